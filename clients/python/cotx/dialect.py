"""The SQL each engine is driven with, and what its errors mean.

PostgreSQL (psycopg 3): `BEGIN ISOLATION LEVEL …`, `PREPARE TRANSACTION '<gid>'`,
`COMMIT PREPARED` / `ROLLBACK PREPARED`, and pg_co's `co.decide` for a decision kept in
the participant. MariaDB (PyMySQL): `XA START / END / PREPARE / COMMIT / ROLLBACK` on an
xid. Also: which driver a connection belongs to, the gid check before a gid is spelled
into SQL, and the error codes the client looks at (whether retrying may cure an error is
cotx.refusals' to say).

Every function takes the owner's connection and the branch's id at the engine (a gid
string, or an xid triple); none of them knows about the coordinator or the branch's state.
"""
from __future__ import annotations

import re

from .errors import CotxError
from .refusals import classify

PG_NO_SUCH_PREPARED = "42704"
MY_XAER_NOTA = 1397

# PostgreSQL's longest gid (GIDSIZE 200 with its NUL): the daemon's naming::PG_GID_MAX.
GID_MAX = 199
_ID_CHARS = re.compile(r"^[A-Za-z0-9._:-]{1,%d}$" % GID_MAX)

# Spelled into SQL: only these exact strings are accepted.
ISOLATION_LEVELS = ("SERIALIZABLE", "REPEATABLE READ", "READ COMMITTED")


class SessionNotChecked(CotxError):
    """Client mode on MariaDB: the branch ran in a session its connection's check was not
    made in; running the transaction again (checked anew) may work."""


def _kind_of(conn) -> str:
    mod = type(conn).__module__
    if mod.startswith("psycopg"):
        return "postgres"
    if mod.startswith("pymysql"):
        return "mariadb"
    raise CotxError(f"unsupported connection type {type(conn)!r}: use psycopg 3 or PyMySQL")


def _pg_literal(s: str) -> str:
    """A gid as an SQL literal. The daemon only hands out gids of [A-Za-z0-9._:-]; checking
    again here means a misbehaving coordinator still cannot make us run its text as SQL."""
    if not _ID_CHARS.match(s):
        raise CotxError(f"refusing unexpected gid {s!r}")
    return "'" + s + "'"


def _pg_state(e) -> str | None:
    return getattr(e, "sqlstate", None)


def _my_code(e) -> int | None:
    args = getattr(e, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _retryable(e) -> bool:
    return classify(e).retryable


def _already_finished(e) -> bool:
    """The prepared branch is not there any more: the coordinator finished it (its owner
    grace period ran out)."""
    return _pg_state(e) == PG_NO_SUCH_PREPARED or _my_code(e) == MY_XAER_NOTA


class Postgres:
    """A PostgreSQL branch; `gid` is the daemon's `<prefix>:<gtid>:<branch>`."""

    @staticmethod
    def _sql(conn, text: str, literal: str | None = None) -> None:
        conn.execute(text.format(_pg_literal(literal)) if literal is not None else text)

    @staticmethod
    def session(conn) -> int | None:
        """The backend's pid, from the connection's start-up (no round trip): the daemon
        maps lock waits to the branch by it to break deadlocks across databases."""
        pid = getattr(getattr(conn, "info", None), "backend_pid", None)
        return int(pid) if pid else None

    @classmethod
    def begin(cls, conn, gid: str, isolation: str, read_only: bool = False) -> None:
        if not conn.autocommit:
            # Our explicit BEGIN/PREPARE need a session psycopg does not wrap.
            conn.autocommit = True
        cls._sql(conn, f"BEGIN ISOLATION LEVEL {isolation}")

    @staticmethod
    def wrote_nothing(conn) -> bool:
        """No transaction id assigned: the open transaction changed no row (PostgreSQL
        assigns one at a transaction's first write)."""
        row = conn.execute("SELECT pg_current_xact_id_if_assigned() IS NULL").fetchone()
        return bool(row and row[0])

    @classmethod
    def prepare(cls, conn, gid: str) -> None:
        cls._sql(conn, "PREPARE TRANSACTION {}", gid)

    @classmethod
    def commit_one_phase(cls, conn, gid: str) -> None:
        cls._sql(conn, "COMMIT")

    @classmethod
    def finish(cls, conn, gid: str, outcome: str) -> None:
        cls._sql(conn, ("COMMIT PREPARED {}" if outcome == "commit" else "ROLLBACK PREPARED {}"), gid)

    @classmethod
    def rollback_unprepared(cls, conn, gid: str) -> None:
        cls._sql(conn, "ROLLBACK")

    @staticmethod
    def alive(conn) -> bool:
        try:
            conn.execute("SELECT 1")
            return True
        except Exception:  # noqa: BLE001 - gone: that is the answer
            return False

    @staticmethod
    def shim_touch(conn, key: int) -> None:
        """Client mode (no pg_co): the branch's write of its slot in cotx.shim, which the
        daemon's prepared helper transaction has read: the edge helper -rw-> branch that
        makes PostgreSQL's SSI refuse a commitment-ordering violation
        (sql/client_mode/postgres.sql, docs/client-mode.md)."""
        conn.execute("SELECT cotx.shim_touch(%s)", (int(key),))

    @staticmethod
    def commit_with_decision(conn, gtid: str) -> None:
        """Commits the (unprepared) branch in one phase with the global decision written
        inside it (pg_co's co.decide): the decision and the branch commit together, in one
        round trip (without parameters psycopg sends one simple query, in which an error in
        co.decide skips the COMMIT)."""
        conn.execute(f"SELECT co.decide({_pg_literal(gtid)}); COMMIT")


class MariaDB:
    """A MariaDB branch; `xid` is the daemon's (gtrid, bqual, format_id)."""

    @staticmethod
    def _sql(conn, xid: tuple, text: str) -> None:
        g, b, f = xid
        spelled = f"{conn.escape(g)},{conn.escape(b)},{int(f)}"
        with conn.cursor() as cur:
            cur.execute(text.replace("{xid}", spelled))

    @staticmethod
    def session(conn) -> int | None:
        """The connection id (CONNECTION_ID()), from the handshake (no round trip): the
        daemon maps lock waits to the branch by it to break deadlocks across databases."""
        tid = getattr(conn, "thread_id", None)
        return int(tid()) if callable(tid) and tid() else None

    @classmethod
    def begin(cls, conn, xid: tuple, isolation: str, read_only: bool = False) -> None:
        with conn.cursor() as cur:
            # READ ONLY: InnoDB refuses the branch's writes (error 1792), so "wrote
            # nothing" needs no look; its SERIALIZABLE reads still lock until XA COMMIT.
            cur.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}" + (", READ ONLY" if read_only else ""))
        cls._sql(conn, xid, "XA START {xid}")

    # Client mode's once-per-connection check, kept on the connection object:
    # (the server's connection id it was made on, the server's start or None).
    _CHECKED = "_cotx_client_mode_checked"

    @staticmethod
    def _check(conn) -> tuple | None:
        """This connection's check, or None when it has not been checked (or was
        reconnected since: another connection id)."""
        c = getattr(conn, MariaDB._CHECKED, None)
        return c if c is not None and c[0] == MariaDB.session(conn) else None

    @staticmethod
    def checked_start(conn) -> int | None:
        """The server's start (unix seconds) this connection's check read, sent with the
        registration; None when unchecked or not read (MySQL 8)."""
        c = MariaDB._check(conn)
        return c[1] if c is not None else None

    @staticmethod
    def is_checked(conn) -> bool:
        return MariaDB._check(conn) is not None

    @staticmethod
    def forget_check(conn) -> None:
        if hasattr(conn, MariaDB._CHECKED):
            delattr(conn, MariaDB._CHECKED)

    @staticmethod
    def wrote_nothing(conn) -> bool:
        """Unknown without a READ ONLY transaction (InnoDB's INNODB_TRX rows are a cache
        refreshed at most every 0.1 s): never claimed."""
        return False

    @staticmethod
    def set_serializable_verified(conn) -> None:
        """Client mode (no mysql_co), once per connection: the session runs SERIALIZABLE,
        checked by reading the level back rather than assumed (a proxy or an init_connect
        may change it), and the server's start is read in the same round trip, exactly as
        the daemon's restart gate computes it (UNIX_TIMESTAMP() - Uptime), into the
        session variable @cotx_started. Later branches on this connection send that start
        with their registration (the daemon then need not look at the server itself) and
        their slot write checks @cotx_started: a session that is not the one checked (a
        reconnect, a reset) writes nothing and the branch fails before it prepares.
        Each branch still sets SERIALIZABLE for its own transaction (begin), so a session
        level changed later by a pool or the application does not reach a branch.
        MariaDB spells the variable tx_isolation (and from 11.1 also transaction_isolation),
        MySQL 8 only transaction_isolation; MySQL 8 keeps no GLOBAL_STATUS in
        information_schema: there the start is not read and the daemon looks itself."""
        started = None
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            try:
                cur.execute("SELECT @@session.tx_isolation, @cotx_started := UNIX_TIMESTAMP() - "
                            "CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS "
                            "WHERE VARIABLE_NAME = 'UPTIME'")
                level, started = cur.fetchone()
            except Exception:  # noqa: BLE001 - MySQL 8: only transaction_isolation, no GLOBAL_STATUS there
                cur.execute("SET @cotx_started = NULL")
                try:
                    cur.execute("SELECT @@session.tx_isolation")
                except Exception:  # noqa: BLE001 - MySQL 8 has only transaction_isolation
                    cur.execute("SELECT @@session.transaction_isolation")
                level = cur.fetchone()[0]
        if level != "SERIALIZABLE":
            raise CotxError(f"client mode needs SERIALIZABLE branches; the session is {level} after "
                            "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        setattr(conn, MariaDB._CHECKED, (MariaDB.session(conn), None if started is None else int(started)))

    @staticmethod
    def shim_touch(conn, key: int) -> None:
        """Client mode: a write that really changes a row (its own slot), so InnoDB prepares
        the branch as read-write and keeps its SERIALIZABLE read locks until the decision
        (sql/client_mode/mariadb.sql). It must change exactly that row, in the session
        this connection's check was made in (@cotx_started as the check left it):
        otherwise the branch fails, retryably, and the next branch checks again."""
        c = MariaDB._check(conn)
        started = c[1] if c is not None else None
        with conn.cursor() as cur:
            cur.execute("UPDATE cotx_shim SET v = v + 1 WHERE k = %s AND @cotx_started <=> %s",
                        (int(key), started))
            changed = cur.rowcount
        if changed != 1:
            MariaDB.forget_check(conn)
            raise SessionNotChecked(
                f"client mode: the slot write changed {changed} rows, not 1: this session is not the one "
                f"checked (reconnected or reset) or slot {int(key)} is missing from cotx_shim; "
                "the next branch checks the connection again")

    @classmethod
    def prepare(cls, conn, xid: tuple) -> None:
        cls._sql(conn, xid, "XA END {xid}")
        cls._sql(conn, xid, "XA PREPARE {xid}")

    @classmethod
    def commit_one_phase(cls, conn, xid: tuple) -> None:
        cls._sql(conn, xid, "XA END {xid}")
        cls._sql(conn, xid, "XA COMMIT {xid} ONE PHASE")

    @classmethod
    def finish(cls, conn, xid: tuple, outcome: str) -> None:
        cls._sql(conn, xid, "XA COMMIT {xid}" if outcome == "commit" else "XA ROLLBACK {xid}")

    @classmethod
    def rollback_unprepared(cls, conn, xid: tuple) -> None:
        try:
            cls._sql(conn, xid, "XA END {xid}")
        except Exception:  # noqa: BLE001 - already ended or failed
            pass
        cls._sql(conn, xid, "XA ROLLBACK {xid}")

    @staticmethod
    def alive(conn) -> bool:
        try:
            conn.ping(reconnect=False)
            return True
        except Exception:  # noqa: BLE001 - gone: that is the answer
            return False


DIALECTS = {"postgres": Postgres, "mariadb": MariaDB}

"""Runs one global transaction (a list of sub-transactions) in one of the four modes.

A sub-transaction is `Sub(key, db, fn)`: `db` is "pg" or "my", `key` names the session it
runs on (two sub-transactions of one global transaction on the same database need two
sessions), `fn(ex)` runs its statements through `ex.q(sql, params)` and returns how many
rows it wrote.

Modes (the servers and the daemon's enforcement are switched by core.Env.set_mode before
the workers start):
  local  every sub-transaction is an independent local SERIALIZABLE transaction, retried
         on its own until it commits; no 2PC, no coordinator (upper bound).
  2pc    the product's client and coordinator (cotx), pg_co.enabled = off, mysql_co off,
         the daemon at enforcement = "none", MariaDB branches at REPEATABLE READ (what
         plain XA users run).
  co     the product as users run it: cotx client + coordinator, pg_co on (default
         conflict_action = abort), mysql_co on, enforcement = "engine", MariaDB branches
         SERIALIZABLE.
  client the product's client mode (Sonata's shims, run by the daemon and the cotx
         client): pg_co and mysql_co off, enforcement = "client". The daemon prepares a
         helper transaction per PostgreSQL branch at its registration; the client writes
         the slot the registration answer names just before PREPARE / XA END, never
         commits in one phase; MariaDB branches SERIALIZABLE (checked by the client).
All three 2PC modes go through the same coordinator and client code, so ratios between
them measure the engines' rules and client mode's extra work, nothing else. This driver
only checks that every branch was registered under the mode's enforcement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from cotx import refusals

LOCK_TIMEOUT_S = 2
# The enforcement the coordinator answers each branch registration with, per 2PC mode
# (core.ENFORCEMENT: the daemon's config in that mode).
ENFORCEMENT = {"2pc": "none", "co": "engine", "client": "client"}


@dataclass
class Sub:
    key: str                 # session name, e.g. "pg0", "my1"
    db: str                  # "pg" | "my"
    fn: Callable             # fn(ex) -> rows written
    touch: dict | None = None  # attempt log: {"table", "read": [keys], "written": [keys]}


class Abort(Exception):
    """A global transaction attempt failed; `reason` is a short class for the report."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def error_record(e: BaseException | None) -> dict | None:
    """The attempt log's error: the first engine error in the `raise ... from` chain (the
    same fields as the Rust driver's: db, sqlstate, errno, message, detail)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        diag = getattr(e, "diag", None)
        if getattr(e, "sqlstate", None) and diag is not None:
            return {"db": "pg", "sqlstate": e.sqlstate, "errno": None,
                    "message": diag.message_primary, "detail": diag.message_detail}
        args = getattr(e, "args", ())
        if len(args) >= 2 and isinstance(args[0], int) and not isinstance(args[0], bool):
            return {"db": "my", "sqlstate": None, "errno": args[0], "message": str(args[1]), "detail": None}
        e = e.__cause__ or e.__context__
    return None


def attempt_line(mode: str, gtid: str, ids: list, subs: list[Sub], outcome: str, measured: bool,
                 kind: str | None, err: BaseException | None) -> str:
    """One line of the attempt log (the format bench/loadgen writes)."""
    import json
    import time as _t
    branches = []
    for i, s in enumerate(subs):
        t = s.touch or {}
        ident = ids[i] if i < len(ids) else None
        branches.append({"db": s.db, "bid": f"b{i}", "gid": ident if s.db == "pg" else None,
                         "xid": ident if s.db == "my" else None, "table": t.get("table"),
                         "read": t.get("read", []), "written": t.get("written", [])})
    return json.dumps({"gtid": gtid, "mode": mode, "t": _t.time(), "measured": measured, "outcome": outcome,
                       "kind": kind, "branches": branches, "error": error_record(err) if err is not None else None})


class PgEx:
    def __init__(self, conn):
        self.conn = conn

    def q(self, sql, params=None):
        cur = self.conn.execute(sql, params)
        return cur.fetchall() if cur.description else None


class MyEx:
    def __init__(self, conn):
        self.conn = conn
        self.cur = conn.cursor()

    def q(self, sql, params=None):
        self.cur.execute(sql, params)
        return self.cur.fetchall() if self.cur.description else None


def _rr_cursor_class():
    """Plain 2PC on MariaDB runs REPEATABLE READ branches. The product client always begins
    a branch with `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`; in mode 2pc the MariaDB
    sessions use this cursor class, which runs that one statement at REPEATABLE READ. The
    client's code path is otherwise untouched."""
    import pymysql.cursors

    class RepeatableReadCursor(pymysql.cursors.Cursor):
        def execute(self, query, args=None):
            if query == "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE":
                query = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"
            return super().execute(query, args)
    return RepeatableReadCursor


def classify(e: BaseException) -> str:
    """Short abort reason for the report: the refusal kind (cotx.refusals: which database,
    which rule or mechanism), or the error itself when it is none of those."""
    kind = refusals.classify(e).kind
    if kind != "other":
        return kind
    return type(e).__name__ + ": " + str(e)[:60].replace(",", ";").replace("\n", " ")


class Driver:
    def __init__(self, mode: str, wid: int, pg_port: int, my_port: int,
                 coord_url: str | None = None, coord_token: str | None = None,
                 pg_db: str = "postgres", my_db: str = "test"):
        self.mode, self.wid = mode, wid
        self.pg_port, self.my_port, self.pg_db, self.my_db = pg_port, my_port, pg_db, my_db
        self.conns: dict[str, object] = {}
        self.exs: dict[str, object] = {}
        self.coord = None
        if mode != "local":
            from cotx import Coordinator
            self.coord = Coordinator(coord_url, coord_token, timeout=30.0, decision_timeout=60.0)
        # Branches the coordinator registered in client mode (each wrote its shim slot
        # before it prepared, unless it failed first; on PostgreSQL each had a helper).
        self.client_branches = 0
        # The last attempt's gtid and its branches' gids / xids (attempt log).
        self.last_gtid: str | None = None
        self.last_ids: list = []

    # --- sessions ---------------------------------------------------------------------
    def _pg_connect(self):
        import psycopg
        c = psycopg.connect(host="127.0.0.1", port=self.pg_port, user="postgres", dbname=self.pg_db,
                            autocommit=True, connect_timeout=10)
        c.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
        return c

    def _my_connect(self):
        import pymysql
        kw = {}
        if self.mode == "2pc":
            kw["cursorclass"] = _rr_cursor_class()
        c = pymysql.connect(host="127.0.0.1", port=self.my_port, user="root", database=self.my_db,
                            autocommit=True, connect_timeout=10, **kw)
        with c.cursor() as cur:
            cur.execute(f"SET SESSION innodb_lock_wait_timeout = {LOCK_TIMEOUT_S}")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"
                        if self.mode != "2pc" else
                        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return c

    def session(self, sub: Sub):
        if sub.key not in self.conns:
            c = self._pg_connect() if sub.db == "pg" else self._my_connect()
            self.conns[sub.key] = c
            self.exs[sub.key] = PgEx(c) if sub.db == "pg" else MyEx(c)
        return self.conns[sub.key], self.exs[sub.key]

    def open(self, subs: list[Sub]) -> None:
        for s in subs:
            self.session(s)

    def close(self) -> None:
        for c in self.conns.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass

    # --- one global transaction ---------------------------------------------------------
    def run(self, subs: list[Sub]) -> int:
        """Runs the global transaction once; raises Abort on failure (everything of the
        attempt rolled back). Returns the number of local commits it took (local mode)."""
        if self.mode == "local":
            return self._run_local(subs)
        return self._run_2pc(subs)

    def _run_local(self, subs: list[Sub]) -> int:
        """Independent local transactions: each retried alone (the global transaction is
        never undone, as without 2PC). Aborts of a single sub-transaction are raised as
        LocalRetry so the caller can count them and call again with the remaining ones."""
        done = 0
        for s in subs:
            conn, ex = self.session(s)
            try:
                if s.db == "pg":
                    conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                    s.fn(ex)
                    conn.execute("COMMIT")
                else:
                    ex.q("START TRANSACTION")
                    s.fn(ex)
                    ex.q("COMMIT")
            except Exception as e:  # noqa: BLE001
                try:
                    if s.db == "pg":
                        conn.execute("ROLLBACK")
                    else:
                        ex.q("ROLLBACK")
                except Exception:  # noqa: BLE001
                    pass
                raise LocalRetry(classify(e), done) from e
            done += 1
        return done

    def _run_2pc(self, subs: list[Sub]) -> int:
        from cotx import CotxError
        want = ENFORCEMENT[self.mode]
        tx = self.coord.transaction()
        self.last_gtid, self.last_ids = None, []
        try:
            with tx:
                for i, s in enumerate(subs):
                    conn, ex = self.session(s)
                    with tx.branch(conn, s.db, f"b{i}") as b:
                        if b.enforcement != want:
                            # Not a conflict: the daemon is configured for another mode.
                            raise WrongEnforcement(f"mode {self.mode} needs enforcement {want}, the coordinator "
                                                   f"answered {b.enforcement} for resource {s.db}")
                        self.client_branches += b.enforcement == "client"
                        s.fn(ex)
        except WrongEnforcement:
            raise
        except (CotxError, Exception) as e:  # noqa: BLE001 - any failure aborts the attempt
            raise Abort(classify(e), str(e)[:200]) from e
        finally:
            self.last_gtid = tx._gtid
            self.last_ids = [b.gid if b.kind == "postgres" else ",".join(map(str, b.xid or ())) for b in tx._branches]
        return 1


class WrongEnforcement(RuntimeError):
    """The coordinator registered a branch under another enforcement than the mode's: the
    run measures something else, so the worker stops (reported as its error)."""


class LocalRetry(Exception):
    def __init__(self, reason: str, done: int):
        super().__init__(reason)
        self.reason, self.done = reason, done

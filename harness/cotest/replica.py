"""A PostgreSQL primary with a synchronous streaming-replication standby, as real
processes (for the coordinator's decision store on a replicated engine).

    with PgReplicaPair() as pair:
        dsn = pair.dsn("postgres")       # multi-host, target_session_attrs=read-write
        ...
        pair.failover()                  # kill -9 the primary, promote the standby
        pair.rejoin()                    # rebuild the dead node as the new standby

The primary has wal_level=replica, a replication role `replicator` (the pg_hba.conf
initdb writes with -A trust already has `host replication all 127.0.0.1/32`), and
synchronous_standby_names = 'standby1' with synchronous_commit = remote_apply: a COMMIT
returns only once the standby has replayed it, so a committed row can be read there
right after (a plain `on` would wait for the standby's flush only). The standby is a
pg_basebackup -R of the primary whose primary_conninfo says application_name=standby1.

Each node lives in its own harness directory (pg-<owner pid>-…/data), so reap_orphans()
stops the nodes of a killed run like any other server. The two ports never change: a
rejoined node takes the port of the node it replaces, so a client's multi-host DSN stays
valid across any number of failovers. While no standby is attached, commits on the
primary wait (synchronous replication refuses to acknowledge what only one node has).
"""
from __future__ import annotations

import time

from .servers import PgServer, ServerError, _chown, _run, _Server

REPL_USER = "replicator"
STANDBY_NAME = "standby1"

# Settings for both nodes (the standby's copy comes with the base backup).
REPLICATION_CONF = {
    "wal_level": "replica",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "'256MB'",
    "hot_standby": "on",
    "synchronous_standby_names": f"'{STANDBY_NAME}'",
    "synchronous_commit": "remote_apply",
    "wal_sender_timeout": "'5s'",
    "wal_receiver_timeout": "'5s'",
    "wal_retrieve_retry_interval": "'200ms'",
    # PostgreSQL's own default (the harness's is serializable): a hot standby refuses
    # serializable reads.
    "default_transaction_isolation": "'read committed'",
}


class PgStandby(PgServer):
    """A node made by pg_basebackup -R from `primary` (no initdb), on `port`."""

    def __init__(self, primary: PgServer, port: int | None = None):
        self.major, self.bin = primary.major, primary.bin
        _Server.__init__(self, port)
        self.data = self.dir / "data"
        self.log_file = self.dir / "postgres.log"
        self.preload = primary.preload
        self.conf = dict(primary.conf)
        self.conf.update({"port": self.port, "unix_socket_directories": f"'{self.dir}'"})
        _run([str(self.bin / "pg_basebackup"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(primary.port),
              "-U", REPL_USER, "-X", "stream", "-c", "fast", "-R", "--no-sync"])
        # The base backup carries the primary's postgresql.auto.conf (its port and socket
        # directory); later lines win. primary_conninfo is written here, not left to -R, so
        # that application_name (what synchronous_standby_names names) is certain.
        with open(self.data / "postgresql.auto.conf", "a") as f:
            f.write(f"port = {self.port}\n")
            f.write(f"unix_socket_directories = '{self.dir}'\n")
            f.write(f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user={REPL_USER} "
                    f"application_name={STANDBY_NAME}'\n")
        _chown(self.data / "postgresql.auto.conf")


class PgReplicaPair:
    """Primary + synchronous standby. `primary` and `standby` swap roles on promote()."""

    def __init__(self, conf: dict | None = None, preload: bool = False, major: int | None = None):
        c = dict(REPLICATION_CONF)
        c.update(conf or {})
        self.primary: PgServer = PgServer(preload=preload, conf=c, major=major)
        self.standby: PgServer | None = None
        self.ports = (self.primary.port, None)
        self.failovers = 0

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.destroy()

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> "PgReplicaPair":
        self.primary.start()
        with self.primary.connect() as c:
            # No standby yet: this commit must not wait for one.
            c.execute("SET synchronous_commit = local")
            c.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{REPL_USER}') "
                      f"THEN CREATE ROLE {REPL_USER} WITH REPLICATION LOGIN; END IF; END $$")
        self._add_standby(None)
        self.ports = (self.primary.port, self.standby.port)
        return self

    def _add_standby(self, port: int | None) -> None:
        sb = PgStandby(self.primary, port)
        try:
            sb.start()
        except Exception:
            sb.destroy()
            raise
        self.standby = sb
        self.wait_sync()

    @property
    def synchronous(self) -> bool:
        return self.primary.conf.get("synchronous_standby_names") not in ("''", "", None)

    def wait_sync(self, timeout: float = 60) -> None:
        """Until the primary reports the standby streaming (as its synchronous standby,
        unless synchronous_standby_names was overridden to '')."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.primary.sql("SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                                        (STANDBY_NAME,))
                want = "sync" if self.synchronous else "async"
                if last and last[0] == ("streaming", want):
                    return
            except Exception as e:  # noqa: BLE001 - not ready yet
                last = e
            time.sleep(0.1)
        raise ServerError(f"standby not synchronous after {timeout}s: {last}\n{self.standby and self.standby.log_tail()}")

    def destroy(self) -> None:
        for s in (self.standby, self.primary):
            if s is not None:
                try:
                    s.destroy()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass

    # --- faults ------------------------------------------------------------------------
    def kill9_primary(self) -> None:
        self.primary.kill9()

    def promote(self, timeout: float = 60) -> None:
        """Promote the standby (pg_ctl promote, waits until it accepts writes); it becomes
        `primary`, the old primary (dead or not) is dropped from the pair's roles and
        must be rejoined with rejoin()."""
        if self.standby is None:
            raise ServerError("no standby to promote")
        _run([str(self.standby.bin / "pg_ctl"), "-D", str(self.standby.data), "-w", "-t", str(int(timeout)), "promote"])
        new, old = self.standby, self.primary
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if new.sql("SELECT pg_is_in_recovery()") == [(False,)]:
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.05)
        else:
            raise ServerError(f"promoted standby still in recovery:\n{new.log_tail()}")
        self.primary, self.standby = new, None
        self._dead = old
        self.failovers += 1

    def rejoin(self) -> None:
        """Throw the old primary away and make a fresh standby of the new primary on its
        port (a pg_basebackup: simpler and surer than pg_rewind for a small test cluster)."""
        old = getattr(self, "_dead", None)
        port = old.port if old is not None else None
        if old is not None:
            old.destroy()
            self._dead = None
        self._add_standby(port)

    def failover(self, rejoin: bool = False) -> None:
        self.kill9_primary()
        self.promote()
        if rejoin:
            self.rejoin()

    # --- clients -----------------------------------------------------------------------
    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        """libpq / rust-postgres multi-host DSN that finds whichever node accepts writes."""
        p1, p2 = self.ports
        return (f"host=127.0.0.1,127.0.0.1 port={p1},{p2} user={user} dbname={dbname} "
                f"target_session_attrs=read-write connect_timeout=5")

    def connect(self, dbname: str = "postgres", autocommit: bool = True):
        """A test's own session: its statements give up after a minute (a lock queue or a
        commit waiting for a standby that never comes fails the test, not the run)."""
        import psycopg
        return psycopg.connect(self.dsn(dbname), autocommit=autocommit, options="-c statement_timeout=60000")

    def sql(self, query: str, params=None, dbname: str = "postgres"):
        """One statement on the current primary (through the multi-host DSN)."""
        with self.connect(dbname) as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

"""Runs a schedule on real engines (PostgreSQL and MariaDB, started by the caller) and
checks the committed history.

The runner executes a schedule on real sessions, one per (transaction, database). A step
that blocks on a lock (seen in pg_stat_activity / information_schema.innodb_trx, not
guessed from time) is left waiting and the transaction's later steps queue behind it;
other transactions go on. When every unfinished transaction is blocked and nothing else
can run (a deadlock across the two databases, which neither engine sees), the youngest
blocked step is cancelled. An error (a refusal by pg_co or mysql_co, an SSI failure, a
deadlock) aborts the transaction: its branches are rolled back, prepared ones with
ROLLBACK PREPARED / XA ROLLBACK. The committed history is then checked twice: the graph
checker (checker.check) and the brute-force serial-order oracle must both accept it.
`MODES` says how each database takes part (co, client, plain, ...); `Tally` counts a
mode's results, `run_many` runs a list of schedules.
"""
from __future__ import annotations

import json
import re
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cotx import refusals
from cotx.dialect import MariaDB as MyDialect
from cotx.dialect import Postgres as PgDialect

from .graph import check, serial_order
from .history import Txn, parse_list
from .schedule_interleavings import DBS, Step


# --------------------------------------------------------------------------------------
# Execution.
class _Session:
    def __init__(self, server, kind):
        self.kind = kind
        self.server = server
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.connect()

    def connect(self):
        if self.kind == "pg":
            self.conn = self.server.connect()
            self.id = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            self.conn.execute("SET lock_timeout = '5s'")
        else:
            self.conn = self.server.connect()
            with self.conn.cursor() as c:
                c.execute("SELECT CONNECTION_ID()")
                self.id = c.fetchone()[0]
                c.execute("SET SESSION innodb_lock_wait_timeout = 5")

    def run(self, stmts):
        """Runs the statements; returns the last result rows."""
        rows = None
        for s in stmts:
            if callable(s):           # a function of the connection (cotx.dialect's)
                rows = s(self.conn)
            elif self.kind == "pg":
                cur = self.conn.execute(s)
                rows = cur.fetchall() if cur.description else None
            else:
                with self.conn.cursor() as c:
                    c.execute(s)
                    rows = c.fetchall() if c.description else None
        return rows

    def quiet(self, stmts):
        for s in stmts:
            try:
                self.run([s])
            except Exception:  # noqa: BLE001 - cleanup: the state may already be gone
                pass

    def close(self):
        self.pool.shutdown(wait=False)
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


@dataclass
class Result:
    label: str
    steps: list
    committed: list = field(default_factory=list)
    aborted: dict = field(default_factory=dict)      # txn -> reason
    history: list = field(default_factory=list)
    final: dict = field(default_factory=dict)
    anomalies: list = field(default_factory=list)     # checker's cycles
    oracle_serializable: bool = True
    executed: list = field(default_factory=list)      # steps in completion order

    @property
    def refused(self) -> bool:
        return bool(self.aborted)

    def to_json(self):
        return {"label": self.label, "schedule": [str(s) for s in self.steps], "executed": self.executed,
                "committed": self.committed, "aborted": self.aborted,
                "anomalies": [a.text for a in self.anomalies], "oracle_serializable": self.oracle_serializable}


def reason_of(e) -> str:
    """Why a step failed: the refusal kind (cotx.refusals), or the error's first line."""
    kind = refusals.classify(e).kind
    if kind in ("pg cancelled", "my interrupted"):
        return "global deadlock (cancelled)"   # only the runner cancels steps, on a wait cycle
    if kind != "other":
        return kind
    return (str(e).splitlines()[0] if str(e) else type(e).__name__)[:120]


# How each database takes part, per mode: (PostgreSQL, MariaDB).
#   co            the engine enforces CO: pg_co (pg_co.enabled on) / mysql_co (mysql_co_enabled ON)
#   client        client mode, no pg_co / mysql_co needed: Sonata's shims (below)
#   plain         plain 2PC: pg_co / mysql_co off where loaded; MariaDB at REPEATABLE READ
#   serializable  plain 2PC with every branch SERIALIZABLE and no shim: client mode without
#                 its shims (the baseline that shows what the shims add)
# In every mode the PostgreSQL transactions run SERIALIZABLE.
MODES = {
    "co": ("co", "co"),
    "co-unlocked": ("co", "co"),
    "plain": ("plain", "plain"),
    "client": ("client", "client"),
    "plain-serializable": ("serializable", "serializable"),
    "pg_co+client": ("co", "client"),
    "client+mysql_co": ("client", "co"),
}


def mode_servers(mode: str) -> tuple:
    """(PostgreSQL with pg_co preloaded?, MariaDB with mysql_co loaded?) for a mode: True
    when it needs the extension / plugin, False when it runs on a server without it (client
    mode is tested where they are absent), None when either does."""
    want = {"co": True, "client": False, "plain": None, "serializable": False}
    return tuple(want[m] for m in MODES[mode])


# How client mode's PostgreSQL helpers are run (Runner's docstring): the daemon's, the
# older daemon's, and two broken ones that the tests show failing.
HELPER_POLICIES = ("shared", "per-branch", "shared-readonly", "released-at-prepare", "one-phase-untouched")

# Client mode's slots (sql/client_mode/): rows 1..SHIM_SLOTS of cotx.shim / cotx_shim; a
# branch takes the lowest slot no live branch on its database holds.
SHIM_SLOTS = 16
_ROOT = Path(__file__).resolve().parents[1]


def _sql_statements(path: Path) -> list:
    """The statements of one of sql/client_mode/'s scripts for a driver that takes one
    statement at a time: comment lines dropped, split at a semicolon that ends a line."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
    return [st.strip() for st in re.split(r";\s*$", text, flags=re.M) if st.strip()]


class Runner:
    """Runs schedules on one PostgreSQL and one MariaDB server (harness objects).

    Client mode (mode client, or one database of pg_co+client / client+mysql_co), as the
    coordinator daemon and the client drive a branch where pg_co / mysql_co are absent:
    PostgreSQL (`pg_helpers`, HELPER_POLICIES): "shared", as the daemon does
    (coordinator-daemon/src/participants/enforcement/helpers.rs): one helper transaction
    reads a block of slots (all SHIM_SLOTS here) and is prepared *before the schedule's
    first step* (ahead of need: its snapshot is older than every branch's); each global
    branch takes an unused key of it when it registers (no SQL); when no helper is live, one
    is prepared at that moment (the daemon's inline case); a helper is rolled back as soon
    as every branch that took one of its keys is committed or rolled back. A key is never
    handed out twice in a helper's life. "per-branch": the older daemon's helper per
    branch, prepared when the branch registers, reading its slot only. The branch runs
    cotx.shim_touch(k) just before its PREPARE TRANSACTION (cotx.dialect.Postgres.
    shim_touch). Two deliberately broken policies show what the rule needs (their tests
    must find anomalies): "shared-readonly" (the helper declared READ ONLY: PostgreSQL's
    SSI does not count it as the dangerous structure's first transaction) and
    "released-at-prepare" (the helper rolled back once its branch prepared, before that
    branch commits), and "one-phase-untouched" (a one-phase branch, kind one, commits
    without its slot write: it is then a local transaction). A one-phase branch (kind one)
    takes its key as a global branch does and writes its slot just before its COMMIT
    (PostgreSQL) or XA END (MariaDB; then XA COMMIT ... ONE PHASE); its helper is kept
    until that COMMIT has ended. MariaDB: the branch session is SERIALIZABLE,
    set and read back (cotx.dialect.MariaDB.set_serializable_verified), and the branch
    writes its slot (MariaDB.shim_touch) before XA END. Local transactions get nothing
    (SERIALIZABLE, BEGIN ... COMMIT; an autocommit reader is InnoDB's snapshot read):
    Sonata's hole."""

    def __init__(self, pg, my, mode: str = "co", max_txns: int = 3, pg_helpers: str = "shared"):
        if pg_helpers not in HELPER_POLICIES:
            raise ValueError(f"unknown helper policy {pg_helpers!r} (policies: {', '.join(HELPER_POLICIES)})")
        self.pg, self.my, self.mode, self.pg_helpers = pg, my, mode, pg_helpers
        self.n = 0
        self._my_poll_at, self._my_waiting = 0.0, set()
        for srv, ddl in ((pg, "CREATE TABLE IF NOT EXISTS sch(k text PRIMARY KEY, v text NOT NULL)"),
                         (my, "CREATE TABLE IF NOT EXISTS sch(k varchar(16) PRIMARY KEY, v text NOT NULL) ENGINE=InnoDB")):
            srv.sql(ddl)
        # No autovacuum / autoanalyze of the schedules' table: once autoanalyze has seen
        # the small table (its first naptime is 60 s), PostgreSQL reads it by sequential
        # scan, SSI locks the whole relation, and schedules see conflicts they were not
        # written for (extra refusals, which also hide what a mode lets through).
        pg.sql("ALTER TABLE sch SET (autovacuum_enabled = off)")
        self.monitor = {"pg": pg.connect(), "my": my.connect()}
        # What the servers have: pg_co preloaded, mysql_co loaded. Modes that need one
        # refuse to run without it; the others leave it alone when it is absent.
        self.has_ext = {
            "pg": bool(self._mon("pg", "SELECT 'pg_co' = ANY(regexp_split_to_array("
                                       "current_setting('shared_preload_libraries'), '\\s*,\\s*'))")[0][0]),
            "my": bool(self._mon("my", "SELECT COUNT(*) FROM information_schema.PLUGINS "
                                       "WHERE PLUGIN_NAME = 'mysql_co' AND PLUGIN_STATUS = 'ACTIVE'")[0][0])}
        if self.has_ext["pg"]:
            pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")   # co.decide, for dip programs
        self._shim_ready = {"pg": False, "my": False}
        self.slots = [{"pg": _Session(pg, "pg"), "my": _Session(my, "my"), "pg_helper": _Session(pg, "pg")}
                      for _ in range(max_txns)]
        self.set_mode(mode)

    def set_mode(self, mode):
        """co: pg_co on, mysql_co on, MariaDB branches SERIALIZABLE. plain: pg_co off on our
        sessions, mysql_co off, MariaDB at REPEATABLE READ (PostgreSQL stays SERIALIZABLE).
        co-unlocked: co, but MariaDB autocommit readers with mysql_co_lock_autocommit_reads
        =OFF (InnoDB's snapshot read: the project before it protected them). client,
        pg_co+client, client+mysql_co, plain-serializable: MODES (client mode: the class
        docstring). pg_co / mysql_co are switched only where the server has them; a mode
        that needs one the server lacks is refused."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        self.mode = mode
        self.db_mode = dict(zip(DBS, MODES[mode]))
        for d, name in (("pg", "pg_co"), ("my", "mysql_co")):
            if self.db_mode[d] == "co" and not self.has_ext[d]:
                raise RuntimeError(f"mode {mode} needs {name}, which this server does not have loaded")
            if self.db_mode[d] == "client" and not self._shim_ready[d]:
                self._create_shim(d)
        if self.has_ext["my"]:
            with self.monitor["my"].cursor() as c:
                c.execute(f"SET GLOBAL mysql_co_enabled = {'ON' if self.db_mode['my'] == 'co' else 'OFF'}")
        if self.has_ext["pg"]:
            for slot in self.slots:
                slot["pg"].run([f"SET pg_co.enabled = {'on' if self.db_mode['pg'] == 'co' else 'off'}"])

    def _create_shim(self, db):
        """Client mode's objects, from sql/client_mode/, and the slot rows."""
        if db == "pg":
            self.monitor["pg"].execute((_ROOT / "sql" / "client_mode" / "postgres.sql").read_text())
            self._mon("pg", f"INSERT INTO cotx.shim(k) SELECT generate_series(1, {SHIM_SLOTS}) ON CONFLICT DO NOTHING")
        else:
            for st in _sql_statements(_ROOT / "sql" / "client_mode" / "mariadb.sql"):
                self._mon("my", st)
            self._mon("my", "INSERT IGNORE INTO cotx_shim(k) VALUES " + ", ".join(f"({i})" for i in range(1, SHIM_SLOTS + 1)))
        self._shim_ready[db] = True

    def close(self):
        for slot in self.slots:
            for s in slot.values():
                s.close()
        for c in self.monitor.values():
            c.close()

    def _blocked(self, db, sess) -> bool:
        """Is the session waiting for a lock right now? PostgreSQL: pg_stat_activity.
        MariaDB: information_schema.innodb_trx, whose cache refreshes only when the previous
        read is more than 100 ms old (trx_i_s cache), so we read it at most every 110 ms and
        a verdict only counts for steps started before that read."""
        if db == "pg":
            r = self.monitor["pg"].execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                           (sess.id,)).fetchone()
            return bool(r) and r[0] == "Lock"
        now = time.monotonic()
        if now - self._my_poll_at >= 0.11:
            with self.monitor["my"].cursor() as c:
                c.execute("SELECT trx_mysql_thread_id FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
                self._my_waiting = {r[0] for r in c.fetchall()}
            self._my_poll_at = time.monotonic()
        return sess.id in self._my_waiting and self._my_poll_at > sess.started_at + 0.001

    def _mon(self, db, q):
        if db == "pg":
            cur = self.monitor["pg"].execute(q)
            return cur.fetchall() if cur.description else []
        with self.monitor["my"].cursor() as c:
            c.execute(q)
            return list(c.fetchall()) if c.description else []

    def _cancel(self, db, sess):
        if db == "pg":
            self.monitor["pg"].execute("SELECT pg_cancel_backend(%s)", (sess.id,))
        else:
            with self.monitor["my"].cursor() as c:
                c.execute(f"KILL QUERY {int(sess.id)}")

    def run(self, label, programs, steps, time_limit: float = 60.0) -> Result:
        """Runs one schedule (its steps in order, each transaction on its own sessions)
        and checks the committed history: `_Schedule` does each step of it."""
        self.n += 1
        if any(p.kind == "dip" for p in programs) and not (self.has_ext["pg"] and self.db_mode["pg"] != "client"):
            raise ValueError("dip programs decide with pg_co's co.decide: not in client mode, not without pg_co")
        self._reset_rows(programs)
        return _Schedule(self, f"s{self.n}", label, programs, steps).execute(time_limit)

    def _reset_rows(self, programs):
        """The schedules' table holds exactly the keys the programs touch, each empty."""
        keys = sorted({(d, kk) for p in programs for d, _, k in p.ops for kk in k.split("+")})
        for db in DBS:
            vals = ", ".join(f"('{k}', '')" for d, k in keys if d == db)
            self._mon(db, "DELETE FROM sch")
            if db == "pg" and any(p.kind == "dip" for p in programs):
                self._mon(db, "DELETE FROM co.decisions")
            if vals:
                self._mon(db, f"INSERT INTO sch VALUES {vals}")


class _Schedule:
    """One schedule's run on a Runner's sessions: what each transaction has done at each
    database (none|active|prepared|done), the client-mode slots and helpers it holds, the
    steps in flight and those queued behind them. `execute` drives the steps, then checks
    the history (`Runner` says how: blocked steps, wait cycles, aborts)."""

    def __init__(self, runner: Runner, tag: str, label, programs, steps):
        self.r, self.tag, self.label, self.programs, self.steps = runner, tag, label, programs, steps
        self.progs = {p.name: p for p in programs}
        self.slot_of = {p.name: runner.slots[i] for i, p in enumerate(programs)}
        self.client = {d: runner.db_mode[d] == "client" for d in DBS}
        self.shim_key = {}      # (txn, db) -> the client-mode slot of a live branch
        self.helpers = {}       # txn -> the gid of its prepared PostgreSQL helper
        self.res = Result(label, steps)
        self.hist = {p.name: Txn(p.name, kind=p.kind, note=str(p)) for p in programs}
        self.state = {(p.name, d): "none" for p in programs for d in p.dbs}   # none|active|prepared|done
        self.aborted = {}
        self.inflight = {}      # txn -> (future, step, sess)
        self.backlog = defaultdict(deque)
        self.blocked_seen = {}
        self.policy = runner.pg_helpers
        self.shared = {"gid": None, "used": set(), "takers": set(), "n": 0}   # the live shared helper
        self.helper_sess = runner.slots[0]["pg_helper"]

    # -- names and client mode's slots and helpers ---------------------------------------

    def gid(self, t, d):
        return f"{self.tag}_{t}" if d == "pg" else f"'{self.tag}_{t}','{d}'"

    def take_slot(self, t, d):
        live = {k for (_, dd), k in self.shim_key.items() if dd == d}
        self.shim_key[(t, d)] = min(set(range(1, SHIM_SLOTS + 1)) - live)
        return self.shim_key[(t, d)]

    def shared_prepare(self):
        """A shared helper reads every slot and is prepared (pre-prepared at the
        schedule's start, or inline when a branch registers and none is live)."""
        shared = self.shared
        shared["n"] += 1
        g = f"{self.tag}_helper{shared['n']}"
        ro = " READ ONLY" if self.policy == "shared-readonly" else " READ WRITE"
        self.helper_sess.run([f"BEGIN ISOLATION LEVEL SERIALIZABLE{ro}",
                              f"SELECT count(cotx.shim_hold(k)) FROM generate_series(1, {SHIM_SLOTS}) AS k",
                              f"PREPARE TRANSACTION '{g}'"])
        shared.update(gid=g, used=set(), takers=set())

    def shared_rollback(self):
        if self.shared["gid"] is not None:
            self.helper_sess.run([f"ROLLBACK PREPARED '{self.shared['gid']}'"])
            self.shared.update(gid=None, takers=set())

    def helper_begin(self, t):
        """Client mode at PostgreSQL, when t's branch registers (before its first
        statement). per-branch: a helper reads t's slot and is prepared, on its own
        session. Shared: t takes a key of the live helper (one is prepared if none
        is). A helper only reads rows no live branch writes: it never waits."""
        if self.policy == "per-branch":
            k = self.take_slot(t, "pg")
            g = f"{self.tag}_{t}_helper"
            self.slot_of[t]["pg_helper"].run(["BEGIN ISOLATION LEVEL SERIALIZABLE", f"SELECT cotx.shim_hold({k})",
                                              f"PREPARE TRANSACTION '{g}'"])
            self.helpers[t] = g
            return
        shared = self.shared
        if shared["gid"] is None:
            self.shared_prepare()
        k = min(set(range(1, SHIM_SLOTS + 1)) - shared["used"])
        shared["used"].add(k)
        shared["takers"].add(t)
        self.shim_key[(t, "pg")] = k
        self.helpers[t] = shared["gid"]

    def helper_end(self, t):
        """After t's branch at PostgreSQL is committed or rolled back."""
        g = self.helpers.pop(t, None)
        if self.policy == "per-branch":
            if g is not None:
                self.slot_of[t]["pg_helper"].run([f"ROLLBACK PREPARED '{g}'"])
        else:
            self.shared["takers"].discard(t)
            if g is not None and g == self.shared["gid"] and not self.shared["takers"]:
                self.shared_rollback()      # its last taker settled: it goes now
        self.shim_key.pop((t, "pg"), None)

    # -- the statements of a step ----------------------------------------------------------

    def stmts_for(self, s: Step):
        p = self.progs[s.txn]
        if s.kind == "op":
            out = self._opening(s, p) if self.state[(s.txn, s.db)] == "none" else []
            if s.f == "r":
                ks = ", ".join(f"'{k}'" for k in s.key.split("+"))
                out.append(f"SELECT k, v FROM sch WHERE k IN ({ks}) ORDER BY k")
            else:
                cat = f"v || ' ' || '{s.txn}'" if s.db == "pg" else f"CONCAT(v, ' ', '{s.txn}')"
                out.append(f"UPDATE sch SET v = {cat} WHERE k = '{s.key}'")
            return out
        if s.kind == "prep":
            return self._preparing(s, p)
        return self._committing(s, p)

    def _opening(self, s: Step, p) -> list:
        """What starts a transaction's branch at a database, before its first operation."""
        r = self.r
        if s.db == "pg":
            return ["BEGIN ISOLATION LEVEL SERIALIZABLE" + (" READ ONLY" if p.kind == "local_ro" else "")]
        out = []
        if p.kind in ("auto", "auto_unlocked"):
            # One autocommit statement at SERIALIZABLE: InnoDB reads it from a
            # snapshot unless mysql_co makes it a locking read (not loaded in
            # client mode: there it is the snapshot read).
            if r.has_ext["my"]:
                lock = "OFF" if p.kind == "auto_unlocked" or r.mode == "co-unlocked" else "ON"
                out.append(f"SET SESSION mysql_co_lock_autocommit_reads = {lock}")
            out.append("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        elif self.client["my"] and p.kind in ("global", "dip", "one"):
            self.take_slot(s.txn, "my")
            out.append(MyDialect.set_serializable_verified)
            out.append(f"XA START {self.gid(s.txn, s.db)}")
        else:
            lvl = "REPEATABLE READ" if r.db_mode["my"] == "plain" else "SERIALIZABLE"
            out.append(f"SET TRANSACTION ISOLATION LEVEL {lvl}")
            out.append(f"XA START {self.gid(s.txn, s.db)}" if p.kind in ("global", "dip", "one") else "BEGIN")
        return out

    def _preparing(self, s: Step, p) -> list:
        out = []
        two_phase = p.kind == "global" or (p.kind == "dip" and s.db != "pg")
        if self.client[s.db] and two_phase:
            k = self.shim_key[(s.txn, s.db)]
            touch = PgDialect.shim_touch if s.db == "pg" else MyDialect.shim_touch
            out.append(lambda conn, touch=touch, k=k: touch(conn, k))
        out += ([f"PREPARE TRANSACTION '{self.gid(s.txn, 'pg')}'"] if s.db == "pg"
                else [f"XA END {self.gid(s.txn, 'my')}", f"XA PREPARE {self.gid(s.txn, 'my')}"])
        return out

    def _committing(self, s: Step, p) -> list:
        if p.kind == "one":
            # One phase: the slot write, then the commit, in one step (the client commits
            # right after the daemon's answer).
            out = []
            if self.client[s.db] and self.policy != "one-phase-untouched":
                k = self.shim_key[(s.txn, s.db)]
                touch = PgDialect.shim_touch if s.db == "pg" else MyDialect.shim_touch
                out.append(lambda conn, touch=touch, k=k: touch(conn, k))
            return out + (["COMMIT"] if s.db == "pg"
                          else [f"XA END {self.gid(s.txn, 'my')}", f"XA COMMIT {self.gid(s.txn, 'my')} ONE PHASE"])
        if p.kind in ("local", "local_ro"):
            return ["COMMIT"]
        if p.kind in ("auto", "auto_unlocked"):
            return []                      # committed by itself
        if p.kind == "dip" and s.db == "pg":
            return [f"SELECT co.decide('{self.tag}_{s.txn}')", "COMMIT"]   # the global decision
        return [f"COMMIT PREPARED '{self.gid(s.txn, 'pg')}'" if s.db == "pg" else f"XA COMMIT {self.gid(s.txn, 'my')}"]

    # -- steps started, finished, transactions aborted -----------------------------------

    def start(self, s: Step):
        sess = self.slot_of[s.txn][s.db]
        if (self.client["pg"] and s.db == "pg" and self.state[(s.txn, "pg")] == "none" and s.txn not in self.helpers
                and self.progs[s.txn].kind in ("global", "one")):
            try:
                self.helper_begin(s.txn)
            except Exception as e:  # noqa: BLE001 - the transaction cannot run in client mode
                self.res.executed.append(f"{s.txn}.helper(pg) !{reason_of(e)}")
                self.abort(s.txn, f"{s.txn}.helper(pg): client-mode helper failed: {reason_of(e)}")
                return
        sess.started_at = time.monotonic()
        fut = sess.pool.submit(sess.run, self.stmts_for(s))
        self.inflight[s.txn] = (fut, s, sess)

    def abort(self, t, why):
        self.aborted[t] = why
        p = self.progs[t]
        for d in p.dbs:
            sess = self.slot_of[t][d]
            st = self.state[(t, d)]
            if d == "pg":
                if st == "prepared":
                    sess.quiet([f"ROLLBACK PREPARED '{self.gid(t, 'pg')}'"])
                sess.quiet(["ROLLBACK"])
            else:
                if p.kind in ("global", "dip", "one"):
                    if st != "prepared":
                        sess.quiet([f"XA END {self.gid(t, 'my')}"])
                    sess.quiet([f"XA ROLLBACK {self.gid(t, 'my')}"])
                else:
                    sess.quiet(["ROLLBACK"])
            self.state[(t, d)] = "done"
            if d == "pg":
                self.helper_end(t)
            self.shim_key.pop((t, d), None)
        self.helper_end(t)      # a helper prepared for a branch that never ran its first step
        self.backlog[t].clear()

    def finish(self, t):
        fut, s, sess = self.inflight.pop(t)
        self.blocked_seen.pop(t, None)
        try:
            rows = fut.result()
        except Exception as e:  # noqa: BLE001
            self.res.executed.append(f"{s} !{reason_of(e)}")
            self.abort(t, f"{s}: {reason_of(e)}")
            return
        self.res.executed.append(str(s))
        if s.kind == "op":
            self.state[(t, s.db)] = "active"
            k = f"{s.db}:{s.key}"
            if s.f == "r":
                got = {kk: parse_list(v) for kk, v in rows or []}
                for kk in s.key.split("+"):
                    self.hist[t].read(f"{s.db}:{kk}", got.get(kk, []))
            else:
                self.hist[t].append(k, t)
        elif s.kind == "prep":
            self.state[(t, s.db)] = "prepared"
            if self.policy == "released-at-prepare" and s.db == "pg" and self.helpers.get(t) == self.shared["gid"]:
                self.shared_rollback()      # broken on purpose: before its branch commits
        else:
            self.state[(t, s.db)] = "done"
            if s.db == "pg":
                self.helper_end(t)
            self.shim_key.pop((t, s.db), None)
        if self.backlog[t]:
            self.start(self.backlog[t].popleft())

    def settle(self, deadline):
        """Until every in-flight step is finished or blocked on a lock."""
        inflight = self.inflight
        while True:
            progressed = False
            for t in list(inflight):
                if inflight[t][0].done():
                    self.finish(t)
                    progressed = True
            if progressed:
                continue
            if all(self.r._blocked(s.db, sess) for _, s, sess in inflight.values()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"schedule {self.label} did not settle")
            time.sleep(0.0005)

    # -- the schedule, start to end --------------------------------------------------------

    def execute(self, time_limit: float) -> Result:
        deadline = time.monotonic() + time_limit
        if (self.client["pg"] and self.policy != "per-branch"
                and any(p.kind in ("global", "one") and "pg" in p.dbs for p in self.programs)):
            self.shared_prepare()               # ahead of need: older than every branch
        try:
            self._drive(deadline)
        except TimeoutError:
            self._give_up()
            raise
        if self.shared["gid"] is not None:
            self.shared_rollback()              # pre-prepared and never taken (or outlived its takers)
        return self._checked()

    def _drive(self, deadline):
        """Every step in the schedule's order (a transaction's step waits behind its
        blocked one), then what is left in flight, its wait cycles broken."""
        for s in self.steps:
            if s.txn in self.aborted:
                continue
            if s.txn in self.inflight:
                self.backlog[s.txn].append(s)
            else:
                self.start(s)
            self.settle(deadline)
        inflight = self.inflight
        while inflight:
            self.settle(deadline)
            if inflight:
                # Everything left is blocked and nothing else can run: a wait cycle.
                # Look twice (a lock may have just been released), then cancel the
                # youngest blocked transaction.
                time.sleep(0.12)
                if any(inflight[t][0].done() for t in inflight):
                    continue
                if all(self.r._blocked(s.db, sess) for _, s, sess in inflight.values()):
                    t = max(inflight, key=lambda x: [p.name for p in self.programs].index(x))
                    _, s, sess = inflight[t]
                    self.r._cancel(s.db, sess)

    def _give_up(self):
        """The schedule did not settle in time: its statements cancelled, its helpers
        rolled back (the caller raises the timeout)."""
        for t, (_, s, sess) in list(self.inflight.items()):
            self.r._cancel(s.db, sess)
        time.sleep(0.2)
        for t in list(self.inflight):
            if self.inflight[t][0].done():
                self.finish(t)
        for t in list(self.helpers):
            g = self.helpers.pop(t)
            if self.policy == "per-branch":
                self.slot_of[t]["pg_helper"].quiet([f"ROLLBACK PREPARED '{g}'"])
        if self.shared["gid"] is not None:
            self.helper_sess.quiet([f"ROLLBACK PREPARED '{self.shared['gid']}'"])

    def _checked(self) -> Result:
        """The result: who committed, the history and the final state, both checks'
        verdicts; nothing may be left prepared."""
        res, r = self.res, self.r
        for p in self.programs:
            if p.name in self.aborted:
                self.hist[p.name].status = "fail"
                res.aborted[p.name] = self.aborted[p.name]
            else:
                res.committed.append(p.name)
        res.history = list(self.hist.values())
        for db in DBS:
            for k, v in r._mon(db, "SELECT k, v FROM sch"):
                res.final[f"{db}:{k}"] = parse_list(v)
        rep = check(res.history, final_reads=res.final)
        res.anomalies = rep.anomalies
        res.oracle_serializable = serial_order(res.history, res.final) is not None
        left = r._mon("pg", "SELECT gid FROM pg_prepared_xacts")
        left_my = r._mon("my", "XA RECOVER")
        if left or left_my:
            raise RuntimeError(f"schedule {self.label} left prepared transactions: {left} {left_my}")
        return res


@dataclass
class Tally:
    mode: str
    run: int = 0
    refused: int = 0
    committed_all: int = 0
    anomalies: int = 0
    global_anomalies: int = 0    # of those, schedules of global transactions only
    oracle_disagrees: int = 0
    reasons: dict = field(default_factory=lambda: defaultdict(int))
    failures: list = field(default_factory=list)

    def add(self, r: Result):
        self.run += 1
        self.refused += r.refused
        self.committed_all += not r.refused
        for why in r.aborted.values():
            self.reasons[why.split(": ", 1)[1]] += 1
        bad = bool(r.anomalies) or not r.oracle_serializable
        self.anomalies += bad
        self.global_anomalies += bad and all(t.kind in ("global", "dip", "one") for t in r.history)
        if bool(r.anomalies) == r.oracle_serializable:
            self.oracle_disagrees += 1
        if bad and len(self.failures) < 5:
            self.failures.append(r)

    def line(self) -> str:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.reasons.items(), key=lambda kv: -kv[1]))
        return (f"[{self.mode}] schedules run: {self.run}, refused (a transaction aborted): {self.refused}, "
                f"all committed: {self.committed_all}, non-serializable histories: {self.anomalies} "
                f"({self.global_anomalies} among global transactions only), "
                f"checker/oracle disagreements: {self.oracle_disagrees}" + (f"\n  aborts by reason: {why}" if why else ""))


def run_many(runner: Runner, items, tally: Tally, progress_every: int = 0, log=None, time_budget: float | None = None):
    t0 = time.time()
    for i, (label, progs, steps) in enumerate(items, 1):
        r = runner.run(label, progs, steps)
        tally.add(r)
        if log is not None:
            log.write(json.dumps({"mode": tally.mode, **r.to_json()}) + "\n")
            log.flush()
        if progress_every and i % progress_every == 0:
            dt = time.time() - t0
            print(f"  {tally.mode}: {i} schedules, {tally.refused} refused, {tally.anomalies} anomalies "
                  f"[{dt:.0f} s, {i / dt:.1f}/s]", flush=True)
        if time_budget and time.time() - t0 > time_budget:
            print(f"  {tally.mode}: time budget reached after {i} schedules", flush=True)
            break
    return tally

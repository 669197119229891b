"""List-append across PostgreSQL and MariaDB, through the coordinator daemon, checked for cycles.

checker/list_append.py's workload (Jepsen's list-append over upserts) made global: every
transaction appends to and reads keys on both databases, as one global transaction of the
`cotx` Python client through a real `cotx-coordinator` process. Per database, tables
`txn1..txn3(id int primary key, sk int not null, val text)`; a read is

    select val from txnK where id = %s

an append of a unique integer is, on PostgreSQL and on MariaDB,

    insert into txnK as t (id, sk, val) values (...) on conflict (id) do update set val = concat(t.val, ',', ...)
    insert into txnK (id, sk, val) values (...) on duplicate key update val = concat(val, ',', values(val))

Each transaction runs 1-4 operations on each database (keys from a small rolling window
per table, list_append.KeySpace), each database's inside its branch, the two branches in a
random order. Keys are named per engine (`pg:txn1/5`, `my:txn1/5`), so the checker's one
graph holds both databases and a cycle may cross them. After the run the final lists are
read from both servers (nothing left prepared) and `checker.check` looks for cycles; each
one is explained as list_append explains them (statements and timings of its members,
deadlock cancellations meanwhile, PostgreSQL's log of their backends).

Modes (what users run; the daemon's `enforcement` of each resource, and the engines):

    co              engine / engine: pg_co and mysql_co on
    dip             co, with the decision inside the PostgreSQL branch (co.decide)
    client          client / client: pg_co and mysql_co off, Sonata's shims (docs/client-mode.md)
    pg_co+client    engine / client: pg_co on, mysql_co off
    client+mysql_co client / engine: pg_co off, mysql_co on
    none            plain 2PC: pg_co and mysql_co off, no shims (the baseline: it must show cycles)

Every branch is SERIALIZABLE in every mode (MariaDB too), so a cycle of `none` is one no
single database allowed: it crosses the two, which is what the project's rule forbids.

    python -m checker.list_append --engines pg,my --mode co --txns 5000 --seed 1
    python -m checker.list_append --engines pg,my --help
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

from .graph import check
from .list_append import TABLES, KeySpace, Record, Result, _read_log, summary

# (PostgreSQL enforcement, MariaDB enforcement, decision in the participant)
MODES = {
    "co": ("engine", "engine", False),
    "dip": ("engine", "engine", True),
    "client": ("client", "client", False),
    "pg_co+client": ("engine", "client", False),
    "client+mysql_co": ("client", "engine", False),
    "none": ("none", "none", False),
}
DBS = ("pg", "my")
READ_SQL = "select val from txn{t} where id = %s"
APPEND_SQL = {
    "pg": "insert into txn{t} as t (id, sk, val) values (%s, %s, %s) "
          "on conflict (id) do update set val = concat(t.val, ',', excluded.val)",
    "my": "insert into txn{t} (id, sk, val) values (%s, %s, %s) "
          "on duplicate key update val = concat(val, ',', values(val))",
}
LOCK_TIMEOUT_S = 3     # both databases: ends waits that span them if the daemon has not


def key_name(db: str, table: int, key: int) -> str:
    return f"{db}:txn{table + 1}/{key}"


def setup_schema(pg, my) -> None:
    for t in range(1, TABLES + 1):
        pg.sql(f"DROP TABLE IF EXISTS txn{t}")
        pg.sql(f"CREATE TABLE txn{t} (id int PRIMARY KEY, sk int NOT NULL, val text)")
        my.sql(f"DROP TABLE IF EXISTS txn{t}")
        my.sql(f"CREATE TABLE txn{t} (id int PRIMARY KEY, sk int NOT NULL, val text) ENGINE=InnoDB")


def set_engines(pg, my, mode: str) -> None:
    """pg_co / mysql_co on where the mode's enforcement is `engine`, off elsewhere (client
    mode and plain 2PC run on the same servers with the extension and plugin switched off,
    as the benchmarks do). Before the daemon starts: it probes them then."""
    pg_e, my_e, _ = MODES[mode]
    on = pg_e == "engine"
    pg.sql(f"ALTER SYSTEM SET pg_co.enabled = {'on' if on else 'off'}")
    pg.sql("SELECT pg_reload_conf()")
    my.sql(f"SET GLOBAL mysql_co_enabled = {'ON' if my_e == 'engine' else 'OFF'}")
    deadline = time.time() + 10
    while pg.sql("SHOW pg_co.enabled")[0][0] != ("on" if on else "off"):
        if time.time() > deadline:
            raise RuntimeError("pg_co.enabled did not change after pg_reload_conf()")
        time.sleep(0.05)


def make_daemon(pg, my, mode: str, clients: int):
    """A daemon whose two resources have the mode's enforcement, never `auto` (with auto,
    a server whose extension is switched off would be moved to client mode and the plain
    baseline would silently get shims). PostgreSQL decides in dip (`decisions = true`)."""
    from cotest.daemon import Daemon
    pg_e, my_e, dip = MODES[mode]
    pool = clients + 2     # client mode's helpers run on the daemon's own sessions
    pgres = {"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": pool, "enforcement": pg_e}
    if dip:
        pgres["decisions"] = True
    return Daemon([pgres, {"name": "my", "kind": "mariadb", "dsn": my.dsn, "pool_size": pool, "enforcement": my_e}],
                  timeouts={"transaction_ms": 30000})


class Budget:
    """Transactions started, shared by the clients: stops the run after `txns`."""

    def __init__(self, txns: int | None):
        self.lock = threading.Lock()
        self.n, self.txns = 0, txns

    def take(self) -> bool:
        with self.lock:
            if self.txns is not None and self.n >= self.txns:
                return False
            self.n += 1
            return True


def _connect(pg, my):
    pc = pg.connect()
    pc.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
    mc = my.connect()
    with mc.cursor() as c:
        c.execute(f"SET SESSION innodb_lock_wait_timeout = {LOCK_TIMEOUT_S}")
    return {"pg": pc, "my": mc}


def _client(pg, my, coord, dip: bool, cid: int, spaces: dict, rng: random.Random, deadline: float, t0: float,
            counter: Budget, out: list, errors: list, think_ms: int, enforcement: dict):
    from cotx import OutcomeUnknown, TransactionAborted
    from cotx.refusals import classify
    try:
        conns = _connect(pg, my)
        n = 0
        while time.monotonic() < deadline and counter.take():
            n += 1
            pid = conns["pg"].info.backend_pid
            rec = Record(f"c{cid}.{n}", cid, pid, round(time.monotonic() - t0, 4))
            out.append(rec)
            plan = {db: spaces[db].gen(rng) for db in DBS}
            order = list(DBS)
            rng.shuffle(order)
            phase = "body"

            def stmt(db, label, sql, params=()):
                s = time.monotonic()
                try:
                    if db == "pg":
                        cur = conns["pg"].execute(sql, params)
                        row = cur.fetchone() if cur.description else None
                    else:
                        with conns["my"].cursor() as cur:
                            cur.execute(sql, params)
                            row = cur.fetchone() if cur.description else None
                except Exception as e:
                    rec.stmts.append([label, round(s - t0, 4), round(time.monotonic() - s, 4), classify(e).kind])
                    raise
                rec.stmts.append([label, round(s - t0, 4), round(time.monotonic() - s, 4), "ok"])
                return row

            try:
                with coord.transaction(decide_in_participant=dip) as tx:
                    for db in order:
                        with tx.branch(conns[db], db) as b:
                            if b.enforcement != enforcement[db]:
                                raise RuntimeError(f"resource {db}: the daemon answered enforcement "
                                                   f"{b.enforcement!r}, the mode needs {enforcement[db]!r}")
                            for f, t, k, v in plan[db]:
                                if think_ms:
                                    time.sleep(rng.randrange(think_ms) / 1000)
                                kn = key_name(db, t, k)
                                if f == "r":
                                    row = stmt(db, f"read {kn}", READ_SQL.format(t=t + 1), (k,))
                                    rec.ops.append(("r", kn, [int(x) for x in row[0].split(",")] if row and row[0] else []))
                                else:
                                    # Recorded before it runs: a failed append belongs to an
                                    # aborted transaction, which the checker leaves out.
                                    rec.ops.append(("append", kn, v))
                                    stmt(db, f"append {v} to {kn}", APPEND_SQL[db].format(t=t + 1), (k, k, str(v)))
                    rec.gid = tx.gtid
                    phase = "commit"
                    c0 = time.monotonic()     # the context manager's exit prepares and decides
                rec.stmts.append(["commit", round(c0 - t0, 4), round(time.monotonic() - c0, 4), tx.outcome])
            except RuntimeError:
                raise
            except Exception as e:  # noqa: BLE001 - every failure is a history entry
                rec.gid = rec.gid or getattr(e, "gtid", None)
                rec.status = "fail" if phase == "body" or isinstance(e, TransactionAborted) else "info"
                if isinstance(e, OutcomeUnknown):
                    rec.status = "info"
                r = classify(e)
                cause = e
                while cause.__cause__ is not None:
                    cause = cause.__cause__
                rec.sqlstate = getattr(cause, "sqlstate", None) or (str(cause.args[0]) if getattr(cause, "args", None)
                                                                   and isinstance(cause.args[0], int) else None)
                rec.reason = r.kind if r.kind != "other" else type(cause).__name__
                rec.error = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                if phase == "commit":
                    rec.stmts.append(["commit", round(c0 - t0, 4), round(time.monotonic() - c0, 4), rec.reason])
                # A broken session is replaced; an open one was rolled back by the client.
                if conns["pg"].closed or not conns["my"].open:
                    conns = _connect(pg, my)
            rec.end = round(time.monotonic() - t0, 4)
        for c in conns.values():
            c.close()
    except Exception as e:  # a client that dies must not look like a quiet, clean run
        errors.append(f"client {cid}: {type(e).__name__}: {e}")


def _settled(pg, my, timeout: float = 60) -> int:
    """Waits until nothing is prepared on either server (the daemon finishes what a client
    left); returns how many were still prepared at the timeout."""
    deadline = time.time() + timeout
    while True:
        left = pg.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0] + len(my.sql("XA RECOVER") or ())
        if not left or time.time() > deadline:
            return left
        time.sleep(0.1)


def _decided_in_participant(d) -> int:
    """The daemon's count of commits decided inside a PostgreSQL branch (co.decide): what
    shows mode dip ran as dip (co.decisions rows are purged once every branch finished)."""
    from cotest.coord import metric
    return int(metric(d, "cotx_decided_in_participant_total", 0))


def run(pg, my, *, mode: str, txns: int | None = None, seconds: float | None = None, clients: int = 8,
        window: int = 4, appends_per_key: int = 5, seed: int = 1, think_ms: int = 5, daemon=None) -> Result:
    """Runs the workload in `mode` until `txns` transactions were started or `seconds`
    passed, on started servers (harness PgServer with pg_co, MariaServer with mysql_co),
    through a daemon of its own (or `daemon`, already started with the mode's enforcement);
    checks the combined history."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    if txns is None and seconds is None:
        raise ValueError("give txns or seconds")
    from cotx import Coordinator
    pg_e, my_e, dip = MODES[mode]
    setup_schema(pg, my)
    pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")
    set_engines(pg, my, mode)
    own = daemon is None
    d = make_daemon(pg, my, mode, clients).start() if own else daemon
    try:
        coord = Coordinator(d.url, d.token)
        spaces = {db: KeySpace(window, appends_per_key) for db in DBS}
        counter = Budget(txns)
        errors: list = []
        outs = [[] for _ in range(clients)]
        t0 = time.monotonic()
        wall0 = time.time()
        deadline = t0 + (seconds if seconds is not None else 10 ** 9)
        enforcement = {"pg": pg_e, "my": my_e}
        threads = [threading.Thread(target=_client, daemon=True,
                                    args=(pg, my, coord, dip, cid, spaces, random.Random(seed * 1000 + cid), deadline,
                                          t0, counter, outs[cid], errors, think_ms, enforcement))
                   for cid in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.monotonic() - t0
        if errors:
            raise RuntimeError("workload clients failed: " + "; ".join(errors) + "\n" + d.log_tail(30))
        left = _settled(pg, my)
        in_participant = _decided_in_participant(d)
    finally:
        if own:
            d.destroy()
    records = [r for o in outs for r in o]
    final = {}
    for db, srv in (("pg", pg), ("my", my)):
        for t in range(TABLES):
            for k, val in srv.sql(f"SELECT id, val FROM txn{t + 1}"):
                final[key_name(db, t, k)] = [int(x) for x in val.split(",")] if val else []
    version = f"{pg.version.rstrip(')')} + MariaDB {my.sql('SELECT VERSION()')[0][0]}"
    res = Result(records, final, elapsed, version=version, left_prepared=left,
                 decided_in_participant=in_participant)
    res.report = check([r.txn() for r in records], final_reads=final)
    res.server_log = _read_log(pg, wall0)
    return res


def numbers(res: Result) -> dict:
    """What docs/guarantees.md's table records of a run."""
    return {"transactions": len(res.records), "committed": res.committed,
            "aborted": sum(r.status == "fail" for r in res.records),
            "unknown": sum(r.status == "info" for r in res.records), "seconds": round(res.seconds, 1),
            "edges": res.report.edges, "cycles": len(res.cycles()),
            "anomalies": [a.kind for a in res.report.anomalies], "lost_appends": len(res.lost_appends()),
            "aborts": dict(res.aborts()), "left_prepared": res.left_prepared}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m checker.list_append",
                                 description="List-append across PostgreSQL and MariaDB through the coordinator "
                                             "daemon; checks the combined history for cycles (exit 1 on any "
                                             "anomaly or anything left prepared, except with --mode none, "
                                             "the plain-2PC baseline whose cycles are expected).")
    ap.add_argument("--engines", required=True, help="pg,my (the only pair so far)")
    ap.add_argument("--mode", choices=tuple(MODES), default="co",
                    help="co, dip, client, pg_co+client, client+mysql_co, none (plain 2PC: the baseline)")
    ap.add_argument("--major", type=int, choices=(15, 16, 17, 18), default=None,
                    help="PostgreSQL major (default: the harness's)")
    ap.add_argument("--txns", type=int, help="stop after this many transactions started (committed or not)")
    ap.add_argument("--seconds", type=float, help="or stop after this many seconds")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--window", type=int, default=4, help="active keys per table and database (default 4)")
    ap.add_argument("--appends-per-key", type=int, default=5, help="appends after which a key is retired (default 5)")
    ap.add_argument("--think-ms", type=int, default=5, help="sleep 0..N-1 ms before each operation (default 5)")
    ap.add_argument("--seed", type=int, default=1, help="seeds each client's generator (threads interleave freely)")
    ap.add_argument("--log", help="write every transaction as JSON lines (python -m checker.list_append --from-log)")
    ap.add_argument("--json", help="write the run's numbers as one JSON object")
    ap.add_argument("--show", type=int, default=5, help="explain at most this many cycles in full (default 5)")
    a = ap.parse_args(argv)
    if sorted(x.strip() for x in a.engines.split(",")) != ["my", "pg"]:
        ap.error("--engines: only pg,my (one PostgreSQL and one MariaDB) is supported; "
                 "one PostgreSQL alone is `python -m checker.list_append` without --engines")
    if a.txns is None and a.seconds is None:
        ap.error("give --txns N or --seconds S")
    if (a.txns is not None and a.txns < 1) or (a.seconds is not None and a.seconds <= 0):
        ap.error("--txns and --seconds must be > 0")
    if a.clients < 1 or a.window < 1 or a.appends_per_key < 1 or a.think_ms < 0:
        ap.error("--clients, --window and --appends-per-key must be >= 1, --think-ms >= 0")
    from cotest import MariaServer, PgServer
    from cotest.servers import mysql_co_installed, pg_co_installed, pg_unavailable
    kw = {"major": a.major} if a.major else {}
    if a.major and pg_unavailable(a.major):
        ap.error(f"PostgreSQL {a.major} is not available: {pg_unavailable(a.major)}")
    # One pair of servers serves every mode (the extension and plugin are switched off
    # where the mode does not use them), so they must be installed.
    if not pg_co_installed(*([a.major] if a.major else [])) or not mysql_co_installed():
        ap.error("pg_co and mysql_co must be installed (scripts/build.sh)")
    label = (f"--engines pg,my --mode {a.mode}, {a.clients} clients, window {a.window}, think {a.think_ms} ms, "
             f"seed {a.seed}")
    with PgServer(preload=True, conf={"log_lock_waits": "on", "log_line_prefix": "'%m [%p] '",
                                      "log_timezone": "'UTC'"}, **kw) as pg, MariaServer(plugin=True) as my:
        res = run(pg, my, mode=a.mode, txns=a.txns, seconds=a.seconds, clients=a.clients, window=a.window,
                  appends_per_key=a.appends_per_key, seed=a.seed, think_ms=a.think_ms)
    print(summary(res, label, a.show))
    if a.log:
        with open(a.log, "w") as f:
            for r in res.records:
                f.write(json.dumps(r.to_json()) + "\n")
            f.write(json.dumps({"final": res.final}) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "mode": a.mode, "version": res.version, **numbers(res)}, f, indent=1)
    if a.mode == "none":
        return 0
    return 1 if res.anomalous or res.left_prepared else 0


if __name__ == "__main__":
    sys.exit(main())

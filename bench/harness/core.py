"""Environment and runner shared by the experiments (see package docstring).

Env starts PostgreSQL 15 (pg_co preloaded), MariaDB 10.11 (mysql_co loaded at startup) and
the coordinator daemon; every mode runs on the same servers and data, switched by
  pg_co.enabled         ALTER SYSTEM + pg_reload_conf() (checked from a new session)
  mysql_co_enabled      SET GLOBAL
  the daemon's `[[resources]] enforcement` (ENFORCEMENT: none, engine or client, both
                        resources alike): a daemon only reads its config at start, so
                        it is restarted (same port, token, node id and decision store)
                        whenever the mode needs another enforcement, after the servers
                        were switched, and the switch waits until its /metrics say
                        cotx_resource_enforcement{resource, mode} = 1 for both resources.
                        (`auto`, the daemon's default, would move a daemon whose servers
                        run with pg_co off to client mode at its next recovery pass: the
                        plain-2PC baseline would silently get shims.)
The decision store (Env.use_store, the experiment `store`): "sqlite" (default) is one
daemon with its SQLite file; "log" one daemon with the append-only decision log; "pg1" / "pg3" are 1 or 3 daemons (node ids benchpg0..2,
their own ports, one token) sharing a PostgreSQL store in its own PostgreSQL instance,
started at the first use (what a user of a replicated store runs: a cluster of its own,
not a database beside the application's; on this 2-core machine it still competes for
the same CPU, and its CPU is reported apart: cpu_snapshot's "store").
run_point() runs the modes interleaved (order rotated each repetition), each run being
CLIENTS worker processes that open their sessions, then warm up, then measure for a fixed
duration (only transactions that end inside the window count).
"""
from __future__ import annotations

import csv
import multiprocessing as mp
import os
import platform
import random
import statistics
import subprocess
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

from . import MODES, canonical
from cotest import MariaServer, PgServer, reap_orphans

from .driver import Abort, Driver, LocalRetry, attempt_line
from .reasons import pool as pool_reasons

ROOT = Path(__file__).resolve().parents[2]    # the checkout: results and plots live in bench/

PG_CONF = {
    "shared_buffers": "'256MB'",
    "max_pred_locks_per_transaction": 256,
    "max_wal_size": "'2GB'",
    "checkpoint_timeout": "'15min'",
    # SERIALIZABLE: a sequential scan takes a relation-level predicate lock, which conflicts
    # with every write to the table (PostgreSQL manual 13.2.3: "eliminate seq scans"). Tiny
    # hot tables (TPC-C warehouse, district) would otherwise be scanned sequentially.
    "enable_seqscan": "off",
}
MY_OPTIONS = ["--innodb-log-file-size=256M"]
# The PostgreSQL decision store's database and table in its own instance (Env.use_store).
STORE_DB, STORE_TABLE = "cotx_store", "cotx_decisions"
# The coordinator's documented production defaults (docs/coordinator.md), not the test ones.
COORD_TIMEOUTS = {"transaction_ms": 30000, "owner_grace_ms": 2000, "recovery_interval_ms": 5000,
                  "retry_initial_ms": 100, "retry_max_ms": 10000, "retention_ms": 60000}


# How the daemon enforces commitment ordering at both resources in each mode (a variant
# "base:label" runs its base), and the modes whose servers run pg_co and mysql_co.
ENFORCEMENT = {"local": "none", "2pc": "none", "co": "engine", "dip": "engine", "client": "client"}
ENGINES_ON = ("co", "dip")


def base_mode(mode: str) -> str:
    return canonical(mode).partition(":")[0]


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


def log_store_config(kind: str, workdir: str) -> dict:
    """The append-only decision log's [store] section: "log" (direct writes, the default
    sync method) or "log-fdatasync" (store.sync_method = "fdatasync")."""
    store = {"kind": "log", "path": os.path.join(workdir, "decisions.log")}
    if kind == "log-fdatasync":
        store["sync_method"] = "fdatasync"
    return store


class Env:
    def __init__(self, fsync: bool = True):
        reap_orphans()
        self.fsync = fsync
        self.pg = PgServer(conf=PG_CONF, fsync=fsync, preload=True)
        self.my = MariaServer(plugin=True, fsync=fsync, options=MY_OPTIONS)
        self.pg.start()
        self.my.start()
        # Which PostgreSQL ran goes into every log ($COTX_PG_MAJOR picks the major).
        log(f"servers: {self.pg.version} (pg_co), MariaDB (mysql_co)")
        self.pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")
        self.coord_dir = tempfile.mkdtemp(prefix="cotx-bench-coord-")
        self.daemon = None
        # The daemons running now (self.daemon is the first): one, or several sharing a
        # PostgreSQL store; built from _pool (one Daemon per node id, so that a node keeps
        # its directory and port across restarts) by store kind (use_store).
        self.daemons: list = []
        self._pool: dict = {}
        self.store = "sqlite"
        self.store_pg = None         # the PostgreSQL instance of the store, started at first use
        self.decisions = True
        self.enforcement = None      # what the running daemon was configured with
        self.mode = None
        self.start_daemon("none")    # servers as loaded: pg_co / mysql_co on, but nothing runs yet

    def close(self) -> None:
        for f in [d.stop for d in self._pool.values()] + [self.my.destroy, self.pg.destroy] \
                + ([self.store_pg.destroy] if self.store_pg else []):
            try:
                if f:
                    f()
            except Exception:  # noqa: BLE001
                pass

    # --- the coordinator daemon -----------------------------------------------------------
    def start_daemon(self, enforcement: str) -> None:
        """(Re)starts the daemon with `enforcement` at both resources, on the same port,
        token, node id and decision store. PostgreSQL is also declared a decision resource
        (mode dip) unless in client mode (the daemon refuses that pair: a decision resource
        needs pg_co) or the daemon does not know the setting (an older daemon: then it runs
        without it)."""
        for d in self.daemons:
            d.stop()
        for decisions in ((True, False) if self.decisions and enforcement != "client" else (False,)):
            pg_res = {"name": "pg", "kind": "postgres", "dsn": self.pg.dsn, "pool_size": 2, "enforcement": enforcement}
            if decisions:
                pg_res["decisions"] = True
            resources = [pg_res, {"name": "my", "kind": "mariadb", "dsn": self.my.dsn, "pool_size": 2,
                                  "enforcement": enforcement}]
            self.daemons = self._store_daemons(resources)
            self.daemon = self.daemons[0]
            for d in self.daemons:
                d.resources = resources
                d.write_config()
            try:
                for d in self.daemons:
                    d.start()
                break
            except RuntimeError:
                if not decisions:
                    raise
                for d in self.daemons:
                    d.stop()
                self.decisions = False
        self.enforcement = enforcement
        want = {"pg": enforcement, "my": enforcement}
        deadline = time.time() + 30
        while (got := self.daemon_enforcement()) != want:
            if time.time() > deadline:
                raise RuntimeError(f"the daemon configured with enforcement = {enforcement!r} reports {got}:\n"
                                   + self.daemon.log_tail())
            time.sleep(0.1)

    def _store_daemons(self, resources: list[dict]) -> list:
        """The daemons of the current store kind, from the pool: "sqlite" one (node id
        bench, its SQLite file in coord_dir), "log" one (node id benchlog, the append-only
        decision log in its own directory), "pgN" N of them on the PostgreSQL store. One
        token for all: the driver has one (--coord lists their URLs)."""
        from cotest.daemon import Daemon
        if self.store == "sqlite":
            specs = [("bench", None, self.coord_dir)]
        elif self.store.startswith("log"):
            node = {"log": "benchlog", "log-fdatasync": "benchlogfd"}[self.store]
            workdir = os.path.join(self.coord_dir, node)
            specs = [(node, log_store_config(self.store, workdir), workdir)]
        else:
            store = {"kind": "postgres", "dsn": self.store_dsn(), "table": STORE_TABLE}
            specs = [(f"benchpg{i}", store, os.path.join(self.coord_dir, f"benchpg{i}"))
                     for i in range(int(self.store[2:]))]
        out = []
        for node, store, workdir in specs:
            if node not in self._pool:
                os.makedirs(workdir, exist_ok=True)
                d = Daemon(resources, timeouts=COORD_TIMEOUTS, store=store, node_id=node, workdir=workdir)
                if self._pool:
                    d.token = next(iter(self._pool.values())).token
                self._pool[node] = d
            out.append(self._pool[node])
        return out

    def use_store(self, store: str) -> None:
        """Runs the daemon(s) on `store` from now on: "sqlite" (one daemon, its SQLite
        file), "log" / "log-fdatasync" (one daemon, the append-only decision log with
        direct writes / with fdatasync), or "pg1" / "pg3" (1 or 3 daemons, distinct node
        ids and ports, sharing the PostgreSQL store of its own instance), restarting them when it changes (with the
        running enforcement; what the last slice left prepared is decided first)."""
        assert store in ("sqlite", "log", "log-fdatasync") \
            or (store.startswith("pg") and store[2:].isdigit() and int(store[2:]) >= 1), store
        if store == self.store:
            return
        self.leftovers()
        if store.startswith("pg") and self.store_pg is None:
            self.start_store_server()
        for d in self.daemons:
            d.stop()
        self.daemons = []
        self.store = store
        self.start_daemon(self.enforcement)

    def start_store_server(self) -> None:
        """The decision store's PostgreSQL instance: no pg_co, PostgreSQL's default
        isolation (READ COMMITTED, as a store a user sets up), fsync as the benchmark's
        servers."""
        from cotest import PgServer
        self.store_pg = PgServer(preload=False, fsync=self.fsync,
                                 conf={"default_transaction_isolation": "'read committed'", "max_connections": 50})
        self.store_pg.start()
        self.store_pg.sql(f"CREATE DATABASE {STORE_DB}")
        log(f"decision store: {self.store_pg.version} on port {self.store_pg.port}, database {STORE_DB}")

    def store_dsn(self) -> str | None:
        """The PostgreSQL store's DSN (None before its first use)."""
        return self.store_pg.dsn.replace("dbname=postgres", f"dbname={STORE_DB}") if self.store_pg else None

    def use_binary(self, path: str | None) -> None:
        """Runs the daemon from `path` (None: the installed one) from now on, restarting it
        if it ran another binary: the `daemon` experiment compares two builds side by side."""
        if os.environ.get("COTX_COORDINATOR_BIN") == path or (path is None and "COTX_COORDINATOR_BIN" not in os.environ):
            return
        self.leftovers()
        if path is None:
            os.environ.pop("COTX_COORDINATOR_BIN", None)
        else:
            os.environ["COTX_COORDINATOR_BIN"] = path
        self.start_daemon(self.enforcement)

    @property
    def in_process_path(self) -> str:
        """The config of the coordinator in the driver's process (--coord inproc:PATH)."""
        return os.path.join(self.coord_dir, "inproc", "coordinator.toml")

    def in_process_config(self, commit_delay_us: int = 0, store_kind: str = "sqlite") -> str:
        """Writes the in-process coordinator's config: the running daemon's resources (so
        the mode's enforcement) and timeouts, with a node id and a store of its own (a node
        is owned by one coordinator at a time; the daemon keeps its own): SQLite, or the
        append-only decision log (`store_kind` "log", or "log-fdatasync": its
        sync_method = "fdatasync"), with the store's commit_delay_us."""
        from cotest.daemon import Daemon
        workdir = os.path.dirname(self.in_process_path)
        os.makedirs(workdir, exist_ok=True)
        store = {"kind": "sqlite", "path": os.path.join(workdir, "decisions.db")} if store_kind == "sqlite" \
            else log_store_config(store_kind, workdir)
        store["commit_delay_us"] = commit_delay_us
        Daemon(self.daemon.resources, timeouts=COORD_TIMEOUTS, store=store, node_id="benchinproc",
               workdir=workdir)  # writes it
        return self.in_process_path

    def daemon_enforcement(self) -> dict[str, str]:
        """What the daemon's /metrics say of each resource: cotx_resource_enforcement
        {resource, mode} = 1 (engine, client, none, unknown, refused). Several daemons:
        what they all say, or the disagreement (which no mode wants)."""
        seen = [self._enforcement_of(d) for d in self.daemons]
        if all(x == seen[0] for x in seen):
            return seen[0]
        return {"error": "daemons disagree: " + "; ".join(f"{d.node_id} {x}" for d, x in zip(self.daemons, seen))}

    def _enforcement_of(self, daemon) -> dict[str, str]:
        from cotest.coord import metrics_text  # cotest.coord imports cotx: loaded when a daemon runs
        out = {}
        try:
            text = metrics_text(daemon)
        except OSError as e:
            return {"error": str(e)}
        for line in text.splitlines():
            if line.startswith("cotx_resource_enforcement{") and line.rsplit(" ", 1)[1] == "1":
                labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
                out[labels["resource"].strip('"')] = labels["mode"].strip('"')
        return out

    def enforcement_seen(self, mode: str) -> tuple[str, str]:
        """What the daemon says now ("pg=client my=client"), and "" when that is what
        `mode` needs at both resources, else the failed check (a slice measured under
        another enforcement is no result; a recovery pass may have changed it)."""
        want = ENFORCEMENT[base_mode(mode)]
        got = self.daemon_enforcement()
        seen = " ".join(f"{k}={v}" for k, v in sorted(got.items()))
        return seen, ("" if got == {"pg": want, "my": want} else f"enforcement {seen} (want {want})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- modes ----------------------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        """The servers' switches, then the daemon's enforcement (restarted when it changes)."""
        mode = base_mode(mode)
        assert mode in ENFORCEMENT, mode
        want_pg = "on" if mode in ENGINES_ON else "off"
        want_my = "ON" if mode in ENGINES_ON else "OFF"
        self.pg.sql(f"ALTER SYSTEM SET pg_co.enabled = {want_pg}")
        self.pg.sql("SELECT pg_reload_conf()")
        deadline = time.time() + 10
        while self.pg.sql("SHOW pg_co.enabled")[0][0] != want_pg:
            if time.time() > deadline:
                raise RuntimeError("pg_co.enabled did not switch")
            time.sleep(0.05)
        self.my.sql(f"SET GLOBAL mysql_co_enabled = {want_my}")
        if ENFORCEMENT[mode] != self.enforcement:
            # What the last slice left prepared is decided by this daemon before it goes
            # (a client-mode daemon also rolls back its helpers then).
            self.leftovers()
            self.start_daemon(ENFORCEMENT[mode])
        self.mode = mode

    def settings(self) -> dict:
        return {"pg_co.enabled": self.pg.sql("SHOW pg_co.enabled")[0][0],
                "pg_co.conflict_action": self.pg.sql("SHOW pg_co.conflict_action")[0][0],
                "mysql_co_enabled": self.my.sql("SELECT @@global.mysql_co_enabled")[0][0]}

    def pg_co_refusals(self) -> dict:
        try:
            rows = self.pg.sql("SELECT * FROM co.stats")
            cols = [r for r in self.pg.sql(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'co.stats'::regclass AND attnum > 0 ORDER BY attnum")]
            return {c[0]: v for c, v in zip(cols, rows[0])}
        except Exception:  # noqa: BLE001
            return {}

    def leftovers(self) -> tuple[int, int]:
        """What is still prepared (PostgreSQL, MariaDB), after waiting a little: owners
        finish their branches, the daemon the rest, and in client mode the daemon rolls
        back its helper transactions once their branches are finished."""
        deadline = time.time() + 10
        while True:
            n_pg = self.pg.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0]
            n_my = len(self.my.sql("XA RECOVER"))
            if (n_pg == 0 and n_my == 0) or time.time() > deadline:
                return n_pg, n_my
            time.sleep(0.2)

    def vacuum(self) -> None:
        self.pg.sql("VACUUM ANALYZE")


# --- worker processes -----------------------------------------------------------------------
def _worker(env_ports, mode, wid, workload, seed, t_start, t_measure, t_end, q, attempt_log=None):
    pg_port, my_port, url, token = env_ports
    lines = [] if attempt_log else None
    n_attempt = 0
    res = {"wid": wid, "commits": 0, "lat": [], "aborts": Counter(), "attempts": 0, "error": None,
           "client_branches": 0}
    drv = None
    try:
        rng = random.Random(seed)
        drv = Driver(mode, wid, pg_port, my_port, url, token)
        drv.open(workload.sessions(wid))
        time.sleep(max(0.0, t_start - time.time()))
        while True:
            now = time.time()
            if now >= t_end:
                break
            subs = workload.txn(rng, wid)
            t0 = now
            pending = subs
            ok = False
            tries = 0
            while True:
                tries += 1
                n_attempt += 1
                try:
                    drv.run(pending)
                    ok = True
                    if lines is not None:
                        t = time.time()
                        lines.append(attempt_line(mode, drv.last_gtid or f"local-w{wid}-{n_attempt}", drv.last_ids,
                                                  pending, "commit", t_measure <= t < t_end, None, None))
                    break
                except LocalRetry as e:
                    if lines is not None:
                        t = time.time()
                        lines.append(attempt_line(mode, f"local-w{wid}-{n_attempt}", [], pending[e.done:], "abort",
                                                  t_measure <= t < t_end, e.reason, e.__cause__))
                    pending = pending[e.done:]
                    t = time.time()
                    if t_measure <= t < t_end:
                        res["aborts"][e.reason] += 1
                        res["attempts"] += 1
                    if tries > 10000:
                        raise RuntimeError("local sub-transaction never committed") from e
                    # local mode finishes what it started (no atomicity to fall back on)
                except Abort as e:
                    t = time.time()
                    if lines is not None:
                        lines.append(attempt_line(mode, drv.last_gtid or "", drv.last_ids, pending, "abort",
                                                  t_measure <= t < t_end, e.reason, e.__cause__))
                    if t_measure <= t < t_end:
                        res["aborts"][e.reason] += 1
                        res["attempts"] += 1
                    if t >= t_end:
                        break
            t1 = time.time()
            if ok and t_measure <= t1 < t_end:
                res["commits"] += 1
                res["attempts"] += 1
                res["lat"].append((t1 - t0) * 1000.0)
        res["client_branches"] = drv.client_branches
    except BaseException:  # noqa: BLE001 - reported by the parent
        res["error"] = traceback.format_exc()[-3000:]
    finally:
        if drv is not None:
            drv.close()
        if lines:
            # One append per worker: the workers' blocks do not interleave.
            with open(attempt_log, "a") as f:
                f.write("\n".join(lines) + "\n")
        q.put(res)


def _proc_cpu(pid: int, children: bool = False) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    t = int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if children else 0)
    return t / os.sysconf("SC_CLK_TCK")


def _postgres_cpu(data: Path) -> float:
    """A PostgreSQL instance's CPU seconds: postmaster + live processes (exited backends
    are in the postmaster's children time)."""
    pm = int((data / "postmaster.pid").read_text().split()[0])
    total = _proc_cpu(pm, children=True)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pm:
                    total += _proc_cpu(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return total


def cpu_snapshot(env: "Env") -> dict:
    """CPU seconds used so far: PostgreSQL, mariadbd, the coordinator daemons (all of
    them when several share a PostgreSQL store), the PostgreSQL store's instance ("store",
    0 with SQLite: then the store's work is in the daemon's own CPU), and the finished
    worker processes of this harness (RUSAGE_CHILDREN)."""
    import resource
    out = {"pg": 0.0, "my": 0.0, "coord": 0.0, "store": 0.0, "clients": 0.0}
    try:
        out["pg"] = _postgres_cpu(env.pg.data)
        out["my"] = _proc_cpu(int(env.my.pid_file.read_text().split()[0]))
        out["coord"] = sum(_proc_cpu(d.proc.pid) for d in (getattr(env, "daemons", None) or [env.daemon]) if d.proc)
        if getattr(env, "store_pg", None) is not None and env.store != "sqlite":
            out["store"] = _postgres_cpu(env.store_pg.data)
    except (OSError, ValueError, AttributeError):
        pass
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["clients"] = ru.ru_utime + ru.ru_stime
    return out


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def run_once(env: Env, mode: str, workload, clients: int, warmup: float, duration: float,
             seed: int, attempt_log=None) -> dict:
    env.set_mode(mode)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    cpu0 = cpu_snapshot(env)
    t_start = time.time() + 0.3 + 0.05 * clients
    t_measure = t_start + warmup
    t_end = t_measure + duration
    ports = (env.pg.port, env.my.port, env.daemon.url, env.daemon.token)
    procs = [ctx.Process(target=_worker, args=(ports, mode, w, workload, seed * 1000 + w,
                                               t_start, t_measure, t_end, q, attempt_log))
             for w in range(clients)]
    for p in procs:
        p.start()
    results = []
    deadline = t_end + 120
    while len(results) < clients:
        try:
            results.append(q.get(timeout=max(1.0, deadline - time.time())))
        except Exception:  # noqa: BLE001 - queue.Empty: a worker hung
            break
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    time.sleep(0.1)                     # let the postmaster reap the exited backends
    cpu1 = cpu_snapshot(env)
    errors = [r["error"] for r in results if r["error"]]
    if len(results) < clients:
        errors.append(f"{clients - len(results)} worker(s) did not report")
    lat = [x for r in results for x in r["lat"]]
    commits = sum(r["commits"] for r in results)
    attempts = sum(r["attempts"] for r in results)
    aborts = Counter()
    for r in results:
        aborts.update(r["aborts"])
    n_aborts = sum(aborts.values())
    left_pg, left_my = env.leftovers()
    # CPU per committed global transaction over the whole run (warm-up included, so it is
    # divided by every commit of the run, estimated from the measured rate).
    total_commits = max(1.0, commits / duration * (t_end - t_start))
    cpu = {k: (cpu1[k] - cpu0[k]) * 1000.0 / total_commits for k in cpu0}
    return {"mode": mode, "clients": clients, "duration_s": duration, "commits": commits,
            "tps": commits / duration, "p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99),
            "attempts": attempts, "aborts": n_aborts,
            "abort_rate": (n_aborts / attempts) if attempts else 0.0,
            "reasons": ";".join(f"{k}={v}" for k, v in aborts.most_common()),
            "client_branches": sum(r["client_branches"] for r in results),
            "leftover_prepared": f"{left_pg}/{left_my}",
            "cpu_ms_pg": cpu["pg"], "cpu_ms_my": cpu["my"], "cpu_ms_coord": cpu["coord"],
            "cpu_ms_clients": cpu["clients"],
            "errors": " | ".join(e.strip().splitlines()[-1] for e in errors)[:500],
            "_errors_full": errors}


RUN_FIELDS = ["experiment", "point", "params", "rep", "order", "mode", "clients", "duration_s",
              "commits", "tps", "p50_ms", "p99_ms", "attempts", "aborts", "abort_rate", "reasons",
              "client_branches", "cpu_ms_pg", "cpu_ms_my", "cpu_ms_coord", "cpu_ms_clients", "leftover_prepared",
              "enforcement", "check", "errors", "started_utc"]


def run_point(env: Env, experiment: str, point: str, params: dict, workload, *, clients: int,
              warmup: float, duration: float, reps: int, modes=MODES, csv_path: Path | None = None,
              progress_prefix: str = "", check=None, attempt_log=None) -> list[dict]:
    """All modes, `reps` repetitions, interleaved; rows appended to csv_path."""
    rows = []
    env.vacuum()
    for rep in range(reps):
        order = list(modes[rep % len(modes):]) + list(modes[:rep % len(modes)])
        for pos, mode in enumerate(order):
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            r = run_once(env, mode, workload, clients, warmup, duration, seed=rep * 7919 + pos + 1,
                         attempt_log=attempt_log)
            r["check"] = check(env) if check else ""
            # The daemon still enforced as the mode needs (a recovery pass re-probes).
            r["enforcement"], bad = env.enforcement_seen(mode)
            if bad:
                r["check"] = (r["check"] + "; " if r["check"] and r["check"] != "ok" else "") + bad
            r.update({"experiment": experiment, "point": point, "rep": rep + 1, "order": pos + 1,
                      "params": " ".join(f"{k}={v}" for k, v in params.items()), "started_utc": started})
            if r["_errors_full"]:
                log("  worker errors:\n" + "\n".join(r["_errors_full"][:2]))
            rows.append(r)
            log(f"{progress_prefix}[{experiment} {point}] rep {rep + 1}/{reps} {mode:5s} "
                f"{r['tps']:8.1f} tx/s  p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
                f"aborts {r['abort_rate']:6.2%}  {r['reasons'][:70]}"
                + (f"  check: {r['check']}" if r["check"] and r["check"] != "ok" else ""))
            if csv_path is not None:
                new = not csv_path.exists()
                with open(csv_path, "a", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=RUN_FIELDS, extrasaction="ignore")
                    if new:
                        w.writeheader()
                    w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    return rows


def summarize(rows: list[dict], modes=MODES) -> list[dict]:
    """Per (experiment, point, mode): medians over repetitions, ratio to 2pc of the same
    repetition (median of per-repetition ratios), pooled abort rate and reasons."""
    out = []
    keys = []
    for r in rows:
        k = (r["experiment"], r["point"])
        if k not in keys:
            keys.append(k)
    for exp, point in keys:
        pr = [r for r in rows if r["experiment"] == exp and r["point"] == point]
        base = {int(r["rep"]): float(r["tps"]) for r in pr if r["mode"] == "2pc"}
        for mode in modes:
            mr = [r for r in pr if r["mode"] == mode]
            if not mr:
                continue
            ratios = [float(r["tps"]) / base[int(r["rep"])] for r in mr
                      if base.get(int(r["rep"]))]
            attempts = sum(int(r["attempts"]) for r in mr)
            aborts = sum(int(r["aborts"]) for r in mr)
            out.append({"experiment": exp, "point": point, "params": mr[0]["params"], "mode": mode,
                        "reps": len(mr),
                        "tps_median": statistics.median(float(r["tps"]) for r in mr),
                        "p50_ms_median": statistics.median(float(r["p50_ms"]) for r in mr),
                        "p99_ms_median": statistics.median(float(r["p99_ms"]) for r in mr),
                        "abort_rate": aborts / attempts if attempts else 0.0,
                        "ratio_to_2pc": statistics.median(ratios) if ratios else float("nan"),
                        "reasons": pool_reasons(mr),
                        "cpu_ms_per_tx": "/".join(f"{statistics.median(float(r.get(k) or 0) for r in mr):.2f}"
                                                  for k in ("cpu_ms_pg", "cpu_ms_my", "cpu_ms_coord", "cpu_ms_clients")),
                        "checks": ",".join(sorted({str(r.get("check", "")) for r in mr})) or "",
                        })
    return out


SUMMARY_FIELDS = ["experiment", "point", "params", "mode", "reps", "tps_median", "p50_ms_median",
                  "p99_ms_median", "abort_rate", "ratio_to_2pc", "cpu_ms_per_tx", "reasons", "checks"]


def write_summary(summary: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS, extrasaction="ignore")
        w.writeheader()
        for s in summary:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in s.items()})


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def machine() -> dict:
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001
            return "?"
    return {
        "cpu": sh("lscpu | sed -n 's/^Model name: *//p' | head -1") + f", {os.cpu_count()} cores",
        "memory": sh("free -g | awk '/Mem:/{print $2\" GiB\"}'"),
        "disk": sh("df -h /tmp | awk 'NR==2{print $1\" (\"$2\")\"}'"),
        "kernel": platform.release(),
        "os": sh(". /etc/os-release; echo $PRETTY_NAME"),
        "postgresql": sh("/usr/lib/postgresql/15/bin/postgres --version"),
        "mariadb": sh("mariadbd --version | cut -c1-60"),
        "python": platform.python_version(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }

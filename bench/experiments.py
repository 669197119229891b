"""The side-by-side experiments with the Rust load driver in interleaved slices (the
default of bench/run_all.py; run it through that script).

Experiments (--experiments, comma-separated):
  micro     microbenchmark default point: 2pc, 2pc:ser (MariaDB SERIALIZABLE), co, dip (when
            the installed pg_co and daemon support it), client, local; then the same point
            settled (after its load and a plain VACUUM): 2pc, co, dip, client
  levers    the default point with one lever at a time, in 2pc and co alike:
            pg_co.conflict_action = wait (max_wait 0: wait until lock_timeout); pg_co.max_wait = 0
            (refuse at once, the old default; if the GUC exists); max_pred_locks_per_page = 64;
            fillfactor 100 and 50 instead of 80; prepares and finishes in parallel (modes
            2pc:par and co:par beside their sequential 2pc and co). Each lever starts from
            the tables rewritten (VACUUM FULL at its fillfactor).
            Every point records the settings in effect and the share of HOT updates.
  ro        read-only MariaDB branches (S=2, P=0, R=12, W=0): 2pc, co, client, local
  tpcc      TPC-C W = --warehouses with the split YTD rows (--ytd-split), 2pc, co, client,
            local; plus W=4 with the classic schema to compare
  autocommit MariaDB autocommit reads beside XA writers: 2pc, and co with
            mysql_co_lock_autocommit_reads OFF and ON (variants interleaved like modes)
  coordinator  what the coordinator costs: the micro default point in modes local, 2pc, co,
            dip, and 2pc:per-step, co:per-step (the driver's calls as before batching: a
            request per branch and per acknowledgement), and 2pc:inproc, co:inproc,
            dip:inproc (the coordinator in the driver's process, its CPU booked as the
            coordinator's), 2pc:inproc-delay, co:inproc-delay (the same with the
            store's commit_delay_us = 1000), 2pc:1req, co:1req, dip:1req (the
            one-request path, the driver's --one-request: leased gtids, the commit the
            only request; dip's hands the decision to the PostgreSQL branch),
            2pc:1req-log, co:1req-log, 2pc:inproc-log, co:inproc-log (the same with the
            append-only decision log as the store), 2pc:1req-log-fdatasync,
            2pc:inproc-log-fdatasync (the log with store.sync_method = "fdatasync"),
            2pc:inproc-log-delay, co:inproc-log-delay (the log with commit_delay_us =
            1000), 2pc:1req-log-backoff, co:1req-log-backoff (a refused attempt retried
            after the clients' jittered backoff, the driver's --retry-backoff-ms 20,
            instead of at once), 2pc:inproc-1req-log, co:inproc-1req-log and their
            -delay variants (the coordinator in the driver's process on the one-request
            path), 2pc:1req-log-pglast, co:1req-log-pglast (MariaDB's branch prepared
            before PostgreSQL's, the driver's --prepare-pg-last); with
            --other-daemon also 2pc:other,
            co:other (that build, driven per step, or --other-calls batched); then the
            same point with every global transaction read-only (RO=100%: local, 2pc,
            co, 2pc:1req, co:1req); not in the default set
  narayana  the micro default point through Narayana's in-process JTA transaction manager
            (the Java driver clients/java/example io.cotx.tm.Load: modes 2pc:jta plain XA, co:jta with
            pg_co / mysql_co on) beside the daemon (2pc, co), interleaved; not in the
            default set (needs `bash scripts/build-jta-load.sh` first)
  scaling   not in the default set (about 35 minutes): the micro default point swept one
            parameter at a time, S = 2, 3, 5 branches, clients 1, 8, 32, 64, read-only share
            0, 50, 100 %: 2pc, co, local (bench/harness/scaling.py); PNGs per sweep
            (bench/harness/scaling_plots.py) into --plots-dir
  profile   (not in the default; alone) where the daemon's cost per transaction goes:
            bench/coordinator/profile.py for this build with batched calls, and with
            --other-daemon for that build per step; JSON and a before/after table in
            --out/profile (bench/coordinator/profile_pair.py; needs strace and perf)
  store     (not in the default) the decision store: micro default point in 2pc and co with
            the SQLite store (one daemon) and the PostgreSQL store in its own instance shared
            by 1 or 3 daemons (variants :pg1, :pg3); then the store alone (bench-store)
            (bench/harness/decision_store.py)
Every experiment starts with the quiet-machine check (refuses unless --force).

Modes: local and 2pc run the daemon with enforcement = "none", co and dip with "engine",
client (the product's client mode; `shim` is accepted for it in --modes) with "client"
and pg_co / mysql_co switched off; the daemon is restarted when a slice needs another
enforcement than the one before (bench/harness/core.py, Env.set_mode).
--modes (e.g. 2pc,co,client) narrows every point to those of its modes (2pc is the
baseline of the ratios: keep it).
--rate TPS runs every slice in the driver's open loop (bench/loadgen/src/pace.rs): TPS
transactions per second whatever the completions, so the modes' CPU per transaction
compares at equal throughput. Every slice, in either loop, counts the flushes per commit
(bench/harness/flushes.py: PostgreSQL's WAL syncs, MariaDB's redo fsyncs, the decision
store's syncs).
"""
from __future__ import annotations

import argparse
import ast
import re
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psycopg

from bench.harness import canonical, decision_store, jta, loadgen, refusal_breakdown, scaling, scaling_plots, slices, slices_report
from bench.harness.core import Env, log, machine, read_csv
from bench.micro import micro
from bench.tpcc import tpcc

ROOT = Path(__file__).resolve().parents[1]
ALL = "micro,levers,ro,tpcc,autocommit"
MICRO_MODES = ["2pc", "2pc:ser", "co", "dip", "client", "local"]
RO_MODES = ["2pc", "co", "client", "local"]
TPCC_MODES = ["2pc", "co", "client", "local"]
SETTLED_MODES = ["2pc", "co", "dip", "client"]
COORDINATOR_MODES = ["local", "2pc", "co", "dip", "2pc:per-step", "co:per-step", "2pc:inproc", "co:inproc", "dip:inproc",
                     "2pc:inproc-delay", "co:inproc-delay", "2pc:1req", "co:1req", "dip:1req"]
# The same with the append-only decision log as the store (docs/coordinator.md, "Decision
# store"): the daemon on the one-request path, and in the driver's process.
COORDINATOR_LOG_MODES = ["2pc:1req-log", "co:1req-log", "2pc:inproc-log", "co:inproc-log",
                         "2pc:1req-log-fdatasync", "2pc:inproc-log-fdatasync", "2pc:inproc-log-delay",
                         "co:inproc-log-delay", "2pc:1req-log-backoff", "co:1req-log-backoff",
                         "2pc:inproc-1req-log", "co:inproc-1req-log", "2pc:inproc-1req-log-delay",
                         "co:inproc-1req-log-delay", "2pc:1req-log-pglast", "co:1req-log-pglast"]


def log_store_of(mode: str) -> str:
    """The store of a log mode: "log" (direct writes, the default sync method) or
    "log-fdatasync" (store.sync_method = "fdatasync")."""
    return "log-fdatasync" if mode.endswith("-log-fdatasync") else "log"
# The coordinator experiment's all-read-only point.
COORDINATOR_RO_MODES = ["local", "2pc", "co", "2pc:1req", "co:1req"]
# store.commit_delay_us of the :inproc-delay modes (bench/RESULTS.md, "The decision store's
# commit delay": 1 ms gathered about three decisions per sync at the micro default point).
INPROC_COMMIT_DELAY_US = 1000
# The driver's calls as before batching: a request per branch and per acknowledgement.
PER_STEP = ["--calls", "per-step"]
# The one-request path (variants :1req): gtids leased by each client, the commit the
# transaction's only request (docs/coordinator.md, "One request per transaction").
ONE_REQUEST = ["--one-request"]
# The clients' documented retry path (variants -backoff): a refused attempt runs again after
# the full-jitter backoff of cotx/retry.py, Go's Run and Java's Retry (base 20 ms, at most
# 1 s), not at once.
CLIENT_BACKOFF = ["--retry-backoff-ms", "20"]
# PostgreSQL's branches prepared last (variants -pglast): in doubt for less time, so fewer
# pg_co rule A refusals of the branches that read what they overwrote.
PG_LAST = ["--prepare-pg-last"]
# The daemon path and Narayana's (variants :jta, bench/harness/jta.py), plain 2PC and CO.
NARAYANA_MODES = ["2pc", "co", "2pc:jta", "co:jta"]
SETTLED = slices_report.SETTLED


def _setting(env, name: str) -> str:
    """The value in effect for new sessions, without unit (pg_settings.setting)."""
    return str(env.pg.sql(f"SELECT setting FROM pg_settings WHERE name = '{name}'")[0][0])


def set_gucs(env, values: dict[str, str | None], expect: dict[str, str] | None = None) -> None:
    """ALTER SYSTEM SET (RESET when a value is None) + one reload, then waits until new
    sessions see `expect` (default: the values set)."""
    for name, value in values.items():
        env.pg.sql(f"ALTER SYSTEM RESET {name}" if value is None else f"ALTER SYSTEM SET {name} = '{value}'")
    env.pg.sql("SELECT pg_reload_conf()")
    deadline = time.time() + 10
    for name, want in (expect or values).items():
        while _setting(env, name) != str(want):
            if time.time() > deadline:
                raise RuntimeError(f"{name} did not switch to {want}")
            time.sleep(0.05)


@contextmanager
def gucs(env, values: dict[str, str]):
    """The settings for the duration of a lever (reloadable ones), then back to what they
    were before (RESET, so the configuration file and the server's defaults hold again)."""
    before = {n: _setting(env, n) for n in values}
    set_gucs(env, values)
    try:
        yield
    finally:
        set_gucs(env, {n: None for n in values}, expect=before)


def has_guc(env, name: str) -> bool:
    return bool(env.pg.sql(f"SELECT count(*) FROM pg_settings WHERE name = '{name}'")[0][0])


# What "default" meant at a point: pg_co's settings and PostgreSQL's predicate-lock
# granularity, as new sessions see them (SHOW, with units).
RECORDED = ["pg_co.max_wait", "pg_co.conflict_action", "pg_co.rule_c_read_only", "max_pred_locks_per_transaction",
            "max_pred_locks_per_relation", "max_pred_locks_per_page", "enable_seqscan"]


def effective_settings(env) -> dict[str, str]:
    out = {n: str(env.pg.sql(f"SHOW {n}")[0][0]) for n in RECORDED if has_guc(env, n)}
    opts = env.pg.sql("SELECT reloptions FROM pg_class WHERE relname = 'mt0'")
    if opts:
        ff = [o for o in (opts[0][0] or []) if o.startswith("fillfactor=")]
        out["mt* fillfactor"] = ff[0].split("=", 1)[1] if ff else "100 (PostgreSQL's default)"
    return out


def update_counts(env) -> tuple[int, int]:
    """(updates, HOT updates) of the microbenchmark's PostgreSQL tables so far. A non-HOT
    update inserts a new entry into the primary key's leaf page, and that insertion is an
    SSI write on the whole page (the conflicts labelled same_index_page)."""
    r = env.pg.sql("SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables "
                   "WHERE relname ~ '^mt[0-9]+$'")
    return int(r[0][0]), int(r[0][1])


def set_fillfactor(env, ff: int) -> None:
    for i in range(micro.MAX_TABLES):
        env.pg.sql(f"ALTER TABLE mt{i} SET (fillfactor = {ff})")
        env.pg.sql(f"VACUUM FULL mt{i}")
    env.pg.sql("ANALYZE")


def refusal_breakdowns(env, path: Path, modes: list[str]) -> dict[str, str]:
    """The refusal breakdown of each mode in one attempt log: the log read once, one page
    map for all (run while the servers are up: page membership comes from PostgreSQL's
    predicate locks). A variant such as co:par has a log of its own in which the driver
    names the base mode (co). Modes without a pg_co refusal are left out."""
    if not path.exists():
        return {}
    try:
        attempts = refusal_breakdown.load(str(path))
        out = {}
        with psycopg.connect(env.pg.dsn, autocommit=True) as conn:
            pages = refusal_breakdown.PageMap(conn)
            for mode in modes:
                counts, _ = refusal_breakdown.breakdown(attempts, pages, {mode.partition(":")[0]})
                if counts:
                    out[mode] = refusal_breakdown.format_table(counts)
        return out
    except Exception as e:  # the measurements stand without it; say why it is missing
        return {mode: f"(refusal_breakdown failed: {e!r:.300})" for mode in modes}


def other_calls(a) -> list[str]:
    """The driver's arguments for the variants :other (--other-calls)."""
    return PER_STEP if a.other_calls == "per-step" else []


def only(modes, wanted: str) -> list[str]:
    """A point's modes narrowed to those in `wanted` (--modes, comma-separated; empty: all),
    by name or by base (2pc keeps 2pc's variants too, unless some of them are named: then
    only those), in the point's order; shim is spelled client."""
    keep = {canonical(m) for m in wanted.split(",") if m}
    named_variants = {m.partition(":")[0] for m in keep if ":" in m}
    return [m for m in map(canonical, modes)
            if not keep or m in keep or (m.partition(":")[0] in keep - named_variants)]


def unmatched_modes(wanted: str, offered) -> list[str]:
    """The names in --modes that `only` kept no mode for: neither a mode of some point nor
    the base of one."""
    bases = {m.partition(":")[0] for m in offered}
    return [w for w in dict.fromkeys(canonical(m) for m in wanted.split(",") if m)
            if w not in offered and w not in bases]


def estimate(a, exps) -> float:
    # A slice: its warm-up and window, about 1.5 s of setup, and a daemon restart (about
    # 1 s) when its enforcement differs from the slice's before (ABBA: most slices of a
    # point with modes of two enforcements or more).
    per = a.warmup + a.seconds + 1.5
    n = 0

    def count(modes):
        return len(only(modes, a.modes))
    if "micro" in exps:
        n += (count(MICRO_MODES) + count(SETTLED_MODES)) * (a.slices + 0.5)
    if "levers" in exps:
        n += (5 * count(["2pc", "co"]) + count(["2pc", "co", "2pc:par", "co:par"])) * (a.slices + 0.5)
    if "ro" in exps:
        n += count(RO_MODES) * (a.slices + 0.5)
    if "daemon" in exps:
        n += count(["2pc", "2pc:other", "co", "co:other"]) * (a.slices + 0.5)
    if "coordinator" in exps:
        n += (count(COORDINATOR_MODES + COORDINATOR_LOG_MODES) + count(COORDINATOR_RO_MODES) + (count(["2pc", "co"]) if a.other_daemon else 0)) \
            * (a.slices + 0.5)
    if "tpcc" in exps:
        n += (len(a.warehouses.split(",")) + (1 if a.ytd_split else 0)) * count(TPCC_MODES) * (a.slices + 0.5)
    if "narayana" in exps:
        # A :jta slice also starts a JVM (about 2 s, outside the window).
        n += count(NARAYANA_MODES) * (a.slices + 0.5) + count(["2pc:jta", "co:jta"]) * (a.slices + 0.5) * 2 / (per + 1.0)
    if "autocommit" in exps:
        n += count(["2pc", "co:acr=OFF", "co:acr=ON"]) * (a.slices + 0.5)
    if "scaling" in exps:
        # 64 clients open 128 sessions per slice: a few seconds more at those points.
        n += scaling.slices_count(count(scaling.MODES), a.slices) * 1.1
    if "store" in exps:
        # Every slice restarts the daemons (the store changes); plus the store alone.
        n += count(decision_store.MODES) * (a.slices + 0.5) * 1.5 + 1
    rewrites = 8 if {"micro", "levers"} & set(exps) else 0
    rewrites += 1 if "scaling" in exps else 0   # set_fillfactor: about 5 s each at N = 100000
    return n * (per + 1.0) / 60 + 1.5 + rewrites * 5 / 60


class _Measuring:
    """One measuring run on one set of servers (`env`): `point` runs a point's slices,
    interleaved, and keeps their rows, settings and refusal breakdowns; each experiment is
    a method of its name (`EXPERIMENT_ORDER`: the order they run in, whatever the order of
    --experiments)."""

    def __init__(self, a, env, meta, csv_path, att_dir, sizes):
        self.a, self.env, self.meta, self.csv_path, self.att_dir = a, env, meta, csv_path, att_dir
        self.items, self.customers, self.rows_n = sizes
        self.common = dict(slices=a.slices, warmup=a.warmup, seconds=a.seconds, rate=a.rate)
        self.dflt = micro.parse_point("default", dict(micro.DEFAULTS, N=self.rows_n))
        self.rows: list = []
        self.breakdowns: dict[str, str] = {}
        self.offered: set[str] = set()   # every mode a point had, before --modes narrowed it

    def point(self, exp, name, params, wargs, modes, clients, extra=None, check=None, log_attempts=False,
              switch=None):
        a, env, meta = self.a, self.env, self.meta
        self.offered.update(map(canonical, modes))
        modes = only(modes, a.modes)
        if not modes:
            log(f"[{exp} {name}] none of its modes is in --modes {a.modes}: skipped")
            return []
        q = meta["quiet"][f"{exp} {name}"] = slices.quiet_check(sample_s=1.0, use_load=False)
        if not q["quiet"]:
            log(f"quiet check before {exp} {name}: NOT QUIET ({q['why']})")
        att = None
        if log_attempts and not a.no_attempt_logs:
            att = self.att_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{exp}_{name}") + ".jsonl")
        settings = meta["settings"][f"{exp} {name}"] = effective_settings(env)
        upd0 = update_counts(env)
        rows = slices.run_point(env, exp, name, params, wargs, modes, clients=clients, csv_path=self.csv_path,
                                extra=extra, check=check, attempt_log=att, quiet=q, switch=switch,
                                **self.common)
        upd, hot = (x1 - x0 for x1, x0 in zip(update_counts(env), upd0))
        if upd:
            settings["HOT updates of mt*"] = f"{100 * hot / upd:.1f} % of {upd}"
        self.rows.extend(rows)
        if att is not None:
            # One breakdown per mode that runs pg_co (a variant such as co:par has a
            # log of its own), so that co's and dip's refusals are not pooled.
            per_log: dict[Path, list[str]] = {}
            for mode in modes:
                if mode.partition(":")[0] in ("co", "dip"):
                    per_log.setdefault(slices.variant_log(att, mode), []).append(mode)
            for path, log_modes in per_log.items():
                for mode, b in refusal_breakdowns(env, path, log_modes).items():
                    self.breakdowns[f"{exp} {name}, {mode}"] = b
        return rows

    def micro(self):
        a, env, dflt, point = self.a, self.env, self.dflt, self.point
        set_fillfactor(env, 80)
        # 2pc:ser: plain 2PC with MariaDB at SERIALIZABLE as co runs it (2pc's branches
        # run REPEATABLE READ), to tell CO's rules from MariaDB's isolation in co's cost.
        point("micro", "default", dflt, loadgen.micro_args(dflt), MICRO_MODES, a.clients,
              log_attempts=True, extra={"2pc:ser": ["--my-isolation", "serializable"]})
        # The same tables after those minutes of load and a plain VACUUM (run_point's,
        # what autovacuum does): the steady state of a service that has been running,
        # where pruning has made room for HOT updates again (docs/benchmarks.md).
        point("micro", SETTLED, dflt, loadgen.micro_args(dflt), SETTLED_MODES, a.clients,
              log_attempts=True)

    def daemon(self):
        a, env, dflt, point = self.a, self.env, self.dflt, self.point
        # Two builds of the daemon on the same servers and data, slice by slice: the
        # variants :other restart the daemon from the other binary (same config,
        # store and port), the plain modes from the installed one.
        set_fillfactor(env, 80)
        # The other build is driven with the per-step calls every version understands,
        # or with this build's calls (--other-calls batched: like for like, for a build
        # that has them).
        mine, other = (lambda env: env.use_binary(None)), (lambda env: env.use_binary(a.other_daemon))
        calls = other_calls(a)
        point("daemon", "default", dflt, loadgen.micro_args(dflt), ["2pc", "2pc:other", "co", "co:other"],
              a.clients, switch={"2pc": mine, "co": mine, "2pc:other": other, "co:other": other},
              extra={"2pc:other": calls, "co:other": calls})
        env.use_binary(None)

    def coordinator(self):
        a, env, dflt, point = self.a, self.env, self.dflt, self.point
        # What the coordinator costs: the micro default point in every mode with a
        # coordinator and without one (local), the calls per step (:per-step, the
        # protocol before batched calls) beside the batched ones, and with
        # --other-daemon an earlier build driven per step (:other), interleaved.
        set_fillfactor(env, 80)
        def on_store(kind):
            def switch_to(env):
                env.use_binary(None)
                env.use_store(kind)
            return switch_to
        mine = on_store("sqlite")
        modes = COORDINATOR_MODES + COORDINATOR_LOG_MODES + (["2pc:other", "co:other"] if a.other_daemon else [])
        switch = {m: mine for m in COORDINATOR_MODES}
        switch.update({m: on_store(log_store_of(m)) for m in COORDINATOR_LOG_MODES})
        if a.other_daemon:
            other = lambda env: env.use_binary(a.other_daemon)  # noqa: E731
            switch.update({"2pc:other": other, "co:other": other})
        # :inproc, the coordinator in the driver's process (bench/loadgen --coord
        # inproc:CONFIG): its config written at the switch with the mode's enforcement.
        def in_process(delay_us, store_kind="sqlite"):
            # The daemon stays on whichever store it runs (its resources give the mode's
            # enforcement; the coordinator in the driver's process has a store of its own).
            def switch_to(env):
                env.use_binary(None)
                env.in_process_config(commit_delay_us=delay_us, store_kind=store_kind)
            return switch_to
        inproc = [m for m in modes if ":inproc" in m]
        switch.update({m: in_process(INPROC_COMMIT_DELAY_US if m.endswith("-delay") else 0,
                                     log_store_of(m) if "-log" in m else "sqlite") for m in inproc})
        extra = {m: PER_STEP for m in modes if m.endswith(":per-step")}
        extra.update({m: other_calls(a) for m in modes if m.endswith(":other")})
        extra.update({m: ["--coord", "inproc:" + env.in_process_path] for m in inproc})
        extra.update({m: ONE_REQUEST + (CLIENT_BACKOFF if m.endswith("-backoff") else [])
                      + (PG_LAST if m.endswith("-pglast") else []) for m in modes if ":1req" in m})
        # :inproc-1req: the coordinator in the driver's process on the one-request path.
        extra.update({m: extra[m] + ONE_REQUEST for m in inproc if "-1req" in m})
        point("coordinator", "default", dflt, loadgen.micro_args(dflt), modes, a.clients, switch=switch,
              extra=extra)
        # Every global transaction read-only (the driver's --ro-share 1): nothing for the
        # coordinator to force, the begin path and the one-request path against local.
        ro = dict(dflt, RO=1.0)
        point("coordinator", "RO=100%", ro, loadgen.micro_args(dflt) + ["--ro-share", "1"], COORDINATOR_RO_MODES,
              a.clients, switch=switch, extra=extra)
        env.use_binary(None)

    def narayana(self):
        a, env, dflt, point = self.a, self.env, self.dflt, self.point
        # The same point, tables and servers for both transaction managers, slice by
        # slice: :jta runs the Java driver with Narayana in its process instead of
        # the Rust driver through the daemon (the servers switched for the base).
        set_fillfactor(env, 80)
        point("narayana", "default", dflt, loadgen.micro_args(dflt), NARAYANA_MODES, a.clients)

    def store(self):
        a, env, dflt, point, meta = self.a, self.env, self.dflt, self.point, self.meta
        # The decision store: SQLite (one daemon) vs PostgreSQL shared by 1 and 3
        # daemons, each mode switched to its store before its slice.
        set_fillfactor(env, 80)
        point("store", "default", dflt, loadgen.micro_args(dflt), decision_store.MODES, a.clients,
              switch=decision_store.switch_hooks())
        env.use_store("sqlite")
        meta["store_alone"] = decision_store.store_alone(env, a.out, smoke=a.smoke)

    def levers(self):
        a, env, dflt, point = self.a, self.env, self.dflt, self.point
        def lever(name, ff=80, modes=("2pc", "co"), extra=None):
            # Every lever starts from the same physical layout (table rewritten, index
            # rebuilt), so that points compare without the order they ran in.
            set_fillfactor(env, ff)
            point("micro_levers", name, dflt, loadgen.micro_args(dflt), list(modes), a.clients,
                  extra=extra, log_attempts=True)
        bounded = has_guc(env, "pg_co.max_wait")
        # Today's wait: until the blocker's decision, bounded by lock_timeout only. In
        # wait mode a max_wait above 0 bounds the wait (then refuses), so it goes to 0.
        with gucs(env, {"pg_co.conflict_action": "wait", **({"pg_co.max_wait": "0"} if bounded else {})}):
            lever("conflict_action=wait")
        if bounded:
            # The old default: rule B refuses at once (abort mode, no bounded wait).
            with gucs(env, {"pg_co.max_wait": "0"}):
                lever("max_wait=0")
        else:
            log("pg_co.max_wait does not exist in the installed pg_co: lever skipped")
        # Predicate-lock granularity: the only setting that can make a conflict finer
        # here (docs/benchmarks.md, "Predicate-lock granularity"); reloadable.
        with gucs(env, {"max_pred_locks_per_page": "64"}):
            lever("max_pred_locks_per_page=64")
        lever("fillfactor=100", ff=100)
        lever("fillfactor=50", ff=50)
        # With its sequential control in the same point (variants :par), so that the
        # lever is compared on the same data, not against an earlier point.
        par = ["--parallel-prepare", "--parallel-finish"]
        lever("parallel prepare+finish", modes=("2pc", "co", "2pc:par", "co:par"),
              extra={"2pc:par": par, "co:par": par})
        set_fillfactor(env, 80)

    def ro(self):
        a, point, rows_n = self.a, self.point, self.rows_n
        p = micro.parse_point("R=12:W=0:P=0", dict(micro.DEFAULTS, N=rows_n))
        point("micro_ro", "R=12:W=0:P=0", p, loadgen.micro_args(p), RO_MODES, a.clients)

    def autocommit(self):
        a, env, dflt, point = self.a, self.env, self.dflt, self.point
        # One point, the two settings as variants of mode co, interleaved like modes.
        p = dict(dflt, A=0.8)
        wargs = loadgen.micro_args(dflt) + ["--autocommit-reads", "0.8"]

        def acr(on):
            return lambda env: env.my.sql(f"SET GLOBAL mysql_co_lock_autocommit_reads = {on}")
        point("autocommit", "autocommit reads 80%", p, wargs, ["2pc", "co:acr=OFF", "co:acr=ON"], a.clients,
              switch={"2pc": acr("OFF"), "co:acr=OFF": acr("OFF"), "co:acr=ON": acr("ON")})
        env.my.sql("SET GLOBAL mysql_co_lock_autocommit_reads = DEFAULT")

    def scaling(self):
        env, dflt, point = self.env, self.dflt, self.point
        # From the layout the micro point starts from (tables rewritten at fillfactor
        # 80), so the study's default point compares with micro's default.
        set_fillfactor(env, 80)
        for pt in scaling.points():
            scaling.check_connections(env, pt, dflt["P"])
            p = scaling.params(pt, dflt)
            point(scaling.EXPERIMENT, scaling.name(pt), p, loadgen.micro_args(p) + scaling.driver_args(pt),
                  scaling.MODES, pt["clients"])

    def tpcc(self):
        a, env, point, items, customers = self.a, self.env, self.point, self.items, self.customers
        plan = [(int(w), a.ytd_split) for w in a.warehouses.split(",")]
        if a.ytd_split:
            plan.append((4 if not a.smoke else 2, 0))
        for W, split in plan:
            wl = tpcc.TpcC(W, items=items, customers=customers, ytd_split=split)
            wl.load(env)
            first = wl.check(env)
            if first != "ok":
                raise RuntimeError(f"TPC-C consistency check fails right after loading: {first}")
            name = f"W={W}" + ("" if split == a.ytd_split else (":classic" if split == 0 else f":split={split}"))
            params = {"W": W, "ytd_split": split, "clients": a.tpcc_clients_per_warehouse * W,
                      "items": items, "customers_per_district": customers}
            point("tpcc", name, params, loadgen.tpcc_args(W, items, customers, ytd_split=split),
                  TPCC_MODES, a.tpcc_clients_per_warehouse * W, check=wl.check)


EXPERIMENT_ORDER = ('micro', 'daemon', 'coordinator', 'narayana', 'store', 'levers', 'ro', 'autocommit', 'scaling', 'tpcc')


def _arguments(argv):
    """The command line, checked: (the parser, for later errors; the arguments)."""
    ap = argparse.ArgumentParser(description="side-by-side experiments, Rust driver, interleaved slices")
    ap.add_argument("--experiments", default=ALL,
                    help=f"comma-separated (default {ALL}); also daemon (needs --other-daemon), coordinator, scaling, store, profile "
                         "(alone; needs strace and perf) and narayana "
                         "(Narayana's JTA TM beside the daemon; build: bash scripts/build-jta-load.sh)")
    ap.add_argument("--modes", default="", help="only these modes (comma-separated, e.g. 2pc,co,client; a base such as co "
                    "also runs its variants, co:par, unless some are named: then only those; a variant may be named alone); "
                    "default every mode of each point")
    ap.add_argument("--slices", type=int, default=10, help="rounds per point (one slice per mode each)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per slice")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per slice")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rate", type=float, default=None, metavar="TPS",
                    help="open loop: every slice issues TPS global transactions per second at fixed times, whatever "
                         "the completions (--clients sessions serve them), instead of the closed loop; CPU per "
                         "transaction then compares at equal throughput; pick a rate every mode sustains (the "
                         "slices' `missed` says when one did not). Slices also count flushes per commit "
                         "(WAL, redo log, decision store), in either loop")
    ap.add_argument("--tpcc-clients-per-warehouse", type=int, default=2)
    ap.add_argument("--warehouses", default="2,4,8")
    ap.add_argument("--ytd-split", type=int, default=4, help="YTD rows per warehouse/district (0: classic schema)")
    ap.add_argument("--force", action="store_true", help="run even when the machine is not quiet (recorded)")
    ap.add_argument("--no-attempt-logs", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--results-md", type=Path, default=ROOT / "bench" / "RESULTS.md")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--plots-dir", type=Path, default=None,
                    help="where experiment scaling's PNGs go (default bench/plots; with --smoke, --out)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--other-calls", choices=["per-step", "batched"], default="per-step",
                    help="how the variants :other are driven: the per-step calls any version understands "
                         "(default), or this build's batched calls, like for like, for a build that has them")
    ap.add_argument("--other-daemon", metavar="BINARY",
                    help="experiments `daemon` and `coordinator`: the micro default point with 2pc and co also run "
                         "by this build of the daemon (modes 2pc:other, co:other, driven with the per-step calls "
                         "any version understands), interleaved; experiment `profile`: the build profiled as before")
    a = ap.parse_args(argv)
    if a.rate is not None and not a.rate > 0:
        ap.error(f"--rate {a.rate}: expected transactions per second above 0")
    if a.rate is not None and "narayana" in a.experiments.split(","):
        ap.error("--rate: the Narayana driver has no open loop (experiment narayana)")
    if "daemon" in a.experiments.split(",") and not a.other_daemon:
        ap.error("--experiments daemon needs --other-daemon BINARY (the build to compare with)")
    return ap, a

def _profile(ap, a, exps) -> int:
    """Experiment profile: not slices but its own servers and daemon, counted by strace and
    perf (profile_pair.py)."""
    if exps != ["profile"]:
        ap.error("--experiments profile runs alone (it counts with strace and perf, which slow the daemon)")
    from bench.coordinator import profile_pair
    if missing := profile_pair.missing_tools():   # before the quiet check: nothing to wait for
        ap.error(f"--experiments profile needs {' and '.join(missing)} (apt-get install strace linux-perf)")
    slices.require_quiet(a.force or a.smoke, "start")
    return profile_pair.run(a.out, a.other_daemon, 2.0 if a.smoke else a.seconds, a.smoke)


def _sizes(a) -> tuple:
    """(TPC-C items, customers per district, micro rows); a smoke run makes everything
    small, its slices short and its results go beside its CSVs (set in `a`)."""
    items, customers, rows_n = 10000, 300, 100000
    if a.smoke:
        a.slices, a.seconds, a.warmup, a.clients, a.tpcc_clients_per_warehouse = 2, 0.6, 0.2, 2, 1
        a.warehouses, a.force = "2", True
        a.results_md = a.out / "RESULTS.md"
        items, customers, rows_n = 300, 20, 500
    return items, customers, rows_n


def _measure(a, exps, cmd, csv_path, meta_path, att_dir, sizes) -> tuple:
    """Runs the experiments on one set of servers, slice by slice: (the run's meta, the
    refusal breakdowns, the slices with errors or failed checks); the slices go to
    `csv_path`, the meta to `meta_path`."""
    loadgen.binary()   # fail early with the build hint
    if "narayana" in exps:
        jta.classpath()   # the same for the Java driver
    csv_path.unlink(missing_ok=True)
    t0 = time.time()
    meta = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": machine(), "command": cmd,
            "clients": a.clients, "rate": a.rate, "tpcc_cpw": a.tpcc_clients_per_warehouse, "slices": a.slices,
            "warmup": a.warmup, "seconds": a.seconds, "quiet": {}, "settings": {}}
    log(f"experiments {','.join(exps)}: about {estimate(a, exps):.0f} min")
    meta["quiet"]["start"] = slices.require_quiet(a.force, "start")
    if not a.no_attempt_logs:
        att_dir.mkdir(exist_ok=True)
        for f in att_dir.glob("*.jsonl"):
            f.unlink()
    with Env(fsync=not a.smoke) as env:
        if {"micro", "levers", "ro", "autocommit", "daemon", "coordinator", "narayana", "scaling", "store"} & set(exps):
            micro.load(env, sizes[2])
        m = _Measuring(a, env, meta, csv_path, att_dir, sizes)
        for name in EXPERIMENT_ORDER:
            if name in exps:
                getattr(m, name)()
    unmatched = unmatched_modes(a.modes, m.offered)
    if unmatched:
        # A misspelt or misplaced mode must not pass for measured: say so where the run ends.
        meta["unmatched_modes"] = unmatched
        log(f"WARNING: --modes names {','.join(unmatched)}, which no point of experiments {','.join(exps)} has: "
            f"not measured (the points' modes: {','.join(sorted(m.offered))})")
    meta["quiet"]["end"] = slices.quiet_check(sample_s=1.0, use_load=False)
    meta["elapsed_min"] = f"{(time.time() - t0) / 60:.1f}"
    meta["breakdowns"] = m.breakdowns
    meta_path.write_text(repr(meta))
    bad = [r for r in m.rows if r["errors"] or r["check"] not in ("", "ok")]
    if bad:
        log(f"{len(bad)} slice(s) with errors or failed checks, first: {bad[0]['errors'] or bad[0]['check']}")
    return meta, m.breakdowns, bad


def _report(a, csv_path, sum_path, meta, breakdowns, plots_dir, bad) -> int:
    """The summary CSV, RESULTS.md's section, the targets and the scaling plots."""
    rows = read_csv(csv_path)
    summary = slices.summarize(rows)
    slices.write_csv(summary, sum_path, slices.SUMMARY_FIELDS)
    slices_report.write_section(a.results_md, slices_report.markdown(summary, rows, meta, breakdowns))
    log(f"wrote {a.results_md}")
    print(slices_report.targets(summary, rows))
    if any(s["experiment"] == scaling.EXPERIMENT for s in summary):
        for path in scaling_plots.draw(summary, plots_dir):
            log(f"wrote {path}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap, a = _arguments(argv)
    cmd = "/var/cache/cotx/venv/bin/python bench/run_all.py " + " ".join(shlex.quote(x) for x in (argv or []))
    exps = [e for e in a.experiments.split(",") if e]
    if "profile" in exps:
        return _profile(ap, a, exps)
    sizes = _sizes(a)
    # A smoke run's pictures must not overwrite the measured ones in bench/plots.
    plots_dir = a.plots_dir or (a.out if a.smoke else ROOT / "bench" / "plots")
    a.out.mkdir(parents=True, exist_ok=True)
    csv_path, sum_path, meta_path = a.out / "slices.csv", a.out / "slices_summary.csv", a.out / "slices_meta.txt"
    if a.report_only:
        meta = ast.literal_eval(meta_path.read_text())
        breakdowns, bad = meta.get("breakdowns", {}), []
    else:
        meta, breakdowns, bad = _measure(a, exps, cmd, csv_path, meta_path, a.out / "attempts", sizes)
    if not csv_path.exists():
        log(f"nothing was measured: no mode of experiments {','.join(exps)} is in --modes {a.modes}")
        return 2
    return _report(a, csv_path, sum_path, meta, breakdowns, plots_dir, bad)


if __name__ == "__main__":
    sys.exit(main())

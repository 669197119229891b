#!/usr/bin/env python3
"""Sonata's microbenchmark in the four modes (local, 2pc, co, client).

A global transaction has S sub-transactions; sub-transaction i runs on its own two-column
table mt<i>(k, v) of N rows: R point reads, then W point updates (v = v + 1), keys drawn
from a Zipf distribution with skew K over the N keys (K = 0: uniform; hot keys scattered
over the table by a multiplicative hash). The first round(S*P) sub-transactions run on
PostgreSQL, the rest on MariaDB. Updates of a sub-transaction are sorted by key (fewer
local deadlocks, the same in every mode).

  /var/cache/cotx/venv/bin/python bench/micro/micro.py [--points default,N=1000,...]
      [--seconds 4] [--warmup 1] [--reps 3] [--clients 8] [--out bench/results]
  --smoke: tiny sizes and sub-second runs (CI)
Point syntax: `default` or comma-free `KEY=VAL[:KEY=VAL...]` over S R W P N K, e.g.
`S=1:P=0`, `R=12:W=0`. Named sets: --points sweeps (every point of RESULTS.md).
"""
from __future__ import annotations

import argparse
import bisect
import sys
import time
from pathlib import Path

from bench.harness import MODES, canonical
from bench.harness.core import Env, log, machine, run_point, summarize, write_summary
from bench.harness.driver import Sub

DEFAULTS = {"S": 2, "R": 6, "W": 6, "P": 0.5, "N": 100000, "K": 0.0}
# Tables mt0..mt4 on each database: enough for S = 5, the largest point of the scaling study
# (bench/harness/scaling.py); a sub-transaction i always runs on its own table mt<i>.
MAX_TABLES = 5
# Every point in RESULTS.md: the default, then one sweep per parameter around it.
SWEEPS = ["default", "N=1000", "N=10000", "K=0.8", "K=0.99", "S=3", "S=4",
          "S=1:P=0", "S=1:P=1", "R=12:W=0", "R=10:W=2", "R=12:W=0:P=0"]


def parse_point(spec: str, defaults=DEFAULTS) -> dict:
    p = dict(defaults)
    if spec != "default":
        for part in spec.split(":"):
            k, _, v = part.partition("=")
            if k not in p:
                raise SystemExit(f"unknown parameter {k!r} in point {spec!r} (known: {', '.join(p)})")
            p[k] = type(defaults[k])(float(v)) if k in ("S", "R", "W", "N") else float(v)
    if p["S"] > MAX_TABLES:
        raise SystemExit(f"S <= {MAX_TABLES}")
    return p


class Micro:
    def __init__(self, S, R, W, P, N, K, **_):
        self.S, self.R, self.W, self.N, self.K = int(S), int(R), int(W), int(N), float(K)
        n_pg = int(self.S * P + 0.5)
        self.dbs = ["pg"] * n_pg + ["my"] * (self.S - n_pg)
        self.cdf = None
        if self.K > 0:
            acc, cdf = 0.0, []
            for r in range(1, self.N + 1):
                acc += 1.0 / (r ** self.K)
                cdf.append(acc)
            self.cdf = [c / acc for c in cdf]

    def key(self, rng) -> int:
        if self.cdf is None:
            return rng.randrange(self.N)
        rank = bisect.bisect_left(self.cdf, rng.random())
        return (rank * 7919 + 13) % self.N        # 7919 is prime, coprime to N = 10^k

    def sessions(self, wid):
        return [Sub(f"{db}{i}", db, None) for i, db in enumerate(self.dbs)]

    def txn(self, rng, wid):
        subs = []
        for i, db in enumerate(self.dbs):
            reads = [self.key(rng) for _ in range(self.R)]
            writes = sorted(self.key(rng) for _ in range(self.W))
            sel = f"SELECT v FROM mt{i} WHERE k = %s"
            upd = f"UPDATE mt{i} SET v = v + 1 WHERE k = %s"

            def fn(ex, reads=reads, writes=writes, sel=sel, upd=upd):
                for k in reads:
                    ex.q(sel, (k,))
                for k in writes:
                    ex.q(upd, (k,))
                return len(writes)
            subs.append(Sub(f"{db}{i}", db, fn, {"table": f"mt{i}", "read": reads, "written": writes}))
        return subs


def load(env: Env, rows: int) -> None:
    """MAX_TABLES tables of `rows` rows on both databases (a point with N < rows draws keys
    from the first N). Client mode's slot tables (cotx.shim, cotx_shim) are the daemon's:
    it creates them when it goes to client mode."""
    t0 = time.time()
    with env.pg.connect() as c:
        for i in range(MAX_TABLES):
            c.execute(f"DROP TABLE IF EXISTS mt{i}")
            c.execute(f"CREATE TABLE mt{i} (k int PRIMARY KEY, v int NOT NULL) WITH (fillfactor = 80)")
            c.execute(f"INSERT INTO mt{i} SELECT g, 0 FROM generate_series(0, {rows - 1}) g")
        c.execute("VACUUM ANALYZE")
    for i in range(MAX_TABLES):
        env.my.sql(f"DROP TABLE IF EXISTS mt{i}")
        env.my.sql(f"CREATE TABLE mt{i} (k int PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
        env.my.sql(f"INSERT INTO mt{i} SELECT seq, 0 FROM seq_0_to_{rows - 1}")
    log(f"loaded {MAX_TABLES} x {rows} rows on each database in {time.time() - t0:.1f} s")


def run(env: Env, points: list[str], *, seconds: float, warmup: float, reps: int, clients: int,
        out: Path, modes=MODES, max_rows: int | None = None, attempt_log: Path | None = None) -> list[dict]:
    specs = [(s, parse_point(s)) for s in points]
    rows_needed = max_rows or max(int(p["N"]) for _, p in specs)
    load(env, rows_needed)
    all_rows = []
    for i, (spec, p) in enumerate(specs):
        wl = Micro(**p)
        all_rows += run_point(env, "micro", spec, p, wl, clients=clients, warmup=warmup,
                              duration=seconds, reps=reps, modes=modes, csv_path=out / "micro_runs.csv",
                              progress_prefix=f"({i + 1}/{len(specs)}) ", attempt_log=attempt_log)
    write_summary(summarize(all_rows, modes), out / "micro_summary.csv")
    return all_rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="default", help="comma-separated points, or 'sweeps'")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES), help="subset of the modes (2pc first for ratios; shim: alias of client)")
    ap.add_argument("--rows", type=int, default=None, help="override N of every point (and the load)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "results")
    ap.add_argument("--attempt-log", type=Path, help="JSONL, one line per attempt (the format of bench/loadgen's)")
    ap.add_argument("--no-fsync", action="store_true", help="durability off (smoke runs only)")
    ap.add_argument("--smoke", action="store_true", help="tiny and quick: for CI")
    a = ap.parse_args(argv)
    points = SWEEPS if a.points == "sweeps" else a.points.split(",")
    if a.smoke:
        a.seconds, a.warmup, a.reps, a.clients, a.rows, a.no_fsync = 0.6, 0.2, 1, 2, 500, True
    if a.rows:
        DEFAULTS["N"] = a.rows
        points = [":".join(x for x in p.split(":") if not x.startswith("N=")) or "default" for p in points]
    a.out.mkdir(parents=True, exist_ok=True)
    for f in ("micro_runs.csv", "micro_summary.csv"):
        (a.out / f).unlink(missing_ok=True)
    modes = tuple(canonical(m) for m in a.modes.split(","))
    log(f"machine: {machine()}")
    with Env(fsync=not a.no_fsync) as env:
        rows = run(env, points, seconds=a.seconds, warmup=a.warmup, reps=a.reps, clients=a.clients, out=a.out,
                   attempt_log=a.attempt_log, modes=modes)
    bad = [r for r in rows if r["errors"] or (r["check"] not in ("", "ok"))]
    for s in summarize(rows, modes):
        log(f"summary {s['point']:14s} {s['mode']:5s} {s['tps_median']:8.1f} tx/s  ratio to 2pc "
            f"{s['ratio_to_2pc']:.3f}  aborts {s['abort_rate']:.2%}")
    if bad:
        log(f"{len(bad)} run(s) with errors: {bad[0]['errors']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Every side-by-side experiment in one command, with the Rust load driver
(bench/loadgen) in short interleaved slices (bench/experiments.py): quiet-machine check,
microbenchmark modes and levers, read-only MariaDB branches, TPC-C W=2,4,8; CSVs in
bench/results/ and the generated block of bench/RESULTS.md.

  /var/cache/cotx/venv/bin/python bench/run_all.py [--slices 10] [--seconds 5] [--warmup 1] ...
  --experiments micro,ro,tpcc --modes local,2pc,co,client
                  some experiments, each point narrowed to those modes (client: the
                  product's client mode; the daemon runs each mode's enforcement)
  --experiments daemon --other-daemon BINARY
                  two builds of the daemon side by side (micro default point, 2pc and co,
                  variants :other run by BINARY): a change's cost, before and after
  --experiments narayana
                  the micro default point through Narayana's in-process JTA TM (the Java
                  driver, modes 2pc:jta, co:jta) beside the daemon (2pc, co); not in the
                  default set; build it first: bash scripts/build-jta-load.sh
  --experiments profile [--other-daemon BINARY]
                  where the daemon's cost per transaction goes (requests, syncs, syscalls,
                  context switches, mallocs, CPU; a perf profile), this build and the
                  other one, a before/after table in --out/profile; needs strace and perf
  --experiments scaling [--plots-dir DIR]
                  the scaling study (S, clients, read-only share; not in the default
                  set), its PNGs in bench/plots (--smoke: in --out)
  --rate TPS      open loop: every slice issues TPS transactions per second at fixed times
                  (the --clients sessions serve them), for CPU per transaction at equal
                  throughput; every slice also counts flushes per commit (WAL, redo,
                  decision store)
  --report-only   redo RESULTS.md (and the scaling PNGs) from the CSVs in --out
  --smoke         tiny sizes, sub-second slices, no fsync, written to --out only (CI)
  --python-driver the earlier harness (Python worker processes, bench/harness/driver.py),
                  its own options: --seconds --warmup --reps --clients --micro-points ...
The pgbench cost of pg_co on one database is bench/pg_co/pgbench_cost.py (its own section).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from bench.harness import report
from bench.harness.core import Env, log, machine, read_csv, summarize, write_summary
from bench.micro import micro
from bench.tpcc import tpcc

ROOT = Path(__file__).resolve().parents[1]

HEADER = "## Side by side: local / 2pc / co / client (the earlier Python driver)"


def python_driver_main(argv=None) -> int:
    """The earlier harness: Python worker processes (bench/harness/driver.py)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python-driver", action="store_true")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tpcc-clients-per-warehouse", type=int, default=2)
    ap.add_argument("--micro-points", default="sweeps")
    ap.add_argument("--warehouses", default="2,4")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--plots", type=Path, default=ROOT / "bench" / "plots")
    ap.add_argument("--results-md", type=Path, default=ROOT / "bench" / "RESULTS.md")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    cmd = "/var/cache/cotx/venv/bin/python bench/run_all.py " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    if a.smoke:
        a.seconds, a.warmup, a.reps, a.clients, a.tpcc_clients_per_warehouse = 0.5, 0.2, 1, 2, 1
        a.micro_points, a.warehouses = "default,S=1:P=1,R=12:W=0:P=0", "2"
        a.plots = a.out / "plots"
        a.results_md = a.out / "RESULTS.md"
    a.out.mkdir(parents=True, exist_ok=True)
    meta_path = a.out / "meta.txt"
    if not a.report_only:
        for f in ("micro_runs.csv", "micro_summary.csv", "tpcc_runs.csv", "tpcc_summary.csv"):
            (a.out / f).unlink(missing_ok=True)
        points = micro.SWEEPS if a.micro_points == "sweeps" else a.micro_points.split(",")
        if a.smoke:
            micro.DEFAULTS["N"] = 500
        t0 = time.time()
        meta = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": machine(),
                "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()), "command": cmd,
                "clients": a.clients, "tpcc_cpw": a.tpcc_clients_per_warehouse, "warmup": a.warmup, "seconds": a.seconds, "reps": a.reps}
        n_runs = (len(points) + len(a.warehouses.split(","))) * 4 * a.reps
        log(f"{n_runs} runs of {a.warmup + a.seconds:.1f} s (+ about 1.5 s setup each) and data loads: "
            f"about {n_runs * (a.warmup + a.seconds + 1.5) / 60 + 1:.0f} min")
        log(f"machine: {meta['machine']}")
        with Env(fsync=not a.smoke) as env:
            mrows = micro.run(env, points, seconds=a.seconds, warmup=a.warmup, reps=a.reps,
                              clients=a.clients, out=a.out)
            trows = tpcc.run(env, [int(x) for x in a.warehouses.split(",")], seconds=a.seconds,
                             warmup=a.warmup, reps=a.reps, clients_per_warehouse=a.tpcc_clients_per_warehouse,
                             out=a.out, small=a.smoke)
        meta["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        meta["elapsed_min"] = f"{(time.time() - t0) / 60:.1f}"
        meta_path.write_text(repr(meta))
        bad = [r for r in mrows + trows if r["errors"] or r["check"] not in ("", "ok")]
        if bad:
            log(f"{len(bad)} run(s) with errors or failed checks, first: {bad[0]['errors'] or bad[0]['check']}")
    else:
        import ast
        meta = ast.literal_eval(meta_path.read_text())
        bad = []
    msum = summarize(read_csv(a.out / "micro_runs.csv")) if (a.out / "micro_runs.csv").exists() else []
    tsum = summarize(read_csv(a.out / "tpcc_runs.csv")) if (a.out / "tpcc_runs.csv").exists() else []
    write_summary(msum, a.out / "micro_summary.csv")
    write_summary(tsum, a.out / "tpcc_summary.csv")
    paths = report.plots(msum, tsum, a.plots)
    log(f"plots: {', '.join(str(p) for p in paths)}")
    root_for_links = ROOT if not a.smoke else a.out.parent
    try:
        text = report.markdown(msum, tsum, meta, paths, ROOT)
    except ValueError:  # smoke: plots outside bench/
        text = report.markdown(msum, tsum, meta, [], root_for_links)
    report.write_section(a.results_md, text, HEADER)
    log(f"wrote {a.results_md}")
    print(report.targets(msum, tsum))
    return 1 if bad else 0


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--python-driver" in args:
        return python_driver_main(args)
    from bench import experiments
    return experiments.main(args)


if __name__ == "__main__":
    sys.exit(main())

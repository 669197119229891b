"""The decision store of the coordinator in the driver's process, per committed
transaction: syncs, writes per sync, the store thread's CPU and the calls' CPU (the
driver's result fields store_syncs, store_writes, cpu_tm_store_s, cpu_tm_calls_s), mode
2pc on the micro default point with the Rust driver and real servers (bench.harness.Env),
with and without the store's commit delay, and against another build of the driver
(--other-loadgen: the coordinator is linked into it). Single slices, one per variant and
round, the variants interleaved in ABBA order; run it on a quiet machine (checked before
the run; --force runs anyway and says so).

usage: store_syncs.py [--delays-us 0,1000] [--rounds 4] [--seconds 4] [--clients 8]
                      [--store sqlite|log|log-fdatasync] [--other-loadgen PATH] [--force]
Prints a JSON line per slice, then one per variant with the medians, then (with
--other-loadgen) the per-round ratios this / other with 95 % bootstrap intervals.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

from bench.experiments import set_fillfactor
from bench.harness import loadgen
from bench.harness.core import Env
from bench.harness import slices
from bench.micro import micro

KEYS = ("tps", "p99_ms", "syncs_per_tx", "writes_per_sync", "store_ms_per_tx", "calls_ms_per_tx", "coord_ms_per_tx")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays-us", default="0,1000", help="store.commit_delay_us values, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "log", "log-fdatasync"],
                    help="the in-process coordinator's decision store (Env.in_process_config's store_kind)")
    ap.add_argument("--other-loadgen", metavar="PATH", help="another build of the driver, run beside this one")
    ap.add_argument("--force", action="store_true", help="run on a busy machine (the output says so)")
    a = ap.parse_args()
    quiet = slices.require_quiet(a.force, "store_syncs")
    print(json.dumps({"quiet": quiet["quiet"], "loadavg": quiet["loadavg"]}), flush=True)
    builds = [("this", loadgen.binary())] + ([("other", a.other_loadgen)] if a.other_loadgen else [])
    variants = [(b, d) for b in builds for d in (int(x) for x in a.delays_us.split(","))]
    rows: dict[tuple[str, int], list[dict]] = {(b, d): [] for (b, _), d in variants}
    with Env() as env:
        micro.load(env, micro.DEFAULTS["N"])
        point = micro.parse_point("default")
        set_fillfactor(env, 80)
        env.set_mode("2pc")
        for r in range(a.rounds):
            for (build, path), d in (variants if r % 2 == 0 else variants[::-1]):
                os.environ["COTX_LOADGEN_BIN"] = str(path)
                env.in_process_config(commit_delay_us=d, store_kind=a.store)
                x = loadgen.run_slice(env, "2pc", loadgen.micro_args(point), clients=a.clients, warmup=1,
                                      seconds=a.seconds, seed=r * 31 + d, extra=["--coord", "inproc:" + env.in_process_path])
                n = max(1, int(x["commits"]))
                row = {"build": build, "delay_us": d, "round": r, "tps": x["tps"], "p99_ms": x["p99_ms"],
                       "syncs_per_tx": x["store_syncs"] / n, "writes_per_sync": x["store_writes"] / max(1, x["store_syncs"]),
                       "store_ms_per_tx": x["cpu_tm_store_s"] * 1000 / n, "calls_ms_per_tx": x["cpu_tm_calls_s"] * 1000 / n,
                       "coord_ms_per_tx": x["cpu_tm_s"] * 1000 / n}
                rows[(build, d)].append(row)
                print(json.dumps(row), flush=True)
                env.leftovers()
    for (build, d), rs in rows.items():
        print(json.dumps({"build": build, "delay_us": d, "median": {k: statistics.median(r[k] for r in rs) for k in KEYS}}))
    if a.other_loadgen:
        for d in {d for _, d in variants}:
            ratios = {k: slices.bootstrap_median([t[k] / o[k] for t, o in zip(rows[("this", d)], rows[("other", d)]) if o[k]])
                      for k in KEYS}
            print(json.dumps({"delay_us": d, "this / other, median [95 % CI]": ratios}))


if __name__ == "__main__":
    main()

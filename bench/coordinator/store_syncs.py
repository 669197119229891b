"""The decision store of the coordinator in the driver's process, per committed
transaction, with and without its commit delay: syncs, writes per sync, the store
thread's CPU and the calls' CPU (the driver's result fields store_syncs, store_writes,
cpu_tm_store_s, cpu_tm_calls_s), mode 2pc on the micro default point with the Rust driver
and real servers (bench.harness.Env). Single slices, one per delay and round, the delays
interleaved in ABBA order; run it on a quiet machine.

usage: store_syncs.py [--delays-us 0,1000] [--rounds 4] [--seconds 4] [--clients 8]
Prints a JSON line per slice, then one per delay with the medians.
"""
from __future__ import annotations

import argparse
import json
import statistics

from bench.experiments import set_fillfactor
from bench.harness import loadgen
from bench.harness.core import Env
from bench.micro import micro


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays-us", default="0,1000", help="store.commit_delay_us values, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--clients", type=int, default=8)
    a = ap.parse_args()
    delays = [int(x) for x in a.delays_us.split(",")]
    rows: dict[int, list[dict]] = {d: [] for d in delays}
    with Env() as env:
        micro.load(env, micro.DEFAULTS["N"])
        point = micro.parse_point("default")
        set_fillfactor(env, 80)
        env.set_mode("2pc")
        for r in range(a.rounds):
            for d in (delays if r % 2 == 0 else delays[::-1]):
                env.in_process_config(commit_delay_us=d)
                x = loadgen.run_slice(env, "2pc", loadgen.micro_args(point), clients=a.clients, warmup=1,
                                      seconds=a.seconds, seed=r * 31 + d, extra=["--coord", "inproc:" + env.in_process_path])
                n = max(1, int(x["commits"]))
                row = {"delay_us": d, "tps": x["tps"], "p99_ms": x["p99_ms"], "syncs_per_tx": x["store_syncs"] / n,
                       "writes_per_sync": x["store_writes"] / max(1, x["store_syncs"]),
                       "store_ms_per_tx": x["cpu_tm_store_s"] * 1000 / n, "calls_ms_per_tx": x["cpu_tm_calls_s"] * 1000 / n}
                rows[d].append(row)
                print(json.dumps(row), flush=True)
                env.leftovers()
    for d, rs in rows.items():
        print(json.dumps({"delay_us": d, "median": {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "delay_us"}}))


if __name__ == "__main__":
    main()

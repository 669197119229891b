"""What deadlock detection costs when nothing waits long: mode co on the micro default
point with the Rust driver (whose registrations carry each branch's session, as the
clients' do, so every transaction enters the detector's watch), the daemon restarted
between slices with timeouts.deadlock_check_ms = 500 (the default) and 0 (detection off),
interleaved ABBA. Per slice: tps, the coordinator's CPU ms per committed transaction, p99,
and the detector's passes (cotx_deadlock_checks_total: 0 means no lock wait was read).
Run it on a quiet machine.

usage: python -m bench.coordinator.deadlock_cost [--rounds 6] [--seconds 4] [--clients 8]
Prints a JSON line per slice, then the per-round ratios on/off (tps, coordinator CPU) as
medians with 95 % bootstrap intervals.
"""
from __future__ import annotations

import argparse
import json

from cotest.coord import metric

from bench.experiments import set_fillfactor
from bench.harness import core, loadgen, slices
from bench.harness.core import Env
from bench.micro import micro


def checks(env) -> float:
    return metric(env.daemon, "cotx_deadlock_checks_total", float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--force", action="store_true", help="run even when the machine is not quiet (recorded)")
    a = ap.parse_args()
    slices.require_quiet(a.force, "start")
    rows: dict[int, list[dict]] = {500: [], 0: []}
    with Env() as env:
        micro.load(env, micro.DEFAULTS["N"])
        point = micro.parse_point("default")
        set_fillfactor(env, 80)
        env.set_mode("co")
        for r in range(a.rounds):
            for every in ((500, 0) if r % 2 == 0 else (0, 500)):
                core.COORD_TIMEOUTS["deadlock_check_ms"] = every
                env.leftovers()
                env.start_daemon("engine")
                x = loadgen.run_slice(env, "co", loadgen.micro_args(point), clients=a.clients, warmup=1,
                                      seconds=a.seconds, seed=r * 31 + every)
                row = {"round": r, "deadlock_check_ms": every, "tps": x.get("tps"), "p99_ms": x.get("p99_ms"),
                       "coord_ms_per_tx": x.get("cpu_ms_coord"), "server_ms_per_tx": x.get("cpu_ms_server"),
                       "deadlock_checks": checks(env), "errors": x.get("errors") or x.get("error")}
                rows[every].append(row)
                print(json.dumps(row), flush=True)
    on = {r["round"]: r for r in rows[500]}
    off = {r["round"]: r for r in rows[0]}
    for key in ("tps", "coord_ms_per_tx", "p99_ms"):
        ratios = [on[k][key] / off[k][key] for k in on if k in off and on[k][key] and off[k][key]]
        m, lo, hi = slices.bootstrap_median(ratios)
        print(json.dumps({"ratio_on_off": key, "median": round(m, 3), "ci95": [round(lo, 3), round(hi, 3)],
                          "rounds": len(ratios)}), flush=True)


if __name__ == "__main__":
    main()

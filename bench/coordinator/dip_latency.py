"""dip judged where it should win: latency. The micro default point with the
Rust driver through the daemon at 1 and 2 clients, in modes 2pc, dip (the decision inside
the last PostgreSQL branch's commit: one forced write fewer) and co (dip's own servers,
pg_co and mysql_co on, with the decision in the store), servers and the decision store on
this machine's disk (Env's fsync on). Per client count, one slice per mode and round, the
modes interleaved ABBA (the order reversed every other round). Per slice: p50, p99, tps;
then per client count the per-round ratios of each dip mode to each other mode, of p50 and
p99, as medians with 95 % bootstrap intervals (the target: dip p50 <= 0.8 x 2pc p50 at 1
client), the same of the commit alone (commit_p50_ms, commit_p99_ms: from the last
statement to the end, what the protocol decides; the statements are the workload's, the
same in every mode), and per mode where its time went, step by step (the driver's phases_p50_ms: each
branch's begin and statements, the PREPAREs, the daemon's request, dip's decision commit,
phase two). A mode with the suffix :1req runs on the one-request path (the driver's
--one-request: leased gtids, the commit the only request; dip's hands the decision over in
it): dip:1req against 2pc:1req is like for like; dip:1req-overlap sends that commit while
the other branches prepare (the driver's --handover-while-preparing). Run it on a quiet machine (checked before the run; --force runs anyway
and says so).

usage: python -m bench.coordinator.dip_latency [--rounds 8] [--seconds 4] [--clients 1,2]
       [--modes 2pc,dip,co] [--force]
       e.g. --modes 2pc,dip,2pc:1req,dip:1req
Prints a JSON line per slice, then one per client count, ratio and percentile.
"""
from __future__ import annotations

import argparse
import json
import statistics

from bench.experiments import ONE_REQUEST, set_fillfactor
from bench.harness import loadgen, slices
from bench.harness.core import Env
from bench.micro import micro


def one_request_args(mode: str) -> list[str] | None:
    """The driver's flags for a mode's suffix: :1req, :1req-overlap (dip's hand-over
    beside the PREPAREs); None for the begin path."""
    variant = mode.partition(":")[2]
    if variant == "1req":
        return ONE_REQUEST
    if variant == "1req-overlap":
        return ONE_REQUEST + ["--handover-while-preparing"]
    if variant:
        raise SystemExit(f"{mode}: unknown variant {variant!r} (known: 1req, 1req-overlap)")
    return None


def ratios(rows: list[dict], num: str, den: str, key: str) -> dict:
    """Per-round ratio num/den of `key`, median and 95 % bootstrap interval."""
    a = {r["round"]: r[key] for r in rows if r["mode"] == num and r[key]}
    b = {r["round"]: r[key] for r in rows if r["mode"] == den and r[key]}
    xs = [a[k] / b[k] for k in a if k in b]
    if not xs:
        return {"median": None, "ci95": None, "rounds": 0}
    m, lo, hi = slices.bootstrap_median(xs)
    return {"median": round(m, 3), "ci95": [round(lo, 3), round(hi, 3)], "rounds": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--clients", default="1,2", help="client counts, comma-separated")
    ap.add_argument("--modes", default="2pc,dip,co", help="modes, comma-separated (dip first compared with 2pc)")
    ap.add_argument("--force", action="store_true", help="run even when the machine is not quiet (recorded)")
    a = ap.parse_args()
    quiet = slices.require_quiet(a.force, "start")
    modes = a.modes.split(",")
    rows: list[dict] = []
    with Env() as env:
        micro.load(env, micro.DEFAULTS["N"])
        point = micro.parse_point("default")
        set_fillfactor(env, 80)
        for n in (int(x) for x in a.clients.split(",")):
            for r in range(a.rounds):
                for mode in (modes if r % 2 == 0 else modes[::-1]):
                    env.set_mode(mode)
                    env.leftovers()
                    x = loadgen.run_slice(env, mode, loadgen.micro_args(point), clients=n, warmup=a.warmup,
                                          seconds=a.seconds, seed=r * 31 + n,
                                          extra=one_request_args(mode))
                    row = {"clients": n, "round": r, "mode": mode, "p50_ms": x.get("p50_ms"),
                           "p99_ms": x.get("p99_ms"), "tps": x.get("tps"), "commits": x.get("commits"),
                           "errors": x.get("errors") or x.get("error"),
                           "commit_p50_ms": x.get("commit_p50_ms"), "commit_p99_ms": x.get("commit_p99_ms"),
                           "phases_p50_ms": x.get("phases_p50_ms"),
                           "quiet": "ok" if quiet["quiet"] else "NOT QUIET: " + quiet["why"]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    # Where each mode's time went: per step, the median over rounds of its slices' p50.
    for n in sorted({r["clients"] for r in rows}):
        for mode in modes:
            mine = [r["phases_p50_ms"] for r in rows if r["clients"] == n and r["mode"] == mode and r["phases_p50_ms"]]
            steps = sorted({k for p in mine for k in p})
            print(json.dumps({"clients": n, "mode": mode, "phases_p50_ms": {
                k: round(statistics.median(p[k] for p in mine if p.get(k) is not None), 3) for k in steps}}), flush=True)
    dips = [m for m in modes if m.partition(":")[0] == "dip"]
    for n in sorted({r["clients"] for r in rows}):
        mine = [r for r in rows if r["clients"] == n]
        for num in dips:
            for den in (m for m in modes if m not in dips):
                for key in ("p50_ms", "p99_ms", "commit_p50_ms", "commit_p99_ms"):
                    print(json.dumps({"clients": n, "ratio": f"{num}/{den}", "of": key,
                                      **ratios(mine, num, den, key)}), flush=True)


if __name__ == "__main__":
    main()

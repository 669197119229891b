"""SQLite's decision store against the append-only decision log, per decision: does the
log beat SQLite? `cotx-coordinator bench-store --backend applog` writes the same decisions
through the same group-commit thread (the same batching, one sync per batch) to the daemon's
log store (`[store] kind = "log"`, coordinator-daemon/src/store/applog: one checksummed
frame per batch appended to a preallocated file and made durable, with its replay and
compaction), with each of its sync methods: `applog` direct writes (O_DIRECT | O_DSYNC,
the default), `applog-fdatasync` a write and an fdatasync. Three patterns, each
decision then marked finished as the daemon does: 1 writer back to back; 8 writers 12 ms
apart (the micro point's pace, where a batch starts after an idle wait); 64 writers back to
back (throughput, `--n-throughput` decisions). Per round and pattern one run of each
backend, their order reversed every other round (ABC CBA). Prints a JSON line per run,
then per pattern and backend the medians with 95 % bootstrap intervals of the store
thread's CPU per decision and per sync, decisions per sync and decisions/s, and the
per-round ratios applog/sqlite and applog/applog-fdatasync of each (per sync as well as
per decision: the backends share the batching policy, not the batches; what a batch gathers depends on how long the one
before it took). Run it on a quiet machine (checked first; --force runs anyway and
the lines say so).

usage: python -m bench.coordinator.store_log_probe [--rounds 8] [--n 3000]
       [--n-throughput 20000] [--dir DIR] [--force]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

from bench.coordinator.store_cpu import bench_store
from bench.harness import slices

# Each backend's bench-store arguments.
BACKENDS = {"sqlite": ["--backend", "sqlite"],
            "applog": ["--backend", "applog", "--sync-method", "direct"],
            "applog-fdatasync": ["--backend", "applog", "--sync-method", "fdatasync"]}
RATIOS = [("applog", "sqlite"), ("applog", "applog-fdatasync")]
# (name, bench-store arguments, whether --n-throughput sets its decisions)
PATTERNS = [
    ("1 writer, back to back", ["--clients", "1", "--finish"], False),
    ("8 writers at 12 ms", ["--clients", "8", "--pace-ms", "12", "--finish"], False),
    ("64 writers, back to back", ["--clients", "64", "--finish"], True),
]
FIELDS = ["store_cpu_ms_per_decision", "store_cpu_ms_per_sync", "decisions_per_sync", "decisions_per_s"]


def interval(xs: list[float]) -> dict:
    m, lo, hi = slices.bootstrap_median(xs)
    return {"median": round(m, 4), "ci95": [round(lo, 4), round(hi, 4)], "runs": len(xs)}


def summary(rows: list[dict]) -> list[dict]:
    """Per pattern: each backend's medians, and the per-round ratios (RATIOS)."""
    out = []
    for name, _, _ in PATTERNS:
        mine = [r for r in rows if r["pattern"] == name]
        for b in BACKENDS:
            out.append({"pattern": name, "backend": b,
                        **{k: interval([r[k] for r in mine if r["backend"] == b]) for k in FIELDS}})
        by = {(r["round"], r["backend"]): r for r in mine}
        rounds = sorted({r["round"] for r in mine})
        for num, den in RATIOS:
            out.append({"pattern": name, "ratio": f"{num}/{den}",
                        **{k: interval([by[(i, num)][k] / by[(i, den)][k] for i in rounds
                                        if (i, num) in by and by.get((i, den), {}).get(k)])
                           for k in FIELDS}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n", type=int, default=3000, help="decisions per run (1 and 8 writers)")
    ap.add_argument("--n-throughput", type=int, default=20000, help="decisions per run of 64 writers")
    ap.add_argument("--dir", default=None, help="where the store files go (default: a temporary directory)")
    ap.add_argument("--force", action="store_true", help="run even when the machine is not quiet (recorded)")
    a = ap.parse_args()
    if a.rounds < 1 or a.n < 1 or a.n_throughput < 1:
        ap.error("--rounds, --n and --n-throughput must be at least 1")
    quiet = slices.require_quiet(a.force, "start")
    quiet = "ok" if quiet["quiet"] else "NOT QUIET: " + quiet["why"]
    d = a.dir or tempfile.mkdtemp(prefix="cotx-store-log-")
    rows: list[dict] = []
    for r in range(a.rounds):
        for name, args, throughput in PATTERNS:
            order = list(BACKENDS)
            for b in (order if r % 2 == 0 else order[::-1]):
                x = bench_store(os.path.join(d, f"store.{b}"), a.n_throughput if throughput else a.n,
                                [*args, *BACKENDS[b]])
                # Per sync too: the backends share the batching policy, not the batches
                # (what a batch gathers depends on how long the one before it took).
                x["store_cpu_ms_per_sync"] = round(x["store_cpu_ms_per_decision"] * x["decisions"]
                                                   / max(x["syncs"], 1), 4)
                row = {"pattern": name, "round": r, "backend": b, "decisions": x["decisions"],
                       **{k: x[k] for k in FIELDS}, "quiet": quiet}
                rows.append(row)
                print(json.dumps(row), flush=True)
    for s in summary(rows):
        print(json.dumps(s), flush=True)


if __name__ == "__main__":
    main()

"""The experiment `store` (bench/experiments.py): the daemon's decision store measured
the same way as the modes, and the store alone.

Slices: the micro default point in 2pc and co, each with the SQLite store (one daemon:
`2pc`, `co`) and with the PostgreSQL store shared by 1 or 3 daemons (`2pc:pg1`,
`2pc:pg3`, `co:pg1`, `co:pg3`), interleaved slice by slice; every mode has a switch hook
(Env.use_store) so that a slice always runs on its own store, whatever ran before. With
3 daemons the driver spreads its clients over them (client i talks to daemon i mod 3):
each daemon owns the transactions it began, as behind a load balancer with sticky
clients.

The store alone: `cotx-coordinator bench-store` (decisions/s and, for PostgreSQL,
per-decision p50/p99), SQLite with group commit, then the PostgreSQL store (its own
instance, table cotx_bench_decisions) with 1 and 3 writers, after the slices.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .core import log

TARGET_SQLITE = 10000
MODES = ["2pc", "2pc:pg1", "2pc:pg3", "co", "co:pg1", "co:pg3"]


def store_of(mode: str) -> str:
    """The store a mode runs on: its label (pg1, pg3), or sqlite for a plain mode."""
    return mode.partition(":")[2] or "sqlite"


def switch_hooks(modes=MODES) -> dict:
    """One hook per mode (slices.run_point's `switch`): the store of the mode."""
    return {m: (lambda env, s=store_of(m): env.use_store(s)) for m in modes}


def store_alone(env, out_dir: Path, smoke: bool = False) -> list[dict]:
    """Decisions/s of the store alone (bench-store of the daemon binary the harness runs):
    SQLite in the daemon's directory, then the PostgreSQL store with 1 and 3 writers.
    Appends the JSON lines to out_dir/store_alone.jsonl and returns them; a binary without
    --pg-dsn (an older build) gives an `error` line instead."""
    from cotest.daemon import find_binary
    bin_ = find_binary()
    n, clients = (2000, 16) if smoke else (20000, 64)
    if env.store_pg is None:
        env.start_store_server()
    runs = [["--path", os.path.join(env.coord_dir, "bench-store.db")]]
    runs += [["--pg-dsn", env.store_dsn(), "--writers", str(w)] for w in (1, 3)]
    results = []
    for args in runs:
        cmd = [bin_, "bench-store", *args, "--n", str(n), "--clients", str(clients)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            line = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else ""
            r = json.loads(line) if line else {"error": (p.stderr.strip() or f"exit {p.returncode}")[-300:]}
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            r = {"error": repr(e)[:300]}
        r.setdefault("store", "postgres" if "--pg-dsn" in args else "sqlite")
        results.append(r)
        log("store alone: " + json.dumps(r))
    with open(out_dir / "store_alone.jsonl", "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    return results


def markdown(results: list[dict]) -> list[str]:
    """The store-alone lines of the generated block of RESULTS.md (empty without a run)."""
    if not results:
        return []
    out = ["### Decision store alone (`cotx-coordinator bench-store`)", "",
           "| store | writers | clients | decisions/s | p50 / p99 ms per decision | decisions per sync |",
           "|---|---:|---:|---:|---|---:|"]
    for r in results:
        if r.get("error"):
            out.append(f"| {r['store']} | | | error: {str(r['error'])[:120]} | | |")
            continue
        lat = f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}" if "p50_ms" in r else "n/a"
        out.append(f"| {r['store']} | {r.get('writers', 1)} | {r.get('clients')} | {r.get('decisions_per_s')} | "
                   f"{lat} | {r.get('decisions_per_sync')} |")
    # The target of the single-daemon path: the SQLite store alone keeps >= 10k decisions/s.
    sq = next((r for r in results if r.get("store") == "sqlite" and not r.get("error")), None)
    if sq is not None:
        met = float(sq.get("decisions_per_s") or 0) >= TARGET_SQLITE
        out += ["", f"Target: the SQLite store alone keeps ≥ {TARGET_SQLITE:,} decisions/s: "
                    f"{'met' if met else 'missed'} ({sq.get('decisions_per_s')}/s, one run)."]
    return out + [""]

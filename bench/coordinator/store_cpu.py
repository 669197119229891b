"""The SQLite decision store alone, per decision: the store thread's CPU and decisions per
sync for the write patterns that matter to the coordinator's cost, with no database
beside it. Each configuration is one `cotx-coordinator bench-store` run per round (the
decisions written as the daemon writes them: fenced, of a registered epoch); the
configurations are interleaved, in reverse order every other round. Run it on a quiet
machine.

usage: store_cpu.py [--rounds 3] [--n 3000] [--dir DIR]
Prints a JSON line per run, then one per configuration with medians and ranges.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile

from cotest.daemon import find_binary

# (name, bench-store arguments)
CONFIGS = [
    ("1 writer, decide", ["--clients", "1"]),
    ("1 writer, decide + finish", ["--clients", "1", "--finish"]),
    ("64 writers, decide", ["--clients", "64"]),
    ("64 writers, decide + finish", ["--clients", "64", "--finish"]),
    ("8 writers at 12 ms, decide + finish", ["--clients", "8", "--pace-ms", "12", "--finish"]),
    ("8 writers at 12 ms, decide + finish, delay 1 ms", ["--clients", "8", "--pace-ms", "12", "--finish", "--commit-delay-us", "1000"]),
]
FIELDS = ["store_cpu_ms_per_decision", "decisions_per_sync", "decisions_per_s"]


def bench_store(path: str, n: int, args: list[str]) -> dict:
    """One `cotx-coordinator bench-store --path PATH --n N ARGS` run: its JSON line."""
    p = subprocess.run([find_binary(), "bench-store", "--path", path, "--n", str(n), *args],
                       capture_output=True, text=True, timeout=600, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=3000, help="decisions per run")
    ap.add_argument("--dir", default=None, help="where the store file goes (default: a temporary directory)")
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="cotx-store-cpu-")
    db = os.path.join(d, "store.db")
    rows: dict[str, list[dict]] = {name: [] for name, _ in CONFIGS}
    for r in range(a.rounds):
        for name, args in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):
            x = bench_store(db, a.n, args)
            rows[name].append(x)
            print(json.dumps({"config": name, "round": r, **{k: x[k] for k in FIELDS}}), flush=True)
    for name, xs in rows.items():
        print(json.dumps({"config": name, **{k: {"median": statistics.median(x[k] for x in xs),
                                                 "min": min(x[k] for x in xs), "max": max(x[k] for x in xs)}
                                             for k in FIELDS}}))


if __name__ == "__main__":
    main()

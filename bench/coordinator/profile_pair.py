"""The profile before and after, as `bench/run_all.py --experiments profile` runs it: this
build's daemon with batched calls ("after") and, with --other-daemon, an older build
driven per step ("before"), each by bench/coordinator/profile.py in a process of its own;
their JSON lines go to OUT/profile/after.json and before.json, and the table comparing
them (per committed transaction) to OUT/profile/table.md and the log.

Needs strace and perf (Debian's linux-perf), which the project's scripts do not install:
without them `run_all.py` stops before starting anything, naming what is missing
(missing_tools()).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (label, field of profile.py's line, digits)
ROWS = [("tx/s (that slice)", "tx_per_s", 1), ("daemon CPU ms per transaction", "daemon_cpu_ms_per_tx", 3),
        ("API requests per transaction", "requests_per_tx", 2), ("store syncs (batches) per transaction", "store_syncs_per_tx", 3),
        ("store ops per transaction", "store_ops_per_tx", 2), ("context switches per transaction", "context_switches_per_tx", 1),
        ("mallocs per transaction", "mallocs_per_tx", 1), ("syscalls per transaction", "syscalls_per_tx", 1)]


def missing_tools() -> list[str]:
    return [t for t in ("strace", "perf") if shutil.which(t) is None]


def table(runs: dict[str, dict]) -> str:
    """Markdown: one column per run (before, after; whichever exist), one row per count.
    A build without the request counter shows its 0 as "no counter"."""
    cols = [k for k in ("before", "after") if k in runs]
    out = ["| per committed transaction | " + " | ".join(f"{k} ({runs[k]['calls']} calls, {runs[k]['daemon']})" for k in cols) + " |",
           "|---|" + "---:|" * len(cols)]
    for label, key, digits in ROWS:
        cells = []
        for k in cols:
            v = runs[k].get(key)
            cells.append("no counter" if key == "requests_per_tx" and not v else "n/a" if v is None else f"{v:.{digits}f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    for k in cols:
        sc = runs[k].get("syscalls", {})
        out.append(f"| of the syscalls, {k} | " + " | ".join(
            (", ".join(f"{n} {v}" for n, v in sc.items()) if c == k else "") for c in cols) + " |")
    return "\n".join(out) + "\n"


def run(out: Path, other_daemon: str | None, seconds: float, smoke: bool) -> int:
    """The caller (bench/experiments.py) has checked missing_tools() and the quiet machine."""
    d = out / "profile"
    d.mkdir(parents=True, exist_ok=True)
    plan = [("after", ["--calls", "batched"])]
    if other_daemon:
        plan.insert(0, ("before", ["--calls", "per-step", "--daemon", other_daemon]))
    extra = ["--seconds", str(seconds)] + (["--rows", "500", "--clients", "2"] if smoke else [])
    runs = {}
    for name, args in plan:
        p = subprocess.run([sys.executable, "-m", "bench.coordinator.profile", "--mode", "2pc", *args, *extra,
                            "--perf-record", str(d / f"{name}.data")],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if p.returncode != 0 or not lines:
            print(f"profile {name} failed (exit {p.returncode}): {p.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        runs[name] = json.loads(lines[-1])
        (d / f"{name}.json").write_text(lines[-1] + "\n")
    (d / "table.md").write_text(table(runs))
    print(table(runs))
    return 0

"""Where the servers' CPU goes, mode by mode, at one microbenchmark point: for each mode a
slice of the Rust driver runs while `perf record -a -g` samples the whole machine, then
the samples are split by process (PostgreSQL, MariaDB, the daemon, the driver) and, for
each server, by function: the functions that use the most CPU themselves, and the
inclusive share of the steps two-phase commit and client mode add (PREPARE, the log
flushes, the XA calls, the slot write's UPDATE). Each process's share times the slice's
CPU per transaction of that server (the harness's own /proc count) gives milliseconds per
transaction. What bench/coordinator/profile.py does for the daemon alone, for the servers.

Needs perf (Debian's linux-perf), which no test or benchmark command needs, so the
project's scripts do not install it. Run it on a quiet machine.

usage: python -m bench.micro.server_profile [--point R=12:W=0:P=0] [--modes 2pc,client]
           [--seconds 6] [--clients 8] [--rows 100000] [--out DIR]
Prints one JSON object per mode.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import threading
import time
from pathlib import Path

from bench.harness import loadgen
from bench.harness.core import Env
from bench.micro import micro

# Process names as perf records them, by the part they belong to.
PARTS = {"postgres": "pg", "mariadbd": "my", "cotx-coordinato": "coord", "decision-store": "coord",
         "tokio-rt-worker": "coord", "cotx-loadgen": "driver"}
# Steps whose inclusive share is reported (those present in a server's samples).
WATCH = ["PrepareTransaction", "FinishPreparedTransaction", "XLogFlush", "issue_xlog_fsync", "CommitTransaction",
         "ExecUpdate", "PreCommit_CheckForSerializationFailure", "trans_xa_prepare", "trans_xa_commit",
         "trx_prepare_for_mysql", "log_write_up_to", "trx_commit_for_mysql", "mysql_update", "mysql_execute_command",
         "do_fsync", "__x64_sys_fdatasync", "__x64_sys_fsync"]


def report(data: Path, *args: str) -> str:
    return subprocess.run(["perf", "report", "-i", str(data), "--stdio", "-g", "none", *args],
                          capture_output=True, text=True).stdout


def shares(text: str) -> list[tuple[float, str]]:
    """perf report lines `  12.34%  name...`: (percent, the rest of the line)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+(?:[0-9.]+%\s+)?(.*\S)", line)
        if m and not line.lstrip().startswith("#"):
            out.append((float(m.group(1)), m.group(2)))
    return out


def split(data: Path) -> dict:
    by_part: dict[str, float] = {}
    for pct, comm in shares(report(data, "--no-children", "--sort", "comm")):
        part = PARTS.get(comm, "other")
        by_part[part] = round(by_part.get(part, 0.0) + pct, 2)
    servers = {}
    for comm, part in (("postgres", "pg"), ("mariadbd", "my")):
        top = [(p, re.sub(r"^\[[.k]\]\s+", "", s)) for p, s in
               shares(report(data, "--no-children", "--comms", comm, "--sort", "sym"))[:12]]
        incl = {s: p for p, s in ((p, re.sub(r"^\[[.k]\]\s+", "", s)) for p, s in
                                  shares(report(data, "--children", "--comms", comm, "--sort", "sym")))}
        servers[part] = {"top_self": [[round(p, 2), s] for p, s in top],
                         "inclusive": {w: round(incl[w], 2) for w in WATCH if w in incl}}
    return {"share_by_part": by_part, "servers": servers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--point", default="R=12:W=0:P=0")
    ap.add_argument("--modes", default="2pc,client")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--out", default="/tmp/server-profile")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    point = micro.parse_point(a.point, dict(micro.DEFAULTS, N=a.rows))
    with Env(fsync=True) as env:
        micro.load(env, a.rows)
        for mode in a.modes.split(","):
            env.set_mode(mode)
            data = out / f"{mode.replace(':', '-')}.data"
            rec = threading.Thread(target=lambda: (time.sleep(1.5), subprocess.run(
                ["perf", "record", "-a", "-g", "-F", "499", "-o", str(data), "--", "sleep", str(a.seconds)],
                capture_output=True)))
            rec.start()
            r = loadgen.run_slice(env, mode, loadgen.micro_args(point), clients=a.clients, warmup=1.0,
                                  seconds=a.seconds + 1.0)
            rec.join()
            if r.get("error"):
                raise SystemExit(f"{mode}: the slice failed: {r['error']}")
            print(json.dumps({"mode": mode, "point": a.point, "tx_per_s": round(r.get("tps", 0.0), 1),
                              "cpu_ms_per_tx": {k: round(float(r.get(f"cpu_ms_{k}") or 0.0), 3)
                                                for k in ("pg", "my", "coord")},
                              "perf_data": str(data), **split(data)}), flush=True)


if __name__ == "__main__":
    main()

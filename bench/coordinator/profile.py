"""Where the coordinator's cost per global transaction goes, on the micro default point
with the Rust driver and real servers (bench.harness.Env): per committed transaction, the
daemon's API requests (cotx_requests_total), store batches (each one sync of the decision
log) and store ops, its syscalls by name (strace -c -f), context switches and mallocs
(perf stat with a uprobe on glibc's malloc), and its CPU ms. Each count comes from its own
slice (strace slows the daemon down; the counts per transaction stay right), the divisor
is the daemon's own count of commits in the same window. --perf-record FILE also samples
a call-graph profile in a last slice (read it with `perf report -i FILE`).

Needs strace and perf (Debian's linux-perf): profiling tools that no test or benchmark
command needs, so the project's scripts do not install them.

usage: profile.py [--mode 2pc] [--calls batched|per-step] [--one-request] [--ro-share F]
                  [--daemon BINARY] [--store sqlite|log|log-fdatasync] [--seconds 6] [--clients 8] [--rows 100000] [--perf-record FILE]

--one-request: the driver's one-request path (leased gtids, the commit the only request; the
coordinator experiment's :1req variants). --ro-share F: that share of the global
transactions read-only (1: the experiment's RO=100% point).
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import threading
import time

from cotest.coord import metrics_text

from bench.harness import loadgen
from bench.harness.core import Env, cpu_snapshot
from bench.micro import micro

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def metrics(env) -> dict[str, float]:
    """The daemon's counters this profile divides (commits, requests, store batches/ops)."""
    text = metrics_text(env.daemon)   # one read: the counters of one moment
    out = {}
    for name, key in (("cotx_requests_total", "requests"), ("cotx_store_batches_total", "store_batches"),
                      ("cotx_store_ops_total", "store_ops"), ('cotx_transactions_total{outcome="commit"}', "commits")):
        m = re.search(r"^" + re.escape(name) + r"\s+([0-9.e+]+)$", text, re.M)
        out[key] = float(m.group(1)) if m else 0.0
    return out


def strace_counts(text: str) -> dict[str, int]:
    """`strace -c` summary: calls per syscall."""
    calls = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) in (5, 6) and f[-1] != "total" and f[3].isdigit():
            calls[f[-1]] = int(f[3])
    return calls


def perf_counts(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 2 and re.fullmatch(r"[0-9.,]+", f[0]):
            out[f[1]] = float(f[0].replace(",", ""))
    return out


def windowed(env, delay: float, seconds: float, cmd: list[str]) -> dict:
    """Runs `cmd` (attached to the daemon) for `seconds` after `delay`, with the daemon's
    counters read at both ends; returns its stderr and the counters' deltas."""
    res: dict = {}

    def run():
        time.sleep(delay)
        m0, c0 = metrics(env), cpu_snapshot(env)["coord"]
        p = subprocess.run(["timeout", "-s", "INT", str(seconds)] + cmd, capture_output=True, text=True)
        m1, c1 = metrics(env), cpu_snapshot(env)["coord"]
        res.update(out=p.stderr + p.stdout, d={k: m1[k] - m0[k] for k in m0}, cpu_s=c1 - c0)
    t = threading.Thread(target=run)
    t.start()
    res["thread"] = t
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="2pc")
    ap.add_argument("--calls", default="batched", choices=["batched", "per-step"])
    ap.add_argument("--one-request", action="store_true", help="the driver's one-request path (modes 2pc and co)")
    ap.add_argument("--ro-share", type=float, help="share of read-only global transactions (the driver's --ro-share)")
    ap.add_argument("--daemon", help="another build of the daemon (default: the installed one)")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--perf-record", metavar="FILE")
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "log", "log-fdatasync"],
                    help="the daemon's decision store: SQLite, or the append-only decision log (direct writes, or fdatasync)")
    a = ap.parse_args()
    subprocess.run(["perf", "probe", "-q", "-x", LIBC, "malloc"], capture_output=True)  # exists already: fine
    point = micro.parse_point("default", dict(micro.DEFAULTS, N=a.rows))
    wargs = loadgen.micro_args(point) + ["--calls", a.calls] + (["--one-request"] if a.one_request else []) \
        + (["--ro-share", str(a.ro_share)] if a.ro_share is not None else [])
    with Env(fsync=True) as env:
        micro.load(env, a.rows)
        env.set_mode(a.mode)
        if a.daemon:
            env.use_binary(a.daemon)
        env.use_store(a.store)
        warm = 1.0
        out = {"mode": a.mode, "calls": a.calls, "one_request": a.one_request, "ro_share": a.ro_share,
               "daemon": a.daemon or "installed", "store": a.store, "clients": a.clients}

        def slice_with(cmd):
            w = windowed(env, warm + 0.5, a.seconds, cmd if cmd[0] == "sleep" else cmd + ["-p", str(env.daemon.proc.pid)])
            r = loadgen.run_slice(env, a.mode, wargs, clients=a.clients, warmup=warm, seconds=a.seconds + 1.0)
            w["thread"].join()
            if r.get("error"):
                raise SystemExit(f"the slice failed: {r['error']}")
            return w, r

        # CPU and the daemon's counters with nothing attached (the malloc uprobe and strace
        # cost the daemon CPU of their own).
        w, r = slice_with(["sleep", str(a.seconds)])
        d = w["d"]
        n = max(1.0, d["commits"])
        out.update(tx_per_s=round(r.get("tps", 0.0), 1), commits=int(d["commits"]),
                   daemon_cpu_ms_per_tx=round(w["cpu_s"] * 1000 / n, 3),
                   requests_per_tx=round(d["requests"] / n, 2), store_syncs_per_tx=round(d["store_batches"] / n, 3),
                   store_ops_per_tx=round(d["store_ops"] / n, 2))
        w, r = slice_with(["perf", "stat", "-e", "task-clock,context-switches,cpu-migrations,probe_libc:malloc"])
        n = max(1.0, w["d"]["commits"])
        pc = perf_counts(w["out"])
        out.update(context_switches_per_tx=round(pc.get("context-switches", 0) / n, 2),
                   mallocs_per_tx=round(pc.get("probe_libc:malloc", 0) / n, 1))
        w, _ = slice_with(["strace", "-c", "-f"])
        n = max(1.0, w["d"]["commits"])
        calls = strace_counts(w["out"])
        out["syscalls_per_tx"] = round(sum(calls.values()) / n, 1)
        out["syscalls"] = {k: round(v / n, 2) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v / n >= 0.05}
        if a.perf_record:
            w, _ = slice_with(["perf", "record", "-e", "cpu-clock", "-F", "1999", "-g", "-o", a.perf_record])
            out["perf_record"] = a.perf_record
        if a.daemon:
            env.use_binary(None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

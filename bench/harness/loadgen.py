"""Runs the Rust load driver (bench/loadgen, installed as $COTX_CACHE/bin/cotx-loadgen by
scripts/build-loadgen.sh) for one slice: one workload, one mode, a warm-up then a measured
window (several daemons sharing a PostgreSQL store: --coord lists their URLs, client i
talks to the i-th mod n). The driver prints an event line when its window opens and when it closes; the
servers' CPU (PostgreSQL, mariadbd, the coordinator: core.cpu_snapshot) is sampled at
exactly those moments, so CPU per committed transaction covers the same window as the
commits it is divided by (the driver keeps its sessions open until the second sample is
taken: a backend exiting during the sample would be counted nowhere). The flushes to
stable storage (flushes.py: WAL, redo log, decision store) are counted over the same
window. `rate`: the driver's open loop (--rate), a fixed number of transactions per second
whatever the completions, for CPU per transaction at equal throughput.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from . import flushes, jta
from .core import cpu_snapshot

DIP = "dip"


def binary() -> Path:
    p = Path(os.environ.get("COTX_LOADGEN_BIN") or
             Path(os.environ.get("COTX_CACHE", "/var/cache/cotx")) / "bin" / "cotx-loadgen")
    if not p.exists():
        raise RuntimeError(f"{p} not found: build it with `bash scripts/build-loadgen.sh`")
    return p


def _release(proc) -> None:
    """Lets the driver close its sessions (it keeps them until the CPU sample is taken)."""
    try:
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.write("\n")
            proc.stdin.close()
    except OSError:
        pass


def micro_args(p: dict) -> list[str]:
    return ["--workload", "micro"] + [x for k in ("S", "R", "W", "P", "N", "K") for x in (f"--{k}", str(p[k]))]


def tpcc_args(W: int, items: int, customers: int, remote_item: float = 0.10, remote_customer: float = 0.15,
              ytd_split: int = 0) -> list[str]:
    return ["--workload", "tpcc", "--warehouses", str(W), "--items", str(items), "--customers", str(customers),
            "--remote-item", str(remote_item), "--remote-customer", str(remote_customer), "--ytd-split", str(ytd_split)]


def run_slice(env, mode: str, workload_args: list[str], *, clients: int, warmup: float, seconds: float,
              seed: int = 1, extra: list[str] | None = None, attempt_log: Path | None = None,
              timeout: float | None = None, rate: float | None = None) -> dict:
    """One slice in `mode` (the servers must already be switched: env.set_mode). Returns
    the driver's result plus the servers' CPU ms per committed transaction in the window
    and the driver's own share of all CPU used in it. A mode base:jta runs the Narayana
    driver (jta.py) in mode base; any other label runs the Rust driver in the base mode.
    `rate`: open loop at that many transactions per second (the Rust driver's --rate)."""
    if rate is not None and jta.is_jta(mode):
        raise ValueError(f"{mode}: the Narayana driver has no open loop (--rate)")
    if jta.is_jta(mode):
        cmd = jta.command(env, mode, workload_args, clients=clients, warmup=warmup, seconds=seconds, seed=seed,
                          extra=extra)
    else:
        cmd = [str(binary()), "--mode", mode.partition(":")[0], "--pg", env.pg.dsn, "--my", env.my.dsn,
               "--coord", ",".join(d.url for d in env.daemons), "--clients", str(clients), "--warmup", str(warmup),
               "--seconds", str(seconds), "--seed", str(seed), "--sync-stdin"] + workload_args + (extra or [])
        if attempt_log is not None:
            cmd += ["--attempt-log", str(attempt_log)]
        if rate is not None:
            cmd += ["--rate", str(rate)]
    penv = dict(os.environ, COTX_TOKEN=env.daemon.token or "")
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=penv)
    deadline = time.time() + (timeout or (warmup + seconds + 120))
    cpu0 = cpu1 = fl0 = fl1 = None
    result = None
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        ev = msg.get("event")
        if ev == "measure_start":
            # The counters' own queries before the CPU sample at the start and after it at
            # the end: their CPU stays outside the window.
            fl0 = flushes.snapshot(env)
            cpu0 = cpu_snapshot(env)
        elif ev == "measure_end":
            cpu1 = cpu_snapshot(env)
            fl1 = flushes.snapshot(env)
            _release(proc)
        else:
            result = msg
        if time.time() > deadline:
            proc.kill()
            break
    _release(proc)
    try:
        proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    time.sleep(0.2)   # let the postmaster reap the driver's backends before the next snapshot
    if result is None:
        return {"mode": mode, "error": f"no result from the driver (exit {proc.returncode}): {err[-500:]}"}
    if cpu0 and cpu1:
        commits = max(1, int(result.get("commits") or 0))
        # The PostgreSQL store's instance counts as a server ("store", 0 with SQLite, whose
        # work is in the daemon's CPU), so that server CPU per transaction compares the two.
        srv = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in ("pg", "my", "coord", "store")}
        drv = float(result.get("cpu_s") or 0.0)
        if jta.is_jta(mode) or result.get("coordinator") == "in-process":
            # Narayana, or our coordinator in the driver's process (--coord inproc:...),
            # is the coordinator here and runs inside the driver: its share of the
            # driver's CPU is booked as the coordinator's (the idle daemon's is kept).
            tm = min(drv, jta.tm_cpu_s(result))
            srv["coord"] += tm
            drv -= tm
        for k, v in srv.items():
            result[f"cpu_ms_{k}"] = v * 1000.0 / commits
        result["cpu_ms_server"] = sum(srv.values()) * 1000.0 / commits
        result["cpu_ms_driver"] = drv * 1000.0 / commits
        used = sum(srv.values()) + drv
        result["driver_cpu_share"] = drv / used if used > 0 else 0.0
        result["server_cpu_util"] = sum(srv.values()) / float(result.get("seconds") or seconds)
    if fl0 is not None and fl1 is not None:
        inproc = result.get("store_syncs") if result.get("coordinator") == "in-process" else None
        result.update(flushes.per_commit(fl0, fl1, int(result.get("commits") or 0), inproc))
    if err.strip() and not result.get("errors"):
        result.setdefault("stderr", err[-500:])
    return result

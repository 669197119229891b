"""The Narayana (JTA) load driver for a slice: clients/java/example's io.cotx.tm.Load, the same
command line and result line as the Rust driver (bench/loadgen), with Narayana's
transaction manager inside the driver process instead of the cotx daemon.

A mode "base:jta" (2pc:jta, co:jta) runs it: the servers are switched for the base as
usual (pg_co / mysql_co off for 2pc, on for co); the daemon keeps running but is not in the
path. scripts/build-jta-load.sh compiles the classes offline and writes their classpath
to clients/java/example/target/jta-load.classpath (COTX_JTA_CLASSPATH overrides the file).

CPU: the transaction manager runs in the driver's threads, so the driver reports the part
of its CPU spent inside the TM's calls (cpu_tm_s: begin, enlist, commit, rollback, which
includes the XA statements' client side, plus its threads that are not clients: the
reaper, periodic recovery). loadgen.run_slice books that as the coordinator's share
(cpu_ms_coord, inside cpu_ms_server) and the rest as the driver's, so that "server CPU per
transaction" compares the daemon path (pg + my + the daemon) with Narayana's (pg + my +
the in-process TM).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LABEL = "jta"
BUILD_HINT = "build it with `bash scripts/build-jta-load.sh` (offline, from the Maven cache)"


def is_jta(mode: str) -> bool:
    """A mode the Narayana driver runs: base:jta."""
    return mode.partition(":")[2] == LABEL


def classpath() -> str:
    """The driver's runtime classpath; RuntimeError with the build hint when it is missing."""
    f = Path(os.environ.get("COTX_JTA_CLASSPATH") or ROOT / "clients" / "java" / "example" / "target" / "jta-load.classpath")
    if shutil.which("java") is None:
        raise RuntimeError("java not found: run scripts/bootstrap.sh (Java 17)")
    if not f.exists():
        raise RuntimeError(f"{f} not found: {BUILD_HINT}")
    cp = f.read_text().strip()
    missing = [p for p in cp.split(os.pathsep) if p and not Path(p).exists()]
    classes = [p for p in cp.split(os.pathsep) if p.endswith("classes")]
    if missing or not classes or not (Path(classes[0]) / "io" / "cotx" / "tm" / "Load.class").exists():
        raise RuntimeError(f"{f} names missing entries ({(missing or classes or ['classes'])[0]}): {BUILD_HINT}")
    return cp


def command(env, mode: str, workload_args: list[str], *, clients: int, warmup: float, seconds: float,
            seed: int, extra: list[str] | None) -> list[str]:
    """The java command line for one slice of `mode` (base:jta)."""
    base = mode.partition(":")[0]
    # A fixed heap: no resizing inside a window; the JIT's and GC's threads stay the JVM's own.
    return ["java", "-Xms256m", "-Xmx256m", "-cp", classpath(), "io.cotx.tm.Load", "--mode", base,
            "--pg", env.pg.dsn, "--my", env.my.dsn, "--clients", str(clients), "--warmup", str(warmup),
            "--seconds", str(seconds), "--seed", str(seed), "--sync-stdin"] + workload_args + (extra or [])


def tm_cpu_s(result: dict) -> float:
    """CPU seconds of the in-process TM in the window (see the module's docstring)."""
    return float(result.get("cpu_tm_s") or 0.0)

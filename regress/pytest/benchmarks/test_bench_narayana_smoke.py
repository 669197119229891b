"""Keeps the Narayana (JTA) load driver working (clients/java io.cotx.tm.Load through
bench/harness/jta.py, the modes 2pc:jta and co:jta of `run_all.py --experiments narayana`):
a second of each on real servers, the result line as the harness reads it, the TM's CPU
booked as the coordinator's, nothing left prepared; and co:jta refused on servers whose
extensions are off. No timing is asserted. The classes are built first when missing
(scripts/build-jta-load.sh: offline, from the Maven cache)."""
import shutil
import subprocess
from pathlib import Path

import pytest
from cotest.marks import requires_mysql_co, requires_pg_co

pytestmark = [requires_pg_co, requires_mysql_co]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def env():
    from bench.harness import jta
    try:
        jta.classpath()
    except RuntimeError:
        if not (shutil.which("mvn") and shutil.which("java")):
            pytest.skip("java/maven missing: scripts/bootstrap.sh installs them")
        subprocess.run(["bash", str(ROOT / "scripts/build-jta-load.sh")], check=True, timeout=600)
        jta.classpath()
    from bench.harness.core import Env
    from bench.micro import micro
    with Env(fsync=False) as e:
        micro.load(e, 500)
        yield e


def args():
    from bench.harness import loadgen
    from bench.micro import micro
    return loadgen.micro_args(micro.parse_point("N=500"))


def test_jta_slices(env):
    from bench.harness import loadgen
    for mode, iso in (("2pc:jta", "REPEATABLE READ"), ("co:jta", "SERIALIZABLE")):
        env.set_mode(mode)
        r = loadgen.run_slice(env, mode, args(), clients=3, warmup=0.3, seconds=1.0)
        assert not r.get("errors") and not r.get("error"), r
        assert r["tm"] == "narayana" and r["mode"] == mode.partition(":")[0] and r["my_isolation"] == iso, r
        assert r["commits"] > 0 and r["attempts"] == r["commits"] + r["aborts"], r
        assert r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"], r
        # Narayana's share of the driver's CPU is the coordinator's; the rest stays the driver's.
        assert r["cpu_tm_s"] > 0 and r["cpu_ms_coord"] > 0 and 0 < r["driver_cpu_share"] < 1, r
        assert env.leftovers() == (0, 0)


def test_co_jta_refuses_servers_without_the_extensions(env):
    from bench.harness import loadgen
    env.set_mode("2pc")   # pg_co and mysql_co off
    r = loadgen.run_slice(env, "co:jta", args(), clients=1, warmup=0.1, seconds=0.5)
    assert "needs pg_co (engine mode)" in r.get("error", ""), r

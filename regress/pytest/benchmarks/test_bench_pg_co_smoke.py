"""Keeps bench/pg_co working: a seconds-long smoke run of each pgbench experiment."""
import subprocess
import sys
from pathlib import Path

import pytest
from cotest.marks import requires_pg_co

ROOT = Path(__file__).resolve().parents[3]
pytestmark = requires_pg_co


@pytest.mark.parametrize("experiment", ["cost", "rule-c", "wait", "rule-s"])
def test_pgbench_cost_smoke(experiment):
    r = subprocess.run([sys.executable, str(ROOT / "bench/pg_co/pgbench_cost.py"), "--quick", "--experiment", experiment, "--rows", "1000"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ratio on/off" in r.stdout

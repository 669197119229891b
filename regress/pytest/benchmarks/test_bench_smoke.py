"""Keeps the earlier side-by-side bench harness (bench/run_all.py --python-driver: microbenchmark + TPC-C subset,
four modes, CSVs, plots, report) working: one smoke run of every experiment with tiny
sizes and sub-second runs on real servers. No timing is asserted. Mode client runs the
product's client mode (the daemon at enforcement = "client"), 2pc and local plain 2PC
("none"), co the engines ("engine"): each run's row says what the daemon said after it."""
import csv
import subprocess
import sys
from pathlib import Path

from cotest.marks import requires_mysql_co, requires_pg_co

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [requires_pg_co, requires_mysql_co]


def test_run_all_smoke(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench/run_all.py"), "--python-driver", "--smoke", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for exp in ("micro", "tpcc"):
        rows = list(csv.DictReader(open(tmp_path / f"{exp}_summary.csv")))
        modes = {(row["point"], row["mode"]) for row in rows}
        points = {row["point"] for row in rows}
        assert modes == {(p, m) for p in points for m in ("local", "2pc", "co", "client")}, modes
        for row in rows:
            assert float(row["tps_median"]) > 0, row      # every mode committed something
            assert row["mode"] != "2pc" or float(row["ratio_to_2pc"]) == 1.0
    runs = list(csv.DictReader(open(tmp_path / "tpcc_runs.csv")))
    assert runs and all(row["check"] == "ok" for row in runs), [row["check"] for row in runs]
    assert all(not row["errors"] for row in runs)
    want = {"local": "none", "2pc": "none", "co": "engine", "client": "client"}
    for exp in ("micro", "tpcc"):
        for row in csv.DictReader(open(tmp_path / f"{exp}_runs.csv")):
            assert row["enforcement"] == f"my={want[row['mode']]} pg={want[row['mode']]}", row
            assert row["check"] in ("", "ok"), row
            # client mode's branches were registered as such (they wrote their shim slots)
            assert (int(row["client_branches"]) > 0) == (row["mode"] == "client"), row
    assert (tmp_path / "plots" / "tpcc.png").stat().st_size > 1000
    assert "| target | measured | met? |" in (tmp_path / "RESULTS.md").read_text()

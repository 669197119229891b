"""bench/coordinator/store_log_probe.py end to end on the real binary, tiny sizes (no timing
asserted): SQLite and the append-only log with each sync method run in ABC CBA order for
each pattern, each run's line says which, and the summary pairs the rounds into ratios
applog/sqlite and applog/applog-fdatasync with bootstrap intervals."""
import json
import subprocess
import sys

from cotest.daemon import find_binary


def test_store_log_probe_runs_abba_and_pairs_the_rounds(tmp_path):
    p = subprocess.run([sys.executable, "-m", "bench.coordinator.store_log_probe", "--rounds", "2", "--n", "40",
                        "--n-throughput", "200", "--dir", str(tmp_path), "--force"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    runs = [x for x in lines if "round" in x]
    assert len(runs) == 2 * 3 * 3, runs
    for pattern in ("1 writer, back to back", "8 writers at 12 ms", "64 writers, back to back"):
        order = [(x["round"], x["backend"]) for x in runs if x["pattern"] == pattern]
        assert order == [(0, "sqlite"), (0, "applog"), (0, "applog-fdatasync"),
                         (1, "applog-fdatasync"), (1, "applog"), (1, "sqlite")], order
    assert all(x["store_cpu_ms_per_decision"] > 0 and x["store_cpu_ms_per_sync"] > 0 and x["quiet"] for x in runs), runs
    assert {x["decisions"] for x in runs if x["pattern"].startswith("64")} == {200}
    ratios = [x for x in lines if x.get("ratio") in ("applog/sqlite", "applog/applog-fdatasync")]
    assert len(ratios) == 6 and all(r["store_cpu_ms_per_decision"]["runs"] == 2 for r in ratios), ratios
    for r in ratios:
        m = r["store_cpu_ms_per_decision"]
        assert m["ci95"][0] <= m["median"] <= m["ci95"][1], r
    assert find_binary()  # the binary the script ran (COTX_COORDINATOR_BIN or the cached build)

"""Keeps the Rust load driver (bench/loadgen via bench/harness/loadgen.py) working: every
mode of the microbenchmark and the TPC-C subset (classic and split warehouse rows) for a
second on real servers, with the attempt log. No timing is asserted."""
import json

import pytest

from conftest import requires_mysql_co, requires_pg_co

pytestmark = [requires_pg_co, requires_mysql_co]


@pytest.fixture(scope="module")
def env():
    from bench.harness.core import Env
    with Env(fsync=False) as e:
        yield e


def test_micro_every_mode(env, tmp_path):
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("N=500"))
    log = tmp_path / "attempts.jsonl"
    for mode in ("local", "2pc", "co", "shim", "dip"):
        env.set_mode("co" if mode == "dip" else mode)
        r = loadgen.run_slice(env, mode, args, clients=3, warmup=0.3, seconds=1.0, attempt_log=log)
        assert not r.get("errors") and not r.get("error"), r
        if mode == "dip" and r.get("skipped"):
            continue  # no decision-in-participant support in the installed pg_co / daemon
        assert r["commits"] > 0, r
        assert r["attempts"] == r["commits"] + r["aborts"], r
        assert r["cpu_ms_server"] > 0 and 0 < r["driver_cpu_share"] < 1, r
        if mode == "shim":
            assert r["helpers"] > 0, r        # the shim really prepared helpers
        assert env.leftovers() == (0, 0)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert {x["mode"] for x in lines} >= {"local", "2pc", "co", "shim"}
    for x in lines:
        assert x["outcome"] in ("commit", "abort") and (x["error"] is None) == (x["outcome"] == "commit" or x["kind"].startswith("coordinator"))
        for b in x["branches"]:
            assert b["db"] in ("pg", "my") and b["table"].startswith("mt") and len(b["written"]) == 6
    twopc = [x for x in lines if x["mode"] == "co"]
    assert all(x["gtid"] and x["branches"][0]["gid"].endswith(":" + x["gtid"] + ":b0") for x in twopc)


@pytest.mark.parametrize("split", [0, 4])
def test_tpcc(env, split):
    from bench.harness import loadgen
    from bench.tpcc import tpcc
    wl = tpcc.TpcC(2, items=300, customers=20, ytd_split=split)
    wl.load(env)
    for mode in ("2pc", "co", "shim"):
        env.set_mode(mode)
        r = loadgen.run_slice(env, mode, loadgen.tpcc_args(2, 300, 20, ytd_split=split),
                              clients=3, warmup=0.3, seconds=1.0, extra=["--parallel-prepare", "--parallel-finish"])
        assert not r.get("errors") and not r.get("error"), r
        assert r["commits"] > 0, r
        assert wl.check(env) == "ok"


def test_run_all_smoke(tmp_path):
    """The one command that regenerates RESULTS.md, every experiment, seconds-long."""
    import csv
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "bench/run_all.py"), "--smoke", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = list(csv.DictReader(open(tmp_path / "slices_summary.csv")))
    got = {(s["experiment"], s["mode"]) for s in summary}
    for exp, modes in (("micro", ("2pc", "co", "shim", "local")), ("micro_levers", ("2pc", "co")),
                       ("micro_ro", ("2pc", "co", "shim")), ("tpcc", ("2pc", "co", "shim")),
                       ("autocommit", ("2pc", "co:acr=OFF", "co:acr=ON"))):
        assert {(exp, m) for m in modes} <= got, (exp, got)
    for s in summary:
        assert float(s["tps_median"]) > 0 and s["checks"] == "ok" and s["errors"] == "0", s
        if s["mode"] == "2pc":
            assert s["ratio_verdict"] == "baseline"
        else:
            assert float(s["ratio_lo"]) <= float(s["ratio"]) <= float(s["ratio_hi"]), s
    md = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- slices:generated:begin -->" in md and "| target | measured: median [95% CI] | met? |" in md
    assert (tmp_path / "attempts" / "micro_default.jsonl").stat().st_size > 0

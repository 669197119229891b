"""Keeps the Rust load driver (bench/loadgen via bench/harness/loadgen.py) working: every
mode of the microbenchmark and the TPC-C subset (classic and split warehouse rows) for a
second on real servers, with the attempt log. No timing is asserted. Each mode must run
under its enforcement: the daemon's /metrics and every branch registration say none for
2pc, engine for co and dip, client for client (whose branches then wrote their slots in
the daemon's shim tables, while 2pc's wrote none). The experiment `store`'s switch: the
PostgreSQL decision store shared by 3 daemons, the driver's clients spread over them."""
import json

import pytest

from conftest import requires_mysql_co, requires_pg_co

pytestmark = [requires_pg_co, requires_mysql_co]


@pytest.fixture(scope="module")
def env():
    from bench.harness.core import Env
    with Env(fsync=False) as e:
        yield e


ENFORCEMENT = {"local": "none", "2pc": "none", "co": "engine", "dip": "engine", "client": "client"}


def shim_writes(env) -> tuple[int, int]:
    """Slot writes so far in the daemon's client-mode tables (PostgreSQL, MariaDB)."""
    return (int(env.pg.sql("SELECT coalesce(sum(v), 0) FROM cotx.shim")[0][0]),
            int(env.my.sql("SELECT coalesce(sum(v), 0) FROM cotx_shim")[0][0]))


def test_micro_every_mode(env, tmp_path):
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("N=500"))
    log = tmp_path / "attempts.jsonl"
    # client twice: the daemon goes to client mode (and creates its shim tables) the
    # first time; the second client slice comes after 2pc's, whose branches write no slot.
    for mode in ("local", "client", "2pc", "co", "client", "dip"):
        env.set_mode(mode)
        want = ENFORCEMENT[mode]
        assert env.daemon_enforcement() == {"pg": want, "my": want}
        shims = shim_writes(env) if mode in ("2pc", "client") else None   # the tables exist from the first client
        r = loadgen.run_slice(env, mode, args, clients=3, warmup=0.3, seconds=1.0, attempt_log=log)
        assert not r.get("errors") and not r.get("error"), r
        if mode == "dip" and r.get("skipped"):
            continue  # no decision-in-participant support in the installed pg_co / daemon
        assert r["commits"] > 0, r
        assert r["attempts"] == r["commits"] + r["aborts"], r
        assert r["cpu_ms_server"] > 0 and 0 < r["driver_cpu_share"] < 1, r
        # Every branch was registered under the mode's enforcement.
        assert set(r["enforcement"]) == ({f"pg:{want}", f"my:{want}"} if mode != "local" else set()), r
        if mode == "client":
            assert r["client_branches"] == sum(r["enforcement"].values()) > 0, r
            after = shim_writes(env)
            assert after[0] > shims[0] and after[1] > shims[1], (shims, after)   # slots written on both
        else:
            assert r["client_branches"] == 0, r
            if mode == "2pc":
                assert shim_writes(env) == shims      # plain 2PC: no shim at all
        # Nothing prepared left: the branches decided, client mode's helpers rolled back.
        assert env.leftovers() == (0, 0)
        assert env.enforcement_seen(mode)[1] == ""
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert {x["mode"] for x in lines} >= {"local", "2pc", "co", "client"}
    for x in lines:
        assert x["outcome"] in ("commit", "abort") and (x["error"] is None) == (x["outcome"] == "commit" or x["kind"].startswith("coordinator"))
        for b in x["branches"]:
            assert b["db"] in ("pg", "my") and b["table"].startswith("mt") and len(b["written"]) == 6
    twopc = [x for x in lines if x["mode"] == "co"]
    assert all(x["gtid"] and x["branches"][0]["gid"].endswith(":" + x["gtid"] + ":b0") for x in twopc)



def test_micro_five_branches_and_ro_share(env, tmp_path):
    """The scaling study's workload: S=5 (three branches on PostgreSQL, two on MariaDB,
    each on its own table mt<i>) with half of the transactions read-only (--ro-share 0.5:
    every branch's reads kept, its updates dropped)."""
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("S=5:N=500")) + ["--ro-share", "0.5"]
    log = tmp_path / "attempts.jsonl"
    env.set_mode("co")
    r = loadgen.run_slice(env, "co", args, clients=3, warmup=0.3, seconds=1.0, attempt_log=log)
    assert not r.get("errors") and not r.get("error"), r
    assert r["commits"] > 0, r
    assert env.leftovers() == (0, 0)
    kinds = set()
    for x in map(json.loads, log.read_text().splitlines()):
        b = x["branches"]
        assert [(y["db"], y["table"]) for y in b] == [("pg", "mt0"), ("pg", "mt1"), ("pg", "mt2"), ("my", "mt3"), ("my", "mt4")]
        assert all(len(y["read"]) == 6 for y in b)
        kinds.add(tuple(len(y["written"]) for y in b))
    assert kinds == {(0,) * 5, (6,) * 5}, kinds

def test_a_mode_under_another_enforcement_is_refused(env):
    """The driver stops when the daemon registers branches under another enforcement than
    the mode's (here: mode client against the plain-2PC daemon): no result measured under
    the wrong configuration. The old name shim is mode client."""
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 500)
    env.set_mode("2pc")
    r = loadgen.run_slice(env, "shim", loadgen.micro_args(micro.parse_point("N=500")), clients=1, warmup=0.1,
                          seconds=0.3)
    assert r["mode"] == "client" and r["commits"] == 0, r
    assert r["errors"] and all("mode client needs enforcement client but the coordinator answered none" in e
                               for e in r["errors"]), r
    assert env.leftovers() == (0, 0)


@pytest.mark.parametrize("split", [0, 4])
def test_tpcc(env, split):
    from bench.harness import loadgen
    from bench.tpcc import tpcc
    wl = tpcc.TpcC(2, items=300, customers=20, ytd_split=split)
    wl.load(env)
    for mode in ("2pc", "co", "client", "local"):
        env.set_mode(mode)
        r = loadgen.run_slice(env, mode, loadgen.tpcc_args(2, 300, 20, ytd_split=split),
                              clients=3, warmup=0.3, seconds=1.0, extra=["--parallel-prepare", "--parallel-finish"])
        assert not r.get("errors") and not r.get("error"), r
        assert r["commits"] > 0, r
        want = ENFORCEMENT[mode]
        assert set(r["enforcement"]) <= {f"pg:{want}", f"my:{want}"}, r
        assert (r["client_branches"] > 0) == (mode == "client"), r
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
    for exp, modes in (("micro", ("2pc", "co", "client", "local")), ("micro_levers", ("2pc", "co")),
                       ("micro_ro", ("2pc", "co", "client", "local")), ("tpcc", ("2pc", "co", "client", "local")),
                       ("autocommit", ("2pc", "co:acr=OFF", "co:acr=ON"))):
        assert {(exp, m) for m in modes} <= got, (exp, got)
    # Each slice ran under its mode's enforcement, as the daemon said after it; client
    # mode's branches were registered as such.
    for row in csv.DictReader(open(tmp_path / "slices.csv")):
        want = ENFORCEMENT[row["mode"].partition(":")[0]]
        assert row["enforcement"] == f"my={want} pg={want}", row
        assert (int(row["client_branches"]) > 0) == (row["mode"] == "client"), row
    for s in summary:
        assert float(s["tps_median"]) > 0 and s["checks"] == "ok" and s["errors"] == "0", s
        if s["mode"] == "2pc":
            assert s["ratio_verdict"] == "baseline"
        else:
            assert float(s["ratio_lo"]) <= float(s["ratio"]) <= float(s["ratio_hi"]), s
    md = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- slices:generated:begin -->" in md and "| target | measured: median [95% CI] | met? |" in md
    assert (tmp_path / "attempts" / "micro_default.jsonl").stat().st_size > 0


def test_pg_store_three_daemons(env):
    """The experiment `store`'s switch: the PostgreSQL store in its own instance shared by
    3 daemons, the driver's clients spread over them (--coord URL,URL,URL), every daemon
    deciding into the one store; their CPU summed, the store's apart; then back to the
    SQLite daemon."""
    from bench.harness import loadgen
    from bench.harness.core import STORE_DB, STORE_TABLE
    from bench.micro import micro
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("N=500"))
    try:
        env.set_mode("2pc")
        env.use_store("pg3")
        assert [d.node_id for d in env.daemons] == ["benchpg0", "benchpg1", "benchpg2"]
        assert len({d.url for d in env.daemons}) == 3 and env.daemon_enforcement() == {"pg": "none", "my": "none"}
        r = loadgen.run_slice(env, "2pc", args, clients=3, warmup=0.3, seconds=1.0)
        assert not r.get("errors") and not r.get("error"), r
        assert r["commits"] > 0 and r["cpu_ms_coord"] > 0 and r["cpu_ms_store"] > 0, r
        nodes = {n for (n,) in env.store_pg.sql(f"SELECT DISTINCT node FROM {STORE_TABLE}", dbname=STORE_DB)}
        assert nodes == {"benchpg0", "benchpg1", "benchpg2"}, nodes
        assert env.leftovers() == (0, 0)
    finally:
        env.use_store("sqlite")
    assert [d.node_id for d in env.daemons] == ["bench"]
    r = loadgen.run_slice(env, "2pc", args, clients=2, warmup=0.2, seconds=0.5)
    assert r["commits"] > 0 and r["cpu_ms_store"] == 0, r

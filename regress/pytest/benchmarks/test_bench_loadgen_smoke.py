"""Keeps the Rust load driver (bench/loadgen via bench/harness/loadgen.py) working: every
mode of the microbenchmark and the TPC-C subset (classic and split warehouse rows) for a
second on real servers, with the attempt log. No timing is asserted. Each mode must run
under its enforcement: the daemon's /metrics and every branch registration say none for
2pc, engine for co and dip, client for client (whose branches then wrote their slots in
the daemon's shim tables, while 2pc's wrote none). The experiment `store`'s switch: the
PostgreSQL decision store shared by 3 daemons, the driver's clients spread over them."""
import json

import pytest
from cotest.marks import requires_mysql_co, requires_pg_co

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



def test_micro_one_request(env):
    """--one-request (the variants 2pc:1req, co:1req of bench/experiments.py): each client
    leases a range of gtids and a transaction is one request to the daemon, its commit
    (the daemon's cotx_requests_total: about one per attempt, against two for the batched
    calls), under the mode's enforcement; nothing stays prepared. In mode dip the commit
    hands the decision to the PostgreSQL branch (decide_in): still one request, and no
    decision written to the store. co:1req-pglast prepares MariaDB's branch before
    PostgreSQL's (--prepare-pg-last). Each result says where its time went, step by step
    (phases_p50_ms). The driver refuses the flag in the modes that need a begun
    transaction."""
    from bench.harness import loadgen
    from bench.micro import micro
    from cotest.coord import metric
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("N=500"))
    clients = 3
    for mode in ("2pc", "2pc:1req", "co:1req", "dip:1req", "co:1req-pglast"):
        env.set_mode(mode.partition(":")[0])
        d = env.daemon
        requests, leases = metric(d, "cotx_requests_total"), metric(d, "cotx_gtid_leases_total", 0)
        handed = metric(d, "cotx_decided_in_participant_total", 0)
        extra = ["--one-request"] if ":1req" in mode else []
        extra += ["--prepare-pg-last"] if mode.endswith("-pglast") else []
        r = loadgen.run_slice(env, mode, args, clients=clients, warmup=0.0, seconds=1.0, extra=extra)
        assert not r.get("errors") and not r.get("error"), r
        if mode == "dip:1req" and r.get("skipped"):
            continue  # no decision-in-participant support in the installed pg_co / daemon
        assert r["commits"] > 0 and r["attempts"] == r["commits"] + r["aborts"], r
        assert r["one_request"] == bool(extra), r
        assert r["prepare_pg_last"] == mode.endswith("-pglast"), r
        want = ENFORCEMENT[mode.partition(":")[0]]
        assert set(r["enforcement"]) == {f"pg:{want}", f"my:{want}"}, r
        # Per client beside its transactions: the resources read, its lease, its last held
        # acknowledgement and a health check at close, and the harness's own reads.
        sent = metric(d, "cotx_requests_total") - requests
        if extra:
            assert metric(d, "cotx_gtid_leases_total", 0) - leases == clients, r
            # dip: a decision commit refused after the hand-over is reported (failed).
            reported = r["aborts"] if mode.startswith("dip") else 0
            assert sent <= r["attempts"] + reported + 4 * clients + 10, (sent, r)
        else:
            assert sent >= 2 * r["commits"], (sent, r)
        if mode == "dip:1req":
            assert metric(d, "cotx_decided_in_participant_total", 0) - handed >= r["commits"], r
        # Where the time went, step by step (bench/RESULTS.md reads it): dip's decision
        # commit is a step of its own; the others' commit is the request and phase two.
        steps = r["phases_p50_ms"]
        assert {"statements postgresql", "statements mariadb", "prepare", "request", "phase two"} <= set(steps), r
        assert ("decision" in steps) == mode.startswith("dip"), r
        assert all(v is not None and 0 <= v <= r["p99_ms"] for v in steps.values()), r
        assert 0 < r["commit_p50_ms"] <= r["p50_ms"] and r["commit_p50_ms"] <= r["commit_p99_ms"], r
        assert env.leftovers() == (0, 0)
    env.set_mode("client")
    r = loadgen.run_slice(env, "client", args, clients=1, warmup=0.0, seconds=0.5, extra=["--one-request"])
    # Refused before any work (exit 2; the message, then the usage, on stderr).
    assert "(exit 2)" in r.get("error", ""), r


def test_dip_hand_over_while_preparing(env):
    """dip on the one-request path sends the commit that hands the decision over after the
    other branches' PREPAREs; with --handover-while-preparing beside them (the model's mode
    "one request with the decision in a participant" sends either way: the decision branch
    commits only once both answered). Three branches on 20 rows
    (two on PostgreSQL, the first prepared beside the MariaDB one): PostgreSQL refuses
    PREPAREs (serialization failures, pg_co's rules) after the daemon took the hand-over: the decision branch is rolled back, then
    reported failed, so the daemon aborts at once. Either way nothing stays prepared, no
    transaction is left deciding in the daemon, and every commit was decided in the
    participant."""
    from bench.harness import loadgen
    from bench.micro import micro
    from cotest.coord import api, metric
    micro.load(env, 20)
    args = loadgen.micro_args(micro.parse_point("N=20:S=3:P=0.67"))
    env.set_mode("dip")
    d = env.daemon
    for extra in (["--handover-while-preparing"], []):
        handed = metric(d, "cotx_decided_in_participant_total", 0)
        r = loadgen.run_slice(env, "dip", args, clients=4, warmup=0.0, seconds=2.0, extra=["--one-request"] + extra)
        if r.get("skipped"):
            pytest.skip("no decision-in-participant support in the installed pg_co / daemon")
        assert not r.get("errors") and not r.get("error"), r
        assert r["commits"] > 0 and r["aborts"] > 0, r
        assert r["handover_while_preparing"] == bool(extra), r
        if extra:
            assert r["refused_after_handover"] > 0, (r.get("reasons"), r.get("refused_after_handover"))
        else:
            assert r["refused_after_handover"] == 0, r
        assert metric(d, "cotx_decided_in_participant_total", 0) - handed >= r["commits"], r
        assert env.leftovers() == (0, 0)
        status, listed = api(d, "GET", "/v1/transactions?state=deciding")
        assert status == 200 and listed["transactions"] == [], listed


def test_retry_backoff(env):
    """--retry-backoff-ms (the variants -backoff of bench/experiments.py): a refused attempt
    runs again after the clients' jittered backoff (cotx.retry's, base 20 ms), not at once.
    On 20 rows every client conflicts; with the flag the clients waited before their
    retries (backoff_s), without it they did not."""
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 20)
    args = loadgen.micro_args(micro.parse_point("N=20"))
    env.set_mode("co")
    try:
        for extra in ([], ["--retry-backoff-ms", "20"]):
            r = loadgen.run_slice(env, "co", args, clients=4, warmup=0.0, seconds=1.5, extra=["--one-request"] + extra)
            assert not r.get("errors") and not r.get("error"), r
            assert r["commits"] > 0 and r["aborts"] > 0, r
            assert r["retry_backoff_ms"] == (20 if extra else 0), r
            if extra:
                # Full jitter: about 10 ms a retry on average; well above nothing.
                assert r["backoff_s"] > 0.002 * r["aborts"], r
            else:
                assert r["backoff_s"] == 0, r
            assert env.leftovers() == (0, 0)
    finally:
        micro.load(env, 500)


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

@pytest.mark.parametrize("mode,p,listed", [("co", 0, True), ("co", 1, True), ("2pc", 0, True), ("client", 1, True),
                                           ("client", 0, False)])
def test_read_only_transactions_take_the_read_only_commit(env, mode, p, listed):
    """The driver's read-only transactions (the `ro` experiment: W=0) declare their branches
    read-only and list them with the commit as the clients do, so the bench measures the
    daemon's all-read-only commit: counted in cotx_read_only_commits_total, no store sync
    per commit. P=0: both branches on MariaDB (READ ONLY transactions outside client mode;
    in client mode never listed, their slot write: synced), P=1: both on PostgreSQL (no
    transaction id before PREPARE)."""
    from bench.harness import loadgen
    from bench.micro import micro
    from cotest.coord import metric
    micro.load(env, 500)
    env.set_mode(mode)
    ro0 = metric(env.daemon, "cotx_read_only_commits_total")
    r = loadgen.run_slice(env, mode, loadgen.micro_args(micro.parse_point(f"R=6:W=0:P={p}:N=500")), clients=2,
                          warmup=0.3, seconds=1.0)
    assert not r.get("errors") and not r.get("error"), r
    assert r["commits"] > 0, r
    ro = metric(env.daemon, "cotx_read_only_commits_total") - ro0
    if listed:
        assert ro >= r["commits"], (ro, r)   # the warm-up's commits counted too
        assert r["store_syncs"] <= 0.1 * r["commits"], r   # only background writes
    else:
        assert ro == 0, ro
        assert r["store_syncs"] > 0, r
    assert env.leftovers() == (0, 0)


@pytest.mark.parametrize("one_request", [False, True], ids=["batched", "1req"])
def test_plain_2pc_read_only_branches_vote_and_flush_nothing(env, one_request):
    """The coordinator experiment's RO=100% point (every global transaction read-only) in
    mode 2pc: the branches vote read-only (committed in one phase instead of prepared,
    docs/coordinator.md, "The read-only vote in plain 2PC"), so PostgreSQL's WAL is not
    flushed per commit (PREPARE TRANSACTION flushes even for a transaction that wrote
    nothing: about one flush per commit before), and the daemon decides in memory. fsync
    is switched on for the slice (off, the server counts no flush at all)."""
    from bench.harness import loadgen
    from bench.micro import micro
    from cotest.coord import metric, wait_until
    micro.load(env, 500)
    env.set_mode("2pc")
    args = loadgen.micro_args(micro.parse_point("N=500")) + ["--ro-share", "1"]
    ro0 = metric(env.daemon, "cotx_read_only_commits_total")
    env.pg.sql("ALTER SYSTEM SET fsync = on")
    env.pg.sql("SELECT pg_reload_conf()")
    wait_until(lambda: env.pg.sql("SHOW fsync")[0][0] == "on", what="fsync on")
    try:
        r = loadgen.run_slice(env, "2pc", args, clients=2, warmup=0.5, seconds=2.0,
                              extra=["--one-request"] if one_request else [])
    finally:
        env.pg.sql("ALTER SYSTEM SET fsync = off")
        env.pg.sql("SELECT pg_reload_conf()")
    assert not r.get("errors") and not r.get("error") and not r.get("flush_errors"), r
    assert r["commits"] > 20, r
    assert r["pg_wal_syncs_per_commit"] < 0.1, r
    assert metric(env.daemon, "cotx_read_only_commits_total") - ro0 >= r["commits"], r
    assert r["store_syncs"] <= 0.1 * r["commits"], r
    assert env.leftovers() == (0, 0)


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
    root = Path(__file__).resolve().parents[3]
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


def test_fixed_rate_and_flushes_per_commit(env):
    """The driver's open loop (--rate): arrivals at fixed times whatever the completions, in
    plain 2PC and in client mode, and the flushes each commit cost counted over the window
    (WAL syncs, redo fsyncs, decision-store syncs). Seconds long, no timing asserted: only
    what follows from the schedule (40/s for 1 s offers exactly 40 arrivals) and from the
    counts."""
    import subprocess
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("N=500"))
    for mode in ("2pc", "client"):
        env.set_mode(mode)
        r = loadgen.run_slice(env, mode, args, clients=3, warmup=0.3, seconds=1.0, rate=40)
        assert not r.get("errors") and not r.get("error") and not r.get("flush_errors"), r
        assert r["rate"] == 40 and r["arrivals"] == 40 and 0 <= r["missed"] <= 40, r
        assert r["start_lag_p99_ms"] is not None and r["start_lag_p99_ms"] >= 0, r
        # Never more commits than offered: the window's arrivals plus those of the warm-up
        # still queued or running when it opened (at most one per client).
        assert 0 < r["commits"] <= r["arrivals"] + 3, r
        assert r["cpu_ms_server"] > 0, r
        # fsync is off on these servers (Env(fsync=False)): the counts exist, may be 0;
        # every commit's decision went through the store.
        for k in ("pg_wal_syncs", "my_log_fsyncs", "store_syncs"):
            assert r[k] >= 0 and r[f"{k}_per_commit"] == r[k] / r["commits"], (k, r)
        assert r["store_syncs"] > 0, r
        assert env.leftovers() == (0, 0)
    # A rate that is not a rate is refused before anything connects.
    bad = subprocess.run([str(loadgen.binary()), "--mode", "2pc", "--rate", "0"] + args,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--rate 0: expected transactions per second above 0" in bad.stderr, bad


def test_run_all_fixed_rate_smoke(tmp_path):
    """run_all.py --rate: every slice in the open loop, the rate, missed arrivals and the
    flushes per commit in the slices' CSV and the summary."""
    import csv
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, str(root / "bench/run_all.py"), "--smoke", "--experiments", "ro", "--modes", "2pc,client",
           "--out", str(tmp_path)]
    refused = subprocess.run(cmd + ["--rate", "-1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--rate -1.0: expected transactions per second above 0" in refused.stderr
    r = subprocess.run(cmd + ["--rate", "30"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = list(csv.DictReader(open(tmp_path / "slices.csv")))
    assert {x["mode"] for x in rows} == {"2pc", "client"}, rows
    for x in rows:
        assert float(x["rate"]) == 30 and int(x["arrivals"]) > 0 and int(x["missed"]) >= 0, x
        assert all(x[f"{k}_per_commit"] != "" for k in ("pg_wal_syncs", "my_log_fsyncs", "store_syncs")), x
    for s in csv.DictReader(open(tmp_path / "slices_summary.csv")):
        assert float(s["rate"]) == 30, s
        # The ro point's two MariaDB branches: committed read-only (no store sync per
        # commit) in 2pc; in client mode never listed (their slot write), so synced.
        if s["mode"] == "2pc":
            assert float(s["store_syncs_per_commit"]) < 0.1, s
        else:
            assert float(s["store_syncs_per_commit"]) > 0, s


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


def test_in_process_coordinator(env, tmp_path):
    """--coord inproc:CONFIG: the coordinator runs in the driver's process (the daemon's
    own crate, coordinator_daemon::in_process) on a node and SQLite store of its own; every
    mode with a coordinator commits through it, its decisions land in its store (not the
    daemon's), its CPU is reported apart and booked as the coordinator's, with the store's
    commit delay on as well. A config that
    cannot be read is refused by name before anything starts."""
    import sqlite3
    import subprocess
    from bench.harness import loadgen
    from bench.micro import micro
    micro.load(env, 500)
    args = loadgen.micro_args(micro.parse_point("N=500"))
    # ... and with the store's commit delay (store.commit_delay_us) on.
    for mode, delay_us in (("2pc", 0), ("co", 0), ("dip", 0), ("2pc", 1000)):
        env.set_mode(mode)
        path = env.in_process_config(commit_delay_us=delay_us)
        r = loadgen.run_slice(env, mode, args, clients=3, warmup=0.3, seconds=1.0, extra=["--coord", "inproc:" + path])
        assert not r.get("errors") and not r.get("error"), r
        if mode == "dip" and r.get("skipped"):
            continue
        assert r["commits"] > 0 and r["coordinator"] == "in-process", r
        assert r["cpu_tm_s"] > 0 and r["cpu_tm_calls_s"] > 0 and r["cpu_ms_coord"] > 0, r
        assert env.leftovers() == (0, 0)
    with sqlite3.connect(f"file:{env.in_process_path.replace('coordinator.toml', 'decisions.db')}?mode=ro", uri=True) as c:
        assert c.execute("SELECT count(*) FROM decisions WHERE node = 'benchinproc'").fetchone()[0] > 0
    bad = subprocess.run([str(loadgen.binary()), "--mode", "co", "--pg", env.pg.dsn, "--my", env.my.dsn,
                          "--coord", f"inproc:{tmp_path}/missing.toml", "--seconds", "1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and f"{tmp_path}/missing.toml" in bad.stderr and "did not start" in bad.stderr, bad.stderr


def test_in_process_coordinator_killed_then_a_daemon_finishes_its_branches(env, tmp_path):
    """kill -9 of a process with the coordinator in it, stopped while branches are
    prepared: a daemon started on the same config takes the node over once the dead
    process's lease has run out, and finishes every prepared branch from the store: those
    of a transaction with a commit record committed, the others rolled back (presumed
    abort), nothing left prepared."""
    import json
    import signal
    import sqlite3
    import subprocess
    import time
    from cotest.daemon import Daemon
    from bench.harness import loadgen
    from bench.harness.core import COORD_TIMEOUTS
    from bench.micro import micro
    micro.load(env, 500)
    env.set_mode("co")
    lease = {"ttl_ms": 1500, "renew_ms": 300}
    timeouts = dict(COORD_TIMEOUTS, recovery_interval_ms=500)
    cfg = Daemon(env.daemon.resources, timeouts=timeouts, node_id="inprockill", workdir=str(tmp_path), lease=lease)
    cmd = [str(loadgen.binary()), "--mode", "co", "--pg", env.pg.dsn, "--my", env.my.dsn, "--coord", f"inproc:{cfg.config}",
           "--clients", "4", "--warmup", "0", "--seconds", "120"] + loadgen.micro_args(micro.parse_point("N=500"))
    def snapshot():
        """The gtids of the prepared branches (one per branch), and the store's commits."""
        pg = [g.split(":")[1] for (g,) in env.pg.sql("SELECT gid FROM pg_prepared_xacts")]
        my = [bytes(x[3])[:int(x[1])].decode() if isinstance(x[3], (bytes, bytearray)) else str(x[3])[:int(x[1])]
              for x in env.my.sql("XA RECOVER")]
        with sqlite3.connect(f"file:{tmp_path / 'decisions.db'}?mode=ro", uri=True) as c:
            committed = {g for (g,) in c.execute("SELECT gtid FROM decisions WHERE outcome = 'commit'")}
        return pg + my, committed

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Stopped again and again until it is caught with a decided transaction's branch
        # still prepared (between the decision and COMMIT PREPARED): the harder case.
        deadline = time.time() + 60
        time.sleep(1.0)
        while True:
            proc.send_signal(signal.SIGSTOP)
            branches, committed = snapshot()
            if any(g in committed for g in branches) or time.time() > deadline:
                break
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.02)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    branches, committed = snapshot()
    assert any(g in committed for g in branches), f"never caught a decided branch still prepared: {branches}"
    want_commit = sum(1 for g in branches if g in committed)
    d = Daemon(env.daemon.resources, timeouts=timeouts, node_id="inprockill", workdir=str(tmp_path), lease=lease)
    assert d.config == cfg.config
    d.start()
    try:
        assert env.leftovers() == (0, 0), d.log_tail()
        done = {"committed": 0, "rolled_back": 0}
        for line in d.log_file.read_text().splitlines():
            x = json.loads(line) if line.startswith("{") else {}
            if x.get("fields", x).get("message", x.get("msg")) == "recovery pass" or "recovery pass" in line:
                f = {**x, **x.get("fields", {})}
                done["committed"] += int(f.get("committed", 0))
                done["rolled_back"] += int(f.get("rolled_back", 0))
        assert done == {"committed": want_commit, "rolled_back": len(branches) - want_commit}, (done, branches, d.log_tail())
    finally:
        d.stop()

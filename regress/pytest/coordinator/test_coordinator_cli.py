"""The command line follows the conventions of its ecosystem (clap): --help and --version
exit 0, every subcommand has its own help, usage errors exit 2 on stderr, the config path
and the token can come from the environment (COTX_CONFIG, COTX_TOKEN)."""
import os
import subprocess

from cotest.daemon import find_binary

SUBCOMMANDS = ["serve", "check-config", "in-doubt", "show", "force", "audit", "bench-store", "transactions", "incidents",
               "nodes"]
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "coordinator-daemon", "coordinator.example.toml")


def run(*args, env=None):
    return subprocess.run([find_binary(), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0 and all(c in r.stdout for c in SUBCOMMANDS), r
    r = run("--version")
    assert r.returncode == 0 and r.stdout.startswith("cotx-coordinator "), r
    for c in SUBCOMMANDS:
        r = run(c, "--help")
        assert r.returncode == 0 and "Usage: cotx-coordinator " + c in r.stdout, (c, r)


def test_usage_errors_exit_2_on_stderr():
    r = run()
    assert r.returncode == 2 and "Usage" in r.stderr and not r.stdout
    r = run("force", "--config", EXAMPLE, "g.1-1", "maybe", "--reason", "x")
    assert r.returncode == 2 and "possible values: commit, abort" in r.stderr
    r = run("check-config", "--config", "/nonexistent.toml")
    assert r.returncode == 2 and "cannot read /nonexistent.toml" in r.stderr


def test_config_and_token_from_the_environment(tmp_path):
    r = run("check-config", env={"COTX_CONFIG": EXAMPLE})
    assert r.returncode == 0 and "config ok: node c1" in r.stdout, r
    r = run("check-config", env={"COTX_CONFIG": EXAMPLE, "COTX_TOKEN": "short"})
    assert r.returncode == 2 and "COTX_TOKEN" in r.stderr


def test_bench_store_writes_as_the_daemon_does(tmp_path):
    """bench-store's SQLite decisions are the daemon's: gtids of an epoch registered first,
    fenced by the node's lease, marked finished with --finish; it reports the store
    thread's CPU per decision. Bad options are refused by name, before anything runs."""
    import json
    import sqlite3
    db = str(tmp_path / "s.db")
    r = run("bench-store", "--path", db, "--n", "200", "--clients", "4", "--finish", "--pace-ms", "1")
    assert r.returncode == 0, r
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["decisions"], out["finish"], out["pace_ms"]) == (200, True, 1), out
    assert out["store_cpu_ms_per_decision"] > 0 and out["syncs"] >= 1, out
    con = sqlite3.connect(db)
    (nonce,) = con.execute("SELECT nonce FROM epochs WHERE node = 'bench'").fetchone()
    gtids = [g for (g,) in con.execute("SELECT gtid FROM decisions")]
    assert len(gtids) == 200 and all(g.startswith("bench.") for g in gtids), gtids[:3]
    assert con.execute("SELECT count(*) FROM nodes WHERE node = 'bench' AND holder = 'bench-store'").fetchone() == (1,)
    # The last batch's marks may not be written before the process exits.
    assert con.execute("SELECT count(*) FROM decisions WHERE finished_ms IS NOT NULL").fetchone()[0] >= 100
    assert nonce > 0
    for bad, says in [(["--pace-ms", "nan"], "is not a pause in milliseconds"),
                      (["--commit-delay-us", "200000"], "not in 0..=100000"),
                      (["--commit-delay-us", "100", "--no-group-commit"], "cannot be used with"),
                      (["--finish", "--pg-dsn", "host=x"], "cannot be used with")]:
        r = run("bench-store", "--path", str(tmp_path / "t.db"), *bad) if "--pg-dsn" not in bad else run("bench-store", *bad)
        assert r.returncode == 2 and says in r.stderr, (bad, r)


def test_bench_store_applog_probe(tmp_path):
    """bench-store --backend applog writes the same decisions through the same group
    commit to the append-only log store (`[store] kind = "log"`): one sync per batch as
    SQLite, the store thread's CPU reported, the records in its preallocated file (the
    store's unit tests read them back). With a PostgreSQL store, or an unknown backend,
    it is refused by name."""
    import json
    log = tmp_path / "d.log"
    r = run("bench-store", "--path", str(log), "--n", "300", "--clients", "4", "--finish", "--backend", "applog")
    assert r.returncode == 0, r
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["store"], out["decisions"], out["finish"]) == ("applog", 300, True), out
    assert out["store_cpu_ms_per_decision"] > 0 and 1 <= out["syncs"] <= 300 + 2, out
    data = log.read_bytes()
    assert len(data) >= 300 * 512 and data.count(b"bench.") >= 300, len(data)
    assert not (tmp_path / "d.log-wal").exists()
    for bad, says in [(["--backend", "applog", "--pg-dsn", "host=x"], "cannot be used with"),
                      (["--backend", "lsm"], "invalid value 'lsm'")]:
        r = run("bench-store", *bad) if "--pg-dsn" in bad else run("bench-store", "--path", str(log), *bad)
        assert r.returncode == 2 and says in r.stderr, (bad, r)

"""The operator commands that list what a daemon knows, against a real daemon on real
PostgreSQL and MariaDB: `transactions` (with `--state`), `incidents` and `nodes`, each in
text and with `--json` (the daemon's own answer), and their errors (a state that does not
exist, a daemon that cannot be reached, a wrong credential); `in-doubt` naming quarantined
records and `force` deciding one (docs/ops.md's runbook); the failed branches counted by
resource (`cotx_branch_failures_total`, the retry-storm runbook's metric)."""
import json
import sqlite3
import subprocess

import pytest
from cotest.coord import make_daemon, metrics_text, nothing_prepared, wait_until
from cotx import Coordinator
from cotest.daemon import find_binary, store_kind
from cotest import free_port
from cotest.transfers import Child, committed_both, committed_transfer

pytestmark = pytest.mark.usefixtures("crash_tables")


@pytest.fixture(scope="module")
def d(pg, mariadb):
    d = make_daemon(pg, mariadb, timeouts={"owner_grace_ms": 300, "transaction_ms": 600000}).start()
    yield d
    d.destroy()


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0 and not r.stderr.strip(), (r.returncode, r.stdout, r.stderr)
    return r.stdout


def test_transactions_lists_and_filters_by_state(pg, mariadb, d):
    coord = Coordinator(d.url, d.token)
    active = coord.begin()
    with pg.connect() as pc:
        with coord.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO crash VALUES ('cli-committed', 1)")
    committed = tx.gtid
    assert tx.outcome == "commit"

    out = ok(d.cli("transactions"))
    assert "in the daemon's memory, oldest first" in out.splitlines()[0], out
    assert f"{active}  state=active  decision=-" in out, out
    assert committed in out, out
    # Oldest first: the active one was begun before.
    assert out.index(active) < out.index(committed), out

    out = ok(d.cli("transactions", "--state", "active"))
    assert out.splitlines()[0].startswith("1 active transaction(s)"), out
    assert active in out and committed not in out, out

    listed = json.loads(ok(d.cli("transactions", "--state", "active", "--json")))
    assert [t["gtid"] for t in listed["transactions"]] == [active], listed
    assert [t["gtid"] for t in coord.list("active")] == [active]

    # A state that does not exist is a usage error that names the ones that do.
    r = d.cli("transactions", "--state", "prepared")
    assert r.returncode == 2 and "possible values: active, committing, committed, aborted, one_phase, " \
        "deciding, in_doubt" in r.stderr, r.stderr
    coord.http.request("POST", f"/v1/transactions/{active}/abort", {})


def test_incidents_name_the_branch_that_missed_its_outcome(pg, mariadb, d):
    out = ok(d.cli("incidents"))
    assert out.startswith("0 incident(s) since the daemon started"), out
    assert json.loads(ok(d.cli("incidents", "--json"))) == {"incidents": []}
    # A read-only MariaDB branch whose owner dies after the commit decision: MariaDB rolls
    # it back when its session closes, and the daemon's XA COMMIT gets 1402 (an incident).
    ch = Child(d, pg, mariadb, "after_decision", "cli-incident", readonly=True)
    ch.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="completion")
    wait_until(lambda: ch.gtid in ok(d.cli("incidents")), what="the incident in the CLI")
    out = ok(d.cli("incidents"))
    assert out.startswith("1 incident(s)"), out
    line = out.splitlines()[1]
    assert f"{ch.gtid}  branch " in line and " on my: " in line and "1402" in line, line
    assert line[:4].isdigit() and line[19] == "Z" and " ago)" in line, line   # 2026-...Z  (1.2s ago)
    listed = json.loads(ok(d.cli("incidents", "--json")))
    api = Coordinator(d.url, d.token).http.request("GET", "/v1/incidents")
    assert listed == api and listed["incidents"][0]["gtid"] == ch.gtid, listed


def test_nodes_shows_this_daemon_and_its_lease(d):
    out = ok(d.cli("nodes"))
    lines = out.splitlines()
    api = Coordinator(d.url, d.token).http.request("GET", "/v1/nodes")
    assert lines[0] == f"this daemon: node {api['node_id']} (holder {api['holder']}), lease valid", out
    assert f"{len(api['nodes'])} node lease(s) in the decision store" in out, out
    own = [ln for ln in lines if ln.startswith(f"  {api['node_id']}: held by {api['holder']} at ")]
    assert own and own[0].endswith(", this daemon") and "expires in " in own[0], out
    listed = json.loads(ok(d.cli("nodes", "--json")))
    assert (listed["node_id"], listed["holder"], listed["lease_valid"]) == (api["node_id"], api["holder"], True)


def test_errors_are_said(d):
    """No daemon at the address: exit 1 with the address; a wrong credential: exit 1 with
    the daemon's refusal; no target at all: a usage error (2)."""
    binary = find_binary()
    for cmd in ("transactions", "incidents", "nodes"):
        r = subprocess.run([binary, cmd, "--url", f"http://127.0.0.1:{free_port()}"], capture_output=True,
                           text=True, timeout=30, env={"COTX_TOKEN": "x" * 32, "PATH": "/usr/bin:/bin"})
        assert r.returncode == 1 and "cannot reach the daemon at 127.0.0.1:" in r.stderr and not r.stdout, r
        r = subprocess.run([binary, cmd, "--url", d.url], capture_output=True, text=True, timeout=30,
                           env={"COTX_TOKEN": "y" * 32, "PATH": "/usr/bin:/bin"})
        assert r.returncode == 1 and r.stderr.startswith("error: 401: ") and not r.stdout, r
        r = subprocess.run([binary, cmd], capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
        assert r.returncode == 2 and "--url URL" in r.stderr, r


def failures(d) -> dict[str, float]:
    text = metrics_text(d)
    prefix = 'cotx_branch_failures_total{resource="'
    return {ln[len(prefix):].split('"', 1)[0]: float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines() if ln.startswith(prefix)}


def test_failed_branches_are_counted_by_resource(pg, mariadb, d):
    """A statement that fails inside a MariaDB branch (a duplicate key) is reported failed
    by the client and aborts the transaction: counted for "my", not for "pg"."""
    wait_until(lambda: failures(d).keys() >= {"pg", "my"}, what="a row per resource")
    before = failures(d)
    mariadb.sql("INSERT IGNORE INTO crash VALUES ('cli-dup', 1)")
    coord = Coordinator(d.url, d.token)
    mc = mariadb.connect()
    try:
        with pytest.raises(Exception, match="Duplicate entry"):
            with coord.transaction() as tx:
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO crash VALUES ('cli-dup', 2)")
    finally:
        mc.close()
    after = failures(d)
    assert (after["my"] - before["my"], after["pg"] - before["pg"]) == (1, 0), (before, after)
    out = ok(d.cli("transactions", "--state", "aborted"))
    assert f"{tx.gtid}  state=aborted" in out and "Duplicate entry" in out, out


@pytest.mark.skipif(store_kind() == "log", reason="writes an unreadable row into the SQLite file "
                    "(the log store's unit test unreadable_rows_are_not_aborts has its case)")
def test_a_quarantined_record_is_listed_and_decided_with_force(pg, mariadb, daemons):
    """docs/ops.md, "A quarantined record": a commit record made unreadable is not taken
    for abort; `in-doubt` names it with the problem, `show` says it is quarantined, and
    `force GTID commit` (the other branches committed) has recovery commit its branches."""
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 600000})
    ch = Child(d, pg, mariadb, "after_decision", "cli-quarantine")
    d.kill9()
    ch.kill9()
    with sqlite3.connect(d.dir / "decisions.db") as db:
        db.execute("UPDATE decisions SET outcome = 'comit' WHERE gtid = ?", (ch.gtid,))
    d.timeouts["owner_grace_ms"] = 200
    d.write_config()
    d.start()
    out = wait_until(lambda: "quarantined" in (r := d.cli("in-doubt")).stdout and r.stdout, what="quarantine")
    assert "1 quarantined transaction(s): the decision record cannot be read; decide each with force" in out, out
    assert f"  {ch.gtid}  problem: " in out and "comit" in out, out
    r = d.cli("show", ch.gtid)
    assert r.returncode == 1 and r.stderr.startswith("error: 503: ") and "quarantined" in r.stderr, r
    ok(d.cli("force", ch.gtid, "commit", "--yes-i-know", "--operator", "tester", "--reason", "both branches prepared"))
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to commit the branches")
    assert committed_both(pg, mariadb, "cli-quarantine")
    assert "quarantined" not in ok(d.cli("in-doubt"))
    assert ch.gtid in ok(d.cli("audit"))


def test_a_forgotten_outcome_as_the_runbook_shows_it(pg, mariadb, daemons):
    """docs/ops.md, "`outcome_forgotten` (410)": after the retention, `show` says 410
    outcome_forgotten (not abort), `in-doubt` lists nothing of it, and `force` refuses it."""
    d = daemons.start(pg, mariadb, timeouts={"retention_ms": 0, "outcome_retention_ms": 1000,
                                             "recovery_interval_ms": 500})
    tx = committed_transfer(d, pg, mariadb, "cli-forgotten")
    assert tx.outcome == "commit"
    r = wait_until(lambda: (r := d.cli("show", tx.gtid)).returncode == 1 and r, timeout=30, what="the purge")
    assert r.stderr.startswith("error: 410: ") and "outcome_forgotten" in r.stderr, r.stderr
    assert tx.gtid not in ok(d.cli("in-doubt"))
    r = d.cli("force", tx.gtid, "commit", "--yes-i-know", "--operator", "tester", "--reason", "r")
    assert r.returncode == 1 and r.stderr.startswith("error: 4"), r

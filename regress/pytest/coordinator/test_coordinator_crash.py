"""Crashes around the coordinator, with real processes: the client process killed (-9)
after the decision (owner gone: the daemon completes), the daemon killed (-9) before the
decision / after it before fan-out / in the middle of fan-out, both databases crashed
while branches were in doubt, and the daemon stopped in order (SIGTERM) right after it
answered commits. Afterwards every branch has the recorded outcome and nothing stays
prepared."""
import sqlite3
from pathlib import Path

import pytest
from cotx import Coordinator
from cotest.applog import unfinished
from cotest.daemon import store_kind
from cotest.coord import api, metric, my_prepared, nothing_prepared, pg_prepared, wait_until
from cotest.transfers import Child, absent_both, committed_both, prepared_transfer

pytestmark = pytest.mark.usefixtures("crash_tables")


def records(d):
    """The gtids of unfinished decision records in d's store (SQLite, or the log store
    with COTX_TEST_STORE_KIND=log)."""
    if store_kind() == "log":
        return unfinished(Path(d.store["path"]))
    with sqlite3.connect(f"file:{d.dir / 'decisions.db'}?mode=ro", uri=True) as c:
        return [r[0] for r in c.execute("SELECT gtid FROM decisions WHERE finished_ms IS NULL")]


def test_owner_gone_daemon_completes(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=300))
    ch = Child(d, pg, mariadb, "after_decision", "owner-gone")
    assert ch.what == "commit"
    ch.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="daemon to complete the orphaned branches")
    assert committed_both(pg, mariadb, "owner-gone")
    t = Coordinator(d.url, d.token).get(ch.gtid)
    assert [b["state"] for b in t["branches"]] == ["finished", "finished"]
    assert {b["finished_by"] for b in t["branches"]} <= {"daemon", "recovery"}
    wait_until(lambda: ch.gtid not in records(d), what="the decision record to be marked finished")


def test_an_orderly_stop_finishes_what_it_committed(pg, mariadb, daemons):
    """SIGTERM (a rolling restart, `systemctl stop`) right after commits were answered, within
    the owners' grace period, before the daemon's own completion started: the stop finishes
    their branches before it exits. Failed before (the stop exited at once): the branches
    stayed prepared, holding their locks, until a restart's or another daemon's recovery."""
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=5000))
    gtids = [prepared_transfer(d, pg, mariadb, f"orderly-stop-{i}") for i in range(3)]
    for g in gtids:
        assert api(d, "POST", f"/v1/transactions/{g}/commit", {})[1].get("decision") == "commit"
    d.stop()
    assert d.proc.returncode == 0
    assert pg_prepared(pg) == [] and my_prepared(mariadb) == []
    for i in range(3):
        assert committed_both(pg, mariadb, f"orderly-stop-{i}")


def test_owner_gone_readonly_mariadb_branch_is_an_incident(pg, mariadb, daemons):
    """MariaDB rolls back a read-only prepared branch when its session closes; the daemon's
    XA COMMIT then gets 1402. That is recorded as an incident, not retried forever."""
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=300))
    ch = Child(d, pg, mariadb, "after_decision", "ro-branch", readonly=True)
    ch.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="completion")
    assert pg.sql("SELECT count(*) FROM crash WHERE k = 'ro-branch'") == [(1,)]
    coord = Coordinator(d.url, d.token)
    inc = wait_until(lambda: [i for i in coord.http.request("GET", "/v1/incidents")["incidents"] if i["gtid"] == ch.gtid],
                     what="an incident for the lost read-only branch")
    assert inc[0]["resource"] == "my" and "1402" in inc[0]["message"]
    t = coord.get(ch.gtid)
    assert all(b["state"] == "finished" for b in t["branches"])


def test_daemon_killed_before_decision(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=300))
    ch = Child(d, pg, mariadb, "after_prepare", "before-decision")
    assert len(pg_prepared(pg)) == 1 and len(my_prepared(mariadb)) == 1
    d.kill9()
    ch.kill9()
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to roll back (presumed abort)")
    assert absent_both(pg, mariadb, "before-decision")


def test_daemon_killed_after_decision_before_fanout(pg, mariadb, daemons):
    # A long owner grace: the daemon itself will not fan out before it is killed.
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=600000))
    ch = Child(d, pg, mariadb, "after_decision", "after-decision")
    assert ch.what == "commit"
    assert ch.gtid in records(d)
    d.kill9()
    ch.kill9()
    assert len(pg_prepared(pg)) == 1 and len(my_prepared(mariadb)) == 1
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to commit from the record")
    assert committed_both(pg, mariadb, "after-decision")
    wait_until(lambda: ch.gtid not in records(d), what="the record to be marked finished once all branches are done")


def test_daemon_killed_mid_fanout(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=600000))
    ch = Child(d, pg, mariadb, "mid_fanout", "mid-fanout")
    assert pg_prepared(pg) == [] and len(my_prepared(mariadb)) == 1
    d.kill9()
    ch.kill9()
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to finish the fan-out")
    assert committed_both(pg, mariadb, "mid-fanout")
    wait_until(lambda: ch.gtid not in records(d), what="record marked finished")


def test_databases_crash_while_in_doubt(pg, mariadb, daemons):
    """Both databases crash while the branches are prepared and decided commit: the daemon
    keeps retrying (backoff) and completes them once the databases are back."""
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=200))
    ch = Child(d, pg, mariadb, "after_decision", "db-crash")
    pg.kill9()
    mariadb.kill9()
    ch.kill9()
    wait_until(lambda: (metric(d, "cotx_recovery_errors_total") or 0) >= 1, what="the daemon to notice the databases are down")
    assert (metric(d, "cotx_in_doubt") or 0) >= 1
    pg.start()
    mariadb.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=60, what="completion after the databases came back")
    assert committed_both(pg, mariadb, "db-crash")
    wait_until(lambda: metric(d, "cotx_in_doubt") == 0, what="in-doubt gauge back to 0")


def test_operator_commands(pg, mariadb, daemons):
    """in-doubt lists a decided-but-unfinished transaction with its age; force refuses to
    contradict the recorded decision, writes an audit record either way."""
    d = daemons.start(pg, mariadb, timeouts=dict(owner_grace_ms=600000))
    ch = Child(d, pg, mariadb, "after_decision", "operator")
    r = d.cli("in-doubt")
    assert r.returncode == 0 and ch.gtid in r.stdout and "age=" in r.stdout and "prepared" in r.stdout, r
    assert '"locks_held":' in r.stdout and "lock_waits_on_resource" in r.stdout, r.stdout
    held = int(r.stdout.split('"locks_held":')[1].split(",")[0])
    assert held >= 1, r.stdout  # the PostgreSQL branch's row lock (and more)
    r = d.cli("show", ch.gtid, "--json")
    assert r.returncode == 0 and '"committed"' in r.stdout
    r = d.cli("force", ch.gtid, "abort", "--operator", "tester", "--reason", "test")
    assert r.returncode != 0 and "yes-i-know" in r.stderr
    r = d.cli("force", ch.gtid, "abort", "--yes-i-know", "--operator", "tester", "--reason", "test")
    assert r.returncode != 0 and "contradicts_decision" in r.stderr
    ch.kill9()  # the owner is gone; its MariaDB branch is detached now
    r = d.cli("force", ch.gtid, "commit", "--yes-i-know", "--operator", "tester", "--reason", "owner is gone")
    assert r.returncode == 0 and '"unfinished_branches":0' in r.stdout, r
    assert nothing_prepared(pg, mariadb)
    assert committed_both(pg, mariadb, "operator")
    audit = [line for line in d.cli("audit").stdout.splitlines() if ch.gtid in line]
    # Each force leaves two records: its attempt (written before it acts) and its result.
    assert len(audit) == 4 and "attempt" in audit[0] and "refused" in audit[1] and "tester" in audit[3], audit
    # An undecided transaction can be forced to abort.
    coord = Coordinator(d.url, d.token)
    g = coord.begin()
    r = d.cli("force", g, "abort", "--yes-i-know", "--operator", "tester", "--reason", "stuck")
    assert r.returncode == 0 and coord.get(g)["state"] == "aborted"
    r = d.cli("force", "t1.nothing-1", "commit", "--yes-i-know", "--operator", "tester", "--reason", "x")
    assert r.returncode != 0 and "presumed abort" in r.stderr

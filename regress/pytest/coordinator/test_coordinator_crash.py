"""Crashes around the coordinator, with real processes: the client process killed (-9)
after the decision (owner gone: the daemon completes), the daemon killed (-9) before the
decision / after it before fan-out / in the middle of fan-out, and both databases crashed
while branches were in doubt. Afterwards every branch has the recorded outcome and
nothing stays prepared."""
import sqlite3
import subprocess
import sys
import urllib.request

import pytest
from cotx import Coordinator
from cotest.coord import make_daemon, my_prepared, nothing_prepared, pg_prepared, wait_until

# A client process: one global transaction over both engines; `mode` makes it stop (and
# wait to be killed) at a chosen point.
CHILD = r'''
import sys, time
import psycopg, pymysql
from cotx import Coordinator, client as cl
_, mode, url, token, pg_port, my_port, key, readonly = sys.argv
coord = Coordinator(url, token, decision_timeout=600)
pc = psycopg.connect(host="127.0.0.1", port=int(pg_port), user="postgres", dbname="postgres", autocommit=True)
mc = pymysql.connect(host="127.0.0.1", port=int(my_port), user="root", database="test", autocommit=True)

def park(tx, what):
    print("READY", tx.gtid, what, flush=True)
    time.sleep(600)  # parked until the test kills this process: no event to wait for

if mode == "after_prepare":
    def commit(self):
        self.prepare_all()
        park(self, "prepared")
    cl.Transaction.commit = commit
elif mode == "after_decision":
    cl.Transaction._finish = lambda self, d: park(self, d)
elif mode == "mid_fanout":
    def fin(self, d):
        self._branches[0].finish(d)
        park(self, d)
    cl.Transaction._finish = fin

with coord.transaction() as tx:
    with tx.branch(pc, "pg"):
        pc.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
    with tx.branch(mc, "my"):
        if readonly == "1":
            mc.cursor().execute("SELECT count(*) FROM crash")
        else:
            mc.cursor().execute("INSERT INTO crash VALUES (%s, 1)", (key,))
print("DONE", tx.gtid, tx.outcome, flush=True)
'''


@pytest.fixture(scope="module", autouse=True)
def tables(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS crash(k text PRIMARY KEY, v int)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS crash(k varchar(64) PRIMARY KEY, v int) ENGINE=InnoDB")


class Child:
    def __init__(self, d, pg, mariadb, mode, key, readonly=False):
        self.p = subprocess.Popen([sys.executable, "-c", CHILD, mode, d.url, d.token, str(pg.port),
                                   str(mariadb.port), key, "1" if readonly else "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        if not line or line[0] != "READY":
            self.p.kill()
            raise AssertionError(f"client did not reach {mode}: {line} {self.p.stderr.read()}")
        self.gtid, self.what = line[1], line[2]

    def kill9(self):
        self.p.kill()
        self.p.wait()


def committed_both(pg, mariadb, key):
    return pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == [(1,)] and \
        mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == ((1,),)


def absent_both(pg, mariadb, key):
    return pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == [(0,)] and \
        mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == ((0,),)


def records(d):
    with sqlite3.connect(f"file:{d.dir / 'decisions.db'}?mode=ro", uri=True) as c:
        return [r[0] for r in c.execute("SELECT gtid FROM decisions WHERE finished_ms IS NULL")]


@pytest.fixture
def daemon_factory(pg, mariadb):
    made = []

    def make(**timeouts):
        d = make_daemon(pg, mariadb, timeouts=timeouts)
        made.append(d)
        return d.start()
    yield make
    for d in made:
        d.destroy()


def test_owner_gone_daemon_completes(pg, mariadb, daemon_factory):
    d = daemon_factory(owner_grace_ms=300)
    ch = Child(d, pg, mariadb, "after_decision", "owner-gone")
    assert ch.what == "commit"
    ch.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="daemon to complete the orphaned branches")
    assert committed_both(pg, mariadb, "owner-gone")
    t = Coordinator(d.url, d.token).get(ch.gtid)
    assert [b["state"] for b in t["branches"]] == ["finished", "finished"]
    assert {b["finished_by"] for b in t["branches"]} <= {"daemon", "recovery"}
    wait_until(lambda: ch.gtid not in records(d), what="the decision record to be marked finished")


def test_owner_gone_readonly_mariadb_branch_is_an_incident(pg, mariadb, daemon_factory):
    """MariaDB rolls back a read-only prepared branch when its session closes; the daemon's
    XA COMMIT then gets 1402. That is recorded as an incident, not retried forever."""
    d = daemon_factory(owner_grace_ms=300)
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


def test_daemon_killed_before_decision(pg, mariadb, daemon_factory):
    d = daemon_factory(owner_grace_ms=300)
    ch = Child(d, pg, mariadb, "after_prepare", "before-decision")
    assert len(pg_prepared(pg)) == 1 and len(my_prepared(mariadb)) == 1
    d.kill9()
    ch.kill9()
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to roll back (presumed abort)")
    assert absent_both(pg, mariadb, "before-decision")


def test_daemon_killed_after_decision_before_fanout(pg, mariadb, daemon_factory):
    # A long owner grace: the daemon itself will not fan out before it is killed.
    d = daemon_factory(owner_grace_ms=600000)
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


def test_daemon_killed_mid_fanout(pg, mariadb, daemon_factory):
    d = daemon_factory(owner_grace_ms=600000)
    ch = Child(d, pg, mariadb, "mid_fanout", "mid-fanout")
    assert pg_prepared(pg) == [] and len(my_prepared(mariadb)) == 1
    d.kill9()
    ch.kill9()
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to finish the fan-out")
    assert committed_both(pg, mariadb, "mid-fanout")
    wait_until(lambda: ch.gtid not in records(d), what="record marked finished")


def _metric(d, name):
    req = urllib.request.Request(d.url + "/metrics", headers={"Authorization": f"Bearer {d.token}"})
    for line in urllib.request.urlopen(req, timeout=5).read().decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_databases_crash_while_in_doubt(pg, mariadb, daemon_factory):
    """Both databases crash while the branches are prepared and decided commit: the daemon
    keeps retrying (backoff) and completes them once the databases are back."""
    d = daemon_factory(owner_grace_ms=200)
    ch = Child(d, pg, mariadb, "after_decision", "db-crash")
    pg.kill9()
    mariadb.kill9()
    ch.kill9()
    wait_until(lambda: (_metric(d, "cotx_recovery_errors_total") or 0) >= 1, what="the daemon to notice the databases are down")
    assert (_metric(d, "cotx_in_doubt") or 0) >= 1
    pg.start()
    mariadb.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=60, what="completion after the databases came back")
    assert committed_both(pg, mariadb, "db-crash")
    wait_until(lambda: _metric(d, "cotx_in_doubt") == 0, what="in-doubt gauge back to 0")


def test_operator_commands(pg, mariadb, daemon_factory):
    """in-doubt lists a decided-but-unfinished transaction with its age; force refuses to
    contradict the recorded decision, writes an audit record either way."""
    d = daemon_factory(owner_grace_ms=600000)
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

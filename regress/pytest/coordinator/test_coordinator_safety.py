"""A coordinator that never splits a committed transaction, tried as a hostile operator
would: two daemons with one node id (with separate stores, and after one died), a corrupt
decision record, asking the wrong daemon, a dead daemon's transactions taken over, a
paused daemon that wakes up after the takeover, force when the audit cannot be written, a
read-only MariaDB branch lost in a crash, the client when the daemon or the database dies
around the decision, slow and greedy clients, two databases of one server, a removed
resource. Each test failed on the coordinator before the fix it checks."""
import os
import signal
import socket
import sqlite3
import time
import urllib.request

import psycopg
import pytest
from cotx import Coordinator, CotxError, client as cl
from cotest.daemon import Daemon, store_kind
from cotest.coord import api, make_daemon, metric, my_prepared, nothing_prepared, peers, pg_prepared, shared_store, wait_until
from cotest.transfers import Child, absent_both, committed_both

pytestmark = pytest.mark.usefixtures("crash_tables", "store_db")


@pytest.fixture(scope="module", autouse=True)
def other_db(pg):
    pg.sql("CREATE DATABASE other")


def answers(d) -> bool:
    """The daemon takes a connection and answers 200 (not 503: over its connection cap)."""
    try:
        with urllib.request.urlopen(d.url + "/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:  # HTTPError (503) included
        return False


# --- 1. one node id, two daemons ------------------------------------------------------

def test_second_daemon_with_the_same_node_id_is_refused(pg, mariadb, daemons):
    a = daemons.start(pg, mariadb, node_id="dup1")
    b = daemons(make_daemon(pg, mariadb, node_id="dup1"))   # its own store, same databases
    with pytest.raises(RuntimeError) as e:
        b.start()
    assert "another daemon acts as node dup1" in str(e.value)
    # The same with a shared store: refused by the store's lease.
    s = shared_store(pg, "dup_t")
    c = daemons.start(pg, mariadb, node_id="dup2", store=s)
    d = daemons(make_daemon(pg, mariadb, node_id="dup2", store=s, lease={"ttl_ms": 1000, "renew_ms": 250}))
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "node dup2 is held by" in str(e.value)
    assert a.proc.poll() is None and c.proc.poll() is None


def test_same_node_id_with_another_store_leaves_the_branches_alone(pg, mariadb, daemons):
    """Daemon A decided commit and died before finishing; a second deployment with the same
    node id and its own store starts: it must not roll back what it never began."""
    a = daemons.start(pg, mariadb, node_id="dup3", timeouts={"owner_grace_ms": 600000})
    ch = Child(a, pg, mariadb, "after_decision", "dup3-1")
    assert ch.what == "commit"
    a.kill9()
    ch.kill9()
    b = daemons.start(pg, mariadb, node_id="dup3")
    wait_until(lambda: (metric(b, "cotx_recovery_runs_total") or 0) >= 3, what="three recovery passes of B")
    assert len([g for g in pg_prepared(pg) if ch.gtid in g]) == 1, "B rolled back A's committed PostgreSQL branch"
    assert len(my_prepared(mariadb)) == 1
    assert metric(b, "cotx_foreign_branches_total") >= 1
    b.stop()
    a.timeouts["owner_grace_ms"] = 200
    a.write_config()
    a.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="A to finish its own branches")
    assert committed_both(pg, mariadb, "dup3-1")


# --- 2. a corrupt decision record -------------------------------------------------------

@pytest.mark.skipif(store_kind() == "log", reason="writes an unreadable row into the SQLite file "
                    "(the log store's unit test unreadable_rows_are_not_aborts has its case)")
def test_corrupt_record_is_quarantined_not_aborted(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 600000})
    ch1 = Child(d, pg, mariadb, "after_decision", "corrupt-outcome")
    ch2 = Child(d, pg, mariadb, "after_decision", "corrupt-branches")
    d.kill9()
    ch1.kill9()
    ch2.kill9()
    with sqlite3.connect(d.dir / "decisions.db") as db:
        db.execute("UPDATE decisions SET outcome = 'comit' WHERE gtid = ?", (ch1.gtid,))
        db.execute("UPDATE decisions SET branches = 'garbage' WHERE gtid = ?", (ch2.gtid,))
    d.timeouts["owner_grace_ms"] = 200
    d.write_config()
    d.start()
    wait_until(lambda: (metric(d, "cotx_recovery_runs_total") or 0) >= 3, what="recovery passes")
    # Nothing was rolled back; both gtids are stopped and visible.
    assert len(pg_prepared(pg)) == 2 and len(my_prepared(mariadb)) == 2
    assert metric(d, "cotx_quarantined") == 2
    st, body = api(d, "GET", f"/v1/transactions/{ch1.gtid}/decision")
    assert (st, body["error"]["code"]) == (503, "quarantined")
    st, rep = api(d, "GET", "/v1/in-doubt")
    assert {q["gtid"] for q in rep["quarantined"]} == {ch1.gtid, ch2.gtid}
    assert "cannot be read" in d.log_tail(200)
    # The operator decides (after checking the databases): commit both.
    for ch in (ch1, ch2):
        r = d.cli("force", ch.gtid, "commit", "--yes-i-know", "--operator", "t", "--reason", "corrupt record")
        assert r.returncode == 0, r.stderr + r.stdout
    wait_until(lambda: nothing_prepared(pg, mariadb), what="branches committed after the operator's decision")
    assert committed_both(pg, mariadb, "corrupt-outcome") and committed_both(pg, mariadb, "corrupt-branches")


# --- 3. asking the wrong daemon; 4. a dead daemon's transactions -------------------------

def test_any_daemon_answers_for_any_gtid(pg, mariadb, daemons):
    a, b = peers(pg, mariadb, daemons, "any_t", ["any-a", "any-b"])
    a.start()
    b.start()
    done = Child(a, pg, mariadb, "after_decision", "any-1")
    open_tx = Child(a, pg, mariadb, "after_prepare", "any-2")
    try:
        cb = Coordinator(b.url, b.token)
        # A committed transaction of node A, asked at B: commit (from the store), never abort.
        assert cb.decision(done.gtid)["decision"] == "commit"
        st, body = api(b, "POST", "/v1/admin/force", {"gtid": done.gtid, "outcome": "abort", "operator": "t",
                                                     "reason": "wrong daemon", "confirm": True})
        assert st == 409 and body["error"]["code"] == "contradicts_decision", body
        # An undecided one: B sends the client to A (421 + owner_url); the client follows.
        st, body = api(b, "GET", f"/v1/transactions/{open_tx.gtid}/decision")
        assert st == 421 and body["error"]["owner_url"] == a.url, body
        assert cb.decision(open_tx.gtid)["decision"] is None
        st, body = api(b, "POST", "/v1/admin/force", {"gtid": open_tx.gtid, "outcome": "abort", "operator": "t",
                                                     "reason": "wrong daemon", "confirm": True})
        assert st == 421, body
    finally:
        done.kill9()
        open_tx.kill9()
        Coordinator(a.url, a.token).http.request("POST", f"/v1/transactions/{open_tx.gtid}/abort", {})
        wait_until(lambda: nothing_prepared(pg, mariadb), what="A to finish both")


def test_dead_daemon_is_taken_over(pg, mariadb, daemons):
    a, b = peers(pg, mariadb, daemons, "take_t", ["take-a", "take-b"], lease={"ttl_ms": 1500, "renew_ms": 300},
                 timeouts={"owner_grace_ms": 600000})
    a.start()
    b.start()
    committed = Child(a, pg, mariadb, "after_decision", "take-1")
    undecided = Child(a, pg, mariadb, "after_prepare", "take-2")
    a.kill9()
    committed.kill9()
    undecided.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="B to take over A's branches")
    assert committed_both(pg, mariadb, "take-1")
    assert absent_both(pg, mariadb, "take-2")
    assert metric(b, "cotx_takeovers_total") >= 1
    # The client of the committed one, asking B, hears commit; of the undecided one, abort.
    cb = Coordinator(b.url, b.token)
    assert cb.decision(committed.gtid)["decision"] == "commit"
    # A client that knows the deployment's daemons reaches B while A is down.
    both = Coordinator([a.url, b.url], a.token)
    assert both.decision(committed.gtid)["decision"] == "commit"
    assert both.decision(undecided.gtid)["decision"] == "abort"
    # A comes back at once: B gives the node back when asked (or has released it already).
    a.timeouts["owner_grace_ms"] = 200
    a.write_config()
    a.start()
    wait_until(lambda: metric(b, "cotx_adopted_nodes") == 0, what="B to let node take-a go")


def test_branch_of_a_released_node_that_comes_back_is_finished(pg, mariadb, daemons):
    """MariaDB's XA ROLLBACK of a prepared branch is not flushed: killed within about a
    second, the server comes back with the branch prepared again (seen here: a takeover
    rolled back a dead daemon's branch, released the node, and MariaDB was killed). Nobody
    acted for that node any more, and mysql_co's restart gate refused every XA PREPARE.
    The branch's return is made here without the crash's timing: the same XID prepared
    again, as recovery would find it."""
    a, b = peers(pg, mariadb, daemons, "orphan_t", ["orph-a", "orph-b"], lease={"ttl_ms": 1500, "renew_ms": 300},
                 timeouts={"owner_grace_ms": 600000})
    a.start()
    b.start()
    undecided = Child(a, pg, mariadb, "after_prepare", "orphan-1")
    xids = [r for r in mariadb.sql("XA RECOVER") if r[3].decode().startswith(undecided.gtid)]
    assert len(xids) == 1, xids
    fmt, glen, _, data = xids[0]
    a.kill9()
    undecided.kill9()
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="B to take over A's branches")
    wait_until(lambda: metric(b, "cotx_adopted_nodes") == 0, what="B to release node orph-a")
    gtrid, bqual = data[:glen].decode(), data[glen:].decode()
    c = mariadb.connect()
    cur = c.cursor()
    cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    cur.execute(f"XA START '{gtrid}', '{bqual}', {fmt}")
    cur.execute("INSERT INTO crash VALUES ('orphan-1', 2)")
    cur.execute(f"XA END '{gtrid}', '{bqual}', {fmt}")
    cur.execute(f"XA PREPARE '{gtrid}', '{bqual}', {fmt}")
    c.close()
    assert my_prepared(mariadb)
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="the returned branch to be rolled back")
    assert absent_both(pg, mariadb, "orphan-1")
    assert metric(b, "cotx_takeovers_total") >= 2
    assert Coordinator(b.url, b.token).decision(undecided.gtid)["decision"] == "abort"


def test_paused_daemon_loses_to_the_takeover(pg, mariadb, daemons):
    """A is stopped (SIGSTOP) past its lease with a prepared, undecided transaction; B takes
    over and aborts it; A wakes up and is asked to commit: nobody may hear "commit"."""
    a, b = peers(pg, mariadb, daemons, "zombie_t", ["zomb-a", "zomb-b"], lease={"ttl_ms": 1500, "renew_ms": 300},
                 timeouts={"transaction_ms": 60000})
    a.start()
    b.start()
    ca = Coordinator(a.url, a.token)
    tx = ca.transaction()
    pc = pg.connect()
    mc = mariadb.connect()
    with tx.branch(pc, "pg"):
        pc.execute("INSERT INTO crash VALUES ('zombie-1', 1)")
    with tx.branch(mc, "my"):
        mc.cursor().execute("INSERT INTO crash VALUES ('zombie-1', 1)")
    mine = tx.prepare_all(report=True)
    assert len(mine) == 2
    # The application dies too (a MariaDB branch cannot be finished from another session
    # while its owner's session is attached).
    pc.close()
    mc.close()
    os.kill(a.proc.pid, signal.SIGSTOP)
    a.stopped = True
    try:
        wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="B to take over and roll back")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
        a.stopped = False
    try:
        r = ca.http.request("POST", f"/v1/transactions/{tx.gtid}/commit", {})
        assert r["decision"] != "commit", r
    except CotxError:
        pass  # refused, or A stopped acting: either way no "commit"
    assert absent_both(pg, mariadb, "zombie-1")
    assert Coordinator(b.url, b.token).decision(tx.gtid)["decision"] == "abort"
    # A does not exit: it finds its grant gone, claims its node again (B gives it back when
    # asked) and keeps of its memory only what the store says (test_coordinator_stale.py).
    wait_until(lambda: "node lease lost" in a.log_tail(200), timeout=15, what="A to notice its lease is lost")
    def a_says_abort():
        try:
            return ca.decision(tx.gtid)["decision"] == "abort"
        except CotxError:
            return False  # 503 while it takes its node back
    wait_until(a_says_abort, timeout=30, what="A to answer abort")
    assert a.proc.poll() is None


# --- 5. force writes its audit first ------------------------------------------------------

def test_force_does_nothing_when_the_audit_cannot_be_written(pg, mariadb, daemons):
    s = shared_store(pg, "audit_t")
    d = daemons.start(pg, mariadb, store=s)
    pg.sql("ALTER TABLE audit_t_audit ADD CONSTRAINT no_more CHECK (false) NOT VALID", dbname="cotx_log")
    c = Coordinator(d.url, d.token)
    gtid = c.begin()
    st, body = api(d, "POST", "/v1/admin/force", {"gtid": gtid, "outcome": "abort", "operator": "t",
                                                 "reason": "audit down", "confirm": True})
    assert st == 503, body
    assert c.get(gtid)["state"] == "active", "force acted although its audit record was not written"


# --- 6. a read-only MariaDB branch lost in a crash after the decision: in
# test_coordinator_mariadb_crash.py (it restarts MariaDB: a module of its own, so that no
# other test's branches meet the restart gate).

# --- 7. the client's errors -----------------------------------------------------------------

def test_client_errors_are_typed_when_the_daemon_dies(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb)
    c = Coordinator(d.url, d.token, decision_timeout=1.0)
    pc, mc = pg.connect(), mariadb.connect()
    with pytest.raises(CotxError):
        with c.transaction() as tx:
            with tx.branch(pc, "pg"):
                pc.execute("INSERT INTO crash VALUES ('typed-1', 1)")
            with tx.branch(mc, "my"):
                pass
            d.kill9()   # the daemon dies before the decision: connection refused
    # OutcomeUnknown: the branches stay prepared; the application lets go of its sessions
    # (a MariaDB branch cannot be finished by the daemon while its session is attached).
    pc.close()
    mc.close()
    d.start()   # its recovery rolls the prepared branches back (presumed abort)
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery after the restart")


def test_database_error_after_the_decision_is_not_the_applications(pg, mariadb, daemons, monkeypatch):
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 300})
    c = Coordinator(d.url, d.token)
    pc = pg.connect()
    pid = pc.execute("SELECT pg_backend_pid()").fetchone()[0]
    orig = cl.Transaction._finish

    def finish_after_losing_the_connection(self, decision):
        pg.sql("SELECT pg_terminate_backend(%s)", (pid,))
        return orig(self, decision)
    monkeypatch.setattr(cl.Transaction, "_finish", finish_after_losing_the_connection)
    mc = mariadb.connect()
    with c.transaction() as tx:
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO crash VALUES ('typed-2', 1)")
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO crash VALUES ('typed-2', 1)")
    assert tx.outcome == "commit"
    assert [b for b, _ in tx.unfinished] != []
    wait_until(lambda: nothing_prepared(pg, mariadb), what="the daemon to finish the branch")
    assert committed_both(pg, mariadb, "typed-2")
    mc.close()


# --- 8. slow and greedy clients, two databases of one server, a removed resource ----------

def test_slow_clients_are_cut_off(pg, mariadb, daemons):
    d = daemons(make_daemon(pg, mariadb, limits={"header_timeout_ms": 300, "idle_timeout_ms": 500,
                                                 "max_connections": 40, "max_active": 3})).start()
    socks = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(30)]
    deadline = time.time() + 10   # far beyond the timeouts: only a daemon that holds them fails
    closed = 0
    for s in socks:
        s.settimeout(max(0.01, deadline - time.time()))
        try:
            closed += s.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except socket.timeout:
            pass  # still held open by the daemon
        s.close()
    assert closed == 30, f"{30 - closed} half-open connections still held"
    # Over the connection cap: refused at once with 503, the daemon still serves.
    socks = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(40)]
    extra = socket.create_connection(("127.0.0.1", d.port))
    extra.settimeout(5)
    assert extra.recv(200).startswith(b"HTTP/1.1 503")
    for s in socks:
        s.close()
    # The daemon has let the closed connections go once it takes a request again.
    wait_until(lambda: answers(d), timeout=10, what="the daemon to take connections again")
    c = Coordinator(d.url, d.token)
    for _ in range(3):
        c.begin()
    with pytest.raises(CotxError) as e:
        c.begin()
    assert e.value.status == 429 and e.value.code == "too_many_transactions"


def test_two_databases_of_one_postgresql_server(pg, mariadb, daemons):
    other = pg.dsn.replace("dbname=postgres", "dbname=other")
    d = daemons(Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn},
                        {"name": "pg2", "kind": "postgres", "dsn": other}])).start()
    c = Coordinator(d.url, d.token)
    gtid = c.begin()
    c.http.request("POST", f"/v1/transactions/{gtid}/abort", {})
    # A branch of this daemon's (aborted) transaction, prepared in database "other".
    with psycopg.connect(other, autocommit=True) as oc:
        oc.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        oc.execute(f"PREPARE TRANSACTION 'cotx:{gtid}:b1'")
    wait_until(lambda: not pg.sql("SELECT gid FROM pg_prepared_xacts"), what="rolled back through pg2")
    wait_until(lambda: (metric(d, "cotx_recovery_runs_total") or 0) >= 3, what="more recovery passes")
    log = d.log_tail(400)
    assert "belongs to another database" not in log, log
    up = c.health()["resources"]
    assert up.get("pg") is not False, up


def test_two_mariadb_resources_on_one_server_are_refused(pg, mariadb, daemons):
    mariadb.sql("CREATE DATABASE IF NOT EXISTS other")
    d = daemons(Daemon([{"name": "my", "kind": "mariadb", "dsn": mariadb.dsn},
                        {"name": "my2", "kind": "mariadb", "dsn": mariadb.dsn.rsplit("/", 1)[0] + "/other"}]))
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "same MariaDB server" in str(e.value)


def test_driver_errors_are_logged_with_sqlstate(pg, mariadb, daemons):
    d = daemons(Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=nope")}])).start()
    wait_until(lambda: "3D000" in d.log_tail(100), what="the SQLSTATE in the log")


def test_removed_resource_is_reported(pg, mariadb, daemons):
    d = daemons.start(pg, mariadb, timeouts={"owner_grace_ms": 600000})
    ch = Child(d, pg, mariadb, "after_decision", "removed-1")
    d.kill9()
    ch.kill9()
    d.resources = [r for r in d.resources if r["name"] != "my"]
    d.timeouts["owner_grace_ms"] = 200
    d.write_config()
    d.start()
    wait_until(lambda: metric(d, "cotx_unconfigured_resource_branches") == 1, what="the metric")
    assert "not configured" in d.log_tail(100)
    rep = Coordinator(d.url, d.token).http.request("GET", "/v1/in-doubt")
    blocking = [b.get("blocking", {}) for t in rep["transactions"] for b in t["branches"] if b["resource"] == "my"]
    assert blocking and "not configured" in blocking[0]["error"]
    # Put the resource back: the branch is finished.
    d.stop()
    d.resources = make_daemon(pg, mariadb).resources
    d.write_config()
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="completion once the resource is back")
    assert committed_both(pg, mariadb, "removed-1")

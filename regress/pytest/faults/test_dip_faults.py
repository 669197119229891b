"""Decision in a participant: faults around the one-phase commit that carries the global
decision (pg_co's co.decide in the PostgreSQL branch, the MariaDB branch prepared).

Each case runs one transfer step by step over the HTTP API and SQL (so the fault lands
exactly where it should), kills or pauses something, lets the real daemon's recovery run,
and checks: nothing stays prepared, no split (the two rows moved together or not at all),
and the outcome is whether the decision row committed. The first case also runs without
the fix (the PostgreSQL resource not declared a decision resource: plain presumed abort)
and shows the split that the participant lookup prevents."""

import collections
import threading
import time

import psycopg
import pytest
from cotx import Coordinator
from cotest.daemon import Daemon
from cotest.coord import metric, nothing_prepared, wait_until
from cotest.transfers import create_withdrawal_tables, reset_accounts, withdrawals_under_kills
from cotest.marks import requires_mysql_co, requires_pg_co

pytestmark = [requires_pg_co, requires_mysql_co]

TIMEOUTS = {"transaction_ms": 8000, "owner_grace_ms": 500, "recovery_interval_ms": 300}


@pytest.fixture(scope="module")
def dbs(pg, mariadb):
    pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")
    pg.sql("DROP TABLE IF EXISTS dip_acct")
    pg.sql("CREATE TABLE dip_acct (id int PRIMARY KEY, bal int NOT NULL)")
    mariadb.sql("DROP TABLE IF EXISTS dip_acct")
    mariadb.sql("CREATE TABLE dip_acct (id int PRIMARY KEY, bal int NOT NULL) ENGINE=InnoDB")
    return pg, mariadb


def daemon(pg, mariadb, decisions: bool, **timeouts) -> Daemon:
    pgres = {"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2}
    if decisions:
        pgres["decisions"] = True
    return Daemon([pgres, {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn, "pool_size": 2}],
                  timeouts={**TIMEOUTS, **timeouts}).start()


def fresh_row(pg, mariadb, rid: int) -> None:
    """Row `rid` of dip_acct at 100 on both servers."""
    pg.sql("INSERT INTO dip_acct VALUES (%s, 100) ON CONFLICT (id) DO UPDATE SET bal = 100", (rid,))
    mariadb.sql("REPLACE INTO dip_acct VALUES (%s, 100)", (rid,))


def recovery_runs(d: Daemon) -> float:
    """The daemon's count of finished recovery passes (`cotx_recovery_runs_total`)."""
    return metric(d, "cotx_recovery_runs_total", 0.0)


class Transfer:
    """Moves 10 from MariaDB row `rid` to PostgreSQL row `rid`; the PostgreSQL branch
    carries the decision. `leased`: on the one-request path (a gtid of a leased range,
    nothing sent before the commit, which lists both branches), else the begin path."""

    def __init__(self, d: Daemon, pg, mariadb, rid: int, leased: bool = False):
        fresh_row(pg, mariadb, rid)
        self.pg, self.my, self.rid, self.leased = pg, mariadb, rid, leased
        self.c = Coordinator(d.url, d.token)
        if leased:
            r = self.c.http.request("POST", "/v1/gtid-leases", {"count": 1})
            self.gtid = r["prefix"] + format(r["first"], "x")
            x = {"gtrid": self.gtid, "bqual": "m", "format_id": r["xa_format_id"]}
        else:
            r = self.c.http.request("POST", "/v1/transactions", {"branch": {"resource": "my", "branch_id": "m"}})
            self.gtid = r["gtid"]
            x = r["branch"]["xid"]
            self.c.http.request("POST", f"/v1/transactions/{self.gtid}/branches", {"resource": "pg", "branch_id": "p"})
        self.myc = mariadb.connect()
        xid = f"{self.myc.escape(x['gtrid'])},{self.myc.escape(x['bqual'])},{int(x['format_id'])}"
        with self.myc.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            cur.execute(f"XA START {xid}")
            cur.execute("UPDATE dip_acct SET bal = bal - 10 WHERE id = %s", (rid,))
            cur.execute(f"XA END {xid}")
            cur.execute(f"XA PREPARE {xid}")
        # A read-write prepared branch survives its session; the daemon finishes it.
        self.myc.close()
        self.pgc = pg.connect()
        self.pgc.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        self.pgc.execute("UPDATE dip_acct SET bal = bal + 10 WHERE id = %s", (rid,))

    def commit_call(self) -> dict:
        body = {"prepared": ["m"], "decide_in": "p"}
        if self.leased:
            body = {"branches": [{"resource": "my", "branch_id": "m"}, {"resource": "pg", "branch_id": "p"}],
                    "decide_in": "p"}
        return self.c.http.request("POST", f"/v1/transactions/{self.gtid}/commit", body)

    def decide(self) -> None:
        self.pgc.execute("SELECT co.decide(%s)", (self.gtid,))

    def balances(self) -> tuple[int, int]:
        p = self.pg.sql("SELECT bal FROM dip_acct WHERE id = %s", (self.rid,))[0][0]
        m = self.my.sql("SELECT bal FROM dip_acct WHERE id = %s", (self.rid,))[0][0]
        return p, m

    def settled(self) -> tuple[int, int]:
        wait_until(lambda: nothing_prepared(self.pg, self.my), timeout=60, what="recovery to finish every prepared branch")
        return self.balances()

    def decision_row(self):
        r = self.pg.sql("SELECT outcome FROM co.decisions WHERE gtid = %s", (self.gtid,))
        return r[0][0] if r else None


PATHS = pytest.mark.parametrize("leased", [False, True], ids=["begin", "one_request"])


@PATHS
def test_owner_silent_after_decision_commit(dbs, leased):
    """The decision branch commits, its owner never reports: after the grace period the
    daemon reads the decision there and commits the MariaDB branch. On the one-request
    path too: the commit request listing both branches hands the decision over (before,
    the daemon refused decide_in with branches)."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        t = Transfer(d, pg, my, 11 if leased else 1, leased)
        assert t.commit_call()["decision"] == "in_participant"
        assert t.c.decision(t.gtid)["decision"] is None, "deciding: pending, never presumed abort"
        t.decide()
        t.pgc.execute("COMMIT")
        assert t.c.decision(t.gtid, wait_ms=20000)["decision"] == "commit"
        assert t.settled() == (110, 90)
    finally:
        d.destroy()


def test_decision_commit_refused_aborts(dbs):
    """The owner reports the refused decision commit (failed): abort, MariaDB rolled back."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        t = Transfer(d, pg, my, 2)
        t.commit_call()
        t.pgc.execute("ROLLBACK")
        t.c.http.request("POST", f"/v1/transactions/{t.gtid}/branches/p/failed", {"reason": "refused", "retryable": True})
        assert t.c.decision(t.gtid)["decision"] == "abort"
        assert t.settled() == (100, 100)
    finally:
        d.destroy()


@PATHS
@pytest.mark.parametrize("decisions", [True, False], ids=["participant_lookup", "presumed_abort_only"])
def test_daemon_killed_before_decision_commit(dbs, decisions, leased):
    """kill -9 of the daemon once it answered in_participant; the owner then commits the
    decision branch. Recovery after the restart finds the MariaDB branch prepared with no
    record: with the participant lookup it reads 'commit' in PostgreSQL and commits it;
    restarted without it (presumed abort alone) it rolls it back: a split (PostgreSQL +10,
    MariaDB +0). On the one-request path the restarted daemon does not know the old
    process's ranges: the gtid is another epoch's, whose abort recovery records only after
    the same lookup (and, without it, records over the committed decision: the split)."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        t = Transfer(d, pg, my, 13 if leased else 3, leased)
        t.commit_call()
        d.kill9()
        t.decide()
        t.pgc.execute("COMMIT")
        if not decisions:
            # The restarted daemon without the lookup: recovery as before this mode.
            d.resources[0].pop("decisions")
            d.write_config()
        d.start()
        if decisions:
            # A participant asking for the decision is not told "presumed abort".
            assert Coordinator(d.url, d.token).decision(t.gtid)["decision"] == "commit"
        bal = t.settled()
        if decisions:
            assert bal == (110, 90)
        else:
            assert bal == (110, 100), "without the lookup the committed transaction is split"
    finally:
        d.destroy()


@PATHS
def test_daemon_killed_after_decision_commit(dbs, leased):
    """kill -9 of the daemon after the decision commit, before the owner's report."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        t = Transfer(d, pg, my, 14 if leased else 4, leased)
        t.commit_call()
        t.decide()
        t.pgc.execute("COMMIT")
        d.kill9()
        d.start()
        assert t.settled() == (110, 90)
        # Finished: the committed decision row is deleted by a later pass.
        wait_until(lambda: t.decision_row() is None, timeout=30, what="the decision row to be forgotten")
    finally:
        d.destroy()


@PATHS
def test_client_session_closed_after_decide_before_commit(dbs, leased):
    """The client calls co.decide and dies before COMMIT (its session closes): the decision
    never committed, recovery resolves abort (and records it, so the gtid stays aborted)."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        t = Transfer(d, pg, my, 15 if leased else 5, leased)
        t.commit_call()
        t.decide()
        d.kill9()
        t.pgc.close()
        d.start()
        assert t.settled() == (100, 100)
        assert t.decision_row() == "a"
    finally:
        d.destroy()


def test_paused_decision_delays_resolution(dbs):
    """The client holds an open co.decide across a daemon restart: co.resolve waits for it
    (bounded, then retried) instead of deciding abort under it; the COMMIT then wins."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        t = Transfer(d, pg, my, 6)
        t.commit_call()
        t.decide()
        d.kill9()
        d.start()
        # Several recovery passes (each waits up to its lock timeout on our open row): counted
        # by the restarted daemon, so the resolution had its chances to decide under us.
        wait_until(lambda: recovery_runs(d) >= 3, timeout=60, what="three recovery passes")
        assert t.balances() == (100, 100) and not nothing_prepared(pg, my), "resolution must wait for the open decision"
        t.pgc.execute("COMMIT")
        assert t.settled() == (110, 90)
    finally:
        d.destroy()


@pytest.mark.parametrize("down_s", [0, 14], ids=["restarted_at_once", "down_14s"])
def test_postgresql_down_after_decision_commit(dbs, down_s):
    """PostgreSQL is killed right after the decision commit (the owner never reports): the
    daemon's reads fail until it is back, then it finds the committed decision. (The test
    clusters run with synchronous_commit = off: co.decide turns it on for its transaction;
    without that this commit was lost in the crash while its client had been told commit.)
    Down 14 s, longer than the resolution's retry delay takes to grow: once PostgreSQL is
    back the resolution does not wait out that delay, the first contact that works (a
    recovery pass, here every 300 ms) wakes it, and the MariaDB branch is committed within
    a second or two. Failed before: the next try came up to `timeouts.retry_max_ms` (10 s)
    after PostgreSQL's return (8.7 s), the MariaDB branch prepared (its row locked)
    meanwhile. (The test daemons' retry_max_ms is 500 ms: here the default.)"""
    pg, my = dbs
    d = daemon(pg, my, decisions=True, retry_max_ms=10000)
    try:
        t = Transfer(d, pg, my, 7)
        t.commit_call()
        t.decide()
        t.pgc.execute("COMMIT")
        pg.kill9()
        time.sleep(down_s)
        pg.start()
        back = time.monotonic()
        wait_until(lambda: nothing_prepared(pg, my), timeout=60, what="the MariaDB branch committed")
        took = time.monotonic() - back
        assert took < 4, f"the MariaDB branch was committed {took:.1f} s after PostgreSQL was back\n" + d.log_tail(30)
        assert t.balances() == (110, 90)
    finally:
        d.destroy()


@PATHS
def test_client_commits_with_decision_in_participant(dbs, leased):
    """The Python client's mode: MariaDB branch prepared, PostgreSQL branch commits with the
    decision; a CO refusal of that commit (rule A: it read a row an in-doubt transaction
    overwrote) aborts the whole transaction retryably. With Coordinator(one_request=True)
    both ride the one-request path: no begin, the commit the only request."""
    from cotx import RetryableError
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    try:
        fresh_row(pg, my, 8)
        c = Coordinator(d.url, d.token, one_request=leased)
        pgc, myc = pg.connect(), my.connect()
        with c.transaction(decide_in_participant=True) as tx:
            with tx.branch(myc, "my"):
                with myc.cursor() as cur:
                    cur.execute("UPDATE dip_acct SET bal = bal - 10 WHERE id = 8")
            with tx.branch(pgc, "pg"):
                pgc.execute("UPDATE dip_acct SET bal = bal + 10 WHERE id = 8")
        assert tx.outcome == "commit"
        # One request's acknowledgements ride with the next request: sent now (until then,
        # or the owners' grace period, the daemon holds it deciding).
        c.flush_acks()
        wait_until(lambda: c.get(tx.gtid)["state"] == "committed", timeout=10, what="the acknowledgement")
        assert t_bal(pg, my, 8) == (110, 90)
        assert metric(d, "cotx_transactions_begun_total", 0.0) == 1 and metric(d, "cotx_decided_in_participant_total", 0.0) == 1
        assert metric(d, "cotx_gtid_leases_total", 0.0) == (1 if leased else 0)

        # rule A at the decision commit: the PostgreSQL branch read row 8, then an
        # in-doubt 2PC writer overwrote it.
        with pytest.raises(RetryableError, match="rule A"):
            with c.transaction(decide_in_participant=True) as tx:
                with tx.branch(myc, "my"):
                    with myc.cursor() as cur:
                        cur.execute("UPDATE dip_acct SET bal = bal - 10 WHERE id = 8")
                with tx.branch(pgc, "pg"):
                    pgc.execute("SELECT bal FROM dip_acct WHERE id = 8")
                    pgc.execute("UPDATE dip_acct SET bal = bal + 0 WHERE id = 9")
                    w = pg.connect()
                    w.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                    w.execute("UPDATE dip_acct SET bal = bal + 1 WHERE id = 8")
                    w.execute("PREPARE TRANSACTION 'dip-w'")
        pg.sql("COMMIT PREPARED 'dip-w'")
        assert c.get(tx.gtid)["state"] == "aborted"
        wait_until(lambda: nothing_prepared(pg, my), timeout=30, what="the MariaDB branch rolled back")
        assert t_bal(pg, my, 8) == (111, 90)
    finally:
        d.destroy()


@PATHS
def test_a_resource_without_decisions_is_a_configuration_error(dbs, leased):
    """decide_in_participant against a daemon whose PostgreSQL resource is not declared a
    decision resource: the daemon refuses the hand-over (not_a_decision_resource). That is
    configuration, not bad luck: the client raises a TransactionAborted that names it, not
    a RetryableError that a retry loop would run into again and again, on both paths; and
    nothing committed or stayed prepared."""
    from cotx import RetryableError, TransactionAborted
    pg, my = dbs
    d = daemon(pg, my, decisions=False)
    try:
        fresh_row(pg, my, 12)
        c = Coordinator(d.url, d.token, one_request=leased)
        pgc, myc = pg.connect(), my.connect()
        with pytest.raises(TransactionAborted, match="not_a_decision_resource|not a decision resource") as ei:
            with c.transaction(decide_in_participant=True) as tx:
                with tx.branch(myc, "my"):
                    with myc.cursor() as cur:
                        cur.execute("UPDATE dip_acct SET bal = bal - 10 WHERE id = 12")
                with tx.branch(pgc, "pg"):
                    pgc.execute("UPDATE dip_acct SET bal = bal + 10 WHERE id = 12")
        assert not isinstance(ei.value, RetryableError), ei.value
        assert tx.outcome == "abort"
        wait_until(lambda: nothing_prepared(pg, my), timeout=10, what="nothing prepared")
        assert t_bal(pg, my, 12) == (100, 100)
    finally:
        d.destroy()


def t_bal(pg, my, rid):
    return (pg.sql("SELECT bal FROM dip_acct WHERE id = %s", (rid,))[0][0],
            my.sql("SELECT bal FROM dip_acct WHERE id = %s", (rid,))[0][0])


@PATHS
def test_takeover_resolves_in_the_participant(dbs, leased):
    """Two daemons on a shared store; A hands the decision to the PostgreSQL branch and is
    killed -9 for good; the owner commits the decision. B takes node A over and its
    recovery finds the commit in the participant: the MariaDB branch is committed. On the
    one-request path B never knew A's ranges: the gtid is another epoch's to it."""
    pg, my = dbs
    if not pg.sql("SELECT 1 FROM pg_database WHERE datname = 'cotx_log_dip'"):
        pg.sql("CREATE DATABASE cotx_log_dip")
    store = {"kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=cotx_log_dip"), "table": "dip_take_1req" if leased else "dip_take"}
    res = [{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2, "decisions": True},
           {"name": "my", "kind": "mariadb", "dsn": my.dsn, "pool_size": 2}]
    lease = {"ttl_ms": 1500, "renew_ms": 300}
    a = Daemon(res, timeouts=TIMEOUTS, store=store, node_id="dip-a", lease=lease)
    b = Daemon(res, timeouts=TIMEOUTS, store=store, node_id="dip-b", lease=lease)
    b.token = a.token
    b.write_config()
    try:
        a.start()
        b.start()
        t = Transfer(a, pg, my, 19 if leased else 9, leased)
        assert t.commit_call()["decision"] == "in_participant"
        a.kill9()
        t.decide()
        t.pgc.execute("COMMIT")
        assert t.settled() == (110, 90)
        assert Coordinator(b.url, b.token).decision(t.gtid)["decision"] == "commit"
    finally:
        a.destroy()
        b.destroy()


def test_kill9_under_load_with_one_request(dbs):
    """Withdrawals (savings on PostgreSQL, the ledger on MariaDB) in a thread per request,
    each one request with the decision in its PostgreSQL branch, while the daemon is killed
    -9 and restarted three times: every withdrawal ends done or declined through the retry
    loop, nothing stays prepared, the ledger holds exactly the withdrawals done, and the
    money is conserved (a branch committed by a decision the dead daemon handed over is
    found by the restarted daemon's lookup; one it never saw is aborted and run again)."""
    pg, my = dbs
    users, balance = 6, 400
    create_withdrawal_tables(pg, my)
    reset_accounts(pg, my, users, balance)
    d = daemon(pg, my, decisions=True)
    try:
        coord = Coordinator(d.url, d.token, decision_timeout=60, one_request=True, lease_count=50)
        results, retried = withdrawals_under_kills(d, coord, pg, my, users, decide_in_participant=True)
        failed = {w: r for w, r in results.items() if r not in ("done", "declined")}
        print(f"{len(results)} withdrawals, {len(failed)} failed; run again after: {collections.Counter(retried)}; "
              f"ranges leased: {coord.leases.leased}; handed over: {metric(d, 'cotx_decided_in_participant_total', 0)}")
        assert not failed, f"{len(failed)} of {len(results)} withdrawals failed: {list(failed.items())[:5]}"
        done = {w for w, r in results.items() if r == "done"}
        assert len(done) >= 20 and coord.leases.leased >= 4, (len(done), coord.leases.leased)
        wait_until(lambda: nothing_prepared(pg, my), 30, "nothing left prepared")
        assert {r[0] for r in my.sql("SELECT id FROM wd_log")} == done
        spent = dict(my.sql("SELECT u, SUM(amt) FROM wd_log GROUP BY u"))
        for u, bal in pg.sql("SELECT u, bal FROM wd_acct"):
            assert bal == balance - int(spent.get(u, 0)) and bal >= 0, (u, bal, spent.get(u))
    finally:
        d.destroy()


class CommitHangs:
    """Holds every PostgreSQL COMMIT after its local flush, as a synchronous standby that
    never answers would (synchronous_standby_names names one that does not exist): the
    COMMIT is durable here but its client gets no answer. `lose_the_waiter` then ends the
    waiting session (pg_terminate_backend), so its client sees its connection lost during
    a COMMIT that did commit, and lifts the hold. The test cluster's own setting is put
    back at exit whatever happened."""

    def __init__(self, pg):
        self.pg = pg

    def __enter__(self):
        self.pg.sql("ALTER SYSTEM SET synchronous_standby_names = 'cotx_no_such_standby'")
        self.pg.sql("SELECT pg_reload_conf()")
        # The checkpointer applies the setting: armed once a probe's COMMIT waits (then
        # cancelled: a cancel ends the wait, the COMMIT stands). Neither statement_timeout
        # (off during a COMMIT) nor a transaction that wrote no WAL would show it.
        def armed():
            probe = self.pg.connect()
            pid = probe.info.backend_pid
            def run_probe():
                try:
                    probe.execute("SET synchronous_commit = on; SELECT pg_logical_emit_message(true, 'cotx', 'probe')")
                except psycopg.Error:
                    pass  # cancelled before its COMMIT: this try did not show the hold
            t = threading.Thread(target=run_probe)
            t.start()
            waited = False
            for _ in range(20):
                if self.pg.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'", (pid,)):
                    waited = True
                    break
                if not t.is_alive():
                    break
                time.sleep(0.05)
            # Cancelled whatever the watch saw: the hold may take effect just after it, and
            # the join must not wait on a held COMMIT (a cancel ends the wait; the COMMIT stands).
            if t.is_alive():
                self.pg.sql("SELECT pg_cancel_backend(%s)", (pid,))
            t.join(timeout=30)
            probe.close()
            return waited
        wait_until(armed, timeout=10, what="synchronous_standby_names in effect")
        return self

    def lose_the_waiter(self, timeout: float = 30) -> int:
        pid = wait_until(lambda: (self.pg.sql("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
                                  or [[None]])[0][0], timeout=timeout, what="a COMMIT waiting for the standby")
        self.pg.sql("SELECT pg_terminate_backend(%s)", (pid,))
        self.lift()
        return pid

    def lift(self):
        self.pg.sql("ALTER SYSTEM RESET synchronous_standby_names")
        self.pg.sql("SELECT pg_reload_conf()")

    def __exit__(self, *exc):
        self.lift()


@PATHS
def test_client_session_lost_during_decision_commit(dbs, leased):
    """The Python client's decision branch loses its session during the COMMIT that carries
    the decision, after PostgreSQL committed it (the COMMIT held as by a synchronous
    standby, the backend then terminated). Whether it committed is the database's to say:
    the client must not read the lost session as a refusal (rolling back, reporting the
    branch failed: the daemon would abort the MariaDB branch, a split, and the caller would
    run the transfer again). It waits for the daemon, which reads the decision in
    PostgreSQL (co.resolve) after the owner's grace period: the transaction commits, the
    MariaDB branch with it, and the client returns as for any commit."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    rid = 21 if leased else 20
    try:
        fresh_row(pg, my, rid)
        c = Coordinator(d.url, d.token, one_request=leased)
        pgc, myc = pg.connect(), my.connect()
        with CommitHangs(pg) as hold:
            lost = []
            killer = threading.Thread(target=lambda: lost.append(hold.lose_the_waiter()))
            with c.transaction(decide_in_participant=True) as tx:
                with tx.branch(myc, "my"):
                    with myc.cursor() as cur:
                        cur.execute("UPDATE dip_acct SET bal = bal - 10 WHERE id = %s", (rid,))
                with tx.branch(pgc, "pg"):
                    pgc.execute("UPDATE dip_acct SET bal = bal + 10 WHERE id = %s", (rid,))
                killer.start()
            killer.join(timeout=60)
        assert lost, "the decision COMMIT never waited"
        assert pgc.broken, "the client's PostgreSQL session was not lost"
        assert tx.outcome == "commit"
        assert c.decision(tx.gtid)["decision"] == "commit"
        wait_until(lambda: nothing_prepared(pg, my), timeout=30, what="the MariaDB branch committed")
        assert t_bal(pg, my, rid) == (110, 90)
    finally:
        d.destroy()


@PATHS
def test_client_session_lost_before_the_decision_commit_is_run_again(dbs, leased):
    """The Python client's decision branch loses its session while its decision is still
    open (co.decide waits on another session's lock of co.decisions, as in the Go and Java
    tests; the waiting backend is then terminated and that lock released): nothing committed
    anywhere. The client waits for the daemon, which resolves abort in PostgreSQL
    (co.resolve). That abort means "not done, safe to run again": Coordinator.run runs the
    transfer again (a fresh PostgreSQL session, as from a pool), and it commits once. Before,
    the daemon recorded that abort not retryable and the client raised TransactionAborted."""
    pg, my = dbs
    d = daemon(pg, my, decisions=True)
    rid = 23 if leased else 22
    try:
        fresh_row(pg, my, rid)
        c = Coordinator(d.url, d.token, one_request=leased)
        myc = my.connect()
        blocker = pg.connect()
        attempts, lost = [], []

        def lose_the_decider():
            pid = wait_until(lambda: (pg.sql("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                             "AND query LIKE '%co.decide(%'") or [[None]])[0][0],
                             timeout=30, what="co.decide waiting on the lock of co.decisions")
            pg.sql("SELECT pg_terminate_backend(%s)", (pid,))
            blocker.execute("ROLLBACK")
            lost.append(pid)
        killer = threading.Thread(target=lose_the_decider)

        def transfer(tx):
            attempts.append(tx.gtid)
            pgc = pg.connect()
            with tx.branch(myc, "my"):
                with myc.cursor() as cur:
                    cur.execute("UPDATE dip_acct SET bal = bal - 10 WHERE id = %s", (rid,))
            with tx.branch(pgc, "pg"):
                pgc.execute("UPDATE dip_acct SET bal = bal + 10 WHERE id = %s", (rid,))
            if len(attempts) == 1:
                blocker.execute("BEGIN")
                blocker.execute("LOCK TABLE co.decisions IN SHARE MODE")
                killer.start()

        c.run(lambda tx: transfer(tx), retries=2, decide_in_participant=True)
        killer.join(timeout=60)
        assert lost, "co.decide never waited"
        assert len(attempts) == 2, attempts
        assert c.decision(attempts[0])["decision"] == "abort"
        wait_until(lambda: nothing_prepared(pg, my), timeout=30, what="nothing prepared")
        assert t_bal(pg, my, rid) == (110, 90), "the transfer applied once"
    finally:
        d.destroy()


def test_session_lost_during_a_one_phase_commit_is_an_unknown_outcome(dbs):
    """A single-branch transaction commits in one phase (no PREPARE, no decision record):
    its session is lost during that COMMIT, after PostgreSQL committed it (held as by a
    synchronous standby, then terminated). Only the database knows whether it committed:
    the client raises OutcomeUnknown (not retried by run()), acknowledges nothing, and the
    daemon does not record an abort. Before, the client rolled back on the dead session,
    acknowledged "abort" (the daemon recorded "one-phase branch rolled back") and raised
    TransactionAborted while the row had committed."""
    from cotx import OutcomeUnknown
    pg, my = dbs
    d = daemon(pg, my, decisions=False)
    try:
        fresh_row(pg, my, 24)
        c = Coordinator(d.url, d.token)
        pgc = pg.connect()
        pgc.execute("SET synchronous_commit = on")   # the test clusters run it off: no wait
        runs = []

        def transfer(tx):
            runs.append(tx.gtid)
            with tx.branch(pgc, "pg"):
                pgc.execute("UPDATE dip_acct SET bal = bal + 10 WHERE id = 24")
            killer.start()
        with CommitHangs(pg) as hold:
            killer = threading.Thread(target=hold.lose_the_waiter)
            with pytest.raises(OutcomeUnknown, match="lost during the one-phase COMMIT"):
                c.run(transfer, retries=2)
            killer.join(timeout=60)
        assert len(runs) == 1, "run again although it may have committed"
        assert pg.sql("SELECT bal FROM dip_acct WHERE id = 24")[0][0] == 110, "it did commit"
        assert c.get(runs[0]).get("abort_reason") is None and c.get(runs[0])["decision"] != "abort"
    finally:
        d.destroy()

"""The Python client's one-request path (Coordinator(one_request=True), cotx/leases.py and
Transaction._commit_leased): gtids drawn from a range leased from the daemon, branches
prepared under the names the lease gives, the commit the transaction's only request.
Real daemon, real PostgreSQL and MariaDB, withdrawals (savings on PostgreSQL, the ledger
on MariaDB) through coord.run:

- every withdrawal commits and costs the daemon one request (its requests counter), with
  the acknowledgements carried by the next commit;
- branches that wrote nothing are listed read-only with the commit (decided in memory);
- a range that is used up, or past the part of its lease the client draws from, is
  replaced by a new lease;
- a transaction that reaches a client-mode resource takes the begin path (never sent and
  refused), at its first branch or, after a leased one, by a rerun before anything was sent;
- the daemon restarted between a leased transaction's branches and its commit: the commit
  is answered as an abort (another epoch's gtid), the transaction runs again under a fresh
  lease;
- kill -9 of the daemon, three times, under withdrawals in a thread per request: every
  withdrawal ends done or declined through the retry loop (a leased gtid the restarted
  daemon does not know is aborted on record by its recovery and run again under a new
  lease), nothing stays prepared, the money is conserved.
"""
from __future__ import annotations

import collections
import time

import pytest
from cotest.coord import api, make_daemon, metric, nothing_prepared, wait_until
from cotest.transfers import create_withdrawal_tables, reset_accounts, withdrawal, withdrawals_under_kills
from cotx import Coordinator

PLAIN = "none"  # plain 2PC on both: engine-mode-like branches, no mysql_co needed


@pytest.fixture
def tables(pg, mariadb):
    create_withdrawal_tables(pg, mariadb)


def ledger(mariadb) -> set[str]:
    return {r[0] for r in mariadb.sql("SELECT id FROM wd_log")}


def test_each_withdrawal_is_one_request(pg, mariadb, tables):
    reset_accounts(pg, mariadb, 2, 1000)
    with make_daemon(pg, mariadb, enforcement=PLAIN) as d:
        coord = Coordinator(d.url, d.token, one_request=True)
        pc, mc = pg.connect(), mariadb.connect()
        # The first leases the range and reads the resources' modes.
        assert coord.run(withdrawal(pc, mc, "w-first", 0, 1)) == "done"
        assert metric(d, "cotx_gtid_leases_total") == 1
        before, n = metric(d, "cotx_requests_total"), 20
        for i in range(n):
            assert coord.run(withdrawal(pc, mc, f"w{i}", i % 2, 5)) == "done"
        # The metrics read before is counted when it is answered: n commits and it.
        assert metric(d, "cotx_requests_total") - before == n + 1, "more than one request per transaction"
        assert metric(d, "cotx_gtid_leases_total") == 1
        assert metric(d, "cotx_transactions_total{outcome=\"commit\"}", 0) >= n + 1
        wait_until(lambda: nothing_prepared(pg, mariadb), what="every branch finished")
    assert ledger(mariadb) == {"w-first"} | {f"w{i}" for i in range(n)}
    assert pg.sql("SELECT SUM(bal) FROM wd_acct") == [(2000 - 1 - 5 * n,)]


def test_an_all_read_only_transaction_is_listed_read_only(pg, mariadb, tables):
    """Branches declared read_only that wrote nothing are listed with the commit: the
    daemon decides it in memory (its read-only commits counter), still one request."""
    reset_accounts(pg, mariadb, 1, 1000)
    with make_daemon(pg, mariadb, enforcement=PLAIN) as d:
        coord = Coordinator(d.url, d.token, one_request=True)
        pc, mc = pg.connect(), mariadb.connect()

        def balance(tx):
            with tx.branch(pc, "pg", read_only=True):
                bal = pc.execute("SELECT bal FROM wd_acct WHERE u = 0").fetchone()[0]
            with tx.branch(mc, "my", read_only=True):
                cur = mc.cursor()
                cur.execute("SELECT COUNT(*) FROM wd_log")
                cur.fetchall()
            return bal
        assert coord.run(balance) == 1000
        ro = metric(d, "cotx_read_only_commits_total", 0)
        before = metric(d, "cotx_requests_total")
        assert coord.run(balance) == 1000
        # The metrics read before is counted when it is answered: the commit and it.
        assert metric(d, "cotx_requests_total") - before == 2
        assert metric(d, "cotx_read_only_commits_total", 0) - ro == 1
        wait_until(lambda: nothing_prepared(pg, mariadb), what="every branch finished")


def test_a_used_up_or_expired_range_is_leased_again(pg, mariadb, tables):
    reset_accounts(pg, mariadb, 1, 1000)
    with make_daemon(pg, mariadb, enforcement=PLAIN) as d:
        pc, mc = pg.connect(), mariadb.connect()
        # Three gtids a range: seven transactions lease three ranges.
        coord = Coordinator(d.url, d.token, one_request=True, lease_count=3)
        for i in range(7):
            assert coord.run(withdrawal(pc, mc, f"c{i}", 0, 1)) == "done"
        assert coord.leases.leased == 3 and metric(d, "cotx_gtid_leases_total") == 3
        # A 2 s lease is drawn from for its first second only.
        coord = Coordinator(d.url, d.token, one_request=True, lease_ttl_ms=2000)
        assert coord.run(withdrawal(pc, mc, "t0", 0, 1)) == "done"
        assert coord.run(withdrawal(pc, mc, "t1", 0, 1)) == "done"
        assert coord.leases.leased == 1
        time.sleep(1.1)
        assert coord.run(withdrawal(pc, mc, "t2", 0, 1)) == "done"
        assert coord.leases.leased == 2 and metric(d, "cotx_gtid_leases_total") == 5
    assert len(ledger(mariadb)) == 10


def test_a_client_mode_resource_takes_the_begin_path(pg, mariadb, tables):
    """PostgreSQL plain 2PC, MariaDB in client mode: a withdrawal's first branch is
    leased, its second reaches the client-mode resource, so it runs again on the begin
    path before anything was sent; a transaction on the client-mode resource alone is
    begun. The daemon refuses nothing."""
    reset_accounts(pg, mariadb, 1, 1000)
    from cotest.daemon import Daemon
    with Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "enforcement": "none"},
                 {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn, "enforcement": "client"}]) as d:
        coord, reruns = Coordinator(d.url, d.token, one_request=True), []
        pc, mc = pg.connect(), mariadb.connect()
        out = coord.run(withdrawal(pc, mc, "m0", 0, 10), on_retry=lambda n, e, s: reruns.append(type(e).__name__))
        assert out == "done" and reruns == ["BeginPathNeeded"]
        assert metric(d, "cotx_gtid_leases_total") == 1

        def ledger_only(tx):
            with tx.branch(mc, "my"):
                mc.cursor().execute("INSERT INTO wd_log VALUES ('m1', 0, 0)")
            return tx.gtid
        leased_before = coord.leases.leased
        coord.run(ledger_only)
        assert coord.leases.leased == leased_before
        assert metric(d, "cotx_branch_refusals_total", 0) == 0
        wait_until(lambda: nothing_prepared(pg, mariadb), what="every branch finished")
    assert ledger(mariadb) == {"m0", "m1"}


def test_a_restart_before_the_commit_leads_to_a_fresh_lease_and_a_rerun(pg, mariadb, tables):
    """The daemon killed (-9) and restarted while a leased transaction works: the commit
    reaches a new epoch that never leased its gtid. Its recovery records abort for the
    branches it finds prepared under it and rolls them back, the commit is answered as an
    abort (never committed), and coord.run runs the withdrawal again under a
    gtid of a fresh range: committed once, nothing prepared."""
    reset_accounts(pg, mariadb, 1, 1000)
    d = make_daemon(pg, mariadb, enforcement=PLAIN, timeouts={"recovery_interval_ms": 300})
    d.start()
    try:
        coord, retried, gtids = Coordinator(d.url, d.token, one_request=True), [], []
        pc, mc = pg.connect(), mariadb.connect()
        inner = withdrawal(pc, mc, "r1", 0, 10)

        def fn(tx):
            out = inner(tx)
            gtids.append(tx.gtid)
            if len(gtids) == 1:
                d.kill9()
                d.start()
            return out
        assert coord.run(fn, on_retry=lambda n, e, s: retried.append(type(e).__name__)) == "done"
        assert retried == ["RetryableError"] and coord.leases.leased == 2, (retried, coord.leases.leased)
        # The first gtid is another epoch's for the restarted daemon: abort on record, or
        # presumed abort (only the dead process could have recorded its commit).
        assert gtids[0].split("-")[0] != gtids[1].split("-")[0], gtids
        st, body = api(d, "GET", f"/v1/transactions/{gtids[0]}/decision")
        assert body.get("decision") == "abort" or body["error"]["code"] == "unknown_transaction", (st, body)
        wait_until(lambda: nothing_prepared(pg, mariadb), what="nothing left prepared")
    finally:
        d.destroy()
    assert ledger(mariadb) == {"r1"}
    assert pg.sql("SELECT bal FROM wd_acct") == [(990,)]


def test_kill9_under_load_with_one_request(pg, mariadb, tables):
    users, balance = 6, 400
    reset_accounts(pg, mariadb, users, balance)
    d = make_daemon(pg, mariadb, enforcement=PLAIN, timeouts={"transaction_ms": 10000, "recovery_interval_ms": 300})
    d.start()
    try:
        coord = Coordinator(d.url, d.token, decision_timeout=60, one_request=True, lease_count=50)
        results, retried = withdrawals_under_kills(d, coord, pg, mariadb, users)
        failed = {w: r for w, r in results.items() if r not in ("done", "declined")}
        print(f"{len(results)} withdrawals: {sum(r == 'done' for r in results.values())} done, "
              f"{sum(r == 'declined' for r in results.values())} declined, {len(failed)} failed; "
              f"run again after: {collections.Counter(retried)}; ranges leased: {coord.leases.leased}")
        assert not failed, f"{len(failed)} of {len(results)} withdrawals failed: {list(failed.items())[:5]}"
        done = {w for w, r in results.items() if r == "done"}
        # Each restart is a new epoch: the client leased again after each (3 kills).
        assert len(done) >= 20 and coord.leases.leased >= 4 and retried, (len(done), coord.leases.leased, retried)
        wait_until(lambda: nothing_prepared(pg, mariadb), 30, "nothing left prepared")
        assert ledger(mariadb) == done
        spent = dict(mariadb.sql("SELECT u, SUM(amt) FROM wd_log GROUP BY u"))
        for u, bal in pg.sql("SELECT u, bal FROM wd_acct"):
            assert bal == balance - int(spent.get(u, 0)) and bal >= 0, (u, bal, spent.get(u))
    finally:
        d.destroy()

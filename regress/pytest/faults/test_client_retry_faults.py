"""coord.run (clients/python/cotx/retry.py) rides through the daemon's faults as the retry
rules say (clients/retry-rules.json), on real servers and the real daemon:

- a begin refused with 429 too_many_transactions, one refused with 503
  resource_unavailable (client mode's helper cannot be prepared: every prepared-transaction
  slot of the server is taken), and one refused with 503 lease_unconfirmed (the daemon's
  decision store stopped past the lease's validity) are run again after Retry-After and
  commit; with several daemons of one deployment, the begin goes to another at once;
- the daemon killed with kill -9 and restarted, three times, under withdrawals run in a
  thread per request: every withdrawal ends done or declined, none fails, the money is
  conserved and nothing stays prepared.

The table's rows themselves: test_client_retry_rules.py."""
from __future__ import annotations
import collections
import os
import signal
import time

import pytest
from cotest import PgServer
from cotest.coord import make_daemon, nothing_prepared, pg_prepared, wait_until
from cotest.transfers import reset_accounts, withdrawal, withdrawals_under_kills
from cotx import Coordinator
from cotest.daemon import Daemon
from cotx.errors import CoordinatorError


def test_a_begin_refused_with_429_is_run_again(pg, mariadb, withdrawal_tables):
    """limits.max_active = 1 and another transaction undecided: the begin is refused with
    429 too_many_transactions (Retry-After: 1); run() waits, the other ends, it commits."""
    reset_accounts(pg, mariadb, 1, 100)
    with make_daemon(pg, mariadb, limits={"max_active": 1}) as d:
        coord = Coordinator(d.url, d.token)
        other = coord.begin()
        waits, refused = [], []

        def sleep(s):
            waits.append(s)
            coord.http.request("POST", f"/v1/transactions/{other}/abort", {"reason": "test"})
        out = coord.run(withdrawal(pg.connect(), mariadb.connect(), "w429", 0, 10), sleep=sleep,
                        on_retry=lambda n, e, s: refused.append((n, e)))
        assert out == "done"
        assert [(n, e.status, e.code, e.phase) for n, e in refused] == [(0, 429, "too_many_transactions", "begin")]
        assert 1.0 <= waits[0] <= 1.25          # Retry-After, spread by up to a quarter
    assert pg.sql("SELECT bal FROM wd_acct") == [(90,)]
    assert mariadb.sql("SELECT id FROM wd_log") == (("w429",),)


def test_a_begin_refused_with_503_is_run_again():
    """Client mode on a PostgreSQL whose prepared-transaction slots are all taken: the
    daemon cannot prepare the branch's helper and refuses the begin with 503
    resource_unavailable; once the slots are free again run() commits."""
    with PgServer(preload=False, conf={"max_prepared_transactions": 3}) as bare:
        bare.sql("CREATE TABLE t(k int PRIMARY KEY)")
        blocker = bare.connect()
        for i in range(3):
            blocker.execute("BEGIN")
            blocker.execute(f"PREPARE TRANSACTION 'blocker-{i}'")
        with Daemon([{"name": "bare", "kind": "postgres", "dsn": bare.dsn, "enforcement": "client"}]) as d:
            coord = Coordinator(d.url, d.token)
            conn, refused = bare.connect(), []

            def fn(tx):
                with tx.branch(conn, "bare"):
                    conn.execute("INSERT INTO t VALUES (1)")
                return "done"

            def sleep(s):
                for i in range(3):
                    bare.sql(f"ROLLBACK PREPARED 'blocker-{i}'")
            out = coord.run(fn, sleep=sleep, on_retry=lambda n, e, s: refused.append(e))
            assert out == "done"
            assert [(e.status, e.code, e.phase) for e in refused] == [(503, "resource_unavailable", "begin")]
            wait_until(lambda: not pg_prepared(bare), 15, "the helper rolled back")
        assert bare.sql("SELECT k FROM t") == [(1,)]


def test_a_begin_refused_goes_to_another_daemon_of_the_deployment(pg, mariadb, withdrawal_tables):
    """Two daemons on one PostgreSQL store, the client given both URLs: the first refuses
    the begin (429, full), the second takes it at once (no wait); the rest of the
    transaction follows it there (421)."""
    reset_accounts(pg, mariadb, 1, 100)
    if not pg.sql("SELECT 1 FROM pg_database WHERE datname = 'retry_log'"):
        pg.sql("CREATE DATABASE retry_log")
    store = {"kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=retry_log"), "table": "multi_t"}
    with make_daemon(pg, mariadb, store=store, limits={"max_active": 1}) as full:
        other = make_daemon(pg, mariadb, store=store)
        other.token = full.token
        other.write_config()
        with other:
            Coordinator(full.url, full.token).begin()          # the one undecided transaction allowed
            coord, waits = Coordinator([full.url, other.url], full.token), []
            assert coord.run(withdrawal(pg.connect(), mariadb.connect(), "w-multi", 0, 10), sleep=waits.append) == "done"
            assert waits == []
    assert mariadb.sql("SELECT id FROM wd_log") == (("w-multi",),)


class Paused:
    """The PostgreSQL server `srv` stopped (SIGSTOP: its postmaster and its sessions; a
    paused or partitioned decision store) until resume()."""

    def __init__(self, srv):
        sessions = srv.sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
                           "AND pid <> pg_backend_pid()")
        self.pids = [int((srv.data / "postmaster.pid").read_text().split()[0])] + [p for (p,) in sessions]
        for p in self.pids:
            os.kill(p, signal.SIGSTOP)

    def resume(self):
        for p in self.pids:
            os.kill(p, signal.SIGCONT)
        self.pids = []


def test_a_daemon_whose_lease_lapsed_is_ridden_through(pg, mariadb, withdrawal_tables):
    """The daemon's decision store (PostgreSQL) stops answering past the lease's validity:
    the daemon refuses new work with 503 lease_unconfirmed. run() waits Retry-After (the
    store comes back during the first wait) and commits once the lease is renewed."""
    reset_accounts(pg, mariadb, 1, 100)
    with PgServer(preload=False) as store_srv:
        store = {"kind": "postgres", "dsn": store_srv.dsn, "table": "lease_t"}
        with make_daemon(pg, mariadb, store=store, lease={"ttl_ms": 1000, "renew_ms": 250}) as d:
            coord = Coordinator(d.url, d.token)
            paused = Paused(store_srv)
            try:
                def lapsed():
                    try:
                        coord.begin()       # a begin that goes through just times out
                    except CoordinatorError as e:
                        return e.code == "lease_unconfirmed"
                wait_until(lapsed, 15, "the daemon to refuse new work")
                refused = []

                def sleep(s):
                    paused.resume()
                    time.sleep(s)
                out = coord.run(withdrawal(pg.connect(), mariadb.connect(), "w-lease", 0, 10), sleep=sleep,
                                on_retry=lambda n, e, s: refused.append(e))
            finally:
                paused.resume()
            assert out == "done"
            assert refused and all((e.status, e.code, e.phase) == (503, "lease_unconfirmed", "begin") for e in refused)
    assert mariadb.sql("SELECT id FROM wd_log") == (("w-lease",),)


@pytest.fixture
def load_daemon(pg, mariadb):
    d = make_daemon(pg, mariadb, timeouts={"transaction_ms": 10000})
    d.start()
    yield d
    d.destroy()


def test_kill9_of_the_daemon_under_load_every_withdrawal_is_done_or_declined(pg, mariadb, withdrawal_tables, load_daemon):
    """Four clients, each running withdrawals through coord.run in a thread per request (as
    a threaded web service does); the daemon is killed with kill -9 and restarted three
    times meanwhile. Every withdrawal ends done or declined (run() ran again what was
    aborted by the crash or refused while the daemon restarted), the money is conserved,
    and nothing stays prepared."""
    users, balance = 6, 400
    reset_accounts(pg, mariadb, users, balance)
    d = load_daemon
    coord = Coordinator(d.url, d.token, decision_timeout=60)
    results, retried = withdrawals_under_kills(d, coord, pg, mariadb, users)
    failed = {w: r for w, r in results.items() if r not in ("done", "declined")}
    print(f"{len(results)} withdrawals: {sum(r == 'done' for r in results.values())} done, "
          f"{sum(r == 'declined' for r in results.values())} declined, {len(failed)} failed; "
          f"run again after: {collections.Counter(retried)}")
    assert not failed, f"{len(failed)} of {len(results)} withdrawals failed: {list(failed.items())[:5]}"
    done = {w for w, r in results.items() if r == "done"}
    assert len(done) >= 20 and "CoordinatorUnavailable" in retried, (len(done), retried)
    wait_until(lambda: nothing_prepared(pg, mariadb), 30, "nothing left prepared")
    assert {r[0] for r in mariadb.sql("SELECT id FROM wd_log")} == done
    spent = dict(mariadb.sql("SELECT u, SUM(amt) FROM wd_log GROUP BY u"))
    for u, bal in pg.sql("SELECT u, bal FROM wd_acct"):
        assert bal == balance - int(spent.get(u, 0)) and bal >= 0, (u, bal, spent.get(u))


def test_a_refusal_that_is_not_retry_later_is_not_waited_on(pg, mariadb, withdrawal_tables):
    """An unknown resource is a misconfiguration (the table's "fail"): no wait, no retry."""
    with make_daemon(pg, mariadb) as d:
        coord = Coordinator(d.url, d.token)
        conn, waits = pg.connect(), []

        def fn(tx):
            with tx.branch(conn, "no-such-resource"):
                pass
        with pytest.raises(CoordinatorError) as ei:
            coord.run(fn, sleep=waits.append)
        assert (ei.value.status, ei.value.code, ei.value.phase) == (404, "unknown_resource", "begin") and waits == []

"""The PostgreSQL decision store: decisions in a table of a database of our choice. The
daemon crashes after a decision; a restarted daemon finds the decision in the table and
completes every branch; the record is marked finished once all branches are (and kept,
answerable, for timeouts.outcome_retention_ms)."""
import os
import time

import pytest
from cotx import Coordinator
from cotest.coord import make_daemon, metric, nothing_prepared, shared_store, wait_until
from cotest.transfers import Child, committed_both, committed_transfer

pytestmark = pytest.mark.usefixtures("crash_tables", "store_db")


def records(pg):
    return [r[0] for r in pg.sql("SELECT gtid FROM cotx_decisions_t WHERE finished_ms IS NULL", dbname="cotx_log")]


def test_pg_store_commit_crash_and_recover(pg, mariadb, daemons):
    store = shared_store(pg, "cotx_decisions_t")
    d = daemons.start(pg, mariadb, store=store, timeouts={"owner_grace_ms": 600000})
    # Normal commit through the PostgreSQL store.
    tx = committed_transfer(d, pg, mariadb, "pgstore-1")
    assert committed_both(pg, mariadb, "pgstore-1")
    wait_until(lambda: tx.gtid not in records(pg), what="record marked finished after owners finished")
    # Crash after the decision, before any branch is finished.
    ch = Child(d, pg, mariadb, "after_decision", "pgstore-2")
    assert ch.gtid in records(pg)
    d.kill9()
    ch.kill9()
    d.timeouts["owner_grace_ms"] = 200
    d.write_config()
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery from the PostgreSQL store")
    assert committed_both(pg, mariadb, "pgstore-2")
    wait_until(lambda: ch.gtid not in records(pg), what="record marked finished")


def test_connecting_takes_no_lock_on_a_busy_store(pg, mariadb):
    """A daemon that (re)connects to a store whose schema is current takes no lock on its
    tables. Before, every connection ran the schema's ALTER TABLEs: an ACCESS EXCLUSIVE
    request queued behind any open transaction on the decision table — e.g. another
    daemon's decision whose commit waits for a synchronous standby during a failover — and
    every later reader and writer of the table queued behind it: the store stopped for all
    daemons until that standby came back (the failover test hung this way)."""
    store = shared_store(pg, "cotx_decisions_t")
    first = make_daemon(pg, mariadb, store=store, node_id="busy1").start()   # schema made
    first.destroy()
    with pg.connect(dbname="cotx_log", autocommit=False) as holder:
        # What a decision waiting for its synchronous standby holds: a row-exclusive lock.
        holder.execute("LOCK TABLE cotx_decisions_t IN ROW EXCLUSIVE MODE")
        d = make_daemon(pg, mariadb, store=store, node_id="busy2")
        try:
            d.start()   # fails (no answer in 30 s) while its connection waits for a lock
            with pg.connect(dbname="cotx_log") as reader:
                reader.execute("SET statement_timeout = '5s'")
                reader.execute("SELECT count(*) FROM cotx_decisions_t")   # not queued behind the daemon
            with pg.connect() as pc:
                mc = mariadb.connect()
                with Coordinator(d.url, d.token).transaction() as tx:
                    with tx.branch(pc, "pg"):
                        pc.execute("INSERT INTO crash VALUES ('pgstore-busy', 1)")
                    with tx.branch(mc, "my"):
                        mc.cursor().execute("INSERT INTO crash VALUES ('pgstore-busy', 1)")
                mc.close()
            assert tx.outcome == "commit" and committed_both(pg, mariadb, "pgstore-busy")
        finally:
            holder.rollback()
            d.destroy()


# Debian's libfaketime (scripts/bootstrap.sh installs the faketime package).
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def test_a_daemon_whose_clock_runs_slow_says_so(pg, mariadb, monkeypatch):
    """The daemon's clocks (wall and monotonic) run at a quarter of real time, the
    PostgreSQL store's do not: it renews its lease every 300 ms by its clock, 1.2 s by the
    store's. Before, nothing said why its lease kept running out; now the rate is
    exported (cotx_clock_rate), the skew logged once, and CotxClockSkewed alerts on it
    (deploy/prometheus). A daemon in step shows 1."""
    import json
    store = shared_store(pg, "cotx_clock_t")

    def rate(d):
        return metric(d, "cotx_clock_rate")

    lease = {"ttl_ms": 1500, "renew_ms": 300}
    with make_daemon(pg, mariadb, store=store, lease=lease) as d:
        wait_until(lambda: 0.8 < (rate(d) or 0) < 1.25 and "clock runs" not in d.log_tail(200), 10, "in step")
        time.sleep(2)
        assert 0.8 < rate(d) < 1.25 and "clock runs at another rate" not in d.log_tail(400)
    assert os.path.exists(FAKETIME), "faketime is not installed: run scripts/bootstrap.sh"
    monkeypatch.setenv("LD_PRELOAD", FAKETIME)
    monkeypatch.setenv("FAKETIME", "+0 x0.25")
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
    with make_daemon(pg, mariadb, store=store, lease=lease) as d:
        monkeypatch.delenv("LD_PRELOAD")
        wait_until(lambda: "clock runs at another rate" in d.log_tail(400), 30, "the skew logged")
        assert rate(d) < 0.5, rate(d)
        said = [json.loads(x) for x in d.log_tail(400).splitlines() if "clock runs at another rate" in x]
        assert len(said) == 1, said

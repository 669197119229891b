"""The PostgreSQL decision store: decisions in a table of a database of our choice. The
daemon crashes after a decision; a restarted daemon finds the decision in the table and
completes every branch; the record is marked finished once all branches are (and kept,
answerable, for timeouts.outcome_retention_ms)."""
import pytest
from cotx import Coordinator
from cotx.testing import make_daemon, nothing_prepared, wait_until

from test_coordinator_crash import Child, committed_both


@pytest.fixture(scope="module", autouse=True)
def tables(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS crash(k text PRIMARY KEY, v int)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS crash(k varchar(64) PRIMARY KEY, v int) ENGINE=InnoDB")
    pg.sql("CREATE DATABASE cotx_log")


def records(pg):
    return [r[0] for r in pg.sql("SELECT gtid FROM cotx_decisions_t WHERE finished_ms IS NULL", dbname="cotx_log")]


def test_pg_store_commit_crash_and_recover(pg, mariadb):
    store = {"kind": "postgres", "dsn": pg.dsn.replace("dbname=postgres", "dbname=cotx_log"), "table": "cotx_decisions_t"}
    d = make_daemon(pg, mariadb, store=store, timeouts={"owner_grace_ms": 600000}).start()
    try:
        # Normal commit through the PostgreSQL store.
        coord = Coordinator(d.url, d.token)
        with pg.connect() as pc:
            mc = mariadb.connect()
            with coord.transaction() as tx:
                with tx.branch(pc, "pg"):
                    pc.execute("INSERT INTO crash VALUES ('pgstore-1', 1)")
                with tx.branch(mc, "my"):
                    mc.cursor().execute("INSERT INTO crash VALUES ('pgstore-1', 1)")
            mc.close()
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
    finally:
        d.destroy()

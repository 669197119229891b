"""The harness's replicated PostgreSQL (harness/cotest/replica.py): a primary and a
synchronous streaming standby as real processes. A COMMIT on the primary returns only
once the standby has applied it; with the standby gone a COMMIT waits (shown, not
timed: the backend is seen waiting on SyncRep until the standby is back); kill -9 of the
primary and promotion of the standby lose no committed row, and the multi-host DSN
finds the new primary — and does not find a writable node before the promotion."""
import threading

import psycopg
import pytest
from cotest import PgReplicaPair
from cotest.coord import wait_until


@pytest.fixture
def pair():
    with PgReplicaPair() as p:
        p.sql("CREATE TABLE t(k int PRIMARY KEY)")
        yield p


def test_commit_is_on_the_standby_before_it_returns(pair):
    with pair.primary.connect() as c:
        for k in range(200):
            c.execute("INSERT INTO t VALUES (%s)", (k,))
            # remote_apply: no wait, no retry — the row must already be readable there.
            assert pair.standby.sql("SELECT count(*) FROM t WHERE k = %s", (k,)) == [(1,)]


def test_commit_waits_while_the_standby_is_down(pair):
    pair.standby.stop()
    done = threading.Event()

    def insert():
        with pair.primary.connect() as c:
            c.execute("INSERT INTO t VALUES (1000)")
        done.set()

    th = threading.Thread(target=insert, daemon=True)
    th.start()
    # The COMMIT is written locally but not acknowledged: the backend waits for a standby.
    wait_until(lambda: pair.primary.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
               == [(1,)], what="the commit to wait on synchronous replication")
    assert not done.is_set()
    pair.standby.start()
    th.join(60)
    assert done.is_set()
    assert pair.standby.sql("SELECT count(*) FROM t WHERE k = 1000") == [(1,)]


def test_failover_keeps_every_committed_row(pair):
    old_primary = pair.primary.port
    with pair.connect() as c:
        assert c.info.port == old_primary
        for k in range(500):
            c.execute("INSERT INTO t VALUES (%s)", (k,))
    pair.kill9_primary()
    # Before the promotion no node accepts writes: the multi-host DSN finds none.
    with pytest.raises(psycopg.OperationalError):
        pair.connect().close()
    pair.promote()
    with pair.connect() as c:
        assert c.info.port != old_primary
        assert c.execute("SELECT count(*) FROM t").fetchone() == (500,)
    # The dead node comes back as the new standby, on its old port (until then a commit
    # on the new primary would wait: it has no synchronous standby); a second failover
    # then goes back to it.
    pair.rejoin()
    assert pair.standby.port == old_primary
    pair.sql("INSERT INTO t VALUES (500)")
    pair.sql("INSERT INTO t VALUES (501)")
    pair.failover()
    assert pair.primary.port == old_primary
    assert pair.sql("SELECT count(*) FROM t") == [(502,)]


def test_asynchronous_standby_does_not_hold_commits():
    """The counterpart of the two tests above: without synchronous_standby_names a
    COMMIT returns with the standby down, so a failover then could lose it."""
    with PgReplicaPair(conf={"synchronous_standby_names": "''"}) as p:
        p.sql("CREATE TABLE t(k int PRIMARY KEY)")
        # Asynchronous: the table itself may not have reached the standby yet. Wait for
        # it, so only the INSERT below is the write the failover can lose.
        wait_until(lambda: p.standby.sql("SELECT to_regclass('t') IS NOT NULL") == [(True,)],
                   what="the standby to replay CREATE TABLE")
        p.standby.stop()
        p.sql("INSERT INTO t VALUES (1)")      # returns: nobody waits for the standby
        p.kill9_primary()
        p.standby.start()
        p.promote()
        assert p.sql("SELECT count(*) FROM t") == [(0,)]   # the acknowledged row is gone

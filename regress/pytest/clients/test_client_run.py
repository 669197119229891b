"""Coordinator.run (clients/python/cotx/retry.py) on a real daemon and a real PostgreSQL:
a transaction refused with a RetryableError is rerun, any other error is not, the number
of retries is bounded, and the waits between attempts are random draws (injected here, so
no clock is involved) from an exponentially growing, capped window."""
import psycopg
import pytest
from cotx import Coordinator, RetryableError, TransactionAborted
from cotx.retry import backoff
from cotest.coord import make_daemon, nothing_prepared
from cotest.marks import requires_mysql_co


@pytest.fixture(scope="module")
def coord(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS runs(id int PRIMARY KEY, v int NOT NULL)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS runs(id int PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
    d = make_daemon(pg, mariadb)
    with d:
        yield Coordinator(d.url, d.token)


@pytest.fixture
def row(pg):
    pg.sql("DELETE FROM runs; INSERT INTO runs VALUES (1, 0)")


class Conflicting:
    """fn(tx) that adds 1 to the row in a PostgreSQL branch; its first `fail` attempts meet
    a concurrent update between their read and their write (a real 40001)."""

    def __init__(self, pg, fail):
        self.pg, self.fail, self.attempts = pg, fail, 0
        self.conn = pg.connect()

    def __call__(self, tx):
        self.attempts += 1
        with tx.branch(self.conn, "pg"):
            v = self.conn.execute("SELECT v FROM runs WHERE id = 1").fetchone()[0]
            if self.attempts <= self.fail:
                self.pg.sql("UPDATE runs SET v = v + 100 WHERE id = 1")   # another client wins
            self.conn.execute("UPDATE runs SET v = %s WHERE id = 1", (v + 1,))
        return f"attempt {self.attempts}"


def test_retryable_errors_are_retried_with_jittered_backoff(pg, mariadb, coord, row):
    fn, sleeps, draws = Conflicting(pg, fail=2), [], iter([0.5, 0.25])
    out = coord.run(fn, retries=5, base_delay=0.1, max_delay=10, sleep=sleeps.append, rand=lambda: next(draws))
    assert out == "attempt 3" and fn.attempts == 3
    assert sleeps == [0.5 * 0.1, 0.25 * 0.2]        # random share of base * 2**n
    assert pg.sql("SELECT v FROM runs WHERE id = 1") == [(201,)]   # two foreign updates + ours, once
    assert nothing_prepared(pg, mariadb)


def test_without_retries_the_refusal_surfaces(pg, coord, row):
    fn, sleeps = Conflicting(pg, fail=1), []
    with pytest.raises(RetryableError):
        coord.run(fn, retries=0, sleep=sleeps.append)
    assert fn.attempts == 1 and sleeps == []


def test_retries_are_bounded(pg, coord, row):
    fn, sleeps = Conflicting(pg, fail=99), []
    with pytest.raises(RetryableError):
        coord.run(fn, retries=3, sleep=sleeps.append)
    assert fn.attempts == 4 and len(sleeps) == 3


def test_other_errors_are_not_retried(pg, coord, row):
    conn, sleeps, attempts = pg.connect(), [], []

    def duplicate(tx):
        attempts.append(1)
        with tx.branch(conn, "pg"):
            conn.execute("INSERT INTO runs VALUES (1, 1)")       # unique violation: not retryable
    with pytest.raises(psycopg.errors.UniqueViolation):
        coord.run(duplicate, sleep=sleeps.append)

    def bug(tx):
        attempts.append(1)
        raise ValueError("application bug")
    with pytest.raises(ValueError):
        coord.run(bug, sleep=sleeps.append)
    assert len(attempts) == 2 and sleeps == []


@requires_mysql_co
def test_a_setup_refusal_is_not_retried(pg, mariadb, coord, row):
    """mysql_co refuses a REPEATABLE READ branch: retrying cannot cure that (cotx.refusals
    kind "mysql_co isolation"), so run() gives up at once with TransactionAborted."""
    pc, mc, sleeps, attempts = pg.connect(), mariadb.connect(), [], []

    def fn(tx):
        attempts.append(1)
        with tx.branch(pc, "pg"):
            pc.execute("UPDATE runs SET v = v + 1 WHERE id = 1")
        with tx.branch(mc, "my", isolation="REPEATABLE READ"):
            mc.cursor().execute("INSERT INTO runs VALUES (1, 1)")
    with pytest.raises(TransactionAborted) as ei:
        coord.run(fn, sleep=sleeps.append)
    assert not isinstance(ei.value, RetryableError) and "mysql_co" in str(ei.value)
    assert len(attempts) == 1 and sleeps == []
    assert pg.sql("SELECT v FROM runs WHERE id = 1") == [(0,)]
    assert mariadb.sql("SELECT count(*) FROM runs") == ((0,),)
    assert nothing_prepared(pg, mariadb)


def test_backoff_window_grows_and_is_capped():
    assert [backoff(n, 0.02, 0.1, lambda: 1.0) for n in range(5)] == [0.02, 0.04, 0.08, 0.1, 0.1]
    # Two clients refused by the same conflict draw different waits: no lockstep.
    assert backoff(2, 0.02, 1.0, lambda: 0.3) != backoff(2, 0.02, 1.0, lambda: 0.7)

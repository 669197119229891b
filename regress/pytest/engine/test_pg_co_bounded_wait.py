"""pg_co's bounded wait in rule B (pg_co.max_wait, default 5 ms) on real clusters: the
writer sleeps until the in-doubt reader is decided, then goes through (max_wait 0 refuses
it at once); a reader that stays in doubt past the bound gets the usual refusal. The
isolation spec pg_co_ext/test/specs/bounded_wait.spec has the outcome matrix; here each
test first sees the writer in pg_co's wait before the reader is decided."""
import threading
import time

import psycopg
import pytest
from psycopg import errors
from cotest.marks import requires_pg_co

pytestmark = [requires_pg_co, pytest.mark.usefixtures("pg_major")]


@pytest.fixture(scope="module")
def pg(pg_with_ext):
    return pg_with_ext


def rw_pair(server):
    """Two open serializable transactions with r -rw-> w on table k; r prepared (in doubt)."""
    server.sql("DROP TABLE IF EXISTS k")
    server.sql("CREATE TABLE k (id int PRIMARY KEY, v int)")
    server.sql("INSERT INTO k VALUES (1, 0), (2, 0)")
    r, w = server.connect(), server.connect()
    for c in (r, w):
        c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
    r.execute("SELECT v FROM k WHERE id = 1")
    r.execute("UPDATE k SET v = 1 WHERE id = 2")
    w.execute("UPDATE k SET v = 5 WHERE id = 1")
    r.execute("PREPARE TRANSACTION 'r'")
    return r, w


def commit_in_thread(conn):
    result = {}

    def run():
        try:
            conn.execute("COMMIT")
            result["w"] = "committed"
        except psycopg.Error as e:
            result["w"] = e.sqlstate

    t = threading.Thread(target=run)
    t.start()
    return t, result


def wait_until_in_pg_co_wait(server, pid, timeout=20):
    """Until backend `pid` sleeps in pg_co's bounded wait (a latch wait, event type Extension)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Extension'", (pid,)):
            return
        time.sleep(0.02)
    raise AssertionError("the writer never waited")


def stats(server):
    return server.sql("SELECT waits, wait_timeouts, refused_rule_b FROM co.stats")[0]


@pytest.mark.parametrize("max_wait", ["0", "60s"])
@pytest.mark.parametrize("outcome", ["COMMIT", "ROLLBACK"])
def test_writer_waits_for_the_decision_within_max_wait(pg, max_wait, outcome):
    """max_wait 0: refused at once, no wait counted. 60s: the writer waits, the decision
    releases it, it commits."""
    r, w = rw_pair(pg)
    w.execute(f"SET LOCAL pg_co.max_wait = '{max_wait}'")
    before = stats(pg)
    if max_wait == "0":
        with pytest.raises(errors.SerializationFailure, match="rule B"):
            w.execute("COMMIT")
        pg.sql(f"{outcome} PREPARED 'r'")
        assert stats(pg) == (before[0], before[1], before[2] + 1)
        return
    t, result = commit_in_thread(w)
    wait_until_in_pg_co_wait(pg, w.info.backend_pid)
    assert t.is_alive() and not result, "w must wait while r is in doubt"
    pg.sql(f"{outcome} PREPARED 'r'")
    t.join(20)
    assert result == {"w": "committed"}
    assert stats(pg) == (before[0] + 1, before[1], before[2])
    assert pg.sql("SELECT v FROM k WHERE id = 1") == [(5,)]


def test_default_bound_is_5ms(pg):
    """The module's server sets nothing: a new session shows the built-in default."""
    assert pg.sql("SHOW pg_co.max_wait") == [("5ms",)]


@pytest.mark.parametrize("max_wait", [None, "300ms"], ids=["default", "300ms"])
def test_blocker_still_in_doubt_after_max_wait_is_refused(pg, max_wait):
    """The bound, the default one too, is waited out (counted) before the refusal, whose
    DETAIL says so; max_wait 0 (above) refuses without waiting."""
    r, w = rw_pair(pg)
    if max_wait:
        w.execute(f"SET LOCAL pg_co.max_wait = '{max_wait}'")
    before = stats(pg)
    with pytest.raises(errors.SerializationFailure, match="rule B") as e:
        w.execute("COMMIT")
    assert "(pg_co.max_wait)" in (e.value.diag.message_detail or ""), e.value.diag.message_detail
    pg.sql("COMMIT PREPARED 'r'")
    assert stats(pg) == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert pg.sql("SELECT v FROM k WHERE id = 1") == [(0,)]

"""pg_co on real PostgreSQL clusters: the global anomalies that per-database SSI misses,
shown with pg_co off and refused with it on; restart, summarization, the check-to-prepare
race and rule C, on every supported PostgreSQL major. Isolation specs in pg_co_ext/test
cover the single-database rule matrix."""
import threading
import time

import psycopg
import pytest
from psycopg import errors
from cotest.marks import requires_pg_co
from cotest import PgServer
from cotest.servers import ServerError


# Every test runs on each PostgreSQL major (conftest.pg_major).
pytestmark = [requires_pg_co, pytest.mark.usefixtures("pg_major")]


@pytest.fixture(scope="module")
def two_pg(pg_major):
    """Two clusters, playing two services' databases (A: savings, B: checking)."""
    with PgServer() as a, PgServer() as b:
        for s in (a, b):
            s.sql("CREATE EXTENSION pg_co")
        yield a, b


def begin(server, pg_co_on=True):
    c = server.connect()
    c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
    if not pg_co_on:
        c.execute("SET LOCAL pg_co.enabled = off")
    return c


def rw_pair(server, w_value=1):
    """Table k and two open transactions with r -rw-> w: r read row 1 (and wrote row 2, so
    it is not read-only), w overwrote row 1."""
    server.sql("DROP TABLE IF EXISTS k")
    server.sql("CREATE TABLE k (id int PRIMARY KEY, v int)")
    server.sql("INSERT INTO k VALUES (1, 0), (2, 0)")
    r, w = begin(server), begin(server)
    r.execute("SELECT v FROM k WHERE id = 1")
    r.execute("UPDATE k SET v = 1 WHERE id = 2")
    w.execute("UPDATE k SET v = %s WHERE id = 1", (w_value,))
    return r, w


def prepare_in_thread(conn, gid):
    """Starts PREPARE TRANSACTION on another thread; returns (thread, result) where
    result[gid] becomes "prepared" or the SQLSTATE of the refusal."""
    result = {}

    def run():
        try:
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
            result[gid] = "prepared"
        except psycopg.Error as e:
            result[gid] = e.sqlstate

    t = threading.Thread(target=run)
    t.start()
    return t, result


def reset_accounts(a, b):
    for s, name in ((a, "savings"), (b, "checking")):
        s.sql(f"DROP TABLE IF EXISTS {name}")
        s.sql(f"CREATE TABLE {name} (owner text PRIMARY KEY, bal int NOT NULL)")
        s.sql(f"INSERT INTO {name} VALUES ('alice', 50)")


def withdraw_reads(a_conn, b_conn):
    sav = a_conn.execute("SELECT bal FROM savings WHERE owner = 'alice'").fetchone()[0]
    chk = b_conn.execute("SELECT bal FROM checking WHERE owner = 'alice'").fetchone()[0]
    return sav + chk


def run_overdraft(a, b, pg_co_on):
    """Two global withdrawals of 80 (total 100): each reads both balances, debits one.
    Serially the second sees total 20 and refuses; interleaved, both may succeed."""
    reset_accounts(a, b)
    t1a, t1b, t2a, t2b = begin(a, pg_co_on), begin(b, pg_co_on), begin(a, pg_co_on), begin(b, pg_co_on)
    assert withdraw_reads(t1a, t1b) - 80 >= 0
    assert withdraw_reads(t2a, t2b) - 80 >= 0
    t1a.execute("UPDATE savings SET bal = bal - 80 WHERE owner = 'alice'")
    t2b.execute("UPDATE checking SET bal = bal - 80 WHERE owner = 'alice'")
    refused = []
    for gid, conns in (("t1", (t1a, t1b)), ("t2", (t2a, t2b))):
        try:
            for c in conns:
                c.execute(f"PREPARE TRANSACTION '{gid}'")
        except errors.SerializationFailure as e:
            refused.append((gid, e))
            for c in conns:
                c.rollback() if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE else None
    for gid in ("t1", "t2"):
        outcome = "ROLLBACK" if gid in [r[0] for r in refused] else "COMMIT"
        for s in (a, b):
            if s.sql("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)):
                s.sql(f"{outcome} PREPARED '{gid}'")
    for c in (t1a, t1b, t2a, t2b):
        c.close()
    total = a.sql("SELECT bal FROM savings")[0][0] + b.sql("SELECT bal FROM checking")[0][0]
    return total, refused


def test_overdraft_anomaly_with_pg_co_off(two_pg):
    total, refused = run_overdraft(*two_pg, pg_co_on=False)
    assert refused == []
    assert total == -60, "both withdrawals committed: the total went negative"


def test_overdraft_refused_with_pg_co_on(two_pg):
    total, refused = run_overdraft(*two_pg, pg_co_on=True)
    assert [gid for gid, _ in refused] == ["t2"]
    err = refused[0][1]
    assert err.sqlstate == "40001"
    assert "rule A" in err.diag.message_primary
    assert "gid 't1'" in err.diag.message_detail, err.diag.message_detail
    assert total == 20


def test_refused_prepare_touches_nothing_else(two_pg):
    a, _ = two_pg
    a.sql("DROP TABLE IF EXISTS other_t; CREATE TABLE other_t (id int)")
    r, w = rw_pair(a)
    other = begin(a)
    other.execute("INSERT INTO other_t VALUES (3)")
    w.execute("PREPARE TRANSACTION 'w_ok'")
    with pytest.raises(errors.SerializationFailure):
        r.execute("PREPARE TRANSACTION 'r_refused'")
    other.execute("COMMIT")
    a.sql("COMMIT PREPARED 'w_ok'")
    assert a.sql("SELECT id, v FROM k ORDER BY id") == [(1, 1), (2, 0)]
    assert a.sql("SELECT id FROM other_t") == [(3,)]
    assert a.sql("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]


@pytest.mark.parametrize("pg_co_on", [False, True])
def test_recovered_prepared_transaction_still_blocks(pg_co_on):
    """After a restart the prepared reader is restored from its state file; a writer of
    what it read must still not commit before the decision."""
    with PgServer() as s:
        s.sql("CREATE TABLE k (id int PRIMARY KEY, v int)")
        s.sql("INSERT INTO k VALUES (1, 0), (2, 0)")
        r = begin(s)
        r.execute("SELECT v FROM k WHERE id = 1")
        r.execute("UPDATE k SET v = 1 WHERE id = 2")
        r.execute("PREPARE TRANSACTION 'r'")
        r.close()
        s.restart()
        w = begin(s, pg_co_on)
        w.execute("UPDATE k SET v = 1 WHERE id = 1")
        if pg_co_on:
            with pytest.raises(errors.SerializationFailure):
                w.execute("COMMIT")
        else:
            try:
                w.execute("COMMIT")
                committed = True
            except errors.SerializationFailure:
                committed = False  # PostgreSQL itself may be conservative after recovery
            assert committed, "without pg_co the writer commits while the reader is in doubt"
        s.sql("COMMIT PREPARED 'r'")


@pytest.mark.parametrize("skip_marker", [True, False])
def test_check_to_prepare_race_is_closed_by_marker(skip_marker):
    """r -rw-> w. r passes its check and pauses before PostgreSQL's own prepare step; w
    checks in that window. Without the marker both get through; with it w is refused."""
    with PgServer() as s:
        r, w = rw_pair(s)
        r.execute("SET LOCAL pg_co.test_pause_after_check_ms = 3000")
        if skip_marker:
            r.execute("SET LOCAL pg_co.test_skip_marker = on")
        t, result = prepare_in_thread(r, "r")
        # r's PREPARE is running; its check takes microseconds, then it sleeps 3 s.
        deadline = time.time() + 20
        while not s.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND state = 'active' AND query LIKE 'PREPARE%%'",
                        (r.info.backend_pid,)):
            assert time.time() < deadline, "r's PREPARE never started"
            time.sleep(0.01)
        # Kept: nothing shows that r's check has passed (the pause is a pg_usleep, no wait
        # event); the check takes microseconds, so 0.3 s puts w well inside r's 3 s window.
        time.sleep(0.3)
        try:
            w.execute("PREPARE TRANSACTION 'w'")
            result["w"] = "prepared"
        except psycopg.Error as e:
            result["w"] = e.sqlstate
        t.join()
        if skip_marker:
            assert result == {"r": "prepared", "w": "prepared"}, "the race lets both through"
        else:
            assert result == {"r": "prepared", "w": "40001"}
        for gid in ("r", "w"):
            if s.sql("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)):
                s.sql(f"ROLLBACK PREPARED '{gid}'")


@pytest.mark.parametrize("pg_co_on", [False, True])
def test_summarized_conflicts_refuse_prepare(pg_co_on, tiny_ssi_pool):
    """A tiny SSI pool makes PostgreSQL fold committed transactions (and T's out-edges to
    them) into a summary. pg_co cannot see those edges any more: it refuses T's prepare."""
    with PgServer(conf=tiny_ssi_pool) as s:
        s.sql("CREATE TABLE k (id int PRIMARY KEY, v int)")
        s.sql("INSERT INTO k SELECT g, 0 FROM generate_series(1, 400) g")
        t = begin(s, pg_co_on)
        t.execute("SELECT sum(v) FROM k")
        t.execute("UPDATE k SET v = v WHERE id = 0")
        with s.connect() as c:
            for i in range(1, 201):
                c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                c.execute("UPDATE k SET v = v + 1 WHERE id = %s", (i,))
                c.execute("COMMIT")
        if pg_co_on:
            with pytest.raises(errors.SerializationFailure, match="summarized conflicts"):
                t.execute("PREPARE TRANSACTION 't'")
        else:
            t.execute("PREPARE TRANSACTION 't'")
            s.sql("ROLLBACK PREPARED 't'")


@pytest.mark.parametrize("rule_c", [False, True])
def test_rule_c_local_reader_of_in_doubt_write(two_pg, rule_c):
    """The rule C schedule of docs/pg_co.md. Y writes y at A and z at B; G writes x at A and reads
    z at B after Y committed there, so Y -> G. A local reader L at A sees G's x but not
    Y's y (Y still in doubt at A): L -> Y -> G -> L, a cycle no serial order explains."""
    a, b = two_pg
    a.sql("DROP TABLE IF EXISTS r; CREATE TABLE r (k text PRIMARY KEY, v int); INSERT INTO r VALUES ('x', 0), ('y', 0)")
    b.sql("DROP TABLE IF EXISTS r; CREATE TABLE r (k text PRIMARY KEY, v int); INSERT INTO r VALUES ('z', 0)")
    ya, yb = begin(a), begin(b)
    ya.execute("UPDATE r SET v = 1 WHERE k = 'y'")
    ya.execute("PREPARE TRANSACTION 'Y'")
    ga = begin(a)
    ga.execute("UPDATE r SET v = 1 WHERE k = 'x'")
    ga.execute("PREPARE TRANSACTION 'G'")
    yb.execute("UPDATE r SET v = 1 WHERE k = 'z'")
    yb.execute("PREPARE TRANSACTION 'Y'")
    b.sql("COMMIT PREPARED 'Y'")  # Y decided commit; delivered to B first
    gb = begin(b)
    assert gb.execute("SELECT v FROM r WHERE k = 'z'").fetchone() == (1,)  # G saw Y
    gb.execute("PREPARE TRANSACTION 'G'")
    b.sql("COMMIT PREPARED 'G'")
    a.sql("COMMIT PREPARED 'G'")  # G's commit reaches A before Y's
    lc = a.connect()
    lc.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
    if not rule_c:
        lc.execute("SET LOCAL pg_co.rule_c = off")
    seen = dict(lc.execute("SELECT k, v FROM r ORDER BY k").fetchall())
    assert seen == {"x": 1, "y": 0}, "L sees G's write but not Y's"
    try:
        lc.execute("COMMIT")
        committed = True
    except errors.SerializationFailure as e:
        committed = False
        assert "rule C" in e.diag.message_primary
    a.sql("COMMIT PREPARED 'Y'")
    for c in (ya, yb, ga, gb, lc):
        c.close()
    assert committed == (not rule_c)


def _wait_until_lock_wait(server, pid, timeout=20):
    """Until backend `pid` sleeps on a transaction lock (the in-doubt transaction's)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.sql("SELECT 1 FROM pg_locks WHERE pid = %s AND locktype = 'transactionid' AND NOT granted", (pid,)):
            return
        time.sleep(0.02)
    raise AssertionError("the writer never waited")


@pytest.mark.parametrize("outcome", ["COMMIT", "ROLLBACK"])
def test_wait_mode_waits_for_in_doubt_reader(outcome):
    """Rule B in wait mode: the writer sleeps on the in-doubt reader's lock until the
    decision arrives, then goes on; the stats count the wait."""
    with PgServer() as s:
        s.sql("CREATE EXTENSION pg_co")
        r, w = rw_pair(s, w_value=5)
        w.execute("SET LOCAL pg_co.conflict_action = wait")
        r.execute("PREPARE TRANSACTION 'r'")
        waits_before = s.sql("SELECT waits FROM co.stats")[0][0]
        t, result = prepare_in_thread(w, "w")
        _wait_until_lock_wait(s, w.info.backend_pid)
        assert t.is_alive() and "w" not in result, "w must wait while r is in doubt"
        s.sql(f"{outcome} PREPARED 'r'")
        t.join(20)
        assert result == {"w": "prepared"}
        s.sql("COMMIT PREPARED 'w'")
        assert s.sql("SELECT waits FROM co.stats")[0][0] == waits_before + 1
        assert s.sql("SELECT v FROM k WHERE id = 1") == [(5,)]


def test_ssi_layout_mismatch_stops_the_server():
    """pg_co checks at start-up that the server lays out SSI's shared structs as the headers
    it was built with (docs/pg_co.md, "Minor releases"). pg_co.test_layout_skew plays
    headers that differ: the server refuses to start and says why; every other test here
    starts with the real layout."""
    s = PgServer(conf={"pg_co.test_layout_skew": 8})
    try:
        with pytest.raises(ServerError):
            s.start()
        assert "pg_co cannot run on this server" in s.log_tail(60), s.log_tail(60)
    finally:
        s.destroy()


def test_half_loaded_extension_is_refused_loudly():
    """CREATE EXTENSION without shared_preload_libraries must fail, naming the fix."""
    with PgServer(preload=False) as s:
        with pytest.raises(errors.ObjectNotInPrerequisiteState, match="shared_preload_libraries"):
            s.sql("CREATE EXTENSION pg_co")
        assert "commitment ordering is NOT enforced" in s.log_tail(200)


def test_log_vetoes_writes_refusals_to_the_server_log(two_pg):
    a, _ = two_pg
    a.sql("ALTER SYSTEM SET pg_co.log_vetoes = on")
    a.sql("SELECT pg_reload_conf()")
    try:
        r, w = rw_pair(a)
        w.execute("PREPARE TRANSACTION 'logged_w'")
        with pytest.raises(errors.SerializationFailure):
            r.execute("PREPARE TRANSACTION 'logged_r'")
        a.sql("COMMIT PREPARED 'logged_w'")
        assert "LOG:  pg_co refused PREPARE TRANSACTION: commitment ordering rule A" in a.log_tail(50)
    finally:
        a.sql("ALTER SYSTEM RESET pg_co.log_vetoes")
        a.sql("SELECT pg_reload_conf()")


def test_observe_only_counts_what_it_would_refuse(two_pg):
    """pg_co.observe_only: the rule-A schedule of the test above: both prepare and commit;
    co.stats counts the would-be refusal and the log names both transactions."""
    a, _ = two_pg
    a.sql("ALTER SYSTEM SET pg_co.observe_only = on")
    a.sql("SELECT pg_reload_conf()")
    try:
        before = a.sql("SELECT observed_rule_a, refused_rule_a FROM co.stats")[0]
        r, w = rw_pair(a)
        w.execute("PREPARE TRANSACTION 'observed_w'")
        r.execute("PREPARE TRANSACTION 'observed_r'")     # rule A would refuse it
        for gid in ("observed_w", "observed_r"):
            a.sql(f"COMMIT PREPARED '{gid}'")
        assert a.sql("SELECT observed_rule_a, refused_rule_a FROM co.stats")[0] == (before[0] + 1, before[1])
        log = a.log_tail(50)
        assert "pg_co observe-only, not refused: pg_co refused PREPARE TRANSACTION: commitment ordering rule A" in log
        assert "gid 'observed_r'" in log and "gid='observed_w'" in log, log
    finally:
        a.sql("ALTER SYSTEM RESET pg_co.observe_only")
        a.sql("SELECT pg_reload_conf()")

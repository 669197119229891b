"""The one refusal classifier (clients/python/cotx/refusals.py): every known engine message
maps to its kind and retryability (the table below, also checked against the engines'
sources), and the errors real servers raise map the same way: pg_co's rules A, B, C and
its preconditions, PostgreSQL's SSI, lock and deadlock errors, mysql_co's refusals and
MariaDB's lock, deadlock and XA errors."""
import threading
from pathlib import Path

import psycopg
import pymysql
import pytest
from cotx import PrepareRefused
from cotx.refusals import KINDS, classify
from cotest.servers import pg_co_installed
from cotest.marks import requires_mysql_co, requires_pg_co

ROOT = Path(__file__).resolve().parents[3]

# (sqlstate, errno, message, kind). Retryability comes from KINDS, checked separately.
TABLE = [
    ("40001", None, "pg_co refused PREPARE TRANSACTION: commitment ordering rule A", "pg_co rule A"),
    ("40001", None, "pg_co refused COMMIT: commitment ordering rule A", "pg_co rule A"),
    ("40001", None, "pg_co refused PREPARE TRANSACTION: commitment ordering rule A (summarized conflicts)",
     "pg_co rule A (summarized)"),
    ("40001", None, "pg_co refused PREPARE TRANSACTION: commitment ordering rule B", "pg_co rule B"),
    ("40001", None, "pg_co refused COMMIT: commitment ordering rule C", "pg_co rule C"),
    ("40001", None, "pg_co refused COMMIT: rule S (a reader PostgreSQL summarized)", "pg_co rule S"),
    ("40001", None, "pg_co refused COMMIT of a global decision (co.decide): commitment ordering rule A", "pg_co rule A"),
    ("40001", None, "pg_co refused COMMIT of a global decision (co.decide): commitment ordering rule B", "pg_co rule B"),
    ("40001", None, "pg_co refused co.decide: global transaction 'n1.x-1' is already decided", "pg_co already decided"),
    ("25000", None, "pg_co refused co.decide: the transaction is not SERIALIZABLE", "pg_co not serializable"),
    ("25000", None, "pg_co refused co.decide: the transaction is READ ONLY", "pg_co read only"),
    ("55P03", None, "pg_co: lock_timeout expired while waiting for an in-doubt transaction (rule B)",
     "pg_co rule B wait timeout"),
    ("25000", None, "pg_co refused PREPARE TRANSACTION: the transaction is not SERIALIZABLE", "pg_co not serializable"),
    ("25000", None, "pg_co refused PREPARE TRANSACTION: the transaction is READ ONLY", "pg_co read only"),
    ("40001", None, "could not serialize access due to read/write dependencies among transactions",
     "pg serialization failure"),
    ("40001", None, "could not serialize access due to concurrent update", "pg concurrent update"),
    ("40P01", None, "deadlock detected", "pg deadlock"),
    ("55P03", None, "canceling statement due to lock timeout", "pg lock timeout"),
    ("55P03", None, 'could not obtain lock on row in relation "acct"', "pg lock timeout"),
    ("57014", None, "canceling statement due to statement timeout", "pg cancelled"),
    ("53200", None, "maximum number of prepared transactions reached", "pg prepared transactions exhausted"),
    ("23505", None, 'duplicate key value violates unique constraint "acct_pkey"', "other"),
    (None, 1402, "mysql_co: XA PREPARE refused by the restart gate: 1 XA branch(es) recovered at server "
                 "start are still undecided ('r1'); their read locks were lost in the restart.", "mysql_co restart gate"),
    (None, 1402, "mysql_co: XA COMMIT ... ONE PHASE refused: this XA branch ran at REPEATABLE READ, but "
                 "commitment ordering needs SERIALIZABLE", "mysql_co isolation"),
    (None, 1402, "XA_RBROLLBACK: Transaction branch was rolled back", "my XA rollback"),
    (None, 1613, "XA_RBTIMEOUT: Transaction branch was rolled back: took too long", "my XA rollback"),
    (None, 1614, "XA_RBDEADLOCK: Transaction branch was rolled back: deadlock was detected", "my XA rollback"),
    (None, 1213, "Deadlock found when trying to get lock; try restarting transaction", "my deadlock"),
    (None, 1205, "Lock wait timeout exceeded; try restarting transaction", "my lock wait timeout"),
    (None, 1317, "Query execution was interrupted", "my interrupted"),
    (None, 1062, "Duplicate entry '1' for key 'PRIMARY'", "other"),
    # Text only: an abort reason recorded by the coordinator.
    (None, None, "prepare refused: pg: pg_co refused PREPARE TRANSACTION: commitment ordering rule B", "pg_co rule B"),
    (None, None, "my: mysql_co: XA PREPARE refused by the restart gate: 2 XA branch(es) ...", "mysql_co restart gate"),
    (None, None, "could not serialize access due to read/write dependencies among transactions",
     "pg serialization failure"),
    (None, None, "Deadlock found when trying to get lock; try restarting transaction", "my deadlock"),
    (None, None, "connection refused", "other"),
]

# The fragments the classifier keys on, as the engines spell them.
SOURCES = {
    "pg_co_ext/src/refusal.rs": ["pg_co refused {}: commitment ordering rule A", "rule A (summarized conflicts)",
                                 "commitment ordering rule B", "pg_co refused COMMIT: commitment ordering rule C",
                                 "the transaction is not SERIALIZABLE", "the transaction is READ ONLY",
                                 "pg_co: lock_timeout expired while waiting",
                                 "COMMIT of a global decision (co.decide)", "is already decided"],
    # The refusal texts live beside the rules (co_rules::message); the plugin raises them.
    "mysql_co_plugin/mysql_co_rules.h": ['"mysql_co: " + what + " refused by the restart gate',
                                         '"mysql_co: " + what + " refused: this XA branch ran at "',
                                         '" This branch was rolled back."'],
    "mysql_co_plugin/mysql_co.cc": ["ER_XA_RBROLLBACK"],
}


@pytest.mark.parametrize("state,errno,message,kind", TABLE, ids=[f"{r[3]}:{r[2][:30]}" for r in TABLE])
def test_known_messages(state, errno, message, kind):
    r = classify(sqlstate=state, errno=errno, message=message)
    assert (r.kind, r.retryable, r.engine) == (kind, *reversed(KINDS[kind])), r


def test_table_covers_every_kind():
    assert {row[3] for row in TABLE} == set(KINDS)


def test_retryability_of_kinds():
    # Conflicts with other transactions are retryable; a wrong setup or a cancel is not.
    assert {k for k, (_, retry) in KINDS.items() if not retry} == {
        "pg_co not serializable", "pg_co read only", "pg cancelled", "mysql_co isolation", "my interrupted", "other"}


@pytest.mark.parametrize("path", sorted(SOURCES))
def test_engines_still_say_it_so(path):
    text = (ROOT / path).read_text()
    missing = [f for f in SOURCES[path] if f not in text]
    assert not missing, f"{path} no longer raises these texts; update cotx/refusals.py and TABLE: {missing}"


def test_wrapped_errors_classify_by_their_cause():
    class Driver(Exception):
        sqlstate = "40001"
    cause = Driver("pg_co refused PREPARE TRANSACTION: commitment ordering rule A")
    err = PrepareRefused("g1", f"pg: {cause}")
    err.__cause__ = cause
    assert classify(err).kind == "pg_co rule A"
    assert classify(pymysql.err.OperationalError(1213, "Deadlock found")).kind == "my deadlock"
    assert classify(ValueError(1213)).kind == "other"     # a bare int argument is no errno
    # PyMySQL errors carry MariaDB's SQLSTATE too (40001 for a deadlock): the errno decides.
    e = pymysql.err.OperationalError(1205, "Lock wait timeout exceeded; try restarting transaction")
    e.sqlstate = "HY000"
    assert classify(e).kind == "my lock wait timeout"


# --- real servers -------------------------------------------------------------------------

def _pg_table(pg):
    pg.sql("DROP TABLE IF EXISTS acct; CREATE TABLE acct (id int PRIMARY KEY, bal int); "
           "INSERT INTO acct VALUES (1, 100), (2, 100)")


@pytest.fixture
def pgs(pg):
    """session(*stmts): a new autocommit session on PostgreSQL that ran `stmts`. Sessions
    are closed and prepared transactions rolled back after the test."""
    if pg_co_installed():
        pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")
    _pg_table(pg)
    conns = []

    def session(*stmts):
        c = pg.connect()
        conns.append(c)
        for s in stmts:
            c.execute(s)
        return c
    yield session
    for c in conns:
        c.close()
    for (gid,) in pg.sql("SELECT gid FROM pg_prepared_xacts"):
        pg.sql(f"ROLLBACK PREPARED '{gid}'")


@pytest.fixture
def mys(mariadb):
    """Like pgs, on MariaDB (sessions SERIALIZABLE unless told otherwise)."""
    mariadb.sql("DROP TABLE IF EXISTS acct")
    mariadb.sql("CREATE TABLE acct (id INT PRIMARY KEY, bal INT) ENGINE=InnoDB")
    mariadb.sql("INSERT INTO acct VALUES (1, 100), (2, 100)")
    conns = []

    def session(*stmts, isolation="SERIALIZABLE"):
        c = mariadb.connect()
        conns.append(c)
        run(c, f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation}", *stmts)
        return c
    yield session
    for c in conns:
        try:
            c.close()
        except pymysql.MySQLError:
            pass  # the server was restarted under it
    for row in mariadb.sql("XA RECOVER"):
        mariadb.sql(f"XA ROLLBACK '{row[3].decode()}'")


def run(conn, *stmts):
    for s in stmts:
        if isinstance(conn, pymysql.connections.Connection):
            with conn.cursor() as cur:
                cur.execute(s)
        else:
            conn.execute(s)


def raised(conn, stmt):
    with pytest.raises((psycopg.Error, pymysql.MySQLError)) as ei:
        run(conn, stmt)
    return ei.value


def deadlock(a, a_stmt, b, b_stmt):
    """a and b each hold a row lock the other's statement wants: both statements run at
    once (threads), the engine breaks the cycle; returns (victim's session, its error)."""
    errors = []

    def go(conn, stmt):
        try:
            run(conn, stmt)
        except Exception as e:  # noqa: BLE001 - collected
            errors.append((conn, e))
    threads = [threading.Thread(target=go, args=x) for x in ((a, a_stmt), (b, b_stmt))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(errors) == 1, errors
    return errors[0]


def assert_kind(e, kind):
    r = classify(e)
    assert r.kind == kind, f"{type(e).__name__} {getattr(e, 'sqlstate', None)} {e}"
    assert r.retryable == KINDS[kind][1]
    # Wrapped the way the client wraps it, it means the same.
    w = PrepareRefused("g", str(e))
    w.__cause__ = e
    assert classify(w) == r


SER = "BEGIN ISOLATION LEVEL SERIALIZABLE"


@requires_pg_co
def test_pg_co_rule_a(pgs):
    r = pgs(SER, "SELECT bal FROM acct WHERE id = 1", "UPDATE acct SET bal = bal + 1 WHERE id = 2")
    pgs(SER, "UPDATE acct SET bal = bal - 10 WHERE id = 1", "PREPARE TRANSACTION 'w'")
    assert_kind(raised(r, "PREPARE TRANSACTION 'r'"), "pg_co rule A")


@requires_pg_co
def test_pg_co_rule_b_and_wait_mode_timeout(pgs):
    pgs(SER, "SELECT bal FROM acct WHERE id = 1", "UPDATE acct SET bal = bal + 1 WHERE id = 2",
        "PREPARE TRANSACTION 'r'")
    w = pgs(SER, "UPDATE acct SET bal = bal - 10 WHERE id = 1")
    assert_kind(raised(w, "PREPARE TRANSACTION 'w'"), "pg_co rule B")
    # Wait mode: the wait on the in-doubt reader's lock ends with PostgreSQL's own lock
    # timeout (pg_co's "lock_timeout expired" is for peers it polls: in the table above).
    w = pgs(SER, "SET LOCAL pg_co.conflict_action = 'wait'", "SET LOCAL lock_timeout = '100ms'",
            "UPDATE acct SET bal = bal - 10 WHERE id = 1")
    assert_kind(raised(w, "PREPARE TRANSACTION 'w'"), "pg lock timeout")


@requires_pg_co
def test_pg_co_rule_c(pgs):
    pgs(SER, "UPDATE acct SET bal = 0 WHERE id = 2", "PREPARE TRANSACTION 'y'")
    pgs(SER, "UPDATE acct SET bal = 0 WHERE id = 1", "PREPARE TRANSACTION 'g'", "COMMIT PREPARED 'g'")
    reader = pgs(SER, "SELECT id, bal FROM acct")     # sees g's write, misses in-doubt y's
    assert_kind(raised(reader, "COMMIT"), "pg_co rule C")


@requires_pg_co
def test_pg_co_preconditions(pgs):
    rc = pgs("BEGIN ISOLATION LEVEL READ COMMITTED", "UPDATE acct SET bal = 1 WHERE id = 1")
    assert_kind(raised(rc, "PREPARE TRANSACTION 'rc'"), "pg_co not serializable")
    ro = pgs(SER + " READ ONLY", "SELECT * FROM acct")
    assert_kind(raised(ro, "PREPARE TRANSACTION 'ro'"), "pg_co read only")


def test_pg_serialization_failures(pgs):
    a = pgs(SER, "SELECT sum(bal) FROM acct", "UPDATE acct SET bal = bal - 150 WHERE id = 1")
    pgs(SER, "SELECT sum(bal) FROM acct", "UPDATE acct SET bal = bal - 150 WHERE id = 2", "COMMIT")
    assert_kind(raised(a, "COMMIT"), "pg serialization failure")          # write skew
    a = pgs(SER, "SELECT bal FROM acct WHERE id = 1")
    pgs("UPDATE acct SET bal = 7 WHERE id = 1")
    assert_kind(raised(a, "UPDATE acct SET bal = 8 WHERE id = 1"), "pg concurrent update")


def test_pg_lock_timeout_and_cancel(pgs):
    pgs("BEGIN", "UPDATE acct SET bal = 1 WHERE id = 1")
    b = pgs("SET lock_timeout = '100ms'")
    assert_kind(raised(b, "UPDATE acct SET bal = 2 WHERE id = 1"), "pg lock timeout")
    run(b, "SET lock_timeout = 0", "SET statement_timeout = '100ms'")
    assert_kind(raised(b, "UPDATE acct SET bal = 2 WHERE id = 1"), "pg cancelled")


@pytest.mark.parametrize("sessions,kind", [("pgs", "pg deadlock"), ("mys", "my deadlock")])
def test_deadlock(request, sessions, kind):
    session = request.getfixturevalue(sessions)
    a = session("BEGIN", "UPDATE acct SET bal = 1 WHERE id = 1")
    b = session("BEGIN", "UPDATE acct SET bal = 2 WHERE id = 2")
    _, e = deadlock(a, "UPDATE acct SET bal = 1 WHERE id = 2", b, "UPDATE acct SET bal = 2 WHERE id = 1")
    assert_kind(e, kind)


@requires_mysql_co
def test_mysql_co_isolation(mys):
    a = mys("XA START 'a'", "SELECT bal FROM acct WHERE id = 1", "UPDATE acct SET bal = 1 WHERE id = 2",
            "XA END 'a'", isolation="REPEATABLE READ")
    assert_kind(raised(a, "XA PREPARE 'a'"), "mysql_co isolation")


def test_my_lock_wait_timeout(mys):
    mys("BEGIN", "UPDATE acct SET bal = 1 WHERE id = 1")
    b = mys("SET SESSION innodb_lock_wait_timeout = 1")
    assert_kind(raised(b, "UPDATE acct SET bal = 2 WHERE id = 1"), "my lock wait timeout")


def test_my_deadlock_inside_xa_branches(mys):
    # MariaDB 10.11 reports the same errno there (not XA_RBDEADLOCK).
    a = mys("XA START 'a'", "UPDATE acct SET bal = 1 WHERE id = 1")
    b = mys("XA START 'b'", "UPDATE acct SET bal = 2 WHERE id = 2")
    _, e = deadlock(a, "UPDATE acct SET bal = 1 WHERE id = 2", b, "UPDATE acct SET bal = 2 WHERE id = 1")
    assert_kind(e, "my deadlock")


@requires_mysql_co
def test_mysql_co_restart_gate(mys, mariadb):
    """Last: it kills and restarts the module's MariaDB."""
    mys("XA START 'r1'", "SELECT bal FROM acct WHERE id = 1", "UPDATE acct SET bal = 1 WHERE id = 2",
        "XA END 'r1'", "XA PREPARE 'r1'")
    mariadb.kill9()
    mariadb.start()
    b = mys("XA START 'n1'", "UPDATE acct SET bal = 7 WHERE id = 1", "XA END 'n1'")
    assert_kind(raised(b, "XA PREPARE 'n1'"), "mysql_co restart gate")

"""mysql_co end to end: two real PyMySQL sessions against real MariaDB servers.

Every rule is shown twice: the anomaly on a server without mysql_co (or with the rule
off), the refusal on a server with it.
"""
import threading
import time

import pymysql
import pytest

from cotest import MariaServer
from cotest.servers import mysql_co_installed

pytestmark = pytest.mark.skipif(not mysql_co_installed(),
                                reason="mysql_co is not installed (run scripts/build.sh)")

XA_RBROLLBACK = 1402
LOCK_WAIT_TIMEOUT = 1205


@pytest.fixture(scope="module")
def plain():
    """MariaDB without mysql_co."""
    with MariaServer(plugin=False) as s:
        yield s


@pytest.fixture(scope="module")
def co():
    """MariaDB with mysql_co loaded at startup (plugin-load-add)."""
    with MariaServer(plugin=True) as s:
        yield s


_n = 0


def fresh_table(server) -> str:
    global _n
    _n += 1
    name = f"t{_n}"
    server.sql(f"CREATE TABLE {name} (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
    server.sql(f"INSERT INTO {name} VALUES (1, 0), (2, 0)")
    return name


def session(server, isolation="REPEATABLE READ"):
    c = server.connect()
    with c.cursor() as cur:
        cur.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation}")
        cur.execute("SET SESSION innodb_lock_wait_timeout = 5")
    return c


def run(conn, *stmts):
    with conn.cursor() as cur:
        for s in stmts:
            cur.execute(s)
        return cur.fetchall() if cur.description else None


def branch_reads_row1_writes_row2(conn, t, xid, write=True):
    stmts = [f"XA START '{xid}'", f"SELECT v FROM {t} WHERE id = 1"]
    if write:
        stmts.append(f"UPDATE {t} SET v = v + 1 WHERE id = 2")
    stmts.append(f"XA END '{xid}'")
    run(conn, *stmts)


class Writer(threading.Thread):
    """Second session: UPDATE row 1 in autocommit; records when it committed."""

    def __init__(self, server, t):
        super().__init__(daemon=True)
        self.conn = session(server)
        self.t = t
        self.done_at = None
        self.error = None

    def run(self):
        try:
            run(self.conn, f"UPDATE {self.t} SET v = 100 WHERE id = 1")
            self.done_at = time.monotonic()
        except pymysql.MySQLError as e:
            self.error = e


def writer_commits_while_branch_prepared(server, t, branch) -> bool:
    """Start the writer while `branch` is prepared; True if it committed before the
    branch was decided (the CO violation), False if it had to wait for XA COMMIT."""
    w = Writer(server, t)
    w.start()
    committed_first = None
    deadline = time.monotonic() + 4      # the writer's lock wait timeout is 5 s
    while committed_first is None and time.monotonic() < deadline:
        if w.done_at is not None:
            committed_first = True
        elif server.sql("SELECT COUNT(*) FROM information_schema.innodb_lock_waits")[0][0]:
            committed_first = False      # InnoDB shows the writer waiting for a lock
        else:
            time.sleep(0.02)
    assert committed_first is not None, "writer neither committed nor waited for a lock"
    decided_at = time.monotonic()
    run(branch, "XA COMMIT 'a'")
    w.join(10)
    assert w.error is None, w.error
    assert w.done_at is not None
    w.conn.close()
    if not committed_first:
        assert w.done_at >= decided_at
    return committed_first


def test_rr_branch_anomaly_without_plugin(plain):
    t = fresh_table(plain)
    a = session(plain)
    branch_reads_row1_writes_row2(a, t, "a")
    run(a, "XA PREPARE 'a'")  # accepted: nothing checks the isolation level
    # a read row 1 (a -rw-> w), yet w commits while a is still in doubt.
    assert writer_commits_while_branch_prepared(plain, t, a) is True
    a.close()


def test_rr_branch_refused_with_plugin(co):
    t = fresh_table(co)
    a = session(co)
    branch_reads_row1_writes_row2(a, t, "a")
    with pytest.raises(pymysql.MySQLError) as e:
        run(a, "XA PREPARE 'a'")
    assert e.value.args[0] == XA_RBROLLBACK
    assert "mysql_co: XA PREPARE refused" in e.value.args[1]
    assert "SERIALIZABLE" in e.value.args[1]
    assert co.sql(f"SELECT v FROM {t} WHERE id = 2") == ((0,),)   # rolled back
    assert run(a, "XA RECOVER") == ()
    a.close()


@pytest.mark.parametrize("write", [True, False], ids=["read-write", "read-only"])
def test_serializable_branch_keeps_read_lock_until_commit(co, write):
    t = fresh_table(co)
    a = session(co, "SERIALIZABLE")
    branch_reads_row1_writes_row2(a, t, "a", write=write)
    run(a, "XA PREPARE 'a'")
    # the writer has to wait for the decision: CO holds
    assert writer_commits_while_branch_prepared(co, t, a) is False
    a.close()


def test_session_setting_makes_xa_serializable(co):
    t = fresh_table(co)
    a = session(co)
    run(a, "SET SESSION mysql_co_serializable_xa = ON")
    branch_reads_row1_writes_row2(a, t, "a")
    run(a, "XA PREPARE 'a'")
    assert writer_commits_while_branch_prepared(co, t, a) is False
    a.close()


def test_one_phase(co):
    t = fresh_table(co)
    a = session(co)
    run(a, "SET GLOBAL mysql_co_check_one_phase = OFF")
    try:
        branch_reads_row1_writes_row2(a, t, "a")
        run(a, "XA COMMIT 'a' ONE PHASE")        # rule off: accepted at REPEATABLE READ
    finally:
        run(a, "SET GLOBAL mysql_co_check_one_phase = ON")
    branch_reads_row1_writes_row2(a, t, "b")
    with pytest.raises(pymysql.MySQLError) as e:
        run(a, "XA COMMIT 'b' ONE PHASE")
    assert e.value.args[0] == XA_RBROLLBACK and "ONE PHASE refused" in e.value.args[1]
    assert co.sql(f"SELECT v FROM {t} WHERE id = 2") == ((1,),)   # only 'a' committed
    a.close()


def status(server, name):
    rows = server.sql("SHOW GLOBAL STATUS LIKE %s", (name,))
    return rows[0][1]


def _prepare_read_only_and_disconnect(server, t, xid):
    a = session(server, "SERIALIZABLE")
    cid = run(a, "SELECT CONNECTION_ID()")[0][0]
    run(a, f"XA START '{xid}'", f"SELECT v FROM {t} WHERE id = 1", f"XA END '{xid}'",
        f"XA PREPARE '{xid}'")
    a.close()
    # the server ends the session (and rolls the read-only branch back) asynchronously
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.sql(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s", (cid,))[0][0]:
        time.sleep(0.05)


def test_lost_read_only_branch_silent_without_plugin(plain):
    t = fresh_table(plain)
    _prepare_read_only_and_disconnect(plain, t, "ro")
    # XA RECOVER still lists it, as if it were in doubt, but it is gone (and its locks):
    assert [bytes(r[3], "latin1") if isinstance(r[3], str) else r[3] for r in plain.sql("XA RECOVER")] == [b"ro"]
    plain.sql(f"UPDATE {t} SET v = 5 WHERE id = 1")       # no wait
    with pytest.raises(pymysql.MySQLError) as e:
        plain.sql("XA COMMIT 'ro'")
    assert e.value.args[0] == XA_RBROLLBACK


def test_lost_read_only_branch_reported_with_plugin(co):
    t = fresh_table(co)
    before = int(status(co, "Mysql_co_read_only_branches_lost"))
    _prepare_read_only_and_disconnect(co, t, "ro-lost")
    assert int(status(co, "Mysql_co_read_only_branches_lost")) == before + 1
    rows = co.sql("SELECT xid FROM information_schema.MYSQL_CO_LOST_BRANCHES")
    assert ("'ro-lost'",) in rows
    assert "read-only prepared XA branch 'ro-lost' was rolled back" in \
        open(co.log_file, errors="replace").read()


def test_runtime_install_without_binlog_says_hooks_disabled():
    with MariaServer(plugin=False) as s:
        c = s.connect()
        with c.cursor() as cur:
            cur.execute("INSTALL SONAME 'mysql_co'")
            cur.execute("SHOW WARNINGS")
            warnings = " ".join(str(w[2]) for w in cur.fetchall())
        assert "Cannot enable tc-log at run-time" in warnings
        assert "mysql_co: 2PC hooks are disabled" in warnings
        assert status(s, "Mysql_co_hooks") == "DISABLED"
        assert status(s, "Mysql_co_health") == "HOOKS_DISABLED"
        assert "the server disabled the 2PC hooks of mysql_co" in open(s.log_file).read()
        # Nothing can be enforced; the unchecked XA PREPARE is counted.
        t = fresh_table(s)
        a = session(s)
        branch_reads_row1_writes_row2(a, t, "a")
        run(a, "XA PREPARE 'a'", "XA COMMIT 'a'")
        assert int(status(s, "Mysql_co_unchecked_prepares")) >= 1
        a.close()
        c.close()


def test_runtime_install_with_binlog_enforces():
    with MariaServer(plugin=False, binlog=True) as s:
        s.sql("INSTALL SONAME 'mysql_co'")
        assert status(s, "Mysql_co_hooks") == "ENABLED"
        assert status(s, "Mysql_co_health") == "RESTART_REQUIRED"
        t = fresh_table(s)
        a = session(s)
        branch_reads_row1_writes_row2(a, t, "a")
        with pytest.raises(pymysql.MySQLError) as e:
            run(a, "XA PREPARE 'a'")
        assert e.value.args[0] == XA_RBROLLBACK
        run(a, "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        branch_reads_row1_writes_row2(a, t, "b")
        run(a, "XA PREPARE 'b'", "XA COMMIT 'b'")
        a.close()


def test_restart_gate(co):
    t = fresh_table(co)
    a = session(co, "SERIALIZABLE")
    run(a, "XA START 'r1'", f"SELECT v FROM {t} WHERE id = 1",
        f"UPDATE {t} SET v = 1 WHERE id = 2", "XA END 'r1'", "XA PREPARE 'r1'")
    co.kill9()
    co.start()
    assert status(co, "Mysql_co_restart_gate") == "ON"
    b = session(co, "SERIALIZABLE")
    run(b, "XA START 'n1'", f"UPDATE {t} SET v = 7 WHERE id = 1", "XA END 'n1'")
    with pytest.raises(pymysql.MySQLError) as e:
        run(b, "XA PREPARE 'n1'")
    assert e.value.args[0] == XA_RBROLLBACK and "'r1'" in e.value.args[1]
    run(b, "SET GLOBAL mysql_co_restart_gate = OFF")          # rule off: accepted
    run(b, "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    run(b, "XA START 'n2'", f"UPDATE {t} SET v = 7 WHERE id = 1", "XA END 'n2'",
        "XA PREPARE 'n2'", "XA ROLLBACK 'n2'")
    run(b, "SET GLOBAL mysql_co_restart_gate = ON")
    run(b, "XA COMMIT 'r1'")                                  # lifts the gate
    assert status(co, "Mysql_co_restart_gate") == "OFF"
    run(b, "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    run(b, "XA START 'n3'", f"UPDATE {t} SET v = 7 WHERE id = 1", "XA END 'n3'",
        "XA PREPARE 'n3'", "XA COMMIT 'n3'")
    b.close()


def test_runtime_install_gate_not_armed_until_restart():
    """INSTALL SONAME at run time cannot arm the restart gate (recovered branches are known
    only at startup): the plugin says so loudly and reports RESTART_REQUIRED, and a
    conflicting branch prepares while a recovered XID is undecided. After a restart (the
    plugin is now in mysql.plugin, loaded before recovery) the gate is armed and refuses."""
    with MariaServer(plugin=False, binlog=True) as s:
        t = fresh_table(s)
        a = session(s, "SERIALIZABLE")
        run(a, "XA START 'r1'", f"SELECT v FROM {t} WHERE id = 1",
            f"UPDATE {t} SET v = 1 WHERE id = 2", "XA END 'r1'", "XA PREPARE 'r1'")
        s.kill9()
        s.start()                      # r1 recovered, its S lock on row 1 lost
        c = s.connect()
        with c.cursor() as cur:
            cur.execute("INSTALL SONAME 'mysql_co'")
            cur.execute("SHOW WARNINGS")
            warnings = " ".join(str(w[2]) for w in cur.fetchall())
        c.close()
        assert "restart gate is NOT armed" in warnings
        assert "RESTART_REQUIRED" in warnings
        assert status(s, "Mysql_co_health") == "RESTART_REQUIRED"
        assert status(s, "Mysql_co_restart_gate") == "NOT_ARMED"
        assert "the restart gate is NOT armed" in open(s.log_file, errors="replace").read()
        b = session(s, "SERIALIZABLE")
        # the gap: a branch overwriting what r1 read prepares while r1 is in doubt
        run(b, "XA START 'n1'", f"UPDATE {t} SET v = 7 WHERE id = 1", "XA END 'n1'",
            "XA PREPARE 'n1'", "XA ROLLBACK 'n1'")
        b.close()
        s.restart()
        assert status(s, "Mysql_co_health") == "OK"
        assert status(s, "Mysql_co_restart_gate") == "ON"
        b = session(s, "SERIALIZABLE")
        run(b, "XA START 'n2'", f"UPDATE {t} SET v = 7 WHERE id = 1", "XA END 'n2'")
        with pytest.raises(pymysql.MySQLError) as e:
            run(b, "XA PREPARE 'n2'")
        assert e.value.args[0] == XA_RBROLLBACK and "'r1'" in e.value.args[1]
        run(b, "XA COMMIT 'r1'")
        assert status(s, "Mysql_co_restart_gate") == "OFF"
        b.close()


def _rule_c_at_mariadb(server, t):
    """Rule C's schedule with MariaDB as the reader's database: Y wrote row 2 and is in
    doubt; G wrote row 1 and committed after Y's prepare (G saw Y elsewhere: Y -> G).
    Returns Y's session (still prepared)."""
    y = session(server, "SERIALIZABLE")
    run(y, "XA START 'Y'", f"UPDATE {t} SET v = 1 WHERE id = 2", "XA END 'Y'", "XA PREPARE 'Y'")
    g = session(server, "SERIALIZABLE")
    run(g, "XA START 'G'", f"UPDATE {t} SET v = 1 WHERE id = 1", "XA END 'G'", "XA PREPARE 'G'",
        "XA COMMIT 'G'")
    g.close()
    return y


def test_autocommit_read_anomaly_without_plugin(plain):
    t = fresh_table(plain)
    y = _rule_c_at_mariadb(plain, t)
    r = session(plain, "SERIALIZABLE")
    # G's row new, Y's row old: L -> Y -> G -> L, no serial order
    assert run(r, f"SELECT id, v FROM {t} ORDER BY id") == ((1, 1), (2, 0))
    run(y, "XA COMMIT 'Y'")
    y.close()
    r.close()


@pytest.mark.parametrize("lock", ["OFF", "ON"])
def test_autocommit_read_with_plugin(co, lock):
    """mysql_co_lock_autocommit_reads=ON (default): the autocommit SELECT waits for Y's
    decision and sees both rows; OFF: the anomaly, as without the plugin."""
    t = fresh_table(co)
    y = _rule_c_at_mariadb(co, t)
    r = session(co, "SERIALIZABLE")
    run(r, f"SET SESSION mysql_co_lock_autocommit_reads = {lock}")
    # Read on the reader's own connection: the counter grows after the SELECT's result
    # reached the client, so another connection could read it too early.
    locked = "SHOW GLOBAL STATUS LIKE 'Mysql_co_autocommit_reads_locked'"
    before = int(run(r, locked)[0][1])
    out = {}
    reader = threading.Thread(target=lambda: out.update(rows=run(r, f"SELECT id, v FROM {t} ORDER BY id"),
                                                        at=time.monotonic()), daemon=True)
    reader.start()
    waited = None
    deadline = time.monotonic() + 4      # the reader's lock wait timeout is 5 s
    while waited is None and time.monotonic() < deadline:
        if "at" in out:
            waited = False
        elif co.sql("SELECT COUNT(*) FROM information_schema.innodb_lock_waits")[0][0]:
            waited = True                 # InnoDB shows the reader waiting for Y's lock
        else:
            time.sleep(0.02)
    decided_at = time.monotonic()
    run(y, "XA COMMIT 'Y'")
    reader.join(10)
    after = int(run(r, locked)[0][1])
    y.close()
    r.close()
    if lock == "OFF":
        assert waited is False and out["rows"] == ((1, 1), (2, 0))
        assert after == before
    else:
        assert waited is True and out["at"] >= decided_at
        assert out["rows"] == ((1, 1), (2, 1))
        assert after == before + 1

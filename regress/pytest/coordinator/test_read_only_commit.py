"""All-read-only global transactions: when the commit request lists every
branch as read-only, the daemon decides commit in memory, with no store sync
(cotx_protocol::read_only, checked by the model). Real servers, engine mode (pg_co,
mysql_co) and client mode (neither: the helper and slot shims):

- all-read-only transactions commit with no store write (cotx_store_batches_total does
  not move) and are counted in cotx_read_only_commits_total; one writing branch, an
  older client that lists nothing, or a declared read-only PostgreSQL branch that wrote
  all keep the synced decision;
- MariaDB runs a declared read-only branch as a READ ONLY transaction in engine mode (a
  write is refused), and its prepared branch still holds its SERIALIZABLE read locks;
- the daemon killed (-9) right after answering such a commit, before any branch finished:
  after the restart nothing is prepared, no data changed, and a writer that waited on the
  read-only branch's locks goes on.
"""
import subprocess
import sys
import threading
import time

import psycopg
import pymysql
import pytest
from cotx import Coordinator
from cotest.coord import servers_in_mode, metric, metrics_text, my_prepared, nothing_prepared, pg_prepared, wait_until
from cotest.servers import mysql_co_installed, pg_co_installed


needs_engine = pytest.mark.skipif(not (pg_co_installed() and mysql_co_installed()),
                                  reason="pg_co and mysql_co are not installed (run scripts/build.sh)")
MODES = [pytest.param("engine", marks=needs_engine), "client"]


@pytest.fixture(scope="module", params=MODES)
def env(request):
    """(mode, pg, mariadb, daemon): servers with the mode's extensions, a table `ro` of 10
    rows on each, a daemon whose owners' grace is long (the tests' owners finish)."""
    with servers_in_mode(request.param, "ro",
                         timeouts={"owner_grace_ms": 60000, "recovery_interval_ms": 3_600_000}) as e:
        yield e


def pg_conn(pg):
    return psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres", autocommit=True)


def my_conn(my):
    return pymysql.connect(host="127.0.0.1", port=my.port, user="root", database="test", autocommit=True)


def syncs(d) -> float:
    return metric(d, "cotx_store_batches_total")


def settled_syncs(d) -> float:
    """The store's sync count once background writes (start-up, earlier finishes) are done:
    unchanged for 1.2 s (the start-up recovery pass's held write lands about 0.4 s after
    the daemon answers; a single 0.3 s look missed it now and then)."""
    last, same = syncs(d), 0
    while same < 4:
        time.sleep(0.3)
        now = syncs(d)
        same = same + 1 if now == last else 0
        last = now
    return last


def run(d, pg, my, *, pg_ro=True, my_ro=True, pg_write=False, two_pg=False):
    """One global transaction: a read on PostgreSQL (and a write with pg_write) and a read
    on MariaDB (or on a second PostgreSQL session: two_pg). Returns its outcome."""
    coord = Coordinator(d.url, d.token)
    pc, oc = pg_conn(pg), (pg_conn(pg) if two_pg else my_conn(my))
    try:
        with coord.transaction() as tx:
            with tx.branch(pc, "pg", read_only=pg_ro):
                pc.execute("SELECT sum(v) FROM ro").fetchone()
                if pg_write:
                    pc.execute("UPDATE ro SET v = v + 1 WHERE k = 1")
            with tx.branch(oc, "pg" if two_pg else "my", read_only=my_ro):
                if two_pg:
                    oc.execute("SELECT sum(v) FROM ro WHERE k > 5").fetchone()
                else:
                    with oc.cursor() as c:
                        c.execute("SELECT sum(v) FROM ro")
        return tx.outcome
    finally:
        pc.close()
        oc.close()


def test_all_read_only_transactions_commit_without_a_store_sync(env):
    mode, pg, my, d = env
    # Client mode runs MariaDB branches as read-write (the slot write): the all-read-only
    # transactions there are two PostgreSQL branches.
    two_pg = mode == "client"
    before, ro_before = settled_syncs(d), metric(d, "cotx_read_only_commits_total")
    for _ in range(5):
        assert run(d, pg, my, two_pg=two_pg) == "commit"
    wait_until(lambda: nothing_prepared(pg, my), what="branches finished by their owners")
    assert settled_syncs(d) == before, "an all-read-only commit synced the store"
    assert metric(d, "cotx_read_only_commits_total") - ro_before == 5


@pytest.mark.parametrize("case", ["one_writer", "older_client", "declared_but_wrote"])
def test_anything_else_keeps_the_synced_decision(env, case):
    mode, pg, my, d = env
    before, ro_before = settled_syncs(d), metric(d, "cotx_read_only_commits_total")
    v0 = pg.sql("SELECT v FROM ro WHERE k = 1")[0][0]
    if case == "one_writer":
        out = run(d, pg, my, pg_ro=False, pg_write=True, two_pg=mode == "client")
    elif case == "older_client":
        out = run(d, pg, my, pg_ro=False, my_ro=False, two_pg=mode == "client")
    else:
        # Declared read-only, yet it wrote: PREPARE finds a transaction id, the branch is
        # not listed, and the write is committed durably.
        out = run(d, pg, my, pg_ro=True, pg_write=True, two_pg=mode == "client")
    assert out == "commit"
    wait_until(lambda: nothing_prepared(pg, my), what="branches finished")
    assert syncs(d) > before, f"{case}: the decision was not synced"
    assert metric(d, "cotx_read_only_commits_total") == ro_before
    assert pg.sql("SELECT v FROM ro WHERE k = 1")[0][0] == v0 + (case != "older_client")


def test_a_mariadb_read_only_branch_refuses_writes_and_keeps_its_read_locks(env):
    mode, pg, my, d = env
    if mode == "client":
        pytest.skip("client mode writes the branch's slot: MariaDB branches are never run READ ONLY")
    coord = Coordinator(d.url, d.token)
    mc = my_conn(my)
    with pytest.raises(pymysql.err.OperationalError, match="READ ONLY"), coord.transaction() as tx:
        with tx.branch(mc, "my", read_only=True):
            with mc.cursor() as c:
                c.execute("UPDATE ro SET v = v + 1 WHERE k = 2")
    assert my.sql("SELECT v FROM ro WHERE k = 2") == ((0,),)
    mc.close()


def rollbacks(d) -> float:
    for line in metrics_text(d).splitlines():
        if line.startswith("cotx_recovery_actions_total{") and '"recovery_rollback"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# A client that answers READY after the commit decision and never finishes its branches.
CHILD = r'''
import sys, time
import psycopg, pymysql
from cotx import Coordinator, client as cl
_, url, token, pg_port, my_port = sys.argv
coord = Coordinator(url, token, decision_timeout=600)
pc = psycopg.connect(host="127.0.0.1", port=int(pg_port), user="postgres", dbname="postgres", autocommit=True)
mc = pymysql.connect(host="127.0.0.1", port=int(my_port), user="root", database="test", autocommit=True)
def park(tx, d):
    print("READY", tx.gtid, d, flush=True)
    time.sleep(600)  # parked until the test kills this process
cl.Transaction._finish = park
with coord.transaction() as tx:
    with tx.branch(pc, "pg", read_only=True):
        pc.execute("SELECT v FROM ro WHERE k = 3").fetchone()
    with tx.branch(mc, "my", read_only=True):
        mc.cursor().execute("SELECT v FROM ro WHERE k = 3")
'''


def test_daemon_killed_after_answering_a_read_only_commit(env):
    mode, pg, my, d = env
    if mode == "client":
        pytest.skip("a MariaDB branch in client mode is never listed read-only (its slot write)")
    before = settled_syncs(d)
    pg_sum = pg.sql("SELECT sum(v) FROM ro")
    child = subprocess.Popen([sys.executable, "-c", CHILD, d.url, d.token, str(pg.port), str(my.port)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert line[:1] == ["READY"], f"{line} {child.stderr.read() if child.poll() is not None else ''}"
        decision = line[2]
        assert decision == "commit"
        assert syncs(d) == before, "the read-only commit synced the store"
        # Both branches are prepared, decided in memory only. A writer of the row they
        # read waits for them (rule B at PostgreSQL in engine mode; MariaDB's S lock).
        done = {}

        def writer():
            c = my_conn(my)
            with c.cursor() as cur:
                cur.execute("SET SESSION innodb_lock_wait_timeout = 60")
                cur.execute("UPDATE ro SET v = 7 WHERE k = 3")
            done["at"] = time.monotonic()
            c.close()

        w = threading.Thread(target=writer)
        w.start()
        time.sleep(1.0)
        assert "at" not in done, "the writer did not wait for the prepared read-only branch"
        d.kill9()
        # Passes every half second from now on (the store's syncs are not counted any more).
        d.timeouts["recovery_interval_ms"] = 500
        d.write_config()
        d.start()
        # The commit was never recorded: recovery presumes abort (it records the abort of
        # the previous run's transaction first) and rolls the PostgreSQL branch back; the
        # MariaDB branch is still attached to its owner's session, which then dies too:
        # MariaDB rolls a read-only branch back at disconnect.
        wait_until(lambda: not pg_prepared(pg), what="recovery to roll the PostgreSQL branch back")
        child.kill()
        child.wait()
        wait_until(lambda: nothing_prepared(pg, my), what=f"nothing prepared ({my_prepared(my)})")
        w.join(30)
        assert "at" in done, "the writer is still waiting"
        assert pg.sql("SELECT sum(v) FROM ro") == pg_sum, "PostgreSQL's data changed"
        assert my.sql("SELECT k, v FROM ro WHERE v <> 0 AND k <> 1") == ((3, 7),), "only the writer's change is there"
        assert rollbacks(d) >= 1, "recovery did not roll the PostgreSQL branch back"
    finally:
        child.kill()
        child.wait()


def test_a_mariadb_branch_in_client_mode_is_never_committed_read_only(env, monkeypatch):
    """Client mode on MariaDB: the branch's slot write makes it a read-write InnoDB
    transaction, and nothing in the session says for certain that the application changed
    no row; so the clients never list it, and the daemon refuses a listing that names it
    (invalid_field, naming the reason): the decision is synced (docs/client-mode.md,
    "Read-only branches")."""
    mode, pg, my, d = env
    if mode != "client":
        pytest.skip("engine mode runs a declared read-only MariaDB branch READ ONLY (listed)")
    # As the clients do: declared read-only, not listed, synced.
    before, ro_before = settled_syncs(d), metric(d, "cotx_read_only_commits_total")
    assert run(d, pg, my) == "commit"
    wait_until(lambda: nothing_prepared(pg, my), what="branches finished")
    assert syncs(d) > before and metric(d, "cotx_read_only_commits_total") == ro_before

    # A client that claims the MariaDB branch wrote nothing: refused by the daemon, and the
    # Python client sends the commit again without the list (synced).
    from cotx import dialect
    from cotx import transaction as txmod
    refusals = []
    real = txmod.Transaction._request

    def recording(self, method, path, body=None):
        try:
            return real(self, method, path, body)
        except Exception as e:
            if path.endswith("/commit"):
                refusals.append(e)
            raise

    monkeypatch.setattr(dialect.MariaDB, "wrote_nothing", staticmethod(lambda conn: True))
    monkeypatch.setattr(txmod.Transaction, "_request", recording)
    before, ro_before = settled_syncs(d), metric(d, "cotx_read_only_commits_total")
    assert run(d, pg, my) == "commit"
    wait_until(lambda: nothing_prepared(pg, my), what="branches finished")
    assert metric(d, "cotx_read_only_commits_total") == ro_before, "a client-mode MariaDB branch was committed read-only"
    assert syncs(d) > before, "the decision was not synced"
    assert [getattr(e, "code", None) for e in refusals] == ["invalid_field"], refusals
    assert "MariaDB branch in client mode" in str(refusals[0]) and "slot write" in str(refusals[0]), refusals[0]

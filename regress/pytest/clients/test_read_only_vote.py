"""The read-only vote in plain 2PC (the Python client's Branch.prepare(vote=True);
docs/coordinator.md, "The read-only vote in plain 2PC"): with enforcement "none", a branch
declared read-only that wrote nothing is committed in one phase at its vote instead of
prepared, and listed as prepared and read-only in the commit. Real servers, what they
saw read from their own logs (PostgreSQL `log_statement = 'all'`, MariaDB's general log
in mysql.general_log):

- plain 2PC, the begin path and the one-request path: the PostgreSQL branch is never
  prepared (no PREPARE TRANSACTION of its gid), the MariaDB branch is committed with XA
  COMMIT … ONE PHASE (no XA PREPARE), the daemon decides in memory (its read-only commits
  counter) and nothing is ever prepared;
- a branch declared read-only that did write is prepared as before (and the decision is
  synced), while the other read-only branch still votes;
- the one-phase COMMIT of a voting branch fails (its session is terminated): the
  transaction aborts as for a refused PREPARE, the other branch's write is rolled back;
- engine mode and client mode: read-only branches are prepared as before.
"""
from __future__ import annotations

import psycopg
import pytest
from cotest.coord import servers_in_mode, metric, my_prepared, nothing_prepared, pg_prepared, wait_until
from cotest.servers import mysql_co_installed, pg_co_installed
from cotx import Coordinator, TransactionAborted
from cotx import dialect

needs_engine = pytest.mark.skipif(not (pg_co_installed() and mysql_co_installed()),
                                  reason="pg_co and mysql_co are not installed (run scripts/build.sh)")
GENERAL_LOG = ["--general-log=1", "--log-output=TABLE"]


@pytest.fixture(scope="module", params=["none", pytest.param("engine", marks=needs_engine), "client"])
def env(request):
    """(mode, pg, mariadb, daemon): servers that log every statement, with the mode's
    extensions, a table `rv` of 10 rows on each."""
    with servers_in_mode(request.param, "rv", pg_conf={"log_statement": "'all'"}, my_options=GENERAL_LOG,
                         timeouts={"owner_grace_ms": 60000}) as e:
        yield e


def only(env, mode):
    if env[0] != mode:
        pytest.skip(f"runs in mode {mode}")


def pg_saw(pg, statement: str) -> bool:
    """Whether PostgreSQL's log shows `statement` (logged before it runs)."""
    return f"statement: {statement}" in pg.log_file.read_text(errors="replace")


def my_saw(my, verb: str, gtrid: str) -> list[str]:
    """MariaDB's general log: the XA statements of `verb` on the branch of gtrid."""
    rows = my.sql("SELECT CONVERT(argument USING utf8mb4) FROM mysql.general_log WHERE argument LIKE %s",
                  (f"{verb} %'{gtrid}'%",))
    return [r[0] for r in rows]


def run(d, pg, my, *, pg_write=False, one_request=False):
    """A read on PostgreSQL (and a write with pg_write) and a read on MariaDB, both declared
    read-only. Returns (outcome, pg branch, mariadb branch)."""
    coord = Coordinator(d.url, d.token, one_request=one_request)
    pc, mc = pg.connect(), my.connect()
    try:
        with coord.transaction() as tx:
            with tx.branch(pc, "pg", read_only=True) as pb:
                pc.execute("SELECT sum(v) FROM rv").fetchone()
                if pg_write:
                    pc.execute("UPDATE rv SET v = v + 1 WHERE k = 1")
            with tx.branch(mc, "my", read_only=True) as mb:
                with mc.cursor() as c:
                    c.execute("SELECT sum(v) FROM rv")
        return tx.outcome, pb, mb
    finally:
        pc.close()
        mc.close()


def voted(pg, my, pb, mb) -> bool:
    """Both branches committed at their vote: never prepared, MariaDB's in one phase."""
    return (not pg_saw(pg, f"PREPARE TRANSACTION '{pb.gid}'") and not my_saw(my, "XA PREPARE", mb.xid[0])
            and len(my_saw(my, "XA COMMIT", mb.xid[0])) == 1 and my_saw(my, "XA COMMIT", mb.xid[0])[0].endswith("ONE PHASE"))


@pytest.mark.parametrize("path", ["begin", "one_request"])
def test_plain_2pc_read_only_branches_vote_instead_of_preparing(env, path):
    only(env, "none")
    _, pg, my, d = env
    ro0 = metric(d, "cotx_read_only_commits_total")
    out, pb, mb = run(d, pg, my, one_request=path == "one_request")
    assert out == "commit"
    assert voted(pg, my, pb, mb), (my_saw(my, "XA", mb.xid[0]), pb.gid)
    assert (pb.state, mb.state) == ("finished", "finished") and pb.voted_read_only and mb.voted_read_only
    assert not pg_saw(pg, f"COMMIT PREPARED '{pb.gid}'")
    # Decided in memory (every branch listed read-only), nothing was ever prepared.
    assert metric(d, "cotx_read_only_commits_total") - ro0 == 1
    assert nothing_prepared(pg, my)


def test_a_read_only_branch_that_wrote_is_prepared(env):
    """Declared read-only, yet it wrote: PostgreSQL found a transaction id, so the branch
    prepares (not listed read-only, the decision synced) and its write commits; the
    MariaDB branch, which could not write, still votes."""
    only(env, "none")
    _, pg, my, d = env
    ro0, v0 = metric(d, "cotx_read_only_commits_total"), pg.sql("SELECT v FROM rv WHERE k = 1")[0][0]
    out, pb, mb = run(d, pg, my, pg_write=True)
    assert out == "commit"
    assert pg_saw(pg, f"PREPARE TRANSACTION '{pb.gid}'") and pg_saw(pg, f"COMMIT PREPARED '{pb.gid}'")
    assert my_saw(my, "XA COMMIT", mb.xid[0])[0].endswith("ONE PHASE") and not my_saw(my, "XA PREPARE", mb.xid[0])
    assert not pb.voted_read_only and mb.voted_read_only
    assert metric(d, "cotx_read_only_commits_total") == ro0
    assert pg.sql("SELECT v FROM rv WHERE k = 1")[0][0] == v0 + 1
    wait_until(lambda: nothing_prepared(pg, my), what="branches finished")


def test_a_failed_read_only_commit_aborts_like_a_refused_prepare(env, monkeypatch):
    """The voting branch's one-phase COMMIT fails (its backend terminated just before):
    the transaction aborts at the daemon, the MariaDB writer prepared before it is rolled
    back, nothing stays prepared."""
    only(env, "none")
    _, pg, my, d = env
    real = dialect.Postgres.commit_one_phase

    def lost(conn, gid):
        pg.sql("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        real(conn, gid)
    monkeypatch.setattr(dialect.Postgres, "commit_one_phase", staticmethod(lost))
    coord = Coordinator(d.url, d.token)
    pc, mc = pg.connect(), my.connect()
    with pytest.raises(TransactionAborted) as raised:
        with coord.transaction() as tx:
            with tx.branch(mc, "my") as mb:
                with mc.cursor() as c:
                    c.execute("UPDATE rv SET v = v + 1 WHERE k = 2")
            with tx.branch(pc, "pg", read_only=True) as pb:
                pc.execute("SELECT sum(v) FROM rv").fetchone()
    assert isinstance(raised.value.__cause__, psycopg.OperationalError), raised.value
    assert (mb.state, pb.state) == ("rolled_back", "failed")
    assert my_saw(my, "XA PREPARE", mb.xid[0]) and my_saw(my, "XA ROLLBACK", mb.xid[0])
    assert my.sql("SELECT v FROM rv WHERE k = 2") == ((0,),)
    assert coord.decision(tx.gtid)["decision"] == "abort"
    assert nothing_prepared(pg, my)
    mc.close()


@pytest.mark.parametrize("path", ["begin", "one_request"])
def test_engine_and_client_mode_still_prepare_read_only_branches(env, path):
    """Where commitment ordering is enforced a reader's branch must stay prepared until
    the decision: no vote (client mode has no one-request path: it takes the begin path)."""
    mode, pg, my, d = env
    if mode == "none":
        pytest.skip("plain 2PC votes")
    out, pb, mb = run(d, pg, my, one_request=path == "one_request")
    assert out == "commit"
    assert pg_saw(pg, f"PREPARE TRANSACTION '{pb.gid}'") and pg_saw(pg, f"COMMIT PREPARED '{pb.gid}'")
    assert my_saw(my, "XA PREPARE", mb.xid[0]) and not my_saw(my, "XA COMMIT", mb.xid[0])[0].endswith("ONE PHASE")
    # (Client mode's daemon keeps helper transactions prepared: the branches are looked for.)
    wait_until(lambda: pb.gid not in pg_prepared(pg) and not any(mb.xid[0].encode() in x for x in my_prepared(my)),
               what="branches finished")

"""Client mode commits a single-branch global transaction in one phase (docs/client-mode.md,
"One phase"): the branch writes its slot, the daemon answers `one_phase`, the client
commits on its own session. Its shared helper (PostgreSQL) must stay prepared until that
session's transaction has ended, not until the daemon hears of it: the daemon looks at
the block's slot rows (a branch's slot stays write-locked until its transaction ends) before
a helper goes, in the run that answered and in the next one after a kill -9.

That one phase keeps the guarantee is the checker's (test_schedules_client_mode.py: the
one-phase schedules, and one phase without the slot write letting rule C's cycle commit)."""
from __future__ import annotations

import time

import psycopg
import pytest
from cotest.coord import metric, my_prepared, pg_prepared, wait_until
from cotest.daemon import Daemon
from cotx import Coordinator
from cotx._http import _q


@pytest.fixture(scope="module")
def bare_pg(bare_pg):
    bare_pg.sql("CREATE TABLE one(k text PRIMARY KEY, v int NOT NULL)")
    return bare_pg


@pytest.fixture(scope="module")
def bare_my(bare_my):
    bare_my.sql("CREATE TABLE one(k varchar(64) PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
    return bare_my


def daemon(pg, my=None, **kw) -> Daemon:
    # Blocks of one slot: a helper serves one branch, so it may go as soon as that branch
    # no longer needs it (not after the idle time of a block with keys left).
    res = [{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "enforcement": "client", "client_helper_block": 1}]
    if my is not None:
        res.append({"name": "my", "kind": "mariadb", "dsn": my.dsn, "enforcement": "client"})
    return Daemon(res, **kw)


def helper_of(pg, key) -> list[str]:
    return [g for g in pg_prepared(pg) if f".h{key}x1:" in g]


def answered(pg, c, key):
    """A global transaction with one PostgreSQL branch that inserted `key`, its slot
    written and its one-phase commit answered by the daemon; not committed yet:
    (tx, branch, session)."""
    conn = psycopg.connect(pg.dsn, autocommit=True)
    tx = c.transaction()
    with tx.branch(conn, "pg") as b:
        conn.execute("INSERT INTO one VALUES (%s, 1)", (key,))
    assert b.enforcement == "client" and b.shim_one_phase
    b.write_slot_for_one_phase()
    r = tx._request("POST", f"/v1/transactions/{_q(tx.gtid)}/commit", {"one_phase_branch": b.branch_id})
    assert r["decision"] == "one_phase", r
    return tx, b, conn


def test_one_phase_in_client_mode_on_both_engines(bare_pg, bare_my):
    """Through the public API: a single-branch transaction in client mode commits in one
    phase on PostgreSQL and on MariaDB (no branch prepared, the daemon counts a one-phase
    commit), and nothing is left prepared afterwards (the helper rolled back)."""
    with daemon(bare_pg, bare_my) as d:
        c = Coordinator(d.url, d.token)
        for name, srv in (("pg", bare_pg), ("my", bare_my)):
            conn = srv.connect()
            if name == "pg":
                conn.autocommit = True
            with c.transaction() as tx:
                with tx.branch(conn, name) as b:
                    with conn.cursor() as cur:
                        cur.execute("INSERT INTO one VALUES (%s, 1)", (f"api-{name}",))
            assert b.enforcement == "client" and b.shim_one_phase and tx.outcome == "commit"
            conn.close()
        assert metric(d, 'cotx_transactions_total{outcome="one_phase"}') == 2
        wait_until(lambda: not pg_prepared(bare_pg) and not my_prepared(bare_my), 10,
                   "nothing prepared\n" + d.log_tail(40))
    assert bare_pg.sql("SELECT count(*) FROM one WHERE k = 'api-pg'")[0][0] == 1
    assert bare_my.sql("SELECT count(*) FROM one WHERE k = 'api-my'")[0][0] == 1


def test_the_helper_waits_for_the_session_not_for_the_ack(bare_pg):
    """The owner's "finished" acknowledgement arrives before its COMMIT has ended (here
    sent first on purpose; a lost ack and a transaction forgotten by retention come to
    the same): the helper's block still has the branch's slot write-locked, so the helper
    stays prepared, tick after tick; once the session commits it is rolled back."""
    with daemon(bare_pg) as d:
        c = Coordinator(d.url, d.token)
        tx, b, conn = answered(bare_pg, c, "early-ack")
        helper = helper_of(bare_pg, b.shim_key)
        assert len(helper) == 1, pg_prepared(bare_pg)
        tx._request("POST", f"/v1/transactions/{_q(tx.gtid)}/branches/{_q(b.branch_id)}/finished", {"outcome": "commit"})
        time.sleep(1.0)
        assert helper[0] in pg_prepared(bare_pg), "the helper went while its branch's COMMIT was still to come"
        b.commit_one_phase()
        conn.close()
        wait_until(lambda: helper[0] not in pg_prepared(bare_pg), 10, "helper rolled back\n" + d.log_tail(40))
    assert bare_pg.sql("SELECT count(*) FROM one WHERE k = 'early-ack'")[0][0] == 1


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_kill9_after_the_one_phase_answer(bare_pg, end):
    """kill -9 of the daemon after it answered `one_phase` and before the client's COMMIT:
    the next run does not know the transaction (one phase writes no record), yet the
    helper stays prepared, recovery pass after pass, while the branch's session is open
    (its slot row write-locked); then the session commits (or rolls back) and the helper
    is rolled back. Failed before the rule: the next run's sweep rolled the helper back at
    once (no prepared branch of the dead run), leaving the branch's COMMIT unprotected."""
    with daemon(bare_pg, timeouts={"recovery_interval_ms": 200}) as d:
        c = Coordinator(d.url, d.token)
        tx, b, conn = answered(bare_pg, c, f"kill-{end}")
        helper = helper_of(bare_pg, b.shim_key)
        assert len(helper) == 1, pg_prepared(bare_pg)
        d.kill9()
        d.start()
        # The new run looks at the helpers before it admits a branch: one admitted proves
        # the sweep ran; then several recovery passes.
        with c.transaction() as t2:
            with t2.branch(bare_pg.connect(), "pg") as b2:
                pass
        assert b2.enforcement == "client"
        time.sleep(1.5)
        assert helper[0] in pg_prepared(bare_pg), "the helper went while the one-phase branch's session was open\n" \
            + d.log_tail(40)
        if end == "commit":
            b.commit_one_phase()
        else:
            conn.execute("ROLLBACK")
        conn.close()
        wait_until(lambda: helper[0] not in pg_prepared(bare_pg), 10, "helper rolled back\n" + d.log_tail(40))
        wait_until(lambda: not pg_prepared(bare_pg), 10, "nothing prepared\n" + d.log_tail(40))
    assert bare_pg.sql(f"SELECT count(*) FROM one WHERE k = 'kill-{end}'")[0][0] == (end == "commit")

"""PostgreSQL client mode's shared, pre-prepared helpers (docs/client-mode.md, "PostgreSQL
(SSI): shared helper transactions"; coordinator-daemon/src/participants/enforcement/
helpers.rs): a helper reads a block of `client_helper_block` slots and serves that many
branches, so N branches use about N / block helpers, not N; a kill -9 of the daemon with
a helper half used leaves it prepared exactly while a branch that took one of its keys may
still commit, and nothing prepared afterwards.

That the shared helper still refuses what breaks commitment ordering is the checker's
(test_schedules_client_mode.py: the schedules run with the daemon's shared, pre-prepared
helper; a READ ONLY helper and one rolled back before its branch commits let an overdraft
through)."""
from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from cotest import PgServer
from cotest.coord import metric, wait_until
from cotx import Coordinator
from cotest.daemon import Daemon


ROOT = Path(__file__).resolve().parents[3]
PW = "CHANGE-ME"
POOL_READY = 2      # helpers.rs: ready helpers kept ahead of need


def dsn(pg, role: str) -> str:
    return f"host=127.0.0.1 port={pg.port} user={role} password={PW} dbname=shop"


@pytest.fixture(scope="module")
def bare():
    """PostgreSQL without pg_co, set up as docs/client-mode.md says: the owner ran
    sql/client_mode/postgres.sql; the applications' role and a daemon role of its own
    (which may not finish the applications' prepared branches: PostgreSQL lets only their
    owner or a superuser)."""
    with PgServer(preload=False) as pg:
        for role in ("shop_owner", "shop_app", "cotx_daemon"):
            pg.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{PW}'")
        pg.sql("CREATE DATABASE shop OWNER shop_owner")
        with psycopg.connect(dsn(pg, "shop_owner"), autocommit=True) as c:
            c.execute("CREATE TABLE acct(k text PRIMARY KEY, v int NOT NULL)")
            c.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON acct TO shop_app")
        subprocess.run([str(pg.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", dsn(pg, "shop_owner"),
                        "-f", str(ROOT / "sql/client_mode/postgres.sql")], check=True, capture_output=True)
        yield pg


def prepared(pg) -> list[str]:
    return [r[0] for r in pg.sql("SELECT gid FROM pg_prepared_xacts ORDER BY gid", dbname="shop")]


def daemon(pg, role: str = "shop_app", **kw) -> Daemon:
    block = kw.pop("block", None)
    r = {"name": "pg", "kind": "postgres", "dsn": dsn(pg, role), "enforcement": "client"}
    if block is not None:
        r["client_helper_block"] = block
    return Daemon([r], **kw)


def one_branch(c, pg, key):
    """A global transaction with one PostgreSQL branch that inserted `key`, not prepared:
    (tx, branch, the application's session)."""
    conn = psycopg.connect(dsn(pg, "shop_app"), autocommit=True)
    tx = c.transaction()
    with tx.branch(conn, "pg") as b:
        conn.execute("INSERT INTO acct VALUES (%s, 1)", (key,))
    return tx, b, conn


@pytest.mark.parametrize("block", [10, 1])
def test_n_branches_use_a_helper_per_block_not_one_each(bare, block):
    """40 branches, one after another: with blocks of 10 their keys fall in 4 blocks and
    the daemon prepares 4 helpers plus the pool's ready ones (cotx_client_helpers_prepared);
    with blocks of 1 (a helper per branch, as before) 40 or more. Every helper is rolled
    back once its branches are done (the last, partly used ones after the idle time)."""
    n = 40
    with daemon(bare, block=block) as d:
        c = Coordinator(d.url, d.token)
        keys = []
        conn = psycopg.connect(dsn(bare, "shop_app"), autocommit=True)
        for i in range(n):
            with c.transaction() as tx:
                with tx.branch(conn, "pg") as b:
                    conn.execute("INSERT INTO acct VALUES (%s, 1)", (f"count-{block}-{i}",))
            keys.append(b.shim_key)
        conn.close()
        helpers = metric(d, "cotx_client_helpers_prepared_total")
        wait_until(lambda: not prepared(bare), 10, "every helper rolled back\n" + d.log_tail(40))
        assert metric(d, "cotx_client_helpers_rolled_back_total") == helpers
        assert metric(d, "cotx_client_helpers_live") == 0
    blocks = {(k - 1) // block for k in keys}
    print(f"block {block}: {n} branches, {len(blocks)} blocks of keys, {helpers} helpers prepared")
    assert len(set(keys)) == n, "a key is never handed out twice by one daemon run"
    if block == 1:
        assert helpers >= n
    else:
        # Sequential branches use each block up before the next (a machine stalled for
        # the idle time may retire a partly used one: one block more).
        assert math.ceil(n / block) <= len(blocks) <= math.ceil(n / block) + 1, keys
        assert helpers <= len(blocks) + POOL_READY + 2, helpers
        assert helpers < n / 4


def test_kill9_with_a_shared_helper_half_used(bare):
    """Three branches take keys of one helper: A committed and finished, B prepared and
    its commit decided (not finished), C prepared and undecided; then kill -9 of the
    daemon. The daemon runs as a role of its own, so it cannot finish B itself (the
    application's role owns it): B stays prepared and may still commit. After the
    restart: a new branch is admitted on another block; the old helper stays prepared,
    pass after pass, while B is prepared; once the application has committed B and
    rolled back C it is rolled back; nothing is left prepared; A, B and the new branch
    committed, C did not."""
    with daemon(bare, role="cotx_daemon", timeouts={"recovery_interval_ms": 200, "owner_grace_ms": 200}) as d:
        c = Coordinator(d.url, d.token)
        ta, ba, ca = one_branch(c, bare, "crash-A")
        ta.commit()
        tb, bb, cb = one_branch(c, bare, "crash-B")
        tc, bc, cc = one_branch(c, bare, "crash-C")
        blk = {(b.shim_key - 1) // 10 for b in (ba, bb, bc)}
        assert len(blk) == 1, "one helper serves the three"
        first = blk.pop() * 10 + 1
        mine = tb.prepare_all(report=True)
        assert tb._commit_call({"prepared": mine}) == "commit"
        tc.prepare_all(report=True)
        helper = [g for g in prepared(bare) if f".h{first}x10:" in g]
        assert len(helper) == 1, prepared(bare)
        d.kill9()
        for conn in (ca, cb, cc):
            conn.close()
        assert helper[0] in prepared(bare)
        d.start()
        # A new branch is admitted once the old helpers were looked at, on another block.
        td, bd, cd = one_branch(c, bare, "crash-D")
        assert (bd.shim_key - 1) // 10 * 10 + 1 != first
        td.commit()
        cd.close()
        # B may still commit (committed decision, prepared): its helper stays, whatever
        # the number of recovery passes.
        time.sleep(1.5)
        assert helper[0] in prepared(bare) and bb.gid in prepared(bare), prepared(bare)
        with psycopg.connect(dsn(bare, "shop_app"), autocommit=True) as app:
            app.execute(f"COMMIT PREPARED '{bb.gid}'")
            if bc.gid in prepared(bare):
                app.execute(f"ROLLBACK PREPARED '{bc.gid}'")
        wait_until(lambda: helper[0] not in prepared(bare), 10, "the old helper rolled back\n" + d.log_tail(40))
        wait_until(lambda: not prepared(bare), 10, "nothing prepared\n" + d.log_tail(40))
        assert "dangling helper transaction rolled back" in d.log_tail(400)
    rows = {r[0] for r in bare.sql("SELECT k FROM acct WHERE k LIKE 'crash-%'", dbname="shop")}
    assert rows == {"crash-A", "crash-B", "crash-D"}


def helpers(pg) -> list[str]:
    return [g for g in prepared(pg) if ".h" in g]


def test_unused_helpers_go_with_the_daemon_whatever_runs_next(bare):
    """The pool's ready helpers protect no branch. A daemon that stops (SIGTERM) rolls them
    back; and those a killed client-mode run left are recovered by the next daemon on the
    resource even when it starts in another mode (here plain 2PC: enforcement none, as an
    operator who installs pg_co and restarts in engine mode). Left prepared, a helper would
    hold back the server's xmin for good. Both failed before: the stop left the ready
    helpers, and only a daemon in client mode looked for helpers."""
    with daemon(bare) as d:
        c = Coordinator(d.url, d.token)
        conn = psycopg.connect(dsn(bare, "shop_app"), autocommit=True)
        for i in range(2):
            with c.transaction() as tx:
                with tx.branch(conn, "pg"):
                    conn.execute("INSERT INTO acct VALUES (%s, 1)", (f"stop-{i}",))
        # The refill after a registration prepares the ready ones (they retire after an
        # idle second: stop at once).
        wait_until(lambda: len(helpers(bare)) >= POOL_READY, 10, "the pool's ready helpers")
        d.stop()
        assert not prepared(bare), "the ready helpers outlived their daemon's stop"
        d.start()
        with c.transaction() as tx:
            with tx.branch(conn, "pg"):
                conn.execute("INSERT INTO acct VALUES ('stop-2', 1)")
        conn.close()
        wait_until(lambda: len(helpers(bare)) >= POOL_READY, 10, "the pool's ready helpers")
        d.kill9()
        assert helpers(bare), "ready helpers of the killed daemon are prepared"
        # The same daemon (node, store) back in plain 2PC mode.
        d.resources[0]["enforcement"] = "none"
        d.write_config()
        d.start()
        wait_until(lambda: not prepared(bare), 10, "a killed run's helpers recovered in plain 2PC mode\n"
                   + d.log_tail(40))

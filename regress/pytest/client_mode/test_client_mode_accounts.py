"""The database accounts docs/ops.md and docs/client-mode.md document, used as documented,
on servers without pg_co and mysql_co (a managed service): the client-mode objects created
once by the database's owner (sql/client_mode/*.sql, run as that owner), the daemon
connected as its documented role (no superuser, no ownership, only the grants the docs
list), an application connected as its own role; a global transaction across both engines
commits in client mode, and its helper is let go.

PostgreSQL: three roles, none superuser: the owner (owns the database and the
application's table, runs the script), the application's role (DML on its table), and
the daemon's role, both as ops.md recommends (the applications' role, which can finish
branches left by their owner) and as a role of its own (CONNECT only).
MariaDB: the owner account (ALL on the database, runs the script), ops.md's daemon account
(PROCESS and SELECT) and the application's account (SELECT, INSERT, UPDATE, DELETE).
And what PostgreSQL lets a daemon role do to the applications' sessions (deadlock
detection's cancel) and branches (finishing them), as ops.md's table says.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pymysql
import pytest
from cotest import MariaServer, PgServer
from cotest.coord import metric, my_prepared, pg_prepared, wait_until
from cotx import Coordinator
from cotest.daemon import Daemon

ROOT = Path(__file__).resolve().parents[3]
PW = "CHANGE-ME"


@pytest.fixture(scope="module")
def servers():
    """PostgreSQL and MariaDB without the extension / plugin, set up as the docs say."""
    with PgServer(preload=False) as pg, MariaServer(plugin=False) as my:
        # PostgreSQL: the owner owns the database and the application's table.
        for role in ("shop_owner", "shop_app", "cotx_daemon"):
            pg.sql(f"CREATE ROLE {role} LOGIN PASSWORD '{PW}'")
        pg.sql("CREATE DATABASE shop OWNER shop_owner")
        with psycopg.connect(pg_dsn(pg, "shop_owner"), autocommit=True) as c:
            c.execute("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL)")
            c.execute("INSERT INTO acct VALUES (1, 1000)")
            c.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON acct TO shop_app")
        # docs/client-mode.md: the script, once, as the database's owner.
        subprocess.run([str(pg.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", pg_dsn(pg, "shop_owner"),
                        "-f", str(ROOT / "sql/client_mode/postgres.sql")], check=True, capture_output=True)
        # MariaDB: ops.md's accounts, and an owner account that runs the script.
        my.sql("CREATE DATABASE stock")
        my.sql("CREATE TABLE stock.items (id int PRIMARY KEY, qty int NOT NULL) ENGINE=InnoDB")
        my.sql("INSERT INTO stock.items VALUES (1, 1000)")
        for stmt in (f"CREATE USER 'stock_owner'@'%' IDENTIFIED BY '{PW}'",
                     "GRANT ALL ON stock.* TO 'stock_owner'@'%'",
                     f"CREATE USER 'cotx_recovery'@'%' IDENTIFIED BY '{PW}'",
                     "GRANT PROCESS ON *.* TO 'cotx_recovery'@'%'",
                     "GRANT SELECT ON stock.* TO 'cotx_recovery'@'%'",
                     f"CREATE USER 'shop_app'@'%' IDENTIFIED BY '{PW}'",
                     "GRANT SELECT, INSERT, UPDATE, DELETE ON stock.* TO 'shop_app'@'%'"):
            my.sql(stmt)
        with open(ROOT / "sql/client_mode/mariadb.sql") as script:
            subprocess.run(["mariadb", "-h", "127.0.0.1", "-P", str(my.port), "-u", "stock_owner", f"-p{PW}",
                            "stock"], stdin=script, check=True, capture_output=True)
        yield pg, my


def pg_dsn(pg, role: str, db: str = "shop") -> str:
    return f"host=127.0.0.1 port={pg.port} user={role} password={PW} dbname={db}"


@pytest.mark.parametrize("daemon_role", ["shop_app", "cotx_daemon"],
                         ids=["daemon-as-applications-role", "daemon-role-of-its-own"])
def test_a_global_transaction_in_client_mode_with_the_documented_accounts(servers, daemon_role):
    pg, my = servers
    d = Daemon([{"name": "pg", "kind": "postgres", "dsn": pg_dsn(pg, daemon_role)},
                {"name": "my", "kind": "mariadb", "dsn": f"mysql://cotx_recovery:{PW}@127.0.0.1:{my.port}/stock"}])
    with d:
        pc = psycopg.connect(pg_dsn(pg, "shop_app"), autocommit=True)
        mc = pymysql.connect(host="127.0.0.1", port=my.port, user="shop_app", password=PW, database="stock",
                             autocommit=True)
        try:
            tx = Coordinator(d.url, d.token).transaction()
            with tx:
                with tx.branch(pc, "pg") as bp:
                    pc.execute("UPDATE acct SET bal = bal - 10 WHERE id = 1")
                with tx.branch(mc, "my") as bm:
                    mc.cursor().execute("UPDATE items SET qty = qty + 10 WHERE id = 1")
            assert tx.outcome == "commit"
            assert (bp.enforcement, bm.enforcement) == ("client", "client")
        finally:
            pc.close()
            mc.close()
        wait_until(lambda: not pg_prepared(pg) and not my_prepared(my), 15, "the helper rolled back, nothing prepared")
    # The daemon created nothing and owns nothing: the owner's objects, used as they are.
    assert pg.sql("SELECT tableowner FROM pg_tables WHERE schemaname = 'cotx'", dbname="shop") == [("shop_owner",)]


def test_what_a_daemon_role_of_its_own_may_cancel_and_finish(servers):
    """ops.md's deadlock-detection row, as PostgreSQL enforces it: a daemon role of its own
    may not cancel the applications' waiting statements; a member of the applications'
    role may (pg_cancel_backend), yet still may not finish their prepared branches (only
    the preparing role or a superuser may): why ops.md has the daemon log in as the
    applications' role."""
    import threading
    pg, _ = servers
    pg.sql(f"CREATE ROLE cotx_member LOGIN PASSWORD '{PW}'")
    pg.sql("GRANT shop_app TO cotx_member")
    app = psycopg.connect(pg_dsn(pg, "shop_app"), autocommit=True)
    pid = app.info.backend_pid
    cancelled = []

    def wait():
        try:
            app.execute("SELECT pg_sleep(10)")
        except psycopg.errors.QueryCanceled:
            cancelled.append(True)
    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: pg.sql("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)) == [("PgSleep",)],
               10, "the application's statement running")
    with psycopg.connect(pg_dsn(pg, "cotx_daemon"), autocommit=True) as own:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            own.execute("SELECT pg_cancel_backend(%s)", (pid,))
    with psycopg.connect(pg_dsn(pg, "cotx_member"), autocommit=True) as member:
        assert member.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone() == (True,)
        t.join(10)
        assert cancelled == [True]
        app.execute("BEGIN")
        app.execute("UPDATE acct SET bal = bal WHERE id = 1")
        app.execute("PREPARE TRANSACTION 'cotx:member-test:b0'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            member.execute("COMMIT PREPARED 'cotx:member-test:b0'")
    app.execute("ROLLBACK PREPARED 'cotx:member-test:b0'")
    app.close()


def test_objects_of_an_older_script_keep_two_phases(servers):
    """A database whose owner ran an older sql/client_mode/postgres.sql (no
    cotx.shim_locked, which one phase needs to tell when a branch's session has ended) and
    a daemon role that may not replace its objects: the resource still works in client
    mode, used as it is, but offers no one phase (`shim.one_phase` false), so a
    single-branch transaction is prepared and committed in two phases, its helper let go."""
    pg, _ = servers
    pg.sql("CREATE DATABASE shop_old OWNER shop_owner")
    with psycopg.connect(pg_dsn(pg, "shop_owner", "shop_old"), autocommit=True) as c:
        c.execute("CREATE TABLE acct(id int PRIMARY KEY, bal int NOT NULL)")
        c.execute("INSERT INTO acct VALUES (1, 1000)")
        c.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON acct TO shop_app")
    subprocess.run([str(pg.bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", pg_dsn(pg, "shop_owner", "shop_old"),
                    "-f", str(ROOT / "sql/client_mode/postgres.sql")], check=True, capture_output=True)
    with psycopg.connect(pg_dsn(pg, "shop_owner", "shop_old"), autocommit=True) as c:
        c.execute("DROP FUNCTION cotx.shim_locked(integer, integer)")
    with Daemon([{"name": "pg", "kind": "postgres", "dsn": pg_dsn(pg, "cotx_daemon", "shop_old"),
                  "enforcement": "client"}]) as d:
        pc = psycopg.connect(pg_dsn(pg, "shop_app", "shop_old"), autocommit=True)
        try:
            with Coordinator(d.url, d.token).transaction() as tx:
                with tx.branch(pc, "pg") as b:
                    pc.execute("UPDATE acct SET bal = bal - 10 WHERE id = 1")
            assert tx.outcome == "commit"
            assert b.enforcement == "client" and not b.shim_one_phase
        finally:
            pc.close()
        assert metric(d, 'cotx_transactions_total{outcome="one_phase"}') == 0
        assert metric(d, 'cotx_transactions_total{outcome="commit"}') == 1
        wait_until(lambda: not pg_prepared(pg), 15, "the helper rolled back, nothing prepared")
    assert pg.sql("SELECT bal FROM acct WHERE id = 1", dbname="shop_old") == [(990,)]
    # The daemon replaced nothing: still the older objects.
    assert pg.sql("SELECT to_regprocedure('cotx.shim_locked(integer, integer)')", dbname="shop_old") == [(None,)]

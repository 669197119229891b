"""Smoke tests: each real server starts, takes a 2PC branch through prepare and commit."""
import pytest


def test_pg_prepare_commit(pg):
    pg.sql("CREATE TABLE smoke(id int primary key, v int)")
    with pg.connect() as c:
        c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        c.execute("INSERT INTO smoke VALUES (1, 10)")
        c.execute("PREPARE TRANSACTION 'smoke-1'")
        assert pg.sql("SELECT gid FROM pg_prepared_xacts") == [("smoke-1",)]
        c.execute("COMMIT PREPARED 'smoke-1'")
    assert pg.sql("SELECT v FROM smoke WHERE id = 1") == [(10,)]
    assert pg.sql("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]


def test_mariadb_xa_prepare_commit(mariadb):
    mariadb.sql("CREATE TABLE smoke(id int primary key, v int) ENGINE=InnoDB")
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        cur.execute("XA START 'smoke-1'")
        cur.execute("INSERT INTO smoke VALUES (1, 10)")
        cur.execute("XA END 'smoke-1'")
        cur.execute("XA PREPARE 'smoke-1'")
        cur.execute("XA RECOVER")
        rows = cur.fetchall()
        assert [(r[0], r[1], r[2]) for r in rows] == [(1, 7, 0)]
        cur.execute("XA COMMIT 'smoke-1'")
    c.close()
    assert mariadb.sql("SELECT v FROM smoke WHERE id = 1") == ((10,),)


def test_port_in_use_is_refused(pg):
    from cotest.servers import ServerError
    with pytest.raises(ServerError, match="already in use"):
        type(pg)(port=pg.port)

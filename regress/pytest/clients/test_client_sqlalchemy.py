"""Branches on SQLAlchemy connections (clients/python/README.md): the client takes the
driver connection under a SQLAlchemy Connection (psycopg 3 / PyMySQL), the statements
still go through SQLAlchemy, the global transaction commits or aborts on both engines, and
the pooled connection is handed back as SQLAlchemy left it (not in autocommit)."""
import pytest
from cotx import Coordinator, CotxError
from cotest.coord import make_daemon, nothing_prepared
from sqlalchemy import create_engine, text


@pytest.fixture(scope="module")
def coord(pg, mariadb):
    pg.sql("CREATE TABLE IF NOT EXISTS sa(id int PRIMARY KEY, v int NOT NULL)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS sa(id int PRIMARY KEY, v int NOT NULL) ENGINE=InnoDB")
    d = make_daemon(pg, mariadb)
    with d:
        yield Coordinator(d.url, d.token)


@pytest.fixture(scope="module")
def engines(pg, mariadb):
    e = {"pg": create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres", pool_size=1),
         "my": create_engine(f"mysql+pymysql://root@127.0.0.1:{mariadb.port}/test", pool_size=1)}
    yield e
    for x in e.values():
        x.dispose()


def branch_connection(engine):
    """The recipe: a SQLAlchemy Connection in AUTOCOMMIT (the client issues BEGIN / XA START
    itself; SQLAlchemy restores the isolation level when the connection goes back to the
    pool) and the driver connection under it, for tx.branch."""
    c = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    return c, c.connection.driver_connection


def test_commit_and_abort_on_sqlalchemy_connections(pg, mariadb, coord, engines):
    pg.sql("DELETE FROM sa")
    mariadb.sql("DELETE FROM sa")
    pc, pdrv = branch_connection(engines["pg"])
    mc, mdrv = branch_connection(engines["my"])
    with coord.transaction() as tx:
        with tx.branch(pdrv, "pg"):
            pc.execute(text("INSERT INTO sa VALUES (1, 10)"))
        with tx.branch(mdrv, "my"):
            mc.execute(text("INSERT INTO sa VALUES (1, 20)"))
    assert tx.outcome == "commit"
    with pytest.raises(RuntimeError):
        with coord.transaction() as tx2:
            with tx2.branch(pdrv, "pg"):
                pc.execute(text("INSERT INTO sa VALUES (2, 10)"))
            with tx2.branch(mdrv, "my"):
                mc.execute(text("INSERT INTO sa VALUES (2, 20)"))
            raise RuntimeError("the application gives up")
    assert tx2.outcome == "abort"
    pc.close()
    mc.close()
    assert pg.sql("SELECT id, v FROM sa") == [(1, 10)]
    assert mariadb.sql("SELECT id, v FROM sa") == ((1, 20),)
    assert nothing_prepared(pg, mariadb)
    # Back in the pool, the driver connections are no longer in autocommit.
    with engines["pg"].connect() as c:
        assert c.connection.driver_connection is pdrv and pdrv.autocommit is False
    with engines["my"].connect() as c:
        assert c.connection.driver_connection is mdrv and not mdrv.get_autocommit()


def test_sqlalchemy_connection_itself_is_refused(coord, engines):
    # Without unwrapping, the client cannot know the driver: it refuses instead of guessing.
    with engines["pg"].connect() as c:
        with pytest.raises(CotxError, match="unsupported connection type"):
            with coord.transaction() as tx:
                with tx.branch(c, "pg"):
                    pass

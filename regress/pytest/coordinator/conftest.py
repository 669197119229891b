"""Fixtures of the coordinator's tests: the tables their transfers write and the database
of a shared decision store, made once per module on its servers."""
import pytest
from cotest.transfers import create_crash_tables


@pytest.fixture(scope="module")
def crash_tables(pg, mariadb):
    """Table `crash` on both servers (cotest.transfers writes there)."""
    create_crash_tables(pg, mariadb)


@pytest.fixture(scope="module")
def store_db(pg):
    """Database cotx_log on the module's PostgreSQL, for a PostgreSQL decision store
    (cotest.coord.shared_store)."""
    pg.sql("CREATE DATABASE cotx_log")

"""Fixtures of the client-mode tests: servers without pg_co or mysql_co (what a managed
service gives you), started once per module. A module that needs tables overrides the
fixture under the same name and creates them on the server it is given."""
import pytest
from cotest import MariaServer, PgServer


@pytest.fixture(scope="module")
def bare_pg():
    """PostgreSQL without pg_co."""
    with PgServer(preload=False) as s:
        yield s


@pytest.fixture(scope="module")
def bare_my():
    """MariaDB without mysql_co."""
    with MariaServer(plugin=False) as s:
        yield s

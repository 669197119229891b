"""Fixtures shared by every folder of the suite: real servers, started per module and
removed after; `daemons`, the coordinator daemons of one test, destroyed at its teardown.
Fixtures shared inside one folder are in that folder's conftest.py; helpers a test imports
are in the harness (`cotest.coord`, `cotest.transfers`, `cotest.marks`), never in a test
module or a conftest (every folder's conftest.py is a module named `conftest`)."""
import os
from pathlib import Path

import checker
import cotest
import cotx
import pytest
from cotest import MariaServer, PgServer, reap_orphans
from cotest.coord import Daemons
from cotest.marks import requires_mysql_co, requires_pg_co  # noqa: F401 - for a test file run alone that imports them from here
from cotest import servers as cotest_servers
from cotest.servers import PG_MAJORS, pg_co_installed

ROOT = Path(__file__).resolve().parents[2]
# The project's packages are installed editable into the machine-wide venv, pointing at
# one checkout (scripts/install-python-packages.sh): say so when it is another one.
for _pkg in (cotx, cotest, checker):
    if not Path(_pkg.__file__).resolve().is_relative_to(ROOT):
        raise pytest.UsageError(f"{_pkg.__name__} is imported from {_pkg.__file__}, not from this checkout "
                                f"({ROOT}): run scripts/bootstrap.sh (or scripts/install-python-packages.sh) here")


def pytest_sessionstart(session):
    reap_orphans()


@pytest.fixture(scope="module")
def pg():
    """PostgreSQL 15 with pg_co preloaded when it is installed."""
    with PgServer() as s:
        yield s


@pytest.fixture(scope="module")
def mariadb():
    """MariaDB 10.11 with mysql_co loaded at startup when it is installed."""
    with MariaServer() as s:
        yield s


@pytest.fixture(scope="module")
def pg_with_ext(pg_major):
    """PostgreSQL of the module's major with pg_co preloaded and CREATE EXTENSION pg_co done."""
    with PgServer() as s:
        s.sql("CREATE EXTENSION pg_co")
        yield s


@pytest.fixture(scope="module", params=PG_MAJORS, ids=lambda m: f"pg{m}")
def pg_major(request):
    """A module that uses this fixture runs every test once per PostgreSQL major
    (COTX_PG_MAJORS narrows the list): every PgServer() it starts is of that major."""
    if cotest_servers.pg_unavailable(request.param):
        pytest.skip(f"PostgreSQL {request.param} skipped: {cotest_servers.pg_unavailable(request.param)}")
    if not pg_co_installed(request.param) and not os.environ.get("CI"):
        pytest.skip(f"pg_co is not installed into PostgreSQL {request.param} (run scripts/build.sh)")
    old = cotest_servers.DEFAULT_PG_MAJOR
    cotest_servers.DEFAULT_PG_MAJOR = request.param
    yield request.param
    cotest_servers.DEFAULT_PG_MAJOR = old


@pytest.fixture
def daemons():
    """The daemons of one test: `daemons(make_daemon(...))` registers one (started by the
    test, or changed first), `daemons.start(pg, mariadb, **kw)` makes and starts one; every
    one is stopped and its directory removed at the test's teardown, whatever the test did."""
    made = Daemons()
    yield made
    made.destroy_all()

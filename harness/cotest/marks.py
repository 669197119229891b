"""pytest marks for the suites (regress/pytest): a test that needs pg_co or mysql_co is
skipped where the extension is not installed, except in CI (CI sets CI), where its
absence must fail. Imports pytest, so `import cotest` does not load it."""
import os

import pytest

from .servers import mysql_co_installed, pg_co_installed

requires_pg_co = pytest.mark.skipif(not pg_co_installed() and not os.environ.get("CI"),
                                    reason="pg_co is not installed (run scripts/build.sh)")
requires_mysql_co = pytest.mark.skipif(not mysql_co_installed() and not os.environ.get("CI"),
                                       reason="mysql_co is not installed (run scripts/build.sh)")

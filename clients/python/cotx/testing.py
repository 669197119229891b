"""Deprecated: the test helpers moved to the harness, `cotest.coord` (harness/cotest/coord.py),
since they are no part of the shipped client. This shim re-exports them so old imports
keep working; it needs the cotest package installed (scripts/install-python-packages.sh).

Not a cycle: cotest.coord imports cotx.daemon, which imports nothing of cotx.
"""
import warnings

from cotest.coord import make_daemon, my_prepared, nothing_prepared, pg_prepared, wait_until  # noqa: F401

warnings.warn("cotx.testing moved to cotest.coord (the test harness); import it from there",
              DeprecationWarning, stacklevel=2)

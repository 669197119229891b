"""Moved: the test helpers (make_daemon, pg_prepared, wait_until, ...) are the test
harness's `cotest.coord` (harness/cotest/coord.py). This module only says where they went:
it imports nothing, so the shipped package never imports the harness."""
raise ImportError("cotx.testing moved to the project's test harness: use cotest.coord (harness/cotest/coord.py, "
                  "installed by scripts/install-python-packages.sh)")

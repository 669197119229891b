"""Helpers for tests and benches of the coordinator: start a real daemon on a PostgreSQL
and a MariaDB server (harness objects), and look at what is prepared.

Test-only, so it lives in the harness rather than in the shipped client (it was
cotx.testing, which still re-exports it). It needs the client's cotx.daemon, so unlike
the rest of cotest it imports cotx; `import cotest` does not import this module.
"""
from __future__ import annotations

import time

from cotx.daemon import Daemon


def make_daemon(pg, mariadb, enforcement: str | None = None, **kw) -> Daemon:
    """A daemon with resources "pg" and "my"; `enforcement` (auto by default) for both."""
    extra = {"enforcement": enforcement} if enforcement else {}
    return Daemon([{"name": "pg", "kind": "postgres", "dsn": pg.dsn, "pool_size": 2, **extra},
                   {"name": "my", "kind": "mariadb", "dsn": mariadb.dsn, "pool_size": 2, **extra}], **kw)


def pg_prepared(pg) -> list[str]:
    return [r[0] for r in pg.sql("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


def my_prepared(mariadb) -> list[bytes]:
    return [r[3] for r in mariadb.sql("XA RECOVER")]


def wait_until(pred, timeout: float = 30.0, what: str = "condition", step: float = 0.1):
    """Polls pred until it returns a truthy value; fails with `what` after timeout."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what} (last value: {last!r})")


def nothing_prepared(pg, mariadb) -> bool:
    return not pg_prepared(pg) and not my_prepared(mariadb)

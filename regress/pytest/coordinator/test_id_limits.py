"""The gid length limit, in one number every part checks against: PostgreSQL's own.
PostgreSQL's GIDSIZE is 200 bytes including the terminating NUL, so the longest gid it
accepts is 199 bytes; the daemon and the clients used to say "at most 200"."""
import re
from pathlib import Path

import psycopg
import pytest
from cotx import client

ROOT = Path(__file__).resolve().parents[3]


def daemon_limit() -> int:
    src = (ROOT / "coordinator-daemon/src/naming.rs").read_text()
    return int(re.search(r"pub const PG_GID_MAX: usize = (\d+);", src).group(1))


def go_limit() -> int:
    return int(re.search(r"const GIDMax = (\d+)", (ROOT / "clients/go/tx.go").read_text()).group(1))


def prepare(pg, gid):
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute("BEGIN")
        c.execute("SELECT 1")
        c.execute(f"PREPARE TRANSACTION '{gid}'")
        c.execute(f"ROLLBACK PREPARED '{gid}'")


def test_postgresql_takes_the_limit_and_refuses_one_more(pg):
    n = daemon_limit()
    prepare(pg, "g" * n)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="too long"):
        prepare(pg, "g" * (n + 1))


def test_every_part_checks_the_same_limit():
    assert daemon_limit() == client.GID_MAX == go_limit() == 199
    assert client._ID_CHARS.match("g" * 199) and not client._ID_CHARS.match("g" * 200)

"""bench/micro/client_aborts.py's classifier on real refusals: PostgreSQL's SSI failures of
client mode's two shapes (helper H -rw-> T -rw-> X), read back from the server's own log,
are counted by the step they failed at and SSI's reason code — the counts that say why
client mode aborts more than plain 2PC at the micro point (bench/RESULTS.md)."""
import time

import psycopg
import pytest
from bench.micro import client_aborts as ca


@pytest.fixture(scope="module")
def pg(pg):
    # Client mode runs where pg_co is not enforcing: only PostgreSQL's own SSI refuses.
    if pg.sql("SELECT count(*) FROM pg_settings WHERE name = 'pg_co.enabled'")[0][0]:
        pg.sql("ALTER SYSTEM SET pg_co.enabled = off")
        pg.sql("SELECT pg_reload_conf()")
        deadline = time.time() + 10
        while pg.sql("SHOW pg_co.enabled")[0][0] != "off" and time.time() < deadline:
            time.sleep(0.05)
    pg.sql("DROP TABLE IF EXISTS acct")
    pg.sql("CREATE TABLE acct (id int PRIMARY KEY, v int)")
    pg.sql("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 10) g")
    # A stand-in for cotx.shim_touch (the classifier goes by the statement's text).
    pg.sql("CREATE OR REPLACE FUNCTION shim_touch(key int) RETURNS void LANGUAGE sql "
           "AS $$ UPDATE acct SET v = v + 1 WHERE id = key $$")
    return pg


def begin(s):
    c = s.connect()
    c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE")
    return c


def helper_and_branch(s, gid):
    """H reads row 2 (the branch's slot) and is prepared READ WRITE, as the daemon's helper;
    T reads row 1 (the workload's read). Returns T's connection."""
    h = begin(s)
    h.execute("SELECT v FROM acct WHERE id = 2")
    h.execute(f"PREPARE TRANSACTION '{gid}'")
    t = begin(s)
    t.execute("SELECT v FROM acct WHERE id = 1")
    return t


def cleanup(s, *gids):
    for g in gids:
        s.sql(f"ROLLBACK PREPARED '{g}'")


def new_log(s) -> int:
    return s.log_file.stat().st_size


def read_log(s, off) -> str:
    with open(s.log_file, "rb") as f:
        f.seek(off)
        return f.read().decode(errors="replace")


def test_writer_prepared_first_fails_at_the_slot_write(pg):
    """X overwrites what T read and prepares first: T's slot write completes
    H -rw-> T -rw-> X and is refused there."""
    off = new_log(pg)
    t = helper_and_branch(pg, "h1")
    x = begin(pg)
    x.execute("UPDATE acct SET v = v + 1 WHERE id = 1")
    x.execute("PREPARE TRANSACTION 'x1'")
    with pytest.raises(psycopg.errors.SerializationFailure):
        t.execute("SELECT shim_touch(2)")
    t.close()
    cleanup(pg, "x1", "h1")
    got = ca.log_failures(read_log(pg, off))
    assert got == {("slot write", "Canceled on identification as a pivot, during write"): 1}, got


def test_writer_preparing_after_the_pivot_fails_at_prepare(pg):
    """T wrote its slot and prepared; X, which overwrote what T read, is refused at its
    PREPARE: the prepared pivot T has its helper's in-conflict."""
    off = new_log(pg)
    t = helper_and_branch(pg, "h2")
    t.execute("SELECT shim_touch(2)")
    x = begin(pg)
    x.execute("UPDATE acct SET v = v + 1 WHERE id = 1")
    t.execute("PREPARE TRANSACTION 't2'")
    with pytest.raises(psycopg.errors.SerializationFailure):
        x.execute("PREPARE TRANSACTION 'x2'")
    x.close()
    cleanup(pg, "t2", "h2")
    got = ca.log_failures(read_log(pg, off))
    assert got == {("PREPARE", "Canceled on commit attempt with conflict in from prepared pivot"): 1}, got


def test_statement_kinds():
    assert ca.statement_kind("SELECT cotx.shim_touch($1)") == "slot write"
    assert ca.statement_kind("prepare transaction 'cotx:g:b0'") == "PREPARE"
    assert ca.statement_kind("UPDATE mt0 SET v = v + 1 WHERE k = $1") == "workload update"
    assert ca.statement_kind("SELECT v FROM mt0 WHERE k = $1") == "workload read"
    assert ca.reason("Reason code: Canceled on conflict out to pivot 1234, during read.") == \
        "Canceled on conflict out to pivot N, during read"

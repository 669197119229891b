"""The decision store's lifecycle, with a real daemon and real servers: a store restored
from an older copy, and stores made by the previous release.

A restored copy misses every commit recorded after it was taken. Presumed abort would
read such a commit as "abort" and roll back the branches still prepared while the others
committed: a split transaction. The transaction here is committed on PostgreSQL and still
prepared on MariaDB when the daemon is killed; the store is then put back to a copy taken
before the decision.

- without any protection (the daemon's witness file gone, as on a new machine): split,
  as on the daemon before the store lifecycle existed;
- with the witness: the daemon refuses to start and names the procedure;
- after `cotx-coordinator mark-restored`: it starts, leaves the branch prepared, answers
  "forgotten" (never "abort"), and an operator's force commit completes it."""
import json
import re
import sqlite3
from pathlib import Path

import psycopg
import pytest
from cotx import Coordinator, CotxError
from cotest.daemon import store_kind
from cotest.coord import make_daemon, my_prepared, nothing_prepared, wait_until
from cotest.coord import metric
from cotest.transfers import committed_both, transfer

pytestmark = pytest.mark.usefixtures("crash_tables")

STORE_0_1_0 = Path(__file__).resolve().parents[3] / "coordinator-daemon" / "tests" / "store-0.1.0"


def split_state(pg, mariadb, key):
    return (pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,))[0][0],
            mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,))[0][0])


def backup(db: Path, to: Path) -> None:
    """An online copy of a live SQLite store (SQLite's backup API), as an operator's
    backup job would take it; of a log store, its bytes (a batch torn by the copy is cut
    when the copy is opened)."""
    if store_kind() == "log":
        to.write_bytes(db.read_bytes())
        return
    with sqlite3.connect(db) as src, sqlite3.connect(to) as dst:
        src.backup(dst)


def restore(db: Path, copy: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(copy.read_bytes())


def tick_of(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        return c.execute("SELECT tick FROM meta").fetchone()[0]


def committed_on_pg_prepared_on_mariadb(d, pg, mariadb, key):
    """A transfer decided commit, its PostgreSQL branch committed, its MariaDB branch
    still prepared (the application stopped mid fan-out), the daemon killed."""
    tx, (pc, mc) = transfer(d, pg, mariadb, key)

    def finish_first_only(decision):
        tx.outcome = decision
        tx._branches[0].finish(decision, ack=False)
    tx._finish = finish_first_only
    tx.commit()
    assert tx.outcome == "commit"
    pc.close()
    mc.close()
    assert split_state(pg, mariadb, key) == (1, 0) and len(my_prepared(mariadb)) == 1
    d.kill9()
    return tx.gtid


@pytest.fixture
def daemon(pg, mariadb):
    # The owner grace keeps the daemon from finishing the branches itself before it is
    # killed; a short lease renewal moves the store's tick on quickly.
    d = make_daemon(pg, mariadb, timeouts={"owner_grace_ms": 600000}, lease={"ttl_ms": 3000, "renew_ms": 200})
    d.start()
    yield d
    d.destroy()


def restored_before_the_decision(d, pg, mariadb, key):
    db = Path(d.store["path"])
    copy = d.dir / "backup.db"
    seen = json.loads(Path(str(db) + ".witness").read_text())["tick"]
    backup(db, copy)
    witness = json.loads(Path(str(db) + ".witness").read_text())
    # A renewal after the copy: the witness has seen the store further on than the copy.
    # (The log's tick is not read from outside: five renewals after the copy are enough.)
    after = (lambda: seen + 5) if store_kind() == "log" else (lambda: tick_of(copy) + 1)
    wait_until(lambda: json.loads(Path(str(db) + ".witness").read_text())["tick"] >= after(), what="a lease renewal after the backup")
    assert witness["store_id"]
    gtid = committed_on_pg_prepared_on_mariadb(d, pg, mariadb, key)
    restore(db, copy)
    return gtid


def test_a_restored_copy_without_protection_splits_a_committed_transaction(pg, mariadb, daemon):
    """The defect: a daemon that cannot tell (no witness: a new machine, or the daemon
    before the store lifecycle) presumes abort for a commit missing from the copy."""
    gtid = restored_before_the_decision(daemon, pg, mariadb, "restore-split")
    Path(daemon.store["path"] + ".witness").unlink()
    daemon.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to act on the prepared branch")
    assert split_state(pg, mariadb, "restore-split") == (1, 0), "committed on PostgreSQL, rolled back on MariaDB"
    assert gtid


def test_a_restored_copy_is_refused_then_sealed_and_nothing_splits(pg, mariadb, daemon):
    gtid = restored_before_the_decision(daemon, pg, mariadb, "restore-sealed")
    # The witness notices: the daemon refuses to start and names the way out.
    with pytest.raises(RuntimeError) as e:
        daemon.start()
    assert "went back to an older copy" in str(e.value) and "mark-restored" in str(e.value)
    assert len(my_prepared(mariadb)) == 1, "nothing was acted on"

    r = daemon.cli("mark-restored")
    assert r.returncode == 0, r.stderr
    assert re.search(r"restore #1\): [1-9]\d* epoch\(s\) sealed", r.stdout), r.stdout

    daemon.start()
    runs = metric(daemon, "cotx_recovery_runs_total")
    wait_until(lambda: metric(daemon, "cotx_recovery_runs_total") >= runs + 3, what="three recovery passes")
    assert len(my_prepared(mariadb)) == 1 and split_state(pg, mariadb, "restore-sealed") == (1, 0), \
        "the branch of a commit missing from the copy must stay prepared, not be presumed aborted"
    # Never "abort": the daemon says it does not know, and lists it for the operator.
    coord = Coordinator(daemon.url, daemon.token)
    with pytest.raises(CotxError) as e:
        coord.decision(gtid)
    assert getattr(e.value, "code", "") in ("quarantined", "outcome_forgotten"), e.value
    report = json.loads(daemon.cli("in-doubt", "--json", check=True).stdout)
    listed = [q for q in report["quarantined"] if q["gtid"] == gtid]
    assert listed and "restored" in listed[0]["problem"], report

    # The operator checks the other branch (committed on PostgreSQL) and forces commit.
    f = daemon.cli("force", gtid, "commit", "--yes-i-know", "--reason", "committed on pg before the store was restored")
    assert f.returncode == 0, f.stderr
    wait_until(lambda: nothing_prepared(pg, mariadb), what="the forced commit to complete")
    assert committed_both(pg, mariadb, "restore-sealed")

    # New transactions run as before on the restored store.
    tx, _ = transfer(daemon, pg, mariadb, "restore-after")
    tx.commit()
    assert tx.outcome == "commit" and committed_both(pg, mariadb, "restore-after")


def test_mark_restored_refuses_while_a_daemon_runs(daemon):
    r = daemon.cli("mark-restored")
    assert r.returncode == 1 and "in use by another process" in r.stderr, r.stderr


def test_a_sqlite_store_of_release_0_1_0_is_upgraded(pg, mariadb, tmp_path):
    """A store made by the previous release (its schema: coordinator-daemon/tests/store-0.1.0)
    holding a commit whose MariaDB branch is still prepared: the new daemon upgrades it in
    place and commits the branch from the old record."""
    key = "upgrade-sqlite"
    d = make_daemon(pg, mariadb, workdir=str(tmp_path), store={"kind": "sqlite", "path": str(tmp_path / "decisions.db")})
    gtid, bid = prepared_on_mariadb(d, mariadb, key)
    with sqlite3.connect(tmp_path / "decisions.db") as c:
        c.executescript((STORE_0_1_0 / "sqlite.sql").read_text())
        c.execute("INSERT INTO decisions VALUES (?, 'commit', ?, 1, ?, 'coordinator')", (gtid, json.dumps([["my", bid]]), d.node_id))
        c.execute("INSERT INTO epochs VALUES (?, ?, 1)", (d.node_id, int(gtid.split(".")[1].split("-")[0], 16)))
    try:
        d.start()
        wait_until(lambda: not my_prepared(mariadb), what="recovery to commit from the 0.1.0 record")
        assert mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,))[0][0] == 1
        with sqlite3.connect(tmp_path / "decisions.db") as c:
            assert c.execute("SELECT schema_version FROM meta").fetchone()[0] == 2
    finally:
        d.destroy()


def test_a_postgres_store_of_release_0_1_0_is_upgraded_and_a_newer_one_refused(pg, mariadb, tmp_path):
    key = "upgrade-pg"
    table = "old_store"
    dsn = pg.dsn.replace("dbname=postgres", "dbname=cotx_upgrade")
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS cotx_upgrade")
        c.execute("CREATE DATABASE cotx_upgrade")
    d = make_daemon(pg, mariadb, workdir=str(tmp_path), store={"kind": "postgres", "dsn": dsn, "table": table})
    gtid, bid = prepared_on_mariadb(d, mariadb, key)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute((STORE_0_1_0 / "postgres.sql").read_text().replace("{t}", table))
        c.execute(f"INSERT INTO {table} VALUES (%s, 'commit', %s, 1, %s, 'coordinator')", (gtid, json.dumps([["my", bid]]), d.node_id))
        c.execute(f"INSERT INTO {table}_epochs VALUES (%s, %s, 1)", (d.node_id, int(gtid.split(".")[1].split("-")[0], 16)))
    try:
        d.start()
        wait_until(lambda: not my_prepared(mariadb), what="recovery to commit from the 0.1.0 record")
        assert mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,))[0][0] == 1
        d.stop()
        with psycopg.connect(dsn, autocommit=True) as c:
            assert c.execute(f"SELECT schema_version FROM {table}_meta").fetchone()[0] == 2
            c.execute(f"UPDATE {table}_meta SET schema_version = 3")
        with pytest.raises(RuntimeError) as e:
            d.start()
        assert "schema version 3" in str(e.value) and "newer cotx-coordinator" in str(e.value)
    finally:
        d.destroy()


XA_FORMAT_ID = 0x636F7478  # coordinator-daemon/src/naming.rs


def prepared_on_mariadb(d, mariadb, key):
    """A MariaDB branch prepared under a gtid of node d.node_id, epoch 0x10, with the XID
    the daemon gives its branches (naming.rs), as a daemon of release 0.1.0 left it after
    its commit decision; returns (gtid, branch id)."""
    gtid, bid = f"{d.node_id}.0000000000000010-1", "b1"
    c = mariadb.connect()
    xid = f"{c.escape(gtid)},{c.escape(bid)},{XA_FORMAT_ID}"
    with c.cursor() as cur:
        cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")  # mysql_co refuses less
        cur.execute(f"XA START {xid}")
        cur.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
        cur.execute(f"XA END {xid}")
        cur.execute(f"XA PREPARE {xid}")
    c.close()
    assert my_prepared(mariadb)
    return gtid, bid

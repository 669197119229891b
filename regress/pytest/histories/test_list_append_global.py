"""Jepsen's list-append across PostgreSQL and MariaDB (checker/list_append_global.py), the
short form: each global transaction appends to and reads keys on both databases (upserts
on both), through a real coordinator daemon and the `cotx` Python client, in every mode
users run, and the combined history is checked for cycles.

- co, dip, client, pg_co+client, client+mysql_co: no cycle, no lost append, nothing left
  prepared;
- plain 2PC (enforcement none, every branch still SERIALIZABLE): cycles, each crossing the
  two databases (what the rule forbids, shown without it). Run again, up to BASELINE_TRIES
  times, until one is found.

The long runs for the record: docs/guarantees.md (`python -m checker.list_append --engines
pg,my --mode MODE --txns N`).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from checker.list_append_global import MODES, numbers, run
from cotest.marks import requires_mysql_co, requires_pg_co

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [requires_pg_co, requires_mysql_co]

TXNS = int(os.environ.get("COTX_LIST_APPEND_TXNS", 150))
BASELINE_TRIES = 6
SEED = int(os.environ.get("COTX_LIST_APPEND_SEED", 1))


@pytest.fixture(scope="module")
def servers(pg, mariadb):
    yield pg, mariadb
    # The module's servers go back to the project on (run() switched them per mode).
    pg.sql("ALTER SYSTEM SET pg_co.enabled = on")
    pg.sql("SELECT pg_reload_conf()")
    mariadb.sql("SET GLOBAL mysql_co_enabled = ON")


def explain(res) -> str:
    from checker.list_append import summary
    return summary(res, "", show=3)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "none"])
def test_no_cycle_across_engines_with_the_project(servers, mode):
    pg, my = servers
    res = run(pg, my, mode=mode, txns=TXNS, seed=SEED)
    n = numbers(res)
    print(mode, n)
    assert not res.anomalous, explain(res)
    assert n["left_prepared"] == 0, n
    assert n["unknown"] == 0, explain(res)
    # The workload ran and conflicted: enough committed to have edges between them.
    assert n["committed"] >= TXNS // 4 and n["edges"] > n["committed"], n
    # Both databases in every committed transaction's history (the cross-engine part).
    both = [r for r in res.records if r.status == "ok"
            and {k.split(":")[0] for _, k, _ in r.ops} == {"pg", "my"}]
    assert len(both) == n["committed"], n
    if MODES[mode][2]:
        # dip: the decisions were written inside the PostgreSQL branches (co.decide), not
        # only by the daemon. Counted by the daemon: the co.decisions rows themselves are
        # purged once every branch finished, sometimes all before a query could see one.
        assert res.decided_in_participant > 0, f"no commit decided in a participant among {n['committed']}"


def test_plain_2pc_shows_cycles_across_engines(servers):
    """The baseline: without commitment ordering the same workload commits histories with
    cycles, each through both databases (every branch is SERIALIZABLE, so no cycle lies
    within one database)."""
    pg, my = servers
    tries = []
    for i in range(BASELINE_TRIES):
        res = run(pg, my, mode="none", txns=TXNS, seed=SEED + i)
        tries.append(numbers(res))
        if res.cycles():
            break
    print(tries)
    cycles = res.cycles()
    assert cycles, f"no cycle in {len(tries)} plain-2PC runs of {TXNS} transactions: {tries}"
    assert not res.lost_appends(), res.lost_appends()
    for c in cycles:
        # The keys its edges stand on: some on each database (every transaction touches
        # both, so the members alone would say nothing).
        dbs = {m for _, _, _, why in c.edges for m in re.findall(r"\b(pg|my):txn", why)}
        assert dbs == {"pg", "my"}, c.text


def test_cli_refuses_what_it_cannot_run():
    """Bad input gets a clear error and exit status 2, before any server starts."""
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "checker.list_append", *args], capture_output=True,
                              text=True, cwd=ROOT, timeout=60)
    r = cli("--engines", "pg", "--mode", "co", "--txns", "10")
    assert r.returncode == 2 and "only pg,my" in r.stderr, r.stderr
    r = cli("--engines", "pg,my", "--mode", "co")
    assert r.returncode == 2 and "--txns N or --seconds S" in r.stderr, r.stderr
    r = cli("--engines", "pg,my", "--mode", "pg_co", "--txns", "10")
    assert r.returncode == 2 and "invalid choice" in r.stderr, r.stderr

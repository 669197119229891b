"""Client mode (Sonata's shims, no pg_co / mysql_co) on the small schedules of
checker/schedules.py, on real servers without the extension and the plugin.

Client mode: at PostgreSQL a prepared helper transaction shared by the global branches,
prepared before the schedule's first step and reading a block of slots in cotx.shim, as the
daemon runs them (checker.schedules.Runner, "shared"), and each branch's write of its own
slot before PREPARE TRANSACTION; the older helper per branch, and two broken helpers
(READ ONLY, rolled back before its branch commits) that let an overdraft through;
at MariaDB the branch SERIALIZABLE (verified) and a write of its slot in cotx_shim before
XA END (checker.schedules.Runner, sql/client_mode/, cotx.dialect). Local transactions get
nothing.

What is shown, each with a baseline on the same servers (so each test can fail):
  * global transactions only (the named overdrafts, a seeded sample of the pairs of
    global transactions, a few schedules of three): client mode, 0 non-serializable
    histories (the graph checker and the brute-force oracle agree); plain 2PC, and the
    same branches SERIALIZABLE without the shims, have anomalies;
  * single-branch global transactions committed in one phase (the slot write, then COMMIT
    / XA COMMIT ONE PHASE, the helper kept until that COMMIT ended), against global,
    one-phase and local transactions on both databases, and as rule C's reader: 0; the
    same without the shims has anomalies, and a one-phase branch without its slot write
    lets rule C's cycle commit;
  * one database each way (pg_co + MariaDB in client mode, PostgreSQL in client mode +
    mysql_co): 0; plain 2PC on those servers > 0;
  * local transactions, docs/guarantees.md's table "Client mode: what it guarantees":
    rule C's named schedule (a local reader at PostgreSQL) is non-serializable in client
    mode and refused by pg_co in engine mode; the schedules of rule C's three families
    that the full run found non-serializable in client mode (HOLE) are again, each of
    them, and serializable in engine mode; their number is the table's.
Full runs: docs/guarantees.md (`python -m checker.schedules --full --modes client,co`)."""
import os
import re
from pathlib import Path

import pytest
from checker.schedules import (Runner, Tally, full_set, named_schedules, one_phase_named, run_many,
                               sample, three_sample)
from cotest.marks import requires_mysql_co, requires_pg_co
from cotest import MariaServer, PgServer

ROOT = Path(__file__).resolve().parents[3]
GLOBAL_SAMPLE = int(os.environ.get("COTX_CLIENT_SAMPLE", 300))
MIXED_SAMPLE = int(os.environ.get("COTX_CLIENT_MIXED_SAMPLE", 120))
THREE = int(os.environ.get("COTX_CLIENT_THREE", 40))
ONE_PHASE_SAMPLE = int(os.environ.get("COTX_CLIENT_ONE_PHASE_SAMPLE", 160))

OVERDRAFTS = [x for x in named_schedules() if x[0].startswith("overdraft")]
RULE_C_NAMED = [x for x in named_schedules() if x[0].startswith("rule C")]

# The schedules of rule C's programs that the full client-mode run
# (`--full --modes client,co`, docs/guarantees.md) found non-serializable; engine mode
# kept each serializable (a refusal, or the reader waited). Labels of `python -m checker.schedules --count`'s families.
HOLE = {
    "ruleC": [
        811, 812, 815, 821, 822, 825, 831, 832, 835, 4517, 4520, 4536, 4539, 4555, 4825,
        4826, 4829, 4844, 4845, 4848, 4863, 4864, 4867, 4896, 4899, 4900, 4915, 4918,
        4919, 4934, 4937, 4938, 5205, 5208, 5224, 5227, 5243, 5246, 10081, 10084, 10085,
        10091, 10094, 10095, 10101, 10104, 10105],
    "ruleC_my": [
        43, 44, 115, 116, 170, 171, 254, 255, 266, 267, 683, 684, 761, 762, 773, 774,
        1628, 1629, 1640, 1641, 1684, 1685, 3031, 3032, 3095, 3096],
    "ruleC_ro": [
        811, 812, 821, 822, 825, 831, 832, 4517, 4520, 4536, 4539, 4555, 4558, 4825,
        4826, 4829, 4844, 4848, 4863, 4864, 4867, 4896, 4899, 4900, 4918, 4919, 4934,
        4937, 4938, 5205, 5208, 5224, 5227, 5243, 5246, 10081, 10084, 10085, 10091,
        10094, 10095, 10101, 10104, 10105],
}


@pytest.fixture(scope="module")
def pg_bare():
    """PostgreSQL without pg_co (not in shared_preload_libraries, no extension)."""
    with PgServer(preload=False) as s:
        yield s


@pytest.fixture(scope="module")
def my_bare():
    """MariaDB without mysql_co."""
    with MariaServer(plugin=False) as s:
        yield s


@pytest.fixture(scope="module")
def client(pg_bare, my_bare):
    r = Runner(pg_bare, my_bare, mode="client")
    assert r.has_ext == {"pg": False, "my": False}
    yield r
    r.close()


@pytest.fixture(scope="module")
def engine(pg, mariadb):
    """pg_co and mysql_co on: the project's engine mode."""
    r = Runner(pg, mariadb, mode="co")
    assert r.has_ext == {"pg": True, "my": True}
    yield r
    r.close()


def verdict(runner, mode, items):
    runner.set_mode(mode)
    t = run_many(runner, items, Tally(mode))
    print(t.line())
    return t


def failures(t):
    return [(r.label, " ".join(r.executed), [a.text for a in r.anomalies]) for r in t.failures]


def assert_serializable(t, n):
    """Every schedule ran, none non-serializable, checker and oracle agree, some refused."""
    assert t.run == n
    assert t.anomalies == 0, failures(t)
    assert t.oracle_disagrees == 0
    assert 0 < t.refused < t.run


def assert_anomalies_found(t):
    assert t.anomalies > 0
    assert t.oracle_disagrees == 0


@pytest.fixture(scope="module")
def global_pairs():
    """A seeded sample of every schedule of two global transactions (`g*+g*`)."""
    return sample(full_set("g*+g*"), GLOBAL_SAMPLE, seed=6)


# --- global transactions only ---------------------------------------------------------

def test_overdrafts_client_mode(client):
    """The named overdraft schedules: client mode refuses T2 (T1's helper makes T1 the
    pivot of a dangerous structure at PostgreSQL); plain 2PC, and the branches SERIALIZABLE
    without the shims (MariaDB's read-only prepared branch drops its read lock), let the
    overdraft commit."""
    client.set_mode("client")
    for label, progs, steps in OVERDRAFTS:
        r = client.run(label, progs, steps)
        assert not r.anomalies and r.oracle_serializable, (label, r.executed)
        assert r.refused, (label, r.executed)
    for mode in ("plain", "plain-serializable"):
        client.set_mode(mode)
        for label, progs, steps in OVERDRAFTS:
            r = client.run(label, progs, steps)
            assert r.committed == ["T1", "T2"] and r.anomalies and not r.oracle_serializable, (mode, label, r.executed)


@pytest.mark.parametrize("policy", ["shared-readonly", "released-at-prepare"])
def test_broken_helpers_let_the_overdraft_through(pg_bare, my_bare, policy):
    """The daemon's helpers are shared and prepared ahead of need (Runner's "shared",
    used by every client-mode test here). Two ways to get that wrong, each shown to let an
    overdraft commit, so that the schedules above can fail: the helper declared READ ONLY
    (PostgreSQL's SSI leaves a READ ONLY transaction out of the dangerous structure, and a
    pre-prepared one's snapshot is older than the successor's prepare), and the helper
    rolled back once its branch prepared, before that branch commits."""
    r = Runner(pg_bare, my_bare, mode="client", pg_helpers=policy)
    try:
        through = [label for label, progs, steps in OVERDRAFTS
                   if (res := r.run(label, progs, steps)).committed == ["T1", "T2"] and res.anomalies]
    finally:
        r.close()
    assert through, f"{policy}: every overdraft was still refused"


def test_the_older_per_branch_helpers_still_refuse_the_overdrafts(pg_bare, my_bare):
    """The one-helper-per-branch policy of older daemons (a rolling upgrade runs both)."""
    r = Runner(pg_bare, my_bare, mode="client", pg_helpers="per-branch")
    try:
        for label, progs, steps in OVERDRAFTS:
            res = r.run(label, progs, steps)
            assert res.refused and not res.anomalies, (label, res.executed)
    finally:
        r.close()


def test_global_pairs_client_mode_are_serializable(client, global_pairs):
    assert_serializable(verdict(client, "client", global_pairs), len(global_pairs))


@pytest.mark.parametrize("mode", ["plain", "plain-serializable"])
def test_global_pairs_baselines_have_anomalies(client, global_pairs, mode):
    """The same schedules on the same servers: plain 2PC (MariaDB REPEATABLE READ), and
    the branches SERIALIZABLE without the shims: anomalies, which the checker finds."""
    assert_anomalies_found(verdict(client, mode, global_pairs))


def test_three_globals_client_mode(client):
    """Three concurrent global transactions, drawn by seed 1 (and the baseline without
    the shims)."""
    items = three_sample(THREE, seed=1, only="g*+g*+g*")
    assert_serializable(verdict(client, "client", items), len(items))
    assert_anomalies_found(verdict(client, "plain-serializable", items))


# --- single-branch global transactions committed in one phase ----------------------------

ONE_PHASE_NAMED = one_phase_named()


@pytest.fixture(scope="module")
def one_phase_items():
    """A seeded sample of the one-phase combinations (`g*+o*`, `o*+o*`, `o*+l*`, rule C
    with a one-phase reader at PostgreSQL and at MariaDB), and the named one."""
    return ONE_PHASE_NAMED + sample(full_set(one_phase=True), ONE_PHASE_SAMPLE, seed=6)


def test_one_phase_client_mode_is_serializable(client, one_phase_items):
    """A single-branch global transaction commits in one phase in client mode: its slot
    write, just before COMMIT (PostgreSQL) or XA END (MariaDB), makes it the pivot of a
    dangerous structure with its helper, which PostgreSQL's SSI refuses at COMMIT as at
    PREPARE; MariaDB keeps its SERIALIZABLE locks to the end of a one-phase commit. The
    baseline without the shims has anomalies on the same schedules."""
    assert_serializable(verdict(client, "client", one_phase_items), len(one_phase_items))
    assert_anomalies_found(verdict(client, "plain-serializable", one_phase_items))


def test_one_phase_rule_c_reader_refused(client, pg_bare, my_bare):
    """Rule C's named schedule with the reader a one-phase global transaction: client mode
    refuses the reader at its COMMIT; a broken one phase without the slot write makes it a
    local reader, and rule C's cycle commits (the schedules above can fail)."""
    (label, progs, steps), = ONE_PHASE_NAMED
    client.set_mode("client")
    r = client.run(label, progs, steps)
    assert "L" in r.aborted and not r.anomalies and r.oracle_serializable, r.executed
    broken = Runner(pg_bare, my_bare, mode="client", pg_helpers="one-phase-untouched")
    try:
        b = broken.run(label, progs, steps)
    finally:
        broken.close()
    assert b.committed == ["Y", "G", "L"] and b.anomalies and not b.oracle_serializable, b.executed


# --- one database in engine mode, the other in client mode -----------------------------

@requires_pg_co
@requires_mysql_co
@pytest.mark.parametrize("mode", ["pg_co+client", "client+mysql_co"])
def test_mixed_pairs(mode, pg, mariadb, pg_bare, my_bare, global_pairs):
    """pg_co + MariaDB without mysql_co in client mode, and PostgreSQL without pg_co in
    client mode + mysql_co: the overdrafts and a sample of the pairs of global
    transactions are serializable; plain 2PC on the same servers is not."""
    servers = (pg, my_bare) if mode == "pg_co+client" else (pg_bare, mariadb)
    r = Runner(*servers, mode=mode)
    try:
        assert r.has_ext == {"pg": mode == "pg_co+client", "my": mode == "client+mysql_co"}
        items = OVERDRAFTS + global_pairs[:MIXED_SAMPLE]
        assert_serializable(verdict(r, mode, items), len(items))
        assert_anomalies_found(verdict(r, "plain", items))
    finally:
        r.close()


# --- local transactions: engine mode vs client mode (docs/guarantees.md) ---------------

def documented(family):
    """{column: (run, non-serializable)} of the row of docs/guarantees.md's table "Client
    mode: what it guarantees" whose first cell names `family` in backquotes; columns
    "engine", "client" (and "baseline" where the row has it)."""
    text = (ROOT / "docs" / "guarantees.md").read_text()
    section = text.split("\n## Client mode: what it guarantees", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines()
               if line.startswith("|") and f"`{family}`" in line.split("|")[1])
    cells = [c.strip() for c in row.strip().strip("|").split("|")][1:]
    out = {}
    NUM = r"\d{1,3}(?: \d{3})*"          # 11 091
    for name, cell in zip(("engine", "client", "baseline"), cells):
        m = re.match(rf"\**({NUM})\s*/\s*\**({NUM})\**", cell)
        if m:
            out[name] = tuple(int(g.replace(" ", "")) for g in m.groups())
    return out


def test_documented_table_is_read():
    """The parser above finds the rows the tests below compare with."""
    for family in ("g*+g*", "g*+l*", "rule C", *HOLE):
        got = documented(family)
        assert {"engine", "client"} <= set(got), (family, got)


@requires_pg_co
@requires_mysql_co
def test_rule_c_named_is_the_hole(engine, client):
    """Rule C's named schedule (a local reader at PostgreSQL sees G, not Y, while G saw Y)
    commits all three in client mode, a G-single cycle through the local reader; engine
    mode refuses the reader (pg_co rule C)."""
    (label, progs, steps), = RULE_C_NAMED
    assert documented("rule C")["client"] == (1, 1) and documented("rule C")["engine"] == (1, 0)
    client.set_mode("client")
    cl = client.run(label, progs, steps)
    assert cl.committed == ["Y", "G", "L"], cl.executed
    assert [a.kind for a in cl.anomalies] == ["G-single"] and not cl.oracle_serializable, cl.executed
    assert set(cl.anomalies[0].txns) == {"Y", "G", "L"}
    engine.set_mode("co")
    co = engine.run(label, progs, steps)
    assert not co.anomalies and co.oracle_serializable and "pg_co rule C" in co.aborted["L"], co.executed


@requires_pg_co
@requires_mysql_co
def test_rule_c_families_hole_as_documented(engine, client):
    """The schedules of rule C's three families (the PostgreSQL reader READ WRITE and READ
    ONLY, the MariaDB autocommit reader) that the full run found non-serializable in client
    mode: their number per family is the table's; rerun now, each family has
    non-serializable ones again in client mode, every cycle through the local reader L, and
    every one of them is serializable in engine mode. (Each one need not fail again: a
    schedule's refusals can depend on where PostgreSQL put a row version, which differs
    from run to run; the hole is the family's, not one schedule's.)"""
    wanted = {f"{fam}#{i}" for fam, idx in HOLE.items() for i in idx}
    items = [x for x in full_set(",".join(HOLE)) if x[0] in wanted]
    assert len(items) == len(wanted)
    for fam, idx in HOLE.items():
        assert documented(fam)["client"][1] == len(idx), fam
        assert documented(fam)["engine"][1] == 0, fam
    client.set_mode("client")
    engine.set_mode("co")
    again = {fam: 0 for fam in HOLE}
    for label, progs, steps in items:
        cl = client.run(label, progs, steps)
        if cl.anomalies:
            again[label.split("#")[0]] += 1
            assert not cl.oracle_serializable, (label, cl.executed)
            assert all("L" in a.txns for a in cl.anomalies), (label, [a.text for a in cl.anomalies])
        co = engine.run(label, progs, steps)
        assert not co.anomalies and co.oracle_serializable, (label, co.executed)
    assert all(n > 0 for n in again.values()), again

"""The upsert list-append workload (checker/list_append.py) on a real PostgreSQL server.

PostgreSQL's own SERIALIZABLE lets a G2 cycle through this workload about once or twice
per 100 000 committed transactions (docs/upsert-workloads.md): far too rare for a
short sample to show. So this file checks that the harness can fail and that the
configuration the project vouches for stays clean in a sample:
- at REPEATABLE READ the same workload must show write-skew cycles (snapshot isolation
  allows them freely), which proves the recording and the checker see them;
- at SERIALIZABLE with pg_co enforcing and every transaction a 2PC branch it must show
  none;
- the command exits 1 when it finds a cycle, so a longer run can be a test of its own.
"""
import random
import re

import pytest
from checker import list_append
from cotest.marks import requires_pg_co
from cotest import PgServer


@pytest.fixture(scope="module")
def pg_co_server():
    with PgServer(preload=True, conf=list_append.server_conf("pg_co")) as s:
        yield s


def test_key_windows_roll_and_values_are_unique():
    keys = list_append.KeySpace(window=6, max_appends=5)
    rng = random.Random(3)
    appends = [op for _ in range(2000) for op in keys.gen(rng) if op[0] == "append"]
    values = [v for _, _, _, v in appends]
    assert len(values) == len(set(values))
    per_key = {}
    for _, t, k, _ in appends:
        per_key[(t, k)] = per_key.get((t, k), 0) + 1
    assert max(per_key.values()) == 5            # retired after 5 appends
    assert all(len(w) == 6 for w in keys.windows)
    assert len(per_key) > 3 * 6 * 10             # the windows moved on: mostly fresh keys


@requires_pg_co
def test_repeatable_read_shows_write_skew(pg_co_server):
    # Snapshot isolation: two upserts that each read the key the other inserts both commit.
    res = list_append.run(pg_co_server, seconds=6, isolation="repeatable-read", txn="local", seed=2)
    text = list_append.summary(res, "repeatable-read", show=1)
    cycles = res.cycles()
    assert res.committed > 100, text
    assert cycles, "the checker found no cycle at REPEATABLE READ:\n" + text
    assert any(t == "rw" for c in cycles for _, t, _, _ in c.edges), text
    assert "missing" in text and "members:" in text and "waited > 0.5s in a statement" in text


@requires_pg_co
def test_serializable_2pc_with_pg_co_has_no_cycle(pg_co_server):
    res = list_append.run(pg_co_server, seconds=20, isolation="serializable", txn="2pc", seed=3, pg_co=True)
    text = list_append.summary(res, "pg_co 2pc")
    assert res.committed > 100, text
    assert not res.report.anomalies, text
    assert res.left_prepared == 0, text
    # pg_co's counters and the client's classification of refusals tell the same story.
    refused = sum(c for kind, c in res.aborts().items() if kind.startswith("pg_co"))
    counted = sum(res.co_stats[c] or 0 for c in ("refused_rule_a", "refused_summarized", "refused_rule_b", "refused_rule_c"))
    assert refused == counted, text


def test_command_exits_1_on_a_cycle(capsys, tmp_path):
    log = tmp_path / "run.jsonl"
    assert list_append.main(["--mode", "plain", "--isolation", "repeatable-read", "--seconds", "4", "--show", "1",
                             "--log", str(log)]) == 1
    out = capsys.readouterr().out
    assert "cycles: " in out and "CYCLE 1 of" in out
    # The recorded run, checked again without a server, finds the same cycles.
    assert list_append.main(["--from-log", str(log), "--show", "0"]) == 1
    again = capsys.readouterr().out
    assert re.search(r"cycles: (\d+)", again).group(1) == re.search(r"cycles: (\d+)", out).group(1)


def test_command_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        list_append.main(["--mode", "pg_co", "--txn", "2pc", "--isolation", "repeatable-read"])
    assert e.value.code == 2
    assert "pg_co refuses to prepare" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        list_append.main(["--seconds", "0"])

"""The overdraft demo end to end (demo/overdraft.py): real servers, the real coordinator
process, the two service processes passing the gtid. Plain 2PC breaks the invariant and
the checker explains the cycle; with cotx the total never goes below 0, refusals are
retried, and the checker finds no cycle."""
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from checker import serial_order
from cotest.marks import requires_mysql_co, requires_pg_co


# The demo is a script (`python demo/overdraft.py`), not an installed package: load it
# from its file to drive its parts one by one.
_spec = importlib.util.spec_from_file_location(
    "overdraft", Path(__file__).resolve().parents[3] / "demo" / "overdraft.py")
overdraft = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overdraft)

pytestmark = [requires_pg_co, requires_mysql_co]


def started_bank(extensions: bool):
    b = overdraft.Bank(Path(tempfile.mkdtemp(prefix="cotx-demo-test-")), extensions=extensions)
    try:
        b.start()
        yield b
    finally:
        b.stop()
        shutil.rmtree(b.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def bank():
    yield from started_bank(extensions=True)


def test_plain_2pc_overdraws_and_checker_explains(bank):
    # A long think time makes the race (both read before either commits) all but certain.
    st = overdraft.run_mode(bank, "plain", rounds=3, think_ms=600)
    cycles = st["report"].cycles()
    # Every round that went negative is a cycle in the history, and the other way round.
    assert st["negative_rounds"] == len(cycles)
    assert st["negative_rounds"] >= 1, "plain 2PC never overdrew: the race did not happen"
    assert st["lowest"] == 100 - 2 * overdraft.AMOUNT
    for c in cycles:
        assert c.kind in ("G2", "G-single") and len(c.txns) == 2
        assert "rw" in {t for _, t, _, _ in c.edges}


def test_observe_only_flags_every_cycle_and_refuses_nothing(bank):
    """`--mode observe`: plain 2PC with pg_co and mysql_co in observe-only mode. The rounds
    overdraw as in plain mode (nothing refused), and every cycle the checker finds has a
    member the engines would have refused (named in their logs by gtid)."""
    st = overdraft.run_mode(bank, "observe", rounds=3, think_ms=600)
    assert st["retries"] == 0 and st["refused"] == 0, "observe-only refused something"
    cycles = st["report"].cycles()
    assert st["negative_rounds"] == len(cycles) >= 1, "the race did not happen"
    assert st["cycles_flagged"] == len(cycles)
    # MariaDB's branches ran REPEATABLE READ: mysql_co would have refused each of them.
    assert overdraft.observed_count(st, "mysql_co").startswith(f"{st['withdrawn']} (isolation")


def test_cotx_never_overdraws(bank):
    st = overdraft.run_mode(bank, "co", rounds=3, think_ms=200)
    assert st["negative_rounds"] == 0 and st["lowest"] >= 0
    assert st["report"].ok, st["report"].summary()
    assert st["withdrawn"] >= 3 and st["failed"] == 0
    # Each round: one withdrawal done, the other declined (after a refusal, when they raced).
    assert st["withdrawn"] + st["declined"] + st["refused"] == 6
    per_round = {}
    for t in st["history"]:
        per_round.setdefault(t.id.split("-")[1], []).append(t)
    for r, h in per_round.items():
        user = f"co-u{r[1:]}"
        final = {k: v for k, v in st["final"].items() if k.endswith("/" + user)}
        assert serial_order(h, final) is not None, (r, [x.to_json() for x in h])


@pytest.fixture(scope="module")
def bare_bank():
    """The demo's bank on servers with neither pg_co nor mysql_co loaded."""
    yield from started_bank(extensions=False)


def test_without_extensions_plain_2pc_overdraws_and_client_mode_does_not(bare_bank):
    """`--mode client`, shown twice on the same plugin-less servers: plain 2PC overdraws
    (the checker finds the cycles), client mode never does and its history is serializable."""
    plain = overdraft.run_mode(bare_bank, "plain", rounds=3, think_ms=600)
    assert plain["negative_rounds"] == len(plain["report"].cycles()) >= 1, "the race did not happen"
    st = overdraft.run_mode(bare_bank, "client", rounds=3, think_ms=200)
    assert st["negative_rounds"] == 0 and st["lowest"] >= 0
    assert st["report"].ok, st["report"].summary()
    assert st["withdrawn"] >= 3 and st["failed"] == 0
    assert st["withdrawn"] + st["declined"] + st["refused"] == 6


def test_demo_mode_client_prints_its_summary():
    """The command the docs give (`demo/overdraft.py --mode client`): exit 0 and a summary
    that says the invariant broke under plain 2PC and held in client mode."""
    p = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[3] / "demo" / "overdraft.py"),
                        "--mode", "client", "--rounds", "3"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "neither pg_co nor mysql_co loaded" in p.stdout
    line = next(x for x in p.stdout.splitlines() if x.startswith("invariant savings + checking >= 0"))
    assert line.split()[-2:] == ["BROKEN", "held"], line

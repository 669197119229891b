"""The append-only decision log store (`[store] kind = "log"`) through a real daemon and
real servers: the daemon killed (-9) between the decision and phase two (the branches are
committed after the restart from the log), `mark-restored` on a copy of the log put back
(a commit recorded after the copy answers "forgotten", never "abort"), and a torn tail
written by hand (the daemon starts, the acknowledged commits are there); and
`store.sync_method`, direct writes (the default) or fdatasync, seen in the daemon's open
handles."""
import os
import re
from pathlib import Path

import pytest
from cotx import Coordinator, CotxError
from cotest.coord import my_prepared, nothing_prepared, pg_prepared, wait_until
from cotest.transfers import Child, committed_both, transfer

pytestmark = pytest.mark.usefixtures("crash_tables")


def log_daemon(daemons, pg, mariadb, tmp_path, **kw):
    store = {"kind": "log", "path": str(tmp_path / "decisions.log")}
    return daemons.start(pg, mariadb, workdir=str(tmp_path), store=store, **kw)


def test_killed_between_decision_and_phase_two(pg, mariadb, daemons, tmp_path):
    # A long owner grace: the daemon does not fan out itself before it is killed.
    d = log_daemon(daemons, pg, mariadb, tmp_path, timeouts=dict(owner_grace_ms=600000))
    ch = Child(d, pg, mariadb, "after_decision", "log-after-decision")
    assert ch.what == "commit"
    d.kill9()
    ch.kill9()
    assert len(pg_prepared(pg)) == 1 and len(my_prepared(mariadb)) == 1
    d.start()
    wait_until(lambda: nothing_prepared(pg, mariadb), what="recovery to commit from the log's record")
    assert committed_both(pg, mariadb, "log-after-decision")
    assert Coordinator(d.url, d.token).decision(ch.gtid)["decision"] == "commit"


def test_mark_restored_on_a_copied_log(pg, mariadb, daemons, tmp_path):
    d = log_daemon(daemons, pg, mariadb, tmp_path)
    log = Path(d.store["path"])
    before, _ = transfer(d, pg, mariadb, "log-before-copy")
    before.commit()
    copy = log.read_bytes()
    after, _ = transfer(d, pg, mariadb, "log-after-copy")
    after.commit()
    assert before.outcome == after.outcome == "commit"
    d.stop()
    # Put back on a new machine (no witness: test_coordinator_store_lifecycle.py has the
    # witness's refusal); mark-restored seals the copy's epochs.
    log.write_bytes(copy)
    Path(str(log) + ".witness").unlink()
    r = d.cli("mark-restored")
    assert r.returncode == 0, r.stderr
    assert re.search(r"restore #1\): [1-9]\d* epoch\(s\) sealed", r.stdout), r.stdout
    d.start()
    coord = Coordinator(d.url, d.token)
    assert coord.decision(before.gtid)["decision"] == "commit", "the copy's records answer"
    with pytest.raises(CotxError) as e:
        coord.decision(after.gtid)
    assert getattr(e.value, "code", "") == "outcome_forgotten", e.value
    tx, _ = transfer(d, pg, mariadb, "log-after-restore")
    tx.commit()
    assert tx.outcome == "commit" and committed_both(pg, mariadb, "log-after-restore")


def test_a_torn_tail_written_by_hand(pg, mariadb, daemons, tmp_path):
    d = log_daemon(daemons, pg, mariadb, tmp_path)
    log = Path(d.store["path"])
    done = []
    for i in range(3):
        tx, _ = transfer(d, pg, mariadb, f"log-torn-{i}")
        tx.commit()
        done.append(tx.gtid)
    d.kill9()
    # A batch cut by the crash: a frame header and part of its body after the last whole
    # frame (past its last bytes, which may be zeros), the preallocated zeros after it.
    data = bytearray(log.read_bytes())
    end = max(i for i, b in enumerate(data) if b) + 64
    data[end:end + 40] = bytes([200, 1, 0, 0, 0xde, 0xad, 0xbe, 0xef]) + bytes(range(1, 33))
    log.write_bytes(bytes(data))
    d.start()
    assert "torn last batch dropped" in d.log_tail()
    coord = Coordinator(d.url, d.token)
    for g in done:
        assert coord.decision(g)["decision"] == "commit", g
    tx, _ = transfer(d, pg, mariadb, "log-torn-after")
    tx.commit()
    assert tx.outcome == "commit"
    # The cut is durable: the next start reads a clean log with every commit.
    d.stop()
    d.start()
    assert Coordinator(d.url, d.token).decision(tx.gtid)["decision"] == "commit"
    wait_until(lambda: nothing_prepared(pg, mariadb), what="every branch finished")


def log_handles(pid: int, path: Path) -> list[int]:
    """The open flags (/proc fdinfo, octal) of every handle the daemon holds on `path`."""
    flags = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != str(path):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                flags.append(int(re.search(r"^flags:\s+(\d+)", f.read(), re.M).group(1), 8))
        except (FileNotFoundError, AttributeError):
            continue
    return flags


def takes_direct(directory: Path) -> bool:
    probe = directory / "direct-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


@pytest.mark.parametrize("method", [None, "direct", "fdatasync"])
def test_sync_method(pg, mariadb, daemons, tmp_path, method):
    # store.sync_method: by default (and "direct") the appends go through a handle opened
    # O_DIRECT | O_DSYNC (where the file system takes O_DIRECT), with "fdatasync" through
    # none; the commits are there after a restart either way.
    store = {"kind": "log", "path": str(tmp_path / "decisions.log")}
    if method:
        store["sync_method"] = method
    d = daemons.start(pg, mariadb, workdir=str(tmp_path), store=store)
    tx, _ = transfer(d, pg, mariadb, f"log-sync-{method}")
    tx.commit()
    assert tx.outcome == "commit"
    flags = log_handles(d.proc.pid, Path(store["path"]))
    direct = [f for f in flags if f & os.O_DIRECT]
    if method == "fdatasync" or not takes_direct(tmp_path):
        assert not direct, [oct(f) for f in flags]
    else:
        assert len(direct) == 1 and direct[0] & os.O_DSYNC, [oct(f) for f in flags]
    used = "direct" if method != "fdatasync" and takes_direct(tmp_path) else "fdatasync"
    assert re.search(f'sync_method"?[=:]"?{used}"', d.log_tail()), d.log_tail()
    d.kill9()
    d.start()
    assert Coordinator(d.url, d.token).decision(tx.gtid)["decision"] == "commit"
    wait_until(lambda: nothing_prepared(pg, mariadb), what="every branch finished")

"""The decision store's file system fills up under a running daemon (a small tmpfs that
another file fills), as a hostile operator's full disk: a commit whose record cannot be
written is answered "pending" (503 store_unavailable: nothing rolled back), the daemon
keeps running, and once space is freed every pending decision is written and completed.
Nothing split, lost or left prepared. The decision log (`kind = "log"`) writes its batches
into blocks it allocated ahead (4 MiB), so it goes on committing on a full disk."""
import os
import subprocess

import pytest
from cotest.coord import api, decision_of, nothing_prepared, wait_until
from cotest.daemon import find_binary
from cotest.transfers import committed_both, prepared_transfer

pytestmark = [
    pytest.mark.usefixtures("crash_tables"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)"),
]


@pytest.fixture
def small_fs(tmp_path, request):
    """A small tmpfs (6 MiB unless the test asks for another size, `indirect`),
    unmounted at teardown whatever the test did."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    size = getattr(request, "param", "6m")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "cotx-small", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt) -> None:
    """Writes a file on `mnt` until the file system refuses (ENOSPC)."""
    with open(mnt / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


@pytest.mark.parametrize("kind", ["sqlite", "log"])
def test_a_full_disk_under_the_decision_store_loses_nothing(pg, mariadb, daemons, small_fs, kind):
    path = small_fs / ("decisions.db" if kind == "sqlite" else "decisions.log")
    d = daemons.start(pg, mariadb, store={"kind": kind, "path": str(path)})
    first = prepared_transfer(d, pg, mariadb, f"full-{kind}-0")
    assert api(d, "POST", f"/v1/transactions/{first}/commit", {})[1].get("decision") == "commit"
    gtids = [prepared_transfer(d, pg, mariadb, f"full-{kind}-{i}") for i in range(1, 4)]
    fill(small_fs)
    answers = [api(d, "POST", f"/v1/transactions/{g}/commit", {}) for g in gtids]
    for st, body in answers:
        if kind == "log":
            # Its batches go into blocks allocated ahead: a full disk does not stop it.
            assert (st, body.get("decision")) == (200, "commit"), (st, body)
        else:
            # Not written, not rolled back: the client polls for the outcome.
            assert st == 503 and body["error"]["code"] == "store_unavailable", (st, body)
    if kind == "sqlite":
        assert {decision_of(d, g) for g in gtids} != {"commit"}, "decided although not written"
        assert d.proc.poll() is None, "the daemon stopped on a full disk"
    os.remove(small_fs / "filler")
    wait_until(lambda: {decision_of(d, g) for g in gtids} == {"commit"}, timeout=15,
               what="the pending decisions written once space is freed")
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="every branch completed")
    for i in range(4):
        assert committed_both(pg, mariadb, f"full-{kind}-{i}")
    # Written, not only held in memory: a restart answers them from the store.
    d.stop()
    d.start()
    assert {decision_of(d, g) for g in [first, *gtids]} == {"commit"}


def test_a_log_store_made_on_a_full_disk_refuses_by_name_and_leaves_nothing(pg, mariadb, daemons, small_fs):
    """A new decision log on a disk with less than its first 4 MiB free: the daemon does not
    start and says why (the file, no space left); the half-written file is not left holding
    the space (failed before: its `.tmp` stayed, 2 MiB of the 2 left). Once space is freed
    it starts on the same path."""
    with open(small_fs / "filler", "wb") as f:
        f.write(b"\0" * (4 << 20))
    path = small_fs / "decisions.log"
    with pytest.raises(RuntimeError) as e:
        daemons.start(pg, mariadb, store={"kind": "log", "path": str(path)})
    assert "decisions.log" in str(e.value) and "No space left on device" in str(e.value), e.value
    assert sorted(os.listdir(small_fs)) == ["decisions.log.lock", "filler"], os.listdir(small_fs)
    os.remove(small_fs / "filler")
    d = daemons.start(pg, mariadb, store={"kind": "log", "path": str(path)})
    g = prepared_transfer(d, pg, mariadb, "full-new-log")
    assert api(d, "POST", f"/v1/transactions/{g}/commit", {})[1].get("decision") == "commit"
    # Its branches complete before the test ends: the store goes with the tmpfs, and a
    # branch left prepared would hold its locks in the next tests' servers.
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="every branch completed")


CHUNK = 4 << 20  # the log's allocation ahead (store/applog/file.rs CHUNK)


def frames_end(path) -> int:
    """Where the log's frames end: its last non-zero byte + 1 (the rest is allocated zeros)."""
    return len(path.read_bytes().rstrip(b"\0"))


def bench_decisions(path, n: int) -> int:
    """A fresh log at `path` (`bench-store` removes what was there) holding n decisions,
    each marked finished, written as the daemon writes them; returns where its frames end."""
    r = subprocess.run([find_binary(), "bench-store", "--path", str(path), "--backend", "applog", "--finish",
                        "--n", str(n), "--clients", "4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r
    return frames_end(path)


def log_near_its_end(path, low: int, high: int) -> None:
    """A log at `path` whose frames end between `low` and `high`. A decision's share of a
    batch varies with how the clients' writes group, so each try aims at the middle with
    the size per decision the try before it showed."""
    n, aim = 1000, (low + high) // 2
    for _ in range(8):
        end = bench_decisions(path, n)
        if low <= end < high:
            return
        n = max(10, int(aim / (end / n)))
    pytest.fail(f"no log ending between {low} and {high} bytes in 8 tries (last {end})")


@pytest.mark.parametrize("small_fs", ["10m"], indirect=True)
def test_a_decision_log_that_must_grow_on_a_full_disk_answers_pending_and_loses_nothing(
        pg, mariadb, daemons, small_fs):
    """The log writes into 4 MiB it allocated ahead; once its frames reach that end it must
    allocate the next 4 MiB, and on a full disk it cannot. The commit that needs it is
    answered "pending" (503 store_unavailable: not written, not rolled back), the daemon
    keeps running, every commit acknowledged before stays, and once space is freed the log
    grows and writes the pending decisions."""
    path = small_fs / "decisions.log"
    log_near_its_end(path, CHUNK - (64 << 10), CHUNK - (16 << 10))
    assert path.stat().st_size == CHUNK
    d = daemons.start(pg, mariadb, store={"kind": "log", "path": str(path)})
    fill(small_fs)
    acknowledged, pending = [], None
    for i in range(400):
        g = prepared_transfer(d, pg, mariadb, f"grow-{i}")
        st, body = api(d, "POST", f"/v1/transactions/{g}/commit", {})
        if st == 200:
            assert body.get("decision") == "commit", body
            acknowledged.append(g)
            continue
        assert st == 503 and body["error"]["code"] == "store_unavailable", (st, body)
        pending = g
        break
    assert pending, f"{len(acknowledged)} commits went through without the log growing"
    assert decision_of(d, pending) != "commit", "decided although not written"
    assert d.proc.poll() is None, "the daemon stopped on a full disk"
    os.remove(small_fs / "filler")
    wait_until(lambda: decision_of(d, pending) == "commit", timeout=15,
               what="the pending decision written once space is freed")
    wait_until(lambda: nothing_prepared(pg, mariadb), timeout=30, what="every branch completed")
    assert path.stat().st_size == 2 * CHUNK
    for i in range(len(acknowledged) + 1):
        assert committed_both(pg, mariadb, f"grow-{i}")
    d.stop()
    d.start()
    assert {decision_of(d, g) for g in [*acknowledged, pending]} == {"commit"}

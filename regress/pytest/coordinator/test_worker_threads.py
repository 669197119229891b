"""`limits.worker_threads`: how many threads serve the daemon's API (docs/coordinator.md,
configuration). One by default (bench/RESULTS.md, "One API thread and the append-only decision log": fewer wake-ups per
transaction); a configured count is what the running daemon has. Counted from the
daemon's threads in /proc: `cotx-api` (older builds: tokio's own names), counted right
after start, before any blocking task could add a thread of the same name."""
from __future__ import annotations

import os

import pytest
from cotest.daemon import Daemon


def workers(pid: int) -> int:
    names = []
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/comm") as f:
            names.append(f.read().strip())
    return sum(n in ("cotx-api", "tokio-rt-worker", "tokio-runtime-w") for n in names)


@pytest.mark.parametrize("configured, expected", [(None, 1), (3, 3)])
def test_the_daemon_runs_the_configured_api_threads(configured, expected):
    d = Daemon([], limits={} if configured is None else {"worker_threads": configured})
    try:
        d.start()
        assert workers(d.proc.pid) == expected
    finally:
        d.stop()


def test_zero_threads_is_refused_by_name():
    d = Daemon([], limits={"worker_threads": 0})
    with pytest.raises(RuntimeError) as e:
        d.start()
    assert "limits.worker_threads" in str(e.value) and "between 1 and 256" in str(e.value)

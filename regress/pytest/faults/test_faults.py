"""Fault injection during a bank-transfer workload (checker/bank.py): kill -9 the
coordinator, PostgreSQL or MariaDB while one transfer stands at each step of its global
transaction, with background transfers running; restart, let recovery run, then: the
total is conserved, no transfer is half-applied, nothing stays prepared, the history
checker finds no cycle (and no aborted read).

The coordinator's own crash tests (test_coordinator_crash.py) kill the client and the
daemon around single transactions; this is the workload-level version: the victim process
survives and goes on after the restart, other transfers keep running and hit the crash."""
import json
import subprocess
import sys
import uuid

import pytest
from cotx import Coordinator
from cotest.coord import make_daemon, nothing_prepared, wait_until
from checker import Txn, check
from checker import bank
from cotest.marks import requires_mysql_co, requires_pg_co

pytestmark = [requires_pg_co, requires_mysql_co]

TARGETS = ("coordinator", "postgresql", "mariadb")


@pytest.fixture(scope="module")
def world(pg, mariadb):
    start = bank.setup(pg, mariadb)
    d = make_daemon(pg, mariadb, timeouts={"transaction_ms": 8000, "owner_grace_ms": 500,
                                           "recovery_interval_ms": 300})
    d.start()
    w = {"pg": pg, "my": mariadb, "d": d, "total": sum(start.values()), "history": [], "cases": []}
    yield w
    d.destroy()


class Victim:
    def __init__(self, d, pg, my, step):
        self.tid = f"v{uuid.uuid4().hex[:8]}"
        self.p = subprocess.Popen([sys.executable, "-m", "checker.bank", "victim", step, d.url, d.token,
                                   str(pg.port), str(my.port), self.tid],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        line = self.p.stdout.readline()
        if not line.startswith("READY "):
            self.p.kill()
            raise AssertionError(f"victim did not reach {step}: {line!r} {self.p.stderr.read()[-2000:]}")
        self.ready = json.loads(line[6:])

    def release(self):
        try:
            self.p.stdin.write("go\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass

    def result(self, timeout=120) -> Txn:
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, err = self.p.communicate()
        done = [ln for ln in out.splitlines() if ln.startswith("DONE ")]
        if done:
            d = json.loads(done[-1][5:])
            t = Txn.from_json(d["rec"])
            t.status = d["status"]
            t.note += f" -> {d['error'] or 'committed'}"
            return t
        t = Txn.from_json(self.ready["rec"])
        t.status = "info"
        t.note += " -> victim process gave no result"
        return t


def kill9(world, target):
    {"coordinator": world["d"].kill9, "postgresql": world["pg"].kill9, "mariadb": world["my"].kill9}[target]()


def restart(world, target):
    {"coordinator": world["d"].start, "postgresql": world["pg"].start, "mariadb": world["my"].start}[target]()


@pytest.mark.parametrize("step", bank.STEPS)
@pytest.mark.parametrize("target", TARGETS)
def test_kill9_at_step(world, target, step):
    pg, my, d = world["pg"], world["my"], world["d"]
    workers = bank.Workers(lambda: Coordinator(d.url, d.token, decision_timeout=60), pg.port, my.port).start()
    victim = None
    try:
        victim = Victim(d, pg, my, step)
        kill9(world, target)
        restart(world, target)
        victim.release()
        vrec = victim.result()
    finally:
        assert workers.stop(), "background transfers did not stop"
        if victim is not None and victim.p.poll() is None:
            victim.p.kill()
    world["history"] += workers.history + [vrec]
    wait_until(lambda: nothing_prepared(pg, my), timeout=90, what="recovery to finish every prepared branch")
    total, logs = bank.state(pg, my)
    # Total conserved.
    assert total == world["total"]
    # Nothing half-applied: every transfer id is in both databases' logs or in neither.
    seen = {}
    for key, lst in logs.items():
        for x in lst:
            seen.setdefault(x, set()).add(key.split(":")[0])
    half = {x: s for x, s in seen.items() if s != {"pg", "my"}}
    assert not half, f"half-applied transfers: {half}"
    # The victim's fate agrees with what its client was told.
    if vrec.status == "ok":
        assert vrec.id in seen
    elif vrec.status == "fail":
        assert vrec.id not in seen
    rep = check(world["history"], final_reads=logs)
    assert rep.ok, rep.summary()
    world["cases"].append((target, step, vrec.status, vrec.id in seen, workers.counts))
    print(f"{target} killed {step}: victim {vrec.status} ({'applied' if vrec.id in seen else 'not applied'}); "
          f"background {workers.counts}; history {rep.txns} txns, {rep.committed} committed, no cycle")

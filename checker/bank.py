"""Bank-transfer workload for fault injection (regress/pytest/faults/test_faults.py).

Accounts live in two databases: acct(id, bal, log) in PostgreSQL (resource "pg") and in
MariaDB (resource "my"). A transfer is one global transaction through the coordinator:
read both rows, debit one, credit the other, append the transfer's id to both logs (the
logs are list-append keys for the checker) and set both rows' `ver` to it (a read-write
register whose versions the checker orders by read-then-write). Every transfer is recorded as a checker Txn:
status ok (committed), fail (the client was told it aborted) or info (outcome unknown to
the client: a crash in the middle; the final state settles it).

`python -m checker.bank victim STEP ...` runs one transfer in a child process that stops
at STEP and waits for a line on stdin before going on, so that a test can kill -9 a server
or the coordinator exactly there:
  after_register     branches registered, SQL done, nothing prepared
  after_one_prepare  the first branch prepared in its engine, not yet reported
  after_all_prepares every branch prepared in its engine, no decision yet
  after_decision     the coordinator decided commit, no branch finished
  mid_completion     one branch committed, the other still prepared
"""
from __future__ import annotations

import json
import random
import sys
import threading
import time
import uuid

from .history import Txn, parse_list

STEPS = ("after_register", "after_one_prepare", "after_all_prepares", "after_decision", "mid_completion")
START_BALANCE = 100


def pg_connect(port):
    import psycopg
    c = psycopg.connect(host="127.0.0.1", port=int(port), user="postgres", dbname="postgres",
                        autocommit=True, connect_timeout=5)
    c.execute("SET lock_timeout = '3s'")
    return c


def my_connect(port):
    import pymysql
    c = pymysql.connect(host="127.0.0.1", port=int(port), user="root", database="test", autocommit=True,
                        connect_timeout=5, read_timeout=60, write_timeout=60)
    with c.cursor() as cur:
        cur.execute("SET SESSION innodb_lock_wait_timeout = 3")
    return c


def setup(pg, my, n: int = 3) -> dict:
    """Creates n accounts per database; returns {key: balance}."""
    pg.sql("CREATE TABLE IF NOT EXISTS acct(id text PRIMARY KEY, bal int NOT NULL, log text NOT NULL, "
           "ver text NOT NULL DEFAULT '')")
    my.sql("CREATE TABLE IF NOT EXISTS acct(id varchar(16) PRIMARY KEY, bal int NOT NULL, log text NOT NULL, "
           "ver varchar(32) NOT NULL DEFAULT '') ENGINE=InnoDB")
    pg.sql("DELETE FROM acct")
    my.sql("DELETE FROM acct")
    for i in range(n):
        pg.sql("INSERT INTO acct(id, bal, log) VALUES (%s, %s, '')", (f"a{i}", START_BALANCE))
        my.sql("INSERT INTO acct(id, bal, log) VALUES (%s, %s, '')", (f"b{i}", START_BALANCE))
    return {f"pg:acct/a{i}": START_BALANCE for i in range(n)} | {f"my:acct/b{i}": START_BALANCE for i in range(n)}


def state(pg, my) -> tuple:
    """(total balance, {key: log list}) read from both databases."""
    total, logs = 0, {}
    for db, rows in (("pg", pg.sql("SELECT id, bal, log FROM acct")), ("my", my.sql("SELECT id, bal, log FROM acct"))):
        for i, bal, log in rows:
            total += bal
            logs[f"{db}:acct/{i}"] = parse_list(log)
    return total, logs


def _q(conn, kind, sql, args=()):
    if kind == "pg":
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else None
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


# Appending to the account's log, in each dialect.
_UPDATE = {"pg": "UPDATE acct SET bal = bal + %s, log = log || ' ' || %s::text, ver = %s WHERE id = %s",
           "my": "UPDATE acct SET bal = bal + %s, log = CONCAT(log, ' ', %s), ver = %s WHERE id = %s"}


def _step(conn, db: str, acct: str, delta: int, tid: str, rec: Txn) -> None:
    """One database's half of a transfer: read the account (recorded), add delta, append tid."""
    (_bal, log, ver), = _q(conn, db, "SELECT bal, log, ver FROM acct WHERE id = %s", (acct,))
    rec.read(f"{db}:acct/{acct}", parse_list(log))
    rec.read(f"{db}:ver/{acct}", ver or None)
    _q(conn, db, _UPDATE[db], (delta, tid, tid, acct))
    rec.append(f"{db}:acct/{acct}", tid)
    rec.write(f"{db}:ver/{acct}", tid)


def transfer(coord, pg_port, my_port, a: str, b: str, amount: int, tid: str, rec: Txn, park=None,
             conns=None) -> None:
    """Moves `amount` from PostgreSQL account a to MariaDB account b (negative: b to a).
    Raises what the client raises; rec gets the reads and appends as they happen.
    conns=(pg, mariadb): the caller's connections (kept open), else new ones (closed)."""
    rec.phase = "body"
    pc, mc = conns if conns else (pg_connect(pg_port), my_connect(my_port))
    try:
        with coord.transaction() as tx:
            if park:
                park.tx = tx
            with tx.branch(pc, "pg"):
                _step(pc, "pg", a, -amount, tid, rec)
            with tx.branch(mc, "my"):
                _step(mc, "my", b, amount, tid, rec)
            if park:
                park("after_register")
            rec.phase = "commit"   # from here on the context manager prepares and decides
    finally:
        for c in (() if conns else (pc, mc)):
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


def status_of(e: BaseException | None, rec: Txn | None = None) -> str:
    """History status of a transfer from what the client raised: an error inside the
    transaction's body (nothing prepared yet: the context manager rolls back) or an abort
    the client reports is a failure; anything else after that point is an unknown outcome.
    (Which refusal it was does not matter here; cotx.refusals says that.)"""
    from cotx import TransactionAborted
    if e is None:
        return "ok"
    if isinstance(e, TransactionAborted) or (rec is not None and getattr(rec, "phase", None) == "body"):
        return "fail"
    return "info"


class Workers:
    """Background transfers on n threads until stop(); each records its history."""

    def __init__(self, coord_factory, pg_port, my_port, n_accounts=3, threads=2, max_each=10000):
        self.coord_factory, self.pg_port, self.my_port = coord_factory, pg_port, my_port
        self.n_accounts, self.max_each = n_accounts, max_each
        self.history: list = []
        self.counts = {"ok": 0, "fail": 0, "info": 0}
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _run(self, i):
        rnd = random.Random(i)
        coord = self.coord_factory()
        for n in range(self.max_each):
            if self.stop_ev.is_set():
                return
            tid = f"w{i}x{uuid.uuid4().hex[:8]}"
            rec = Txn(tid, note="background transfer")
            a, b = f"a{rnd.randrange(self.n_accounts)}", f"b{rnd.randrange(self.n_accounts)}"
            amt = rnd.randint(1, 9) * rnd.choice((1, -1))
            err = None
            try:
                transfer(coord, self.pg_port, self.my_port, a, b, amt, tid, rec)
            except Exception as e:  # noqa: BLE001 - every outcome is recorded
                err = e
            rec.status = status_of(err, rec)
            with self.lock:
                self.history.append(rec)
                self.counts[rec.status] += 1
            if err is not None:
                time.sleep(0.05 + 0.1 * rnd.random())

    def stop(self, timeout=120):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self.threads)


def _victim(argv) -> int:
    """Child process: one transfer (a0 -> b0) that parks at STEP (see module docstring)."""
    step, url, token, pg_port, my_port, tid = argv
    from cotx import Coordinator
    from cotx import client as cl

    rec = Txn(tid, note=f"victim parked {step}")

    def park(where):
        if where != step:
            return
        park.reached = True
        print("READY " + json.dumps({"tid": tid, "gtid": getattr(park, "tx", None) and park.tx.gtid,
                                     "rec": rec.to_json()}), flush=True)
        sys.stdin.readline()

    # Hooks in the client (this child only) at the steps the application cannot reach.
    orig_prepare, orig_prepare_all, orig_finish = cl.Branch.prepare, cl.Transaction.prepare_all, cl.Transaction._finish
    prepared = []

    def prepare(self, *a, **k):
        orig_prepare(self, *a, **k)
        prepared.append(self)
        if len(prepared) == 1:
            # Prepared in the engine, not yet reported to the coordinator.
            park("after_one_prepare")

    def prepare_all(self, *a, **k):
        r = orig_prepare_all(self, *a, **k)
        park("after_all_prepares")
        return r

    def finish(self, decision):
        if decision == "commit":
            park("after_decision")
            if step == "mid_completion":
                self._branches[0].finish("commit")
                park("mid_completion")
        orig_finish(self, decision)

    cl.Branch.prepare, cl.Transaction.prepare_all, cl.Transaction._finish = prepare, prepare_all, finish
    coord = Coordinator(url, token, decision_timeout=90)
    err = None
    for attempt in range(20):
        # Background transfers may make an attempt fail (lock timeout, SSI, pg_co) before it
        # reaches the step: those attempts aborted cleanly; try again with the same id.
        err = None
        rec.ops.clear()
        prepared.clear()
        try:
            transfer(coord, pg_port, my_port, "a0", "b0", 7, tid, rec, park=park)
        except Exception as e:  # noqa: BLE001
            err = e
        if getattr(park, "reached", False) or status_of(err, rec) != "fail":
            break
        time.sleep(0.1)
    rec.status = status_of(err, rec)
    print("DONE " + json.dumps({"status": rec.status, "error": f"{type(err).__name__}: {err}" if err else None,
                                "rec": rec.to_json()}), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "victim":
        sys.exit(_victim(sys.argv[2:]))
    print(__doc__)

"""The global transactions the coordinator's tests run across PostgreSQL and MariaDB: one
row written into table `crash` of both (a transfer, run in this process or in a client
process parked at a chosen step), and a withdrawal (savings on PostgreSQL, the ledger on
MariaDB). Like cotest.coord it imports cotx; `import cotest` does not load it."""
from __future__ import annotations

import itertools
import random
import subprocess
import sys
import threading
import time

from cotx import Coordinator


def create_crash_tables(pg, mariadb) -> None:
    """Table `crash` (key, value) on both servers, where the transfers write."""
    pg.sql("CREATE TABLE IF NOT EXISTS crash(k text PRIMARY KEY, v int)")
    mariadb.sql("CREATE TABLE IF NOT EXISTS crash(k varchar(64) PRIMARY KEY, v int) ENGINE=InnoDB")


def transfer(d, pg, mariadb, key: str):
    """A transfer on daemon d (resources "pg" and "my"), its two branches run, not
    prepared: (tx, (pg session, MariaDB session)); tx._branches are the two branches."""
    tx = Coordinator(d.url, d.token).transaction()
    return tx, transfer_branches(tx, pg, mariadb, key)


def transfer_branches(tx, pg, mariadb, key: str):
    """The transfer's two branches run in tx, not prepared: (pg session, MariaDB session).
    For a transfer under the client's retry path: `coord.run(lambda tx: ...)`."""
    pc, mc = pg.connect(), mariadb.connect()
    try:
        with tx.branch(pc, "pg"):
            pc.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO crash VALUES (%s, 1)", (key,))
    except BaseException:
        # A refused attempt leaves no session behind (the retry path opens new ones).
        pc.close()
        mc.close()
        raise
    return pc, mc


def run_transfer(d, pg, mariadb, key: str, **run) -> None:
    """A transfer on daemon d under the client's retry path (`Coordinator.run`, given
    `run`'s keywords, e.g. on_retry), committed, its sessions closed."""
    for s in Coordinator(d.url, d.token).run(lambda tx: transfer_branches(tx, pg, mariadb, key), **run):
        s.close()


def prepared_transfer(d, pg, mariadb, key: str) -> str:
    """A transfer on daemon d with both branches prepared and reported, the application's
    sessions closed (so any daemon may finish the branches): its gtid."""
    tx, sessions = transfer(d, pg, mariadb, key)
    assert len(tx.prepare_all(report=True)) == 2
    for s in sessions:
        s.close()
    return tx.gtid


def committed_transfer(d, pg, mariadb, key: str):
    """A transfer on daemon d, committed, its sessions closed: the transaction."""
    tx, sessions = transfer(d, pg, mariadb, key)
    tx.commit()
    for s in sessions:
        s.close()
    return tx


def committed_both(pg, mariadb, key: str) -> bool:
    return pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == [(1,)] and \
        mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == ((1,),)


def absent_both(pg, mariadb, key: str) -> bool:
    return pg.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == [(0,)] and \
        mariadb.sql("SELECT count(*) FROM crash WHERE k = %s", (key,)) == ((0,),)


# A client process: one transfer; `mode` makes it stop (and wait to be killed) at a chosen
# point. A separate process, so that a test can kill -9 the application mid-commit.
CHILD = r'''
import sys, time
import psycopg, pymysql
from cotx import Coordinator, client as cl
_, mode, url, token, pg_port, my_port, key, readonly = sys.argv
coord = Coordinator(url, token, decision_timeout=600)
pc = psycopg.connect(host="127.0.0.1", port=int(pg_port), user="postgres", dbname="postgres", autocommit=True)
mc = pymysql.connect(host="127.0.0.1", port=int(my_port), user="root", database="test", autocommit=True)

def park(tx, what):
    print("READY", tx.gtid, what, flush=True)
    time.sleep(600)  # parked until the test kills this process: no event to wait for

if mode == "after_prepare":
    def commit(self):
        self.prepare_all()
        park(self, "prepared")
    cl.Transaction.commit = commit
elif mode == "after_decision":
    cl.Transaction._finish = lambda self, d: park(self, d)
elif mode == "mid_fanout":
    def fin(self, d):
        self._branches[0].finish(d)
        park(self, d)
    cl.Transaction._finish = fin

with coord.transaction() as tx:
    with tx.branch(pc, "pg"):
        pc.execute("INSERT INTO crash VALUES (%s, 1)", (key,))
    with tx.branch(mc, "my"):
        if readonly == "1":
            mc.cursor().execute("SELECT count(*) FROM crash")
        else:
            mc.cursor().execute("INSERT INTO crash VALUES (%s, 1)", (key,))
print("DONE", tx.gtid, tx.outcome, flush=True)
'''


class Child:
    """CHILD started on daemon d and parked at `mode` (after_prepare, after_decision,
    mid_fanout); `gtid` and `what` (its decision, or "prepared") as it printed them."""

    def __init__(self, d, pg, mariadb, mode: str, key: str, readonly: bool = False):
        self.p = subprocess.Popen([sys.executable, "-c", CHILD, mode, d.url, d.token, str(pg.port),
                                   str(mariadb.port), key, "1" if readonly else "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        if not line or line[0] != "READY":
            self.p.kill()
            raise AssertionError(f"client did not reach {mode}: {line} {self.p.stderr.read()}")
        self.gtid, self.what = line[1], line[2]

    def kill9(self) -> None:
        self.p.kill()
        self.p.wait()


def create_withdrawal_tables(pg, mariadb) -> None:
    """wd_acct (user, balance) on PostgreSQL, wd_log (withdrawal id, user, amount) on MariaDB."""
    pg.sql("DROP TABLE IF EXISTS wd_acct; CREATE TABLE wd_acct(u int PRIMARY KEY, bal int NOT NULL)")
    mariadb.sql("DROP TABLE IF EXISTS wd_log")
    mariadb.sql("CREATE TABLE wd_log(id varchar(64) PRIMARY KEY, u int NOT NULL, amt int NOT NULL) ENGINE=InnoDB")


def reset_accounts(pg, mariadb, users: int, balance: int) -> None:
    """`users` accounts of `balance` each, an empty ledger."""
    pg.sql("DELETE FROM wd_acct")
    for u in range(users):
        pg.sql("INSERT INTO wd_acct VALUES (%s, %s)", (u, balance))
    mariadb.sql("DELETE FROM wd_log")


def withdrawal(pc, mc, wid: str, u: int, amt: int):
    """fn(tx) of one withdrawal, for Coordinator.run: savings on PostgreSQL, the ledger on
    MariaDB; "declined" when the balance is short, else "done"."""
    def fn(tx):
        with tx.branch(pc, "pg"):
            bal = pc.execute("SELECT bal FROM wd_acct WHERE u = %s", (u,)).fetchone()[0]
            if bal < amt:
                return "declined"
            pc.execute("UPDATE wd_acct SET bal = bal - %s WHERE u = %s", (amt, u))
        with tx.branch(mc, "my"):
            mc.cursor().execute("INSERT INTO wd_log VALUES (%s, %s, %s)", (wid, u, amt))
        return "done"
    return fn


def run_withdrawal(coord, pg, mariadb, wid: str, u: int, amt: int, wrap=None, **run_kw):
    """coord.run of one withdrawal on sessions of its own, closed after: what it returned,
    or the exception that ended it (a load test counts every failure rather than stop at
    the first). `wrap(fn)` may wrap the withdrawal's fn(tx), e.g. to record each attempt."""
    pc, mc = pg.connect(), mariadb.connect()
    fn = withdrawal(pc, mc, wid, u, amt)
    try:
        return coord.run(wrap(fn) if wrap else fn, **run_kw)
    except Exception as e:  # noqa: BLE001 - returned to be counted
        return e
    finally:
        pc.close()
        mc.close()


def withdrawals_under_kills(d, coord, pg, mariadb, users: int, *, clients: int = 4, kills: int = 3,
                            decide_in_participant: bool = False):
    """Withdrawals through coord.run in a thread per request (as a threaded web service runs
    them, the thread ending right after its commit), `clients` at a time, while daemon d is
    killed with kill -9 and restarted `kills` times: (each withdrawal's result by its id,
    as run_withdrawal returns it; the names of the errors run() ran a withdrawal again after).
    `decide_in_participant`: each commits with the decision in its PostgreSQL branch."""
    results, stop, seq, retried = {}, threading.Event(), itertools.count(), []

    def request(wid, u, amt):
        results[wid] = run_withdrawal(coord, pg, mariadb, wid, u, amt, retries=30, max_wait=60,
                                      decide_in_participant=decide_in_participant,
                                      on_retry=lambda n, e, s: retried.append(type(e).__name__))

    def client(rng):
        while not stop.is_set():
            t = threading.Thread(target=request, args=(f"w{next(seq)}", rng.randrange(users), rng.randrange(5, 40)))
            t.start()
            t.join()

    threads = [threading.Thread(target=client, args=(random.Random(i),)) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        for _ in range(kills):
            time.sleep(1.5)
            d.kill9()
            time.sleep(0.3)
            d.start()
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    return results, retried

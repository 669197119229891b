"""Added latency of the coordinator per global transaction.

Same branches, same data, two ways, in alternating blocks:
  direct: the client drives 2PC itself (BEGIN SERIALIZABLE / XA START, one UPDATE each,
          PREPARE TRANSACTION / XA END + XA PREPARE, COMMIT PREPARED / XA COMMIT);
  daemon: the same through cotx.Coordinator (begin, register, prepared, durable decision,
          finish, acknowledge) against a real daemon process.
One client, loopback, real PostgreSQL 15 and MariaDB 10.11 from the test harness.
Prints JSON: p50/p99 of both and their difference.

usage: latency.py [--n 10000] [--block 500] [--store-dir DIR]
"""
import argparse
import json
import os
import random
import statistics
import time

from cotest import MariaServer, PgServer
from cotx import Coordinator
from cotest.coord import make_daemon

ROWS = 1000


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000, help="transactions per mode")
    ap.add_argument("--block", type=int, default=500)
    ap.add_argument("--store-dir", default=None, help="directory of the daemon's SQLite store (default: a temp dir on disk)")
    a = ap.parse_args()
    with PgServer() as pg, MariaServer() as my:
        pg.sql("CREATE TABLE t(id int PRIMARY KEY, v int)")
        pg.sql(f"INSERT INTO t SELECT g, 0 FROM generate_series(1, {ROWS}) g")
        my.sql("CREATE TABLE t(id int PRIMARY KEY, v int) ENGINE=InnoDB")
        my.sql("INSERT INTO t SELECT seq, 0 FROM seq_1_to_%d" % ROWS)
        store = None
        if a.store_dir:
            os.makedirs(a.store_dir, exist_ok=True)
            store = {"kind": "sqlite", "path": os.path.join(a.store_dir, f"bench-{os.getpid()}.db")}
        d = make_daemon(pg, my, store=store, timeouts={"owner_grace_ms": 5000, "recovery_interval_ms": 5000})
        with d:
            coord = Coordinator(d.url, d.token)
            pc = pg.connect()
            mc = my.connect()
            mcur = mc.cursor()
            rnd = random.Random(1)
            seq = [0]

            def direct():
                seq[0] += 1
                gid = f"bench:direct-{seq[0]}:b1"
                x = f"'direct-{seq[0]}','b2',1"
                i, j = rnd.randint(1, ROWS), rnd.randint(1, ROWS)
                pc.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                pc.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i,))
                mcur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                mcur.execute(f"XA START {x}")
                mcur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (j,))
                pc.execute(f"PREPARE TRANSACTION '{gid}'")
                mcur.execute(f"XA END {x}")
                mcur.execute(f"XA PREPARE {x}")
                pc.execute(f"COMMIT PREPARED '{gid}'")
                mcur.execute(f"XA COMMIT {x}")

            def daemon():
                i, j = rnd.randint(1, ROWS), rnd.randint(1, ROWS)
                with coord.transaction() as tx:
                    with tx.branch(pc, "pg", "b1"):
                        pc.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i,))
                    with tx.branch(mc, "my", "b2"):
                        mcur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (j,))

            lat = {"direct": [], "daemon": []}
            for _ in range(50):  # warm-up
                direct()
                daemon()
            done = 0
            while done < a.n:
                k = min(a.block, a.n - done)
                for name, fn in (("direct", direct), ("daemon", daemon)):
                    for _ in range(k):
                        t0 = time.perf_counter()
                        fn()
                        lat[name].append(time.perf_counter() - t0)
                done += k
            out = {"transactions_per_mode": a.n, "store": "sqlite " + ("in " + a.store_dir if a.store_dir else "on disk (temp dir)")}
            for name, xs in lat.items():
                out[name] = {"p50_ms": round(pct(xs, 50) * 1e3, 3), "p99_ms": round(pct(xs, 99) * 1e3, 3),
                             "mean_ms": round(statistics.mean(xs) * 1e3, 3)}
            out["added_p50_ms"] = round(out["daemon"]["p50_ms"] - out["direct"]["p50_ms"], 3)
            out["added_p99_ms"] = round(out["daemon"]["p99_ms"] - out["direct"]["p99_ms"], 3)
            print(json.dumps(out))
            pc.close()
            mc.close()


if __name__ == "__main__":
    main()

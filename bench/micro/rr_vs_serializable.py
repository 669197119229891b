#!/usr/bin/env python3
"""Side check: MariaDB read-only XA branches at REPEATABLE READ vs SERIALIZABLE, without
client library, coordinator or PostgreSQL (mode 2pc runs RR branches, co SERIALIZABLE).
8 client processes, each branch: XA START, 12 point reads over 100000 rows, XA END,
XA PREPARE, XA COMMIT; mysql_co off; durability on; levels alternate, PAIRS pairs.

  /var/cache/cotx/venv/bin/python bench/micro/rr_vs_serializable.py [--pairs 2] [--seconds 3]
"""
import argparse
import multiprocessing as mp
import random
import sys
import time

from cotest import MariaServer


def worker(port, level, q, seed, end):
    import pymysql
    c = pymysql.connect(host="127.0.0.1", port=port, user="root", database="test", autocommit=True)
    cur = c.cursor()
    rng = random.Random(seed)
    n = 0
    while time.time() < end:
        x = f"'x{seed}-{n}'"
        cur.execute("SET TRANSACTION ISOLATION LEVEL " + level)
        cur.execute(f"XA START {x}")
        for _ in range(12):
            cur.execute("SELECT v FROM t WHERE k = %s", (rng.randrange(100000),))
        cur.execute(f"XA END {x}")
        cur.execute(f"XA PREPARE {x}")
        cur.execute(f"XA COMMIT {x}")
        n += 1
    q.put(n)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    with MariaServer(plugin=True, fsync=True) as m:
        m.sql("CREATE TABLE t (k int PRIMARY KEY, v int)")
        m.sql("INSERT INTO t SELECT seq, 0 FROM seq_0_to_99999")
        m.sql("SET GLOBAL mysql_co_enabled = OFF")
        for level in ("REPEATABLE READ", "SERIALIZABLE") * a.pairs:
            q = mp.Queue()
            end = time.time() + 0.3 + a.seconds
            ps = [mp.Process(target=worker, args=(m.port, level, q, i, end)) for i in range(8)]
            for p in ps:
                p.start()
            n = sum(q.get() for _ in ps)
            for p in ps:
                p.join()
            print(f"{level:16s} {n / a.seconds:7.1f} read-only XA branches/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decisions/s of the PostgreSQL decision store alone, 1 and 3 writers.

Starts a throwaway PostgreSQL (no pg_co, fsync on, READ COMMITTED: a store as a user sets
it up) unless --dsn names one, then runs `cotx-coordinator bench-store --pg-dsn` once per
writer count. A writer is a store handle with its own connection, group commit and node
id under its own lease, as one daemon sharing the store. Prints the JSON line of each run
(decisions/s, p50/p99 ms per decision).

usage: pg_store.py [--n 20000] [--clients 64] [--writers 1,3] [--dsn DSN]
"""
import argparse
import subprocess
import sys

from cotest import PgServer
from cotest.daemon import find_binary


def run(dsn: str, a) -> int:
    rc = 0
    for w in (int(x) for x in a.writers.split(",") if x):
        cmd = [find_binary(), "bench-store", "--pg-dsn", dsn, "--writers", str(w), "--n", str(a.n),
               "--clients", str(a.clients)]
        rc |= subprocess.run(cmd).returncode
    return rc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000, help="decisions per run")
    ap.add_argument("--clients", type=int, default=64, help="concurrent decisions, spread over the writers")
    ap.add_argument("--writers", default="1,3", help="writer counts, one run each")
    ap.add_argument("--dsn", help="an existing store database (default: a throwaway PostgreSQL)")
    a = ap.parse_args()
    if a.dsn:
        return run(a.dsn, a)
    with PgServer(preload=False, fsync=True, conf={"default_transaction_isolation": "'read committed'"}) as pg:
        pg.sql("CREATE DATABASE cotx_store")
        return run(pg.dsn.replace("dbname=postgres", "dbname=cotx_store"), a)


if __name__ == "__main__":
    sys.exit(main())

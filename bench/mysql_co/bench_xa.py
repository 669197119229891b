#!/usr/bin/env python3
"""Cost of mysql_co: XA branch throughput with the plugin vs without, at SERIALIZABLE.

Two MariaDB servers (same options; one loads mysql_co at startup) run side by side, only
one is measured at a time, in ABBA order (without, with, with, without, ...) so that drift
of the machine hits both alike. Each run: CLIENTS processes run XA branches for SECONDS:
  XA START; READS point SELECTs; WRITES point UPDATEs (random rows); XA END; XA PREPARE;
  XA COMMIT
Branches that hit a deadlock / lock wait timeout are rolled back and counted as aborts.
Result: committed branches per second per run, ratio with/without per pair, median ratio.

  /var/cache/cotx/venv/bin/python bench/mysql_co/bench_xa.py [--pairs 3] [--seconds 10]
      [--clients 4] [--rows 100000] [--results bench/RESULTS.md]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "harness"))

from cotest import MariaServer  # noqa: E402
from cotest.servers import mysql_co_installed  # noqa: E402


def worker(port, seconds, rows, reads, writes, seed, out):
    import pymysql
    rnd = random.Random(seed)
    c = pymysql.connect(host="127.0.0.1", port=port, user="root", database="test",
                        autocommit=True)
    cur = c.cursor()
    cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    cur.execute("SET SESSION innodb_lock_wait_timeout = 2")
    done = aborted = 0
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
        xid = f"b{seed}-{n}"
        try:
            cur.execute(f"XA START '{xid}'")
            for _ in range(reads):
                cur.execute("SELECT v FROM acct WHERE id = %s", (rnd.randrange(rows),))
            for _ in range(writes):
                cur.execute("UPDATE acct SET v = v + 1 WHERE id = %s", (rnd.randrange(rows),))
            cur.execute(f"XA END '{xid}'")
            cur.execute(f"XA PREPARE '{xid}'")
            cur.execute(f"XA COMMIT '{xid}'")
            done += 1
        except pymysql.MySQLError:
            aborted += 1
            for stmt in (f"XA END '{xid}'", f"XA ROLLBACK '{xid}'"):
                try:
                    cur.execute(stmt)
                except pymysql.MySQLError:
                    pass
    c.close()
    out.put((done, aborted))


def measure(server, args, seed) -> tuple[float, int]:
    q = mp.Queue()
    procs = [mp.Process(target=worker, args=(server.port, args.seconds, args.rows, args.reads,
                                             args.writes, seed * 100 + i, q))
             for i in range(args.clients)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    res = [q.get() for _ in procs]
    for p in procs:
        p.join()
    elapsed = max(args.seconds, time.monotonic() - t0 - 0.2)
    done = sum(r[0] for r in res)
    return done / args.seconds, sum(r[1] for r in res)


def setup(server, rows):
    server.sql("CREATE TABLE acct (id INT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB")
    c = server.connect()
    with c.cursor() as cur:
        step = 5000
        for lo in range(0, rows, step):
            cur.executemany("INSERT INTO acct VALUES (%s, 0)",
                            [(i,) for i in range(lo, min(rows, lo + step))])
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--reads", type=int, default=6)
    ap.add_argument("--writes", type=int, default=6)
    ap.add_argument("--results", help="write a 'mysql_co' section into this Markdown file")
    args = ap.parse_args()
    if not mysql_co_installed():
        sys.exit("mysql_co.so is not installed: run scripts/build-mysql-co.sh")

    runs = []   # (label, tps, aborts)
    with MariaServer(plugin=False) as without, MariaServer(plugin=True) as with_co:
        for s in (without, with_co):
            setup(s, args.rows)
        assert with_co.sql("SHOW GLOBAL STATUS LIKE 'Mysql_co_hooks'")[0][1] == "ENABLED"
        # warm-up (buffer pool, connections) on both, not counted
        short = argparse.Namespace(**{**vars(args), "seconds": 2})
        measure(without, short, 1)
        measure(with_co, short, 2)
        order = []
        for i in range(args.pairs):
            order += [("without", without), ("with", with_co)] if i % 2 == 0 else \
                     [("with", with_co), ("without", without)]
        for k, (label, s) in enumerate(order):
            tps, ab = measure(s, args, 10 + k)
            runs.append((label, tps, ab))
            print(f"run {k + 1:2d} {label:8s} {tps:8.1f} branches/s  aborts {ab}", flush=True)
        checked = with_co.sql("SHOW GLOBAL STATUS LIKE 'Mysql_co_prepares_checked'")[0][1]

    ratios = []
    for i in range(args.pairs):
        a, b = runs[2 * i], runs[2 * i + 1]
        w = a if a[0] == "with" else b
        wo = b if a[0] == "with" else a
        ratios.append(w[1] / wo[1])
    med = statistics.median(ratios)
    print("ratios with/without per pair:", " ".join(f"{r:.3f}" for r in ratios))
    print(f"median ratio {med:.3f}   (prepares checked by mysql_co: {checked})")

    if args.results:
        cmd = ("/var/cache/cotx/venv/bin/python bench/mysql_co/bench_xa.py "
               + " ".join(a for a in sys.argv[1:]))
        lines = [
            "## mysql_co",
            "",
            f"XA branch throughput, MariaDB 10.11.18 with mysql_co loaded at startup vs without, "
            f"SERIALIZABLE, {args.clients} client processes, {args.reads} point reads + "
            f"{args.writes} point updates per branch over {args.rows} rows, "
            f"XA START/END/PREPARE/COMMIT, {args.seconds:g} s per run, ABBA order, "
            f"{args.pairs} pairs; innodb_flush_log_at_trx_commit=2 (harness default); "
            f"2-core machine shared with other work ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
            "",
            f"Command: `{cmd}`",
            "",
            "| run | server | branches/s | aborts |",
            "|---:|---|---:|---:|",
        ]
        for k, (label, tps, ab) in enumerate(runs):
            lines.append(f"| {k + 1} | {label} mysql_co | {tps:.1f} | {ab} |")
        lines += ["",
                  "Ratios with/without per pair: " + ", ".join(f"{r:.3f}" for r in ratios)
                  + f"; **median {med:.3f}** (bar: >= 0.99).", ""]
        write_section(Path(args.results), "## mysql_co", "\n".join(lines))


def write_section(path: Path, heading: str, body: str):
    """Replace our section (from heading to the next '## ') or append it."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip() == heading), None)
    if start is None:
        if not text.endswith("\n"):
            text += "\n"
        text += "\n" + body
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")),
                   len(lines))
        text = "".join(lines[:start]) + body + ("\n" if end < len(lines) else "") + "".join(lines[end:])
    path.write_text(text)
    print(f"wrote section '{heading}' in {path}")


if __name__ == "__main__":
    main()

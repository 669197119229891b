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

from cotest import MariaServer
from cotest.servers import mysql_co_installed


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


def server_cpu_seconds(server) -> float:
    """user+system CPU time mariadbd has used so far (from /proc)."""
    pid = int(server.pid_file.read_text().split()[0])
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def measure(server, args, seed) -> tuple[float, int, float]:
    """-> (committed branches/s, aborts, server CPU microseconds per committed branch)"""
    q = mp.Queue()
    cpu0 = server_cpu_seconds(server)
    procs = [mp.Process(target=worker, args=(server.port, args.seconds, args.rows, args.reads,
                                             args.writes, seed * 100 + i, q))
             for i in range(args.clients)]
    for p in procs:
        p.start()
    res = [q.get() for _ in procs]
    for p in procs:
        p.join()
    cpu = server_cpu_seconds(server) - cpu0
    done = sum(r[0] for r in res)
    return done / args.seconds, sum(r[1] for r in res), cpu * 1e6 / max(done, 1)


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

    load0 = f"{os.getloadavg()[0]:.2f}"
    runs = []   # (label, tps, aborts, server CPU us per branch)
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
            tps, ab, us = measure(s, args, 10 + k)
            runs.append((label, tps, ab, us))
            print(f"run {k + 1:2d} {label:8s} {tps:8.1f} branches/s  aborts {ab}  "
                  f"server CPU {us:6.1f} us/branch", flush=True)
        checked = with_co.sql("SHOW GLOBAL STATUS LIKE 'Mysql_co_prepares_checked'")[0][1]

    ratios, cpu_ratios = [], []
    for i in range(args.pairs):
        a, b = runs[2 * i], runs[2 * i + 1]
        w = a if a[0] == "with" else b
        wo = b if a[0] == "with" else a
        ratios.append(w[1] / wo[1])
        cpu_ratios.append(w[3] / wo[3])
    med = statistics.median(ratios)
    cmed = statistics.median(cpu_ratios)
    print("throughput ratios with/without per pair:", " ".join(f"{r:.3f}" for r in ratios))
    print(f"median throughput ratio {med:.3f}   (prepares checked by mysql_co: {checked})")
    print("server CPU per branch, with/without per pair:", " ".join(f"{r:.3f}" for r in cpu_ratios))
    print(f"median server CPU ratio {cmed:.3f}")

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
            "| run | server | branches/s | aborts | server CPU us/branch |",
            "|---:|---|---:|---:|---:|",
        ]
        for k, (label, tps, ab, us) in enumerate(runs):
            lines.append(f"| {k + 1} | {label} mysql_co | {tps:.1f} | {ab} | {us:.1f} |")
        lines += ["",
                  "Throughput ratios with/without per pair: " + ", ".join(f"{r:.3f}" for r in ratios)
                  + f"; **median {med:.3f}** (bar: >= 0.99).",
                  "",
                  "Server CPU time per committed branch (mariadbd user+system from /proc), "
                  "with/without per pair: "
                  + ", ".join(f"{r:.3f}" for r in cpu_ratios) + f"; median {cmed:.3f}.",
                  "",
                  f"Load average before/after: {load0} / {os.getloadavg()[0]:.2f}. " + NOISE_NOTE,
                  ""]
        write_section(Path(args.results), "## mysql_co", "\n".join(lines))


NOISE_NOTE = (
    "The machine is shared with other engineers' builds and tests (2 cores), so run-to-run "
    "spread is tens of percent even between neighbouring runs of the same server; ABBA "
    "pairs cancel slow drift but not this noise, and the medians (on either side of 1.0 "
    "across repeated invocations) cannot resolve a difference of a few percent. What "
    "mysql_co adds per branch is small and bounded: two audit events per statement (a "
    "few field reads; a text scan for 'PHASE'), one trans_register_ha, one prepare and "
    "one commit callback (a level comparison and, only while the restart gate is armed, a "
    "mutex); no I/O, no locks shared between sessions on the normal path.")


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

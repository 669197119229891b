"""Single-database cost of pg_co: pgbench, serializable 2PC transactions, pg_co.enabled off
vs on, interleaved ABBA runs on one durable server (fsync on, synchronous_commit on).

usage: python bench/pg_co/pgbench_cost.py [--pairs 3] [--seconds 20] [--clients 8] [--scale 10]
       python bench/pg_co/pgbench_cost.py --rule-c [--rows 10000]   (cost of rule C)
Prints a table and a Markdown block for bench/RESULTS.md; --quick for a smoke run.

--rule-c: a mix of 2PC writers and local serializable readers (local_reader.sql), pg_co on,
pg_co.check_local_readers off vs on (ABBA): throughput and rule-C refusals per 1000 local
readers. --rows narrows the accounts touched, to raise the chance that a reader meets a
row of a transaction that is in doubt.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "harness"))
from cotest import PgServer, reap_orphans  # noqa: E402

PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
SCRIPT = Path(__file__).with_name("serializable_2pc.sql")
READER = Path(__file__).with_name("local_reader.sql")


def pgbench(server, args, check=True):
    cmd = [PGBENCH, "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"] + args + ["postgres"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"pgbench failed: {r.stderr}\n{r.stdout}")
    return r.stdout + r.stderr


def set_guc(server, name: str, on: bool):
    server.sql(f"ALTER SYSTEM SET {name} = {'on' if on else 'off'}")
    server.sql("SELECT pg_reload_conf()")
    time.sleep(0.3)
    assert server.sql(f"SHOW {name}")[0][0] == ("on" if on else "off")


def refusals(server, rule_c_only=False):
    expr = "refused_rule_c" if rule_c_only else "refused_rule_a + refused_rule_b + refused_rule_c + refused_summarized"
    return server.sql(f"SELECT {expr} FROM co.stats")[0][0]


def run_once(server, on, seconds, clients, rows, rule_c=False):
    set_guc(server, "pg_co.check_local_readers" if rule_c else "pg_co.enabled", on)
    before = refusals(server, rule_c)
    scripts = ["-f", f"{SCRIPT}@1", "-f", f"{READER}@1"] if rule_c else ["-f", str(SCRIPT)]
    out = pgbench(server, ["-n", "-M", "simple", *scripts, "-D", f"nrows={rows}", "-c", str(clients), "-j", "2",
                           "-T", str(seconds), "--max-tries=20"])
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
    done = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    failed = int((re.search(r"number of failed transactions: (\d+)", out) or [0, 0])[1])
    retried = int((re.search(r"number of transactions retried: (\d+)", out) or [0, 0])[1])
    ref = refusals(server, rule_c) - before
    return {"on": on, "tps": tps, "done": done, "failed": failed, "retried": retried, "pg_co_refusals": ref}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--rows", type=int, help="accounts touched (default: all, 100000 x scale)")
    ap.add_argument("--rule-c", action="store_true", help="measure rule C (check_local_readers off vs on)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny and short")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.seconds, a.clients, a.scale = 1, 2, 2, 1
    rows = a.rows or 100000 * a.scale
    label = "pg_co.check_local_readers" if a.rule_c else "pg_co"
    reap_orphans()
    conf = {"max_connections": 50, "max_prepared_transactions": 50, "shared_buffers": "'256MB'",
            "default_transaction_isolation": "'read committed'"}
    with PgServer(conf=conf, fsync=True) as s:
        s.sql("CREATE EXTENSION pg_co")
        print(f"pgbench -i -s {a.scale} ...", flush=True)
        pgbench(s, ["-i", "-q", "-s", str(a.scale)])
        s.sql("CHECKPOINT")
        order = []
        for _ in range(a.pairs):  # ABBA: off on on off ...
            order += [False, True, True, False]
        order = order[: 2 * a.pairs]
        results = []
        for i, on in enumerate(order, 1):
            r = run_once(s, on, a.seconds, a.clients, rows, a.rule_c)
            results.append(r)
            print(f"[{i}/{len(order)}] {label} {'on ' if on else 'off'}: {r['tps']:.1f} tps, "
                  f"{r['done']} tx, failed {r['failed']}, retried {r['retried']}, pg_co refusals {r['pg_co_refusals']}",
                  flush=True)
    off = [r["tps"] for r in results if not r["on"]]
    on = [r["tps"] for r in results if r["on"]]
    ratio = statistics.median(on) / statistics.median(off)
    per_k = lambda rs: 1000 * sum(r["pg_co_refusals"] for r in rs) / max(1, sum(r["done"] for r in rs))  # noqa: E731
    retries_k = lambda rs: 1000 * sum(r["retried"] + r["failed"] for r in rs) / max(1, sum(r["done"] for r in rs))  # noqa: E731
    on_runs = [r for r in results if r["on"]]
    off_runs = [r for r in results if not r["on"]]
    print(f"\n### {'rule C cost (2PC writers + local readers)' if a.rule_c else 'pg_co single-database cost'} (pgbench)")
    print(f"- median tps off: {statistics.median(off):.1f}, on: {statistics.median(on):.1f}, ratio on/off: **{ratio:.3f}**")
    what = "rule C refusals" if a.rule_c else "pg_co refusals"
    print(f"- {what} per 1000 committed transactions (on): {per_k(on_runs):.2f}")
    print(f"- retried+failed per 1000 (pgbench, on / off): {retries_k(on_runs):.2f} / {retries_k(off_runs):.2f}")
    print(f"- runs: {len(results)} x {a.seconds} s, {a.clients} clients, scale {a.scale}, {rows} rows touched, ABBA order")
    return 0


if __name__ == "__main__":
    sys.exit(main())

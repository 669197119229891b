"""Single-database cost of pg_co, measured with pgbench on one durable server (fsync on,
synchronous_commit on): each experiment switches one setting between two values in
interleaved ABBA runs and reports median throughput, their ratio, and refusals.

  cost    pg_co.enabled off vs on; serializable 2PC transactions (serializable_2pc.sql)
  rule-c  pg_co.rule_c off vs on; 2PC writers + local readers (local_reader.sql)
  wait    pg_co.conflict_action abort vs wait; serializable 2PC transactions
  max-wait pg_co.max_wait 0 vs 5 ms (conflict_action abort); serializable 2PC transactions
  rule-c-read-only  pg_co.rule_c_read_only off vs on; a read-mostly mix: 2PC writers and
          four times as many READ ONLY local readers (local_reader_ro.sql)
  rule-s  pg_co.rule_s off vs on; local serializable writers (local_writer.sql)

usage: python bench/pg_co/pgbench_cost.py [--experiment cost] [--pairs 3] [--seconds 20]
           [--clients 8] [--scale 10] [--rows N] [--quick]
--rows narrows the accounts touched (a hot set raises conflicts); --quick is a smoke run.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cotest import PgServer, reap_orphans
from cotest.servers import DEFAULT_PG_MAJOR, PG_MAJORS

HERE = Path(__file__).parent
ALL_REFUSALS = "refused_rule_a + refused_rule_b + refused_rule_c + refused_summarized + refused_rule_s"
EXPERIMENTS = {
    "cost": dict(guc="pg_co.enabled", values=("off", "on"), scripts=["serializable_2pc.sql"],
                 refusals=ALL_REFUSALS, title="pg_co single-database cost"),
    "rule-c": dict(guc="pg_co.rule_c", values=("off", "on"),
                   scripts=["serializable_2pc.sql@1", "local_reader.sql@1"],
                   refusals="refused_rule_c", title="rule C cost (2PC writers + local readers)"),
    "wait": dict(guc="pg_co.conflict_action", values=("abort", "wait"), scripts=["serializable_2pc.sql"],
                 refusals=ALL_REFUSALS, title="rule B: abort vs wait"),
    "max-wait": dict(guc="pg_co.max_wait", values=("0", "'5ms'"), scripts=["serializable_2pc.sql"],
                     refusals=ALL_REFUSALS, title="rule B: refuse at once vs wait at most 5 ms"),
    "rule-c-read-only": dict(guc="pg_co.rule_c_read_only", values=("off", "on"),
                             scripts=["serializable_2pc.sql@1", "local_reader_ro.sql@4"],
                             refusals="refused_rule_c", title="rule C for READ ONLY readers (read-mostly mix)"),
    "rule-s": dict(guc="pg_co.rule_s", values=("off", "on"), scripts=["local_writer.sql"],
                   refusals="refused_rule_s", title="rule S cost (local serializable writers)"),
}


def pgbench(server, args):
    cmd = [str(server.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"] + args + ["postgres"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pgbench failed: {r.stderr}\n{r.stdout}")
    return r.stdout + r.stderr


def set_guc(server, name: str, value: str):
    server.sql(f"ALTER SYSTEM SET {name} = {value}")
    server.sql("SELECT pg_reload_conf()")
    time.sleep(0.3)
    assert server.sql(f"SHOW {name}")[0][0] == value.strip("'")


def counter(server, expr):
    return server.sql(f"SELECT {expr} FROM co.stats")[0][0]


def run_once(server, exp, value, a, rows):
    set_guc(server, exp["guc"], value)
    before = counter(server, exp["refusals"])
    waits_before, wait_ms_before = counter(server, "waits"), counter(server, "wait_time_ms")
    checks_before, check_ms_before = counter(server, "checks_prepare + checks_commit"), counter(server, "check_time_ms")
    scripts = [x for s in exp["scripts"] for x in ("-f", str(HERE / s))]
    out = pgbench(server, ["-n", "-M", "simple", *scripts, "-D", f"nrows={rows}", "-c", str(a.clients),
                           "-j", "2", "-T", str(a.seconds), "--max-tries=20"])
    num = lambda pat: int((re.search(pat, out) or [0, 0])[1])  # noqa: E731
    return {"value": value, "tps": float(re.search(r"tps = ([\d.]+)", out).group(1)),
            "done": num(r"number of transactions actually processed: (\d+)"),
            "failed": num(r"number of failed transactions: (\d+)"),
            "retried": num(r"number of transactions retried: (\d+)"),
            "refusals": counter(server, exp["refusals"]) - before,
            "waits": counter(server, "waits") - waits_before,
            "wait_ms": float(counter(server, "wait_time_ms") - wait_ms_before),
            "checks": counter(server, "checks_prepare + checks_commit") - checks_before,
            "check_ms": float(counter(server, "check_time_ms") - check_ms_before)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", choices=EXPERIMENTS, default="cost")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--rows", type=int, help="accounts touched (default: all, 100000 x scale)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny and short")
    ap.add_argument("--pg", type=int, choices=PG_MAJORS, default=DEFAULT_PG_MAJOR,
                    help="PostgreSQL major to measure on (default $COTX_PG_MAJOR or 15)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.seconds, a.clients, a.scale = 1, 2, 2, 1
    exp = EXPERIMENTS[a.experiment]
    rows = a.rows or 100000 * a.scale
    reap_orphans()
    conf = {"max_connections": 50, "max_prepared_transactions": 50, "shared_buffers": "'256MB'",
            "default_transaction_isolation": "'read committed'"}
    results = []
    with PgServer(conf=conf, fsync=True, major=a.pg) as s:
        server_version = s.version
        print(f"server: {server_version} (pg_co preloaded)", flush=True)
        s.sql("CREATE EXTENSION pg_co")
        print(f"pgbench -i -s {a.scale} ...", flush=True)
        pgbench(s, ["-i", "-q", "-s", str(a.scale)])
        s.sql("CHECKPOINT")
        v_a, v_b = exp["values"]
        order = ([v_a, v_b, v_b, v_a] * a.pairs)[: 2 * a.pairs]  # ABBA
        for i, value in enumerate(order, 1):
            r = run_once(s, exp, value, a, rows)
            results.append(r)
            print(f"[{i}/{len(order)}] {exp['guc']} = {value}: {r['tps']:.1f} tps, {r['done']} tx, "
                  f"failed {r['failed']}, retried {r['retried']}, refusals {r['refusals']}, waits {r['waits']} "
                  f"({r['wait_ms']:.0f} ms in all)",
                  flush=True)
    by = {v: [r for r in results if r["value"] == v] for v in exp["values"]}
    med = {v: statistics.median(r["tps"] for r in rs) for v, rs in by.items()}
    per_k = lambda rs, key: 1000 * sum(r[key] for r in rs) / max(1, sum(r["done"] for r in rs))  # noqa: E731
    print(f"\n### {exp['title']} (pgbench, {server_version})")
    print(f"- median tps {v_a}: {med[v_a]:.1f}, {v_b}: {med[v_b]:.1f}, ratio on/off: **{med[v_b] / med[v_a]:.3f}**")
    # ABBA: runs 2k and 2k+1 (1-based 1,2 / 3,4 / ...) are one side-by-side pair each.
    pairs = [(x, y) for x, y in zip(results[0::2], results[1::2])]
    ratios = sorted((y if y["value"] == v_b else x)["tps"] / (x if x["value"] == v_a else y)["tps"] for x, y in pairs)
    if ratios:
        print(f"- per-pair ratio {v_b}/{v_a}: median {statistics.median(ratios):.3f}, range {ratios[0]:.3f}..{ratios[-1]:.3f} "
              f"({len(ratios)} side-by-side pairs: " + ", ".join(f"{r:.3f}" for r in ratios) + ")")
    print("- tps per run: " + ", ".join(f"{r['value']} {r['tps']:.0f}" for r in results))
    for v in exp["values"]:
        rs = by[v]
        print(f"- {exp['guc']} = {v}: refusals {per_k(rs, 'refusals'):.2f}, waits {per_k(rs, 'waits'):.2f}, "
              f"pgbench retried+failed {per_k(rs, 'retried') + per_k(rs, 'failed'):.2f} per 1000 committed")
    checks = sum(r["checks"] for r in results)
    if checks:
        print(f"- time inside pg_co's checks: {1000 * sum(r['check_ms'] for r in results) / checks:.2f} us per check "
              f"({checks} checks)")
    print(f"- runs: {len(results)} x {a.seconds} s, {a.clients} clients, scale {a.scale}, {rows} rows touched, ABBA")
    return 0


if __name__ == "__main__":
    sys.exit(main())

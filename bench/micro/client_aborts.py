#!/usr/bin/env python3
"""Why client mode aborts more than plain 2PC at the micro default point: counted, not
timed. Short slices of the modes, interleaved (ABBA), on the bench's servers and data (as
bench/experiments.py's micro point: tables at fillfactor 80, VACUUM before the point); for
each slice the abort ratio and every PostgreSQL serialization failure classified by the
statement it failed at (the server log's STATEMENT line: the workload's reads or updates,
the branch's slot write `cotx.shim_touch`, PREPARE TRANSACTION, COMMIT) and by SSI's
reason code (the DETAIL line); the slot table's HOT share (a non-HOT slot write inserts
into the primary key's leaf page, which conflicts with every SIREAD lock on that page);
and the SIREAD locks held during the slice, per relation and granule (tuple, page,
relation), sampled.

  /var/cache/cotx/venv/bin/python bench/micro/client_aborts.py [--modes 2pc,client]
      [--rounds 5] [--seconds 5] [--warmup 1] [--rows 100000] [--out /tmp/client-aborts]
  A mode may carry variants after ':' — client:block=N (the daemon's
  client_helper_block), MODE:par (the driver's --parallel-prepare: the branches prepared
  at once, not PostgreSQL's first) — so that levers run interleaved with the default.

Ratios only: throughput from a shared machine means nothing, and none is printed.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections import Counter
from pathlib import Path

from bench.harness import loadgen
from bench.harness.core import Env, log
from bench.micro import micro

_ERR = re.compile(r"ERROR:\s+(.*)$")
_DETAIL = re.compile(r"DETAIL:\s+(.*)$")
_STMT = re.compile(r"STATEMENT:\s+(.*)$")


def statement_kind(stmt: str) -> str:
    """The step a failed statement belongs to, from its text."""
    s = stmt.strip().lower()
    if "shim_touch" in s:
        return "slot write"
    if "shim_hold" in s:
        return "helper read"
    if s.startswith("prepare transaction"):
        return "PREPARE"
    if s.startswith("commit prepared"):
        return "COMMIT PREPARED"
    if s.startswith("commit"):
        return "COMMIT"
    if s.startswith("update"):
        return "workload update"
    if s.startswith("select"):
        return "workload read"
    return s[:30]


def reason(detail: str) -> str:
    """SSI's reason code, without transaction ids."""
    d = detail.replace("Reason code: ", "").rstrip(".")
    return re.sub(r"\d+", "N", d)


def log_failures(text: str) -> Counter:
    """(statement kind, reason) of each serialization failure in a slice of the server log."""
    out: Counter = Counter()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _ERR.search(line)
        if not m or "could not serialize access" not in m.group(1):
            continue
        detail, stmt = "", ""
        for nxt in lines[i + 1:i + 6]:
            if (d := _DETAIL.search(nxt)) and not detail:
                detail = d.group(1)
            if (s := _STMT.search(nxt)) and not stmt:
                stmt = s.group(1)
                break
            if _ERR.search(nxt):
                break
        if "concurrent update" in m.group(1):
            detail = "concurrent update"
        out[(statement_kind(stmt), reason(detail))] += 1
    return out


SIREAD = """SELECT c.relname, l.locktype, count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
            WHERE l.mode = 'SIReadLock' GROUP BY 1, 2"""


class LockSampler(threading.Thread):
    """SIREAD locks per (relation, granule), sampled every 0.25 s during a slice: the mean."""

    def __init__(self, env):
        super().__init__(daemon=True)
        self.env, self.stop, self.samples = env, threading.Event(), []

    def run(self):
        import psycopg
        with psycopg.connect(self.env.pg.dsn, autocommit=True) as c:
            while not self.stop.wait(0.25):
                self.samples.append({(r[0], r[1]): r[2] for r in c.execute(SIREAD).fetchall()})

    def mean(self) -> dict:
        keys = {k for s in self.samples for k in s}
        n = max(1, len(self.samples))
        return {f"{k[0]}/{k[1]}": round(sum(s.get(k, 0) for s in self.samples) / n, 1) for k in sorted(keys)}


def updates(env, schema: str, table: str) -> tuple[int, int]:
    """(updates, HOT updates) of a table so far."""
    r = env.pg.sql("SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0) FROM pg_stat_user_tables "
                   f"WHERE schemaname = '{schema}' AND relname = '{table}'")
    return int(r[0][0]), int(r[0][1])


def use_block(env, block: int | None) -> None:
    """Restarts the daemon in client mode with client_helper_block = block (None: the
    daemon's default) when it differs from what runs."""
    if getattr(env, "_h4_block", None) == block and env.enforcement == "client":
        return
    env._h4_block = block
    orig = env._store_daemons

    def patched(resources):
        for r in resources:
            if r["kind"] == "postgres":
                r.pop("client_helper_block", None)
                if block is not None:
                    r["client_helper_block"] = block
        return orig(resources)
    env._store_daemons = patched
    try:
        env.leftovers()
        env.start_daemon("client")
    finally:
        env._store_daemons = orig


def enter(env, mode: str) -> str:
    base, _, variant = mode.partition(":")
    env.set_mode(base)
    if base == "client":
        block = next((int(v.split("=", 1)[1]) for v in variant.split(":") if v.startswith("block=")), None)
        use_block(env, block)
    return base


def driver_extra(mode: str) -> list[str]:
    return ["--parallel-prepare"] if "par" in mode.split(":")[1:] else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="2pc,client")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rows", type=int, default=100000)
    ap.add_argument("--age", type=float, default=0.0,
                    help="seconds of 2pc load before the rounds, unmeasured: the tables' pages filled with row "
                         "versions (updates stop being HOT), as later in a long bench run")
    ap.add_argument("--vacuum-each", action="store_true",
                    help="a plain VACUUM before every slice: each slice starts with room for HOT updates")
    ap.add_argument("--out", type=Path, default=Path("/tmp/client-aborts"))
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    a.out.mkdir(parents=True, exist_ok=True)
    point = micro.parse_point("default", dict(micro.DEFAULTS, N=a.rows))
    wargs = loadgen.micro_args(point)
    rows = []
    with Env(fsync=True) as env:
        micro.load(env, a.rows)
        for i in range(micro.MAX_TABLES):   # as experiments.set_fillfactor(env, 80)
            env.pg.sql(f"ALTER TABLE mt{i} SET (fillfactor = 80)")
            env.pg.sql(f"VACUUM FULL mt{i}")
        env.vacuum()
        for m in modes:   # a short warm-up slice per mode (creates the slot table too)
            enter(env, m)
            loadgen.run_slice(env, m.partition(":")[0], wargs, clients=a.clients, warmup=0.5, seconds=1.0, seed=999)
            env.leftovers()
        env.vacuum()
        if a.age > 0:
            enter(env, "2pc")
            m0 = updates(env, "public", "mt0")
            loadgen.run_slice(env, "2pc", wargs, clients=a.clients, warmup=0.5, seconds=a.age, seed=4242)
            m1 = updates(env, "public", "mt0")
            log(f"aged: {a.age} s of 2pc, mt0 updates/HOT {m1[0] - m0[0]}/{m1[1] - m0[1]}")
        logf = env.pg.log_file
        for rnd in range(a.rounds):
            for pos, m in enumerate(modes if rnd % 2 == 0 else modes[::-1]):
                base = enter(env, m)
                if a.vacuum_each:
                    env.vacuum()
                att = a.out / f"attempts_{re.sub(r'[^A-Za-z0-9]+', '_', m)}_{rnd}.jsonl"
                att.unlink(missing_ok=True)
                off = logf.stat().st_size
                upd0, mt0 = updates(env, "cotx", "shim"), updates(env, "public", "mt0")
                sampler = LockSampler(env)
                sampler.start()
                r = loadgen.run_slice(env, base, wargs, clients=a.clients, warmup=a.warmup, seconds=a.seconds,
                                      seed=rnd * 7919 + pos + 1, attempt_log=att, extra=driver_extra(m))
                sampler.stop.set()
                sampler.join()
                left = env.leftovers()
                with open(logf, "rb") as f:
                    f.seek(off)
                    text = f.read().decode(errors="replace")
                upd = [x1 - x0 for x1, x0 in zip(updates(env, "cotx", "shim"), upd0)]
                mt0 = [x1 - x0 for x1, x0 in zip(updates(env, "public", "mt0"), mt0)]
                kinds: Counter = Counter()
                for line in att.read_text().splitlines() if att.exists() else []:
                    x = json.loads(line)
                    if x.get("measured") and x["outcome"] == "abort":
                        kinds[x.get("kind") or "?"] += 1
                row = {"round": rnd, "mode": m, "attempts": r.get("attempts"), "commits": r.get("commits"),
                       "aborts": r.get("aborts"), "abort_kinds": dict(kinds),
                       "pg_failures_by_step_and_reason": {f"{k[0]} | {k[1]}": v for k, v in log_failures(text).most_common()},
                       "shim_updates": upd[0], "shim_hot_updates": upd[1], "mt0_updates": mt0[0],
                       "mt0_hot_updates": mt0[1], "siread_mean": sampler.mean(),
                       "left_prepared": left, "error": r.get("error") or r.get("errors")}
                att_n = int(r.get("attempts") or 0)
                row["abort_ratio"] = round(int(r.get("aborts") or 0) / att_n, 4) if att_n else None
                rows.append(row)
                log(f"[{rnd}] {m}: aborts {r.get('aborts')}/{att_n} = {row['abort_ratio']}; "
                    f"{row['pg_failures_by_step_and_reason']}; shim upd/HOT {upd}; mt0 upd/HOT {mt0}; "
                    f"SIREAD {row['siread_mean']}")
                with open(a.out / "slices.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
    summary(rows)
    return 0


def summary(rows) -> None:
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    print("\nmode | slices | aborts / attempts (pooled) | per-slice ratios")
    for m in modes:
        rs = [r for r in rows if r["mode"] == m]
        ab = sum(int(r["aborts"] or 0) for r in rs)
        at = sum(int(r["attempts"] or 0) for r in rs)
        print(f"{m} | {len(rs)} | {ab}/{at} = {100 * ab / max(1, at):.2f} % | "
              + ", ".join(f"{100 * (r['abort_ratio'] or 0):.1f}" for r in rs))
    for m in modes:
        total: Counter = Counter()
        for r in rows:
            if r["mode"] == m:
                total.update(r["pg_failures_by_step_and_reason"])
        print(f"\n{m}: PostgreSQL serialization failures by step | reason (server log, warm-ups included)")
        for k, v in total.most_common():
            print(f"  {v:6d}  {k}")


if __name__ == "__main__":
    sys.exit(main())

"""List-append over upserts on one PostgreSQL server, checked for cycles.

The workload of the public report "Possible G2-item at SERIALIZABLE" (Jepsen's
list-append on PostgreSQL): three tables `txnK(id int primary key, sk int not null,
val text)`, initially empty; random transactions of 1-4 operations, half reads

    select val from txnK where id = $1

and half appends of a unique integer

    insert into txnK as t (id, sk, val) values ($1, $2, $3)
      on conflict (id) do update set val = concat(t.val, ',', $3) where t.id = $1

on keys from a small rolling window per table (`--window` active keys, a key retired
after `--appends-per-key` appends, so most keys are fresh and their first append inserts
the row). Every transaction runs in explicit BEGIN ... COMMIT, or with `--txn 2pc` as
BEGIN ... PREPARE TRANSACTION 'gid'; COMMIT PREPARED 'gid' (a failed PREPARE is an abort).

A read returns the whole list, so each key's version order is exact (the final state,
read after the run, is the longest list); `checker.check` derives the ww / wr / rw edges
from it as Elle's list-append does and reports every cycle. For each cycle the summary
shows each member's statements with their timings, whether a member waited more than
0.5 s in one statement, and which transactions were cancelled by the deadlock detector
(40P01) while it ran, with the server's log lines of those backends (log_lock_waits is
on). With pg_co, every refusal's DETAIL names the peer transaction by gid; the summary
says how many refused transactions formed a write-skew-shaped pair with that peer (each
read a key the other appended), i.e. would have closed a cycle had they committed.

    python -m checker.list_append --major 18 --mode plain --txn local --seconds 600 --seed 1
    python -m checker.list_append --help
    python -m checker.list_append --engines pg,my --mode co --txns 5000   # across both databases:
                                                                          # checker/list_append_global.py

Modes: `plain` starts the server without pg_co in shared_preload_libraries (PostgreSQL's
own SERIALIZABLE, no pg_co code in the process: the behaviour the public report is
about); `pg_co` loads it and enforces (pg_co.enabled = on, the default); `pg_co-off`
loads it with pg_co.enabled = off (to tell "pg_co's hooks are present" from "pg_co
refuses"). Exit status 1 when the history has any anomaly (a cycle, an aborted read, an
incompatible order), 0 otherwise, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .graph import check
from .history import Txn

TABLES = 3
LONG_WAIT = 0.5        # seconds: a statement this long waited for a lock (deadlock_timeout is 1 s)
READ_SQL = "select val from txn{t} where id = %s"
# Named parameters: psycopg sends each name once ($1 id, $2 sk, $3 val), so the server
# runs exactly the report's statement.
APPEND_SQL = ("insert into txn{t} as t (id, sk, val) values (%(id)s, %(sk)s, %(val)s) "
              "on conflict (id) do update set val = concat(t.val, ',', %(val)s) where t.id = %(id)s")
ISOLATION = {"serializable": "SERIALIZABLE", "repeatable-read": "REPEATABLE READ"}


def key_name(table: int, key: int) -> str:
    """Checker key of row `key` of table txn{table + 1} (tables are 0-based here)."""
    return f"txn{table + 1}/{key}"


class KeySpace:
    """The rolling windows, shared by all clients (under a lock): `window` active keys per
    table; a key is retired once `max_appends` appends were generated for it and replaced by
    a fresh one, so most appends hit a new or young row, as in the public report."""

    def __init__(self, window: int, max_appends: int):
        self.lock = threading.Lock()
        self.max_appends = max_appends
        self.next_key = [window] * TABLES
        self.windows = [list(range(window)) for _ in range(TABLES)]
        self.appends = Counter()
        self.next_value = 0
        self.used = [set() for _ in range(TABLES)]

    def gen(self, rng: random.Random) -> list:
        """One transaction's operations: [("r"|"append", table, key, value)]."""
        ops = []
        with self.lock:
            for _ in range(rng.randint(1, 4)):
                t = rng.randrange(TABLES)
                k = rng.choice(self.windows[t])
                self.used[t].add(k)
                if rng.random() < 0.5:
                    ops.append(("r", t, k, None))
                    continue
                self.next_value += 1
                ops.append(("append", t, k, self.next_value))
                self.appends[(t, k)] += 1
                if self.appends[(t, k)] >= self.max_appends:
                    w = self.windows[t]
                    w[w.index(k)] = self.next_key[t]
                    self.next_key[t] += 1
        return ops


@dataclass
class Record:
    """One transaction as executed: what the checker needs plus what a human needs."""
    id: str
    client: int
    pid: int
    start: float                       # seconds since the run began (monotonic)
    end: float = 0.0
    ops: list = field(default_factory=list)      # checker micro-ops (f, key, value)
    stmts: list = field(default_factory=list)    # [label, start, seconds, result]
    status: str = "ok"                 # ok | fail | info
    sqlstate: str | None = None
    reason: str | None = None          # cotx.refusals kind of the error
    error: str | None = None
    detail: str | None = None
    gid: str | None = None

    def txn(self) -> Txn:
        return Txn(self.id, list(self.ops), self.status, "global" if self.gid else "local",
                   f"client {self.client}, pid {self.pid}")

    def max_wait(self) -> float:
        return max((s[2] for s in self.stmts), default=0.0)

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("id", "client", "pid", "start", "end", "ops", "stmts", "status",
                                              "sqlstate", "reason", "error", "detail", "gid")}


@dataclass
class Result:
    records: list
    final: dict                      # key -> list (the state after the run)
    seconds: float
    report: object = None            # checker Report
    co_stats: dict | None = None
    server_log: list = field(default_factory=list)
    scans: dict = field(default_factory=dict)    # table -> (seq_scan, idx_scan): how reads were planned
    version: str = ""
    left_prepared: int = 0
    # Commits the daemon handed to a decision branch (co.decide; mode dip), from its metrics.
    decided_in_participant: int = 0

    @property
    def committed(self) -> int:
        return self.report.committed

    def lost_appends(self) -> list:
        """Appends of committed transactions missing from the final state, and values that
        appear twice in one list: neither is a cycle, both are wrong (a lost or repeated
        write), so they count as anomalies of the run."""
        out = []
        for r in self.records:
            if r.status == "ok":
                out += [f"{r.id}'s append {v} to {k} is not in the final {k} = {self.final.get(k, [])}"
                        for f, k, v in r.ops if f == "append" and v not in self.final.get(k, ())]
        for k, lst in self.final.items():
            if len(lst) != len(set(lst)):
                out.append(f"{k} = {lst} holds a value twice")
        return out

    @property
    def anomalous(self) -> bool:
        return bool(self.report.anomalies) or bool(self.lost_appends())

    def cycles(self) -> list:
        return self.report.cycles()

    def aborts(self) -> Counter:
        return Counter(r.reason for r in self.records if r.status == "fail")


def _classify(e) -> str:
    from cotx import refusals
    return refusals.classify(e).kind


def _client(dsn_conn, cid: int, keys: KeySpace, rng: random.Random, deadline: float, t0: float,
            isolation: str, txn_mode: str, run_tag: str, out: list, errors: list, think_ms: int):
    import psycopg
    try:
        conn = dsn_conn()
        pid = conn.info.backend_pid
        begin = f"BEGIN ISOLATION LEVEL {ISOLATION[isolation]}"
        n = 0
        while time.monotonic() < deadline:
            n += 1
            rec = Record(f"c{cid}.{n}", cid, pid, round(time.monotonic() - t0, 4))
            if txn_mode == "2pc":
                rec.gid = f"la-{run_tag}-{cid}-{n}"
            out.append(rec)
            prepared = False

            def stmt(label, sql, params=None):
                s = time.monotonic()
                row = None
                try:
                    cur = conn.execute(sql, params, prepare=params is not None)
                    if cur.description:
                        row = cur.fetchone()
                except psycopg.Error as e:
                    rec.stmts.append([label, round(s - t0, 4), round(time.monotonic() - s, 4), e.sqlstate or "error"])
                    raise
                rec.stmts.append([label, round(s - t0, 4), round(time.monotonic() - s, 4), "ok"])
                return row

            try:
                for i, (f, t, k, v) in enumerate(keys.gen(rng)):
                    # Jepsen's client sleeps 0-9 ms before each operation, inside the
                    # transaction after the first: transactions stay open long enough to
                    # overlap many others. Its driver sends BEGIN with the first statement.
                    if think_ms:
                        time.sleep(rng.randrange(think_ms) / 1000)
                    if i == 0:
                        stmt("BEGIN", begin)
                    kn = key_name(t, k)
                    if f == "r":
                        row = stmt(f"read {kn}", READ_SQL.format(t=t + 1), (k,))
                        val = [int(x) for x in row[0].split(",")] if row and row[0] else []
                        rec.ops.append(("r", kn, val))
                    else:
                        # The append is recorded before it runs: an append that failed
                        # belongs to an aborted transaction, which the checker leaves out.
                        rec.ops.append(("append", kn, v))
                        stmt(f"append {v} to {kn}", APPEND_SQL.format(t=t + 1), {"id": k, "sk": k, "val": str(v)})
                if rec.gid:
                    stmt("PREPARE TRANSACTION", f"PREPARE TRANSACTION '{rec.gid}'")
                    prepared = True
                    stmt("COMMIT PREPARED", f"COMMIT PREPARED '{rec.gid}'")
                else:
                    stmt("COMMIT", "COMMIT")
            except psycopg.Error as e:
                rec.status = "info" if prepared else "fail"
                rec.sqlstate = e.sqlstate
                rec.error = (e.diag.message_primary or str(e)).splitlines()[0][:300]
                rec.detail = e.diag.message_detail
                rec.reason = _classify(e)
                if conn.closed:
                    conn = dsn_conn()
                    pid = conn.info.backend_pid
                elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK")
            rec.end = round(time.monotonic() - t0, 4)
        conn.close()
    except Exception as e:  # a client that dies must not look like a quiet, clean run
        errors.append(f"client {cid}: {type(e).__name__}: {e}")


def setup_schema(srv) -> None:
    with srv.connect() as c:
        for t in range(1, TABLES + 1):
            c.execute(f"DROP TABLE IF EXISTS txn{t}")
            c.execute(f"CREATE TABLE txn{t} (id int PRIMARY KEY, sk int NOT NULL, val text)")


def run(srv, *, seconds: float, clients: int = 8, window: int = 6, appends_per_key: int = 5,
        seed: int = 1, isolation: str = "serializable", txn: str = "local", pg_co: bool = False,
        think_ms: int = 10) -> Result:
    """Run the workload on a started server (harness PgServer) and check the history."""
    setup_schema(srv)
    if pg_co:
        srv.sql("CREATE EXTENSION IF NOT EXISTS pg_co")
        srv.sql("SELECT co.reset_stats()")
    keys = KeySpace(window, appends_per_key)
    records: list = []
    errors: list = []
    outs = [[] for _ in range(clients)]
    t0 = time.monotonic()
    wall0 = time.time()
    deadline = t0 + seconds
    run_tag = f"{seed}-{int(wall0) % 100000}"
    threads = [threading.Thread(target=_client, daemon=True,
                                args=(srv.connect, cid, keys, random.Random(seed * 1000 + cid), deadline, t0,
                                      isolation, txn, run_tag, outs[cid], errors, think_ms))
               for cid in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t0
    if errors:
        raise RuntimeError("workload clients failed: " + "; ".join(errors))
    for o in outs:
        records += o
    final = {}
    for t in range(TABLES):
        for k, val in srv.sql(f"SELECT id, val FROM txn{t + 1}"):
            final[key_name(t, k)] = [int(x) for x in val.split(",")] if val else []
    left = srv.sql("SELECT count(*) FROM pg_prepared_xacts")[0][0]
    # A sequential scan takes a relation-wide predicate lock, an index scan page and tuple
    # locks: which one the reads used changes what SSI can see.
    time.sleep(0.6)   # the cumulative statistics are flushed about every second
    scans = {r[0]: (r[1], r[2]) for r in srv.sql(
        "SELECT relname, seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname LIKE 'txn_' ORDER BY 1")}
    res = Result(records, final, elapsed, version=srv.version.rstrip(")"), left_prepared=left, scans=scans)
    res.report = check([r.txn() for r in records], final_reads=final)
    if pg_co:
        cur_rows = srv.connect().execute("SELECT * FROM co.stats")
        cols = [d.name for d in cur_rows.description]
        res.co_stats = dict(zip(cols, cur_rows.fetchone()))
    res.server_log = _read_log(srv, wall0)
    return res


def load_log(path) -> Result:
    """A run written with --log, checked again (no server; no co.stats or server log)."""
    records, final = [], {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "final" in d:
                final = d["final"]
                continue
            r = Record(**{k: v for k, v in d.items() if k != "ops"})
            r.ops = [tuple(o) for o in d["ops"]]
            records.append(r)
    seconds = max((r.end for r in records), default=0.0)
    res = Result(records, final, seconds, version=f"the log {path}")
    res.report = check([r.txn() for r in records], final_reads=final)
    return res


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \w+ \[(\d+)\] (.*)$")


def _read_log(srv, wall0: float) -> list:
    """The server log as [(seconds since the run began, pid, text)]; continuation lines are
    joined to the line they continue (log_line_prefix = '%m [%p] ')."""
    out = []
    try:
        text = srv.log_file.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = _LOG_LINE.match(line)
        if m:
            ts = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
            out.append([round(ts - wall0, 3), int(m.group(2)), m.group(3)])
        elif out:
            out[-1][2] += "\n    " + line.strip()
    return out


def _gid_peer(detail: str | None) -> str | None:
    m = re.search(r"gid '([^']+)'", detail or "")
    return m.group(1) if m else None


def refusal_pairs(res: Result) -> dict:
    """pg_co refusals and the peer each names: how many peers are known (gid of a 2PC
    transaction of this run), and how many (refused T, peer X) pairs are write-skew-shaped:
    T read a key X appended and missed X's append, and X read a key T appended (T aborted,
    so X missed it; had T committed, its append would have come after what X read). Such a
    pair is a G2 cycle that the refusal prevented."""
    by_gid = {r.gid: r for r in res.records if r.gid}
    deadlock_times = sorted(r.end for r in res.records if r.sqlstate == "40P01")

    def deadlock_during(r):
        import bisect
        i = bisect.bisect_left(deadlock_times, r.start)
        return i < len(deadlock_times) and deadlock_times[i] <= r.end

    # "with the reported signature": one of the pair waited > LONG_WAIT in a statement or
    # ran while the deadlock detector cancelled someone, as in most cycles of the report.
    out = {"refusals": 0, "peer named": 0, "cycle-shaped": 0, "cycle-shaped with the signature": 0,
           "examples": []}
    for r in res.records:
        if r.status != "fail" or not (r.reason or "").startswith("pg_co"):
            continue
        out["refusals"] += 1
        x = by_gid.get(_gid_peer(r.detail))
        if x is None:
            continue
        out["peer named"] += 1
        x_appends = {(k, v) for f, k, v in x.ops if f == "append"}
        r_appends = {k: v for f, k, v in r.ops if f == "append"}
        t_misses_x = [k for f, k, v in r.ops if f == "r" and any(kk == k and vv not in v for kk, vv in x_appends)]
        x_misses_t = [k for f, k, v in x.ops if f == "r" and k in r_appends]
        if t_misses_x and x_misses_t:
            out["cycle-shaped"] += 1
            if any(m.max_wait() > LONG_WAIT or deadlock_during(m) for m in (r, x)):
                out["cycle-shaped with the signature"] += 1
            if len(out["examples"]) < 3:
                out["examples"].append(
                    f"{r.id} refused ({r.reason}) naming {x.id} ({x.status}): {r.id} read {t_misses_x[0]} "
                    f"without {x.id}'s append, {x.id} read {x_misses_t[0]} which {r.id} appended to")
    return out


def _fmt_stmts(r: Record) -> list:
    return [f"      {s[1]:9.4f}s +{s[2]:.4f}s {s[0]} -> {s[3]}" for s in r.stmts]


def _describe(r: Record) -> list:
    head = (f"    {r.id} (client {r.client}, pid {r.pid}, {r.gid or 'local'}): {r.status}"
            + (f" {r.sqlstate} {r.reason}: {r.error}" if r.sqlstate else "")
            + f", {r.start:.4f}s..{r.end:.4f}s, longest statement {r.max_wait():.3f}s")
    return [head] + _fmt_stmts(r)


def explain_cycle(res: Result, cyc) -> list:
    by_id = {r.id: r for r in res.records}
    members = [by_id[x] for x in cyc.txns]
    deadlocks = [r for r in res.records if r.sqlstate == "40P01"]
    lines = [cyc.text, "  members:"]
    pids = set()
    lo, hi = min(m.start for m in members), max(m.end for m in members)
    for m in members:
        lines += _describe(m)
        conc = [d for d in deadlocks if m.start <= d.end <= m.end]
        lines.append(f"      waited > {LONG_WAIT}s in a statement: {'yes' if m.max_wait() > LONG_WAIT else 'no'}; "
                     f"40P01 during it: " + (", ".join(f"{d.id} (pid {d.pid}, at {d.end:.4f}s)" for d in conc) or "none"))
        pids.add(m.pid)
        for d in conc:
            pids.add(d.pid)
    shown = {m.id for m in members}
    for d in deadlocks:
        if d.id not in shown and any(m.start <= d.end <= m.end for m in members):
            lines.append("  cancelled by the deadlock detector meanwhile:")
            lines += _describe(d)
            shown.add(d.id)
    touched = {k for m in members for _, k, _ in m.ops}
    others = [r for r in res.records if r.id not in shown and r.start <= hi and r.end >= lo
              and any(k in touched for _, k, _ in r.ops)]
    lines.append(f"  other transactions overlapping the cycle on its keys ({len(others)}):")
    for r in others[:40]:
        lines += _describe(r)
    logs = [e for e in res.server_log if e[1] in pids and lo - 0.05 <= e[0] <= hi + 0.05]
    if logs:
        lines.append("  server log of these backends meanwhile:")
        lines += [f"    {t:9.3f}s [{pid}] {text}" for t, pid, text in logs]
    return lines


def summary(res: Result, label: str = "", show: int = 20) -> str:
    rep = res.report
    n = len(res.records)
    waits = [r for r in res.records if r.max_wait() > LONG_WAIT]
    lines = [f"list-append {label}".rstrip() + f" on {res.version}: {res.seconds:.1f} s, {n} transactions, "
             f"{rep.committed} committed ({rep.committed / max(res.seconds, 1e-9):.0f}/s), "
             f"{sum(r.status == 'fail' for r in res.records)} aborted, "
             f"{sum(r.status == 'info' for r in res.records)} unknown outcome, {rep.edges} dependency edges"]
    for reason, c in sorted(res.aborts().items(), key=lambda x: -x[1]):
        codes = sorted({r.sqlstate for r in res.records if r.status == "fail" and r.reason == reason})
        lines.append(f"  aborted: {c:7d}  {reason} ({', '.join(codes)})")
    lines.append(f"  transactions with a statement longer than {LONG_WAIT}s: {len(waits)}")
    if res.scans:
        lines.append("  scans (sequential, index): " + ", ".join(f"{t} {s}, {i}" for t, (s, i) in res.scans.items()))
    if res.left_prepared:
        lines.append(f"  left prepared after the run: {res.left_prepared}")
    if res.co_stats is not None:
        keep = {k: v for k, v in res.co_stats.items() if v}
        lines.append(f"  co.stats: {keep}")
        pairs = refusal_pairs(res)
        lines.append(f"  pg_co refusals: {pairs['refusals']}, peer named by gid: {pairs['peer named']}, "
                     f"write-skew-shaped pairs among them: {pairs['cycle-shaped']} "
                     f"({pairs['cycle-shaped with the signature']} with a wait > {LONG_WAIT}s or a 40P01 during one of the pair)")
        lines += [f"    e.g. {e}" for e in pairs["examples"]]
    cycles = res.cycles()
    lines.append(f"  cycles: {len(cycles)}" + (f" ({1e5 * len(cycles) / rep.committed:.2f} per 100k committed)"
                                               if rep.committed else ""))
    other = [a for a in rep.anomalies if a not in cycles]
    for a in other[:20]:
        lines.append(f"  ANOMALY {a.text}")
    lost = res.lost_appends()
    lines.append(f"  committed appends missing from the final state, or repeated: {len(lost)}")
    lines += [f"  ANOMALY {x}" for x in lost[:20]]
    for i, c in enumerate(cycles[:show]):
        lines += ["", f"CYCLE {i + 1} of {len(cycles)}"] + explain_cycle(res, c)
    if len(cycles) > show:
        lines.append(f"({len(cycles) - show} more cycles not shown: --show)")
    return "\n".join(lines)


def server_conf(mode: str, durable: bool = False, max_connections: int | None = None, txn: str = "local") -> dict:
    # Lock waits past deadlock_timeout and deadlock reports go to the log, in UTC, so a
    # cycle's report can show what its members waited for.
    conf = {"log_lock_waits": "on", "log_line_prefix": "'%m [%p] '", "log_timezone": "'UTC'"}
    if mode == "pg_co":
        conf["pg_co.log_vetoes"] = "off"     # the DETAIL of each refusal is recorded by the client
    elif mode == "pg_co-off":
        conf["pg_co.enabled"] = "off"
    if durable:
        # The test servers run with fsync and synchronous_commit off; a stock server
        # waits for the WAL flush at every commit, which widens the commit window.
        conf.update({"fsync": "on", "synchronous_commit": "on"})
    if max_connections:
        # PostgreSQL keeps (backend slots + prepared transactions) x 10 serializable
        # transactions; beyond that it summarizes the oldest committed ones (the state
        # under which its SSI misses conflicts: docs/postgresql-ssi-summarized-readers.md).
        conf.update({"max_connections": max_connections,
                     "max_prepared_transactions": max_connections if txn == "2pc" else 0})
    return conf


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if any(x == "--engines" or x.startswith("--engines=") for x in args):
        # Across PostgreSQL and MariaDB through the coordinator: list_append_global.
        from .list_append_global import main as main_global
        return main_global(args)
    ap = argparse.ArgumentParser(prog="python -m checker.list_append",
                                 description="List-append over upserts on a throwaway PostgreSQL server; "
                                             "checks the history for cycles (exit 1 if any anomaly).")
    ap.add_argument("--major", type=int, choices=(15, 16, 17, 18), default=15, help="PostgreSQL major (default 15)")
    ap.add_argument("--mode", choices=("plain", "pg_co", "pg_co-off"), default="plain",
                    help="plain: pg_co not loaded; pg_co: loaded and enforcing; pg_co-off: loaded, pg_co.enabled=off")
    ap.add_argument("--txn", choices=("local", "2pc"), default="local",
                    help="local: BEGIN ... COMMIT; 2pc: BEGIN ... PREPARE TRANSACTION; COMMIT PREPARED")
    ap.add_argument("--isolation", choices=tuple(ISOLATION), default="serializable")
    ap.add_argument("--seconds", type=float, default=60, help="how long to run (default 60)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--window", type=int, default=6, help="active keys per table (default 6)")
    ap.add_argument("--appends-per-key", type=int, default=5, help="appends after which a key is retired (default 5)")
    ap.add_argument("--think-ms", type=int, default=10,
                    help="sleep a random 0..N-1 ms before each operation, as Jepsen's client does (default 10; 0: none)")
    ap.add_argument("--seed", type=int, default=1, help="seeds each client's generator (threads interleave freely)")
    ap.add_argument("--log", help="write every transaction (operations, statements, timings, errors) as JSON lines")
    ap.add_argument("--json", help="write the summary numbers as one JSON object")
    ap.add_argument("--max-connections", type=int, metavar="N",
                    help="the server's max_connections (and max_prepared_transactions with --txn 2pc, else 0): "
                         "a small N makes PostgreSQL's SSI summarize under this load (12 does; the harness default "
                         "does not)")
    ap.add_argument("--durable", action="store_true",
                    help="fsync and synchronous_commit on (the harness's servers have both off)")
    ap.add_argument("--from-log", metavar="PATH", help="check a run written with --log again, without a server")
    ap.add_argument("--show", type=int, default=20, help="explain at most this many cycles in full (default 20)")
    a = ap.parse_args(argv)
    if a.seconds <= 0:
        ap.error("--seconds must be > 0")
    if a.think_ms < 0:
        ap.error("--think-ms must be >= 0")
    if a.max_connections is not None and a.max_connections < a.clients + 2:
        ap.error(f"--max-connections must leave room for the {a.clients} clients and the checker's own sessions "
                 f"(at least {a.clients + 2})")
    if a.clients < 1 or a.window < 1 or a.appends_per_key < 1:
        ap.error("--clients, --window and --appends-per-key must be >= 1")
    if a.mode != "plain" and a.isolation != "serializable" and a.txn == "2pc":
        ap.error("pg_co refuses to prepare a transaction below SERIALIZABLE: use --mode plain")

    if a.from_log:
        res = load_log(a.from_log)
        print(summary(res, "", a.show))
        return 1 if res.anomalous else 0
    from cotest import PgServer
    from cotest.servers import pg_co_installed, pg_unavailable
    why = pg_unavailable(a.major)
    if why:
        ap.error(f"PostgreSQL {a.major} is not available: {why}")
    if a.mode != "plain" and not pg_co_installed(a.major):
        ap.error(f"pg_co is not installed into PostgreSQL {a.major} (run scripts/build.sh)")
    label = (f"{a.mode} {a.txn} {a.isolation}, {a.clients} clients, window {a.window}, think {a.think_ms} ms, "
             f"{'durable commits, ' if a.durable else ''}"
             f"{f'max_connections {a.max_connections}, ' if a.max_connections else ''}seed {a.seed}")
    with PgServer(major=a.major, preload=a.mode != "plain", conf=server_conf(a.mode, a.durable, a.max_connections, a.txn),
                  fsync=a.durable) as srv:
        res = run(srv, seconds=a.seconds, clients=a.clients, window=a.window, appends_per_key=a.appends_per_key,
                  seed=a.seed, isolation=a.isolation, txn=a.txn, pg_co=a.mode == "pg_co",
                  think_ms=a.think_ms)
    print(summary(res, label, a.show))
    if a.log:
        with open(a.log, "w") as f:
            for r in res.records:
                f.write(json.dumps(r.to_json()) + "\n")
            f.write(json.dumps({"final": res.final}) + "\n")
    if a.json:
        pairs = refusal_pairs(res) if res.co_stats is not None else None
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "version": res.version, "seconds": res.seconds,
                       "transactions": len(res.records), "committed": res.committed, "scans": res.scans,
                       "aborts": dict(res.aborts()), "cycles": len(res.cycles()),
                       "anomalies": [a_.kind for a_ in res.report.anomalies], "lost_appends": res.lost_appends(),
                       "co_stats": res.co_stats,
                       "refusal_pairs": pairs, "long_waits": sum(r.max_wait() > LONG_WAIT for r in res.records)},
                      f, default=str, indent=1)
    return 1 if res.anomalous else 0


if __name__ == "__main__":
    sys.exit(main())

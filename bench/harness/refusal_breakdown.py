"""Why pg_co refused what it refused: joins every pg_co refusal in an attempt log with its
blocker and labels the conflict by the finest granule both transactions touched.

Input: the JSONL attempt log of the load drivers (one line per attempt:
{"gtid", "mode", "t", "outcome", "branches": [{"db", "bid", "table", "read", "written"}],
"error": null | {"db", "sqlstate", "message", "detail"}}). A pg_co refusal's DETAIL ends with
"pg_co blocker: rule=.. point=.. xid=.. gid='prefix:gtid:bid' ..." (docs/pg_co.md,
"Errors"); the gid names the blocking attempt and branch.

Labels, finest first (docs/pg_co.md, rules A, B, C say who read and who wrote):
- same_row: the reader read a key the writer wrote (rule A: refused reads, blocker
  writes; rule B: blocker reads, refused writes; rule C: refused reads, blocker writes).
- same_index_page: no common key, but a key the reader read and one the writer wrote sit
  on the same btree leaf page of the table's primary key (SSI locks the leaf page an index
  scan visits, and an insertion into that page conflicts with it).
- same_heap_page: same heap page (a promoted tuple lock, or a page-level read).
- relation: the same table and nothing finer (a relation-level predicate lock).
- summarized: PostgreSQL had summarized the refused transaction's conflicts (rule A's
  summarized refusal names no blocker).
- unknown: no blocker to join (not in the log, a local transaction, another table).

The blocker is found by its gid (a prepared branch) or, when it committed locally and so
has no gid (dip's decision branch: co.decide and a one-phase COMMIT), by the xid the driver
logs for that branch ("pg_xid"), which the blocker line names too. Only refusals of
measured attempts are counted (as the slices' abort reasons), per mode with --mode; a
blocker may be any attempt of the log.

Pages come from the server after the run, by PostgreSQL's own predicate locks: for each
key involved, a serializable transaction reads it by an index scan and pg_locks shows the
SIReadLock targets that read took (the PK leaf page, the heap tuple's page). That is
exactly the granule SSI compares, for any key type, needs no extension, and works the same
on every major. It is the page of the key *now*: a page split or a non-HOT update during the
run may have moved a key since (the label is then one granule off, never a row).

CLI: python -m bench.harness.refusal_breakdown ATTEMPTS.jsonl --pg-dsn DSN [--table T]
[--json]: counts per rule x label.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

LABELS = ["same_row", "same_index_page", "same_heap_page", "relation", "summarized", "unknown"]
_BLOCKER = re.compile(r"pg_co blocker: (.*)$", re.M)
_FIELD = re.compile(r"(\w+)=('(?:[^']|'')*'|\S+)")


@dataclass
class Blocker:
    rule: str
    point: str
    xid: str
    gid: str | None
    pid: str
    state: str
    summarized: bool
    waited_ms: int


def parse_blocker(detail: str | None) -> Blocker | None:
    """The blocker line of a pg_co refusal's DETAIL, None when there is none."""
    m = _BLOCKER.search(detail or "")
    if not m:
        return None
    f = {k: v for k, v in _FIELD.findall(m.group(1))}
    gid = f.get("gid", "-")
    gid = gid[1:-1].replace("''", "'") if gid.startswith("'") else None
    return Blocker(rule=f.get("rule", "-"), point=f.get("point", "-"), xid=f.get("xid", "-"), gid=gid,
                   pid=f.get("pid", "-"), state=f.get("state", "-"), summarized=f.get("summarized") == "yes",
                   waited_ms=int(f.get("waited_ms", "0") or 0))


def split_gid(gid: str) -> tuple[str, str] | None:
    """(gtid, branch id) of a PostgreSQL gid '<prefix>:<gtid>:<bid>' (docs/coordinator.md,
    "Ids": neither part may contain ':')."""
    parts = gid.split(":")
    return (parts[1], parts[2]) if len(parts) == 3 else None


def _key(k):
    """Keys as hashable values (a composite key is a JSON list)."""
    return tuple(k) if isinstance(k, list) else k


@dataclass
class Side:
    """What one transaction did at PostgreSQL, per table."""
    read: dict = field(default_factory=lambda: defaultdict(set))
    written: dict = field(default_factory=lambda: defaultdict(set))


def pg_side(attempt: dict, bid: str | None = None) -> Side:
    """The PostgreSQL branches of an attempt (only branch `bid` when given)."""
    s = Side()
    for b in attempt.get("branches", []):
        if b.get("db") != "pg" or (bid is not None and str(b.get("bid")) != bid):
            continue
        t = b.get("table")
        s.read[t] |= {_key(k) for k in b.get("read", [])}
        s.written[t] |= {_key(k) for k in b.get("written", [])}
    return s


def is_pg_co_refusal(attempt: dict) -> bool:
    e = attempt.get("error") or {}
    return attempt.get("outcome") == "abort" and e.get("db") == "pg" and "pg_co refused" in (e.get("message") or "")


def reader_writer(rule: str, refused: Side, blocker: Side) -> tuple[Side, Side]:
    """Who read and who wrote in the rw edge the rule refused on."""
    return (blocker, refused) if rule == "B" else (refused, blocker)


class PageMap:
    """key -> (leaf page of the table's PK, heap page), from the server's predicate locks."""

    def __init__(self, conn):
        self.conn = conn
        self.cache: dict = {}
        self.pk_cols: dict = {}

    def _pk(self, table: str) -> list[str]:
        if table not in self.pk_cols:
            rows = self.conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
                "ORDER BY array_position(i.indkey::int2[], a.attnum)", (table,)).fetchall()
            if not rows:
                raise ValueError(f"table {table} has no primary key")
            self.pk_cols[table] = [r[0] for r in rows]
        return self.pk_cols[table]

    def pages(self, table: str, key) -> tuple[int | None, int | None]:
        """(leaf block, heap block) of `key` in `table`; None where the read took no such lock
        (a key that does not exist has no heap tuple)."""
        ck = (table, key)
        if ck in self.cache:
            return self.cache[ck]
        cols = self._pk(table)
        vals = list(key) if isinstance(key, tuple) else [key]
        where = " AND ".join(f'"{c}" = %s' for c in cols)
        c = self.conn
        c.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        try:
            # An index scan, so that the predicate locks are those of a point read by key.
            c.execute("SET LOCAL enable_seqscan = off")
            c.execute("SET LOCAL enable_bitmapscan = off")
            c.execute("SET LOCAL enable_indexonlyscan = off")
            c.execute(f'SELECT 1 FROM "{table}" WHERE {where}', vals)
            rows = c.execute(
                "SELECT l.locktype, l.relation = %s::regclass, l.page FROM pg_locks l "
                "WHERE l.pid = pg_backend_pid() AND l.mode = 'SIReadLock' AND l.locktype IN ('page', 'tuple')",
                (table,)).fetchall()
        finally:
            c.execute("ROLLBACK")
        leaf = next((p for t, is_heap, p in rows if t == "page" and not is_heap), None)
        heap = next((p for t, is_heap, p in rows if is_heap), None)
        self.cache[ck] = (leaf, heap)
        return self.cache[ck]


def classify(rule: str, refused: Side, blocker: Side | None, summarized: bool, pages: PageMap | None) -> str:
    if blocker is None:
        return "summarized" if summarized else "unknown"
    reader, writer = reader_writer(rule, refused, blocker)
    tables = [t for t in reader.read if t in writer.written]
    for t in tables:
        if reader.read[t] & writer.written[t]:
            return "same_row"
    if pages is not None:
        for level, label in ((0, "same_index_page"), (1, "same_heap_page")):
            for t in tables:
                r = {pages.pages(t, k)[level] for k in reader.read[t]} - {None}
                w = {pages.pages(t, k)[level] for k in writer.written[t]} - {None}
                if r & w:
                    return label
    if tables:
        return "relation"
    return "summarized" if summarized else "unknown"


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _by_xid(attempts: list[dict]) -> dict[str, tuple[dict, str]]:
    """pg xid -> (attempt, branch id), for the branches whose xid the driver logged."""
    out = {}
    for a in attempts:
        for b in a.get("branches", []):
            if b.get("db") == "pg" and b.get("pg_xid") is not None:
                out[str(b["pg_xid"])] = (a, str(b.get("bid")))
    return out


def blocker_side(a: dict, b: Blocker | None, by_gtid: dict, by_xid: dict) -> Side | None:
    """What the blocker of refusal `a` did at PostgreSQL, when the log holds it."""
    if b is None:
        return None
    ids = split_gid(b.gid) if b.gid else None
    if ids and ids[0] in by_gtid and ids[0] != a["gtid"]:
        return pg_side(by_gtid[ids[0]], ids[1])
    hit = by_xid.get(b.xid) if not ids else None
    if hit and hit[0]["gtid"] != a["gtid"]:
        return pg_side(hit[0], hit[1])
    return None


def breakdown(attempts: list[dict], pages: PageMap | None, modes: set[str] | None = None) -> tuple[Counter, list[dict]]:
    """Counts per (rule, label) of the measured refusals (of `modes` when given), and one row
    per refusal (for inspection)."""
    by_gtid = {a["gtid"]: a for a in attempts}
    by_xid = _by_xid(attempts)
    counts: Counter = Counter()
    rows = []
    for a in attempts:
        if not is_pg_co_refusal(a) or not a.get("measured", True) or (modes and a.get("mode") not in modes):
            continue
        b = parse_blocker(a["error"].get("detail"))
        rule = b.rule if b else _rule_from_message(a["error"].get("message", ""))
        other = blocker_side(a, b, by_gtid, by_xid)
        label = classify(rule, pg_side(a), other, bool(b and b.summarized), pages)
        counts[(rule, label)] += 1
        rows.append({"gtid": a["gtid"], "rule": rule, "label": label, "blocker_gid": b.gid if b else None})
    return counts, rows


def _rule_from_message(msg: str) -> str:
    m = re.search(r"rule ([ABC])", msg)
    return m.group(1) if m else "-"


def format_table(counts: Counter) -> str:
    rules = sorted({r for r, _ in counts})
    head = ["rule"] + LABELS + ["total"]
    lines = [" ".join(f"{h:>15}" for h in head)]
    for r in rules:
        cells = [counts[(r, lab)] for lab in LABELS]
        lines.append(" ".join(f"{x:>15}" for x in [r] + cells + [sum(cells)]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("attempts", help="JSONL attempt log")
    ap.add_argument("--pg-dsn", help="PostgreSQL to read page membership from (after the run); without it no page labels")
    ap.add_argument("--table", action="append", default=[],
                    help="only refusals whose PostgreSQL branches touch this table (repeatable)")
    ap.add_argument("--mode", action="append", default=[], help="only refusals of this mode (repeatable)")
    ap.add_argument("--json", action="store_true", help="print counts and per-refusal rows as JSON")
    args = ap.parse_args(argv)
    attempts = load(args.attempts)
    if args.table:
        keep = set(args.table)
        attempts = [a for a in attempts if not is_pg_co_refusal(a) or keep & set(pg_side(a).read) | keep & set(pg_side(a).written)]
    conn = None
    if args.pg_dsn:
        import psycopg
        conn = psycopg.connect(args.pg_dsn, autocommit=True)
    try:
        counts, rows = breakdown(attempts, PageMap(conn) if conn else None, set(args.mode) or None)
    finally:
        if conn:
            conn.close()
    if args.json:
        print(json.dumps({"counts": [{"rule": r, "label": l, "n": n} for (r, l), n in sorted(counts.items())],
                          "refusals": rows}, indent=1))
    else:
        print(format_table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Exhaustive small schedules against the real engines.

A *program* is one transaction: a list of operations (database, r|w, key) plus its kind:
  global  2PC: a branch on every database it touches; after its operations it prepares
          each branch (PREPARE TRANSACTION / XA END + XA PREPARE), then, once all are
          prepared (the decision), commits each (COMMIT PREPARED / XA COMMIT);
  dip     the same with the decision in the PostgreSQL branch: the other branch prepares,
          then the PostgreSQL branch commits in one phase with `SELECT co.decide(..)`
          (that COMMIT is the decision), then the other branch commits (`as_dip`);
  local   one database, BEGIN ... COMMIT.
Every write is a list-append of the writer's id (so the checker can order versions), every
read returns the whole list.

A *schedule* is an interleaving of the programs' steps. Steps on different databases
commute (neither engine can tell their order), so we enumerate every per-database order of
the steps (each transaction's steps at one database form a chain) and keep those
consistent with each transaction's own order (operations in program order, then all
prepares, then all commits): one linear schedule per equivalence class. That covers every
order of prepare, decision and commit delivery at every database.

The runner executes a schedule on real sessions, one per (transaction, database). A step
that blocks on a lock (seen in pg_stat_activity / information_schema.innodb_trx, not
guessed from time) is left waiting and the transaction's later steps queue behind it;
other transactions go on. When every unfinished transaction is blocked and nothing else
can run (a deadlock across the two databases, which neither engine sees), the youngest
blocked step is cancelled. An error (a refusal by pg_co or mysql_co, an SSI failure, a
deadlock) aborts the transaction: its branches are rolled back, prepared ones with
ROLLBACK PREPARED / XA ROLLBACK. The committed history is then checked twice: the graph
checker (checker.check) and the brute-force serial-order oracle must both accept it.

Three concurrent transactions (--three): every combination of three programs has far too
many schedules to run them all; three_sample() draws them reproducibly from a seed, each
one the same representative of its class that the enumeration would run.

    python -m checker.schedules --help
"""
from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import random
import re
import sys
import time
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cotx import refusals
from cotx.dialect import MariaDB as MyDialect
from cotx.dialect import Postgres as PgDialect

from .graph import check, serial_order
from .history import Txn, parse_list

DBS = ("pg", "my")


@dataclass(frozen=True)
class Program:
    name: str
    kind: str            # global | local
    ops: tuple           # ((db, 'r'|'w', key), ...)

    @property
    def dbs(self):
        return tuple(dict.fromkeys(d for d, _, _ in self.ops))

    def __str__(self):
        return f"{self.name}[{self.kind}: " + ", ".join(f"{f} {d}:{k}" for d, f, k in self.ops) + "]"


@dataclass(frozen=True)
class Step:
    txn: str
    kind: str            # op | prep | commit
    db: str
    f: str = ""          # r | w for ops
    key: str = ""

    def __str__(self):
        if self.kind == "op":
            return f"{self.txn}.{self.f}({self.db}:{self.key})"
        return f"{self.txn}.{self.kind}({self.db})"


def chains(p: Program) -> dict:
    """The steps of p at each database, in order."""
    out = {}
    for d in p.dbs:
        ops = [Step(p.name, "op", d, f, k) for dd, f, k in p.ops if dd == d]
        two_phase = p.kind == "global" or (p.kind == "dip" and d != "pg")
        tail = [Step(p.name, "prep", d), Step(p.name, "commit", d)] if two_phase else [Step(p.name, "commit", d)]
        out[d] = ops + tail
    return out


def txn_edges(p: Program) -> list:
    """Order constraints inside one transaction across databases."""
    ch = chains(p)
    ops = [Step(p.name, "op", d, f, k) for d, f, k in p.ops]
    e = list(zip(ops, ops[1:]))
    if p.kind == "global":
        preps = [Step(p.name, "prep", d) for d in ch]
        commits = [Step(p.name, "commit", d) for d in ch]
        e += [(ops[-1], x) for x in preps] + [(x, c) for x in preps for c in commits]
    if p.kind == "dip":
        # Others prepared, then the decision commit at pg, then the others' commits.
        decision = Step(p.name, "commit", "pg")
        preps = [Step(p.name, "prep", d) for d in ch if d != "pg"]
        commits = [Step(p.name, "commit", d) for d in ch if d != "pg"]
        e += [(ops[-1], x) for x in preps] + [(x, decision) for x in preps] + [(decision, c) for c in commits]
        e += [(ops[-1], decision)]
    return e


def as_dip(programs):
    """The same programs with every global transaction that has a PostgreSQL branch
    deciding inside it (kind dip)."""
    return [Program(p.name, "dip", p.ops) if p.kind == "global" and "pg" in p.dbs else p for p in programs]


def _merges(seqs):
    """Every interleaving of the sequences (each kept in order)."""
    seqs = [s for s in seqs if s]
    if not seqs:
        yield []
        return
    for i, s in enumerate(seqs):
        rest = seqs[:i] + [s[1:]] + seqs[i + 1:]
        for m in _merges(rest):
            yield [s[0]] + m


def _linearize(orders: dict, extra: list):
    """A linear order of all steps respecting the per-database orders and `extra` edges, or
    None when they form a cycle. Ties: the database listed first goes first."""
    succ, indeg = defaultdict(list), defaultdict(int)
    nodes = [s for d in DBS for s in orders.get(d, [])]
    for d in DBS:
        o = orders.get(d, [])
        for a, b in zip(o, o[1:]):
            succ[a].append(b)
            indeg[b] += 1
    for a, b in extra:
        succ[a].append(b)
        indeg[b] += 1
    pos = {s: i for i, s in enumerate(nodes)}
    ready = sorted((s for s in nodes if indeg[s] == 0), key=pos.get)
    out = []
    while ready:
        s = ready.pop(0)
        out.append(s)
        for b in succ[s]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
        ready.sort(key=pos.get)
    return out if len(out) == len(nodes) else None


def _dependent(a: Step, b: Step) -> bool:
    """Can swapping two adjacent steps at one database change anything the engine sees?
    Steps of one transaction: yes (program order). A prepare or commit against anything of
    another transaction: yes (visibility, snapshots, locks, pg_co's checks). Two operations
    of different transactions: only on the same row with at least one write (a snapshot is
    taken by a transaction's first statement, and only commits change what it contains)."""
    if a.txn == b.txn:
        return True
    if a.kind != "op" or b.kind != "op":
        return True
    return a.key == b.key and "w" in (a.f, b.f)


def _canonical(seq) -> tuple:
    """The lexicographically least reordering of seq by swaps of independent steps (one
    representative per Mazurkiewicz trace)."""
    n = len(seq)
    preds = [set(i for i in range(j) if _dependent(seq[i], seq[j])) for j in range(n)]
    done, out = set(), []
    while len(out) < n:
        ready = [j for j in range(n) if j not in done and preds[j] <= done]
        j = min(ready, key=lambda j: str(seq[j]))
        done.add(j)
        out.append(seq[j])
    return tuple(out)


def enumerate_schedules(programs):
    """Every schedule of the programs, one per class of equivalent interleavings."""
    per_db = defaultdict(list)
    extra = []
    for p in programs:
        for d, c in chains(p).items():
            per_db[d].append(c)
        extra += txn_edges(p)
    dbs = [d for d in DBS if d in per_db]
    classes = [sorted(set(_canonical(m) for m in _merges(per_db[d])), key=lambda t: [str(x) for x in t]) for d in dbs]
    for combo in itertools.product(*[[list(c) for c in cl] for cl in classes]):
        lin = _linearize(dict(zip(dbs, combo)), extra)
        if lin is not None:
            yield lin


def schedule_from_db_orders(programs, orders: dict):
    """A named schedule given as per-database orders of step strings ('Y.w(pg:y)')."""
    steps = {}
    for p in programs:
        for c in chains(p).values():
            for s in c:
                steps[str(s)] = s
    o = {d: [steps[x] for x in seq] for d, seq in orders.items()}
    extra = [e for p in programs for e in txn_edges(p)]
    lin = _linearize(o, extra)
    if lin is None:
        raise ValueError("the per-database orders contradict the transactions' own order")
    return lin


# --------------------------------------------------------------------------------------
# The catalogue.
def G(name, *ops):
    return Program(name, "global", tuple(_op(o) for o in ops))


def L(name, *ops, kind="local"):
    """A local transaction; kind local_ro = PostgreSQL READ ONLY, auto = one autocommit
    statement at SERIALIZABLE on MariaDB (its only op may read several keys: 'r my:x+y'),
    auto_unlocked = the same with mysql_co_lock_autocommit_reads=OFF for its session."""
    return Program(name, kind, tuple(_op(o) for o in ops))


def _op(s):
    f, rest = s.split(" ")
    d, k = rest.split(":")
    return (d, f, k)


# Transaction shapes: 1-2 rows on 1-2 databases, reads and writes.
GLOBAL_SHAPES = [
    ("r pg:x", "w my:x"),            # read here, write there
    ("r my:x", "w pg:x"),
    ("r pg:x", "r my:x", "w pg:x"),  # the overdraft's two withdrawals
    ("r pg:x", "r my:x", "w my:x"),
    ("w pg:x", "w my:x"),            # blind writes on both
    ("r pg:x", "r my:x"),            # read-only global
    ("r pg:x", "w pg:y"),            # one database, still 2PC
    ("r my:x", "w my:y"),
]
LOCAL_SHAPES = [
    ("r pg:x", "r pg:y"),
    ("r pg:y", "w pg:x"),
    ("r my:x", "r my:y"),
    ("r my:y", "w my:x"),
]


def catalogue():
    """(label, programs) of every combination in the full set."""
    out = []
    gl = [lambda n, s=s: G(n, *s) for s in GLOBAL_SHAPES]
    lo = [lambda n, s=s: L(n, *s) for s in LOCAL_SHAPES]
    for i, j in itertools.combinations_with_replacement(range(len(gl)), 2):
        out.append((f"g{i}+g{j}", [gl[i]("T1"), gl[j]("T2")]))
    for i in range(len(gl)):
        for j in range(len(lo)):
            out.append((f"g{i}+l{j}", [gl[i]("T1"), lo[j]("L2")]))
    # Three transactions: the programs of rule C (two globals and a local reader).
    out.append(("ruleC", [G("Y", "w pg:y", "w my:x"), G("G", "w pg:x", "r my:x"), L("L", "r pg:x", "r pg:y")]))
    # Rule C with MariaDB as the reader's database, the reader one autocommit SELECT (InnoDB
    # reads it from a snapshot unless mysql_co makes it a locking read).
    out.append(("ruleC_my", [G("Y", "w my:y", "w pg:x"), G("G", "w my:x", "r pg:x"), L("L", "r my:x+y", kind="auto")]))
    # Rule C with the PostgreSQL reader declared READ ONLY (PostgreSQL drops its edges when
    # Y commits: pg_co's rule C for READ ONLY readers covers it).
    out.append(("ruleC_ro", [G("Y", "w pg:y", "w my:x"), G("G", "w pg:x", "r my:x"), L("L", "r pg:x", "r pg:y", kind="local_ro")]))
    return out


def named_schedules():
    """Schedules that must always run: the overdraft and the rule-C schedule of docs/pg_co.md ("Rule C")."""
    od = [G("T1", "r pg:x", "r my:x", "w pg:x"), G("T2", "r pg:x", "r my:x", "w my:x")]
    out = [("overdraft: both read, T1 prepares and commits first", od, schedule_from_db_orders(od, {
        "pg": ["T1.r(pg:x)", "T2.r(pg:x)", "T1.w(pg:x)", "T1.prep(pg)", "T1.commit(pg)", "T2.prep(pg)", "T2.commit(pg)"],
        "my": ["T1.r(my:x)", "T2.r(my:x)", "T1.prep(my)", "T2.w(my:x)", "T1.commit(my)", "T2.prep(my)", "T2.commit(my)"]})),
           ("overdraft: both prepared before either commits", od, schedule_from_db_orders(od, {
               "pg": ["T1.r(pg:x)", "T2.r(pg:x)", "T1.w(pg:x)", "T2.prep(pg)", "T1.prep(pg)", "T1.commit(pg)", "T2.commit(pg)"],
               "my": ["T1.r(my:x)", "T2.r(my:x)", "T2.w(my:x)", "T1.prep(my)", "T2.prep(my)", "T1.commit(my)", "T2.commit(my)"]}))]
    # Rule C (docs/pg_co.md, "Rule C"), A = PostgreSQL, B = MariaDB:
    # Y writes y at A and z at B; G writes x at A and reads z at B (after Y committed at B);
    # G is committed at A before Y; a local reader L at A reads x (G's) and y (Y's in doubt).
    rc = [G("Y", "w pg:y", "w my:z"), G("G", "w pg:x", "r my:z"), L("L", "r pg:x", "r pg:y")]
    out.append(("rule C: local reader sees G but not Y, G saw Y", rc, schedule_from_db_orders(rc, {
        "pg": ["Y.w(pg:y)", "Y.prep(pg)", "G.w(pg:x)", "G.prep(pg)", "G.commit(pg)",
               "L.r(pg:x)", "L.r(pg:y)", "L.commit(pg)", "Y.commit(pg)"],
        "my": ["Y.w(my:z)", "Y.prep(my)", "Y.commit(my)", "G.r(my:z)", "G.prep(my)", "G.commit(my)"]})))
    return out


def limit_schedules():
    """The documented limits (docs/guarantees.md): with the project on, these local readers
    are NOT protected and the checker finds the rule-C cycle. The same reader in the
    protected form is serializable (refused, or it waits for the in-doubt branch)."""
    out = []
    # MariaDB autocommit read: Y in doubt at MariaDB, G (which saw Y at PostgreSQL)
    # committed at MariaDB; one autocommit SELECT of x and y at MariaDB. Unprotected only
    # with mysql_co_lock_autocommit_reads=OFF (the project on otherwise).
    for kind, label in (("auto_unlocked", "limit: MariaDB autocommit SELECT while Y is in doubt, "
                                          "mysql_co_lock_autocommit_reads=OFF"),
                        ("auto", "protected: the same autocommit SELECT (mysql_co locks it)"),
                        ("local", "protected: the same read in BEGIN ... COMMIT SERIALIZABLE")):
        p = [G("Y", "w my:y", "w pg:z"), G("G", "w my:x", "r pg:z"), L("L", "r my:x+y", kind=kind)]
        out.append((label, p, schedule_from_db_orders(p, {
            "my": ["Y.w(my:y)", "Y.prep(my)", "G.w(my:x)", "G.prep(my)", "G.commit(my)",
                   "L.r(my:x+y)", "L.commit(my)", "Y.commit(my)"],
            "pg": ["Y.w(pg:z)", "Y.prep(pg)", "Y.commit(pg)", "G.r(pg:z)", "G.prep(pg)", "G.commit(pg)"]})))
    # PostgreSQL READ ONLY local reader, rule C's schedule with Y's COMMIT PREPARED
    # reaching PostgreSQL between L's read and L's commit (PostgreSQL has dropped L's edge).
    for kind, label in (("local_ro", "protected: PostgreSQL READ ONLY local reader, Y commits before L (rule C for READ ONLY readers refuses it)"),
                        ("local", "protected: the same reader READ WRITE (rule C refuses it)")):
        p = [G("Y", "w pg:y", "w my:z"), G("G", "w pg:x", "r my:z"), L("L", "r pg:x+y", kind=kind)]
        out.append((label, p, schedule_from_db_orders(p, {
            "pg": ["Y.w(pg:y)", "Y.prep(pg)", "G.w(pg:x)", "G.prep(pg)", "G.commit(pg)",
                   "L.r(pg:x+y)", "Y.commit(pg)", "L.commit(pg)"],
            "my": ["Y.w(my:z)", "Y.prep(my)", "Y.commit(my)", "G.r(my:z)", "G.prep(my)", "G.commit(my)"]})))
    return out


def label_matches(label: str, only: str | None) -> bool:
    """--only: labels or shell patterns, comma-separated (None: everything)."""
    return not only or any(fnmatch.fnmatchcase(label, o.strip()) for o in only.split(",") if o.strip())


def full_set(only: str | None = None, dip: bool = False):
    """dip: the global transactions decide in their PostgreSQL branch (as_dip); only: the
    combinations label_matches() picks."""
    for label, progs in catalogue():
        if not label_matches(label, only):
            continue
        if dip:
            progs = as_dip(progs)
        for i, sch in enumerate(enumerate_schedules(progs)):
            yield (f"{'dip:' if dip else ''}{label}#{i}", progs, sch)


# --------------------------------------------------------------------------------------
# Three concurrent transactions, sampled (every combination has ~10 000-30 000 schedules:
# far too many to run them all, so a seed picks them).
# The global shapes of the pairs, plus those of rule C's Y and G (different rows at the two
# databases, so that a third transaction can link them).
THREE_GLOBAL_SHAPES = GLOBAL_SHAPES + [
    ("w pg:y", "w my:x"),            # rule C's Y
    ("w pg:x", "r my:x"),            # rule C's G
    ("r pg:y", "w my:y"),
]
# The local shapes of the pairs, plus rule C's other readers: the PostgreSQL reader READ
# ONLY and the MariaDB reader one autocommit SELECT.
THREE_LOCAL_SHAPES = [(s, "local") for s in LOCAL_SHAPES] + [
    (("r pg:x", "r pg:y"), "local_ro"),
    (("r my:x+y",), "auto"),
]


def three_programs():
    """(label, programs) of every combination of three transactions: three globals, two
    globals and a local, one global and two locals (unordered, repeats allowed), named
    T1 T2 T3 in that order. Labels: gI = THREE_GLOBAL_SHAPES[I], lJ = THREE_LOCAL_SHAPES[J]."""
    ng, nl = len(THREE_GLOBAL_SHAPES), len(THREE_LOCAL_SHAPES)

    def g(i, n):
        return G(n, *THREE_GLOBAL_SHAPES[i])

    def lo(j, n):
        shape, kind = THREE_LOCAL_SHAPES[j]
        return L(n, *shape, kind=kind)

    out = []
    for i, j, k in itertools.combinations_with_replacement(range(ng), 3):
        out.append((f"g{i}+g{j}+g{k}", [g(i, "T1"), g(j, "T2"), g(k, "T3")]))
    for i, j in itertools.combinations_with_replacement(range(ng), 2):
        for k in range(nl):
            out.append((f"g{i}+g{j}+l{k}", [g(i, "T1"), g(j, "T2"), lo(k, "T3")]))
    for i in range(ng):
        for j, k in itertools.combinations_with_replacement(range(nl), 2):
            out.append((f"g{i}+l{j}+l{k}", [g(i, "T1"), lo(j, "T2"), lo(k, "T3")]))
    return out


def random_schedule(programs, rnd: random.Random):
    """One schedule of the programs, the same representative enumerate_schedules() gives
    for its class: a random order of all steps that respects each transaction's own order
    (at each step, one of the steps that may go next, uniformly), reduced to its
    per-database orders, each made canonical, then linearized. Returns (key, schedule)
    where key identifies the class (the per-database canonical orders)."""
    succ, indeg, nodes = defaultdict(list), defaultdict(int), []
    for p in programs:
        for c in chains(p).values():
            nodes += c
            for a, b in zip(c, c[1:]):
                succ[a].append(b)
                indeg[b] += 1
        for a, b in txn_edges(p):
            succ[a].append(b)
            indeg[b] += 1
    ready = [s for s in nodes if indeg[s] == 0]
    order = []
    while ready:
        s = ready.pop(rnd.randrange(len(ready)))
        order.append(s)
        for b in succ[s]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    assert len(order) == len(nodes), "a transaction's own order has a cycle"
    orders = {d: _canonical([s for s in order if s.db == d]) for d in DBS}
    orders = {d: o for d, o in orders.items() if o}
    lin = _linearize({d: list(o) for d, o in orders.items()}, [e for p in programs for e in txn_edges(p)])
    key = tuple((d, tuple(map(str, o))) for d, o in orders.items())
    return key, lin


def three_sample(n: int, seed: int, dip: bool = False, only: str | None = None):
    """n different three-transaction schedules, reproducible from the seed: each picks a
    combination of three_programs() uniformly (or `only`), then a random schedule of it;
    a schedule already drawn is drawn again. Labels: three:COMBINATION/SEED/INDEX."""
    combos = [(l, as_dip(p) if dip else p) for l, p in three_programs() if label_matches(l, only)]
    if not combos:
        raise ValueError(f"no three-transaction combination {only!r} (labels: gI+gJ+gK, gI+gJ+lK, gI+lJ+lK)")
    rnd = random.Random(seed)
    seen = set()
    out = []
    misses = 0
    while len(out) < n:
        label, progs = combos[rnd.randrange(len(combos))]
        key, lin = random_schedule(progs, rnd)
        if lin is None or (label, key) in seen:
            misses += 1
            if misses > 50 * n + 1000:
                break                    # `only` names a combination with fewer schedules
            continue
        seen.add((label, key))
        out.append((f"{'dip:' if dip else ''}three:{label}/{seed}/{len(out)}", progs, lin))
    return out


# --------------------------------------------------------------------------------------
# Execution.
class _Session:
    def __init__(self, server, kind):
        self.kind = kind
        self.server = server
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.connect()

    def connect(self):
        if self.kind == "pg":
            self.conn = self.server.connect()
            self.id = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            self.conn.execute("SET lock_timeout = '5s'")
        else:
            self.conn = self.server.connect()
            with self.conn.cursor() as c:
                c.execute("SELECT CONNECTION_ID()")
                self.id = c.fetchone()[0]
                c.execute("SET SESSION innodb_lock_wait_timeout = 5")

    def run(self, stmts):
        """Runs the statements; returns the last result rows."""
        rows = None
        for s in stmts:
            if callable(s):           # a function of the connection (cotx.dialect's)
                rows = s(self.conn)
            elif self.kind == "pg":
                cur = self.conn.execute(s)
                rows = cur.fetchall() if cur.description else None
            else:
                with self.conn.cursor() as c:
                    c.execute(s)
                    rows = c.fetchall() if c.description else None
        return rows

    def quiet(self, stmts):
        for s in stmts:
            try:
                self.run([s])
            except Exception:  # noqa: BLE001 - cleanup: the state may already be gone
                pass

    def close(self):
        self.pool.shutdown(wait=False)
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


@dataclass
class Result:
    label: str
    steps: list
    committed: list = field(default_factory=list)
    aborted: dict = field(default_factory=dict)      # txn -> reason
    history: list = field(default_factory=list)
    final: dict = field(default_factory=dict)
    anomalies: list = field(default_factory=list)     # checker's cycles
    oracle_serializable: bool = True
    executed: list = field(default_factory=list)      # steps in completion order

    @property
    def refused(self) -> bool:
        return bool(self.aborted)

    def to_json(self):
        return {"label": self.label, "schedule": [str(s) for s in self.steps], "executed": self.executed,
                "committed": self.committed, "aborted": self.aborted,
                "anomalies": [a.text for a in self.anomalies], "oracle_serializable": self.oracle_serializable}


def reason_of(e) -> str:
    """Why a step failed: the refusal kind (cotx.refusals), or the error's first line."""
    kind = refusals.classify(e).kind
    if kind in ("pg cancelled", "my interrupted"):
        return "global deadlock (cancelled)"   # only the runner cancels steps, on a wait cycle
    if kind != "other":
        return kind
    return (str(e).splitlines()[0] if str(e) else type(e).__name__)[:120]


# How each database takes part, per mode: (PostgreSQL, MariaDB).
#   co            the engine enforces CO: pg_co (pg_co.enabled on) / mysql_co (mysql_co_enabled ON)
#   client        client mode, no pg_co / mysql_co needed: Sonata's shims (below)
#   plain         plain 2PC: pg_co / mysql_co off where loaded; MariaDB at REPEATABLE READ
#   serializable  plain 2PC with every branch SERIALIZABLE and no shim: client mode without
#                 its shims (the baseline that shows what the shims add)
# In every mode the PostgreSQL transactions run SERIALIZABLE.
MODES = {
    "co": ("co", "co"),
    "co-unlocked": ("co", "co"),
    "plain": ("plain", "plain"),
    "client": ("client", "client"),
    "plain-serializable": ("serializable", "serializable"),
    "pg_co+client": ("co", "client"),
    "client+mysql_co": ("client", "co"),
}


def mode_servers(mode: str) -> tuple:
    """(PostgreSQL with pg_co preloaded?, MariaDB with mysql_co loaded?) for a mode: True
    when it needs the extension / plugin, False when it runs on a server without it (client
    mode is tested where they are absent), None when either does."""
    want = {"co": True, "client": False, "plain": None, "serializable": False}
    return tuple(want[m] for m in MODES[mode])


# How client mode's PostgreSQL helpers are run (Runner's docstring): the daemon's, the
# older daemon's, and two broken ones that the tests show failing.
HELPER_POLICIES = ("shared", "per-branch", "shared-readonly", "released-at-prepare")

# Client mode's slots (sql/client_mode/): rows 1..SHIM_SLOTS of cotx.shim / cotx_shim; a
# branch takes the lowest slot no live branch on its database holds.
SHIM_SLOTS = 16
_ROOT = Path(__file__).resolve().parents[1]


def _sql_statements(path: Path) -> list:
    """The statements of one of sql/client_mode/'s scripts for a driver that takes one
    statement at a time: comment lines dropped, split at a semicolon that ends a line."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
    return [st.strip() for st in re.split(r";\s*$", text, flags=re.M) if st.strip()]


class Runner:
    """Runs schedules on one PostgreSQL and one MariaDB server (harness objects).

    Client mode (mode client, or one database of pg_co+client / client+mysql_co), as the
    coordinator daemon and the client drive a branch where pg_co / mysql_co are absent:
    PostgreSQL (`pg_helpers`, HELPER_POLICIES): "shared", as the daemon does
    (coordinator-daemon/src/participants/enforcement/helpers.rs): one helper transaction
    reads a block of slots (all SHIM_SLOTS here) and is prepared *before the schedule's
    first step* (ahead of need: its snapshot is older than every branch's); each global
    branch takes an unused key of it when it registers (no SQL); when no helper is live, one
    is prepared at that moment (the daemon's inline case); a helper is rolled back as soon
    as every branch that took one of its keys is committed or rolled back. A key is never
    handed out twice in a helper's life. "per-branch": the older daemon's helper per
    branch, prepared when the branch registers, reading its slot only. The branch runs
    cotx.shim_touch(k) just before its PREPARE TRANSACTION (cotx.dialect.Postgres.
    shim_touch). Two deliberately broken policies show what the rule needs (their tests
    must find anomalies): "shared-readonly" (the helper declared READ ONLY: PostgreSQL's
    SSI does not count it as the dangerous structure's first transaction) and
    "released-at-prepare" (the helper rolled back once its branch prepared, before that
    branch commits). MariaDB: the branch session is SERIALIZABLE,
    set and read back (cotx.dialect.MariaDB.set_serializable_verified), and the branch
    writes its slot (MariaDB.shim_touch) before XA END. Local transactions get nothing
    (SERIALIZABLE, BEGIN ... COMMIT; an autocommit reader is InnoDB's snapshot read):
    Sonata's hole."""

    def __init__(self, pg, my, mode: str = "co", max_txns: int = 3, pg_helpers: str = "shared"):
        if pg_helpers not in HELPER_POLICIES:
            raise ValueError(f"unknown helper policy {pg_helpers!r} (policies: {', '.join(HELPER_POLICIES)})")
        self.pg, self.my, self.mode, self.pg_helpers = pg, my, mode, pg_helpers
        self.n = 0
        self._my_poll_at, self._my_waiting = 0.0, set()
        for srv, ddl in ((pg, "CREATE TABLE IF NOT EXISTS sch(k text PRIMARY KEY, v text NOT NULL)"),
                         (my, "CREATE TABLE IF NOT EXISTS sch(k varchar(16) PRIMARY KEY, v text NOT NULL) ENGINE=InnoDB")):
            srv.sql(ddl)
        # No autovacuum / autoanalyze of the schedules' table: once autoanalyze has seen
        # the small table (its first naptime is 60 s), PostgreSQL reads it by sequential
        # scan, SSI locks the whole relation, and schedules see conflicts they were not
        # written for (extra refusals, which also hide what a mode lets through).
        pg.sql("ALTER TABLE sch SET (autovacuum_enabled = off)")
        self.monitor = {"pg": pg.connect(), "my": my.connect()}
        # What the servers have: pg_co preloaded, mysql_co loaded. Modes that need one
        # refuse to run without it; the others leave it alone when it is absent.
        self.has_ext = {
            "pg": bool(self._mon("pg", "SELECT 'pg_co' = ANY(regexp_split_to_array("
                                       "current_setting('shared_preload_libraries'), '\\s*,\\s*'))")[0][0]),
            "my": bool(self._mon("my", "SELECT COUNT(*) FROM information_schema.PLUGINS "
                                       "WHERE PLUGIN_NAME = 'mysql_co' AND PLUGIN_STATUS = 'ACTIVE'")[0][0])}
        if self.has_ext["pg"]:
            pg.sql("CREATE EXTENSION IF NOT EXISTS pg_co")   # co.decide, for dip programs
        self._shim_ready = {"pg": False, "my": False}
        self.slots = [{"pg": _Session(pg, "pg"), "my": _Session(my, "my"), "pg_helper": _Session(pg, "pg")}
                      for _ in range(max_txns)]
        self.set_mode(mode)

    def set_mode(self, mode):
        """co: pg_co on, mysql_co on, MariaDB branches SERIALIZABLE. plain: pg_co off on our
        sessions, mysql_co off, MariaDB at REPEATABLE READ (PostgreSQL stays SERIALIZABLE).
        co-unlocked: co, but MariaDB autocommit readers with mysql_co_lock_autocommit_reads
        =OFF (InnoDB's snapshot read: the project before it protected them). client,
        pg_co+client, client+mysql_co, plain-serializable: MODES (client mode: the class
        docstring). pg_co / mysql_co are switched only where the server has them; a mode
        that needs one the server lacks is refused."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        self.mode = mode
        self.db_mode = dict(zip(DBS, MODES[mode]))
        for d, name in (("pg", "pg_co"), ("my", "mysql_co")):
            if self.db_mode[d] == "co" and not self.has_ext[d]:
                raise RuntimeError(f"mode {mode} needs {name}, which this server does not have loaded")
            if self.db_mode[d] == "client" and not self._shim_ready[d]:
                self._create_shim(d)
        if self.has_ext["my"]:
            with self.monitor["my"].cursor() as c:
                c.execute(f"SET GLOBAL mysql_co_enabled = {'ON' if self.db_mode['my'] == 'co' else 'OFF'}")
        if self.has_ext["pg"]:
            for slot in self.slots:
                slot["pg"].run([f"SET pg_co.enabled = {'on' if self.db_mode['pg'] == 'co' else 'off'}"])

    def _create_shim(self, db):
        """Client mode's objects, from sql/client_mode/, and the slot rows."""
        if db == "pg":
            self.monitor["pg"].execute((_ROOT / "sql" / "client_mode" / "postgres.sql").read_text())
            self._mon("pg", f"INSERT INTO cotx.shim(k) SELECT generate_series(1, {SHIM_SLOTS}) ON CONFLICT DO NOTHING")
        else:
            for st in _sql_statements(_ROOT / "sql" / "client_mode" / "mariadb.sql"):
                self._mon("my", st)
            self._mon("my", "INSERT IGNORE INTO cotx_shim(k) VALUES " + ", ".join(f"({i})" for i in range(1, SHIM_SLOTS + 1)))
        self._shim_ready[db] = True

    def close(self):
        for slot in self.slots:
            for s in slot.values():
                s.close()
        for c in self.monitor.values():
            c.close()

    def _blocked(self, db, sess) -> bool:
        """Is the session waiting for a lock right now? PostgreSQL: pg_stat_activity.
        MariaDB: information_schema.innodb_trx, whose cache refreshes only when the previous
        read is more than 100 ms old (trx_i_s cache), so we read it at most every 110 ms and
        a verdict only counts for steps started before that read."""
        if db == "pg":
            r = self.monitor["pg"].execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                           (sess.id,)).fetchone()
            return bool(r) and r[0] == "Lock"
        now = time.monotonic()
        if now - self._my_poll_at >= 0.11:
            with self.monitor["my"].cursor() as c:
                c.execute("SELECT trx_mysql_thread_id FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
                self._my_waiting = {r[0] for r in c.fetchall()}
            self._my_poll_at = time.monotonic()
        return sess.id in self._my_waiting and self._my_poll_at > sess.started_at + 0.001

    def _mon(self, db, q):
        if db == "pg":
            cur = self.monitor["pg"].execute(q)
            return cur.fetchall() if cur.description else []
        with self.monitor["my"].cursor() as c:
            c.execute(q)
            return list(c.fetchall()) if c.description else []

    def _cancel(self, db, sess):
        if db == "pg":
            self.monitor["pg"].execute("SELECT pg_cancel_backend(%s)", (sess.id,))
        else:
            with self.monitor["my"].cursor() as c:
                c.execute(f"KILL QUERY {int(sess.id)}")

    def run(self, label, programs, steps, time_limit: float = 60.0) -> Result:
        self.n += 1
        tag = f"s{self.n}"
        progs = {p.name: p for p in programs}
        slot_of = {p.name: self.slots[i] for i, p in enumerate(programs)}
        if any(p.kind == "dip" for p in programs) and not (self.has_ext["pg"] and self.db_mode["pg"] != "client"):
            raise ValueError("dip programs decide with pg_co's co.decide: not in client mode, not without pg_co")
        client = {d: self.db_mode[d] == "client" for d in DBS}
        shim_key = {}      # (txn, db) -> the client-mode slot of a live branch
        helpers = {}       # txn -> the gid of its prepared PostgreSQL helper
        keys = sorted({(d, kk) for p in programs for d, _, k in p.ops for kk in k.split("+")})
        for db in DBS:
            vals = ", ".join(f"('{k}', '')" for d, k in keys if d == db)
            self._mon(db, "DELETE FROM sch")
            if db == "pg" and any(p.kind == "dip" for p in programs):
                self._mon(db, "DELETE FROM co.decisions")
            if vals:
                self._mon(db, f"INSERT INTO sch VALUES {vals}")
        res = Result(label, steps)
        hist = {p.name: Txn(p.name, kind=p.kind, note=str(p)) for p in programs}
        state = {(p.name, d): "none" for p in programs for d in p.dbs}   # none|active|prepared|done
        aborted = {}
        inflight = {}      # txn -> (future, step, sess)
        backlog = defaultdict(deque)
        blocked_seen = {}

        def gid(t, d):
            return f"{tag}_{t}" if d == "pg" else f"'{tag}_{t}','{d}'"

        def take_slot(t, d):
            live = {k for (_, dd), k in shim_key.items() if dd == d}
            shim_key[(t, d)] = min(set(range(1, SHIM_SLOTS + 1)) - live)
            return shim_key[(t, d)]

        policy = self.pg_helpers
        shared = {"gid": None, "used": set(), "takers": set(), "n": 0}   # the live shared helper
        helper_sess = self.slots[0]["pg_helper"]

        def shared_prepare():
            """A shared helper reads every slot and is prepared (pre-prepared at the
            schedule's start, or inline when a branch registers and none is live)."""
            shared["n"] += 1
            g = f"{tag}_helper{shared['n']}"
            ro = " READ ONLY" if policy == "shared-readonly" else " READ WRITE"
            helper_sess.run([f"BEGIN ISOLATION LEVEL SERIALIZABLE{ro}",
                             f"SELECT count(cotx.shim_hold(k)) FROM generate_series(1, {SHIM_SLOTS}) AS k",
                             f"PREPARE TRANSACTION '{g}'"])
            shared.update(gid=g, used=set(), takers=set())

        def shared_rollback():
            if shared["gid"] is not None:
                helper_sess.run([f"ROLLBACK PREPARED '{shared['gid']}'"])
                shared.update(gid=None, takers=set())

        def helper_begin(t):
            """Client mode at PostgreSQL, when t's branch registers (before its first
            statement). per-branch: a helper reads t's slot and is prepared, on its own
            session. Shared: t takes a key of the live helper (one is prepared if none
            is). A helper only reads rows no live branch writes: it never waits."""
            if policy == "per-branch":
                k = take_slot(t, "pg")
                g = f"{tag}_{t}_helper"
                slot_of[t]["pg_helper"].run(["BEGIN ISOLATION LEVEL SERIALIZABLE", f"SELECT cotx.shim_hold({k})",
                                             f"PREPARE TRANSACTION '{g}'"])
                helpers[t] = g
                return
            if shared["gid"] is None:
                shared_prepare()
            k = min(set(range(1, SHIM_SLOTS + 1)) - shared["used"])
            shared["used"].add(k)
            shared["takers"].add(t)
            shim_key[(t, "pg")] = k
            helpers[t] = shared["gid"]

        def helper_end(t):
            """After t's branch at PostgreSQL is committed or rolled back."""
            g = helpers.pop(t, None)
            if policy == "per-branch":
                if g is not None:
                    slot_of[t]["pg_helper"].run([f"ROLLBACK PREPARED '{g}'"])
            else:
                shared["takers"].discard(t)
                if g is not None and g == shared["gid"] and not shared["takers"]:
                    shared_rollback()      # its last taker settled: it goes now
            shim_key.pop((t, "pg"), None)

        def stmts_for(s: Step):
            p = progs[s.txn]
            st = state[(s.txn, s.db)]
            out = []
            two_phase = p.kind == "global" or (p.kind == "dip" and s.db != "pg")
            if s.kind == "op":
                if st == "none":
                    if s.db == "pg":
                        out.append("BEGIN ISOLATION LEVEL SERIALIZABLE" + (" READ ONLY" if p.kind == "local_ro" else ""))
                    elif p.kind in ("auto", "auto_unlocked"):
                        # One autocommit statement at SERIALIZABLE: InnoDB reads it from a
                        # snapshot unless mysql_co makes it a locking read (not loaded in
                        # client mode: there it is the snapshot read).
                        if self.has_ext["my"]:
                            lock = "OFF" if p.kind == "auto_unlocked" or self.mode == "co-unlocked" else "ON"
                            out.append(f"SET SESSION mysql_co_lock_autocommit_reads = {lock}")
                        out.append("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                    elif client["my"] and p.kind in ("global", "dip"):
                        take_slot(s.txn, "my")
                        out.append(MyDialect.set_serializable_verified)
                        out.append(f"XA START {gid(s.txn, s.db)}")
                    else:
                        lvl = "REPEATABLE READ" if self.db_mode["my"] == "plain" else "SERIALIZABLE"
                        out.append(f"SET TRANSACTION ISOLATION LEVEL {lvl}")
                        out.append(f"XA START {gid(s.txn, s.db)}" if p.kind in ("global", "dip") else "BEGIN")
                if s.f == "r":
                    ks = ", ".join(f"'{k}'" for k in s.key.split("+"))
                    out.append(f"SELECT k, v FROM sch WHERE k IN ({ks}) ORDER BY k")
                else:
                    cat = f"v || ' ' || '{s.txn}'" if s.db == "pg" else f"CONCAT(v, ' ', '{s.txn}')"
                    out.append(f"UPDATE sch SET v = {cat} WHERE k = '{s.key}'")
            elif s.kind == "prep":
                if client[s.db] and two_phase:
                    k = shim_key[(s.txn, s.db)]
                    touch = PgDialect.shim_touch if s.db == "pg" else MyDialect.shim_touch
                    out.append(lambda conn, touch=touch, k=k: touch(conn, k))
                out += ([f"PREPARE TRANSACTION '{gid(s.txn, 'pg')}'"] if s.db == "pg"
                        else [f"XA END {gid(s.txn, 'my')}", f"XA PREPARE {gid(s.txn, 'my')}"])
            else:
                if p.kind in ("local", "local_ro"):
                    out.append("COMMIT")
                elif p.kind in ("auto", "auto_unlocked"):
                    pass                      # committed by itself
                elif p.kind == "dip" and s.db == "pg":
                    out += [f"SELECT co.decide('{tag}_{s.txn}')", "COMMIT"]   # the global decision
                else:
                    out.append(f"COMMIT PREPARED '{gid(s.txn, 'pg')}'" if s.db == "pg" else f"XA COMMIT {gid(s.txn, 'my')}")
            return out

        def start(s: Step):
            sess = slot_of[s.txn][s.db]
            if (client["pg"] and s.db == "pg" and state[(s.txn, "pg")] == "none" and s.txn not in helpers
                    and progs[s.txn].kind == "global"):
                try:
                    helper_begin(s.txn)
                except Exception as e:  # noqa: BLE001 - the transaction cannot run in client mode
                    res.executed.append(f"{s.txn}.helper(pg) !{reason_of(e)}")
                    abort(s.txn, f"{s.txn}.helper(pg): client-mode helper failed: {reason_of(e)}")
                    return
            sess.started_at = time.monotonic()
            fut = sess.pool.submit(sess.run, stmts_for(s))
            inflight[s.txn] = (fut, s, sess)

        def abort(t, why):
            aborted[t] = why
            p = progs[t]
            for d in p.dbs:
                sess = slot_of[t][d]
                st = state[(t, d)]
                if d == "pg":
                    if st == "prepared":
                        sess.quiet([f"ROLLBACK PREPARED '{gid(t, 'pg')}'"])
                    sess.quiet(["ROLLBACK"])
                else:
                    if p.kind in ("global", "dip"):
                        if st != "prepared":
                            sess.quiet([f"XA END {gid(t, 'my')}"])
                        sess.quiet([f"XA ROLLBACK {gid(t, 'my')}"])
                    else:
                        sess.quiet(["ROLLBACK"])
                state[(t, d)] = "done"
                if d == "pg":
                    helper_end(t)
                shim_key.pop((t, d), None)
            helper_end(t)      # a helper prepared for a branch that never ran its first step
            backlog[t].clear()

        def finish(t):
            fut, s, sess = inflight.pop(t)
            blocked_seen.pop(t, None)
            try:
                rows = fut.result()
            except Exception as e:  # noqa: BLE001
                res.executed.append(f"{s} !{reason_of(e)}")
                abort(t, f"{s}: {reason_of(e)}")
                return
            res.executed.append(str(s))
            if s.kind == "op":
                state[(t, s.db)] = "active"
                k = f"{s.db}:{s.key}"
                if s.f == "r":
                    got = {kk: parse_list(v) for kk, v in rows or []}
                    for kk in s.key.split("+"):
                        hist[t].read(f"{s.db}:{kk}", got.get(kk, []))
                else:
                    hist[t].append(k, t)
            elif s.kind == "prep":
                state[(t, s.db)] = "prepared"
                if policy == "released-at-prepare" and s.db == "pg" and helpers.get(t) == shared["gid"]:
                    shared_rollback()      # broken on purpose: before its branch commits
            else:
                state[(t, s.db)] = "done"
                if s.db == "pg":
                    helper_end(t)
                shim_key.pop((t, s.db), None)
            if backlog[t]:
                start(backlog[t].popleft())

        def settle(deadline):
            """Until every in-flight step is finished or blocked on a lock."""
            while True:
                progressed = False
                for t in list(inflight):
                    if inflight[t][0].done():
                        finish(t)
                        progressed = True
                if progressed:
                    continue
                if all(self._blocked(s.db, sess) for _, s, sess in inflight.values()):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"schedule {label} did not settle")
                time.sleep(0.0005)

        deadline = time.monotonic() + time_limit
        if client["pg"] and policy != "per-branch" and any(p.kind == "global" and "pg" in p.dbs for p in programs):
            shared_prepare()               # ahead of need: older than every branch
        try:
            for s in steps:
                if s.txn in aborted:
                    continue
                if s.txn in inflight:
                    backlog[s.txn].append(s)
                else:
                    start(s)
                settle(deadline)
            while inflight:
                settle(deadline)
                if inflight:
                    # Everything left is blocked and nothing else can run: a wait cycle.
                    # Look twice (a lock may have just been released), then cancel the
                    # youngest blocked transaction.
                    time.sleep(0.12)
                    if any(inflight[t][0].done() for t in inflight):
                        continue
                    if all(self._blocked(s.db, sess) for _, s, sess in inflight.values()):
                        t = max(inflight, key=lambda x: [p.name for p in programs].index(x))
                        _, s, sess = inflight[t]
                        self._cancel(s.db, sess)
        except TimeoutError as e:
            for t, (_, s, sess) in list(inflight.items()):
                self._cancel(s.db, sess)
            time.sleep(0.2)
            for t in list(inflight):
                if inflight[t][0].done():
                    finish(t)
            for t in list(helpers):
                g = helpers.pop(t)
                if policy == "per-branch":
                    slot_of[t]["pg_helper"].quiet([f"ROLLBACK PREPARED '{g}'"])
            if shared["gid"] is not None:
                helper_sess.quiet([f"ROLLBACK PREPARED '{shared['gid']}'"])
            raise e
        if shared["gid"] is not None:
            shared_rollback()              # pre-prepared and never taken (or outlived its takers)
        for p in programs:
            if p.name in aborted:
                hist[p.name].status = "fail"
                res.aborted[p.name] = aborted[p.name]
            else:
                res.committed.append(p.name)
        res.history = list(hist.values())
        for db in DBS:
            for k, v in self._mon(db, "SELECT k, v FROM sch"):
                res.final[f"{db}:{k}"] = parse_list(v)
        rep = check(res.history, final_reads=res.final)
        res.anomalies = rep.anomalies
        res.oracle_serializable = serial_order(res.history, res.final) is not None
        left = self._mon("pg", "SELECT gid FROM pg_prepared_xacts")
        left_my = self._mon("my", "XA RECOVER")
        if left or left_my:
            raise RuntimeError(f"schedule {label} left prepared transactions: {left} {left_my}")
        return res


@dataclass
class Tally:
    mode: str
    run: int = 0
    refused: int = 0
    committed_all: int = 0
    anomalies: int = 0
    global_anomalies: int = 0    # of those, schedules of global transactions only
    oracle_disagrees: int = 0
    reasons: dict = field(default_factory=lambda: defaultdict(int))
    failures: list = field(default_factory=list)

    def add(self, r: Result):
        self.run += 1
        self.refused += r.refused
        self.committed_all += not r.refused
        for why in r.aborted.values():
            self.reasons[why.split(": ", 1)[1]] += 1
        bad = bool(r.anomalies) or not r.oracle_serializable
        self.anomalies += bad
        self.global_anomalies += bad and all(t.kind in ("global", "dip") for t in r.history)
        if bool(r.anomalies) == r.oracle_serializable:
            self.oracle_disagrees += 1
        if bad and len(self.failures) < 5:
            self.failures.append(r)

    def line(self) -> str:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.reasons.items(), key=lambda kv: -kv[1]))
        return (f"[{self.mode}] schedules run: {self.run}, refused (a transaction aborted): {self.refused}, "
                f"all committed: {self.committed_all}, non-serializable histories: {self.anomalies} "
                f"({self.global_anomalies} among global transactions only), "
                f"checker/oracle disagreements: {self.oracle_disagrees}" + (f"\n  aborts by reason: {why}" if why else ""))


def run_many(runner: Runner, items, tally: Tally, progress_every: int = 0, log=None, time_budget: float | None = None):
    t0 = time.time()
    for i, (label, progs, steps) in enumerate(items, 1):
        r = runner.run(label, progs, steps)
        tally.add(r)
        if log is not None:
            log.write(json.dumps({"mode": tally.mode, **r.to_json()}) + "\n")
            log.flush()
        if progress_every and i % progress_every == 0:
            dt = time.time() - t0
            print(f"  {tally.mode}: {i} schedules, {tally.refused} refused, {tally.anomalies} anomalies "
                  f"[{dt:.0f} s, {i / dt:.1f}/s]", flush=True)
        if time_budget and time.time() - t0 > time_budget:
            print(f"  {tally.mode}: time budget reached after {i} schedules", flush=True)
            break
    return tally


def sample(items, n, seed):
    items = list(items)
    rnd = random.Random(seed)
    return items if n >= len(items) else rnd.sample(items, n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run small schedules against real PostgreSQL + MariaDB "
                                             "(pg_co, mysql_co) and check every committed history.")
    ap.add_argument("--full", action="store_true", help="every schedule of the catalogue (long: see --count)")
    ap.add_argument("--sample", type=int, default=200, help="random schedules from the full set (default 200)")
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--modes", default="co,plain",
                    help="co, plain, co-unlocked (co with MariaDB autocommit reads unprotected), client "
                         "(client mode: Sonata's shims, on servers without pg_co and mysql_co), "
                         "plain-serializable (client mode's servers, every branch SERIALIZABLE, no shim), "
                         "pg_co+client, client+mysql_co (one database each way); comma-separated "
                         "(default co,plain)")
    ap.add_argument("--three", action="store_true",
                    help="three concurrent transactions instead: --sample N different schedules drawn by "
                         "--seed from every combination of three programs (3 globals, 2 globals + a "
                         "local, a global + 2 locals; too many to run them all, no --full); --only one "
                         "combination (a label of --count --three)")
    ap.add_argument("--count", action="store_true", help="only count the schedules of the full set")
    ap.add_argument("--log", help="write every schedule's result as JSON lines here")
    ap.add_argument("--budget", type=float, default=None, help="stop each mode after this many seconds")
    ap.add_argument("--only", help="combinations of the catalogue: labels of --count (e.g. ruleC_my), "
                                   "comma-separated, or shell patterns ('g*+g*': the pairs of global "
                                   "transactions; 'g*+l*': a global and a local)")
    ap.add_argument("--dip", action="store_true",
                    help="global transactions decide inside their PostgreSQL branch's commit (co.decide)")
    args = ap.parse_args(argv)

    if args.three and args.full:
        ap.error("--three samples (--sample N --seed S): its full set is far too large to run")
    if args.count and args.three:
        combos = [(l, p) for l, p in three_programs() if label_matches(l, args.only)]
        for label, progs in combos:
            progs = as_dip(progs) if args.dip else progs
            print(f"{label:14}  " + "  ".join(map(str, progs)))
        print(f"{len(combos)} three-transaction combinations (not counted: with a local, ~10 000 - 30 000 "
              f"schedules each; three globals, up to millions each)")
        return 0
    if args.count:
        total = 0
        for label, progs in catalogue():
            if not label_matches(label, args.only):
                continue
            progs = as_dip(progs) if args.dip else progs
            n = sum(1 for _ in enumerate_schedules(progs))
            total += n
            print(f"{label:14} {n:6}  " + "  ".join(map(str, progs)))
        print(f"total: {total} schedules (+ {len(named_schedules())} named)")
        return 0

    from cotest import MariaServer, PgServer, reap_orphans
    from cotest.servers import mysql_co_installed, pg_co_installed
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            ap.error(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
        if args.dip and MODES[mode][0] == "client":
            ap.error(f"--dip decides with pg_co's co.decide: not with mode {mode} (PostgreSQL in client mode)")
    reap_orphans()
    if args.three:
        items = three_sample(args.sample, args.seed, args.dip, args.only)
    else:
        items = [] if args.only or args.dip else [(l, p, s) for l, p, s in named_schedules()]
        items += (list(full_set(args.only, args.dip)) if args.full
                  else sample(full_set(args.only, args.dip), args.sample, args.seed))
    log = open(args.log, "w") if args.log else None
    tallies = []
    # Each mode runs on servers that have pg_co / mysql_co loaded or not, as it needs
    # (mode_servers: client mode on servers without them); plain runs on the previous
    # mode's servers. One PostgreSQL and one MariaDB server per configuration.
    servers, runners, last = {}, {}, None
    try:
        for mode in modes:
            want = mode_servers(mode)
            key = tuple((mysql_co_installed() if i else pg_co_installed()) if w is None and last is None
                        else (last[i] if w is None else w) for i, w in enumerate(want))
            last = key
            if key not in runners:
                if key[0] not in servers.setdefault("pg", {}):
                    servers["pg"][key[0]] = PgServer(preload=key[0]).start()
                if key[1] not in servers.setdefault("my", {}):
                    servers["my"][key[1]] = MariaServer(plugin=key[1]).start()
                runners[key] = Runner(servers["pg"][key[0]], servers["my"][key[1]], mode=mode)
            runner = runners[key]
            runner.set_mode(mode)
            where = f"PostgreSQL {'with' if key[0] else 'without'} pg_co, MariaDB {'with' if key[1] else 'without'} mysql_co"
            print(f"running {len(items)} schedules with {dict(co='the project on', plain='plain 2PC').get(mode, mode)} "
                  f"({where}) ...", flush=True)
            tallies.append(run_many(runner, items, Tally(mode), progress_every=max(50, len(items) // 20), log=log,
                                    time_budget=args.budget))
            print(tallies[-1].line(), flush=True)
    finally:
        for r in runners.values():
            r.close()
        for by_kind in servers.values():
            for srv in by_kind.values():
                srv.destroy()
    for t in tallies:
        for r in t.failures[:2]:
            print(f"\n[{t.mode}] {r.label}: executed {' '.join(r.executed)}")
            for a in r.anomalies:
                print(a.text)
    # Failure: an anomaly where the project guarantees serializability: with the engines
    # on (co), and in client mode among schedules of global transactions only (local ones
    # are client mode's documented hole).
    co = [t for t in tallies if t.mode == "co"]
    client = [t for t in tallies if "client" in MODES[t.mode]]
    return 1 if (any(t.anomalies or t.oracle_disagrees for t in co)
                 or any(t.global_anomalies or t.oracle_disagrees for t in client)) else 0


if __name__ == "__main__":
    sys.exit(main())

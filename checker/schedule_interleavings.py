"""Small transaction programs and their schedules: the interleavings worth running.

A *program* is one transaction: a list of operations (database, r|w, key) plus its kind:
  global  2PC: a branch on every database it touches; after its operations it prepares
          each branch (PREPARE TRANSACTION / XA END + XA PREPARE), then, once all are
          prepared (the decision), commits each (COMMIT PREPARED / XA COMMIT);
  dip     the same with the decision in the PostgreSQL branch: the other branch prepares,
          then the PostgreSQL branch commits in one phase with `SELECT co.decide(..)`
          (that COMMIT is the decision), then the other branch commits (`as_dip`);
  one     a global transaction with a single branch, committed in one phase (no prepare:
          the daemon's `one_phase_branch`; PostgreSQL COMMIT, MariaDB XA COMMIT ... ONE
          PHASE), in client mode after the branch's slot write;
  local   one database, BEGIN ... COMMIT.
Every write is a list-append of the writer's id (so the checker can order versions), every
read returns the whole list.

A *schedule* is an interleaving of the programs' steps. Steps on different databases
commute (neither engine can tell their order), so we enumerate every per-database order of
the steps (each transaction's steps at one database form a chain) and keep those
consistent with each transaction's own order (operations in program order, then all
prepares, then all commits): one linear schedule per equivalence class. That covers every
order of prepare, decision and commit delivery at every database.

Pure: no server, no I/O. The catalogue of programs is checker.schedule_catalogue, the
runner on real engines checker.schedule_runner, the command line checker.schedules.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass



DBS = ("pg", "my")


@dataclass(frozen=True)
class Program:
    name: str
    kind: str            # global | dip | one | local (and local's variants)
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

"""The catalogue of small schedules that checker.schedules runs: the transaction shapes
(global, dip, local), the named schedules of docs/guarantees.md, the documented limits,
the full set of pairs, and a reproducible sample of three concurrent transactions (every
combination of three programs has far too many schedules to run them all; three_sample()
draws them from a seed, each one the same representative of its class that the
enumeration would run).

Pure: no server, no I/O (checker.schedule_interleavings enumerates, checker.schedule_runner runs).
"""
from __future__ import annotations

import fnmatch
import itertools
import random
from collections import defaultdict


from .schedule_interleavings import DBS, Program, chains, txn_edges, as_dip, _linearize, _canonical, enumerate_schedules, schedule_from_db_orders


# --------------------------------------------------------------------------------------
# The catalogue.
def G(name, *ops):
    return Program(name, "global", tuple(_op(o) for o in ops))


def G1(name, *ops):
    """A global transaction with a single branch, committed in one phase (kind one)."""
    return Program(name, "one", tuple(_op(o) for o in ops))


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


# Single-branch global transactions committed in one phase (the daemon's
# `one_phase_branch`): one database, reads and writes.
ONE_PHASE_SHAPES = [
    ("r pg:x", "w pg:y"),
    ("r pg:y", "w pg:x"),
    ("r pg:x", "r pg:y"),
    ("r my:x", "w my:y"),
    ("r my:y", "w my:x"),
    ("r my:x", "r my:y"),
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


def one_phase_catalogue():
    """(label, programs) of the combinations with a single-branch global transaction
    committed in one phase (kind one), kept apart from catalogue() so that the full set's
    families and counts (docs/guarantees.md) stay as they are. Labels: gI =
    GLOBAL_SHAPES[I], lJ = LOCAL_SHAPES[J], oK = ONE_PHASE_SHAPES[K]; ruleC_one(_my): rule
    C's programs with the reader a one-phase global transaction."""
    out = []
    gl = [lambda n, s=s: G(n, *s) for s in GLOBAL_SHAPES]
    lo = [lambda n, s=s: L(n, *s) for s in LOCAL_SHAPES]
    op = [lambda n, s=s: G1(n, *s) for s in ONE_PHASE_SHAPES]
    for i in range(len(gl)):
        for j in range(len(op)):
            out.append((f"g{i}+o{j}", [gl[i]("T1"), op[j]("T2")]))
    for i, j in itertools.combinations_with_replacement(range(len(op)), 2):
        out.append((f"o{i}+o{j}", [op[i]("T1"), op[j]("T2")]))
    for i in range(len(op)):
        for j in range(len(lo)):
            out.append((f"o{i}+l{j}", [op[i]("T1"), lo[j]("L2")]))
    # Rule C with the reader a one-phase global transaction (PostgreSQL, MariaDB): what a
    # local reader lets through (the hole), a one-phase reader in client mode must not.
    out.append(("ruleC_one", [G("Y", "w pg:y", "w my:x"), G("G", "w pg:x", "r my:x"), G1("L", "r pg:x", "r pg:y")]))
    out.append(("ruleC_one_my", [G("Y", "w my:y", "w pg:x"), G("G", "w my:x", "r pg:x"), G1("L", "r my:x", "r my:y")]))
    return out


def one_phase_named():
    """Rule C's named schedule (named_schedules()) with the reader a one-phase global
    transaction: in client mode its slot write makes it the pivot of a dangerous
    structure with its prepared helper, and it is refused; without that write it is a
    local reader, and rule C's cycle commits."""
    out = []
    ro = [G("Y", "w pg:y", "w my:z"), G("G", "w pg:x", "r my:z"), G1("L", "r pg:x", "r pg:y")]
    out.append(("one phase, rule C: a one-phase reader sees G but not Y, G saw Y", ro, schedule_from_db_orders(ro, {
        "pg": ["Y.w(pg:y)", "Y.prep(pg)", "G.w(pg:x)", "G.prep(pg)", "G.commit(pg)",
               "L.r(pg:x)", "L.r(pg:y)", "L.commit(pg)", "Y.commit(pg)"],
        "my": ["Y.w(my:z)", "Y.prep(my)", "Y.commit(my)", "G.r(my:z)", "G.prep(my)", "G.commit(my)"]})))
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


def full_set(only: str | None = None, dip: bool = False, one_phase: bool = False):
    """dip: the global transactions decide in their PostgreSQL branch (as_dip); only: the
    combinations label_matches() picks; one_phase: one_phase_catalogue()'s instead."""
    for label, progs in (one_phase_catalogue() if one_phase else catalogue()):
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



def sample(items, n, seed):
    items = list(items)
    rnd = random.Random(seed)
    return items if n >= len(items) else rnd.sample(items, n)

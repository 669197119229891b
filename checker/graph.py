"""Dependency graph of committed transactions and its cycles (Adya's G0, G1c, G2).

Version order per key:
- list-append keys: the longest list any committed transaction read; every other read
  must be a prefix of it (otherwise the key's history is incompatible: reported);
- register keys: a transaction that read version v and then wrote w puts w right after v
  (our workloads write unique values, and write only what they read first).
Edges between committed transactions Ti != Tj:
- ww  Ti wrote a version, Tj wrote the next one;
- wr  Tj read (before writing the key itself) the version Ti wrote;
- rw  Ti read a version, Tj wrote the next one (Ti missed Tj's write).
A cycle made of ww edges only is G0, of ww and wr edges G1c, one that needs an rw edge G2
(G-single when it has exactly one). A committed transaction that read a value written by
an aborted one is G1a. Transactions with status "info" (outcome unknown) count as
committed when any of their writes was observed, otherwise they are left out.
"""
from __future__ import annotations

import itertools
from collections import defaultdict, deque
from dataclasses import dataclass, field

SEVERITY = {"G0": 0, "G1c": 1, "G2": 2}


@dataclass
class Anomaly:
    kind: str            # G0 | G1c | G2 | G-single | G1a | incompatible-order
    txns: list
    edges: list = field(default_factory=list)   # [(a, type, b, why)]
    text: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass
class Report:
    txns: int = 0
    committed: int = 0
    edges: int = 0
    anomalies: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def cycles(self) -> list:
        return [a for a in self.anomalies if a.kind in ("G0", "G1c", "G2", "G-single")]

    def summary(self) -> str:
        head = (f"{self.txns} transactions, {self.committed} committed, {self.edges} dependency edges: "
                + ("no anomaly (serializable)" if self.ok else f"{len(self.anomalies)} anomal{'y' if len(self.anomalies) == 1 else 'ies'}"))
        return "\n".join([head] + [str(a) for a in self.anomalies])


def _fmt(v) -> str:
    if isinstance(v, list):
        return "[" + " ".join(map(str, v)) + "]" if v else "[] (initial)"
    return "initial" if v is None else repr(v)


def _is_list_key(ops_by_key) -> bool:
    return any(f == "append" or (f == "r" and isinstance(v, list)) for f, v, _ in ops_by_key)


def check(history, final_reads: dict | None = None) -> Report:
    """Analyse `history` (list of Txn). final_reads: {key: list} read after the run (helps
    to order appends nobody read during the run)."""
    txns = {t.id: t for t in history}
    rep = Report(txns=len(history))

    # Which writes were observed (to settle 'info' transactions).
    observed = set()
    for t in history:
        for f, k, v in t.ops:
            if f == "r":
                if isinstance(v, list):
                    observed.update((k, x) for x in v)
                elif v is not None:
                    observed.add((k, v))
    for k, lst in (final_reads or {}).items():
        observed.update((k, x) for x in lst)
    committed = set()
    for t in history:
        if t.status == "ok":
            committed.add(t.id)
        elif t.status == "info" and any((k, v) in observed for f, k, v in t.ops if f in ("append", "w")):
            committed.add(t.id)
    rep.committed = len(committed)

    writer = {}            # (key, value) -> txn id
    per_key = defaultdict(list)   # key -> [(f, value, txn)]
    for t in history:
        for f, k, v in t.ops:
            per_key[k].append((f, v, t.id))
            if f in ("append", "w"):
                writer[(k, v)] = t.id

    edges = defaultdict(list)     # (a, b) -> [(type, why)]

    def edge(a, b, typ, why):
        if a != b and a in committed and b in committed:
            edges[(a, b)].append((typ, why))

    # G1a: committed transactions reading aborted writes.
    for t in history:
        if t.id not in committed:
            continue
        for f, k, v in t.ops:
            if f != "r":
                continue
            vals = v if isinstance(v, list) else ([] if v is None else [v])
            for x in vals:
                w = writer.get((k, x))
                if w is not None and w not in committed and txns[w].status == "fail":
                    rep.anomalies.append(Anomaly("G1a", [t.id, w], text=(
                        f"G1a (aborted read): {t.id} read {k} = {_fmt(v)}, which contains the write of "
                        f"{w}, a transaction that aborted")))

    def external_reads(t, k):
        """Reads of k by t before t wrote k itself."""
        out = []
        for f, kk, v in t.ops:
            if kk != k:
                continue
            if f in ("append", "w"):
                break
            if f == "r":
                out.append(v)
        return out

    for k, ops in per_key.items():
        # Only the committed transactions that touched k can have an edge through k (looping
        # over every committed transaction per key is quadratic on long workload histories).
        touching = sorted({tid for _, _, tid in ops if tid in committed})
        if _is_list_key(ops):
            reads = [v for f, v, tid in ops if f == "r" and tid in committed]
            if final_reads and k in final_reads:
                reads.append(list(final_reads[k]))
            order = max(reads, key=len) if reads else []
            bad = [r for r in reads if r != order[:len(r)]]
            if bad:
                rep.anomalies.append(Anomaly("incompatible-order", [], text=(
                    f"incompatible order on {k}: reads {_fmt(bad[0])} and {_fmt(order)} are not prefixes of one list")))
                continue
            unobserved = sorted({tid for f, v, tid in ops if f == "append" and tid in committed
                                 and v not in order})
            for a, b in zip(order, order[1:]):
                wa, wb = writer.get((k, a)), writer.get((k, b))
                if wa and wb:
                    edge(wa, wb, "ww", f"{wa} appended {a!r} to {k} and {wb} appended the next element {b!r}")
            for tid in touching:
                for r in external_reads(txns[tid], k):
                    if r:
                        w = writer.get((k, r[-1]))
                        if w:
                            edge(w, tid, "wr", f"{tid} read {k} = {_fmt(r)}, which ends with {w}'s append")
                    if len(r) < len(order):
                        w = writer.get((k, order[len(r)]))
                        if w:
                            edge(tid, w, "rw", f"{tid} read {k} = {_fmt(r)}, missing {w}'s append "
                                               f"{order[len(r)]!r} that comes next")
                    else:
                        for w in unobserved:
                            edge(tid, w, "rw", f"{tid} read {k} = {_fmt(r)}, missing {w}'s later append")
        else:
            succ = defaultdict(set)   # version -> versions written right after it
            for tid in touching:
                t = txns[tid]
                ext = external_reads(t, k)
                wrote = [v for f, kk, v in t.ops if kk == k and f == "w"]
                if ext and wrote:
                    succ[ext[0]].add(wrote[0])
                for a, b in zip(wrote, wrote[1:]):
                    succ[a].add(b)
            for v, nexts in succ.items():
                for n in nexts:
                    wv, wn = writer.get((k, v)) if v is not None else None, writer.get((k, n))
                    if wv and wn:
                        edge(wv, wn, "ww", f"{wv} wrote {k} = {v!r} and {wn} overwrote it with {n!r}")
            for tid in touching:
                for r in external_reads(txns[tid], k):
                    if r is not None:
                        w = writer.get((k, r))
                        if w:
                            edge(w, tid, "wr", f"{tid} read {k} = {r!r}, written by {w}")
                    for n in succ.get(r, ()):
                        w = writer.get((k, n))
                        if w:
                            edge(tid, w, "rw", f"{tid} read {k} = {_fmt(r)}, which {w} overwrote with {n!r}")

    rep.edges = sum(len(v) for v in edges.values())
    rep.anomalies += _cycles(edges, txns)
    return rep


def _adj(edges, allowed):
    adj = defaultdict(set)
    for (a, b), lst in edges.items():
        if any(t in allowed for t, _ in lst):
            adj[a].add(b)
    return adj


def _sccs(nodes, adj):
    """Tarjan, iterative."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = itertools.count()
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(adj.get(root, ()))))]
        index[root] = low[root] = next(counter)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = next(counter)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(adj.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


# Public for other graphs than histories: scripts/structure.py finds import circles with it.
sccs = _sccs


def _shortest_cycle(comp, adj):
    comp_set = set(comp)
    best = None
    for s in comp:
        prev = {s: None}
        q = deque([s])
        found = None
        while q and found is None:
            v = q.popleft()
            for w in sorted(adj.get(v, ())):
                if w not in comp_set:
                    continue
                if w == s:
                    found = v
                    break
                if w not in prev:
                    prev[w] = v
                    q.append(w)
        if found is not None:
            path = [found]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])
            path.reverse()           # s ... found, and found -> s closes it
            if best is None or len(path) < len(best):
                best = path
    return best


def _cycles(edges, txns):
    nodes = sorted({a for a, _ in edges} | {b for _, b in edges})
    out = []
    for comp in _sccs(nodes, _adj(edges, {"ww", "wr", "rw"})):
        for kind, allowed in (("G0", {"ww"}), ("G1c", {"ww", "wr"}), ("G2", {"ww", "wr", "rw"})):
            adj = {k: v for k, v in _adj(edges, allowed).items() if k in comp}
            sub = _sccs(comp, adj)
            if sub:
                cyc = _shortest_cycle(sub[0], adj)
                break
        steps = []
        n_rw = 0
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            cands = [(t, why) for t, why in edges[(a, b)] if t in allowed]
            # Prefer the least anti-dependent explanation of each step.
            t, why = sorted(cands, key=lambda c: ("ww", "wr", "rw").index(c[0]))[0]
            n_rw += t == "rw"
            steps.append((a, t, b, why))
        if kind == "G2" and n_rw == 1:
            kind = "G-single"
        chain = " ".join(f"{a} -{t}->" for a, t, _, _ in steps) + f" {cyc[0]}"
        kinds = {t.kind in ("global", "dip", "one") for t in (txns[x] for x in cyc)}   # global or not
        who = ", ".join(f"{x} ({txns[x].kind}{': ' + txns[x].note if txns[x].note else ''})" for x in cyc)
        lines = [f"{kind} cycle over {len(cyc)} committed transactions: {chain}", f"  transactions: {who}"]
        lines += [f"  {a} -{t}-> {b}: {why}" for a, t, b, why in steps]
        lines.append("  each edge says the left transaction must come before the right one in any "
                     "equivalent serial order; a cycle means no serial order exists"
                     + (" (the cycle mixes global and local transactions)" if len(kinds) > 1 else ""))
        if len(comp) > len(cyc):
            lines.append(f"  ({len(comp)} transactions are tangled in this strongly connected component: {', '.join(comp)})")
        out.append(Anomaly(kind, list(cyc), steps, "\n".join(lines)))
    return out


def serial_order(history, final_reads: dict | None = None, limit: int = 9):
    """Brute force: a serial order of the committed transactions that explains every read
    (and the final state), or None. Only for small histories (<= `limit` transactions)."""
    rep_committed = [t for t in history if t.status == "ok"]
    observed = set()
    for t in history:
        for f, k, v in t.ops:
            if f == "r":
                observed.update((k, x) for x in (v if isinstance(v, list) else [v]))
    for k, lst in (final_reads or {}).items():
        observed.update((k, x) for x in lst)
    rep_committed += [t for t in history if t.status == "info"
                      and any((k, v) in observed for f, k, v in t.ops if f in ("append", "w"))]
    if len(rep_committed) > limit:
        raise ValueError(f"{len(rep_committed)} committed transactions: too many for brute force")
    list_keys = {k for t in history for f, k, v in t.ops if f == "append" or (f == "r" and isinstance(v, list))}
    for perm in itertools.permutations(rep_committed):
        state = {}
        ok = True
        for t in perm:
            for f, k, v in t.ops:
                cur = state.get(k, [] if k in list_keys else None)
                if f == "r":
                    if (list(cur) if k in list_keys else cur) != v:
                        ok = False
                        break
                elif f == "append":
                    state[k] = list(cur) + [v]
                else:
                    state[k] = v
            if not ok:
                break
        if ok and final_reads:
            ok = all(state.get(k, []) == list(v) for k, v in final_reads.items())
        if ok:
            return [t.id for t in perm]
    return None

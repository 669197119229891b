"""The history checker on hand-made histories (no servers): it must find G0, G1c, G2,
G-single, G1a and lost updates, and accept serializable histories; the brute-force
serial-order oracle must agree with it."""
from checker import Txn, check, serial_order


def kinds(rep):
    return sorted(a.kind for a in rep.anomalies)


def test_serializable_list_append():
    h = [Txn("T1").read("pg:x", []).append("pg:x", "T1").append("my:y", "T1"),
         Txn("T2").read("pg:x", ["T1"]).read("my:y", ["T1"]).append("my:y", "T2"),
         Txn("L3", kind="local").read("my:y", ["T1", "T2"])]
    rep = check(h)
    assert rep.ok, rep.summary()
    assert serial_order(h) == ["T1", "T2", "L3"]


def test_overdraft_is_g2_with_explanation():
    # Each read both balances' logs and appended to one: the plain-2PC overdraft.
    h = [Txn("T1").read("pg:s", []).read("my:c", []).append("pg:s", "T1"),
         Txn("T2").read("pg:s", []).read("my:c", []).append("my:c", "T2")]
    rep = check(h, final_reads={"pg:s": ["T1"], "my:c": ["T2"]})
    assert kinds(rep) == ["G2"], rep.summary()
    a = rep.anomalies[0]
    assert sorted(a.txns) == ["T1", "T2"] and all(t == "rw" for _, t, _, _ in a.edges)
    assert "missing T2's append" in a.text and "missing T1's append" in a.text
    assert serial_order(h, {"pg:s": ["T1"], "my:c": ["T2"]}) is None


def test_g_single_through_a_local_transaction():
    # Rule C's shape: L saw G but not Y, G saw Y.
    h = [Txn("Y").append("pg:y", "Y").append("my:z", "Y"),
         Txn("G").read("my:z", ["Y"]).append("pg:x", "G"),
         Txn("L", kind="local").read("pg:x", ["G"]).read("pg:y", [])]
    rep = check(h, final_reads={"pg:y": ["Y"]})
    assert kinds(rep) == ["G-single"], rep.summary()
    assert "mixes global and local" in rep.anomalies[0].text


def test_g1c_and_g0():
    g1c = [Txn("A").append("pg:x", "A").read("my:y", ["B"]),
           Txn("B").append("my:y", "B").read("pg:x", ["A"])]
    assert kinds(check(g1c)) == ["G1c"]
    g0 = [Txn("A").append("pg:x", "A").append("my:y", "A"),
          Txn("B").append("pg:x", "B").append("my:y", "B")]
    assert kinds(check(g0, final_reads={"pg:x": ["A", "B"], "my:y": ["B", "A"]})) == ["G0"]


def test_aborted_read_and_incompatible_order():
    h = [Txn("A", status="fail").append("pg:x", "A"), Txn("B").read("pg:x", ["A"])]
    assert "G1a" in kinds(check(h))
    h = [Txn("A").append("pg:x", "A"), Txn("B").append("pg:x", "B"),
         Txn("C").read("pg:x", ["A"]), Txn("D").read("pg:x", ["B"])]
    assert kinds(check(h)) == ["incompatible-order"]


def test_registers_lost_update_and_chain():
    lost = [Txn("A").read("pg:r", None).write("pg:r", "a"), Txn("B").read("pg:r", None).write("pg:r", "b")]
    assert kinds(check(lost)) == ["G-single"] or kinds(check(lost)) == ["G2"]
    chain = [Txn("A").read("pg:r", None).write("pg:r", "a"), Txn("B").read("pg:r", "a").write("pg:r", "b"),
             Txn("C").read("pg:r", "b")]
    assert check(chain).ok
    assert serial_order(chain) == ["A", "B", "C"]


def test_info_transactions_count_when_observed():
    h = [Txn("A", status="info").append("pg:x", "A").append("my:y", "A"),
         Txn("B").read("pg:x", ["A"]).read("my:y", [])]
    rep = check(h, final_reads={"my:y": ["A"]})
    assert rep.committed == 2 and kinds(rep) == ["G-single"], rep.summary()
    h2 = [Txn("A", status="info").append("pg:x", "A"), Txn("B").read("pg:x", [])]
    assert check(h2).committed == 1


def test_upsert_write_skew_across_tables():
    # The shape checker.list_append looks for: each transaction read a fresh key (no row
    # yet) that the other one's upsert inserted, and both committed.
    h = [Txn("T1").read("txn1/7", []).append("txn2/9", 1),
         Txn("T2").read("txn2/9", []).append("txn1/7", 2),
         Txn("T3").read("txn1/7", [2]).read("txn3/1", [])]   # a bystander, in no cycle
    rep = check(h, final_reads={"txn1/7": [2], "txn2/9": [1]})
    assert kinds(rep) == ["G2"], rep.summary()
    assert sorted(rep.anomalies[0].txns) == ["T1", "T2"]
    assert "T1 read txn1/7 = [] (initial), missing T2's append 2 that comes next" in rep.anomalies[0].text


def _random_interleaving(rng, n_txns, keys):
    """A history of list-append transactions whose operations run one at a time in a random
    interleaving, each on the current state (no isolation at all): sometimes serializable,
    often not. Every transaction commits; no key is read after its own append (the engines
    show a transaction its own append, which the checker leaves to the version order)."""
    programs = []
    for i in range(n_txns):
        ops, appended = [], set()
        for _ in range(rng.randint(1, 3)):
            k = rng.choice(keys)
            if rng.random() < 0.5 and k not in appended:
                ops.append(("r", k))
            else:
                ops.append(("append", k))
                appended.add(k)
        programs.append(ops)
    txns = [Txn(f"T{i}") for i in range(n_txns)]
    pos = [0] * n_txns
    state = {k: [] for k in keys}
    value = 0
    while any(pos[i] < len(programs[i]) for i in range(n_txns)):
        i = rng.choice([i for i in range(n_txns) if pos[i] < len(programs[i])])
        f, k = programs[i][pos[i]]
        pos[i] += 1
        if f == "r":
            txns[i].read(k, list(state[k]))
        else:
            value += 1
            state[k].append(value)
            txns[i].append(k, value)
    return txns, state


def test_list_append_checker_agrees_with_the_oracle_on_random_interleavings():
    # Per-key edge inference (only the transactions that touched a key) against brute
    # force, on many small histories: both must call each one serializable or not alike.
    import random
    rng = random.Random(5)
    seen = {True: 0, False: 0}
    for _ in range(400):
        h, final = _random_interleaving(rng, rng.randint(2, 4), ["a", "b", "c"])
        rep = check(h, final_reads=final)
        oracle = serial_order(h, final) is not None
        assert rep.ok == oracle, (rep.summary(), [t.to_json() for t in h], final)
        seen[oracle] += 1
    assert seen[True] > 20 and seen[False] > 20, seen

"""Exhaustive small schedules against the real engines: the command line.

Every per-database interleaving of small transaction programs (global 2PC, decision in a
participant, local) is run on real PostgreSQL and MariaDB sessions, and each committed
history is checked by the graph checker and a brute-force serial-order oracle. The parts,
each a module named after what it does:

  schedule_interleavings  programs, their steps and the interleavings worth running (pure)
  schedule_catalogue      the named schedules, the documented limits, the full set and the
                          three-transaction sample (pure)
  schedule_runner         runs a schedule on live servers and checks the history

This module is the command line, and keeps the names the tests and callers import from
`checker.schedules`:

    python -m checker.schedules --help
"""
from __future__ import annotations

import argparse
import sys


# The names callers import from checker.schedules (the parts' public names).
from .schedule_catalogue import G, G1, L, GLOBAL_SHAPES, ONE_PHASE_SHAPES, one_phase_catalogue, one_phase_named, LOCAL_SHAPES, catalogue, named_schedules, limit_schedules, label_matches, full_set, THREE_GLOBAL_SHAPES, THREE_LOCAL_SHAPES, three_programs, random_schedule, three_sample, sample  # noqa: F401
from .schedule_interleavings import DBS, Program, Step, chains, txn_edges, as_dip, enumerate_schedules, schedule_from_db_orders  # noqa: F401
from .schedule_runner import Result, reason_of, MODES, mode_servers, SHIM_SLOTS, Runner, Tally, run_many  # noqa: F401


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

"""The statistics of bench/harness behind the targets (no servers): the abort-rate ratio
with its round bootstrap, how the "at most 2 x 2pc's aborts" target is judged on it, the
settings list of RESULTS.md, and the pooled abort reasons."""
from bench.harness import reasons, slices, slices_report


def rows(per_round: dict[str, list[tuple[int, int]]], exp="micro", point="default") -> list[dict]:
    """Slice rows as the CSV holds them: mode -> [(aborts, attempts) per round]."""
    out = []
    for mode, rounds in per_round.items():
        for i, (ab, att) in enumerate(rounds, 1):
            out.append({**dict.fromkeys(slices.SLICE_FIELDS, ""), "experiment": exp, "point": point, "mode": mode,
                        "round": str(i), "aborts": str(ab), "attempts": str(att), "tps": "100",
                        "reasons": f"x={ab}" if ab else ""})
    return out


def test_rate_ratio_pools_rounds_where_the_baseline_aborted_nothing():
    # Round 3's 2pc aborted nothing: it has no ratio of its own, but its attempts count.
    r = rows({"co": [(10, 100), (10, 100), (10, 100)], "2pc": [(5, 100), (5, 100), (0, 100)]})
    m, lo, hi = slices.rate_ratio(r, "micro", "default", "co", "2pc")
    assert m == 3.0
    assert lo <= m <= hi
    # A median of per-round ratios would have dropped round 3 and said 2.
    assert slices.pair_ratio(r, "micro", "default", "co", "2pc", "aborts")[0] == 2.0


def test_rate_ratio_without_baseline_aborts_is_infinite():
    r = rows({"co": [(1, 100)] * 4, "2pc": [(0, 100)] * 4})
    assert slices.rate_ratio(r, "micro", "default", "co", "2pc")[0] == float("inf")


def abort_target(per_round) -> str:
    r = rows(per_round)
    line = next(x for x in slices_report.targets(slices.summarize(r), r).splitlines() if "abort rate" in x)
    return line.rsplit("|", 2)[1].strip()


def test_abort_target_is_judged_on_the_whole_interval():
    ten = 10
    assert abort_target({"2pc": [(10, 1000)] * ten, "co": [(15, 1000)] * ten}) == "yes"
    assert abort_target({"2pc": [(10, 1000)] * ten, "co": [(40, 1000)] * ten}) == "**no**"
    # Rounds on both sides of 2: the interval straddles the goal.
    straddle = {"2pc": [(10, 1000)] * ten, "co": [(5, 1000), (40, 1000)] * (ten // 2)}
    assert abort_target(straddle).startswith("not shown")


def test_settings_list_gives_the_first_point_in_full_then_differences():
    lines = slices_report.settings_lines({
        "micro default": {"pg_co.max_wait": "5ms", "max_pred_locks_per_page": "2", "HOT updates of mt*": "99.0 % of 10"},
        "micro_levers max_wait=0": {"pg_co.max_wait": "0", "max_pred_locks_per_page": "2"},
        "micro_ro R=12": {"pg_co.max_wait": "5ms", "max_pred_locks_per_page": "2"}})
    text = "\n".join(lines)
    assert "- micro default: `pg_co.max_wait` = 5ms, `max_pred_locks_per_page` = 2; HOT updates 99.0 % of 10" in text
    assert "- micro_levers max_wait=0: `pg_co.max_wait` = 0\n" in text
    assert "- micro_ro R=12: as the first" in text


def test_reasons_pooled_and_shortened():
    pooled = reasons.pool([{"reasons": "a=1;b=5"}, {"reasons": ""}, {"reasons": "a=7"}])
    assert pooled == "a=8;b=5"
    assert reasons.cell(pooled, 100) == "a=8, b=5"
    assert reasons.cell("", 100) == "-"
    assert reasons.cell("kind=1;" * 30, 20) == "kind=1, kind=1, k..." and len(reasons.cell("kind=1;" * 30, 20)) == 20


def test_modes_narrowed_and_shim_spelled_client():
    from bench import experiments
    from bench.harness import canonical
    assert canonical("shim") == "client" and canonical("shim:x") == "client:x" and canonical("co:par") == "co:par"
    point = ["2pc", "2pc:ser", "co", "dip", "shim", "local"]
    assert experiments.only(point, "") == ["2pc", "2pc:ser", "co", "dip", "client", "local"]
    # A variant runs with its base; the old name selects client mode.
    assert experiments.only(point, "local,2pc,co,shim") == ["2pc", "2pc:ser", "co", "client", "local"]
    assert experiments.only(["2pc", "co:acr=ON"], "client") == []
    # A variant named alone runs alone (before, it matched nothing and the run measured nothing).
    assert experiments.only(experiments.COORDINATOR_MODES, "local,2pc:inproc") == ["local", "2pc:inproc"]
    # A base with some of its variants named runs only those beside it (before, every
    # variant of the base ran: a two-variant comparison measured ten modes).
    assert experiments.only(experiments.COORDINATOR_MODES, "local,2pc,co,2pc:1req,co:1req") == \
        ["local", "2pc", "co", "2pc:1req", "co:1req"]
    # A name no point has (misspelt, or a mode of another experiment) is named at the
    # run's end, not silently dropped (before: dip:1req in the coordinator experiment,
    # which had none, measured nothing and said nothing); a base or a variant some point
    # has is not.
    offered = set(experiments.COORDINATOR_MODES)
    assert experiments.unmatched_modes("local,2pc,dip:per-step,co:1reqq,shim,2pc:1req", offered) == \
        ["dip:per-step", "co:1reqq", "client"]
    assert experiments.unmatched_modes("", offered) == []


def test_profile_experiment_table_and_refusals(tmp_path):
    """`run_all.py --experiments profile` reproduces RESULTS' profile before/after: its
    table from the stored JSON lines (a build without the request counter says so), and
    clear refusals when it is mixed with slices or strace/perf are missing."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    from bench.coordinator import profile_pair
    res = Path(__file__).resolve().parents[3] / "bench" / "results" / "profile"
    runs = {k: json.loads((res / f"{k}.json").read_text()) for k in ("before", "after")}
    t = profile_pair.table(runs)
    assert "| daemon CPU ms per transaction | 0.661 | 0.459 |" in t, t
    assert "| API requests per transaction | no counter | 2.01 |" in t, t
    assert "fdatasync 0.84" in t and t.count("\n") == 2 + len(profile_pair.ROWS) + 2, t
    run_all = [sys.executable, str(res.parents[1] / "run_all.py")]
    r = subprocess.run(run_all + ["--experiments", "profile,micro", "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "runs alone" in r.stderr, r
    r = subprocess.run(run_all + ["--experiments", "profile", "--out", str(tmp_path)], capture_output=True, text=True,
                       env={**os.environ, "PATH": str(tmp_path)})
    assert r.returncode == 2 and "needs strace and perf" in r.stderr and not (tmp_path / "profile").exists(), r

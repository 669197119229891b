"""Markdown for the generated block of bench/RESULTS.md from the slice summaries
(slices.summarize): tables with medians and 95 % intervals, the targets, the quiet checks,
the refusal breakdowns. A ratio whose interval contains 1.0 says "no difference shown"."""
from __future__ import annotations

from . import report
from .reasons import cell
from .slices import _f, bootstrap_median, pair_ratio, rate_ratio, verdict

BEGIN = "<!-- slices:generated:begin -->"
END = "<!-- slices:generated:end -->"
HEADER = "## Side by side, Rust driver: slices, intervals, CPU per transaction"


def _ci(m, lo, hi, fmt="{:.3f}") -> str:
    if m != m:
        return "n/a"
    return f"{fmt.format(m)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _ratio_cell(s) -> str:
    if s["ratio_verdict"] == "baseline":
        return "1 (baseline)"
    cell = _ci(_f(s["ratio"]), _f(s["ratio_lo"]), _f(s["ratio_hi"]))
    return cell + (" no difference shown" if s["ratio_verdict"] == "no difference shown" else "")


def _abort_ratio_cell(s) -> str:
    if s["ratio_verdict"] == "baseline":
        return "1"
    return _ci(_f(s.get("abort_ratio")), _f(s.get("abort_ratio_lo")), _f(s.get("abort_ratio_hi")), "{:.2f}")


def _flushes(s) -> str:
    """Flushes per commit, pg WAL / MariaDB redo / decision store (slices.FLUSH_FIELDS)."""
    got = [_f(s.get(f"{k}_per_commit")) for k in ("pg_wal_syncs", "my_log_fsyncs", "store_syncs")]
    return "n/a" if all(x != x for x in got) else "/".join(f"{x:.2f}" for x in got)


def table(summary: list[dict], exp: str) -> str:
    lines = ["| point | mode | tx/s median [95% CI] | / 2pc [95% CI] | server CPU ms/tx (pg/my/coord) | CPU/tx / 2pc [95% CI] | flushes/commit (pg/my/store) | aborts | aborts / 2pc's [95% CI] | driver CPU | p50 / p99 ms | abort reasons (pooled) |",
             "|---|---|---|---|---|---|---|---:|---|---:|---|---|"]
    for s in summary:
        if s["experiment"] != exp:
            continue
        reasons = cell(s["reasons"], 100)
        chk = "" if s.get("checks") in ("", "ok", None) else f" (checks: {s['checks']})"
        err = f" ({s['errors']} slices with errors)" if int(_f(s.get("errors")) or 0) else ""
        # Open loop (--rate): arrivals the mode did not start in time (not at equal throughput).
        if int(_f(s.get("missed")) or 0):
            err += f" (missed {s['missed']} arrivals at {_f(s.get('rate')):.0f} tx/s)"
        cpu = (f"{_f(s['cpu_ms_server']):.2f} ({_f(s['cpu_ms_pg']):.2f}/{_f(s['cpu_ms_my']):.2f}/{_f(s['cpu_ms_coord']):.2f}"
               # The PostgreSQL decision store's own instance (experiment store), when it ran.
               + (f", store {_f(s.get('cpu_ms_store')):.2f}" if _f(s.get("cpu_ms_store")) > 0 else "") + ")")
        cpu_r = "1" if s["ratio_verdict"] == "baseline" else _ci(_f(s["cpu_ratio"]), _f(s["cpu_ratio_lo"]), _f(s["cpu_ratio_hi"]))
        lines.append(f"| {s['point']} | {s['mode']} | {_ci(_f(s['tps_median']), _f(s['tps_lo']), _f(s['tps_hi']), '{:.0f}')} | "
                     f"{_ratio_cell(s)} | {cpu} | {cpu_r} | {_flushes(s)} | {100 * _f(s['abort_rate']):.2f} % | {_abort_ratio_cell(s)} | "
                     f"{100 * _f(s['driver_cpu_share']):.1f} % | {_f(s['p50_ms']):.1f} / {_f(s['p99_ms']):.1f} | {reasons}{chk}{err} |")
    return "\n".join(lines)


def _get(summary, exp, point, mode):
    return next((s for s in summary if s["experiment"] == exp and s["point"] == point and s["mode"] == mode), None)


# The default point again on the tables the default point left, after a plain VACUUM.
SETTLED = "default, settled"


def coordinator_targets(out: list[str], rows: list[dict], add) -> None:
    """The coordinator's targets, from experiment `coordinator` (micro default point): for
    the daemon, and for the coordinator in the driver's process (modes :inproc, and
    :inproc-delay with the store's commit delay) when run."""
    exp, point = "coordinator", "default"
    if not any(r["experiment"] == exp for r in rows):
        return
    ran = {r["mode"] for r in rows if r["experiment"] == exp}
    for v in ("", ":inproc", ":inproc-delay"):
        if v and f"2pc{v}" not in ran:
            continue
        two, co, dip = f"2pc{v}", f"co{v}", f"dip{v}"
        for mode in (co, two):
            add(f"coordinator point: {mode} >= 0.65 x local", exp, point, mode, "local", 0.65)
        if dip in ran:   # dip has no store sync: no :inproc-delay variant
            add(f"coordinator point: {dip} >= 1.2 x {two}", exp, point, dip, two, 1.2)
        add(f"coordinator point: {co} >= 0.97 x {two}", exp, point, co, two, 0.97)
        # Lower goals: met when the whole interval is at or below the goal.
        m, lo, hi = pair_ratio(rows, exp, point, co, "local", "p99_ms")
        if m == m:
            met = "yes" if hi <= 1.5 else ("**no**" if lo > 1.5 else "not shown (interval straddles the goal)")
            out.append(f"| coordinator point: {co} p99 <= 1.5 x local p99 | {_ci(m, lo, hi)} | {met} |")
        for mode in (two, co) + ((dip,) if v else ()):
            xs = [_f(r["cpu_ms_coord"]) for r in rows if r["experiment"] == exp and r["point"] == point
                  and r["mode"] == mode and r.get("cpu_ms_coord") not in ("", None)]
            if xs:
                m, lo, hi = bootstrap_median(xs)
                met = "yes" if hi <= 0.10 else ("**no**" if lo > 0.10 else "not shown (interval straddles the goal)")
                out.append(f"| coordinator point: coordinator CPU per committed transaction <= 0.10 ms ({mode}) | "
                           f"{_ci(m, lo, hi)} ms | {met} |")
    # No target: the batched calls over the per-step ones and an earlier build, and the
    # coordinator in the driver's process over the daemon.
    for mode in ("2pc", "co", "dip"):
        for a, b in ((mode, f"{mode}:per-step"), (mode, f"{mode}:other"), (f"{mode}:inproc", mode),
                     (f"{mode}:inproc-delay", f"{mode}:inproc")):
            m, lo, hi = pair_ratio(rows, exp, point, a, b)
            if m == m:
                out.append(f"| (no target) coordinator point: {a} / {b} | {_ci(m, lo, hi)}; {verdict(m, lo, hi)} | - |")


def targets(summary: list[dict], rows: list[dict]) -> str:
    out = ["| target | measured: median [95% CI] | met? |", "|---|---|---|"]

    def add(name, exp, point, a, b, goal, key="tps"):
        m, lo, hi = pair_ratio(rows, exp, point, a, b, key)
        if m != m:
            out.append(f"| {name} | n/a (not run) | n/a |")
            return
        met = "yes" if lo >= goal else ("**no**" if hi < goal else "not shown (interval straddles the goal)")
        extra = f"; {verdict(m, lo, hi)}" if lo <= 1.0 <= hi else ""
        out.append(f"| {name} | {_ci(m, lo, hi)}{extra} | {met} |")
    def aborts(name, point):
        d2, dc = _get(summary, "micro", point, "2pc"), _get(summary, "micro", point, "co")
        if not (d2 and dc):
            return
        # The ratio of pooled abort rates, its interval from resampled rounds; met only when
        # the whole interval is at most 2 (a lower goal: the mirror of add()).
        m, lo, hi = rate_ratio(rows, "micro", point, "co", "2pc")
        met = "n/a" if m != m else "yes" if hi <= 2 else ("**no**" if lo > 2 else "not shown (interval straddles the goal)")
        out.append(f"| {name}: co abort rate <= 2 x 2pc's | pooled rates: {_ci(m, lo, hi, '{:.2f}')} "
                   f"({100 * _f(dc['abort_rate']):.2f} % vs {100 * _f(d2['abort_rate']):.2f} %) | {met} |")
    for name, point in (("microbenchmark default", "default"), ("microbenchmark default, settled", SETTLED)):
        if point == SETTLED and not _get(summary, "micro", point, "2pc"):
            continue  # a run without the settled point
        add(f"{name}: co >= 0.97 x 2pc", "micro", point, "co", "2pc", 0.97)
        aborts(name, point)
        add(f"{name}: dip >= 1.05 x 2pc", "micro", point, "dip", "2pc", 1.05)
    coordinator_targets(out, rows, add)
    add("microbenchmark default: co >= 1.25 x client mode", "micro", "default", "co", "client", 1.25)
    for W in (2, 4, 8):
        add(f"TPC-C W={W}: co >= 0.95 x 2pc", "tpcc", f"W={W}", "co", "2pc", 0.95)
    add("TPC-C W=4: co >= 1.25 x client mode", "tpcc", "W=4", "co", "client", 1.25)
    add("read-only MariaDB branches (S=2, P=0, R=12, W=0): co >= 1.3 x client mode's slot write",
        "micro_ro", "R=12:W=0:P=0", "co", "client", 1.3)
    m, lo, hi = pair_ratio(rows, "micro", "default", "co", "2pc:ser")
    if m == m:
        out.append(f"| (no target) microbenchmark default: co / 2pc with MariaDB at SERIALIZABLE too (2pc:ser) | "
                   f"{_ci(m, lo, hi)}; {verdict(m, lo, hi)} | - |")
    for mode in ("2pc", "co"):
        m, lo, hi = pair_ratio(rows, "daemon", "default", mode, f"{mode}:other")
        if m == m:
            out.append(f"| (no target) microbenchmark default, {mode}: this daemon / the other build ({mode}:other) | "
                       f"{_ci(m, lo, hi)}; {verdict(m, lo, hi)} | - |")
    for a, b, what in (("co:jta", "2pc:jta", "Narayana: co / plain XA"), ("2pc:jta", "2pc", "plain 2PC: Narayana / the daemon"),
                       ("co:jta", "co", "co: Narayana / the daemon")):
        m, lo, hi = pair_ratio(rows, "narayana", "default", a, b)
        if m == m:
            out.append(f"| (no target) microbenchmark default, {what} ({a} / {b}) | {_ci(m, lo, hi)}; "
                       f"{verdict(m, lo, hi)} | - |")
    m, lo, hi = pair_ratio(rows, "autocommit", "autocommit reads 80%", "co:acr=ON", "co:acr=OFF")
    if m == m:
        out.append(f"| (no target) autocommit-read protection: co with it ON / OFF | {_ci(m, lo, hi)}; "
                   f"{verdict(m, lo, hi)} | - |")
    return "\n".join(out)


def settings_lines(settings: dict[str, dict]) -> list[str]:
    """What "default" meant: the settings in effect at the first point in full, at every
    later point what differs from it, and each point's share of HOT updates."""
    if not settings:
        return []
    out = ["", "Settings in effect (PostgreSQL, as a new session sees them; the first point in full, "
           "the others where they differ) and the share of HOT updates of the microbenchmark tables:", ""]
    first = None
    for label, cur in settings.items():
        hot = cur.get("HOT updates of mt*")
        cur = {k: v for k, v in cur.items() if k != "HOT updates of mt*"}
        if first is None:
            first, shown = cur, cur
        else:
            shown = {k: v for k, v in cur.items() if first.get(k) != v}
        text = ", ".join(f"`{k}` = {v}" for k, v in shown.items()) or "as the first"
        out.append(f"- {label}: {text}" + (f"; HOT updates {hot}" if hot else ""))
    return out


def markdown(summary: list[dict], rows: list[dict], meta: dict, breakdowns: dict[str, str]) -> str:
    m = meta.get("machine", {})
    out = [BEGIN, "",
           f"Generated by `bench/run_all.py` on {meta.get('date', '?')} (UTC); measuring time "
           f"{meta.get('elapsed_min', '?')} min.", "",
           "Machine: " + ", ".join(f"{k} {v}" for k, v in m.items() if k != "loadavg") + ".", "",
           "Command:", "", "    " + meta.get("command", "?"), "",
           f"Driver: `cotx-loadgen` (Rust, one process, {meta.get('clients')} client tasks on one thread; TPC-C "
           f"{meta.get('tpcc_cpw')} per warehouse). Per point: one unrecorded warm-up slice per mode, then "
           f"{meta.get('slices')} rounds of one slice per mode ({meta.get('warmup')} s warm-up + "
           f"{meta.get('seconds')} s measured each), the mode order reversed every round (ABBA). Medians over "
           "slices; ratios are medians of per-round ratios against the same round's 2pc slice, with 95 % "
           f"percentile-bootstrap intervals ({'2000'} resamples); an interval containing 1.0 says \"no "
           "difference shown\". Server CPU per committed transaction: PostgreSQL + mariadbd + coordinator "
           "(from /proc) over exactly the measured window; driver CPU: the driver's share of all CPU used "
           "in the window. Durability on everywhere. Raw slices: `bench/results/slices.csv`, summary: "
           "`bench/results/slices_summary.csv`.", "",
           "Quiet-machine checks (load average; top CPU consumers that were not ours):", ""]
    for label, q in meta.get("quiet", {}).items():
        state = "quiet" if q.get("quiet") else f"**NOT QUIET** ({q.get('why')})"
        out.append(f"- {label}: {state}; load {q.get('loadavg')}; others: {q.get('top')}")
    out += settings_lines(meta.get("settings", {}))
    out += ["", "### Targets", "", targets(summary, rows), ""]
    sections = [("micro", "Microbenchmark, default point (S=2, R=W=6, P=0.5, N=100000, K=0)"),
                ("micro_levers", "Microbenchmark, one lever at a time (every mode of the point gets the lever)"),
                ("micro_ro", "Read-only MariaDB branches vs client mode's slot write"),
                ("tpcc", "TPC-C subset (new-order + payment)"),
                ("daemon", "Two builds of the daemon, micro default point (mode:other: the build given by --other-daemon)"),
                ("coordinator", "What the coordinator costs, micro default point (:per-step: the driver's calls before batching; :other: the build given by --other-daemon)"),
                ("narayana", "Narayana (JTA, in the driver) beside the daemon, micro default point (mode:jta: the Java "
                             "driver clients/java/example io.cotx.tm.Load; its TM's CPU is counted as coord)"),
                ("autocommit", "MariaDB autocommit reads (80 % of transactions: six autocommit point reads on MariaDB; "
                               "acr = mysql_co_lock_autocommit_reads)"),
                ("scaling", "Scaling study: S, clients, read-only share swept one at a time around S=2, 8 clients, "
                            "0 % (the point's clients as named; plots: scaling_S.png, scaling_clients.png, "
                            "scaling_ro.png)"),
                ("store", "Decision store, micro default point: SQLite (one daemon) vs the PostgreSQL store with "
                          "1 and 3 daemons (mode:pgN; coord = all daemons, store = the store's instance)")]
    for exp, title in sections:
        if any(s["experiment"] == exp for s in summary):
            out += [f"### {title}", "", table(summary, exp), ""]
    from .decision_store import markdown as store_alone_md
    out += store_alone_md(meta.get("store_alone") or [])
    if breakdowns:
        out += ["### Refusal breakdown (bench/harness/refusal_breakdown.py on the attempt logs)", ""]
        for k, v in breakdowns.items():
            out += [f"{k}:", "", "```", v.strip(), "```", ""]
    out += [END]
    return "\n".join(out)


def write_section(results_md, text: str) -> None:
    """Replaces only the generated block of this section (appends the section if absent)."""
    report.write_section(results_md, text, HEADER, (BEGIN, END))

"""PNG plots of the sweeps and the generated markdown of bench/RESULTS.md (the side-by-side section)."""
from __future__ import annotations

import math
from pathlib import Path

from . import MODES
from .reasons import cell

COLORS = {"local": "#7f7f7f", "2pc": "#1f77b4", "co": "#2ca02c", "client": "#d62728"}
BEGIN = "<!-- side-by-side:generated:begin -->"
END = "<!-- side-by-side:generated:end -->"

# sweep name -> (x label, [(point, x value)])
SWEEP_GROUPS = {
    "micro_N": ("N (rows per table; S=2 R=6 W=6 P=0.5 K=0)",
                [("N=1000", 1000), ("N=10000", 10000), ("default", 100000)], True),
    "micro_K": ("K (Zipf skew; N=100000)", [("default", 0.0), ("K=0.8", 0.8), ("K=0.99", 0.99)], False),
    "micro_S": ("S (sub-transactions, half on PostgreSQL)", [("default", 2), ("S=3", 3), ("S=4", 4)], False),
    "micro_mix": ("W (updates per sub-transaction; R + W = 12)",
                  [("R=12:W=0", 0), ("R=10:W=2", 2), ("default", 6)], False),
}
BAR_GROUPS = {
    "micro_points": ("microbenchmark points",
                     ["default", "S=1:P=0", "S=1:P=1", "R=12:W=0", "R=12:W=0:P=0"]),
    "tpcc": ("TPC-C subset (new-order + payment)", ["W=2", "W=4"]),
}


def _f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _get(summary, exp, point, mode):
    for s in summary:
        if s["experiment"] == exp and s["point"] == point and s["mode"] == mode:
            return s
    return None


def plots(micro: list[dict], tpcc: list[dict], outdir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outdir.mkdir(parents=True, exist_ok=True)
    made = []
    for name, (xlabel, pts, logx) in SWEEP_GROUPS.items():
        have = [(p, x) for p, x in pts if _get(micro, "micro", p, "2pc")]
        if len(have) < 2:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
        for mode in MODES:
            xs, ys, rs = [], [], []
            for p, x in have:
                s = _get(micro, "micro", p, mode)
                if s:
                    xs.append(x)
                    ys.append(_f(s["tps_median"]))
                    rs.append(_f(s["ratio_to_2pc"]))
            a1.plot(xs, ys, marker="o", label=mode, color=COLORS[mode])
            a2.plot(xs, rs, marker="o", label=mode, color=COLORS[mode])
        for a in (a1, a2):
            a.set_xlabel(xlabel)
            if logx:
                a.set_xscale("log")
            a.grid(alpha=0.3)
        a1.set_ylabel("committed global transactions / s (median)")
        a2.set_ylabel("throughput / 2pc (same repetition, median)")
        a2.axhline(1.0, color="k", lw=0.5)
        a1.legend()
        fig.suptitle(f"microbenchmark sweep: {name[6:]}")
        fig.tight_layout()
        path = outdir / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
    for name, (title, pts) in BAR_GROUPS.items():
        data = micro if name.startswith("micro") else tpcc
        exp = "micro" if name.startswith("micro") else "tpcc"
        have = [p for p in pts if _get(data, exp, p, "2pc")]
        if not have:
            continue
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
        width = 0.2
        for i, mode in enumerate(MODES):
            xs = [j + (i - 1.5) * width for j in range(len(have))]
            ys = [_f((_get(data, exp, p, mode) or {}).get("tps_median")) for p in have]
            ab = [100 * _f((_get(data, exp, p, mode) or {}).get("abort_rate")) for p in have]
            a1.bar(xs, ys, width, label=mode, color=COLORS[mode])
            a2.bar(xs, ab, width, label=mode, color=COLORS[mode])
        for a in (a1, a2):
            a.set_xticks(range(len(have)))
            a.set_xticklabels(have, fontsize=8)
            a.grid(alpha=0.3, axis="y")
        a1.set_ylabel("committed global transactions / s (median)")
        a2.set_ylabel("aborted attempts (%)")
        a1.legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        path = outdir / f"{name}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
    return made


def table(summary: list[dict], exp: str) -> str:
    lines = ["| point | mode | tx/s (median) | / 2pc | p50 ms | p99 ms | aborts | CPU ms/tx pg/my/coord/clients | abort reasons (pooled counts) |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for s in summary:
        if s["experiment"] != exp:
            continue
        reasons = cell(s["reasons"], 110)
        chk = "" if s.get("checks") in ("", "ok", None) else f" (checks: {s['checks']})"
        lines.append(f"| {s['point']} | {s['mode']} | {_f(s['tps_median']):.1f} | {_f(s['ratio_to_2pc']):.3f} | "
                     f"{_f(s['p50_ms_median']):.1f} | {_f(s['p99_ms_median']):.1f} | "
                     f"{100 * _f(s['abort_rate']):.2f} % | {s.get('cpu_ms_per_tx', '')} | {reasons}{chk} |")
    return "\n".join(lines)


def _ratio(summary, exp, point, a, b):
    sa, sb = _get(summary, exp, point, a), _get(summary, exp, point, b)
    if not sa or not sb or not _f(sb["tps_median"]):
        return float("nan")
    return _f(sa["tps_median"]) / _f(sb["tps_median"])


def targets(micro: list[dict], tpcc: list[dict]) -> str:
    rows = ["| target | measured | met? |", "|---|---|---|"]

    def add(name, value, ok, fmt="{:.3f}"):
        v = "n/a" if isinstance(value, float) and math.isnan(value) else (fmt.format(value) if not isinstance(value, str) else value)
        rows.append(f"| {name} | {v} | {'n/a' if v == 'n/a' else ('yes' if ok else '**no**')} |")
    d = _get(micro, "micro", "default", "co")
    r = _f(d["ratio_to_2pc"]) if d else float("nan")
    add("microbenchmark default: co >= 0.97 x 2pc", r, r >= 0.97)
    for W in ("W=2", "W=4"):
        t = _get(tpcc, "tpcc", W, "co")
        r = _f(t["ratio_to_2pc"]) if t else float("nan")
        add(f"TPC-C {W}: co >= 0.95 x 2pc", r, r >= 0.95)
    r = _ratio(micro, "micro", "default", "co", "client")
    add("microbenchmark default: co >= 1.25 x client mode", r, r >= 1.25)
    for W in ("W=2", "W=4"):
        r = _ratio(tpcc, "tpcc", W, "co", "client")
        add(f"TPC-C {W}: co >= 1.25 x client mode", r, r >= 1.25)
    for exp, data, pts in (("micro", micro, ["default", "R=12:W=0", "K=0.99"]), ("tpcc", tpcc, ["W=2", "W=4"])):
        for p in pts:
            c, s = _get(data, exp, p, "co"), _get(data, exp, p, "client")
            if c and s:
                add(f"{exp} {p}: co abort rate <= client mode's", f"{100 * _f(c['abort_rate']):.2f} % vs {100 * _f(s['abort_rate']):.2f} %",
                    _f(c["abort_rate"]) <= _f(s["abort_rate"]))
    r = _ratio(micro, "micro", "R=12:W=0:P=0", "co", "client")
    add("read-only MariaDB branches (S=2, P=0, R=12, W=0): co >= 1.3 x client mode's slot write", r, r >= 1.3)
    return "\n".join(rows)


def markdown(micro, tpcc, meta: dict, plot_paths: list[Path], root: Path) -> str:
    m = meta.get("machine", {})
    out = [BEGIN, "",
           f"Generated by `bench/run_all.py` on {meta.get('date', '?')} (UTC); "
           f"measuring time {meta.get('elapsed_min', '?')} min.",
           "",
           "Machine: " + ", ".join(f"{k} {v}" for k, v in m.items() if k != "loadavg") + ".",
           f"Load average before / after: {meta.get('load_before', '?')} / {meta.get('load_after', '?')}.",
           "",
           "Command:", "", "    " + meta.get("command", "?"), "",
           f"Each run: {meta.get('clients')} client processes (microbenchmark; TPC-C: "
           f"{meta.get('tpcc_cpw', 2)} per warehouse), {meta.get('warmup')} s warm-up, "
           f"{meta.get('seconds')} s measured; {meta.get('reps')} repetitions per point, the four modes "
           "interleaved (order rotated each repetition); medians over repetitions; ratio to 2pc = median "
           "of per-repetition ratios (each against the 2pc run of the same repetition). Durability on: "
           "PostgreSQL fsync + synchronous_commit on, InnoDB flush at commit = 1, coordinator decision "
           "log SQLite synchronous=FULL. Raw rows: `bench/results/*_runs.csv`, medians and ratios: "
           "`bench/results/*_summary.csv`.", "",
           "### Targets", "", targets(micro, tpcc), "",
           "### Microbenchmark", "",
           "Defaults S=2, R=6, W=6, P=0.5 (one PostgreSQL and one MariaDB sub-transaction), "
           "N=100000, K=0 (uniform). Point names give what differs from the defaults.", "",
           table(micro, "micro"), "",
           "### TPC-C subset", "", table(tpcc, "tpcc"), "",
           "### Plots", ""]
    for p in plot_paths:
        out.append(f"![{p.stem}]({p.relative_to(root / 'bench').as_posix()})")
    out += ["", END]
    return "\n".join(out)


def write_section(results_md: Path, text: str, header: str, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replaces only the generated block between `markers` (appends the section, under
    `header`, if absent)."""
    begin, end = markers
    cur = results_md.read_text() if results_md.exists() else "# Benchmark results\n"
    if begin in cur and end in cur:
        a, b = cur.index(begin), cur.index(end) + len(end)
        cur = cur[:a] + text + cur[b:]
    else:
        cur = cur.rstrip("\n") + "\n\n" + header + "\n\n" + text + "\n"
    results_md.write_text(cur)

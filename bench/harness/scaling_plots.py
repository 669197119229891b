"""PNG pictures of the scaling study (experiment `scaling`, points in scaling.py), one per
sweep: scaling_S.png, scaling_clients.png, scaling_ro.png. Each has three panels against
the swept value, one line per mode: throughput (median of the slices, bars: its 95 %
bootstrap interval), throughput / 2pc (median of per-round ratios, bars: its interval;
the paired figure that a shared machine's drift does not move), and p99 latency (median of
the slices' p99). Drawn from the slices summary CSV (slices.SUMMARY_FIELDS); run_all.py
calls draw() after each run and with --report-only, or alone on an existing summary:

  /var/cache/cotx/venv/bin/python -m bench.harness.scaling_plots bench/results/slices_summary.csv --out bench/plots
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from . import scaling
from .report import COLORS

FILES = {"S": "scaling_S.png", "clients": "scaling_clients.png", "RO": "scaling_ro.png"}


def _f(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def series(summary: list[dict], key: str) -> dict[str, list[dict]]:
    """mode -> the sweep's points in that mode, by swept value: rows of the study whose other
    two coordinates are at the default (the default point serves all three sweeps)."""
    out: dict[str, list[dict]] = {}
    for s in summary:
        if s.get("experiment") != scaling.EXPERIMENT:
            continue
        c = scaling.parse_params(s.get("params", ""))
        if c[key] is None or any(c[k] != v for k, v in scaling.DEFAULT.items() if k != key):
            continue
        out.setdefault(s["mode"], []).append(dict(s, x=c[key]))
    for rows in out.values():
        rows.sort(key=lambda r: r["x"])
    return out


def _bars(rows, m, lo, hi):
    ys = [_f(r[m]) for r in rows]
    los = [_f(r[lo]) for r in rows]
    his = [_f(r[hi]) for r in rows]
    # matplotlib wants non-negative distances; an undefined interval draws no bar.
    err = [[max(0.0, y - a) if a == a else 0.0 for y, a in zip(ys, los)],
           [max(0.0, b - y) if b == b else 0.0 for y, b in zip(ys, his)]]
    return ys, err


def draw(summary: list[dict], outdir: Path) -> list[Path]:
    """One PNG per sweep that has at least two swept values; returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    for key, fname in FILES.items():
        per_mode = series(summary, key)
        if len({r["x"] for rows in per_mode.values() for r in rows}) < 2:
            continue
        outdir.mkdir(parents=True, exist_ok=True)
        fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(14, 4))
        modes = [m for m in scaling.MODES if m in per_mode] + [m for m in per_mode if m not in scaling.MODES]
        for mode in modes:
            rows = per_mode[mode]
            xs = [r["x"] for r in rows]
            color = COLORS.get(mode.partition(":")[0])
            ys, err = _bars(rows, "tps_median", "tps_lo", "tps_hi")
            a1.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mode, color=color)
            if mode != "2pc":
                ys, err = _bars(rows, "ratio", "ratio_lo", "ratio_hi")
                a2.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=mode, color=color)
            a3.plot(xs, [_f(r["p99_ms"]) for r in rows], marker="o", label=mode, color=color)
        for a in (a1, a2, a3):
            a.set_xlabel(scaling.LABELS[key])
            if key == "clients":
                a.set_xscale("log", base=2)
            a.set_xticks(scaling.SWEEPS[key])
            a.set_xticklabels([str(v) for v in scaling.SWEEPS[key]])
            a.grid(alpha=0.3)
        a1.set_ylabel("committed global transactions / s\n(median, 95 % CI)")
        a2.set_ylabel("throughput / 2pc, same round\n(median, 95 % CI)")
        a2.axhline(1.0, color="k", lw=0.5)
        a3.set_ylabel("p99 latency, ms (median of slices)")
        a1.set_ylim(bottom=0)
        a3.set_ylim(bottom=0)
        a1.legend()
        others = ", ".join(f"{k}={v}{'%' if k == 'RO' else ''}" for k, v in scaling.DEFAULT.items() if k != key)
        fig.suptitle(f"scaling: {key} swept ({others}; R=6 W=6 P=0.5 K=0)")
        fig.tight_layout()
        path = outdir / fname
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the scaling study's PNGs from a slices summary CSV")
    ap.add_argument("summary", type=Path, help="slices_summary.csv written by bench/run_all.py")
    ap.add_argument("--out", type=Path, required=True, help="directory for scaling_*.png")
    a = ap.parse_args(argv)
    with open(a.summary, newline="") as f:
        summary = list(csv.DictReader(f))
    made = draw(summary, a.out)
    for p in made:
        print(p)
    if not made:
        print(f"no sweep of experiment {scaling.EXPERIMENT} with two values or more in {a.summary}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

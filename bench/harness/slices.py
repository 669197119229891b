"""Measurements meant to be trusted on a small shared machine: a quiet-machine check before
each experiment, many short slices per mode in ABBA order (the mode order reversed every
round, so a drift hits every mode alike), one unrecorded warm-up slice per mode before the
first round (the first run after loading data is pathological), medians with bootstrap
95 % confidence intervals on per-round ratios against a baseline mode, and the servers'
CPU per committed transaction beside throughput (far less noisy than throughput when the
machine is shared).

A ratio whose interval contains 1.0 is reported as "no difference shown".
"""
from __future__ import annotations

import csv
import os
import random
import re
import statistics
import time
from pathlib import Path

from . import canonical, flushes, jta
from .core import log
from .loadgen import run_slice
from .reasons import pool as pool_reasons

BOOTSTRAP = 2000


# --- is the machine quiet? -------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[str, int, float]]:
    out = {}
    tck = os.sysconf("SC_CLK_TCK")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
            name = raw[raw.index("(") + 1:raw.rindex(")")]
            f = raw.rsplit(")", 1)[1].split()
            out[int(d.name)] = (name, int(f[1]), (int(f[11]) + int(f[12])) / tck)
        except (OSError, ValueError, IndexError):
            pass
    return out


def _ours(table, root: int) -> set[int]:
    mine, grew = {root}, True
    while grew:
        grew = False
        for pid, (_, ppid, _) in table.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return mine


def quiet_check(sample_s: float = 2.0, max_load_per_core: float = 0.5, max_proc_pct: float = 15.0,
                use_load: bool = True) -> dict:
    """Load average and the top CPU consumers that are not this process or its children
    (servers started by the harness are its children), sampled over `sample_s`. Between
    experiments use_load=False: the load average then still carries our own last minute."""
    t0 = _proc_table()
    time.sleep(sample_s)
    t1 = _proc_table()
    mine = _ours(t1, os.getpid())
    busy = []
    for pid, (name, _, cpu) in t1.items():
        if pid in mine or pid not in t0:
            continue
        pct = 100.0 * (cpu - t0[pid][2]) / sample_s
        if pct >= 1.0:
            busy.append((pct, name, pid))
    busy.sort(reverse=True)
    load = os.getloadavg()
    cores = os.cpu_count() or 1
    why = []
    if use_load and load[0] > max_load_per_core * cores:
        why.append(f"load average {load[0]:.2f} > {max_load_per_core * cores:.1f}")
    hot = [b for b in busy if b[0] >= max_proc_pct]
    if hot:
        why.append("busy: " + ", ".join(f"{n}({p}) {c:.0f}%" for c, n, p in hot[:5]))
    return {"loadavg": " ".join(f"{x:.2f}" for x in load),
            "top": "; ".join(f"{n}({p}) {c:.0f}%" for c, n, p in busy[:5]) or "-",
            "quiet": not why, "why": "; ".join(why)}


def require_quiet(force: bool, label: str) -> dict:
    q = quiet_check()
    if q["quiet"]:
        log(f"quiet check ({label}): ok, load {q['loadavg']}, top others: {q['top']}")
    elif force:
        log("!" * 70 + f"\nQUIET CHECK FAILED ({label}): {q['why']} — running anyway (--force); "
            "the results say so\n" + "!" * 70)
    else:
        raise SystemExit(f"quiet check failed ({label}): {q['why']}\n"
                         "Numbers from a busy machine are noise. Stop the other work, or pass --force "
                         "(the results will record the failed check).")
    return q


# --- slices ---------------------------------------------------------------------------------
FLUSH_FIELDS = [f"{k}_per_commit" for k in flushes.COUNTERS]
SLICE_FIELDS = ["experiment", "point", "params", "round", "order", "mode", "clients", "seconds", "commits",
                "tps", "attempts", "aborts", "abort_rate", "reasons", "p50_ms", "p99_ms", "cpu_ms_pg",
                "cpu_ms_my", "cpu_ms_coord", "cpu_ms_server", "cpu_ms_driver", "driver_cpu_share",
                "server_cpu_util", "client_branches", "enforcement", "check", "errors", "started_utc", "cpu_ms_store",
                # Open loop (--rate) and the flushes per commit (flushes.py); empty otherwise.
                "rate", "arrivals", "missed", "start_lag_p99_ms"] + FLUSH_FIELDS


def variant_log(attempt_log: Path | None, mode: str) -> Path | None:
    """The attempt log of a mode: a variant "base:label" writes its own file (NAME_label.jsonl
    beside NAME.jsonl), so that a breakdown never mixes a lever with its control."""
    label = mode.partition(":")[2]
    if attempt_log is None or not label:
        return attempt_log
    return attempt_log.with_name(f"{attempt_log.stem}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}{attempt_log.suffix}")


def run_point(env, experiment: str, point: str, params: dict, workload_args: list[str], modes: list[str], *,
              slices: int, warmup: float, seconds: float, clients: int, csv_path: Path,
              extra: dict | None = None, check=None, attempt_log: Path | None = None,
              quiet: dict | None = None, switch: dict | None = None, rate: float | None = None) -> list[dict]:
    """Warm-up slice per mode, then `slices` rounds over the modes, ABBA order. extra[mode]:
    extra driver arguments (levers that are client-side). A mode may be a variant
    "base:label" (e.g. "co:acr=ON"): the servers, the daemon and the driver run `base`, and
    switch[mode](env) applies the variant's server settings after the mode switch. Modes
    whose driver says `skipped` (dip without support) are dropped with a log line. The
    mode switch (env.set_mode) restarts the daemon when the enforcement changes (none for
    2pc and local, engine for co and dip, client for client); after each slice the daemon
    must still say so (else the slice's check says what it said). `rate`: every slice in the
    driver's open loop at that many transactions per second (CPU per transaction at equal
    throughput); a slice whose mode did not keep up says how many arrivals it missed."""
    extra = extra or {}
    switch = switch or {}
    modes = [canonical(m) for m in modes]
    extra = {canonical(k): v for k, v in extra.items()}
    switch = {canonical(k): v for k, v in switch.items()}

    def enter(mode):
        base = mode.split(":")[0]
        env.set_mode(base)
        if mode in switch:
            switch[mode](env)
        return base

    def drv(mode):
        # The driver runs the base mode; a variant base:jta also picks the Narayana driver.
        return mode if jta.is_jta(mode) else mode.split(":")[0]

    env.vacuum()
    for mode in list(modes):
        base = enter(mode)
        r = run_slice(env, drv(mode), workload_args, clients=clients, warmup=warmup, seconds=max(1.0, seconds / 2),
                      seed=999, extra=extra.get(mode), rate=rate)
        if r.get("skipped"):
            log(f"[{experiment} {point}] {mode}: skipped: {r['skipped']}")
            modes.remove(mode)
        elif r.get("error") or r.get("errors"):
            log(f"[{experiment} {point}] {mode}: warm-up error: {r.get('error') or r.get('errors')}")
        env.leftovers()
    rows = []
    n = 0
    for rnd in range(slices):
        order = modes if rnd % 2 == 0 else modes[::-1]
        for pos, mode in enumerate(order):
            base = enter(mode)
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            n += 1
            r = run_slice(env, drv(mode), workload_args, clients=clients, warmup=warmup, seconds=seconds,
                          seed=rnd * 7919 + pos + 1, extra=extra.get(mode), attempt_log=variant_log(attempt_log, mode),
                          rate=rate)
            left = env.leftovers()
            chk = check(env) if check else ""
            if left != (0, 0):
                chk = (chk + "; " if chk else "") + f"left prepared {left[0]}/{left[1]}"
            seen, bad = env.enforcement_seen(base)
            if bad:
                chk = (chk + "; " if chk and chk != "ok" else "") + bad
            att = int(r.get("attempts") or 0)
            row = {"experiment": experiment, "point": point,
                   "params": " ".join(f"{k}={v}" for k, v in params.items()), "round": rnd + 1,
                   "order": pos + 1, "mode": mode, "clients": clients, "seconds": seconds,
                   "commits": r.get("commits", 0), "tps": r.get("tps", 0.0), "attempts": att,
                   "aborts": r.get("aborts", 0), "abort_rate": (int(r.get("aborts") or 0) / att) if att else 0.0,
                   "reasons": ";".join(f"{k}={v}" for k, v in sorted((r.get("reasons") or {}).items(), key=lambda kv: -kv[1])),
                   "p50_ms": r.get("p50_ms"), "p99_ms": r.get("p99_ms"),
                   "client_branches": r.get("client_branches", 0), "enforcement": seen,
                   "check": chk, "errors": " | ".join(r.get("errors") or ([r["error"]] if r.get("error") else []))[:500],
                   "started_utc": started}
            for k in ("cpu_ms_pg", "cpu_ms_my", "cpu_ms_coord", "cpu_ms_store", "cpu_ms_server", "cpu_ms_driver",
                      "driver_cpu_share", "server_cpu_util", "rate", "arrivals", "missed", "start_lag_p99_ms",
                      *FLUSH_FIELDS):
                row[k] = r.get(k)
            rows.append(row)
            log(f"[{experiment} {point}] round {rnd + 1}/{slices} {mode:5s} {float(row['tps']):8.1f} tx/s  "
                f"aborts {row['abort_rate']:6.2%}  server {float(row['cpu_ms_server'] or 0):5.2f} ms/tx  "
                f"driver {100 * float(row['driver_cpu_share'] or 0):4.1f}%  {row['reasons'][:60]}"
                + (f"  missed {row['missed']} of {row['arrivals']} arrivals" if row.get("missed") else "")
                + (f"  check: {chk}" if chk not in ("", "ok") else "") + (f"  ERR {row['errors'][:120]}" if row["errors"] else ""))
    new = not csv_path.exists()
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SLICE_FIELDS + ["quiet"], extrasaction="ignore")
        if new:
            w.writeheader()
        for row in rows:
            w.writerow({**{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()},
                        "quiet": "" if quiet is None else ("ok" if quiet["quiet"] else "NOT QUIET: " + quiet["why"])})
    return rows


# --- statistics ------------------------------------------------------------------------------
def _f(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def bootstrap(xs: list, stat, seed: int = 7) -> tuple[float, float, float]:
    """stat(xs) and a 95 % percentile-bootstrap interval of it (resampling the items of xs;
    resamples whose statistic is undefined, nan, are left out)."""
    if not xs:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    vals = sorted(v for v in (stat(rng.choices(xs, k=len(xs))) for _ in range(BOOTSTRAP)) if v == v)
    if not vals:
        return stat(xs), float("nan"), float("nan")
    return stat(xs), vals[int(0.025 * len(vals))], vals[int(0.975 * len(vals)) - 1]


def bootstrap_median(xs: list[float], seed: int = 7) -> tuple[float, float, float]:
    """Median and a 95 % percentile-bootstrap interval of the median."""
    return bootstrap([x for x in xs if x == x], statistics.median, seed)


def per_round(rows, exp, point, mode, key) -> dict[int, float]:
    return {int(r["round"]): _f(r[key]) for r in rows
            if r["experiment"] == exp and r["point"] == point and r["mode"] == mode and not r.get("errors")}


def pair_ratio(rows, exp, point, a, b, key="tps") -> tuple[float, float, float]:
    """Median of per-round ratios a/b with its bootstrap interval."""
    ra, rb = per_round(rows, exp, point, a, key), per_round(rows, exp, point, b, key)
    return bootstrap_median([ra[k] / rb[k] for k in ra if rb.get(k)])


def rate_ratio(rows, exp, point, a, b, num="aborts", den="attempts") -> tuple[float, float, float]:
    """Ratio of pooled rates, (sum num / sum den of mode a) / (the same of mode b), with a
    bootstrap interval resampling whole rounds (a round's slices of a and b together, so the
    pairing of the ABBA order is kept). Pooled, not a median of per-round ratios: a round
    in which b aborted nothing has no ratio, but still counts. inf when b's pooled rate is 0."""
    na, da = per_round(rows, exp, point, a, num), per_round(rows, exp, point, a, den)
    nb, db = per_round(rows, exp, point, b, num), per_round(rows, exp, point, b, den)
    rounds = [(na[k], da[k], nb[k], db[k]) for k in na if k in da and k in nb and k in db]

    def ratio(rs):
        ra, rb = sum(r[1] for r in rs), sum(r[3] for r in rs)
        if not ra or not rb:
            return float("nan")
        pa, pb = sum(r[0] for r in rs) / ra, sum(r[2] for r in rs) / rb
        return pa / pb if pb else (float("inf") if pa else float("nan"))
    return bootstrap(rounds, ratio)


def verdict(m: float, lo: float, hi: float) -> str:
    if m != m:
        return "n/a"
    if lo <= 1.0 <= hi:
        return "no difference shown"
    return "higher" if lo > 1.0 else "lower"


SUMMARY_FIELDS = ["experiment", "point", "params", "mode", "slices", "tps_median", "tps_lo", "tps_hi",
                  "ratio", "ratio_lo", "ratio_hi", "ratio_verdict", "cpu_ms_server", "cpu_ratio", "cpu_ratio_lo",
                  "cpu_ratio_hi", "cpu_ms_pg", "cpu_ms_my", "cpu_ms_coord", "driver_cpu_share", "abort_rate",
                  "abort_ratio", "abort_ratio_lo", "abort_ratio_hi", "p50_ms", "p99_ms", "reasons", "checks", "errors",
                  "cpu_ms_store", "rate", "missed"] + FLUSH_FIELDS


def summarize(rows: list[dict], base: str = "2pc") -> list[dict]:
    out, keys = [], []
    for r in rows:
        if (r["experiment"], r["point"]) not in keys:
            keys.append((r["experiment"], r["point"]))
    for exp, point in keys:
        pr = [r for r in rows if r["experiment"] == exp and r["point"] == point]
        modes = list(dict.fromkeys(r["mode"] for r in pr))
        for mode in modes:
            mr = [r for r in pr if r["mode"] == mode]
            ok = [r for r in mr if not r.get("errors")]
            tps = bootstrap_median([_f(r["tps"]) for r in ok])
            ratio = pair_ratio(rows, exp, point, mode, base) if base in modes else (float("nan"),) * 3
            cpu = pair_ratio(rows, exp, point, mode, base, "cpu_ms_server") if base in modes else (float("nan"),) * 3
            abr = rate_ratio(rows, exp, point, mode, base) if base in modes else (float("nan"),) * 3
            att = sum(int(_f(r["attempts"]) or 0) for r in ok)
            ab = sum(int(_f(r["aborts"]) or 0) for r in ok)

            def med(key):
                xs = [_f(r[key]) for r in ok if r.get(key) not in (None, "")]
                xs = [x for x in xs if x == x]
                return statistics.median(xs) if xs else float("nan")
            out.append({"experiment": exp, "point": point, "params": mr[0]["params"], "mode": mode,
                        "slices": len(ok), "tps_median": tps[0], "tps_lo": tps[1], "tps_hi": tps[2],
                        "ratio": ratio[0], "ratio_lo": ratio[1], "ratio_hi": ratio[2],
                        "ratio_verdict": "baseline" if mode == base else verdict(*ratio),
                        "cpu_ms_server": med("cpu_ms_server"), "cpu_ratio": cpu[0], "cpu_ratio_lo": cpu[1],
                        "cpu_ratio_hi": cpu[2], "cpu_ms_pg": med("cpu_ms_pg"), "cpu_ms_my": med("cpu_ms_my"),
                        "cpu_ms_coord": med("cpu_ms_coord"), "cpu_ms_store": med("cpu_ms_store"), "driver_cpu_share": med("driver_cpu_share"),
                        "abort_rate": ab / att if att else 0.0, "abort_ratio": abr[0], "abort_ratio_lo": abr[1],
                        "abort_ratio_hi": abr[2], "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
                        "reasons": pool_reasons(ok),
                        "checks": ",".join(sorted({str(r.get("check") or "") for r in mr} - {""})) or "ok",
                        "errors": len(mr) - len(ok), "rate": mr[0].get("rate") or "",
                        "missed": sum(int(_f(r.get("missed")) or 0) for r in ok if r.get("missed") not in (None, "")),
                        **{k: med(k) for k in FLUSH_FIELDS}})
    return out


def write_csv(rows: list[dict], path: Path, fields: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})

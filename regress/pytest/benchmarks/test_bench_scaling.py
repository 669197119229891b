"""The scaling study's points and pictures (bench/harness/scaling.py, scaling_plots.py), no
servers: the sweeps share the default point, the params column reads back to the point's
coordinates, one PNG per sweep from a summary CSV, the module runnable alone."""
import csv
import subprocess
import sys
from pathlib import Path

from bench.harness import scaling, scaling_plots, slices
from bench.micro import micro

ROOT = Path(__file__).resolve().parents[3]


def test_points_share_the_default_and_fit_the_tables():
    pts = scaling.points()
    assert pts[0] == scaling.DEFAULT
    assert len(pts) == len({scaling.name(p) for p in pts}) == 8
    for key, values in scaling.SWEEPS.items():
        got = sorted(p[key] for p in pts if all(p[k] == v for k, v in scaling.DEFAULT.items() if k != key))
        assert got == values
    assert max(p["S"] for p in pts) <= micro.MAX_TABLES
    # S=5 at P=0.5: three branches on PostgreSQL, two on MariaDB, one session each per client
    assert scaling.connections_needed({"S": 5, "clients": 8, "RO": 0}, 0.5) == (24, 16)


def test_params_read_back():
    for pt in scaling.points():
        p = scaling.params(pt, dict(micro.DEFAULTS))
        text = " ".join(f"{k}={v}" for k, v in p.items())   # as slices.run_point writes it
        assert scaling.parse_params(text) == pt
    assert scaling.driver_args({"S": 2, "clients": 8, "RO": 50}) == ["--ro-share", "0.5"]
    assert scaling.driver_args(scaling.DEFAULT) == []


def summary_rows() -> list[dict]:
    out = []
    for pt in scaling.points():
        params = " ".join(f"{k}={v}" for k, v in scaling.params(pt, dict(micro.DEFAULTS)).items())
        for i, mode in enumerate(scaling.MODES):
            tps = 100.0 * (i + 1) / pt["S"]
            out.append({**dict.fromkeys(slices.SUMMARY_FIELDS, ""), "experiment": "scaling", "point": scaling.name(pt),
                        "params": params, "mode": mode, "tps_median": f"{tps}", "tps_lo": f"{tps * 0.9}",
                        "tps_hi": f"{tps * 1.1}", "ratio": f"{i + 1}", "ratio_lo": "nan", "ratio_hi": "nan",
                        "p99_ms": f"{pt['clients'] * 2}"})
    # another experiment's row with the same params must not leak into the pictures
    out.append({**out[0], "experiment": "micro", "tps_median": "1e9"})
    return out


def test_series_take_the_sweep_and_the_default_only():
    s = scaling_plots.series(summary_rows(), "clients")
    assert set(s) == set(scaling.MODES)
    assert [r["x"] for r in s["2pc"]] == [1, 8, 32, 64]
    assert all(float(r["tps_median"]) < 1e6 for r in s["2pc"])


def test_one_png_per_sweep(tmp_path):
    made = scaling_plots.draw(summary_rows(), tmp_path)
    assert sorted(p.name for p in made) == ["scaling_S.png", "scaling_clients.png", "scaling_ro.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in made)


def test_runs_alone_on_a_summary_csv(tmp_path):
    path = tmp_path / "slices_summary.csv"
    slices.write_csv(summary_rows(), path, slices.SUMMARY_FIELDS)
    r = subprocess.run([sys.executable, "-m", "bench.harness.scaling_plots", str(path), "--out", str(tmp_path / "p")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p" / "scaling_ro.png").exists()
    # a summary without the study: nothing drawn, said so
    with open(path, "w", newline="") as f:
        csv.writer(f).writerow(slices.SUMMARY_FIELDS)
    r = subprocess.run([sys.executable, "-m", "bench.harness.scaling_plots", str(path), "--out", str(tmp_path / "q")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no sweep" in r.stderr

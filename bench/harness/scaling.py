"""The points of the scaling study (experiment `scaling` of bench/experiments.py; its plots:
scaling_plots.py).

Three sweeps around one default point (the microbenchmark's default: S=2 R=6 W=6 P=0.5
K=0, 8 clients, no read-only transactions), one parameter at a time:
  S        branches per global transaction, 2, 3, 5 (round(S*P) of them on PostgreSQL, the
           rest on MariaDB; branch i on its own table mt<i> through its own session)
  clients  concurrent clients, 1, 8, 32, 64
  RO       share of read-only global transactions, 0, 50, 100 % (the driver's --ro-share:
           each branch keeps its R reads and drops its W updates)
each point in modes local, 2pc and co, interleaved like every other point (ABBA slices).
The default point belongs to all three sweeps and runs once.
"""
from __future__ import annotations

EXPERIMENT = "scaling"
MODES = ["2pc", "co", "local"]
DEFAULT = {"S": 2, "clients": 8, "RO": 0}
SWEEPS = {"S": [2, 3, 5], "clients": [1, 8, 32, 64], "RO": [0, 50, 100]}
# x-axis label of each sweep's picture
LABELS = {"S": "S (branches per global transaction, round(S/2) on PostgreSQL)",
          "clients": "clients (concurrent global transactions)",
          "RO": "read-only share of global transactions (%)"}


def points() -> list[dict]:
    """The default point first, then each sweep's other values, without repeats."""
    out = [dict(DEFAULT)]
    for key, values in SWEEPS.items():
        for v in values:
            pt = dict(DEFAULT, **{key: v})
            if pt not in out:
                out.append(pt)
    return out


def name(pt: dict) -> str:
    return f"S={pt['S']}:clients={pt['clients']}:RO={pt['RO']}%"


def params(pt: dict, micro_defaults: dict) -> dict:
    """The point's recorded parameters (the `params` column of the slice CSVs, which the
    plots read back): the microbenchmark's, the clients and the read-only share (0..1)."""
    return dict(micro_defaults, S=pt["S"], clients=pt["clients"], RO=pt["RO"] / 100)


def driver_args(pt: dict) -> list[str]:
    return ["--ro-share", str(pt["RO"] / 100)] if pt["RO"] else []


def parse_params(s: str) -> dict:
    """`S=2 R=6 ... clients=8 RO=0.5` (a summary row's params) -> {"S": 2, "clients": 8,
    "RO": 50}, the study's coordinates; None for a key that is missing."""
    kv = dict(x.split("=", 1) for x in s.split() if "=" in x)

    def num(k):
        try:
            return float(kv[k])
        except (KeyError, ValueError):
            return None
    S, c, ro = num("S"), num("clients"), num("RO")
    return {"S": None if S is None else int(S), "clients": None if c is None else int(c),
            "RO": None if ro is None else round(ro * 100)}


def slices_count(n_modes: int, slices: int) -> float:
    """Slices the study runs (with each point's unrecorded warm-up slice per mode, half a
    slice's length): for estimate()."""
    return len(points()) * n_modes * (slices + 0.5)


def connections_needed(pt: dict, P: float) -> tuple[int, int]:
    """(PostgreSQL, MariaDB) sessions the driver opens at a point: one per client and branch."""
    n_pg = int(pt["S"] * P + 0.5)
    return pt["clients"] * n_pg, pt["clients"] * (pt["S"] - n_pg)


# Sessions besides the driver's: the daemon's pool (2 per resource), the harness's own
# checks between slices, PostgreSQL's reserved superuser slots.
MARGIN = 10


def check_connections(env, pt: dict, P: float) -> None:
    """Refuses a point the servers could not serve (max_connections of the harness's
    servers: 120 on PostgreSQL, harness/cotest/servers.py, 200 on MariaDB), before its
    slices start rather than as a wall of connection errors in them."""
    pg, my = connections_needed(pt, P)
    pg_max = int(env.pg.sql("SHOW max_connections")[0][0])
    my_max = int(env.my.sql("SELECT @@max_connections")[0][0])
    if pg + MARGIN > pg_max or my + MARGIN > my_max:
        raise RuntimeError(f"scaling point {name(pt)} needs {pg} PostgreSQL and {my} MariaDB sessions; the servers "
                           f"allow {pg_max} and {my_max} ({MARGIN} kept for the daemon and the harness)")

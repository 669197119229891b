"""Side-by-side benchmark harness: one environment (PostgreSQL + pg_co, MariaDB +
mysql_co, the coordinator daemon), four modes on the same data, workloads plugged in.

  core.Env        servers, daemon (restarted with the mode's enforcement), mode switching,
                  interleaved repetitions, CSV, progress
  driver.Driver   runs one global transaction of sub-transactions in a mode
  report          medians, ratios to 2pc, PNG plots, markdown tables
  scaling         the scaling study's points (S, clients, read-only share);
  scaling_plots   its PNGs, one per sweep, from the slices summary CSV
"""
MODES = ("local", "2pc", "co", "client")
# The earlier name of mode client (Sonata's shims, now the product's client mode), still
# accepted on command lines.
ALIASES = {"shim": "client"}


def canonical(mode: str) -> str:
    """A mode (or a variant "base:label") with its base spelled as today: shim -> client."""
    base, sep, label = mode.partition(":")
    return ALIASES.get(base, base) + sep + label

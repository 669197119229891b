"""Side-by-side benchmark harness: one environment (PostgreSQL + pg_co, MariaDB +
mysql_co, the coordinator daemon), four modes on the same data, workloads plugged in.

  core.Env        servers, daemon, mode switching, interleaved repetitions, CSV, progress
  driver.Driver   runs one global transaction of sub-transactions in a mode
  report          medians, ratios to 2pc, PNG plots, markdown tables
"""
MODES = ("local", "2pc", "co", "shim")

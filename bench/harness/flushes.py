"""Flushes to stable storage, counted where they happen, so that a slice says what each
commit cost in syncs (loadgen.run_slice samples them at the driver's measure_start and
measure_end, as it samples CPU):

- pg_wal_syncs: PostgreSQL's WAL fsyncs, `pg_stat_wal.wal_sync` (PostgreSQL 18 moved them
  to `pg_stat_io`, object 'wal': its `fsyncs`). 0 when fsync is off (the server skips
  the call and the count). Backends publish these counters at most once a second, so a
  window of a few seconds is off by up to a second's worth at each end: measure with
  windows of 10 s or more for the record.
- my_log_fsyncs: MariaDB's redo log fsyncs: `Innodb_os_log_fsyncs` where the server has
  it (MySQL, MariaDB before 10.8); MariaDB 10.8 and later dropped it and count the redo
  log's fsyncs in `Innodb_data_fsyncs`, with the data files' (which only the page
  cleaner and checkpoints add). Measured on 10.11 with innodb_flush_log_at_trx_commit = 1:
  50 autocommit inserts 53, 50 XA transactions (prepare, commit) 100. Exact, global.
- store_syncs: the decision store's durable writes, `cotx_store_batches_total` of every
  daemon (one per group-committed batch); with the coordinator in the driver's process
  (`--coord inproc:`) the driver reports them itself.
- store_wal_syncs: with a PostgreSQL decision store, its own instance's WAL fsyncs.
"""
from __future__ import annotations

import psycopg
import pymysql
from cotest.coord import metric

COUNTERS = ("pg_wal_syncs", "my_log_fsyncs", "store_syncs", "store_wal_syncs")


def pg_wal_syncs(server) -> float:
    with server.connect() as c:
        try:
            return float(c.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0])
        except psycopg.errors.UndefinedColumn:
            return float(c.execute("SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'")
                         .fetchone()[0])


def my_log_fsyncs(server) -> float:
    got = dict(server.sql("SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_os_log_fsyncs', 'Innodb_data_fsyncs')"))
    return float(got.get("Innodb_os_log_fsyncs", got["Innodb_data_fsyncs"]))


def daemon_counter(d, name: str) -> float:
    """A counter of a daemon's /metrics (0 when absent)."""
    return metric(d, name, 0.0)


def snapshot(env) -> dict:
    """The counters so far. A counter that cannot be read is left out and its error kept
    under "errors": its slice then reports nothing rather than a wrong number."""
    out: dict = {"errors": []}
    daemons = [d for d in (getattr(env, "daemons", None) or [env.daemon]) if d.proc]
    reads = [("pg_wal_syncs", lambda: pg_wal_syncs(env.pg)),
             ("my_log_fsyncs", lambda: my_log_fsyncs(env.my)),
             ("store_syncs", lambda: sum(daemon_counter(d, "cotx_store_batches_total") for d in daemons))]
    if getattr(env, "store_pg", None) is not None and getattr(env, "store", "sqlite") != "sqlite":
        reads.append(("store_wal_syncs", lambda: pg_wal_syncs(env.store_pg)))
    for key, read in reads:
        try:
            out[key] = read()
        except (OSError, ValueError, KeyError, psycopg.Error, pymysql.Error) as e:
            out["errors"].append(f"{key}: {e}")
    return out


def per_commit(before: dict, after: dict, commits: int, in_process_store_syncs: float | None = None) -> dict:
    """The window's counts and counts per committed transaction, for the slice's result."""
    got: dict = {}
    for key in COUNTERS:
        if key == "store_syncs" and in_process_store_syncs is not None:
            n = in_process_store_syncs
        elif key in before and key in after:
            n = after[key] - before[key]
        else:
            continue
        got[key] = n
        got[f"{key}_per_commit"] = n / commits if commits else None
    errors = before.get("errors", []) + after.get("errors", [])
    if errors:
        got["flush_errors"] = "; ".join(errors)[:300]
    return got

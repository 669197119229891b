//! pg_co: commitment ordering for PostgreSQL two-phase commit.
//!
//! A thin layer: PostgreSQL hooks and SQL functions here; the decisions live in the
//! `pg_co_rules` crate, the reads of SSI internals in csrc/co_ssi.c. Design and rules:
//! docs/pg_co.md.

use pgrx::prelude::*;

mod commit_points;
mod gucs;
mod refusal;
mod shmem;
mod sql_api;
mod ssi_ffi;

::pgrx::pg_module_magic!();

extension_sql!(
    r#"
SELECT co.require_preload();

CREATE VIEW co.stats AS
SELECT
    max(value) FILTER (WHERE counter = 'checks_prepare')           AS checks_prepare,
    max(value) FILTER (WHERE counter = 'checks_commit')            AS checks_commit,
    max(value) FILTER (WHERE counter = 'refused_rule_a')           AS refused_rule_a,
    max(value) FILTER (WHERE counter = 'refused_summarized')       AS refused_summarized,
    max(value) FILTER (WHERE counter = 'refused_rule_b')           AS refused_rule_b,
    max(value) FILTER (WHERE counter = 'refused_rule_c')           AS refused_rule_c,
    max(value) FILTER (WHERE counter = 'refused_not_serializable') AS refused_not_serializable,
    max(value) FILTER (WHERE counter = 'refused_read_only')        AS refused_read_only,
    max(value) FILTER (WHERE counter = 'waits')                    AS waits,
    round(max(value) FILTER (WHERE counter = 'wait_time_us') / 1000.0, 3) AS wait_time_ms,
    round(max(value) FILTER (WHERE counter = 'check_time_ns') / 1e6, 3) AS check_time_ms
FROM co.stat_counters();

-- In-doubt transactions and the transactions they hold up.
CREATE VIEW co.in_doubt AS
SELECT p.gid, p.transaction AS xid, p.prepared, now() - p.prepared AS age, p.owner, p.database,
       b.peer_xid, b.peer_pid, b.peer_state, b.rule,
       CASE b.rule WHEN 'B' THEN 'peer must wait for this decision (rule B)'
                   WHEN 'A' THEN 'peer read data this one wrote: its PREPARE will be refused (rule A)' END AS effect
FROM pg_catalog.pg_prepared_xacts p
LEFT JOIN co.blocking_edges() b ON b.prepared_xid::text::xid = p.transaction;
"#,
    name = "views",
    requires = [sql_api::require_preload, sql_api::stat_counters, sql_api::blocking_edges]
);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::register();
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        // Loaded by CREATE EXTENSION or a function call in one backend only: rules would
        // run in some sessions and not others. Enforce nothing; the SQL functions say why.
        pgrx::warning!("pg_co is loaded without shared_preload_libraries: commitment ordering is NOT enforced; add pg_co to shared_preload_libraries and restart");
        return;
    }
    unsafe {
        shmem::install_hooks();
        commit_points::register();
    }
}

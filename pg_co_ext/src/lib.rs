//! pg_co: commitment ordering for PostgreSQL two-phase commit.
//!
//! A thin layer: PostgreSQL hooks and SQL functions here; the decisions live in the
//! `pg_co_rules` crate, the reads of SSI internals in csrc/co_ssi.c. Design and rules:
//! docs/pg_co.md.

use pgrx::prelude::*;

mod bounded_wait;
mod commit_points;
mod gids;
mod gucs;
mod read_only;
mod refusal;
mod shmem;
mod sql_api;
mod ssi_ffi;

::pgrx::pg_module_magic!();

extension_sql!(
    r#"
SELECT co.require_preload();

-- One column per counter, built from the counter list (src/shmem.rs COUNTERS).
DO $$ BEGIN EXECUTE 'CREATE VIEW co.stats AS ' || co.stats_view_sql(); END $$;

-- In-doubt transactions and the transactions they hold up.
CREATE VIEW co.in_doubt AS
SELECT p.gid, p.transaction AS xid, p.prepared, now() - p.prepared AS age, p.owner, p.database,
       b.peer_xid, b.peer_pid, b.peer_state, b.rule,
       CASE b.rule WHEN 'B' THEN 'peer must wait for this decision (rule B)'
                   WHEN 'A' THEN 'peer read data this one wrote: its PREPARE will be refused (rule A)' END AS effect
FROM pg_catalog.pg_prepared_xacts p
LEFT JOIN co.blocking_edges() b ON b.prepared_xid::text::xid = p.transaction;

-- Global decisions written inside a participant's commit (co.decide): 'c' commit,
-- 'a' abort (written by co.resolve when no decision committed).
CREATE TABLE co.decisions (
    gtid text PRIMARY KEY,
    outcome "char" NOT NULL CHECK (outcome IN ('c', 'a')),
    decided_at timestamptz NOT NULL DEFAULT now()
);

-- The outcome of global transaction $1: its committed decision, or abort recorded now.
-- The insert waits for an open co.decide of the same gtid (unique index), so an open
-- decision can never commit after this returned 'abort'. Only at READ COMMITTED: a
-- serializable snapshot cannot see a decision committed while it waited.
CREATE FUNCTION co.resolve(gtid text) RETURNS text LANGUAGE plpgsql VOLATILE AS $f$
#variable_conflict use_column
DECLARE o "char";
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'co.resolve must run at READ COMMITTED'
            USING ERRCODE = '25000', HINT = 'BEGIN ISOLATION LEVEL READ COMMITTED; SELECT co.resolve(...); COMMIT;';
    END IF;
    INSERT INTO co.decisions AS d (gtid, outcome) VALUES ($1, 'a')
    ON CONFLICT (gtid) DO UPDATE SET outcome = d.outcome
    RETURNING d.outcome INTO o;
    RETURN CASE o WHEN 'c' THEN 'commit' ELSE 'abort' END;
END
$f$;

-- Forgets finished decisions (every branch of those transactions is committed or rolled back).
CREATE FUNCTION co.forget(gtids text[]) RETURNS bigint LANGUAGE sql VOLATILE AS $f$
    WITH gone AS (DELETE FROM co.decisions WHERE gtid = ANY ($1) RETURNING 1) SELECT count(*) FROM gone
$f$;
"#,
    name = "views",
    requires = [sql_api::require_preload, sql_api::stat_counters, sql_api::stats_view_sql, sql_api::blocking_edges]
);

/// pg_co's shared-memory areas: shmem.rs's markers and counters, gids.rs's ring of gids,
/// read_only.rs's commit records. Listed here, above all three, so that shmem.rs (which
/// requests and attaches them) imports neither of the modules that use its `Area`.
static SHMEM_AREAS: [shmem::Area; 3] = [shmem::AREA, gids::AREA, read_only::AREA];

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::register();
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        // Loaded by CREATE EXTENSION or a function call in one backend only: rules would
        // run in some sessions and not others. Enforce nothing; the SQL functions say why.
        pgrx::warning!("pg_co is loaded without shared_preload_libraries: commitment ordering is NOT enforced; add pg_co to shared_preload_libraries and restart");
        return;
    }
    gucs::register_postmaster();
    unsafe {
        shmem::install_hooks(&SHMEM_AREAS);
        gids::install_hooks();
        commit_points::register();
    }
}

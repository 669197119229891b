//! The SQL surface added by CREATE EXTENSION pg_co (views are in lib.rs's extension_sql).

use crate::commit_points;
use crate::gucs;
use crate::refusal::{self, Refusal};
use crate::shmem;
use crate::ssi_ffi;
use pgrx::prelude::*;

fn require_preloaded() {
    if !shmem::attached() {
        ereport!(
            PgLogLevel::ERROR,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_co is not loaded through shared_preload_libraries: commitment ordering is NOT enforced",
            "Add pg_co to shared_preload_libraries in postgresql.conf and restart the server."
        );
    }
}

/// True when the library runs in every backend (preloaded); false means half-loaded.
#[pg_extern]
fn preloaded() -> bool {
    shmem::attached()
}

/// Called first by the extension script: CREATE EXTENSION fails loudly when half-loaded.
#[pg_extern]
fn require_preload() {
    require_preloaded();
}

#[pg_extern]
fn stat_counters() -> TableIterator<'static, (name!(counter, String), name!(value, i64))> {
    require_preloaded();
    TableIterator::new(shmem::read_counters().into_iter().map(|(n, v)| (n.to_string(), v)))
}

/// The query of the co.stats view (used once, by the extension script).
#[pg_extern]
fn stats_view_sql() -> String {
    format!("SELECT\n    {}\nFROM co.stat_counters()", shmem::stats_view_select())
}

#[pg_extern]
fn reset_stats() {
    require_preloaded();
    shmem::reset_counters();
}

/// rw edges between in-doubt transactions and unfinished ones. rule 'B': the peer wrote
/// what the prepared transaction read, so it waits (or is refused) until the decision;
/// rule 'A': the peer read what the prepared one wrote, so its PREPARE will be refused.
#[pg_extern]
fn blocking_edges() -> TableIterator<
    'static,
    (
        name!(prepared_xid, i64),
        name!(peer_xid, Option<i64>),
        name!(peer_pid, Option<i32>),
        name!(peer_state, String),
        name!(rule, String),
    ),
> {
    require_preloaded();
    let rows = ssi_ffi::prepared_edges().into_iter().map(|e| {
        (
            e.prepared_xid as i64,
            (e.peer.xid != 0).then_some(e.peer.xid as i64),
            (e.peer.pid != 0).then_some(e.peer.pid),
            pg_co_rules::state_name(pg_co_rules::classify(&e.peer)).to_string(),
            if e.prepared_is_reader { "B" } else { "A" }.to_string(),
        )
    });
    TableIterator::new(rows.collect::<Vec<_>>().into_iter())
}

/// Writes the commit decision of global transaction `gtid` into co.decisions in the
/// current transaction and makes its COMMIT the global decision point, checked as this
/// branch's prepare and commit at once (docs/pg_co.md). co.resolve of the same gtid waits
/// for this transaction (unique index), so it cannot decide abort while this one is open.
#[pg_extern(volatile, parallel_unsafe)]
fn decide(gtid: &str) {
    require_preloaded();
    if gucs::ENABLED.get() {
        if unsafe { pg_sys::XactIsoLevel } != pg_sys::XACT_SERIALIZABLE as i32 {
            refusal::raise(Refusal::DecisionNotSerializable);
        }
        if unsafe { pg_sys::XactReadOnly } {
            refusal::raise(Refusal::DecisionReadOnly);
        }
    }
    if !insert_decision(gtid) {
        refusal::raise(Refusal::AlreadyDecided(gtid.to_string()));
    }
    // The decision is this commit: it must be durable when COMMIT returns, whatever the
    // session's or server's synchronous_commit (other branches are committed on its word).
    // For this transaction only (GUC_ACTION_LOCAL), as set_config(..., true) does, without
    // a query.
    unsafe {
        pg_sys::set_config_option(
            c"synchronous_commit".as_ptr(),
            c"on".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            PgLogLevel::ERROR as i32,
            false,
        );
    }
    commit_points::mark_decision_point();
}

const INSERT_DECISION: &str =
    "INSERT INTO co.decisions (gtid, outcome) VALUES ($1, 'c') ON CONFLICT (gtid) DO NOTHING RETURNING true";

thread_local! {
    /// The decision row's INSERT, planned once per backend (SPI_keepplan): planning it at
    /// every co.decide was most of the function's cost (bench/RESULTS.md, "dip's latency
    /// at one client, step by step"). PostgreSQL's plan cache re-plans it when co.decisions
    /// changes (the extension dropped and created again).
    static INSERT_PLAN: std::cell::OnceCell<pgrx::spi::OwnedPreparedStatement> = const { std::cell::OnceCell::new() };
}

/// Inserts the commit decision of `gtid`; false when a decision of it is there already.
fn insert_decision(gtid: &str) -> bool {
    Spi::connect_mut(|client| {
        let inserted = INSERT_PLAN.with(|cell| {
            if cell.get().is_none() {
                let plan = client.prepare_mut(INSERT_DECISION, &[PgOid::BuiltIn(PgBuiltInOids::TEXTOID)])?.keep();
                let _ = cell.set(plan);
            }
            let plan = cell.get().expect("planned above");
            client.update(plan, Some(1), &[gtid.into()])?.first().get_one::<bool>()
        });
        Ok::<_, pgrx::spi::SpiError>(inserted?.unwrap_or(false))
    })
    .unwrap_or(false)
}

//! Settings (documented in docs/pg_co.md).

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum ConflictAction {
    #[name = c"abort"]
    Abort,
    #[name = c"wait"]
    Wait,
}

pub static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static OBSERVE_ONLY: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static CONFLICT_ACTION: GucSetting<ConflictAction> = GucSetting::<ConflictAction>::new(ConflictAction::Abort);
pub static REQUIRE_SERIALIZABLE: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static LOG_VETOES: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static RULE_C: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static RULE_C_READ_ONLY: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static RULE_S: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static COMMIT_ORDER_REPAIR: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static REFUSE_UPSERT_READS: GucSetting<bool> = GucSetting::<bool>::new(false);
/// 5 ms: an in-doubt blocker is usually that close to its decision (docs/pg_co.md, "Bounded wait").
pub static MAX_WAIT_MS: GucSetting<i32> = GucSetting::<i32>::new(5);
pub static TEST_PAUSE_MS: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static TEST_SKIP_MARKER: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static TEST_LAYOUT_SKEW: GucSetting<i32> = GucSetting::<i32>::new(0);

pub fn register() {
    GucRegistry::define_bool_guc(
        c"pg_co.enabled",
        c"Enforce commitment ordering at PREPARE TRANSACTION and COMMIT.",
        c"off restores PostgreSQL's own behaviour (for comparisons); 2PC is then atomic but not globally serializable.",
        &ENABLED,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.observe_only",
        c"Run every check but refuse nothing: count and log each would-be refusal.",
        c"For trying pg_co on a system that runs plain 2PC today: co.stats counts what would have been refused (observed_*), the server log names each with its conflicting transaction. Nothing is enforced, nothing waits.",
        &OBSERVE_ONLY,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"pg_co.conflict_action",
        c"What rule B does when an in-doubt transaction read data this one wrote: abort or wait.",
        c"wait blocks until the in-doubt transaction is committed or rolled back (bounded by lock_timeout) and checks again.",
        &CONFLICT_ACTION,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_co.max_wait",
        c"Rule B in abort mode: wait at most this many milliseconds for an in-doubt transaction's outcome, then refuse (0: refuse at once).",
        c"The refusal after the bound is the usual serialization failure. Wait mode ignores it: it waits until the decision or lock_timeout.",
        &MAX_WAIT_MS,
        0,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"pg_co.require_serializable",
        c"Refuse PREPARE TRANSACTION of transactions that are not SERIALIZABLE.",
        c"Only serializable transactions are tracked by SSI; without tracking no CO check is possible.",
        &REQUIRE_SERIALIZABLE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.log_vetoes",
        c"Log every refusal at LOG level, with the conflicting transaction.",
        c"",
        &LOG_VETOES,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.rule_c",
        c"Rule C: refuse a local COMMIT that missed the write of a 2PC transaction prepared before its snapshot.",
        c"",
        &RULE_C,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.rule_c_read_only",
        c"Rule C for READ ONLY readers: refuse a READ ONLY serializable COMMIT when a 2PC transaction prepared before its snapshot was committed after it.",
        c"PostgreSQL drops a READ ONLY reader's rw edges when the writer commits; this rule does without them. Needs pg_co.rule_c.",
        &RULE_C_READ_ONLY,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.rule_s",
        c"Rule S: refuse a local COMMIT that may close a cycle PostgreSQL's SSI cannot see because it summarized a concurrent reader.",
        c"PostgreSQL ignores the read locks of transactions it summarized (its pool of serializable transactions was full); a writer with an rw out-edge to a committed transaction is then refused (docs/pg_co.md, Rule S).",
        &RULE_S,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.commit_order_repair",
        c"At every serializable COMMIT, flag the committing transaction as PostgreSQL flags a pivot when an rw out-peer is past its commit check but not yet committed for SSI.",
        c"Such a peer can be visible to new snapshots before PostgreSQL's SSI numbers its commit after ours; without the flag a reader that saw the peer but not us reads our writes unrefused and closes a cycle (docs/pg_co.md, Commit-order repair).",
        &COMMIT_ORDER_REPAIR,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_co.refuse_upsert_reads",
        c"Refuse INSERT ... ON CONFLICT DO NOTHING and ON CONFLICT DO UPDATE ... WHERE in serializable transactions.",
        c"PostgreSQL takes no read lock on a conflicting row such an upsert leaves unchanged, so a write skew through it commits at SERIALIZABLE (docs/guarantees.md); on makes such statements an error instead.",
        &REFUSE_UPSERT_READS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_co.test_pause_after_check_ms",
        c"Test only: sleep this long after a passed check, widening the check-to-commit window.",
        c"",
        &TEST_PAUSE_MS,
        0,
        60_000,
        GucContext::Suset,
        GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_bool_guc(
        c"pg_co.test_skip_marker",
        c"Test only: do not mark a checked transaction, to show the race the marker closes.",
        c"",
        &TEST_SKIP_MARKER,
        GucContext::Suset,
        GucFlags::NO_SHOW_ALL,
    );
}

/// Settings read once by the postmaster; registered only while shared_preload_libraries is
/// processed (PostgreSQL refuses PGC_POSTMASTER settings from a library loaded later).
pub fn register_postmaster() {
    GucRegistry::define_int_guc(
        c"pg_co.test_layout_skew",
        c"Test only: pretend pg_co's SSI struct sizes differ by this many bytes, to show the start-up layout check refusing.",
        c"",
        &TEST_LAYOUT_SKEW,
        0,
        1024,
        GucContext::Postmaster,
        GucFlags::NO_SHOW_ALL,
    );
}

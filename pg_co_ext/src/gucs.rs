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
pub static CONFLICT_ACTION: GucSetting<ConflictAction> = GucSetting::<ConflictAction>::new(ConflictAction::Abort);
pub static REQUIRE_SERIALIZABLE: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static LOG_VETOES: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static CHECK_LOCAL_READERS: GucSetting<bool> = GucSetting::<bool>::new(true);
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
    GucRegistry::define_enum_guc(
        c"pg_co.conflict_action",
        c"What rule B does when an in-doubt transaction read data this one wrote: abort or wait.",
        c"wait blocks until the in-doubt transaction is committed or rolled back (bounded by lock_timeout) and checks again.",
        &CONFLICT_ACTION,
        GucContext::Userset,
        GucFlags::default(),
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
        c"pg_co.check_local_readers",
        c"Rule C: refuse a local COMMIT that missed the write of a 2PC transaction prepared before its snapshot.",
        c"",
        &CHECK_LOCAL_READERS,
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

//! pg_co's shared memory: counters, and the per-backend marker "this transaction passed
//! the CO check and is preparing / committing" that peers must treat as such until
//! PostgreSQL's own flags say so (docs/pg_co.md, "Atomic check").

use pg_co_rules::Marker;
use pgrx::pg_sys;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug)]
#[repr(usize)]
pub enum Counter {
    ChecksPrepare,
    ChecksCommit,
    RefusedRuleA,
    RefusedSummarized,
    RefusedRuleB,
    RefusedRuleC,
    RefusedNotSerializable,
    RefusedReadOnly,
    Waits,
    WaitMicros,
    CheckNanos,
    WaitTimeouts,
    ObservedRuleA,
    ObservedSummarized,
    ObservedRuleB,
    ObservedRuleC,
    ObservedNotSerializable,
    ObservedReadOnly,
    RefusedRuleS,
    ObservedRuleS,
}
/// Every counter: its name in co.stat_counters() and its column in the co.stats view (with
/// the unit conversion), the one list both are built from.
pub struct CounterDef {
    pub counter: Counter,
    pub name: &'static str,
    /// SQL of the co.stats column; {v} stands for the counter's value.
    pub column: &'static str,
}
const fn def(counter: Counter, name: &'static str, column: &'static str) -> CounterDef {
    CounterDef { counter, name, column }
}
pub const COUNTERS: [CounterDef; 20] = [
    def(Counter::ChecksPrepare, "checks_prepare", "{v} AS checks_prepare"),
    def(Counter::ChecksCommit, "checks_commit", "{v} AS checks_commit"),
    def(Counter::RefusedRuleA, "refused_rule_a", "{v} AS refused_rule_a"),
    def(Counter::RefusedSummarized, "refused_summarized", "{v} AS refused_summarized"),
    def(Counter::RefusedRuleB, "refused_rule_b", "{v} AS refused_rule_b"),
    def(Counter::RefusedRuleC, "refused_rule_c", "{v} AS refused_rule_c"),
    def(Counter::RefusedNotSerializable, "refused_not_serializable", "{v} AS refused_not_serializable"),
    def(Counter::RefusedReadOnly, "refused_read_only", "{v} AS refused_read_only"),
    def(Counter::Waits, "waits", "{v} AS waits"),
    def(Counter::WaitMicros, "wait_time_us", "round({v} / 1000.0, 3) AS wait_time_ms"),
    def(Counter::CheckNanos, "check_time_ns", "round({v} / 1e6, 3) AS check_time_ms"),
    def(Counter::WaitTimeouts, "wait_timeouts", "{v} AS wait_timeouts"),
    // pg_co.observe_only: what would have been refused, per reason (nothing was).
    def(Counter::ObservedRuleA, "observed_rule_a", "{v} AS observed_rule_a"),
    def(Counter::ObservedSummarized, "observed_summarized", "{v} AS observed_summarized"),
    def(Counter::ObservedRuleB, "observed_rule_b", "{v} AS observed_rule_b"),
    def(Counter::ObservedRuleC, "observed_rule_c", "{v} AS observed_rule_c"),
    def(Counter::ObservedNotSerializable, "observed_not_serializable", "{v} AS observed_not_serializable"),
    def(Counter::ObservedReadOnly, "observed_read_only", "{v} AS observed_read_only"),
    def(Counter::RefusedRuleS, "refused_rule_s", "{v} AS refused_rule_s"),
    def(Counter::ObservedRuleS, "observed_rule_s", "{v} AS observed_rule_s"),
];
// The enum and the list are in the same order: a counter's index is its discriminant.
const _: () = {
    let mut i = 0;
    while i < COUNTERS.len() {
        assert!(COUNTERS[i].counter as usize == i, "COUNTERS must list Counter variants in declaration order");
        i += 1;
    }
};

/// The select list of the co.stats view: one column per counter, in list order.
pub fn stats_view_select() -> String {
    COUNTERS
        .iter()
        .map(|d| {
            let v = format!("max(value) FILTER (WHERE counter = '{}')", d.name);
            d.column.replace("{v}", &v)
        })
        .collect::<Vec<_>>()
        .join(",\n    ")
}

#[repr(C)]
struct MarkerSlot {
    sxact: AtomicUsize,
    state: AtomicU32,
}

#[repr(C)]
struct Shared {
    counters: [AtomicU64; COUNTERS.len()],
    n_slots: u32,
    slots: [MarkerSlot; 0], // n_slots follow, indexed by pgprocno
}

static mut SHARED: *mut Shared = std::ptr::null_mut();
static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;
/// Every area of pg_co, handed over by _PG_init (lib.rs lists them: this module stays
/// below gids.rs and read_only.rs, which use its `Area`).
static mut AREAS: &[Area] = &[];

fn n_slots() -> usize {
    // Regular backends (clients, autovacuum, background workers, walsenders) have
    // pgprocno < MaxBackends; only they run transactions that reach a commit point.
    unsafe { pg_sys::MaxBackends as usize }
}

fn size() -> usize {
    std::mem::size_of::<Shared>() + n_slots() * std::mem::size_of::<MarkerSlot>()
}

/// Called from _PG_init while shared_preload_libraries is processed, with every area.
pub unsafe fn install_hooks(areas: &'static [Area]) {
    AREAS = areas;
    PREV_REQUEST = pg_sys::shmem_request_hook;
    pg_sys::shmem_request_hook = Some(request);
    PREV_STARTUP = pg_sys::shmem_startup_hook;
    pg_sys::shmem_startup_hook = Some(startup);
}

/// A shared-memory area of pg_co: its size is requested at preload; at startup it is
/// found or created (zeroed) under AddinShmemInitLock and handed to `attach` (with
/// whether it existed already). One pair of hooks serves them all.
pub struct Area {
    pub name: &'static std::ffi::CStr,
    pub size: fn() -> usize,
    pub attach: unsafe fn(*mut u8, bool),
}

/// This module's area: the markers and counters.
pub const AREA: Area = Area { name: c"pg_co", size, attach: attach_markers };

unsafe fn attach_markers(p: *mut u8, found: bool) {
    let p = p as *mut Shared;
    if !found {
        (*p).n_slots = n_slots() as u32;
    }
    SHARED = p;
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request() {
    if let Some(prev) = PREV_REQUEST {
        prev();
    }
    let areas = AREAS; // a copy of the slice reference, not a reference to the static
    for a in areas {
        pg_sys::RequestAddinShmemSpace((a.size)());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup() {
    if let Some(prev) = PREV_STARTUP {
        prev();
    }
    pg_sys::LWLockAcquire(crate::ssi_ffi::addin_shmem_init_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE);
    let areas = AREAS; // a copy of the slice reference, not a reference to the static
    for a in areas {
        let mut found = false;
        let p = pg_sys::ShmemInitStruct(a.name.as_ptr(), (a.size)(), &mut found) as *mut u8;
        if !found {
            std::ptr::write_bytes(p, 0, (a.size)());
        }
        (a.attach)(p, found);
    }
    pg_sys::LWLockRelease(crate::ssi_ffi::addin_shmem_init_lock());
    // pg_co reads SSI's structs with the layout of the headers it was compiled with; refuse
    // to start rather than misread them (an ERROR here stops the postmaster).
    if let Err(what) = crate::ssi_ffi::check_layout() {
        let built = crate::ssi_ffi::BUILT_FOR_VERSION_NUM;
        let running = {
            let v = pg_sys::GetConfigOption(c"server_version".as_ptr(), true, false);
            if v.is_null() {
                "unknown".into()
            } else {
                std::ffi::CStr::from_ptr(v).to_string_lossy().into_owned()
            }
        };
        use pgrx::pg_sys::errcodes::PgSqlErrorCode;
        use pgrx::pg_sys::panic::ErrorReport;
        ErrorReport::new(PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, format!("pg_co cannot run on this server: {what}"), "pg_co")
            .set_detail(format!("pg_co was built against the headers of PostgreSQL {}.{}; this server is {running}.", built / 10000, built % 10000))
            .set_hint("Rebuild pg_co against this server's own headers (its pg_config; scripts/build-pg-co.sh), or remove pg_co from shared_preload_libraries.")
            .report(pgrx::PgLogLevel::ERROR);
    }
}

fn shared() -> Option<&'static Shared> {
    unsafe { SHARED.as_ref() }
}

pub fn attached() -> bool {
    shared().is_some()
}

pub fn bump(c: Counter, by: u64) {
    if let Some(s) = shared() {
        s.counters[c as usize].fetch_add(by, Ordering::Relaxed);
    }
}

pub fn read_counters() -> Vec<(&'static str, i64)> {
    COUNTERS
        .iter()
        .map(|d| (d.name, shared().map_or(0, |s| s.counters[d.counter as usize].load(Ordering::Relaxed) as i64)))
        .collect()
}

pub fn reset_counters() {
    if let Some(s) = shared() {
        s.counters.iter().for_each(|c| c.store(0, Ordering::Relaxed));
    }
}

fn slot(pgprocno: i32) -> Option<&'static MarkerSlot> {
    let s = shared()?;
    if pgprocno < 0 || pgprocno as u32 >= s.n_slots {
        return None;
    }
    unsafe { Some(&*s.slots.as_ptr().add(pgprocno as usize)) }
}

fn my_pgprocno() -> i32 {
    crate::ssi_ffi::my_procno()
}

/// pg_co's marker of a peer transaction. Read under SerializableXactHashLock.
pub fn marker_of(sxact: *const c_void, pgprocno: i32) -> Option<Marker> {
    let slot = slot(pgprocno)?;
    if slot.sxact.load(Ordering::Acquire) != sxact as usize {
        return None;
    }
    match slot.state.load(Ordering::Acquire) {
        1 => Some(Marker::Preparing),
        2 => Some(Marker::Committing),
        _ => None,
    }
}

/// Marks this backend's transaction; call with SerializableXactHashLock held exclusive.
pub fn set_my_marker(sxact: *const c_void, m: Marker) {
    if let Some(slot) = slot(my_pgprocno()) {
        slot.sxact.store(sxact as usize, Ordering::Release);
        slot.state.store(if m == Marker::Preparing { 1 } else { 2 }, Ordering::Release);
    }
}

/// Cleared once PostgreSQL's own flags tell the same story (prepared, committed) or the
/// transaction aborted. A stale marker only makes peers more careful, never less.
pub fn clear_my_marker() {
    if let Some(slot) = slot(my_pgprocno()) {
        if slot.state.load(Ordering::Relaxed) != 0 {
            slot.state.store(0, Ordering::Release);
            slot.sxact.store(0, Ordering::Release);
        }
    }
}

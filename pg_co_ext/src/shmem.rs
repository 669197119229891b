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
}
pub const COUNTERS: [(Counter, &str); 11] = [
    (Counter::ChecksPrepare, "checks_prepare"),
    (Counter::ChecksCommit, "checks_commit"),
    (Counter::RefusedRuleA, "refused_rule_a"),
    (Counter::RefusedSummarized, "refused_summarized"),
    (Counter::RefusedRuleB, "refused_rule_b"),
    (Counter::RefusedRuleC, "refused_rule_c"),
    (Counter::RefusedNotSerializable, "refused_not_serializable"),
    (Counter::RefusedReadOnly, "refused_read_only"),
    (Counter::Waits, "waits"),
    (Counter::WaitMicros, "wait_time_us"),
    (Counter::CheckNanos, "check_time_ns"),
];

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

fn n_slots() -> usize {
    // Regular backends (clients, autovacuum, background workers, walsenders) have
    // pgprocno < MaxBackends; only they run transactions that reach a commit point.
    unsafe { pg_sys::MaxBackends as usize }
}

fn size() -> usize {
    std::mem::size_of::<Shared>() + n_slots() * std::mem::size_of::<MarkerSlot>()
}

/// Called from _PG_init while shared_preload_libraries is processed.
pub unsafe fn install_hooks() {
    PREV_REQUEST = pg_sys::shmem_request_hook;
    pg_sys::shmem_request_hook = Some(request);
    PREV_STARTUP = pg_sys::shmem_startup_hook;
    pg_sys::shmem_startup_hook = Some(startup);
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn request() {
    if let Some(prev) = PREV_REQUEST {
        prev();
    }
    pg_sys::RequestAddinShmemSpace(size());
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn startup() {
    if let Some(prev) = PREV_STARTUP {
        prev();
    }
    pg_sys::LWLockAcquire(crate::ssi_ffi::addin_shmem_init_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE);
    let mut found = false;
    let p = pg_sys::ShmemInitStruct(c"pg_co".as_ptr(), size(), &mut found) as *mut Shared;
    if !found {
        std::ptr::write_bytes(p as *mut u8, 0, size());
        (*p).n_slots = n_slots() as u32;
    }
    SHARED = p;
    pg_sys::LWLockRelease(crate::ssi_ffi::addin_shmem_init_lock());
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
        .map(|(c, name)| (*name, shared().map_or(0, |s| s.counters[*c as usize].load(Ordering::Relaxed) as i64)))
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
    unsafe { if pg_sys::MyProc.is_null() { -1 } else { (*pg_sys::MyProc).pgprocno } }
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

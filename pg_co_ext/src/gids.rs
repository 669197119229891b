//! Which gid a prepared transaction had, by xid, so that a refusal can name its blocker the
//! way the coordinator knows it (docs/pg_co.md, "Errors"). PREPARE TRANSACTION's gid is
//! seen in a ProcessUtility hook (csrc/co_gid_hook.c); it is recorded with the transaction's xid in a ring in
//! shared memory, also after COMMIT PREPARED (rules A and C name committed 2PC
//! transactions, which pg_prepared_xacts no longer shows). Only the error path reads it.

use pgrx::pg_sys;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// PostgreSQL's GIDSIZE (access/xact.h), with room for the terminating NUL.
const GID_MAX: usize = 200;
/// Recent prepares remembered; the oldest are overwritten (the SPI lookup of
/// pg_prepared_xacts still covers a transaction in doubt).
const RING: usize = 4096;

#[repr(C)]
struct Entry {
    /// Odd while the entry is written (a seqlock: readers retry or skip).
    seq: AtomicU32,
    xid: AtomicU32,
    len: AtomicU32,
    gid: [AtomicU8; GID_MAX],
}

#[repr(C)]
struct Ring {
    next: AtomicU64,
    entries: [Entry; RING],
}

static mut RING_PTR: *mut Ring = std::ptr::null_mut();
/// The gid of this backend's PREPARE TRANSACTION while its xid is not known yet.
static mut PENDING: Option<String> = None;

/// The ring's shared memory (set up by shmem.rs with pg_co's other areas).
pub const AREA: crate::shmem::Area =
    crate::shmem::Area { name: c"pg_co gids", size: std::mem::size_of::<Ring>, attach };

unsafe fn attach(p: *mut u8, _found: bool) {
    RING_PTR = p as *mut Ring;
}

/// Called from _PG_init while shared_preload_libraries is processed.
pub unsafe fn install_hooks() {
    co_install_utility_hook();
}

extern "C" {
    // pub(crate): csrc/co_layout.c's signature check names it from src/ssi_ffi.rs.
    pub(crate) fn co_install_utility_hook();
}

/// Called by csrc/co_gid_hook.c for PREPARE TRANSACTION, before the statement runs. Must not
/// raise an error or panic: only atomics and a plain read of the transaction's xid.
#[no_mangle]
pub extern "C" fn co_gids_on_prepare_stmt(gid: *const std::ffi::c_char) {
    let gid = unsafe { std::ffi::CStr::from_ptr(gid) }.to_string_lossy().into_owned();
    // A transaction that wrote has its xid now, before pg_co's check: a peer refused while
    // this one is still preparing can name it. Otherwise the xid comes with the prepare
    // (on_prepared).
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
    unsafe {
        *std::ptr::addr_of_mut!(PENDING) = if xid != 0 {
            record(xid, &gid);
            None
        } else {
            Some(gid)
        };
    }
}

/// XACT_EVENT_PREPARE: the transaction has its xid now.
pub fn on_prepared() {
    let pending = unsafe { (*std::ptr::addr_of_mut!(PENDING)).take() };
    if let Some(gid) = pending {
        let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
        if xid != 0 {
            record(xid, &gid);
        }
    }
}

/// The gid of this backend's transaction while it is in PREPARE TRANSACTION (None at a
/// local COMMIT): pending, or recorded with its xid.
pub fn own() -> Option<String> {
    if let Some(g) = unsafe { (*std::ptr::addr_of!(PENDING)).clone() } {
        return Some(g);
    }
    let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
    if xid == 0 {
        None
    } else {
        lookup(xid)
    }
}

/// XACT_EVENT_ABORT / COMMIT: a PREPARE that failed (or a PREPARE outside a transaction
/// block) leaves nothing behind for the next transaction.
pub fn forget_pending() {
    unsafe { *std::ptr::addr_of_mut!(PENDING) = None };
}

fn ring() -> Option<&'static Ring> {
    unsafe { RING_PTR.as_ref() }
}

fn record(xid: u32, gid: &str) {
    let Some(r) = ring() else { return };
    let e = &r.entries[(r.next.fetch_add(1, Ordering::Relaxed) % RING as u64) as usize];
    let bytes = &gid.as_bytes()[..gid.len().min(GID_MAX)];
    e.seq.fetch_add(1, Ordering::AcqRel);
    e.xid.store(xid, Ordering::Relaxed);
    e.len.store(bytes.len() as u32, Ordering::Relaxed);
    for (slot, b) in e.gid.iter().zip(bytes) {
        slot.store(*b, Ordering::Relaxed);
    }
    e.seq.fetch_add(1, Ordering::Release);
}

/// The gid recorded for `xid`, newest first; None when it was never seen or overwritten.
pub fn lookup(xid: u32) -> Option<String> {
    let r = ring()?;
    if xid == 0 {
        return None;
    }
    let next = r.next.load(Ordering::Acquire);
    for back in 1..=RING.min(next as usize) as u64 {
        let e = &r.entries[((next - back) % RING as u64) as usize];
        let s0 = e.seq.load(Ordering::Acquire);
        if s0 % 2 == 1 || e.xid.load(Ordering::Relaxed) != xid {
            continue;
        }
        let len = (e.len.load(Ordering::Relaxed) as usize).min(GID_MAX);
        let bytes: Vec<u8> = e.gid[..len].iter().map(|b| b.load(Ordering::Relaxed)).collect();
        if e.seq.load(Ordering::Acquire) == s0 && e.xid.load(Ordering::Relaxed) == xid {
            return Some(String::from_utf8_lossy(&bytes).into_owned());
        }
    }
    None
}

/// The xid recorded for `gid`, newest first (COMMIT PREPARED knows only the gid).
pub fn lookup_xid(gid: &str) -> Option<u32> {
    let r = ring()?;
    let want = &gid.as_bytes()[..gid.len().min(GID_MAX)];
    let next = r.next.load(Ordering::Acquire);
    for back in 1..=RING.min(next as usize) as u64 {
        let e = &r.entries[((next - back) % RING as u64) as usize];
        let s0 = e.seq.load(Ordering::Acquire);
        if s0 % 2 == 1 || e.len.load(Ordering::Relaxed) as usize != want.len() {
            continue;
        }
        let xid = e.xid.load(Ordering::Relaxed);
        let same = e.gid[..want.len()].iter().zip(want).all(|(a, b)| a.load(Ordering::Relaxed) == *b);
        if same && e.seq.load(Ordering::Acquire) == s0 {
            return Some(xid);
        }
    }
    None
}

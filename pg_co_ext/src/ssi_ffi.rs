//! Thin, safe wrappers over csrc/co_ssi.c (PostgreSQL's SSI internals). Mirrors co_ssi.h;
//! the build checks every mirrored size, offset and SXACT flag value against the C side
//! (build.rs, csrc/co_layout.c).

use pg_co_rules::{classify, Marker, Peer, PeerState, SelfView};
use pgrx::pg_sys;
use std::ffi::c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct CoPeer {
    sxact: *const c_void,
    prepare_seq: u64,
    xid: u32,
    flags: u32,
    pid: i32,
    pgprocno: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CoSelf {
    sxact: *const c_void,
    last_commit_before_snapshot: u64,
    flags: u32,
    xid: u32,
    n_out: i32,
    n_in: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CoEdge {
    prepared_xid: u32,
    prepared_flags: u32,
    prepared_pid: i32,
    peer_xid: u32,
    peer_pid: i32,
    peer_flags: u32,
    prepared_is_reader: i32,
}

// Compile-time assertions generated from the C side (sizes, offsets, flag values).
mod layout {
    #![allow(dead_code)]
    use super::{CoEdge, CoPeer, CoSelf};
    include!(concat!(env!("OUT_DIR"), "/co_layout.rs"));
}
pub use layout::BUILT_FOR_VERSION_NUM;

/// An rw edge between an in-doubt transaction and one not yet finished.
pub struct PreparedEdge {
    pub prepared_xid: u32,
    pub peer: Peer,
    /// The prepared transaction read what the peer wrote (the peer is held by rule B).
    pub prepared_is_reader: bool,
}

extern "C" {
    fn co_sxact_lock() -> *mut c_void;
    fn co_addin_shmem_init_lock() -> *mut c_void;
    fn co_predxact_size() -> usize;
    fn co_read_self(out: *mut CoSelf) -> bool;
    fn co_read_edges(out_edges: bool, buf: *mut CoPeer, cap: i32) -> i32;
    fn co_read_prepared_edges(predxact: *const c_void, buf: *mut CoEdge, cap: i32) -> i32;
    fn co_my_procno() -> i32;
    fn co_check_layout(predxact: *mut *mut c_void, skew: i32) -> *const std::ffi::c_char;
    fn co_last_commit_seq(predxact: *const c_void) -> u64;
    fn co_prepare_seq_of(predxact: *const c_void, xid: u32, seq: *mut u64) -> bool;
    fn co_summarized_concurrent_reader(predxact: *const c_void) -> bool;
    fn co_repair_commit_order() -> i32;
}

static mut PREDXACT: *mut c_void = std::ptr::null_mut();

/// The "PredXactList" shared struct (looked up once per backend).
fn predxact() -> *mut c_void {
    unsafe {
        if PREDXACT.is_null() {
            let mut found = false;
            PREDXACT = pg_sys::ShmemInitStruct(c"PredXactList".as_ptr(), co_predxact_size(), &mut found);
        }
        PREDXACT
    }
}

/// PostgreSQL's last handed-out commit sequence number.
pub fn last_commit_seq(_lock: &SsiLock) -> u64 {
    unsafe { co_last_commit_seq(predxact()) }
}

/// prepareSeqNo of the prepared transaction `xid`, None when SSI has none.
pub fn prepare_seq_of(_lock: &SsiLock, xid: u32) -> Option<u64> {
    let mut seq = 0;
    unsafe { co_prepare_seq_of(predxact(), xid, &mut seq) }.then_some(seq)
}

/// Rule S's fact: a reader that committed after our snapshot was summarized and keeps read
/// locks PostgreSQL's write-side check ignores. Takes SSI's finished-list and
/// predicate-list locks: call without an [`SsiLock`] (PostgreSQL's lock order).
pub fn summarized_concurrent_reader() -> bool {
    unsafe { co_summarized_concurrent_reader(predxact()) }
}

/// The commit-order repair (docs/pg_co.md, "Commit-order repair"), at XACT_EVENT_COMMIT:
/// flags this transaction as a pivot whose rw out-peer is past its commit check but not yet
/// committed for SSI (that peer may be visible before us). The one write pg_co makes into
/// SSI's state, so it takes SerializableXactHashLock exclusive itself. Returns how many
/// peers made it flag.
pub fn repair_commit_order() -> i32 {
    let _lock = SsiLock::exclusive();
    unsafe { co_repair_commit_order() }
}

/// lastCommitBeforeSnapshot of this backend's serializable transaction, None without one.
pub fn own_snapshot_seq(_lock: &SsiLock) -> Option<u64> {
    let mut s = CoSelf { sxact: std::ptr::null(), last_commit_before_snapshot: 0, flags: 0, xid: 0, n_out: 0, n_in: 0 };
    unsafe { co_read_self(&mut s) }.then_some(s.last_commit_before_snapshot)
}

/// In the postmaster, once SSI's shared memory exists: Err(what differs) when the running
/// server's SSI layout is not the one of the headers pg_co was compiled with (another minor
/// release that changed it, or headers of another build).
pub fn check_layout() -> Result<(), String> {
    let mut predxact = std::ptr::null_mut();
    let msg = unsafe { co_check_layout(&mut predxact, crate::gucs::TEST_LAYOUT_SKEW.get()) };
    if msg.is_null() {
        Ok(())
    } else {
        Err(unsafe { std::ffi::CStr::from_ptr(msg) }.to_string_lossy().into_owned())
    }
}

/// This backend's PGPROC number (SERIALIZABLEXACT.pgprocno of its transactions), -1 if none.
pub fn my_procno() -> i32 {
    unsafe { co_my_procno() }
}

/// AddinShmemInitLock (a macro over MainLWLockArray, absent from pgrx's bindings).
pub fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
    unsafe { co_addin_shmem_init_lock() as *mut pg_sys::LWLock }
}

/// SerializableXactHashLock, held exclusive: SSI state and pg_co's markers cannot change
/// while it is held, so a check and the marker it sets are one atomic step.
pub struct SsiLock(());

impl SsiLock {
    pub fn exclusive() -> SsiLock {
        unsafe { pg_sys::LWLockAcquire(co_sxact_lock() as *mut pg_sys::LWLock, pg_sys::LWLockMode::LW_EXCLUSIVE) };
        SsiLock(())
    }
    pub fn shared() -> SsiLock {
        unsafe { pg_sys::LWLockAcquire(co_sxact_lock() as *mut pg_sys::LWLock, pg_sys::LWLockMode::LW_SHARED) };
        SsiLock(())
    }
}

impl Drop for SsiLock {
    fn drop(&mut self) {
        // On an error PostgreSQL's abort releases every LWLock itself; only release ours
        // when it is still held.
        unsafe {
            let l = co_sxact_lock() as *mut pg_sys::LWLock;
            if pg_sys::LWLockHeldByMe(l) {
                pg_sys::LWLockRelease(l)
            }
        }
    }
}

/// This backend's serializable transaction, with its rw-conflict peers.
pub struct Snapshot {
    pub sxact: *const c_void,
    pub me: SelfView,
    pub out_edges: Vec<Peer>,
    pub in_edges: Vec<Peer>,
}

/// Reads our transaction's SSI state; None when it has none (not serializable, no
/// snapshot taken yet, or a read-only transaction PostgreSQL released as safe).
/// `marker_of` resolves pg_co's marker for a peer (sxact pointer, pgprocno).
pub fn read_own(_lock: &SsiLock, marker_of: impl Fn(*const c_void, i32) -> Option<Marker>) -> Option<Snapshot> {
    let mut s = CoSelf { sxact: std::ptr::null(), last_commit_before_snapshot: 0, flags: 0, xid: 0, n_out: 0, n_in: 0 };
    if !unsafe { co_read_self(&mut s) } {
        return None;
    }
    let read = |out: bool, n: i32| -> Vec<Peer> {
        let mut buf = vec![
            CoPeer { sxact: std::ptr::null(), prepare_seq: 0, xid: 0, flags: 0, pid: 0, pgprocno: -1 };
            n.max(0) as usize
        ];
        let total = unsafe { co_read_edges(out, buf.as_mut_ptr(), n) };
        debug_assert_eq!(total, n, "lists cannot change under the lock");
        buf.iter()
            .map(|c| Peer {
                xid: c.xid,
                pid: c.pid,
                flags: c.flags,
                prepare_seq: c.prepare_seq,
                marker: marker_of(c.sxact, c.pgprocno),
            })
            .collect()
    };
    Some(Snapshot {
        sxact: s.sxact,
        me: SelfView {
            flags: s.flags,
            last_commit_before_snapshot: s.last_commit_before_snapshot,
            wrote: s.xid != 0,
            summarized_concurrent_reader: false,
        },
        out_edges: read(true, s.n_out),
        in_edges: read(false, s.n_in),
    })
}

fn peer(xid: u32, pid: i32, flags: u32) -> Peer {
    Peer { xid, pid, flags, prepare_seq: 0, marker: None }
}

/// Every rw edge between an in-doubt transaction and an unfinished one. What "in doubt"
/// and "finished" mean is pg_co_rules::classify's decision, as for the checks.
pub fn prepared_edges() -> Vec<PreparedEdge> {
    raw_prepared_edges()
        .into_iter()
        .filter(|e| classify(&peer(e.prepared_xid, e.prepared_pid, e.prepared_flags)) == PeerState::InDoubt)
        .map(|e| PreparedEdge {
            prepared_xid: e.prepared_xid,
            peer: peer(e.peer_xid, e.peer_pid, e.peer_flags),
            prepared_is_reader: e.prepared_is_reader == 1,
        })
        .filter(|e| !matches!(classify(&e.peer), PeerState::Committed { .. } | PeerState::RolledBack))
        .collect()
}

fn raw_prepared_edges() -> Vec<CoEdge> {
    let predxact = predxact();
    let _lock = SsiLock::shared();
    let mut cap = 64;
    loop {
        let mut buf = vec![CoEdge::default(); cap];
        let n = unsafe { co_read_prepared_edges(predxact, buf.as_mut_ptr(), cap as i32) } as usize;
        if n <= cap {
            buf.truncate(n);
            return buf;
        }
        cap = n;
    }
}

//! Rule C for READ ONLY readers (docs/pg_co.md, "Rule C for READ ONLY readers").
//!
//! PostgreSQL drops a READ ONLY reader L's rw edge to Y when Y commits (and then releases
//! L from SSI once its snapshot is safe), so the edge rule C looks for is gone when Y's
//! COMMIT PREPARED comes between L's snapshot and L's COMMIT. pg_co keeps its own record
//! instead: every COMMIT PREPARED of a transaction Y is in flight (a per-backend slot, set
//! before PostgreSQL commits Y) or done (a ring entry written before the slot is cleared),
//! with Y's prepareSeqNo and C = PostgreSQL's last commit sequence number after Y's commit
//! (>= Y's commitSeqNo). L's snapshot position S = lastCommitBeforeSnapshot is noted at
//! L's first ExecutorStart, before L can be released. At L's COMMIT, after rule C's edge
//! check: refuse if some Y with prepareSeqNo <= S (prepared before L's snapshot) is in
//! flight, or done with C > S (committed after L's snapshot, so L missed it), or if the
//! ring overwrote an entry with C > S. That decision is pg_co_rules' `decide_read_only`;
//! this module keeps the records and hands them to it. No callback here raises an error.

use crate::gids;
use crate::ssi_ffi::{self, SsiLock};
use pg_co_rules::read_only::{CommitRecords, Done as DoneRecord, InFlight as InFlightRecord, Overwritten, Reader};
use pg_co_rules::{decide_read_only, Point, Settings, Verdict};
use pgrx::pg_sys;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const RING: usize = 4096;

#[repr(C)]
struct Done {
    seq: AtomicU32, // odd while written
    xid: AtomicU32,
    prepare_seq: AtomicU64,
    commit_seq: AtomicU64,
    /// When the COMMIT PREPARED finished (µs since 2000, PostgreSQL's TimestampTz).
    end_us: AtomicU64,
}

#[repr(C)]
struct InFlight {
    active: AtomicU32,
    xid: AtomicU32,
    prepare_seq: AtomicU64,
}

#[repr(C)]
struct Shared {
    next: AtomicU64,
    /// The largest commit_seq of an overwritten entry: a reader whose S is below it may
    /// have missed a transaction the ring no longer shows.
    overwritten_max: AtomicU64,
    /// The latest end_us of an overwritten entry (for DEFERRABLE readers, below).
    overwritten_max_end: AtomicU64,
    done: [Done; RING],
    n_slots: u32,
    slots: [InFlight; 0], // n_slots follow, indexed by pgprocno
}

static mut SHARED: *mut Shared = std::ptr::null_mut();
/// This transaction's snapshot position: None not looked yet; Some(None) it had no
/// serializable state at its first ExecutorStart (safe from the start).
static mut SNAPSHOT_SEQ: Option<Option<u64>> = None;

fn n_slots() -> usize {
    unsafe { pg_sys::MaxBackends as usize }
}

fn size() -> usize {
    std::mem::size_of::<Shared>() + n_slots() * std::mem::size_of::<InFlight>()
}

/// The commit records' shared memory (set up by shmem.rs with pg_co's other areas).
pub const AREA: crate::shmem::Area = crate::shmem::Area { name: c"pg_co read only", size, attach };

unsafe fn attach(p: *mut u8, found: bool) {
    let p = p as *mut Shared;
    if !found {
        (*p).n_slots = n_slots() as u32;
    }
    SHARED = p;
}

fn shared() -> Option<&'static Shared> {
    unsafe { SHARED.as_ref() }
}

fn slot(s: &'static Shared, pgprocno: i32) -> Option<&'static InFlight> {
    if pgprocno < 0 || pgprocno as u32 >= s.n_slots {
        return None;
    }
    unsafe { Some(&*s.slots.as_ptr().add(pgprocno as usize)) }
}

fn my_slot() -> Option<&'static InFlight> {
    slot(shared()?, ssi_ffi::my_procno())
}

/// Before COMMIT PREPARED 'gid' runs: Y's commit is in flight from here on.
#[no_mangle]
pub extern "C" fn co_ro_commit_prepared_start(gid: *const std::ffi::c_char) {
    let Some(me) = my_slot() else { return };
    let gid = unsafe { std::ffi::CStr::from_ptr(gid) }.to_string_lossy();
    let xid = gids::lookup_xid(&gid).unwrap_or(0);
    // Unknown (prepared before a restart, or out of the gid ring): 0 = prepared before
    // every snapshot, the conservative side.
    let prepare_seq = if xid != 0 {
        let lock = SsiLock::shared();
        ssi_ffi::prepare_seq_of(&lock, xid).unwrap_or(0)
    } else {
        0
    };
    me.xid.store(xid, Ordering::Relaxed);
    me.prepare_seq.store(prepare_seq, Ordering::Relaxed);
    me.active.store(1, Ordering::Release);
}

/// After COMMIT PREPARED succeeded: record it as done, then leave the in-flight slot, in
/// that order, so that a reader always finds it in one of the two.
#[no_mangle]
pub extern "C" fn co_ro_commit_prepared_end() {
    let (Some(s), Some(me)) = (shared(), my_slot()) else { return };
    if me.active.load(Ordering::Acquire) == 0 {
        return;
    }
    let commit_seq = {
        let lock = SsiLock::shared();
        ssi_ffi::last_commit_seq(&lock)
    };
    let e = &s.done[(s.next.fetch_add(1, Ordering::AcqRel) % RING as u64) as usize];
    e.seq.fetch_add(1, Ordering::AcqRel);
    s.overwritten_max.fetch_max(e.commit_seq.load(Ordering::Relaxed), Ordering::AcqRel);
    s.overwritten_max_end.fetch_max(e.end_us.load(Ordering::Relaxed), Ordering::AcqRel);
    e.end_us.store(unsafe { pg_sys::GetCurrentTimestamp() }.max(0) as u64, Ordering::Relaxed);
    e.xid.store(me.xid.load(Ordering::Relaxed), Ordering::Relaxed);
    e.prepare_seq.store(me.prepare_seq.load(Ordering::Relaxed), Ordering::Relaxed);
    e.commit_seq.store(commit_seq, Ordering::Relaxed);
    e.seq.fetch_add(1, Ordering::Release);
    me.active.store(0, Ordering::Release);
}

/// At every ExecutorStart: a READ ONLY serializable transaction notes its snapshot
/// position once, while PostgreSQL still tracks it (a reader is released as safe only by
/// one of its own later predicate-lock calls, which come after this).
#[no_mangle]
pub extern "C" fn co_ro_executor_start() {
    unsafe {
        if (*std::ptr::addr_of!(SNAPSHOT_SEQ)).is_some()
            || !pg_sys::XactReadOnly
            || pg_sys::XactIsoLevel != pg_sys::XACT_SERIALIZABLE as i32
            || shared().is_none()
        {
            return;
        }
        let lock = SsiLock::shared();
        *std::ptr::addr_of_mut!(SNAPSHOT_SEQ) = Some(ssi_ffi::own_snapshot_seq(&lock));
    }
}

/// At the end of every transaction (and of a failed COMMIT PREPARED: not committed).
pub fn on_xact_end() {
    unsafe { *std::ptr::addr_of_mut!(SNAPSHOT_SEQ) = None };
    if let Some(me) = my_slot() {
        if me.active.load(Ordering::Relaxed) != 0 {
            me.active.store(0, Ordering::Release);
        }
    }
}

/// Rule C for a READ ONLY reader at its COMMIT: gathers the facts and asks pg_co_rules'
/// `decide_read_only` (the decision lives there). `seq_now` is the reader's snapshot
/// position when PostgreSQL still tracks it. Call after the edge check (docs/pg_co.md says why).
pub fn check(point: Point, seq_now: Option<u64>, settings: &Settings) -> Verdict {
    let Some(s) = shared() else { return Verdict::Allow };
    let reader = unsafe {
        Reader {
            read_only: pg_sys::XactReadOnly,
            serializable: pg_sys::XactIsoLevel == pg_sys::XACT_SERIALIZABLE as i32,
            noted_seq: *std::ptr::addr_of!(SNAPSHOT_SEQ),
            seq_now,
            deferrable: pg_sys::XactDeferrable,
            took_snapshot: pg_sys::FirstSnapshotSet,
            began_us: pg_sys::GetCurrentTransactionStartTimestamp().max(0) as u64,
        }
    };
    decide_read_only(point, &reader, settings, &Records { s, snapshot: Cell::new(None) })
}

/// The shared records as pg_co_rules reads them: lazily, straight from shared memory.
struct Records {
    s: &'static Shared,
    /// The reader's transaction snapshot, taken at the first visibility question only
    /// (pg_co_rules asks none unless the reader took a snapshot already).
    snapshot: Cell<Option<pg_sys::Snapshot>>,
}

impl CommitRecords for Records {
    fn in_flight(&self) -> impl Iterator<Item = InFlightRecord> {
        let s = self.s;
        (0..s.n_slots as i32).filter_map(move |i| {
            let f = slot(s, i)?;
            (f.active.load(Ordering::Acquire) == 1).then(|| InFlightRecord {
                xid: f.xid.load(Ordering::Relaxed),
                prepare_seq: f.prepare_seq.load(Ordering::Relaxed),
            })
        })
    }

    fn done(&self) -> impl Iterator<Item = Option<DoneRecord>> {
        self.s.done.iter().map(read_entry)
    }

    fn overwritten(&self) -> Overwritten {
        Overwritten {
            max_commit_seq: self.s.overwritten_max.load(Ordering::Acquire),
            max_end_us: self.s.overwritten_max_end.load(Ordering::Acquire),
        }
    }

    fn invisible(&self, xid: u32) -> bool {
        let snapshot = match self.snapshot.get() {
            Some(snap) => snap,
            None => {
                let snap = unsafe { pg_sys::GetTransactionSnapshot() };
                self.snapshot.set(Some(snap));
                snap
            }
        };
        unsafe { xid == 0 || pg_sys::XidInMVCCSnapshot(pg_sys::TransactionId::from_inner(xid), snapshot) }
    }
}

/// A consistent copy of one ring entry (a writer holds it for nanoseconds); None when it
/// kept being rewritten.
fn read_entry(e: &Done) -> Option<DoneRecord> {
    for _ in 0..10_000 {
        let s0 = e.seq.load(Ordering::Acquire);
        let v = DoneRecord {
            xid: e.xid.load(Ordering::Relaxed),
            prepare_seq: e.prepare_seq.load(Ordering::Relaxed),
            commit_seq: e.commit_seq.load(Ordering::Relaxed),
            end_us: e.end_us.load(Ordering::Relaxed),
        };
        if s0 % 2 == 0 && e.seq.load(Ordering::Acquire) == s0 {
            return Some(v);
        }
        std::hint::spin_loop();
    }
    None
}

//! The two commit points: PREPARE TRANSACTION (XACT_EVENT_PRE_PREPARE: rules A and B)
//! and local COMMIT (XACT_EVENT_PRE_COMMIT: rules B and C). Each check runs under
//! SerializableXactHashLock together with setting our marker, so two transactions with
//! an rw edge between them can never both pass (docs/pg_co.md).
//! A local COMMIT of a transaction that called `co.decide` is the global decision of a
//! 2PC transaction (its last branch committing in one phase) and is checked as
//! `Point::Decision`: rule A as at PREPARE, B and C as at COMMIT.

use crate::bounded_wait;
use crate::gucs::{self, ConflictAction};
use crate::read_only;
use crate::refusal::{self, Refusal};
use crate::shmem::{self, Counter};
use crate::ssi_ffi::{self, SsiLock};
use pg_co_rules::{decide, flags, Marker, Point, Settings, Verdict};
use pgrx::pg_sys;
use std::cell::Cell;
use std::time::Instant;

thread_local! {
    /// This backend's current transaction called co.decide: its COMMIT is a global decision.
    static DECISION_POINT: Cell<bool> = const { Cell::new(false) };
    /// This backend's current transaction ran a modifying statement (csrc/co_gid_hook.c).
    static WROTE: Cell<bool> = const { Cell::new(false) };
}

/// Called by the ExecutorStart and ProcessUtility hooks of csrc/co_gid_hook.c for a
/// modifying statement. Never raises an error.
#[no_mangle]
pub extern "C" fn co_note_write() {
    WROTE.with(|w| w.set(true));
}

/// Called by co.decide; cleared when the transaction ends, whichever way.
pub fn mark_decision_point() {
    DECISION_POINT.with(|d| d.set(true));
}

fn is_decision_point() -> bool {
    DECISION_POINT.with(|d| d.get())
}

// From the server headers via pgrx (xact.h), not a copy.
const XACT_SERIALIZABLE: i32 = pg_sys::XACT_SERIALIZABLE as i32;

pub unsafe fn register() {
    pg_sys::RegisterXactCallback(Some(on_xact_event), std::ptr::null_mut());
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_xact_event(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_PREPARE => {
            if is_decision_point() {
                // The decision row would sit prepared, undecided, beside its own branch.
                refusal::raise(Refusal::DecisionPrepared);
            }
            check(Point::Prepare)
        }
        // Parallel workers report XACT_EVENT_PARALLEL_PRE_COMMIT and are not checked:
        // their leader's commit is.
        XACT_EVENT_PRE_COMMIT => check(if is_decision_point() { Point::Decision } else { Point::LocalCommit }),
        XACT_EVENT_PREPARE => {
            DECISION_POINT.with(|d| d.set(false));
            WROTE.with(|w| w.set(false));
            crate::gids::on_prepared();
            read_only::on_xact_end();
            shmem::clear_my_marker()
        }
        XACT_EVENT_ABORT | XACT_EVENT_COMMIT => {
            if event == XACT_EVENT_COMMIT && WROTE.with(|w| w.get()) {
                repair_commit_order();
            }
            DECISION_POINT.with(|d| d.set(false));
            WROTE.with(|w| w.set(false));
            crate::gids::forget_pending();
            read_only::on_xact_end();
            shmem::clear_my_marker()
        }
        _ => {}
    }
}

/// Asked by csrc/co_gid_hook.c's ExecutorStart hook before a serializable statement that
/// holds an upsert able to leave a row it read unchanged (DO NOTHING, DO UPDATE ... WHERE):
/// refuse it (docs/pg_co.md, `pg_co.refuse_upsert_reads`). Never raises an error.
#[no_mangle]
pub extern "C" fn co_refuse_upsert_reads() -> bool {
    gucs::ENABLED.get() && !gucs::OBSERVE_ONLY.get() && gucs::REFUSE_UPSERT_READS.get() && shmem::attached()
}

/// XACT_EVENT_COMMIT comes after ProcArrayEndTransaction (we are visible) and before
/// ReleasePredicateLocks (SSI commits us): the one moment the commit-order repair can flag
/// us before SSI decides whether our edges still matter (docs/pg_co.md). Only for a
/// transaction that wrote: one that did not is no pivot (nobody can read its writes), and
/// PostgreSQL makes it READ ONLY at its release, after which the seqno the repair writes
/// would be read as its lastCommitBeforeSnapshot. Nothing here may raise an error: the
/// transaction is committed.
fn repair_commit_order() {
    if gucs::ENABLED.get() && !gucs::OBSERVE_ONLY.get() && gucs::COMMIT_ORDER_REPAIR.get() && shmem::attached() {
        ssi_ffi::repair_commit_order();
    }
}

fn check(point: Point) {
    if !gucs::ENABLED.get() || !shmem::attached() {
        return;
    }
    let serializable = unsafe { pg_sys::XactIsoLevel } == XACT_SERIALIZABLE;
    if point == Point::Decision {
        // co.decide refused these already; a setting changed since must not slip through.
        if !serializable {
            refusal::raise(Refusal::DecisionNotSerializable);
        }
        if unsafe { pg_sys::XactReadOnly } {
            refusal::raise(Refusal::DecisionReadOnly);
        }
        shmem::bump(Counter::ChecksCommit, 1);
    } else if point == Point::Prepare {
        if !serializable {
            if gucs::REQUIRE_SERIALIZABLE.get() {
                refusal::refuse(Refusal::NotSerializable);
            }
            return; // nothing to check without SSI (observe-only: counted above)
        }
        // A READ ONLY serializable transaction may lose its rw edges when a writer commits,
        // or drop out of SSI altogether once its snapshot is "safe".
        if unsafe { pg_sys::XactReadOnly } {
            refusal::refuse(Refusal::ReadOnly);
            return;
        }
        shmem::bump(Counter::ChecksPrepare, 1);
    } else {
        if !serializable {
            return;
        }
        shmem::bump(Counter::ChecksCommit, 1);
    }
    let settings = Settings {
        rule_c: gucs::RULE_C.get(),
        rule_s: gucs::RULE_S.get(),
        rule_c_read_only: gucs::RULE_C_READ_ONLY.get(),
    };
    // Rule S's fact, read before SerializableXactHashLock (PostgreSQL's lock order); it
    // cannot become false while this transaction is open (docs/pg_co.md, "Rule S").
    let summarized_reader = point == Point::LocalCommit
        && settings.rule_s
        && unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner() != 0
        && ssi_ffi::summarized_concurrent_reader();
    let t0 = Instant::now();
    let mut wait_started: Option<Instant> = None;
    loop {
        let lock = SsiLock::exclusive();
        let Some(mut snap) = ssi_ffi::read_own(&lock, shmem::marker_of) else {
            drop(lock);
            // Nothing read under SSI now; a READ ONLY reader may have been released as safe.
            check_read_only(point, None, &settings);
            return;
        };
        snap.me.summarized_concurrent_reader = summarized_reader;
        let verdict = decide(point, &snap.me, &snap.out_edges, &snap.in_edges, &settings);
        let summarized = snap.me.flags & (flags::SUMMARY_CONFLICT_IN | flags::SUMMARY_CONFLICT_OUT) != 0;
        let context = |waited: Option<Instant>| refusal::Context {
            summarized,
            waited_ms: waited.map(|w| w.elapsed().as_millis() as u64),
        };
        let observe_only = gucs::OBSERVE_ONLY.get();
        if verdict == Verdict::Allow {
            mark(point, snap.sxact);
            drop(lock);
            passed(point, snap.me.last_commit_before_snapshot, &settings, t0, wait_started);
            return;
        }
        drop(lock);
        if let Verdict::RuleBInDoubtReader(peer, _) = verdict {
            let wait_mode = gucs::CONFLICT_ACTION.get() == ConflictAction::Wait;
            // Wait mode waits for the decision itself (lock_timeout bounds it), so the
            // bound, on by default, is abort mode's only. Observe-only never waits.
            let max_wait = if wait_mode { 0 } else { gucs::MAX_WAIT_MS.get() };
            if !observe_only && (wait_mode || max_wait > 0) {
                let started = *wait_started.get_or_insert_with(|| {
                    shmem::bump(Counter::Waits, 1);
                    Instant::now()
                });
                match bounded_wait::deadline(started, max_wait) {
                    // Wait mode: the lock wait, until lock_timeout.
                    None => wait_for(peer.xid, started),
                    Some(deadline) if Instant::now() < deadline => bounded_wait::until_decided_or(peer.xid, deadline),
                    Some(_) => {
                        // Still blocked after max_wait: the usual rule-B refusal.
                        shmem::bump(Counter::WaitTimeouts, 1);
                        finish_timing(t0, wait_started);
                        refusal::raise(Refusal::RuleWith(point, verdict, context(wait_started)));
                    }
                }
                continue;
            }
        }
        finish_timing(t0, wait_started);
        refusal::refuse(Refusal::RuleWith(point, verdict, context(wait_started)));
        // Observe-only: counted and logged; the transaction goes on as if it had passed.
        let lock = SsiLock::exclusive();
        mark(point, snap.sxact);
        drop(lock);
        check_read_only(point, Some(snap.me.last_commit_before_snapshot), &settings);
        return;
    }
}

/// Marks this transaction as past its check, under SerializableXactHashLock: a decision
/// commit is a commit, so peers see it as committing (rule A refuses their out-edges to
/// it, rule B does not wait for it).
fn mark(point: Point, sxact: *const std::ffi::c_void) {
    if !gucs::TEST_SKIP_MARKER.get() {
        shmem::set_my_marker(sxact, if point == Point::Prepare { Marker::Preparing } else { Marker::Committing });
    }
}

/// After a passed check, without the lock: rule C for READ ONLY readers comes after the
/// edge check, not before (docs/pg_co.md, "Rule C for READ ONLY readers").
fn passed(point: Point, snapshot_seq: u64, settings: &Settings, t0: Instant, wait_started: Option<Instant>) {
    check_read_only(point, Some(snapshot_seq), settings);
    finish_timing(t0, wait_started);
    test_pause();
}

/// Rule C for a READ ONLY serializable transaction at its local COMMIT: src/read_only.rs
/// gathers the facts, pg_co_rules' `decide_read_only` decides whether it applies and what.
fn check_read_only(point: Point, seq_now: Option<u64>, settings: &Settings) {
    let verdict = read_only::check(point, seq_now, settings);
    if verdict != Verdict::Allow {
        refusal::refuse(Refusal::Rule(Point::LocalCommit, verdict));
    }
}

fn finish_timing(t0: Instant, wait_started: Option<Instant>) {
    let waited = wait_started.map(|w| w.elapsed());
    if let Some(w) = waited {
        shmem::bump(Counter::WaitMicros, w.as_micros() as u64);
    }
    let busy = t0.elapsed() - waited.unwrap_or_default();
    shmem::bump(Counter::CheckNanos, busy.as_nanos() as u64);
}

/// Waits until transaction `xid` is committed or rolled back. The heavyweight lock wait
/// honours lock_timeout, statement_timeout, cancel and the deadlock detector.
fn wait_for(xid: u32, started: Instant) {
    if xid != 0 {
        unsafe {
            pg_sys::XactLockTableWait(
                pg_sys::TransactionId::from_inner(xid),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                pg_sys::XLTW_Oper::XLTW_None,
            )
        };
        return;
    }
    // A peer still inside PREPARE TRANSACTION may not have its xid yet: poll briefly,
    // bounded by lock_timeout like a lock wait.
    lock_timeout_check(started);
    unsafe {
        pg_sys::pg_usleep(1000);
    }
    pgrx::check_for_interrupts!();
}

/// Wait mode polls while the peer has no xid yet: lock_timeout bounds that too, as it
/// bounds the lock wait.
fn lock_timeout_check(started: Instant) {
    let timeout_ms = unsafe { pg_sys::LockTimeout };
    if timeout_ms > 0 && started.elapsed().as_millis() as i64 >= timeout_ms as i64 {
        refusal::raise(Refusal::WaitTimeout);
    }
}

fn test_pause() {
    let ms = gucs::TEST_PAUSE_MS.get();
    if ms > 0 {
        unsafe { pg_sys::pg_usleep(ms as std::ffi::c_long * 1000) };
    }
}

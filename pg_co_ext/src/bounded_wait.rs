//! Rule B's bounded wait (`pg_co.max_wait`): an in-doubt blocker is usually a few
//! milliseconds from its decision, so waiting that long turns most rule-B refusals into a
//! short delay. PostgreSQL has no timed wait on a transaction lock, so this polls: it
//! sleeps on the backend's latch (cancel, statement_timeout and postmaster death wake it)
//! and looks whether the blocker is still in progress, holding no lock meanwhile.

use pgrx::pg_sys;
use std::time::{Duration, Instant};

/// Shown in pg_stat_activity while a backend waits (wait_event_type "Extension").
const WAIT_EVENT: u32 = pg_sys::PG_WAIT_EXTENSION;
/// How often the blocker is looked at (ms): below the few milliseconds a decision takes.
const TICK_MS: std::ffi::c_long = 1;

/// Returns when transaction `xid` is no longer in progress (committed or rolled back: the
/// caller checks again), or at `deadline`, or after one tick when the blocker has no xid
/// yet (a PREPARE in progress; the caller's re-check sees it once it has one).
pub fn until_decided_or(xid: u32, deadline: Instant) {
    loop {
        if xid != 0 && !unsafe { pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from_inner(xid)) } {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                TICK_MS,
                WAIT_EVENT,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
        if xid == 0 {
            return;
        }
    }
}

/// The deadline of a bounded wait started at `started`, None when max_wait is 0.
pub fn deadline(started: Instant, max_wait_ms: i32) -> Option<Instant> {
    (max_wait_ms > 0).then(|| started + Duration::from_millis(max_wait_ms as u64))
}

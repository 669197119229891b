//! Expiry of the registry's transactions: timeouts of undecided ones from a deadline heap
//! (no walk of the map at every tick), and the retention sweep, once a second, that drops
//! what retention no longer keeps and refreshes the bound on undecided transactions that
//! `Registry::insert_capped` checks the cap against.

use crate::state::TxState;
use std::cmp::Reverse;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::registry::Registry;

/// How often the retention sweep walks the map: retention is measured in seconds, and at
/// every 50 ms tick the walk of tens of thousands of retained entries was a measured 4 %
/// of the daemon's CPU under load (bench/RESULTS.md).
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Registry {
    /// Times out and sweeps (`time_out`, then `sweep`): the unit tests' one call (the
    /// tick sweeps only when due).
    #[cfg(test)]
    pub fn expire(&self, now: Instant, retention: Duration) -> Vec<String> {
        let timed_out = self.time_out(now);
        self.sweep(now, retention);
        timed_out
    }

    /// Aborts every active transaction past its deadline (the tick's); returns their gtids.
    pub fn time_out(&self, now: Instant) -> Vec<String> {
        let mut timed_out = vec![];
        let mut txs = self.txs.lock().unwrap();
        let mut due = self.deadlines.lock().unwrap();
        while due.peek().is_some_and(|Reverse((d, _))| *d <= now) {
            let Reverse((_, gtid)) = due.pop().expect("peeked");
            if let Some(e) = txs.get_mut(&gtid) {
                if e.tx.state == TxState::Active && now >= e.tx.deadline {
                    e.tx.abort("timeout: not decided in time".into(), true);
                    e.publish();
                    timed_out.push(gtid);
                }
            }
        }
        timed_out
    }

    /// Whether the retention sweep is due (at most once per SWEEP_EVERY); marks it run.
    pub fn sweep_due(&self, now: Instant) -> bool {
        let mut last = self.last_sweep.lock().unwrap();
        if last.is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Drops what retention no longer keeps, and counts the undecided (the cap's bound).
    pub fn sweep(&self, now: Instant, retention: Duration) {
        let mut txs = self.txs.lock().unwrap();
        let mut undecided = 0;
        txs.retain(|_, e| {
            let old = e.tx.decided.map(|d| now.saturating_duration_since(d) >= retention).unwrap_or(false);
            let keep = match e.tx.state {
                TxState::Committed => !(old && e.tx.all_finished() && !e.completing),
                TxState::Aborted => !(old && !e.tx.in_doubt() && !e.completing),
                TxState::OnePhase => now < e.tx.deadline + retention,
                _ => true,
            };
            undecided += usize::from(keep && e.tx.is_undecided());
            keep
        });
        // Under the lock: no insert falls between the walk and the reset.
        self.undecided_bound.store(undecided, Relaxed);
    }

}

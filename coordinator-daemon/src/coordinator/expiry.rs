//! Expiry of the registry's transactions: timeouts of undecided ones from a deadline heap
//! (no walk of the map at every tick), the end of the owner's grace period of those
//! deciding in a participant (another heap), and the retention sweep, once a second, that drops
//! what retention no longer keeps and refreshes the bound on undecided transactions that
//! `Registry::insert_capped` checks the cap against.

use crate::state::TxState;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
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
        let mut txs = self.txs.lock().unwrap();
        let due = pop_due(&mut self.deadlines.lock().unwrap(), now);
        due.into_iter()
            .filter(|gtid| match txs.get_mut(gtid) {
                Some(e) if e.tx.state() == TxState::Active && now >= e.tx.deadline => {
                    e.tx.abort("timeout: not decided in time".into(), true);
                    e.publish();
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// Waits for the owner of a transaction deciding in a participant until `until`.
    pub fn grace_until(&self, gtid: &str, until: Instant) {
        self.graces.lock().unwrap().push(Reverse((until, gtid.to_string())));
    }

    /// The transactions still deciding in a participant whose owner's grace period is
    /// over (the tick's): their decision is then read from the decision branch's resource.
    pub fn grace_over(&self, now: Instant) -> Vec<String> {
        let txs = self.txs.lock().unwrap();
        let due = pop_due(&mut self.graces.lock().unwrap(), now);
        due.into_iter().filter(|gtid| txs.get(gtid).is_some_and(|e| e.tx.state() == TxState::Deciding)).collect()
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
            let keep = match e.tx.state() {
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

/// Takes every gtid due at `now` off a heap of (when, gtid), soonest first. An entry may
/// be stale (its transaction decided or gone since): the caller checks the registry.
fn pop_due(heap: &mut BinaryHeap<Reverse<(Instant, String)>>, now: Instant) -> Vec<String> {
    let mut due = vec![];
    while heap.peek().is_some_and(|Reverse((d, _))| *d <= now) {
        due.push(heap.pop().expect("peeked").0 .1);
    }
    due
}

#[cfg(test)]
mod tests {
    use crate::coordinator::tests::coord_src;
    use crate::state::Outcome;
    use std::time::{Duration, Instant};

    /// A transaction deciding in a participant waits for its owner's report until the
    /// grace period is over, then (once) comes up for resolution at the resource; one
    /// whose owner reported in time never does. No task or timer per transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_owner_is_resolved_after_the_grace_period_only() {
        let c = coord_src("grace", "none", "decisions = true\n").await;
        let two = [("pg".to_string(), "b0".to_string(), None), ("pg".to_string(), "b1".to_string(), None)];
        let silent = c.begin_with_branches(None, &two).await.unwrap().gtid;
        let reported = c.begin_with_branches(None, &two).await.unwrap().gtid;
        for g in [&silent, &reported] {
            c.commit_decide_in(g, &["b0".to_string()], "b1").await.unwrap();
        }
        c.finished_many(&reported, &["b1".to_string(), "b0".to_string()], Outcome::Commit).await.unwrap();
        let r = &c.parts().registry;
        let grace = Duration::from_millis(c.cfg.timeouts.owner_grace_ms);
        assert!(r.grace_over(Instant::now()).is_empty(), "still within the grace period");
        let later = Instant::now() + grace + Duration::from_millis(1);
        assert_eq!(r.grace_over(later), vec![silent.clone()]);
        assert!(r.grace_over(later).is_empty(), "resolution is started once");
    }
}

//! Periodic housekeeping (timeouts, retention, deleting finished records), the gauges, and
//! what recovery reads from the live state.

use crate::coordinator::Coordinator;
use crate::telemetry::log::log;
use crate::state::{BranchState, Outcome, TxState};
use crate::store::Op;
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Gauges computed from the live state at scrape time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    pub in_doubt: usize,
    pub active: usize,
    pub oldest_in_doubt_s: f64,
    pub quarantined: usize,
    pub unconfigured_branches: usize,
    pub adopted_nodes: usize,
}

impl Coordinator {
    /// Deletes the durable record once every branch is confirmed finished.
    pub fn maybe_forget(&self, gtid: &str) {
        let mut txs = self.txs.lock().unwrap();
        if let Some(e) = txs.get_mut(gtid) {
            if e.recorded && !e.forgotten && e.tx.decision().is_some() && e.tx.all_finished() {
                e.forgotten = true;
                self.store.write_later(Op::Forget(gtid.to_string()));
            }
            // A committed decision row in a participant goes once every branch is finished
            // (abort rows stay: see decisions.rs).
            if e.tx.decide_in.is_some() && !e.dip_forgotten && e.tx.decision() == Some(Outcome::Commit) && e.tx.all_finished() {
                e.dip_forgotten = true;
                self.decisions_to_forget.lock().unwrap().push(gtid.to_string());
            }
        }
    }

    /// Says once per stall that the decision store stopped answering, and when it answers
    /// again: a paused or partitioned store holds every commit and renewal silently.
    fn watch_store(&self) {
        let stalled = self.store.stats.stalled_ms();
        let limit = self.cfg.lease.ttl_ms.min(2_000);
        if stalled > limit && !self.store_stalled.swap(true, Relaxed) {
            log("error", "decision store is not answering: commits wait for their records, the lease cannot be renewed",
                json!({"stalled_ms": stalled}));
        } else if stalled == 0 && self.store_stalled.swap(false, Relaxed) {
            log("warn", "decision store answers again", json!({}));
        }
    }

    /// Abort what timed out, drop what is finished and old.
    pub fn tick(self: &Arc<Self>) {
        self.watch_store();
        let now = Instant::now();
        let retention = Duration::from_millis(self.cfg.timeouts.retention_ms);
        let mut timed_out = vec![];
        {
            let mut txs = self.txs.lock().unwrap();
            for e in txs.values_mut() {
                if e.tx.state == TxState::Active && now >= e.tx.deadline {
                    e.tx.abort("timeout: not decided in time".into(), true);
                    e.publish();
                    timed_out.push(e.tx.gtid.clone());
                }
            }
            txs.retain(|_, e| {
                let old = e.tx.decided.map(|d| now.duration_since(d) >= retention).unwrap_or(false);
                match e.tx.state {
                    TxState::Committed => !(old && e.tx.all_finished() && !e.completing),
                    TxState::Aborted => !(old && !e.tx.in_doubt() && !e.completing),
                    TxState::OnePhase => now < e.tx.deadline + retention,
                    _ => true,
                }
            });
        }
        for g in timed_out {
            self.metrics.timeouts.fetch_add(1, Relaxed);
            self.metrics.aborted.fetch_add(1, Relaxed);
            log("info", "transaction timed out; aborted", json!({"gtid": g}));
            self.spawn_completion(&g);
        }
        if self.enforcement.held_count() > 0 {
            let me = self.clone();
            tokio::spawn(async move { me.release_settled_holds().await });
        }
    }

    pub fn gauges(&self) -> Gauges {
        let txs = self.txs.lock().unwrap();
        let mut g = Gauges::default();
        for e in txs.values() {
            if e.tx.in_doubt() {
                g.in_doubt += 1;
                g.oldest_in_doubt_s = g.oldest_in_doubt_s.max(e.tx.created.elapsed().as_secs_f64());
            }
            if e.tx.is_undecided() {
                g.active += 1;
            }
            g.unconfigured_branches +=
                e.tx.branches.iter().filter(|b| b.state == BranchState::Prepared && self.kind_of(&b.resource).is_none()).count();
        }
        g.quarantined = self.quarantined.lock().unwrap().len();
        g.adopted_nodes = self.adopted.lock().unwrap().len();
        g
    }

    /// Undecided transactions (the "active set"): their prepared branches are left alone.
    pub fn active_set(&self) -> HashSet<String> {
        self.txs.lock().unwrap().values().filter(|e| e.tx.is_undecided()).map(|e| e.tx.gtid.clone()).collect()
    }

    /// Decision known in memory, and whether its owners' grace period is still running.
    pub fn decision_of(&self, gtid: &str) -> Option<(Outcome, bool)> {
        let grace = Duration::from_millis(self.cfg.timeouts.owner_grace_ms);
        let txs = self.txs.lock().unwrap();
        let e = txs.get(gtid)?;
        let o = e.tx.decision()?;
        // Loaded from the store: its owners are long gone, no grace.
        Some((o, !e.tx.recovered && e.tx.decided.map(|d| d.elapsed() < grace).unwrap_or(false)))
    }

    /// Branches recorded as prepared in decided transactions on `resource`.
    pub fn decided_prepared_on(&self, resource: &str) -> Vec<(String, String)> {
        let txs = self.txs.lock().unwrap();
        txs.values()
            .filter(|e| e.tx.decision().is_some())
            .flat_map(|e| {
                e.tx.branches
                    .iter()
                    .filter(|b| b.resource == resource && b.state == BranchState::Prepared)
                    .map(|b| (e.tx.gtid.clone(), b.branch_id.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    pub fn forget_finished(&self) {
        let gtids: Vec<String> = self.txs.lock().unwrap().keys().cloned().collect();
        for g in gtids {
            self.maybe_forget(&g);
        }
    }
}

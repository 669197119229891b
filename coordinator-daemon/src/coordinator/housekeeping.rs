//! Periodic housekeeping (timeouts, retention, a stalled store said once) and the gauges
//! the metrics endpoint renders.

use crate::config::Config;
use crate::ha::ownership::Ownership;
use crate::state::BranchState;
use crate::store::Store;
use crate::telemetry::gauges::Gauges;
use crate::telemetry::log::log;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::completion;
use super::deadlocks;
use super::decisions;
use super::holds::{self, Holds};
use super::parts::Parts;
use super::registry::Registry;

/// What to say about the store, given how long it has not answered: `Some(true)` it
/// stopped (said once per stall), `Some(false)` it answers again, None nothing new.
pub fn store_news(stalled_ms: u64, limit_ms: u64, was_stalled: bool) -> Option<bool> {
    if stalled_ms > limit_ms && !was_stalled {
        Some(true)
    } else if stalled_ms == 0 && was_stalled {
        Some(false)
    } else {
        None
    }
}

/// How long the store may take over one request before it counts as not answering (the
/// log below, readiness).
pub fn store_stall_limit_ms(cfg: &Config) -> u64 {
    cfg.lease.ttl_ms.min(2_000)
}

/// Says once per stall that the decision store stopped answering, and when it answers
/// again: a paused or partitioned store holds every commit and renewal silently.
fn watch_store(store: &Store, said_stalled: &AtomicBool, cfg: &Config) {
    let stalled = store.stats.stalled_ms();
    match store_news(stalled, store_stall_limit_ms(cfg), said_stalled.load(Relaxed)) {
        Some(true) => {
            said_stalled.store(true, Relaxed);
            log(
                "error",
                "decision store is not answering: commits wait for their records, the lease cannot be renewed",
                json!({"stalled_ms": stalled}),
            );
        }
        Some(false) => {
            said_stalled.store(false, Relaxed);
            log("warn", "decision store answers again", json!({}));
        }
        None => {}
    }
}

/// Abort what timed out, resolve what its owner left deciding past the grace period, drop
/// what is finished and old.
pub fn tick(c: &Arc<Parts>) {
    watch_store(&c.store, &c.store_stalled, &c.cfg);
    let retention = Duration::from_millis(c.cfg.timeouts.retention_ms);
    let now = Instant::now();
    if c.registry.sweep_due(now) {
        c.registry.sweep(now, retention);
    }
    for g in c.registry.time_out(now) {
        c.metrics.timeouts.fetch_add(1, Relaxed);
        c.metrics.aborted.fetch_add(1, Relaxed);
        log("info", "transaction timed out; aborted", json!({"gtid": g}));
        completion::spawn_completion(c, &g);
        deadlocks::spawn_cancel(c, &g);
    }
    deadlocks::tick(c, now);
    for g in c.registry.grace_over(now) {
        decisions::spawn_resolution(c, &g);
    }
    if c.enforcement.busy() {
        let me = c.clone();
        tokio::spawn(async move { holds::release_settled_holds(Holds::from(&me)).await });
    }
}

pub fn gauges(registry: &Registry, owner: &Ownership, cfg: &Config) -> Gauges {
    let mut g = Gauges::default();
    {
        let txs = registry.txs.lock().unwrap();
        for e in txs.values() {
            if e.tx.in_doubt() {
                g.in_doubt += 1;
                g.oldest_in_doubt_s = g.oldest_in_doubt_s.max(e.tx.created.elapsed().as_secs_f64());
            }
            if e.tx.is_undecided() {
                g.active += 1;
            }
            g.unconfigured_branches +=
                e.tx.branches
                    .iter()
                    .filter(|b| b.state == BranchState::Prepared && cfg.kind_of(&b.resource).is_none())
                    .count();
        }
    }
    g.quarantined = registry.quarantined.lock().unwrap().len();
    g.adopted_nodes = owner.adopted().len();
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_store_is_said_once_and_its_return_once() {
        assert_eq!(store_news(100, 2_000, false), None, "a slow answer is no stall");
        assert_eq!(store_news(2_001, 2_000, false), Some(true));
        assert_eq!(store_news(5_000, 2_000, true), None, "said already");
        assert_eq!(store_news(10, 2_000, true), None, "still waiting on an answer");
        assert_eq!(store_news(0, 2_000, true), Some(false));
        assert_eq!(store_news(0, 2_000, false), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gauges_count_the_live_state() {
        let c = crate::coordinator::tests::coord("gauges").await;
        let p = c.parts();
        let g1 = c.begin(None).unwrap().gtid;
        c.begin(None).unwrap();
        c.register(&g1, "pg", "b1").await.unwrap();
        c.commit_with(&g1, "coordinator", &["b1".into()]).await.unwrap();
        let g = gauges(&p.registry, &p.owner, &p.cfg);
        assert_eq!((g.active, g.in_doubt, g.quarantined, g.adopted_nodes), (1, 1, 0, 0));
        p.owner.granted("u9", 1);
        p.owner.adopt("u9");
        p.registry.quarantine(&crate::store::CorruptRecord { gtid: "u9-1-1".into(), problem: "x".into() });
        let g = gauges(&p.registry, &p.owner, &p.cfg);
        assert_eq!((g.quarantined, g.adopted_nodes), (1, 1));
    }
}

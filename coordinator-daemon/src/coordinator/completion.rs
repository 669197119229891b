//! Finishing the prepared branches of decided transactions from the daemon's own
//! connections: after the owners' grace period (owners finish their own branches), with
//! exponential backoff, or at once for an operator. Each attempt's result is booked here:
//! done, gone, incident, or retry. Also where a decision reaches memory (`apply_decided`,
//! what the store answered to a write; `apply_decision`; `adopt_records`): each leaves
//! completion to start (effects.rs), and `start` starts what the operations leave.

use crate::config::Config;
use crate::ha::ownership::Ownership;
use crate::naming;
use crate::participants::resources::{Clients, Completion};
use crate::refusal::RefusalCode;
use crate::state::{self, refuse, BranchState, FinishedBy, Outcome, Refusal};
use crate::store::{CorruptRecord, Decided, DecisionRecord, Store, Token};
use crate::telemetry::log::log;
use crate::telemetry::metrics::Metrics;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::effects::{Effect, Effects};
use super::health::ResourceHealth;
use super::holds;
use super::parts::Parts;
use super::registry::{Incident, Registry};

/// What finishing a branch uses: the resources' connections and what was last seen of
/// them, whose nodes we act for, memory, the incidents booked, the metrics, the config
/// (our node, the timeouts) and the store (a finished transaction's record let go of).
#[derive(Clone, Copy)]
pub struct Finishing<'a> {
    pub cfg: &'a Config,
    pub store: &'a Store,
    pub metrics: &'a Metrics,
    pub resources: &'a Clients,
    pub health: &'a ResourceHealth,
    pub incidents: &'a Mutex<Vec<Incident>>,
    pub registry: &'a Registry,
    pub owner: &'a Ownership,
}

impl<'a> From<&'a Parts> for Finishing<'a> {
    fn from(p: &'a Parts) -> Self {
        Finishing {
            cfg: &p.cfg,
            store: &p.store,
            metrics: &p.metrics,
            resources: &p.resources,
            health: &p.health,
            incidents: &p.incidents,
            registry: &p.registry,
            owner: &p.owner,
        }
    }
}

impl<'a> From<&'a Arc<Parts>> for Finishing<'a> {
    fn from(p: &'a Arc<Parts>) -> Self {
        Finishing::from(&**p)
    }
}

/// Starts, in order, what operations left to follow them: the only place (with the
/// background loops) that needs the parts shared, as the tasks outlive the call.
pub fn start(c: &Arc<Parts>, fx: Effects) {
    for e in fx.into_vec() {
        match e {
            Effect::Complete(g) => spawn_completion(c, &g),
            Effect::ReleaseOf(g) => holds::spawn_release_of(c, &g),
            Effect::Refill(r) => holds::spawn_refill(c, &r),
            Effect::RetryDecision(rec, fence) => spawn_decision_retry(c, rec, fence),
        }
    }
}

/// A decision write whose answer was lost (e.g. a PostgreSQL store's): unknown whether it
/// is durable, so the transaction stays Committing (never rolled back) and the idempotent
/// conditional insert is retried with backoff until the store answers.
fn spawn_decision_retry(c: &Arc<Parts>, rec: DecisionRecord, fence: Option<Token>) {
    let me = c.clone();
    tokio::spawn(async move {
        let stats = me.store.stats.clone();
        let mut delay = me.cfg.timeouts.retry_initial_ms;
        // Registered before each attempt, so that the store's first answer after the
        // attempt failed is not missed: the delay doubles while the store is away (up to
        // retry_max_ms), and a client polling for the outcome must not wait it out once
        // the store is back.
        let mut back = Box::pin(stats.back.notified());
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
                _ = &mut back => {}
            }
            back = Box::pin(stats.back.notified());
            if let Ok(d) = me.store.decide(rec.clone(), fence.clone()).await {
                let mut fx = Effects::default();
                let _ = apply_decided(&me.registry, &me.metrics, &mut fx, &rec.gtid, d);
                start(&me, fx);
                return;
            }
            delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
        }
    });
}

/// Applies what the store answered to a decision write: the outcome in force reaches
/// memory (and is returned), or the refusal the client hears.
pub fn apply_decided(
    registry: &Registry,
    metrics: &Metrics,
    fx: &mut Effects,
    gtid: &str,
    d: Decided,
) -> Result<Outcome, Refusal> {
    match d {
        Decided::Outcome(o) => {
            apply_decision(registry, metrics, fx, gtid, o);
            Ok(o)
        }
        Decided::Corrupt(problem) => {
            // The transaction stays Committing (never rolled back) until an operator decides.
            registry.quarantine(&CorruptRecord { gtid: gtid.to_string(), problem });
            refuse(RefusalCode::Quarantined, format!("{gtid}: an unreadable decision record exists; an operator must decide"))
        }
        // Written under a grant that is gone: nothing was written. Memory is not
        // touched: the daemon that lost its grant reconciles it with the store
        // (lease.rs), and the outcome is whatever the store then says.
        Decided::Forgotten => refuse(RefusalCode::OutcomeForgotten, format!("{gtid}: below its epoch's purge watermark, or of an epoch sealed by a store restore; no decision is written for it any more")),
        // The grant is gone: a value for the client (ask again), never a reaction here —
        // the renewal loop finds the loss and regains the node (ha/lease.rs).
        Decided::Fenced(why) => {
            log("warn", "decision not written: this daemon's lease grant for the transaction's node is gone", json!({"gtid": gtid, "why": why}));
            refuse(RefusalCode::LeaseLost, format!("{gtid}: this daemon lost its lease of the transaction's node before the decision was written; ask again for the outcome"))
        }
    }
}

/// A decision counted as committed or aborted.
pub fn count_decision(metrics: &Metrics, o: Outcome) {
    match o {
        Outcome::Commit => metrics.committed.fetch_add(1, Relaxed),
        Outcome::Abort => metrics.aborted.fetch_add(1, Relaxed),
    };
}

/// Gives one branch its decided outcome from our connection, holding the node's lock
/// at that resource first (a daemon that lost it must not act).
pub async fn complete_branch<'a>(
    c: impl Into<Finishing<'a>>,
    gtid: &str,
    res: &str,
    bid: &str,
    o: Outcome,
    prepared_ms_ago: u64,
) -> Completion {
    let c = c.into();
    let Some(rc) = c.resources.get(res) else {
        c.registry.warn_once(
            format!("unconfigured:{gtid}:{res}"),
            "branch on a resource that is not configured: it cannot be finished from here",
            json!({"gtid": gtid, "resource": res, "branch_id": bid, "outcome": o.as_str()}),
        );
        return Completion::Retry(format!("resource {res} is not configured"));
    };
    if c.owner.lease.expired() {
        return Completion::Retry("our node lease is unconfirmed".into());
    }
    let node = naming::gtid_node(gtid).unwrap_or_default();
    if !c.owner.acts_for(node) {
        return Completion::Retry(format!("node {node} is not ours (any more)"));
    }
    if let Err(e) = rc.hold_node_lock(node, node != c.cfg.node_id).await {
        return Completion::Retry(e);
    }
    rc.complete(gtid, bid, o, prepared_ms_ago).await
}

/// One attempt for every prepared branch of a decided transaction. Returns how many
/// branches are still unfinished.
pub async fn complete_pending<'a>(c: impl Into<Finishing<'a>>, gtid: &str, by: FinishedBy) -> usize {
    let c = c.into();
    let todo = {
        let txs = c.registry.txs.lock().unwrap();
        let Some(e) = txs.get(gtid) else { return 0 };
        let Some(o) = e.tx.decision() else { return 0 };
        e.tx.branches
            .iter()
            .filter(|b| b.state == BranchState::Prepared)
            .map(|b| (b.resource.clone(), b.branch_id.clone(), o))
            .collect::<Vec<_>>()
    };
    let mut left = 0;
    for (res, bid, o) in todo {
        // Read per branch, just before its attempt: the attempts before it take time.
        let ago = c.registry.prepared_ms_ago(gtid, &bid);
        let r = complete_branch(c, gtid, &res, &bid, o, ago).await;
        if !note_completion(c, gtid, &res, &bid, o, r, by) {
            left += 1;
        }
    }
    c.registry.maybe_forget(gtid, c.store);
    left
}

/// At an orderly stop: one attempt for every prepared branch of every decided transaction
/// in memory, without waiting out the owners' grace period. A stop right after commits were
/// answered would otherwise leave their branches prepared, holding their locks, until a
/// restart's or another daemon's recovery finds them. What fails here is left to those: the
/// decisions are durable.
pub async fn finish_decided_at_stop(c: Finishing<'_>) {
    for gtid in c.registry.decided_unfinished() {
        complete_pending(c, &gtid, FinishedBy::Daemon).await;
    }
}

/// Finishes the prepared branches of a decided transaction whose owners did not, after
/// a grace period for the owners; retries with exponential backoff.
pub fn spawn_completion(c: &Arc<Parts>, gtid: &str) {
    let recovered = {
        let mut txs = c.registry.txs.lock().unwrap();
        match txs.get_mut(gtid) {
            Some(e) if !e.completing => {
                e.completing = true;
                e.tx.recovered
            }
            _ => return,
        }
    };
    let me = c.clone();
    let gtid = gtid.to_string();
    tokio::spawn(async move {
        if !recovered {
            // Owners finish their own branches first; loaded records have no owners left.
            tokio::time::sleep(Duration::from_millis(me.cfg.timeouts.owner_grace_ms)).await;
        }
        let mut delay = me.cfg.timeouts.retry_initial_ms;
        let node = naming::gtid_node(&gtid).unwrap_or_default().to_string();
        // A node we gave back is its own daemon's to finish.
        while me.owner.acts_for(&node) && complete_pending(&me, &gtid, FinishedBy::Daemon).await > 0 {
            me.metrics.completion_retries.fetch_add(1, Relaxed);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
        }
        if let Some(e) = me.registry.txs.lock().unwrap().get_mut(&gtid) {
            e.completing = false;
        }
        super::holds::spawn_release_of(&me, &gtid);
        me.registry.maybe_forget(&gtid, &me.store);
    });
}

/// Applies the result of one completion attempt; true when the branch is settled.
pub fn note_completion<'a>(
    c: impl Into<Finishing<'a>>,
    gtid: &str,
    res: &str,
    bid: &str,
    o: Outcome,
    r: Completion,
    by: FinishedBy,
) -> bool {
    let c = c.into();
    c.health.note(res, !matches!(r, Completion::Retry(_)));
    // True when this attempt is the one that settles the branch (completion and
    // recovery may both be at it).
    let settle = |note: Option<String>| {
        let mut txs = c.registry.txs.lock().unwrap();
        if let Some(e) = txs.get_mut(gtid) {
            if let Some(b) = e.tx.branches.iter_mut().find(|b| b.branch_id == bid && b.resource == res) {
                if b.state == BranchState::Prepared || b.state == BranchState::Registered {
                    b.state = BranchState::Finished;
                    b.outcome = Some(o);
                    b.finished_by = Some(by);
                    b.note = note;
                    return true;
                }
                return false;
            }
        }
        true
    };
    match r {
        Completion::Done => {
            let m = match (by, o) {
                (FinishedBy::Recovery, Outcome::Commit) => &c.metrics.recovery_commit,
                (FinishedBy::Recovery, Outcome::Abort) => &c.metrics.recovery_rollback,
                (_, Outcome::Commit) => &c.metrics.completion_commit,
                (_, Outcome::Abort) => &c.metrics.completion_rollback,
            };
            m.fetch_add(1, Relaxed);
            log(
                "info",
                "branch completed",
                json!({"gtid": gtid, "branch_id": bid, "resource": res, "outcome": o.as_str(), "by": by}),
            );
            settle(None);
            true
        }
        Completion::Gone => {
            settle(Some("not prepared any more (finished by its owner)".into()));
            true
        }
        Completion::Incident(msg) => {
            if !settle(Some(format!("incident: {msg}"))) {
                return true; // booked already by the other attempt
            }
            c.metrics.incidents.fetch_add(1, Relaxed);
            log(
                "error",
                "incident: branch did not reach the decided outcome",
                json!({"gtid": gtid, "branch_id": bid, "resource": res, "error": msg}),
            );
            c.incidents.lock().unwrap().push(Incident {
                at_unix_ms: state::unix_ms(),
                gtid: gtid.into(),
                branch_id: bid.into(),
                resource: res.into(),
                message: msg,
            });
            true
        }
        Completion::OwnerAttached => false,
        Completion::Retry(err) => {
            log(
                "warn",
                "branch completion failed; will retry",
                json!({"gtid": gtid, "branch_id": bid, "resource": res, "error": err}),
            );
            false
        }
    }
}

/// A decision the store holds reaches memory: counted, published, its branches to finish.
pub fn apply_decision(registry: &Registry, metrics: &Metrics, fx: &mut Effects, gtid: &str, o: Outcome) {
    if !registry.apply_decision(gtid, o) {
        return; // applied already (a retry and a recovery pass may both bring it)
    }
    count_decision(metrics, o);
    fx.complete(gtid);
}

/// Durable decisions of nodes we act for, not yet in memory: their branches are unknown
/// until recovery looks, so recovery may act on them at once (no owner grace).
/// A record of a transaction that memory still shows committing (its write's answer
/// was lost, e.g. the store paused, and the retry has not come round yet) decides it
/// now: clients waiting on it hear the outcome, completion starts.
pub fn adopt_records<'a>(c: impl Into<Finishing<'a>>, fx: &mut Effects, recs: &[DecisionRecord]) -> usize {
    let c = c.into();
    let generation = |node: &str| c.owner.acts_for(node).then(|| c.owner.generation_of(node));
    let kind_of = |res: &str| c.cfg.kind_of(res);
    let (n, settled) = c.registry.adopt_records(recs, c.cfg.timeouts.transaction_ms, &generation, &kind_of);
    for (g, o) in settled {
        log(
            "info",
            "the store holds the decision of a transaction still committing in memory: applied",
            json!({"gtid": g, "outcome": o.as_str()}),
        );
        apply_decision(c.registry, c.metrics, fx, &g, o);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResourceKind;
    use crate::coordinator::registry::Entry;
    use crate::state::{Tx, TxState};

    /// A committed transaction of ours with prepared branches b1, b2 on "pg", not being
    /// completed (no task races the test).
    fn committed(p: &Parts, seq: u64) -> String {
        let g = naming::new_gtid("u1", p.owner.nonce, 1000 + seq);
        let mut tx = Tx::new(g.clone(), Duration::from_secs(60));
        for b in ["b1", "b2"] {
            tx.register(b, "pg", ResourceKind::Postgres).unwrap();
            tx.prepared(b).unwrap();
        }
        tx.settle(Outcome::Commit, String::new);
        let mut e = Entry::new(tx, false, 1);
        e.completing = true;
        p.registry.insert(&g, e);
        g
    }

    fn branch(p: &Parts, g: &str, b: &str) -> (BranchState, Option<String>) {
        p.registry
            .with_entry(g, |e| {
                e.tx.branches.iter().find(|x| x.branch_id == b).map(|x| (x.state, x.note.clone())).unwrap()
            })
            .here()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_attempt_is_booked_once() {
        let c = crate::coordinator::tests::coord("completion-book").await;
        let p = c.parts();
        let g = committed(p, 1);
        assert!(!note_completion(
            p,
            &g,
            "pg",
            "b1",
            Outcome::Commit,
            Completion::Retry("down".into()),
            FinishedBy::Daemon
        ));
        assert_eq!(p.health.get("pg"), Some(false));
        assert_eq!(branch(p, &g, "b1").0, BranchState::Prepared);
        assert!(!note_completion(p, &g, "pg", "b1", Outcome::Commit, Completion::OwnerAttached, FinishedBy::Daemon));
        assert!(note_completion(p, &g, "pg", "b1", Outcome::Commit, Completion::Done, FinishedBy::Recovery));
        assert_eq!(p.health.get("pg"), Some(true));
        assert_eq!(branch(p, &g, "b1"), (BranchState::Finished, None));
        assert_eq!((p.metrics.recovery_commit.load(Relaxed), p.metrics.completion_commit.load(Relaxed)), (1, 0));
        assert!(note_completion(
            p,
            &g,
            "pg",
            "b2",
            Outcome::Commit,
            Completion::Incident("rolled back".into()),
            FinishedBy::Daemon
        ));
        assert!(note_completion(
            p,
            &g,
            "pg",
            "b2",
            Outcome::Commit,
            Completion::Incident("rolled back".into()),
            FinishedBy::Recovery
        ));
        assert_eq!(p.incidents.lock().unwrap().len(), 1, "booked by the first attempt only");
        assert_eq!(p.metrics.incidents.load(Relaxed), 1);
        assert_eq!(branch(p, &g, "b2").1.as_deref(), Some("incident: rolled back"));
        let g2 = committed(p, 2);
        assert!(note_completion(p, &g2, "pg", "b1", Outcome::Commit, Completion::Gone, FinishedBy::Daemon));
        assert_eq!(
            branch(p, &g2, "b1"),
            (BranchState::Finished, Some("not prepared any more (finished by its owner)".into()))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_is_attempted_where_it_may_not_be() {
        let c = crate::coordinator::tests::coord("completion-where").await;
        let p = c.parts();
        let g = committed(p, 3);
        let r = complete_branch(p, &g, "nowhere", "b1", Outcome::Commit, 0).await;
        assert_eq!(r, Completion::Retry("resource nowhere is not configured".into()));
        let theirs = naming::new_gtid("u2", 1, 1);
        assert_eq!(
            complete_branch(p, &theirs, "pg", "b1", Outcome::Commit, 0).await,
            Completion::Retry("node u2 is not ours (any more)".into())
        );
        // The resource is unreachable: its node lock cannot be held, so nothing is done.
        assert!(matches!(complete_branch(p, &g, "pg", "b1", Outcome::Commit, 0).await, Completion::Retry(_)));
        assert_eq!(complete_pending(p, &g, FinishedBy::Daemon).await, 2, "both branches still to do");
        p.owner.lease.revoke();
        assert_eq!(
            complete_branch(p, &g, "pg", "b1", Outcome::Commit, 0).await,
            Completion::Retry("our node lease is unconfirmed".into())
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_decision_from_the_store_is_applied_and_counted_once() {
        let c = crate::coordinator::tests::coord("completion-apply").await;
        let p = c.parts();
        let g = c.begin(None).unwrap().gtid;
        let mut fx = Effects::default();
        apply_decision(&p.registry, &p.metrics, &mut fx, &g, Outcome::Abort);
        apply_decision(&p.registry, &p.metrics, &mut fx, &g, Outcome::Abort);
        assert_eq!(fx.as_slice(), [Effect::Complete(g.clone())], "completion left to start once");
        start(p, fx);
        assert_eq!(p.metrics.aborted.load(Relaxed), 1);
        let (state, recorded, completing) =
            p.registry.with_entry(&g, |e| (e.tx.state(), e.recorded, e.completing)).here().unwrap();
        assert_eq!((state, recorded, completing), (TxState::Aborted, true, true));
    }
}

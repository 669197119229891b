//! Client mode's holds as the coordinator sees them (crate::participants::enforcement does the I/O):
//! which branches still need their helper transaction and shim slot, letting go of the
//! rest, and the recovery pass's enforcement step (probe every resource again, recover
//! dangling helpers, watch MariaDB restarts).

use crate::config::{ResourceKind, Timeouts};
use crate::ha::ownership::Ownership;
use crate::naming;
use crate::participants::enforcement::runtime::Enforcement;
use crate::participants::enforcement::{Effective, Mode};
use crate::participants::resources::Clients;
use crate::state::{BranchState, Outcome, TxState};
use crate::telemetry::log::log;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

use super::parts::Parts;
use super::registry::Registry;

/// What the holds are kept and let go of with: the enforcement runtime and the resources'
/// connections it acts on, and, to judge whether a helper is still needed, memory, whose
/// nodes we act for and the owners' grace period. Callers pass their `Parts`, narrowed
/// to this (`From`).
#[derive(Clone, Copy)]
pub struct Holds<'a> {
    pub enforcement: &'a Enforcement,
    pub resources: &'a Clients,
    pub registry: &'a Registry,
    pub owner: &'a Ownership,
    pub timeouts: &'a Timeouts,
}

impl<'a> From<&'a Parts> for Holds<'a> {
    fn from(p: &'a Parts) -> Self {
        Holds {
            enforcement: &p.enforcement,
            resources: &p.resources,
            registry: &p.registry,
            owner: &p.owner,
            timeouts: &p.cfg.timeouts,
        }
    }
}

impl<'a> From<&'a Arc<Parts>> for Holds<'a> {
    fn from(p: &'a Arc<Parts>) -> Self {
        Holds::from(&**p)
    }
}

/// A helper that no live branch of ours holds stays only while its branch may still
/// commit: a branch of another node (not ours to touch), a prepared branch whose
/// transaction is not known aborted, or a registered branch of a live transaction.
pub fn keep_helper<'a>(c: impl Into<Holds<'a>>, gtid: &str, bid: &str, branch_prepared: bool) -> bool {
    let c = c.into();
    let Some(node) = naming::gtid_node(gtid) else { return true };
    if !c.owner.acts_for(node) {
        return true;
    }
    if let Some(e) = c.registry.txs.lock().unwrap().get(gtid) {
        if e.tx.is_undecided() {
            return branch_prepared
                || e.tx.branches.iter().any(|b| b.branch_id == bid && b.state == BranchState::Registered);
        }
    }
    match c.registry.decision_of(gtid, Duration::from_millis(c.timeouts.owner_grace_ms)) {
        Some((Outcome::Abort, _)) => false,
        // Committed and still prepared: recovery commits it, the next sweep lets go.
        // Not prepared: finished, or it never will be (an epoch that cannot decide).
        _ => branch_prepared,
    }
}

/// Does this branch no longer need protection? Its transaction aborted or forgotten,
/// the branch failed or finished (committed: commitment ordering asks nothing of a
/// committed branch). A branch being registered right now is not settled.
pub fn settled(r: &Registry, gtid: &str, bid: &str) -> bool {
    let txs = r.txs.lock().unwrap();
    let Some(e) = txs.get(gtid) else { return true };
    if e.tx.state() == TxState::Aborted {
        return true;
    }
    match e.tx.branches.iter().find(|b| b.branch_id == bid) {
        Some(b) => matches!(b.state, BranchState::Finished | BranchState::Failed),
        None => false,
    }
}

/// The daemon stops: settled holds let go of, and helpers no live branch holds.
pub async fn release_at_stop(c: Holds<'_>) {
    release_settled_holds(c).await;
    c.enforcement.let_go_unused(c.resources).await;
}

/// Lets go of every settled hold, and of helpers idle or whose rollback failed (the
/// housekeeping tick: the safety net under `spawn_release_of`).
pub async fn release_settled_holds(c: Holds<'_>) {
    if c.enforcement.held_count() > 0 {
        c.enforcement.release(c.resources, |g, b| settled(c.registry, g, b)).await;
    }
    c.enforcement.retire_idle(c.resources).await;
}

/// A branch of `gtid` may just have been settled (finished, failed, its transaction
/// aborted): its hold is let go of now, not at the next tick, so that a shared helper is
/// rolled back as soon as its last branch no longer needs it. Off the caller's path.
pub fn spawn_release_of(c: &Arc<Parts>, gtid: &str) {
    if c.enforcement.held_count() == 0 {
        return;
    }
    let (me, gtid) = (c.clone(), gtid.to_string());
    tokio::spawn(async move {
        me.enforcement.release(&me.resources, |g, b| g == gtid && settled(&me.registry, g, b)).await;
    });
}

/// After a client-mode registration: PostgreSQL's pool of ready helpers is topped up in
/// the background (the next registrations then find a key without a round trip).
pub fn spawn_refill(c: &Arc<Parts>, resource: &str) {
    if !c.enforcement.begin_refill(resource) {
        return;
    }
    let Some(rc) = c.resources.get(resource).cloned() else { return };
    let me = c.clone();
    tokio::spawn(async move { me.enforcement.refill(&rc).await });
}

/// A registration that failed after its hold was taken.
pub async fn release_hold<'a>(c: impl Into<Holds<'a>>, gtid: &str, bid: &str) {
    let c = c.into();
    c.enforcement.release(c.resources, |g, b| g == gtid && b == bid).await;
}

/// Part of every recovery pass: the mode of each resource asked again (a change is
/// logged), dangling helpers recovered, MariaDB restarts looked for (client mode). A
/// PostgreSQL resource's helpers are looked for whatever its mode now: an earlier run in
/// client mode may have left some (killed, or its resource since moved to engine mode),
/// and a prepared helper holds back the server's xmin until it is rolled back.
pub async fn enforcement_pass(c: Holds<'_>) {
    for rc in c.resources.values() {
        let eff = c.enforcement.refresh(rc).await;
        let helpers_may_be_left = rc.kind == ResourceKind::Postgres && matches!(eff, Effective::Mode(_));
        if eff != Effective::Mode(Mode::Client) && !helpers_may_be_left {
            continue;
        }
        match rc.kind {
            ResourceKind::Postgres => {
                let keep = |g: &str, b: &str, p: bool| keep_helper(c, g, b, p);
                if let Err(e) = c.enforcement.sweep_helpers(rc, &keep).await {
                    log(
                        "warn",
                        "client mode: cannot recover helper transactions; will retry",
                        json!({"resource": rc.name, "error": e}),
                    );
                }
            }
            ResourceKind::Mariadb => c.enforcement.look_at_restarts(rc).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::registry::Entry;
    use crate::state::Tx;

    #[test]
    fn a_branch_is_settled_once_failed_finished_or_its_transaction_aborted_or_gone() {
        let r = Registry::default();
        let g = naming::new_gtid("n1", 1, 1);
        r.insert(&g, Entry::new(Tx::new(g.clone(), Duration::from_secs(60)), false, 1));
        assert!(!settled(&r, &g, "b1"), "being registered right now");
        r.with_entry(&g, |e| e.tx.register("b1", "pg", ResourceKind::Postgres).unwrap());
        assert!(!settled(&r, &g, "b1"));
        r.with_entry(&g, |e| e.tx.failed("b1", "x", false).unwrap());
        assert!(settled(&r, &g, "b1"));
        assert!(settled(&r, "nope", "b1"), "forgotten");
    }
}

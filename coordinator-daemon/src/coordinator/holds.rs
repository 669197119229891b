//! Client mode's holds as the coordinator sees them (crate::participants::enforcement does the I/O):
//! which branches still need their helper transaction and shim slot, letting go of the
//! rest, and the recovery pass's enforcement step (probe every resource again, recover
//! dangling helpers, watch MariaDB restarts).

use crate::coordinator::Coordinator;
use crate::naming;
use crate::state::{BranchState, Outcome, TxState};
use std::sync::Arc;

impl Coordinator {
    /// A helper that no live branch of ours holds stays only while its branch may still
    /// commit: a branch of another node (not ours to touch), a prepared branch whose
    /// transaction is not known aborted, or a registered branch of a live transaction.
    pub fn keep_helper(&self, gtid: &str, bid: &str, branch_prepared: bool) -> bool {
        let Some(node) = naming::gtid_node(gtid) else { return true };
        if !self.acts_for(node) {
            return true;
        }
        if let Some(e) = self.txs.lock().unwrap().get(gtid) {
            if e.tx.is_undecided() {
                return branch_prepared || e.tx.branches.iter().any(|b| b.branch_id == bid && b.state == BranchState::Registered);
            }
        }
        match self.decision_of(gtid) {
            Some((Outcome::Abort, _)) => false,
            // Committed and still prepared: recovery commits it, the next sweep lets go.
            // Not prepared: finished, or it never will be (an epoch that cannot decide).
            _ => branch_prepared,
        }
    }

    /// Does this branch no longer need protection? Its transaction aborted or forgotten,
    /// the branch failed or finished (committed: commitment ordering asks nothing of a
    /// committed branch). A branch being registered right now is not settled.
    fn settled(&self, gtid: &str, bid: &str) -> bool {
        let txs = self.txs.lock().unwrap();
        let Some(e) = txs.get(gtid) else { return true };
        if e.tx.state == TxState::Aborted {
            return true;
        }
        match e.tx.branches.iter().find(|b| b.branch_id == bid) {
            Some(b) => matches!(b.state, BranchState::Finished | BranchState::Failed),
            None => false,
        }
    }

    /// Lets go of every settled hold (the housekeeping tick).
    pub async fn release_settled_holds(&self) {
        if self.enforcement.held_count() == 0 {
            return;
        }
        self.enforcement.release(&self.resources, |g, b| self.settled(g, b)).await;
    }

    /// A registration that failed after its hold was taken.
    pub async fn release_hold(&self, gtid: &str, bid: &str) {
        self.enforcement.release(&self.resources, |g, b| g == gtid && b == bid).await;
    }

    /// Part of every recovery pass: the mode of each resource asked again (a change is
    /// logged), client mode's dangling helpers recovered, MariaDB restarts looked for.
    pub async fn enforcement_pass(self: &Arc<Self>) {
        for rc in self.resources.values() {
            let eff = self.enforcement.refresh(rc).await;
            if eff != crate::participants::enforcement::Effective::Mode(crate::participants::enforcement::Mode::Client) {
                continue;
            }
            match rc.kind {
                crate::config::ResourceKind::Postgres => {
                    let keep = |g: &str, b: &str, p: bool| self.keep_helper(g, b, p);
                    if let Err(e) = self.enforcement.sweep_helpers(rc, &keep).await {
                        crate::telemetry::log::log("warn", "client mode: cannot recover helper transactions; will retry",
                            serde_json::json!({"resource": rc.name, "error": e}));
                    }
                }
                crate::config::ResourceKind::Mariadb => self.enforcement.look_at_restarts(rc).await,
            }
        }
    }
}

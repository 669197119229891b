//! Recovery, at start and periodically, in Citus' order:
//!   1. list our prepared branches on every resource (P1),
//!   2. take the active set (undecided transactions),
//!   3. read the decisions (store + memory),
//!   4. list the prepared branches again (P2).
//! Only branches in both P1 and P2 are acted on: such a branch was prepared before we
//! looked at the active set, so if its transaction is not in that set it was decided before
//! step 2 and step 3 sees the decision (a commit is durable before its transaction leaves
//! the active set). Recorded commit → COMMIT; otherwise (abort, or no record: presumed
//! abort) → ROLLBACK. A resource that cannot be listed is reported and retried next pass,
//! never skipped silently.

use crate::coordinator::{log, Coordinator};
use crate::naming;
use crate::state::{FinishedBy, Outcome};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What one branch found prepared should get. Pure, for unit tests.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Commit,
    Rollback,
    /// Undecided (active) or within its owner's grace period: leave it.
    Leave,
}

pub fn decide(decision: Option<(Outcome, bool)>, active: bool, recorded_commit: bool) -> Action {
    match decision {
        Some((_, true)) => Action::Leave,
        Some((Outcome::Commit, false)) => Action::Commit,
        Some((Outcome::Abort, false)) if recorded_commit => Action::Commit,
        Some((Outcome::Abort, false)) => Action::Rollback,
        None if recorded_commit => Action::Commit,
        None if active => Action::Leave,
        None => Action::Rollback,
    }
}

#[derive(Debug, Default)]
pub struct Report {
    pub committed: usize,
    pub rolled_back: usize,
    pub confirmed: usize,
    pub unreachable: Vec<String>,
}

pub async fn run_pass(c: &Arc<Coordinator>) -> Report {
    let mut rep = Report::default();
    let names: Vec<String> = c.resources.keys().cloned().collect();
    // 1. P1
    let mut p1: HashMap<String, HashSet<(String, String)>> = HashMap::new();
    for n in &names {
        match c.resources[n].list_prepared().await {
            Ok(v) => {
                p1.insert(n.clone(), v.into_iter().collect());
            }
            Err(e) => {
                log("warn", "recovery: resource unreachable; will retry", json!({"resource": n, "error": e}));
                c.resource_up.lock().unwrap().insert(n.clone(), false);
                rep.unreachable.push(n.clone());
            }
        }
    }
    // 2. active set
    let active = c.active_set();
    // 3. decisions: the store is the truth (it may be shared with other coordinators).
    let mut recorded: HashMap<String, Outcome> = HashMap::new();
    match c.store.load().await {
        Ok(recs) => {
            for r in recs {
                if naming::gtid_node(&r.gtid) == Some(c.cfg.node_id.as_str()) {
                    c.adopt_record(&r);
                    recorded.insert(r.gtid.clone(), r.outcome);
                }
            }
        }
        Err(e) => {
            // Without the decisions nothing may be rolled back: skip this pass entirely.
            log("error", "recovery: cannot read the decision store; pass skipped", json!({"error": e}));
            c.metrics.recovery_errors.fetch_add(1, Relaxed);
            rep.unreachable.push("(store)".into());
            return rep;
        }
    }
    // 4. P2, and act on P1 ∩ P2.
    for n in &names {
        let Some(first) = p1.get(n) else { continue };
        let second: HashSet<(String, String)> = match c.resources[n].list_prepared().await {
            Ok(v) => v.into_iter().collect(),
            Err(e) => {
                log("warn", "recovery: resource unreachable; will retry", json!({"resource": n, "error": e}));
                rep.unreachable.push(n.clone());
                continue;
            }
        };
        c.resource_up.lock().unwrap().insert(n.clone(), true);
        for (g, b) in first.intersection(&second) {
            if naming::gtid_node(g) != Some(c.cfg.node_id.as_str()) {
                continue; // another coordinator's transaction
            }
            let rec_commit = recorded.get(g) == Some(&Outcome::Commit);
            let action = decide(c.decision_of(g), active.contains(g), rec_commit);
            let o = match action {
                Action::Leave => continue,
                Action::Commit => Outcome::Commit,
                Action::Rollback => Outcome::Abort,
            };
            let res = c.resources[n].complete(g, b, o).await;
            let done = matches!(res, crate::resources::Completion::Done);
            if c.note_completion(g, n, b, o, res, FinishedBy::Recovery) && done {
                match o {
                    Outcome::Commit => rep.committed += 1,
                    Outcome::Abort => rep.rolled_back += 1,
                }
            }
        }
        // Branches of decided transactions that are prepared in neither list are finished.
        for (g, b) in c.decided_prepared_on(n) {
            if let Some((_, false)) = c.decision_of(&g) {
                if !first.contains(&(g.clone(), b.clone())) && !second.contains(&(g.clone(), b.clone())) {
                    let o = c.decision_of(&g).map(|x| x.0).unwrap_or(Outcome::Abort);
                    c.note_completion(&g, n, &b, o, crate::resources::Completion::Gone, FinishedBy::Recovery);
                    rep.confirmed += 1;
                }
            }
        }
    }
    if !rep.unreachable.is_empty() {
        c.metrics.recovery_errors.fetch_add(1, Relaxed);
    }
    c.metrics.recovery_runs.fetch_add(1, Relaxed);
    c.forget_finished();
    if rep.committed + rep.rolled_back > 0 {
        log("info", "recovery pass", json!({"committed": rep.committed, "rolled_back": rep.rolled_back, "confirmed": rep.confirmed, "unreachable": rep.unreachable}));
    }
    rep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_decisions() {
        // Unknown, not active: presumed abort.
        assert_eq!(decide(None, false, false), Action::Rollback);
        // Undecided and live: leave it.
        assert_eq!(decide(None, true, false), Action::Leave);
        // Recorded commit (e.g. after a restart): commit.
        assert_eq!(decide(None, false, true), Action::Commit);
        assert_eq!(decide(Some((Outcome::Commit, false)), false, true), Action::Commit);
        // Owner still in its grace period: leave it to the owner.
        assert_eq!(decide(Some((Outcome::Commit, true)), false, true), Action::Leave);
        assert_eq!(decide(Some((Outcome::Abort, false)), false, false), Action::Rollback);
    }
}

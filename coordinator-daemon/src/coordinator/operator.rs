//! Operator commands on the running daemon: force an outcome (audited before it acts), the
//! in-doubt report, quarantined records.

use crate::config::Config;
use crate::naming;
use crate::participants::enforcement::runtime::Enforcement;
use crate::participants::resources::Clients;
use crate::refusal::RefusalCode;
use crate::state::{self, refuse, FinishedBy, Outcome, Refusal, TxState};
use crate::store::{AuditEntry, DecisionRecord, Op, Store, StoreError};
use crate::telemetry::log::log;
use crate::wire::{self, Decided, Decision, ResourceEnforcement, ResourceInfo, Resources, TransactionList};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use super::answers::{self, Answering, Res};
use super::commit;
use super::completion::{self, Finishing};
use super::effects::Effects;
use super::health::ResourceHealth;
use super::operating::Operating;
use super::registry::Registry;

/// What a forced outcome does to a transaction memory holds in `state` (its commit
/// refused for `why_not_commit`, if it would be): pure, so every case is tested.
#[derive(Debug, PartialEq, Eq)]
pub enum Forced {
    Refuse(RefusalCode, &'static str),
    Refused(Refusal),
    /// Already decided so: finish its branches now.
    Complete,
    BeingWritten,
    Abort,
    Commit,
}

pub fn forced(state: TxState, why_not_commit: Option<Refusal>, outcome: Outcome) -> Forced {
    match (state, outcome) {
        (TxState::Committed | TxState::Committing, Outcome::Abort) => Forced::Refuse(RefusalCode::ContradictsDecision, "is decided commit"),
        (TxState::Aborted, Outcome::Commit) => Forced::Refuse(RefusalCode::ContradictsDecision, "is decided abort"),
        (TxState::Committed, Outcome::Commit) | (TxState::Aborted, Outcome::Abort) => Forced::Complete,
        (TxState::Committing, Outcome::Commit) => Forced::BeingWritten,
        (TxState::Deciding, _) => Forced::Refuse(RefusalCode::TransactionDeciding,
            "is being decided in its decision branch's commit; the daemon reads the outcome there (co.resolve) after the owners' grace period"),
        (TxState::OnePhase, _) => Forced::Refuse(RefusalCode::TransactionOnePhase, "commits in one phase on its owner's session"),
        (TxState::Active, Outcome::Abort) => Forced::Abort,
        (TxState::Active, Outcome::Commit) => match why_not_commit {
            Some(why) => Forced::Refused(why),
            None => Forced::Commit,
        },
    }
}

async fn audit(
    store: &Store,
    gtid: &str,
    outcome: Outcome,
    operator: &str,
    reason: &str,
    result: String,
) -> Result<(), StoreError> {
    let entry = AuditEntry {
        at_unix_ms: state::unix_ms(),
        gtid: gtid.to_string(),
        outcome: outcome.as_str().to_string(),
        operator: operator.to_string(),
        reason: reason.to_string(),
        result,
    };
    store.write(Op::Audit(entry)).await.map(|_| ())
}

/// Operator: force an outcome. Refuses to contradict a recorded decision. The audit
/// record of the attempt is durable before anything is done (no audit, no action);
/// its result is recorded after. `done`: what finishing its branches at once uses.
pub async fn force(
    c: Operating<'_>,
    done: Finishing<'_>,
    fx: &mut Effects,
    gtid: &str,
    outcome: Outcome,
    operator: &str,
    reason: &str,
) -> Res<Decision> {
    if let Err(e) = naming::check_id("gtid", gtid) {
        return refuse(e.code, e.message);
    }
    let node = naming::gtid_node(gtid).unwrap_or_default().to_string();
    let quarantined = c.registry.is_quarantined(gtid);
    let current = {
        let txs = c.registry.txs.lock().unwrap();
        txs.get(gtid).map(|e| (e.tx.state(), e.tx.check_commit().err()))
    };
    if current.is_none() && !quarantined && !c.owner.acts_for(&node) {
        // Another node's transaction: a recorded decision is never contradicted; anything
        // else is its owner's to decide (or a takeover's), never "abort" here.
        return Err(match answers::from_store(c, gtid).await {
            Ok(rec) if rec.outcome != outcome => Refusal::new(
                RefusalCode::ContradictsDecision,
                format!("{gtid} is decided {} (recorded by node {})", rec.outcome.as_str(), rec.node),
            ),
            Ok(_) => answers::ask_owner(c.into(), gtid).await,
            Err((_, why)) => why,
        });
    }
    if let Err(e) = audit(c.store, gtid, outcome, operator, reason, "attempt".into()).await {
        return refuse(
            RefusalCode::StoreUnavailable,
            format!("could not write the audit record, nothing was done: {e}"),
        );
    }
    let result: Res<Decision> = if quarantined {
        resolve_quarantined(c, done, fx, gtid, &node, outcome, operator).await
    } else {
        match current {
            None if outcome == Outcome::Abort => Ok(Decision {
                note: Some(
                    "no live transaction and no record: presumed abort; recovery rolls back any prepared branch".into(),
                ),
                ..Decision::new(gtid, Decided::Abort)
            }),
            None => refuse(
                RefusalCode::ContradictsDecision,
                format!("{gtid} has no commit record: its outcome is abort (presumed abort)"),
            ),
            Some((st, why)) => match forced(st, why, outcome) {
                Forced::Refuse(code, what) => refuse(code, format!("{gtid} {what}")),
                Forced::Refused(why) => Err(why),
                Forced::Complete => {
                    // The operator wants it finished now: one attempt per branch without
                    // waiting for the owners' grace period; what fails stays for the retries.
                    let left = completion::complete_pending(done, gtid, FinishedBy::Daemon).await;
                    Ok(Decision {
                        note: Some("already decided; completion attempted".into()),
                        unfinished_branches: Some(left as u64),
                        ..Decision::new(gtid, outcome.into())
                    })
                }
                Forced::BeingWritten => {
                    Ok(Decision { note: Some("decision being written".into()), ..Decision::new(gtid, Decided::Commit) })
                }
                Forced::Abort => commit::abort(c, fx, gtid, &format!("forced by {operator}: {reason}")).await,
                Forced::Commit => commit::commit_with(c, fx, gtid, "operator", &[]).await,
            },
        }
    };
    let res_text = match &result {
        Ok(v) => format!("ok: {}", wire::to_json(v)),
        Err(r) => format!("refused: {} {}", r.code, r.message),
    };
    if let Err(e) = audit(c.store, gtid, outcome, operator, reason, res_text).await {
        log(
            "error",
            "could not write the audit record of a forced outcome's result",
            json!({"gtid": gtid, "error": e}),
        );
    }
    if result.is_ok() {
        c.metrics.forced.fetch_add(1, Relaxed);
    }
    log(
        "warn",
        "operator forced an outcome",
        json!({"gtid": gtid, "outcome": outcome.as_str(), "operator": operator, "ok": result.is_ok()}),
    );
    result
}

/// A quarantined gtid gets the operator's outcome: its unreadable record is replaced,
/// and recovery finishes the branches it finds prepared.
async fn resolve_quarantined(
    c: Operating<'_>,
    done: Finishing<'_>,
    fx: &mut Effects,
    gtid: &str,
    node: &str,
    outcome: Outcome,
    operator: &str,
) -> Res<Decision> {
    // The branch list of an unreadable record is unknown: recovery finds the branches.
    let rec = DecisionRecord {
        gtid: gtid.to_string(),
        outcome,
        branches: branches_seen(c.resources, gtid).await,
        decided_unix_ms: state::unix_ms(),
        node: node.to_string(),
        source: "operator".into(),
    };
    if outcome == Outcome::Commit && rec.branches.is_empty() {
        return refuse(
            RefusalCode::NoBranches,
            format!("{gtid}: no prepared branch of it is found on any resource; nothing to commit"),
        );
    }
    c.store
        .write(Op::Overwrite(rec.clone()))
        .await
        .map_err(|e| Refusal::new(RefusalCode::StoreUnavailable, format!("could not replace the record: {e}")))?;
    c.registry.unquarantine(gtid);
    c.registry.remove(gtid);
    completion::adopt_records(done, fx, std::slice::from_ref(&rec));
    fx.complete(gtid);
    Ok(Decision {
        note: Some(format!("quarantined record replaced by {operator}'s decision; recovery finishes its branches")),
        branches: Some(rec.branches.len() as u64),
        ..Decision::new(gtid, outcome.into())
    })
}

/// Branches of `gtid` prepared on any configured resource now.
async fn branches_seen(resources: &Clients, gtid: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for (name, rc) in resources {
        if let Ok(v) = rc.list_prepared().await {
            out.extend(v.into_iter().filter(|(g, _)| g == gtid).map(|(_, b)| (name.clone(), b)));
        }
    }
    out
}

/// In-doubt transactions, oldest first, each prepared branch with what it blocks, plus
/// quarantined records and branches on resources no longer configured.
pub async fn in_doubt_report(c: Answering<'_>) -> Res<TransactionList> {
    let mut v = answers::list(c, Some("in_doubt"))?;
    for t in v.transactions.iter_mut() {
        for b in t.branches.iter_mut() {
            if b.state != Some(wire::BranchState::Prepared) {
                continue;
            }
            b.blocking = Some(match c.resources.get(&b.resource) {
                Some(rc) => rc.blocking_info(&t.gtid, &b.branch_id).await,
                None => wire::Blocking::error(format!(
                    "resource {} is not configured: this branch cannot be finished from here",
                    b.resource
                )),
            });
        }
    }
    let q: Vec<_> = c.registry.quarantined.lock().unwrap().values().cloned().collect();
    v.quarantined = Some(q.iter().map(Into::into).collect());
    Ok(v)
}

/// The configured resources with their health (the last contact) and how many
/// prepared, unfinished branches on each the daemon holds in memory.
pub fn resources_report(
    cfg: &Config,
    registry: &Registry,
    health: &ResourceHealth,
    enforcement: &Enforcement,
) -> Resources {
    let mut prepared: HashMap<String, u64> = HashMap::new();
    for e in registry.txs.lock().unwrap().values() {
        for b in e.tx.branches.iter().filter(|b| b.state == state::BranchState::Prepared) {
            *prepared.entry(b.resource.clone()).or_default() += 1;
        }
    }
    let resources = cfg
        .resources
        .iter()
        .map(|r| ResourceInfo {
            name: r.name.clone(),
            kind: r.kind.into(),
            up: health.get(&r.name),
            decisions: r.decisions,
            prepared_branches: prepared.get(&r.name).copied().unwrap_or(0),
            // Every configured resource has an enforcement state (Enforcement::new).
            enforcement: enforcement.report(&r.name).unwrap_or_else(|| ResourceEnforcement {
                configured: r.enforcement.as_str().into(),
                mode: "unknown".into(),
                reason: Some("no enforcement state".into()),
                slots_in_use: None,
                restart_gate: None,
            }),
        })
        .collect();
    Resources { resources }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every force is audited before it acts and after; a force never contradicts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forcing_is_audited_and_never_contradicts() {
        let c = crate::coordinator::tests::coord("force").await;
        let p = c.parts();
        let g = c.begin(None).unwrap().gtid;
        let v = c.force(&g, Outcome::Abort, "ops", "stuck").await.unwrap();
        assert_eq!(v.decision, Decided::Abort);
        assert_eq!(c.get(&g).await.unwrap().state, TxState::Aborted);
        assert_eq!(
            c.force(&g, Outcome::Commit, "ops", "oops").await.unwrap_err().code,
            RefusalCode::ContradictsDecision
        );
        let audit = p.store.audit_log().await.unwrap();
        assert_eq!(audit.len(), 4, "attempt and result of each force");
        assert_eq!(p.metrics.forced.load(Relaxed), 1);
        // No record, ours: presumed abort; a commit is a contradiction.
        let gone = naming::new_gtid("u1", p.owner.nonce, 999);
        assert_eq!(c.force(&gone, Outcome::Abort, "ops", "x").await.unwrap().decision, Decided::Abort);
        assert_eq!(
            c.force(&gone, Outcome::Commit, "ops", "x").await.unwrap_err().code,
            RefusalCode::ContradictsDecision
        );
        // Another node's, unknown here: its owner's, nothing audited.
        let n = p.store.audit_log().await.unwrap().len();
        let theirs = naming::new_gtid("u2", 1, 1);
        assert_eq!(c.force(&theirs, Outcome::Abort, "ops", "x").await.unwrap_err().code, RefusalCode::OwnerUnavailable);
        assert_eq!(p.store.audit_log().await.unwrap().len(), n);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_in_doubt_report_lists_quarantined_records() {
        let c = crate::coordinator::tests::coord("indoubt").await;
        let p = c.parts();
        let g = naming::new_gtid("u1", p.owner.nonce, 77);
        p.registry.quarantine(&crate::store::CorruptRecord { gtid: g.clone(), problem: "bad".into() });
        let r = in_doubt_report(p.into()).await.unwrap();
        assert!(r.transactions.is_empty());
        assert_eq!(r.quarantined.unwrap()[0].gtid, g);
        assert_eq!(c.get(&g).await.unwrap_err().code, RefusalCode::Quarantined);
    }

    #[test]
    fn a_forced_outcome_never_contradicts_a_decision() {
        use Forced::*;
        let contra = |f: Forced| matches!(f, Refuse(RefusalCode::ContradictsDecision, _));
        assert!(contra(forced(TxState::Committed, None, Outcome::Abort)));
        assert!(contra(forced(TxState::Committing, None, Outcome::Abort)));
        assert!(contra(forced(TxState::Aborted, None, Outcome::Commit)));
        assert_eq!(forced(TxState::Committed, None, Outcome::Commit), Complete);
        assert_eq!(forced(TxState::Aborted, None, Outcome::Abort), Complete);
        assert_eq!(forced(TxState::Committing, None, Outcome::Commit), BeingWritten);
        assert!(matches!(forced(TxState::Deciding, None, Outcome::Abort), Refuse(RefusalCode::TransactionDeciding, _)));
        assert!(matches!(
            forced(TxState::OnePhase, None, Outcome::Commit),
            Refuse(RefusalCode::TransactionOnePhase, _)
        ));
        assert_eq!(forced(TxState::Active, None, Outcome::Abort), Abort);
        assert_eq!(forced(TxState::Active, None, Outcome::Commit), Commit);
        let why = Refusal::new(RefusalCode::BranchNotPrepared, "b1");
        assert_eq!(forced(TxState::Active, Some(why.clone()), Outcome::Commit), Refused(why));
    }
}

//! Operator commands on the running daemon: force an outcome (audited before it acts), the
//! in-doubt report, quarantined records.

use crate::coordinator::{Coordinator, Res};
use crate::telemetry::log::log;
use crate::naming;
use crate::state::{self, refuse, FinishedBy, Outcome, Refusal, TxState};
use crate::store::{AuditEntry, DecisionRecord, Op};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use crate::refusal::RefusalCode;

impl Coordinator {
    async fn audit(&self, gtid: &str, outcome: Outcome, operator: &str, reason: &str, result: String) -> Result<(), String> {
        let entry = AuditEntry {
            at_unix_ms: state::unix_ms(),
            gtid: gtid.to_string(),
            outcome: outcome.as_str().to_string(),
            operator: operator.to_string(),
            reason: reason.to_string(),
            result,
        };
        self.store.write(Op::Audit(entry)).await.map(|_| ())
    }

    /// Operator: force an outcome. Refuses to contradict a recorded decision. The audit
    /// record of the attempt is durable before anything is done (no audit, no action);
    /// its result is recorded after.
    pub async fn force(self: &Arc<Self>, gtid: &str, outcome: Outcome, operator: &str, reason: &str) -> Res {
        if let Err(e) = naming::check_id("gtid", gtid) {
            return refuse(e.code, e.message);
        }
        let node = naming::gtid_node(gtid).unwrap_or_default().to_string();
        let quarantined = self.is_quarantined(gtid);
        let current = {
            let txs = self.txs.lock().unwrap();
            txs.get(gtid).map(|e| (e.tx.state, e.tx.check_commit().err()))
        };
        if current.is_none() && !quarantined && !self.acts_for(&node) {
            // Another node's transaction: a recorded decision is never contradicted; anything
            // else is its owner's to decide (or a takeover's), never "abort" here.
            if let Some(rec) = self.stored_decision(gtid).await? {
                if rec.outcome != outcome {
                    return refuse(RefusalCode::ContradictsDecision, format!("{gtid} is decided {} (recorded by node {})", rec.outcome.as_str(), rec.node));
                }
            }
            return Err(self.elsewhere(gtid).await);
        }
        if let Err(e) = self.audit(gtid, outcome, operator, reason, "attempt".into()).await {
            return refuse(RefusalCode::StoreUnavailable, format!("could not write the audit record, nothing was done: {e}"));
        }
        let result: Result<Value, Refusal> = if quarantined {
            self.resolve_quarantined(gtid, &node, outcome, operator).await
        } else {
            match (current, outcome) {
                (None, Outcome::Abort) => Ok(json!({"gtid": gtid, "decision": "abort", "note": "no live transaction and no record: presumed abort; recovery rolls back any prepared branch"})),
                (None, Outcome::Commit) => refuse(RefusalCode::ContradictsDecision, format!("{gtid} has no commit record: its outcome is abort (presumed abort)")),
                (Some((TxState::Committed | TxState::Committing, _)), Outcome::Abort) => {
                    refuse(RefusalCode::ContradictsDecision, format!("{gtid} is decided commit"))
                }
                (Some((TxState::Aborted, _)), Outcome::Commit) => refuse(RefusalCode::ContradictsDecision, format!("{gtid} is decided abort")),
                (Some((TxState::Committed, _)), Outcome::Commit) | (Some((TxState::Aborted, _)), Outcome::Abort) => {
                    // The operator wants it finished now: one attempt per branch without
                    // waiting for the owners' grace period; what fails stays for the retries.
                    let left = self.complete_pending(gtid, FinishedBy::Daemon).await;
                    Ok(json!({"gtid": gtid, "decision": outcome.as_str(), "note": "already decided; completion attempted", "unfinished_branches": left}))
                }
                (Some((TxState::Committing, _)), Outcome::Commit) => Ok(json!({"gtid": gtid, "decision": "commit", "note": "decision being written"})),
                (Some((TxState::Deciding, _)), _) => refuse(RefusalCode::TransactionDeciding,
                    format!("{gtid} is being decided in its decision branch's commit; the daemon reads the outcome there (co.resolve) after the owners' grace period")),
                (Some((TxState::OnePhase, _)), _) => refuse(RefusalCode::TransactionOnePhase, format!("{gtid} commits in one phase on its owner's session")),
                (Some((TxState::Active, _)), Outcome::Abort) => self.abort(gtid, &format!("forced by {operator}: {reason}")).await,
                (Some((TxState::Active, Some(why))), Outcome::Commit) => Err(why),
                (Some((TxState::Active, None)), Outcome::Commit) => self.commit(gtid, "operator").await,
            }
        };
        let res_text = match &result {
            Ok(v) => format!("ok: {v}"),
            Err(r) => format!("refused: {} {}", r.code, r.message),
        };
        if let Err(e) = self.audit(gtid, outcome, operator, reason, res_text).await {
            log("error", "could not write the audit record of a forced outcome's result", json!({"gtid": gtid, "error": e}));
        }
        if result.is_ok() {
            self.metrics.forced.fetch_add(1, Relaxed);
        }
        log("warn", "operator forced an outcome", json!({"gtid": gtid, "outcome": outcome.as_str(), "operator": operator, "ok": result.is_ok()}));
        result
    }

    /// A quarantined gtid gets the operator's outcome: its unreadable record is replaced,
    /// and recovery finishes the branches it finds prepared.
    async fn resolve_quarantined(self: &Arc<Self>, gtid: &str, node: &str, outcome: Outcome, operator: &str) -> Res {
        // The branch list of an unreadable record is unknown: recovery finds the branches.
        let rec = DecisionRecord {
            gtid: gtid.to_string(),
            outcome,
            branches: self.branches_seen(gtid).await,
            decided_unix_ms: state::unix_ms(),
            node: node.to_string(),
            source: "operator".into(),
        };
        if outcome == Outcome::Commit && rec.branches.is_empty() {
            return refuse(RefusalCode::NoBranches, format!("{gtid}: no prepared branch of it is found on any resource; nothing to commit"));
        }
        self.store
            .write(Op::Overwrite(rec.clone()))
            .await
            .map_err(|e| Refusal::new(RefusalCode::StoreUnavailable, format!("could not replace the record: {e}")))?;
        self.quarantined.lock().unwrap().remove(gtid);
        self.txs.lock().unwrap().remove(gtid);
        self.adopt_records(std::slice::from_ref(&rec));
        self.spawn_completion(gtid);
        Ok(json!({"gtid": gtid, "decision": outcome.as_str(), "note": format!("quarantined record replaced by {operator}'s decision; recovery finishes its branches"), "branches": rec.branches.len()}))
    }

    /// Branches of `gtid` prepared on any configured resource now.
    async fn branches_seen(&self, gtid: &str) -> Vec<(String, String)> {
        let mut out = vec![];
        for (name, rc) in &self.resources {
            if let Ok(v) = rc.list_prepared().await {
                out.extend(v.into_iter().filter(|(g, _)| g == gtid).map(|(_, b)| (name.clone(), b)));
            }
        }
        out
    }

    /// In-doubt transactions, oldest first, each prepared branch with what it blocks, plus
    /// quarantined records and branches on resources no longer configured.
    pub async fn in_doubt_report(&self) -> Res {
        let mut v = self.list(Some("in_doubt"))?;
        for t in v["transactions"].as_array_mut().into_iter().flatten() {
            let gtid = t["gtid"].as_str().unwrap_or_default().to_string();
            for b in t["branches"].as_array_mut().into_iter().flatten() {
                if b["state"] != "prepared" {
                    continue;
                }
                let res = b["resource"].as_str().unwrap_or_default().to_string();
                let bid = b["branch_id"].as_str().unwrap_or_default().to_string();
                b["blocking"] = match self.resources.get(&res) {
                    Some(rc) => rc.blocking_info(&gtid, &bid).await,
                    None => json!({"error": format!("resource {res} is not configured: this branch cannot be finished from here")}),
                };
            }
        }
        let q: Vec<_> = self.quarantined.lock().unwrap().values().cloned().collect();
        v["quarantined"] = json!(q);
        Ok(v)
    }
}

impl Coordinator {
    /// The configured resources with their health (the last contact) and how many
    /// prepared, unfinished branches on each the daemon holds in memory.
    pub fn resources_report(&self) -> Value {
        let mut prepared: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        let txs = self.txs.lock().unwrap();
        for e in txs.values() {
            for b in e.tx.branches.iter().filter(|b| b.state == state::BranchState::Prepared) {
                *prepared.entry(b.resource.as_str()).or_default() += 1;
            }
        }
        let up = self.resource_up.lock().unwrap();
        let list: Vec<Value> = self
            .cfg
            .resources
            .iter()
            .map(|r| json!({"name": r.name, "kind": r.kind, "up": up.get(&r.name), "decisions": r.decisions,
                            "prepared_branches": prepared.get(r.name.as_str()).copied().unwrap_or(0),
                            "enforcement": self.enforcement.report(&r.name)}))
            .collect();
        json!({"resources": list})
    }
}

//! The global decision inside a participant's commit: every other branch is prepared, and
//! the last branch (on a PostgreSQL resource with pg_co, `decisions = true`) commits in one
//! phase with `SELECT co.decide(gtid)`, which writes the decision row in that same local
//! transaction. The daemon writes nothing: the transaction is `deciding` until the owner
//! reports the branch's outcome, or, when the owner is silent past its grace period, until
//! the daemon reads it there with `co.resolve(gtid)` (which records abort when no decision
//! committed, and waits for an open one: the unique index orders the two).
//!
//! Recovery: a prepared branch whose gtid has no decision here may belong to such a
//! transaction, so before presuming abort recovery resolves it at every decision resource
//! (batched); a committed decision found there wins. Committed decision rows are deleted
//! once every branch is finished; abort rows stay (a decision branch paused before
//! `co.decide` must keep finding them). docs/coordinator.md, "Decision in a participant".

use crate::config::ResourceKind;
use crate::coordinator::{Coordinator, Res};
use crate::telemetry::log::log;
use crate::naming;
use crate::participants::resources::{pg_err, ResourceClient};
use crate::state::{refuse, FinishedBy, Outcome, TxState};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use crate::refusal::RefusalCode;

/// How long co.resolve waits for an open co.decide of the same gtid before this attempt
/// gives up (the next attempt asks again).
const RESOLVE_LOCK_TIMEOUT_MS: u64 = 2_000;

fn array_literal(gtids: &[String]) -> String {
    let items: Vec<String> = gtids.iter().map(|g| naming::quote_pg(g)).collect();
    format!("ARRAY[{}]::text[]", items.join(","))
}

impl ResourceClient {
    /// The outcome of each gtid here (co.resolve: abort is recorded where no decision
    /// committed). One round trip for the batch; when it fails (e.g. one gtid's decision
    /// is held open past the lock timeout) each gtid is asked alone, and gtids that still
    /// fail are left out: unknown this time.
    pub async fn resolve_decisions(&self, gtids: &[String]) -> Result<HashMap<String, Outcome>, String> {
        match self.resolve_batch(gtids).await {
            Ok(m) => Ok(m),
            Err(e) if gtids.len() == 1 => Err(e),
            Err(_) => {
                let mut out = HashMap::new();
                let mut last = None;
                for g in gtids {
                    match self.resolve_batch(std::slice::from_ref(g)).await {
                        Ok(m) => out.extend(m),
                        Err(e) => last = Some(e),
                    }
                }
                match (out.is_empty(), last) {
                    (true, Some(e)) => Err(e),
                    _ => Ok(out),
                }
            }
        }
    }

    async fn resolve_batch(&self, gtids: &[String]) -> Result<HashMap<String, Outcome>, String> {
        if gtids.is_empty() {
            return Ok(HashMap::new());
        }
        // One implicit transaction at READ COMMITTED (co.resolve must see a decision that
        // commits while it waits); the abort rows commit with it.
        let sql = format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {RESOLVE_LOCK_TIMEOUT_MS}; \
             SELECT g, co.resolve(g) FROM unnest({}) AS g",
            array_literal(gtids)
        );
        let q = tokio::time::timeout(Duration::from_millis(RESOLVE_LOCK_TIMEOUT_MS + 10_000), self.pg_simple(&sql));
        let msgs = match q.await {
            Ok(r) => r.map_err(|e| format!("{}: {}", self.name, pg_err(&e)))?,
            Err(_) => return Err(format!("{}: timed out resolving decisions", self.name)),
        };
        let mut out = HashMap::new();
        for m in msgs {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                if let (Some(g), Some(o)) = (r.get(0), r.get(1).and_then(Outcome::parse)) {
                    out.insert(g.to_string(), o);
                }
            }
        }
        Ok(out)
    }

    /// Deletes committed decision rows of finished transactions (co.forget).
    pub async fn forget_decisions(&self, gtids: &[String]) -> Result<(), String> {
        let sql = format!("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SELECT co.forget({})", array_literal(gtids));
        match tokio::time::timeout(Duration::from_secs(15), self.pg_simple(&sql)).await {
            Ok(r) => r.map(|_| ()).map_err(|e| format!("{}: {}", self.name, pg_err(&e))),
            Err(_) => Err(format!("{}: timed out forgetting decisions", self.name)),
        }
    }
}

impl Coordinator {
    /// Resources that may carry global decisions (config `decisions = true`).
    pub fn decision_resources(&self) -> Vec<String> {
        self.cfg.resources.iter().filter(|r| r.decisions && r.kind == ResourceKind::Postgres).map(|r| r.name.clone()).collect()
    }

    /// Commit with the decision in branch `bid`: the other branches are prepared (those in
    /// `prepared` are reported here), `bid` is on a decision resource. Nothing is written:
    /// the owner now runs co.decide and COMMIT on `bid` and reports the outcome.
    pub async fn commit_decide_in(self: &Arc<Self>, gtid: &str, prepared: &[String], bid: &str) -> Res {
        if self.lease.expired() {
            return refuse(RefusalCode::LeaseUnconfirmed, format!("node {}'s lease could not be renewed in time: no new work until it is", self.cfg.node_id));
        }
        let allowed = self.decision_resources();
        if self.enforcement.holds(gtid, bid) {
            return refuse(RefusalCode::NotADecisionResource, format!("branch {bid:?} is in client mode: the decision inside a participant needs pg_co there"));
        }
        self.on_tx(gtid, |e| {
            let mut next = e.tx.clone();
            for p in prepared {
                next.prepared(p)?;
            }
            next.check_decide_in(bid)?;
            let res = &next.branches.iter().find(|b| b.branch_id == bid).expect("checked").resource;
            if !allowed.contains(res) {
                return refuse(RefusalCode::NotADecisionResource,
                    format!("branch {bid:?} is on resource {res:?}, which is not configured with decisions = true (PostgreSQL with pg_co)"));
            }
            next.state = TxState::Deciding;
            next.decide_in = Some(bid.to_string());
            e.tx = next;
            Ok(())
        })
        .await?;
        self.metrics.decided_in_participant.fetch_add(1, Relaxed);
        self.spawn_resolution(gtid);
        Ok(json!({"gtid": gtid, "decision": "in_participant", "branch_id": bid}))
    }

    /// After the owners' grace period, a transaction still deciding is resolved at its
    /// decision branch's resource; retried with backoff until that resource answers.
    fn spawn_resolution(self: &Arc<Self>, gtid: &str) {
        let me = self.clone();
        let gtid = gtid.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(me.cfg.timeouts.owner_grace_ms)).await;
            let mut delay = me.cfg.timeouts.retry_initial_ms;
            loop {
                let res = {
                    let txs = me.txs.lock().unwrap();
                    match txs.get(&gtid) {
                        Some(e) if e.tx.state == TxState::Deciding => {
                            let bid = e.tx.decide_in.clone().unwrap_or_default();
                            e.tx.branches.iter().find(|b| b.branch_id == bid).map(|b| b.resource.clone())
                        }
                        _ => return,
                    }
                };
                let Some(rc) = res.and_then(|r| me.resources.get(&r).cloned()) else { return };
                if !me.lease.expired() {
                    match rc.resolve_decisions(std::slice::from_ref(&gtid)).await {
                        Ok(m) if m.contains_key(&gtid) => {
                            let o = m[&gtid];
                            log("info", "decision read from the decision branch's resource (owner silent)", json!({"gtid": gtid, "resource": rc.name, "outcome": o.as_str()}));
                            me.apply_participant_decision(&gtid, o, FinishedBy::Daemon);
                            return;
                        }
                        Ok(_) => {}
                        Err(e) => log("warn", "cannot resolve a deciding transaction yet; will retry", json!({"gtid": gtid, "error": e})),
                    }
                }
                tokio::time::sleep(Duration::from_millis(delay)).await;
                delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
            }
        });
    }

    /// The decision branch's outcome is known: publish it and finish the other branches.
    pub fn apply_participant_decision(self: &Arc<Self>, gtid: &str, o: Outcome, by: FinishedBy) {
        let changed = {
            let mut txs = self.txs.lock().unwrap();
            match txs.get_mut(gtid) {
                Some(e) if e.tx.state == TxState::Deciding => {
                    e.tx.decided_in_participant(o, by);
                    e.publish();
                    true
                }
                _ => false,
            }
        };
        if changed {
            self.count_decision(o);
            self.spawn_completion(gtid);
        }
    }

    /// Recovery: the outcome of gtids that have no decision here, at every decision
    /// resource. A gtid is answered only when every decision resource answered for it;
    /// commit wins (only the decision branch's resource can hold one).
    pub async fn resolve_in_participants(&self, gtids: &[String]) -> HashMap<String, Outcome> {
        let names = self.decision_resources();
        let mut answered: HashMap<String, (usize, Outcome)> = HashMap::new();
        for chunk in gtids.chunks(500) {
            for n in &names {
                match self.resources[n].resolve_decisions(chunk).await {
                    Ok(m) => {
                        for (g, o) in m {
                            let a = answered.entry(g).or_insert((0, Outcome::Abort));
                            a.0 += 1;
                            if o == Outcome::Commit {
                                a.1 = Outcome::Commit;
                            }
                        }
                    }
                    Err(e) => log("warn", "recovery: cannot resolve at a decision resource; those transactions wait", json!({"resource": n, "error": e})),
                }
            }
        }
        answered.into_iter().filter(|(_, (k, _))| *k == names.len()).map(|(g, (_, o))| (g, o)).collect()
    }

    /// Deletes the committed decision rows of finished transactions, batched per pass.
    pub async fn flush_forgotten_decisions(&self) {
        let gtids: Vec<String> = std::mem::take(&mut *self.decisions_to_forget.lock().unwrap());
        if gtids.is_empty() {
            return;
        }
        for n in self.decision_resources() {
            if let Err(e) = self.resources[&n].forget_decisions(&gtids).await {
                // Rows left behind cost a little space; the next pass does not retry them.
                log("warn", "cannot delete finished decision rows", json!({"resource": n, "error": e, "count": gtids.len()}));
            }
        }
    }
}

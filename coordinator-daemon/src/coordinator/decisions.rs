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
//! The commit request itself (`commit_decide_in`) is a commit path: commit.rs.

use crate::config::{Config, Resource, ResourceKind};
use crate::ha::ownership::Ownership;
use crate::naming;
use crate::participants::resources::{pg_err, Clients, ResourceClient, ResourceError};
use crate::state::{self, FinishedBy, Outcome, TxState};
use crate::telemetry::log::log;
use crate::telemetry::metrics::Metrics;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::completion;
use super::parts::Parts;
use super::registry::{Entry, Registry};

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
    pub async fn resolve_decisions(&self, gtids: &[String]) -> Result<HashMap<String, Outcome>, ResourceError> {
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

    async fn resolve_batch(&self, gtids: &[String]) -> Result<HashMap<String, Outcome>, ResourceError> {
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
            Ok(r) => r.map_err(|e| self.failed(&e))?,
            Err(_) => return Err(ResourceError::Unreachable(format!("{}: timed out resolving decisions", self.name))),
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
    pub async fn forget_decisions(&self, gtids: &[String]) -> Result<(), ResourceError> {
        let sql = format!("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SELECT co.forget({})", array_literal(gtids));
        match tokio::time::timeout(Duration::from_secs(15), self.pg_simple(&sql)).await {
            Ok(r) => r.map(|_| ()).map_err(|e| self.failed(&e)),
            Err(_) => Err(ResourceError::Unreachable(format!("{}: timed out forgetting decisions", self.name))),
        }
    }

    /// A PostgreSQL error here, of its kind (the server answered: SQL; else unreachable),
    /// named after the resource.
    fn failed(&self, e: &tokio_postgres::Error) -> ResourceError {
        ResourceError::from_driver(e.as_db_error().is_some(), format!("{}: {}", self.name, pg_err(e)))
    }
}

/// Resources that may carry global decisions (config `decisions = true`).
pub fn decision_resources_of(resources: &[Resource]) -> Vec<String> {
    resources.iter().filter(|r| r.decisions && r.kind == ResourceKind::Postgres).map(|r| r.name.clone()).collect()
}

pub fn decision_resources(cfg: &Config) -> Vec<String> {
    decision_resources_of(&cfg.resources)
}

/// After the owners' grace period (the tick finds it over: Registry::grace_over), a
/// transaction still deciding is resolved at its decision branch's resource; retried with
/// backoff until that resource answers.
pub fn spawn_resolution(c: &Arc<Parts>, gtid: &str) {
    let me = c.clone();
    let gtid = gtid.to_string();
    tokio::spawn(async move {
        let mut delay = me.cfg.timeouts.retry_initial_ms;
        loop {
            // Taken before the attempt, so that the decision resource's return during it
            // is not missed: once anything reaches it again, the next try comes at once,
            // not after a delay grown while it was away (health.rs).
            let back = me.health.back.notified();
            let res = {
                let txs = me.registry.txs.lock().unwrap();
                match txs.get(&gtid) {
                    Some(e) if e.tx.state() == TxState::Deciding => {
                        let bid = e.tx.decide_in.clone().unwrap_or_default();
                        e.tx.branches.iter().find(|b| b.branch_id == bid).map(|b| b.resource.clone())
                    }
                    _ => return,
                }
            };
            let Some(rc) = res.and_then(|r| me.resources.get(&r).cloned()) else { return };
            if !me.owner.lease.expired() {
                let answer = rc.resolve_decisions(std::slice::from_ref(&gtid)).await;
                // A SQL error (co.resolve's lock timeout under an open co.decide) is an answer.
                me.health.note(&rc.name, !matches!(answer, Err(ResourceError::Unreachable(_))));
                match answer {
                    Ok(m) if m.contains_key(&gtid) => {
                        let o = m[&gtid];
                        log(
                            "info",
                            "decision read from the decision branch's resource (owner silent)",
                            json!({"gtid": gtid, "resource": rc.name, "outcome": o.as_str()}),
                        );
                        if apply_participant_decision(&me.registry, &me.metrics, &gtid, o, FinishedBy::Daemon) {
                            completion::spawn_completion(&me, &gtid);
                        }
                        return;
                    }
                    Ok(_) => {}
                    Err(e) => log(
                        "warn",
                        "cannot resolve a deciding transaction yet; will retry",
                        json!({"gtid": gtid, "error": e}),
                    ),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
                _ = back => {}
            }
            delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
        }
    });
}

/// The decision branch's outcome is known: published and counted. True when this call
/// decided it: the caller then has the other branches finished (completion).
pub fn apply_participant_decision(
    registry: &Registry,
    metrics: &Metrics,
    gtid: &str,
    o: Outcome,
    by: FinishedBy,
) -> bool {
    let changed = {
        let mut txs = registry.txs.lock().unwrap();
        match txs.get_mut(gtid) {
            Some(e) if e.tx.state() == TxState::Deciding => {
                e.tx.decided_in_participant(o, by);
                e.publish();
                true
            }
            _ => false,
        }
    };
    if changed {
        completion::count_decision(metrics, o);
    }
    changed
}

/// A transaction recovery found committed in a participant: in memory as committed
/// (its branches seen this pass), so completion and the decision endpoint know it.
/// `complete`: every resource was listed, so these are all its branches and its
/// decision row may go once they are finished; otherwise the row stays.
pub fn adopt_participant_commit(
    cfg: &Config,
    owner: &Ownership,
    registry: &Registry,
    gtid: &str,
    branches: &[(String, String)],
    complete: bool,
) {
    if registry.contains(gtid) {
        return;
    }
    let mut tx = state::Tx::new(gtid.to_string(), Duration::from_millis(cfg.timeouts.transaction_ms));
    tx.recovered = true;
    for (res, bid) in branches {
        let _ = tx.register(bid, res, cfg.kind_of(res).unwrap_or(ResourceKind::Postgres));
        let _ = tx.prepared(bid);
    }
    tx.committed_in_participant();
    let mut e = Entry::new(tx, false, owner.generation_of(naming::gtid_node(gtid).unwrap_or_default()));
    e.dip_forgotten = !complete;
    registry.insert(gtid, e);
    log("info", "recovery: decision found committed in a participant", json!({"gtid": gtid, "branches": branches}));
}

/// Merges the answers of the decision resources: a gtid is answered only when every one
/// of the `asked` resources answered for it; commit wins (only the decision branch's
/// resource can hold one).
pub fn merge_answers(
    asked: usize,
    answers: impl IntoIterator<Item = HashMap<String, Outcome>>,
) -> HashMap<String, Outcome> {
    let mut answered: HashMap<String, (usize, Outcome)> = HashMap::new();
    for m in answers {
        for (g, o) in m {
            let a = answered.entry(g).or_insert((0, Outcome::Abort));
            a.0 += 1;
            if o == Outcome::Commit {
                a.1 = Outcome::Commit;
            }
        }
    }
    answered.into_iter().filter(|(_, (k, _))| *k == asked).map(|(g, (_, o))| (g, o)).collect()
}

/// Recovery: the outcome of gtids that have no decision here, at every decision
/// resource (see `merge_answers`).
pub async fn resolve_in_participants(cfg: &Config, resources: &Clients, gtids: &[String]) -> HashMap<String, Outcome> {
    let names = decision_resources(cfg);
    let mut out = HashMap::new();
    for chunk in gtids.chunks(500) {
        let mut answers = vec![];
        for n in &names {
            match resources[n].resolve_decisions(chunk).await {
                Ok(m) => answers.push(m),
                Err(e) => log(
                    "warn",
                    "recovery: cannot resolve at a decision resource; those transactions wait",
                    json!({"resource": n, "error": e}),
                ),
            }
        }
        out.extend(merge_answers(names.len(), answers));
    }
    out
}

/// Deletes the committed decision rows of finished transactions, batched per pass.
pub async fn flush_forgotten_decisions(cfg: &Config, resources: &Clients, registry: &Registry) {
    let gtids: Vec<String> = std::mem::take(&mut *registry.decisions_to_forget.lock().unwrap());
    if gtids.is_empty() {
        return;
    }
    for n in decision_resources(cfg) {
        if let Err(e) = resources[&n].forget_decisions(&gtids).await {
            // Rows left behind cost a little space; the next pass does not retry them.
            log(
                "warn",
                "cannot delete finished decision rows",
                json!({"resource": n, "error": e, "count": gtids.len()}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_of_gtids_is_one_quoted_array() {
        let a = array_literal(&["n1-1-1".into(), "it's".into()]);
        assert_eq!(a, "ARRAY['n1-1-1','it''s']::text[]");
    }

    #[test]
    fn an_answer_counts_only_when_every_decision_resource_gave_it_and_commit_wins() {
        let m = |v: &[(&str, Outcome)]| v.iter().map(|(g, o)| (g.to_string(), *o)).collect::<HashMap<_, _>>();
        let out = merge_answers(
            2,
            vec![
                m(&[("a", Outcome::Abort), ("b", Outcome::Abort), ("c", Outcome::Commit)]),
                m(&[("a", Outcome::Commit), ("b", Outcome::Abort)]),
            ],
        );
        assert_eq!(out.get("a"), Some(&Outcome::Commit), "commit at either resource wins");
        assert_eq!(out.get("b"), Some(&Outcome::Abort));
        assert_eq!(out.get("c"), None, "one resource did not answer for c: unknown");
        assert!(
            merge_answers(2, vec![m(&[("a", Outcome::Abort)])]).is_empty(),
            "a resource that failed leaves everything unknown"
        );
    }

    #[test]
    fn only_postgres_resources_with_decisions_carry_them() {
        let src = "allow_no_auth = true\nnode_id = \"u1\"\n[store]\nkind = \"sqlite\"\npath = \"/tmp/x.db\"\n\
                   [[resources]]\nname = \"a\"\nkind = \"postgres\"\ndsn = \"host=x\"\ndecisions = true\n\
                   [[resources]]\nname = \"b\"\nkind = \"postgres\"\ndsn = \"host=x\"\n";
        let cfg = crate::config::parse(src, None).unwrap();
        assert_eq!(decision_resources_of(&cfg.resources), vec!["a".to_string()]);
    }
}

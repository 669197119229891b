//! The commit paths: two-phase commit (the decision durable before the answer; for an
//! all-read-only transaction decided in memory, read_only.rs), the decision inside a participant, one phase on the owner's session, abort, a failed
//! prepare, and branches reported finished by their owners.

use crate::refusal::RefusalCode;
use crate::state::{self, refuse, FinishedBy, Outcome, Refusal, TxState};
use crate::store::{DecisionRecord, Token};
use crate::telemetry::log::log;
use crate::wire::{self, Ack, BranchState, Decision};
use cotx_protocol::read_only::CommitPath;
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::answers::{self, Res};
use super::begin::refuse_new_work;
use super::completion;
use super::decisions;
use super::effects::Effects;
use super::operating::Operating;
use super::read_only;
use super::registry::Lookup;

/// Commit; `prepared` lists branches whose "prepared" report rides along with the
/// commit request (saves the root one round trip per branch). All or nothing.
pub async fn commit_with(
    c: Operating<'_>,
    fx: &mut Effects,
    gtid: &str,
    source: &str,
    prepared: &[String],
) -> Res<Decision> {
    commit_listing(c, fx, gtid, source, prepared, &[]).await
}

/// A client's two-phase commit, with the branches it says wrote nothing (`read_only`;
/// empty from older clients). A straight line: the transaction enters Committing in
/// memory once (the gtid checked there, the path chosen under the same lock: every
/// branch listed is decided in memory with no store sync, read_only.rs), then its
/// decision is written, and the outcome the store holds is applied and answered.
pub async fn commit_listing(
    c: Operating<'_>,
    fx: &mut Effects,
    gtid: &str,
    source: &str,
    prepared: &[String],
    read_only: &[String],
) -> Res<Decision> {
    refuse_new_work(c.owner, &c.cfg.node_id)?;
    let t0 = Instant::now();
    let listed = read_only::Listed::new(c, gtid, read_only);
    let entered = answers::with_tx(c, gtid, |e| {
        let path = listed.path(e, gtid)?;
        e.tx.begin_commit(prepared)?;
        Ok((path == CommitPath::Durable).then(|| {
            (e.tx.branches.iter().map(|b| (b.resource.clone(), b.branch_id.clone())).collect::<Vec<_>>(), e.grant)
        }))
    })?;
    let (branches, grant) = match entered {
        Lookup::Here(Some(durable)) => durable,
        Lookup::Here(None) => return read_only::decide(c, fx, gtid).await,
        // A commit asked again after the daemon forgot the transaction from memory
        // (restart, retention, lost lease): the store's record answers it.
        Lookup::NotHere => {
            return match answers::from_store(c, gtid).await {
                Ok(rec) => Ok(Decision { from_store: Some(true), ..Decision::new(gtid, rec.outcome.into()) }),
                Err((_, why)) => Err(why),
            };
        }
    };
    let fence = Some(Token { holder: c.owner.holder.clone(), generation: grant });
    let rec = DecisionRecord {
        gtid: gtid.to_string(),
        outcome: Outcome::Commit,
        branches,
        decided_unix_ms: state::unix_ms(),
        node: c.cfg.node_id.clone(),
        source: source.to_string(),
    };
    match c.store.decide(rec.clone(), fence.clone()).await {
        Ok(d) => {
            c.metrics.observe_decision(t0.elapsed().as_secs_f64());
            // The outcome in force is the store's (a commit, or an abort recorded first
            // by a daemon that took the node over): answered as applied.
            let o = completion::apply_decided(c.registry, c.metrics, fx, gtid, d)?;
            Ok(Decision::new(gtid, o.into()))
        }
        Err(err) => {
            // Unknown whether it is durable (e.g. a lost answer from a PostgreSQL store):
            // the transaction stays Committing (never rolled back) and the write is
            // retried in the background until the store answers.
            log("error", "decision store write failed; retrying", json!({"gtid": gtid, "error": err}));
            fx.retry_decision(rec, fence);
            refuse(
                RefusalCode::StoreUnavailable,
                format!("decision store failed ({err}); the decision is pending, poll /decision"),
            )
        }
    }
}

/// Commit with the decision in branch `bid`: the other branches are prepared (those in
/// `prepared` are reported here), `bid` is on a decision resource. Nothing is written:
/// the owner now runs co.decide and COMMIT on `bid` and reports the outcome.
pub async fn commit_decide_in(c: Operating<'_>, gtid: &str, prepared: &[String], bid: &str) -> Res<Decision> {
    refuse_new_work(c.owner, &c.cfg.node_id)?;
    let allowed = decisions::decision_resources(c.cfg);
    if c.enforcement.holds(gtid, bid) {
        return refuse(
            RefusalCode::NotADecisionResource,
            format!("branch {bid:?} is in client mode: the decision inside a participant needs pg_co there"),
        );
    }
    answers::on(c, gtid, |e| {
        e.tx.begin_decide_in(prepared, bid, |b| {
            if allowed.contains(&b.resource) {
                return Ok(());
            }
            refuse(RefusalCode::NotADecisionResource,
                format!("branch {bid:?} is on resource {:?}, which is not configured with decisions = true (PostgreSQL with pg_co)", b.resource))
        })
    })
    .await?;
    c.metrics.decided_in_participant.fetch_add(1, Relaxed);
    // Silent past the grace period: the tick reads the decision from the resource.
    c.registry.grace_until(gtid, Instant::now() + Duration::from_millis(c.cfg.timeouts.owner_grace_ms));
    Ok(Decision { branch_id: Some(bid.to_string()), ..Decision::new(gtid, wire::Decided::InParticipant) })
}

/// One-phase commit of a single branch. In client mode too (docs/client-mode.md, "One
/// phase"): the branch wrote its slot before asking, which makes it the pivot of a
/// dangerous structure with its prepared helper (PostgreSQL's SSI refuses it at COMMIT as
/// at PREPARE), and a SERIALIZABLE one-phase commit keeps its locks to its end (MariaDB).
/// Its helper then stays prepared until that COMMIT on the client's session has ended
/// (its slot no longer write-locked), whatever becomes of this daemon run.
pub async fn one_phase(c: Operating<'_>, gtid: &str, bid: &str) -> Res<Decision> {
    let client = c.enforcement.holds(gtid, bid);
    if client {
        // Checked first: the transaction may still be refused below, and then the mark
        // only makes its helper look at the slots' locks before it goes.
        answers::on(c, gtid, |e| e.tx.check_one_phase(bid)).await?;
        c.enforcement.begin_one_phase(gtid, bid).map_err(|why| Refusal::new(RefusalCode::WrongState, why))?;
    }
    answers::on(c, gtid, |e| e.tx.begin_one_phase(bid)).await?;
    c.metrics.one_phase.fetch_add(1, Relaxed);
    Ok(Decision { branch_id: Some(bid.to_string()), ..Decision::new(gtid, wire::Decided::OnePhase) })
}

pub async fn abort(c: Operating<'_>, fx: &mut Effects, gtid: &str, reason: &str) -> Res<Decision> {
    let newly = answers::on(c, gtid, |e| {
        e.tx.check_abort()?;
        if e.tx.state() == TxState::Aborted {
            return Ok(false);
        }
        e.tx.abort(reason.to_string(), false);
        Ok(true)
    })
    .await?;
    if newly {
        c.metrics.aborted.fetch_add(1, Relaxed);
        fx.complete(gtid);
    }
    Ok(Decision::new(gtid, wire::Decided::Abort))
}

pub async fn failed(
    c: Operating<'_>,
    fx: &mut Effects,
    gtid: &str,
    bid: &str,
    reason: &str,
    retryable: bool,
) -> Res<Ack> {
    let (newly, victim, earlier, resource) = answers::on(c, gtid, |e| {
        let was = e.tx.state();
        e.tx.failed(bid, reason, retryable)?;
        let earlier = (was == TxState::Aborted).then_some(e.tx.retryable);
        let resource = e.tx.branches.iter().find(|b| b.branch_id == bid).map(|b| b.resource.clone());
        Ok((was != TxState::Aborted && e.tx.state() == TxState::Aborted, e.tx.deadlock_victim, earlier, resource))
    })
    .await?;
    if let Some(r) = resource {
        c.metrics.branch_failed(&r);
    }
    if newly {
        c.metrics.aborted.fetch_add(1, Relaxed);
        fx.complete(gtid);
    }
    let aborted_as = victim.then(|| crate::refusal::RefusalCode::DeadlockVictim.as_str().to_string());
    Ok(Ack {
        decision: Some(wire::OutcomeArg::Abort),
        aborted_as,
        retryable: earlier,
        ..Ack::branch(gtid, bid, BranchState::Failed)
    })
}

/// Several branches finished by their owner(s) in one call. All or nothing.
pub async fn finished_many(
    c: Operating<'_>,
    fx: &mut Effects,
    gtid: &str,
    bids: &[String],
    outcome: Outcome,
) -> Res<Ack> {
    if bids.is_empty() || bids.len() > 1000 {
        return refuse(RefusalCode::InvalidField, "branches must list 1..1000 branch ids");
    }
    let decided_here = answers::on(c, gtid, |e| {
        let mut next = e.tx.clone();
        let was = next.state();
        // The decision branch first, wherever the list names it: its outcome is the
        // decision the other branches' acknowledgements are checked against.
        let decider = next.decide_in.clone().filter(|d| was == TxState::Deciding && bids.contains(d));
        for bid in decider.iter().chain(bids.iter().filter(|b| Some(*b) != decider.as_ref())) {
            next.finish(bid, outcome, FinishedBy::Owner)?;
        }
        e.tx = next;
        let decided = was == TxState::Deciding && e.tx.state() != TxState::Deciding;
        Ok(decided.then(|| e.tx.decision().unwrap_or(Outcome::Abort)))
    })
    .await?;
    if let Some(o) = decided_here {
        // The decision branch reported its commit (or rollback): the other branches
        // get that outcome, from their owners or after the grace period from us.
        completion::count_decision(c.metrics, o);
        fx.complete(gtid);
    }
    c.registry.maybe_forget(gtid, c.store);
    Ok(Ack {
        gtid: gtid.to_string(),
        branch_id: None,
        branches: Some(bids.to_vec()),
        state: BranchState::Finished,
        outcome: Some(outcome.into()),
        decision: None,
        aborted_as: None,
        retryable: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::effects::Effect;

    /// An operation borrows its parts and starts nothing that outlives it: the abort's
    /// completion is left to its caller, which starts it (completion::start).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abort_leaves_its_completion_to_the_caller() {
        let c = crate::coordinator::tests::coord("commit-effects").await;
        let p = c.parts();
        let g = c.begin(None).unwrap().gtid;
        let mut fx = Effects::default();
        let d = abort(p.into(), &mut fx, &g, "test").await.unwrap();
        assert_eq!(d.decision, wire::Decided::Abort);
        assert_eq!(fx.as_slice(), [Effect::Complete(g.clone())]);
        let completing = || p.registry.with_entry(&g, |e| e.completing).here().unwrap();
        assert!(!completing(), "nothing started by the operation itself");
        completion::start(p, fx);
        assert!(completing(), "started by its caller");
    }
}

//! The client's calls, typed: the rules each one checks and the coordinator operation it
//! makes, once its request is in the types of dto.rs. Two callers share them: the HTTP
//! handlers (handlers.rs, after the query string and the body are parsed) and the
//! in-process API (crate::in_process), which takes the same types from a Rust caller with
//! no JSON in between. So each rule is written once, and a refusal is the same `Refusal`
//! (code, message, HTTP status) whichever way the call came. Every check comes before any
//! effect: a refused call changes nothing.

use crate::api::dto::text_field;
use crate::api::dto::{
    AbortRequest, BeginRequest, CommitRequest, FailedRequest, FinishedAck, FinishedManyRequest, FinishedRequest,
    GtidLeaseRequest, RegisterRequest,
};
use crate::coordinator::one_request::DecideBy;
use crate::coordinator::{Coordinator, Res};
use crate::refusal::{refuse, RefusalCode};
use crate::wire::{Ack, Begun, Decision, GtidLease, Registered};

/// Most branches, branch ids or acknowledgements one call may list.
const MAX_LISTED: usize = 1000;

/// Acknowledgements carried by a begin or a commit, each applied as
/// `POST /v1/transactions/{gtid}/finished` would be. Only acknowledgements: one that no
/// longer applies here (forgotten, another daemon's) changes nothing and is skipped.
async fn carried_acks(c: &Coordinator, acks: Option<&[FinishedAck]>) -> Res<()> {
    let acks = acks.unwrap_or_default();
    if acks.len() > MAX_LISTED {
        return refuse(RefusalCode::InvalidField, "finished lists at most 1000 acknowledgements");
    }
    for a in acks {
        let _ = c.finished_many(&a.gtid, &a.branches, a.outcome.into()).await;
    }
    Ok(())
}

/// `POST /v1/transactions`: begin, optionally with the first branch or every branch, and
/// acknowledgements of earlier transactions carried along.
pub async fn begin(c: &Coordinator, b: BeginRequest) -> Res<Begun> {
    if b.branch.is_some() && b.branches.is_some() {
        return refuse(RefusalCode::InvalidField, "branch and branches exclude each other");
    }
    if b.branches.as_ref().is_some_and(|all| all.is_empty() || all.len() > MAX_LISTED) {
        return refuse(RefusalCode::InvalidField, "branches must list 1..1000 branches");
    }
    carried_acks(c, b.finished.as_deref()).await?;
    match (b.branch, b.branches) {
        (None, None) => c.begin(b.timeout_ms),
        (Some(br), _) => {
            let begun = c.begin_with_branch(b.timeout_ms, &br.resource, &br.branch_id, br.server_started).await?;
            c.note_session(&begun.gtid, &br.branch_id, br.session);
            Ok(begun)
        }
        (None, Some(all)) => {
            let ids: Vec<(String, String, Option<i64>)> =
                all.iter().map(|b| (b.resource.clone(), b.branch_id.clone(), b.server_started)).collect();
            let begun = c.begin_with_branches(b.timeout_ms, &ids).await?;
            for br in &all {
                c.note_session(&begun.gtid, &br.branch_id, br.session);
            }
            Ok(begun)
        }
    }
}

/// `POST /v1/transactions/{gtid}/branches`.
pub async fn register(c: &Coordinator, gtid: &str, b: RegisterRequest) -> Res<Registered> {
    let reg = c.register_seen(gtid, &b.resource, &b.branch_id, b.server_started).await?;
    c.note_session(gtid, &b.branch_id, b.session);
    Ok(reg)
}

/// `POST /v1/transactions/{gtid}/branches/{bid}/prepared`.
pub async fn prepared(c: &Coordinator, gtid: &str, bid: &str) -> Res<Ack> {
    c.prepared(gtid, bid).await
}

/// `POST /v1/transactions/{gtid}/branches/{bid}/failed`: aborts the transaction.
pub async fn failed(c: &Coordinator, gtid: &str, bid: &str, b: FailedRequest) -> Res<Ack> {
    let reason = b.reason.unwrap_or_else(|| "prepare failed".into());
    text_field("reason", &reason, 1000)?;
    c.failed(gtid, bid, &reason, b.retryable.unwrap_or(false)).await
}

/// `POST /v1/transactions/{gtid}/branches/{bid}/finished`.
pub async fn finished(c: &Coordinator, gtid: &str, bid: &str, b: FinishedRequest) -> Res<Ack> {
    c.finished(gtid, bid, b.outcome.into()).await
}

/// `POST /v1/transactions/{gtid}/finished`: several branches at once, all or nothing.
pub async fn finished_many(c: &Coordinator, gtid: &str, b: FinishedManyRequest) -> Res<Ack> {
    c.finished_many(gtid, &b.branches, b.outcome.into()).await
}

/// `POST /v1/gtid-leases`: a range of gtids for the one-request commit.
pub fn lease_gtids(c: &Coordinator, b: GtidLeaseRequest) -> Res<GtidLease> {
    c.lease_gtids(b.count, b.ttl_ms)
}

/// `POST /v1/transactions/{gtid}/commit`: the two-phase commit (`prepared`, `read_only`),
/// the one-phase commit of a single branch, the decision handed to a participant
/// (`decide_in`), or the one-request commit of a leased gtid (`branches`).
pub async fn commit(c: &Coordinator, gtid: &str, b: CommitRequest) -> Res<Decision> {
    let read_only = b.read_only.unwrap_or_default();
    carried_acks(c, b.finished.as_deref()).await?;
    if read_only.len() > MAX_LISTED {
        return refuse(RefusalCode::InvalidField, "read_only lists at most 1000 branch ids");
    }
    if !read_only.is_empty() && (b.one_phase_branch.is_some() || b.decide_in.is_some()) {
        return refuse(
            RefusalCode::InvalidField,
            "read_only goes with a two-phase commit only (not with one_phase_branch or decide_in)",
        );
    }
    if let Some(all) = b.branches {
        if b.one_phase_branch.is_some() || b.prepared.is_some() {
            return refuse(RefusalCode::InvalidField, "branches excludes one_phase_branch and prepared");
        }
        if all.is_empty() || all.len() > MAX_LISTED {
            return refuse(RefusalCode::InvalidField, "branches must list 1..1000 branches");
        }
        if all.iter().any(|b| b.server_started.is_some()) {
            return refuse(
                RefusalCode::InvalidField,
                "server_started is client mode's, which the one-request commit does not serve",
            );
        }
        // read_only with decide_in was refused above, as on every commit path.
        let by = match b.decide_in.as_deref() {
            Some(bid) => DecideBy::Participant(bid),
            None => DecideBy::Store { read_only: &read_only },
        };
        let ids: Vec<(String, String, Option<i64>)> =
            all.into_iter().map(|b| (b.resource, b.branch_id, b.session)).collect();
        return c.commit_leased(gtid, &ids, by).await;
    }
    let prepared = |p: Option<Vec<String>>| {
        let p = p.unwrap_or_default();
        if p.len() > MAX_LISTED {
            return refuse(RefusalCode::InvalidField, "prepared lists at most 1000 branch ids");
        }
        Ok(p)
    };
    match (b.one_phase_branch, b.prepared, b.decide_in) {
        (Some(_), _, Some(_)) => refuse(RefusalCode::InvalidField, "one_phase_branch and decide_in exclude each other"),
        (None, p, Some(d)) => c.commit_decide_in(gtid, &prepared(p)?, &d).await,
        (Some(_), Some(_), None) => {
            refuse(RefusalCode::InvalidField, "one_phase_branch and prepared exclude each other")
        }
        (Some(bid), None, None) => c.one_phase(gtid, &bid).await,
        (None, p, None) => c.commit_read_only(gtid, &prepared(p)?, &read_only).await,
    }
}

/// `POST /v1/transactions/{gtid}/abort`.
pub async fn abort(c: &Coordinator, gtid: &str, b: AbortRequest) -> Res<Decision> {
    let reason = b.reason.unwrap_or_else(|| "aborted by client".into());
    text_field("reason", &reason, 1000)?;
    c.abort(gtid, &reason).await
}

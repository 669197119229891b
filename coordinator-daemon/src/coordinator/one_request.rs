//! The one-request commit: a range of gtids leased to a client (leases.rs), and the
//! commit request that carries a leased gtid's branches — the transaction's only request.
//! The rule is cotx_protocol::leased (checked by the model's "leased" mode): only this
//! process, which leased the range, records a commit for it, with the conditional insert
//! every commit uses (recovery's abort, if it came first, is the answer); recovery and
//! the answers treat a leased gtid as one this daemon's memory does not know completely.
//!
//! With `decide_in` the same request hands the decision to that branch's commit (the
//! model's mode "one request with the decision in a participant"): recovery asks the
//! decision resources (co.resolve) before it records abort for a leased gtid, as for any.
//!
//! Every check comes before any effect: a refused request leaves nothing in memory, so
//! no in-memory abort (which has no record) can be forgotten while a branch is prepared
//! and then meet a retried commit.

use crate::config::Config;
use crate::ha::ownership::Ownership;
use crate::naming;
use crate::refusal::RefusalCode;
use crate::state::{refuse, Tx, TxState};
use crate::telemetry::metrics::Metrics;
use crate::wire::{Decision, GtidLease};
use cotx_protocol::leased::{self, Commit};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::answers::{self, Res};
use super::begin;
use super::begin::refuse_new_work;
use super::commit;
use super::effects::Effects;
use super::leases::Leases;
use super::operating::Operating;
use super::registry::Entry;

/// Gtids in a range when the client does not say.
pub const DEFAULT_COUNT: u64 = 1000;
pub const MAX_COUNT: u64 = 100_000;

/// A branch of the request: resource, branch id, its database session (optional).
pub type Branch = (String, String, Option<i64>);

/// Where the one-request commit's decision is made.
#[derive(Clone, Copy, Debug)]
pub enum DecideBy<'a> {
    /// In the store (the two-phase commit), with the branches that wrote nothing
    /// (every one listed: decided in memory, read_only.rs).
    Store { read_only: &'a [String] },
    /// Inside this branch's commit (`decide_in`: co.decide in a PostgreSQL branch with
    /// pg_co, not prepared): the daemon writes nothing and answers `in_participant`, as on
    /// the begin path (commit::commit_decide_in).
    Participant(&'a str),
}

/// Leases a range of `count` gtids for `ttl_ms` (the config's defaults when not said):
/// what it reads is the config, our ownership (the lease and this run's nonce, which the
/// gtids carry), the ranges and the counter of leases.
pub fn lease(
    cfg: &Config,
    owner: &Ownership,
    leases: &Leases,
    metrics: &Metrics,
    seq: &AtomicU64,
    count: Option<u64>,
    ttl_ms: Option<u64>,
) -> Res<GtidLease> {
    refuse_new_work(owner, &cfg.node_id)?;
    let n = count.unwrap_or(DEFAULT_COUNT);
    if !(1..=MAX_COUNT).contains(&n) {
        return refuse(RefusalCode::InvalidField, format!("count must be between 1 and {MAX_COUNT}"));
    }
    let max = cfg.limits.max_transaction_ms;
    let ttl = ttl_ms.unwrap_or(cfg.timeouts.transaction_ms.min(max));
    if !(10..=max).contains(&ttl) {
        return refuse(
            RefusalCode::InvalidField,
            format!("ttl_ms must be between 10 and {max} (limits.max_transaction_ms)"),
        );
    }
    let first = leases.lease(seq, n, Duration::from_millis(ttl));
    metrics.gtid_leases.fetch_add(1, Relaxed);
    Ok(GtidLease {
        prefix: naming::gtid_prefix(&cfg.node_id, owner.nonce),
        first,
        count: n,
        expires_in_ms: ttl,
        gid_prefix: cfg.gid_prefix.clone(),
        xa_format_id: naming::XA_FORMAT_ID,
    })
}

/// Commit of `gtid` with all its branches, each prepared but a decision branch. A gtid
/// already in memory (the request sent again) goes on as any commit; one this process did
/// not lease is answered from the store, nothing written (with `decide_in` too: only the
/// process that leased the range hands a decision to a participant).
pub async fn commit(
    c: Operating<'_>,
    fx: &mut Effects,
    gtid: &str,
    branches: &[Branch],
    by: DecideBy<'_>,
) -> Res<Decision> {
    if let Err(e) = naming::check_id("gtid", gtid) {
        return refuse(e.code, e.message);
    }
    if let DecideBy::Participant(bid) = by {
        if !branches.iter().any(|b| b.1 == bid) {
            return refuse(RefusalCode::InvalidField, format!("decide_in {bid:?} is not one of the listed branches"));
        }
    }
    let bids: Vec<String> = branches.iter().map(|b| b.1.clone()).collect();
    let known = c.registry.contains(gtid);
    // Leased here and not yet known: it goes into memory now (or the same request, sent
    // again, got in first); either way it is then in memory.
    let leased_here = !known && leased::commit(c.range_of(gtid)) == Commit::Record;
    let entered = leased_here && enter(c, gtid, branches).await?;
    let r = match by {
        DecideBy::Participant(bid) if known || leased_here => {
            let others: Vec<String> = bids.iter().filter(|b| *b != bid).cloned().collect();
            commit::commit_decide_in(c, gtid, &others, bid).await
        }
        DecideBy::Participant(_) => commit::commit_listing(c, fx, gtid, "client", &bids, &[]).await,
        DecideBy::Store { read_only } => commit::commit_listing(c, fx, gtid, "client", &bids, read_only).await,
    };
    // Refused before the commit began (e.g. the node's lease unconfirmed): out of memory
    // again, as if never sent. Left there Active, a timeout would abort it in memory with
    // no record, and a commit sent again after it was forgotten would find nothing.
    if r.is_err() && entered && answers::peek(c, gtid, |e| e.tx.state() == TxState::Active) == Some(true) {
        begin::unbegin(c.registry, c.metrics, gtid);
    }
    r
}

/// Puts the gtid in memory with its branches registered, after checking every one;
/// false: the same request, sent again, got in first.
async fn enter(c: Operating<'_>, gtid: &str, branches: &[Branch]) -> Res<bool> {
    refuse_new_work(c.owner, &c.cfg.node_id)?;
    let mut seen = HashSet::new();
    let mut kinds = Vec::with_capacity(branches.len());
    for (resource, bid, _) in branches {
        if let Err(e) = naming::check_id("branch_id", bid) {
            return refuse(e.code, e.message);
        }
        if !seen.insert(bid.as_str()) {
            return refuse(RefusalCode::InvalidField, format!("branch {bid:?} is listed twice"));
        }
        let Some(kind) = c.cfg.kind_of(resource) else {
            return refuse(
                RefusalCode::UnknownResource,
                format!("no resource named {resource:?} in the coordinator's config"),
            );
        };
        begin::branch_ids(kind, &c.cfg.gid_prefix, gtid, bid)?;
        if let Err(e) = c.enforcement.admit_prepared(&c.resources[resource]).await {
            c.metrics.branch_refused(resource, e.code.as_str());
            return Err(e);
        }
        kinds.push(kind);
    }
    let timeout = Duration::from_millis(c.cfg.timeouts.transaction_ms);
    let mut tx = Tx::new(gtid.to_string(), timeout);
    for ((resource, bid, _), kind) in branches.iter().zip(kinds) {
        tx.register(bid, resource, kind)?;
    }
    let grant = c.owner.generation_of(&c.cfg.node_id);
    let max = c.cfg.limits.max_active;
    match c.registry.insert_new_capped(gtid, Entry::new(tx, false, grant), max) {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(active) => {
            c.metrics.overloaded.fetch_add(1, Relaxed);
            return refuse(
                RefusalCode::TooManyTransactions,
                format!("{active} transactions are undecided (limits.max_active = {max}); retry later"),
            );
        }
    }
    c.metrics.begun.fetch_add(1, Relaxed);
    let after = Duration::from_millis(c.cfg.timeouts.deadlock_check_ms);
    for (_, bid, session) in branches {
        if let Some(s) = session {
            let _ = c.registry.note_session(gtid, bid, *s, after);
        }
    }
    Ok(true)
}

//! Answers about gtids: an operation on one in memory (`with_tx`, `on`), and for one that
//! is not, the store's record (`from_store`) or why it cannot be served
//! here (`elsewhere`: presumed abort, forgotten, quarantined, its owner's). The read-only
//! endpoints: `get`, `wait_decision` (long poll), `list`.
//!
//! What may be said of a gtid is decided in one place, [`rule`]: the protocol crate's
//! `cotx_protocol::answer::answer`, the very function the model checks (model/src/proto.rs),
//! fed from memory and from the store. This module only gathers its inputs and puts its
//! [`Answer`] into words (`refusal`); it decides nothing by itself (unit test
//! `answers_are_the_protocols` in answers/tests.rs walks every input).

use crate::config::Config;
use crate::ha::ownership::Ownership;
use crate::naming;
use crate::participants::resources::Clients;
use crate::refusal::RefusalCode;
use crate::state::{refuse, Outcome, Refusal, StateFilter, TxState};
use crate::store::{DecisionRecord, Store, Stored};
use crate::wire::{DecisionState, Transaction, TransactionList};
use cotx_protocol::answer::{self as protocol, Answer};
use std::sync::Arc;
use std::time::Duration;

use super::decisions;
use super::leases::Leases;
use super::parts::Parts;
use super::registry::{Entry, Lookup, Registry};

/// An operation's answer: a response body (crate::wire; the API's handler serializes it)
/// or a refusal.
pub type Res<T> = Result<T, Refusal>;

/// What answering about a gtid reads: memory, the store, whose node it is, the config
/// (our node, the long poll's limit) and the decision resources (a gtid that may have
/// decided in a participant). The operations of other modules pass their `Parts`,
/// narrowed to this (`From`).
#[derive(Clone, Copy)]
pub struct Answering<'a> {
    pub cfg: &'a Config,
    pub store: &'a Store,
    pub owner: &'a Ownership,
    pub registry: &'a Registry,
    pub resources: &'a Clients,
    pub leases: &'a Leases,
}

impl<'a> From<&'a Parts> for Answering<'a> {
    fn from(p: &'a Parts) -> Self {
        Answering {
            cfg: &p.cfg,
            store: &p.store,
            owner: &p.owner,
            registry: &p.registry,
            resources: &p.resources,
            leases: &p.leases,
        }
    }
}

impl Answering<'_> {
    /// Where a gtid stands among the ranges this process leased (cotx_protocol::leased).
    fn range_of(self, gtid: &str) -> cotx_protocol::leased::Range {
        self.leases.range_of(gtid, &self.cfg.node_id, self.owner.nonce)
    }
}

impl<'a> From<&'a Arc<Parts>> for Answering<'a> {
    fn from(p: &'a Arc<Parts>) -> Self {
        Answering::from(&**p)
    }
}

/// The rule: what this daemon may say of `gtid`, given what its memory holds of it
/// (`Some(decision)` when it is in memory) and what the store holds (when read). The
/// quarantine and whether the gtid is ours are read here, so every caller feeds the rule
/// the same way.
pub(super) fn rule(c: Answering, gtid: &str, memory: Option<Option<Outcome>>, stored: Option<&Stored>) -> Answer {
    protocol::answer(c.registry.is_quarantined(gtid), memory, stored.map(Stored::view), ours(c, gtid))
}

/// Whether this daemon may presume abort for the gtid's node: its own node, under its
/// grant. A daemon that took the node over, or any other, answers from the store only —
/// the previous owner's decision may still land (its recovery records abort first). A gtid
/// not of our naming was issued by no daemon: nobody else could answer it.
fn ours(c: Answering, gtid: &str) -> bool {
    match naming::gtid_epoch(gtid) {
        // Not for a gtid of a range we leased: its commit may still come.
        Some((node, _)) => cotx_protocol::leased::presumes_abort(
            node == c.cfg.node_id && c.owner.grant(node).is_some(),
            c.range_of(gtid),
        ),
        None => true,
    }
}

/// The store's word on a gtid, read once; an unreadable record is quarantined as it is
/// seen. A gtid not of our naming is never in the store (both stores answer it absent):
/// not read.
pub(super) async fn read_store<'a>(c: impl Into<Answering<'a>>, gtid: &str) -> Result<Stored, Refusal> {
    let c = c.into();
    if naming::gtid_epoch(gtid).is_none() {
        return Ok(Stored::Absent { forgotten: false });
    }
    match c.store.get(gtid).await {
        Ok(s) => {
            if let Stored::Corrupt(q) = &s {
                c.registry.quarantine(q);
            }
            Ok(s)
        }
        Err(e) => refuse(RefusalCode::StoreUnavailable, format!("cannot read the decision of {gtid}: {e}")),
    }
}

fn quarantined(gtid: &str) -> Refusal {
    Refusal::new(RefusalCode::Quarantined, format!("{gtid}: its outcome cannot be read from the store (an unreadable record, or one lost to a purge or a restore: see the in-doubt report); an operator must decide (cotx-coordinator force)"))
}

/// The rule's answer for a gtid that is not served from memory, in words. `Decided` is
/// only reached by an operation other than a read (a read answers with the record):
/// the gtid is finished and out of memory, its outcome recorded.
async fn refusal(c: Answering<'_>, gtid: &str, a: Answer) -> Refusal {
    match a {
        Answer::Quarantined => quarantined(gtid),
        Answer::Forgotten => Refusal::new(RefusalCode::OutcomeForgotten, format!("{gtid}: its record was purged after the retention (timeouts.outcome_retention_ms), or its epoch was sealed when the store was restored from an older copy (mark-restored); its outcome is no longer known")),
        Answer::PresumedAbort => Refusal::new(
            RefusalCode::UnknownTransaction,
            format!("no transaction {gtid:?} (never begun, or aborted and finished: presumed abort)"),
        ),
        Answer::Decided(o) => Refusal::new(
            match o {
                Outcome::Commit => RefusalCode::TransactionCommitted,
                Outcome::Abort => RefusalCode::TransactionAborted,
            },
            format!("{gtid} is decided {} (recorded in the store); it is no longer in this daemon's memory", o.as_str()),
        ),
        // Not in memory: the rule never says "pending" (no caller passes memory here).
        Answer::Pending | Answer::AskOwner => ask_owner(c, gtid).await,
    }
}

/// Another node's transaction, undecided in the store: who answers it.
pub(super) async fn ask_owner(c: Answering<'_>, gtid: &str) -> Refusal {
    let node = naming::gtid_node(gtid).unwrap_or_default();
    if c.range_of(gtid) != cotx_protocol::leased::Range::NotLeased {
        return Refusal::new(
            RefusalCode::OwnerUnavailable,
            format!("{gtid} is of a range of gtids leased to a client and has no recorded outcome yet: its commit may still come (or recovery records its abort once the lease ran out); ask again"),
        );
    }
    if c.owner.acts_for(node) {
        return Refusal::new(
            RefusalCode::OwnerUnavailable,
            format!(
                "{gtid} belongs to node {node}, taken over by this daemon: its recovery records the outcome; ask again"
            ),
        );
    }
    match c.store.nodes().await {
        Ok(ls) if !ls.iter().any(|l| l.node == node) => Refusal::new(RefusalCode::OwnerUnavailable,
            format!("{gtid} belongs to node {node}, which no daemon of this store holds and which has no recorded outcome for it; ask its daemon")),
        Ok(ls) => match ls.into_iter().find(|l| l.node == node) {
            Some(l) if l.expires_in_ms > 0 && !l.url.is_empty() => Refusal {
                code: RefusalCode::WrongNode,
                message: format!("{gtid} belongs to node {node}, served at {}", l.url),
                owner_url: Some(l.url),
            },
            _ => Refusal::new(RefusalCode::OwnerUnavailable,
                format!("{gtid} belongs to node {node}, which holds no live lease: a takeover will decide it; ask again")),
        },
        Err(e) => Refusal::new(RefusalCode::StoreUnavailable, format!("cannot look up the owner of {gtid}: {e}")),
    }
}

/// Runs a synchronous operation on a gtid in memory. Refused before looking: a malformed
/// gtid, a quarantined one (the rule puts the store's word over memory: every daemon, the
/// one that decided it included, answers "quarantined"), and any while our node is being
/// regained.
pub fn with_tx<'a, T>(
    c: impl Into<Answering<'a>>,
    gtid: &str,
    f: impl FnOnce(&mut Entry) -> Result<T, Refusal>,
) -> Result<Lookup<T>, Refusal> {
    let c = c.into();
    if let Err(e) = naming::check_id("gtid", gtid) {
        return refuse(e.code, e.message);
    }
    // Whatever memory holds, only the quarantine overrides it.
    if rule(c, gtid, Some(None), None) == Answer::Quarantined {
        return Err(quarantined(gtid));
    }
    if c.owner.regaining() {
        return refuse(
            RefusalCode::LeaseUnconfirmed,
            format!("node {} lost its lease and is taking it back: ask again", c.cfg.node_id),
        );
    }
    match c.registry.with_entry(gtid, f) {
        Lookup::Here(r) => r.map(Lookup::Here),
        Lookup::NotHere => Ok(Lookup::NotHere),
    }
}

/// What memory says of a gtid, when it can say anything (no refusal, not here: None).
pub fn peek<'a, T>(c: impl Into<Answering<'a>>, gtid: &str, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
    with_tx(c, gtid, |e| Ok(f(e))).ok().and_then(Lookup::here)
}

/// Runs a synchronous operation on a gtid; when it is not in memory, says why.
pub async fn on<'a, T>(
    c: impl Into<Answering<'a>>,
    gtid: &str,
    f: impl FnOnce(&mut Entry) -> Result<T, Refusal>,
) -> Result<T, Refusal> {
    let c = c.into();
    match with_tx(c, gtid, f)? {
        Lookup::Here(t) => Ok(t),
        Lookup::NotHere => Err(elsewhere(c, gtid).await),
    }
}

/// Why a gtid that is not in memory cannot be served here (the rule, from the store):
/// presumed abort only for our own node under its grant; another node's transaction is
/// sent to its owner, or waits for a takeover.
pub async fn elsewhere(c: Answering<'_>, gtid: &str) -> Refusal {
    // The quarantine is the rule's first word: no read needed.
    if c.registry.is_quarantined(gtid) {
        return quarantined(gtid);
    }
    match read_store(c, gtid).await {
        Ok(s) => refusal(c, gtid, rule(c, gtid, None, Some(&s))).await,
        Err(e) => e,
    }
}

/// A gtid not in memory, answered from one read of the store: its record when the rule
/// says it is decided, else why not: the rule's answer (None: the store could not be
/// read) and that answer in words.
pub async fn from_store<'a>(
    c: impl Into<Answering<'a>>,
    gtid: &str,
) -> Result<DecisionRecord, (Option<Answer>, Refusal)> {
    let c = c.into();
    let s = read_store(c, gtid).await.map_err(|e| (None, e))?;
    match (rule(c, gtid, None, Some(&s)), s) {
        (Answer::Decided(_), Stored::Record(r)) => Ok(r),
        (a, _) => Err((Some(a), refusal(c, gtid, a).await)),
    }
}

pub async fn get(c: Answering<'_>, gtid: &str) -> Res<Transaction> {
    match with_tx(c, gtid, |e| Ok(Transaction::from_tx(&e.tx)))? {
        Lookup::Here(v) => Ok(v),
        Lookup::NotHere => from_store(c, gtid).await.map(|r| Transaction::from_record(&r)).map_err(|(_, e)| e),
    }
}

pub async fn wait_decision(c: Answering<'_>, gtid: &str, wait_ms: u64) -> Res<DecisionState> {
    let mut rx = match with_tx(c, gtid, |e| Ok(e.watch.subscribe()))? {
        Lookup::Here(rx) => rx,
        // Any daemon answers a decided gtid from the store; an undecided one of another
        // node is its owner's to answer.
        Lookup::NotHere => return not_in_memory_decision(c, gtid).await,
    };
    let wait = Duration::from_millis(wait_ms.min(c.cfg.timeouts.long_poll_max_ms));
    let _ = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await;
    // Still committing: the write's answer may be lost while the record is in the
    // store; the rule answers from it rather than "no decision" for a committed
    // transaction (the next recovery pass applies it to memory: adopt_records).
    if peek(c, gtid, |e| e.tx.state() == TxState::Committing).unwrap_or(false) {
        if let Ok(s @ Stored::Record(_)) = c.store.get(gtid).await {
            if let (Answer::Decided(_), Stored::Record(r)) = (rule(c, gtid, Some(None), Some(&s)), s) {
                return Ok(DecisionState::from_record(gtid, &r));
            }
        }
    }
    let now = with_tx(c, gtid, |e| Ok(DecisionState::from_tx(&e.tx)))?;
    match now {
        Lookup::Here(v) => Ok(v),
        // Dropped from memory while we waited (retention, a regained lease).
        Lookup::NotHere => Err(elsewhere(c, gtid).await),
    }
}

/// The long poll's answer for a gtid not in memory. Presumed abort is not ours to answer
/// for a transaction that may have decided in a participant: ask there (which fences it),
/// as the model's `answer` does in its decision-in-a-participant mode.
async fn not_in_memory_decision(c: Answering<'_>, gtid: &str) -> Res<DecisionState> {
    let (a, e) = match from_store(c, gtid).await {
        Ok(rec) => return Ok(DecisionState::from_record(gtid, &rec)),
        Err(x) => x,
    };
    if a == Some(Answer::PresumedAbort) && !decisions::decision_resources(c.cfg).is_empty() {
        match decisions::resolve_in_participants(c.cfg, c.resources, &[gtid.to_string()]).await.get(gtid) {
            Some(Outcome::Commit) => return Ok(DecisionState::committed_in_participant(gtid)),
            Some(Outcome::Abort) => {}
            None => {
                return refuse(
                    RefusalCode::StoreUnavailable,
                    format!("{gtid}: a decision resource did not answer; ask again"),
                )
            }
        }
    }
    Err(e)
}

pub fn list(c: Answering<'_>, filter: Option<&str>) -> Res<TransactionList> {
    let filter = filter.map(StateFilter::parse).transpose()?;
    let txs = c.registry.txs.lock().unwrap();
    let mut out: Vec<(u128, Transaction)> = txs
        .values()
        .filter(|e| filter.is_none_or(|f| f.matches(&e.tx)))
        .map(|e| (e.tx.created.elapsed().as_millis(), Transaction::from_tx(&e.tx)))
        .collect();
    out.sort_by_key(|x| std::cmp::Reverse(x.0));
    Ok(TransactionList { transactions: out.into_iter().map(|x| x.1).collect(), quarantined: None })
}

#[cfg(test)]
mod tests;

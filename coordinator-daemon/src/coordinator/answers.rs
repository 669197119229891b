//! Answers about gtids: an operation on one in memory (`with_tx`, `on`), and for one that
//! is not, the store's record (`stored_decision`) or why it cannot be served here
//! (`elsewhere`: presumed abort, forgotten, quarantined, its owner's). The read-only
//! endpoints: `get`, `wait_decision` (long poll), `list`.

use crate::naming;
use crate::refusal::RefusalCode;
use crate::state::{refuse, Outcome, Refusal, StateFilter, TxState};
use crate::store::{DecisionRecord, Stored};
use crate::wire::{DecisionState, Transaction, TransactionList};
use std::time::Duration;

use super::decisions;
use super::parts::Parts;
use super::registry::{Entry, Lookup};

/// An operation's answer: a response body (crate::wire; the API's handler serializes it)
/// or a refusal.
pub type Res<T> = Result<T, Refusal>;

fn quarantined(gtid: &str) -> Refusal {
    Refusal::new(RefusalCode::Quarantined, format!("{gtid}: its outcome cannot be read from the store (an unreadable record, or one lost to a purge or a restore: see the in-doubt report); an operator must decide (cotx-coordinator force)"))
}

/// Runs a synchronous operation on a gtid in memory. Refused before looking: a malformed
/// gtid, a quarantined one (the store's word over memory: every daemon, the one that
/// decided it included, answers "quarantined": cotx_protocol::answer), and any while our
/// node is being regained.
pub fn with_tx<T>(
    c: &Parts,
    gtid: &str,
    f: impl FnOnce(&mut Entry) -> Result<T, Refusal>,
) -> Result<Lookup<T>, Refusal> {
    if let Err(e) = naming::check_id("gtid", gtid) {
        return refuse(e.code, e.message);
    }
    if c.registry.is_quarantined(gtid) {
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
pub fn peek<T>(c: &Parts, gtid: &str, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
    with_tx(c, gtid, |e| Ok(f(e))).ok().and_then(Lookup::here)
}

/// Runs a synchronous operation on a gtid; when it is not in memory, says why.
pub async fn on<T>(c: &Parts, gtid: &str, f: impl FnOnce(&mut Entry) -> Result<T, Refusal>) -> Result<T, Refusal> {
    match with_tx(c, gtid, f)? {
        Lookup::Here(t) => Ok(t),
        Lookup::NotHere => Err(elsewhere(c, gtid).await),
    }
}

/// Why a gtid that is not in memory cannot be served here. Presumed abort
/// (`unknown_transaction`) is answered only for nodes this daemon acts for; another
/// node's transaction is sent to its owner, or waits for a takeover.
pub async fn elsewhere(c: &Parts, gtid: &str) -> Refusal {
    if c.registry.is_quarantined(gtid) {
        return quarantined(gtid);
    }
    let unknown = || {
        Refusal::new(
            RefusalCode::UnknownTransaction,
            format!("no transaction {gtid:?} (never begun, or aborted and finished: presumed abort)"),
        )
    };
    let Some((node, _)) = naming::gtid_epoch(gtid) else { return unknown() };
    // No record may mean abort only while a record could still be there: past its
    // epoch's purge watermark the outcome is forgotten, never "aborted".
    match c.store.get(gtid).await {
        Ok(Stored::Absent { forgotten: false }) => {}
        Ok(Stored::Absent { forgotten: true }) => {
            return Refusal::new(RefusalCode::OutcomeForgotten, format!("{gtid}: its record was purged after the retention (timeouts.outcome_retention_ms), or its epoch was sealed when the store was restored from an older copy (mark-restored); its outcome is no longer known"));
        }
        // Callers that answer with a record read it themselves (stored_decision).
        Ok(Stored::Record(_)) => {}
        Ok(Stored::Corrupt(q)) => {
            c.registry.quarantine(&q);
            return quarantined(gtid);
        }
        Err(e) => {
            return Refusal::new(RefusalCode::StoreUnavailable, format!("cannot read the decision of {gtid}: {e}"))
        }
    }
    // Presumed abort only by the node's owner under its grant (cotx_protocol::answer):
    // a daemon that took the node over, or any other, answers from the store only —
    // the previous owner's decision may still land (recovery records abort first).
    if node == c.cfg.node_id && c.owner.grant(node).is_some() {
        return unknown();
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

/// The store's word on a gtid not in memory: its recorded decision, if any.
pub async fn stored_decision(c: &Parts, gtid: &str) -> Result<Option<DecisionRecord>, Refusal> {
    if let Err(e) = naming::check_id("gtid", gtid) {
        return refuse(e.code, e.message);
    }
    match c.store.get(gtid).await {
        Ok(Stored::Record(r)) => Ok(Some(r)),
        Ok(Stored::Corrupt(q)) => {
            c.registry.quarantine(&q);
            Err(elsewhere(c, gtid).await)
        }
        Ok(Stored::Absent { .. }) => Ok(None),
        Err(e) => refuse(RefusalCode::StoreUnavailable, format!("cannot read the decision of {gtid}: {e}")),
    }
}

pub async fn get(c: &Parts, gtid: &str) -> Res<Transaction> {
    match with_tx(c, gtid, |e| Ok(Transaction::from_tx(&e.tx)))? {
        Lookup::Here(v) => Ok(v),
        Lookup::NotHere => match stored_decision(c, gtid).await? {
            Some(rec) => Ok(Transaction::from_record(&rec)),
            None => Err(elsewhere(c, gtid).await),
        },
    }
}

pub async fn wait_decision(c: &Parts, gtid: &str, wait_ms: u64) -> Res<DecisionState> {
    let mut rx = match with_tx(c, gtid, |e| Ok(e.watch.subscribe()))? {
        Lookup::Here(rx) => rx,
        Lookup::NotHere => {
            // Any daemon answers a decided gtid from the store; an undecided one of
            // another node is its owner's to answer.
            return match stored_decision(c, gtid).await? {
                Some(rec) => Ok(DecisionState::from_record(gtid, &rec)),
                None => {
                    let e = elsewhere(c, gtid).await;
                    // Presumed abort is not ours to answer for a transaction that may
                    // have decided in a participant: ask there (which fences it).
                    if e.code == RefusalCode::UnknownTransaction && !decisions::decision_resources(c).is_empty() {
                        match decisions::resolve_in_participants(c, &[gtid.to_string()]).await.get(gtid) {
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
            };
        }
    };
    let wait = Duration::from_millis(wait_ms.min(c.cfg.timeouts.long_poll_max_ms));
    let _ = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await;
    // Still committing: the write's answer may be lost while the record is in the
    // store; answer from it rather than "no decision" for a committed transaction
    // (the next recovery pass applies it to memory: adopt_records).
    if peek(c, gtid, |e| e.tx.state == TxState::Committing).unwrap_or(false) {
        if let Ok(Stored::Record(r)) = c.store.get(gtid).await {
            return Ok(DecisionState::from_record(gtid, &r));
        }
    }
    let now = with_tx(c, gtid, |e| Ok(DecisionState::from_tx(&e.tx)))?;
    match now {
        Lookup::Here(v) => Ok(v),
        // Dropped from memory while we waited (retention, a regained lease).
        Lookup::NotHere => Err(elsewhere(c, gtid).await),
    }
}

pub fn list(c: &Parts, filter: Option<&str>) -> Res<TransactionList> {
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

//! The interface every backend implements (`DecisionLog`), its operations and answers,
//! and what the store says about itself: schema version, identity, restores, leases.

use super::error::StoreError;
use super::record::{AuditEntry, DecisionRecord, Loaded, Stored};
use crate::state::Outcome;
pub use cotx_protocol::lease::{Renewal, Token};
use serde::{Deserialize, Serialize};

/// The decision store's schema version, kept in the store's meta row. 1: releases up to
/// 0.1.0 (no meta row; brought up to date in place). 2: the meta row (version, store id,
/// restores, tick) and epochs sealed by a restore. A daemon refuses a store of a newer
/// version: it would misread what a newer daemon wrote (never run an older daemon on it).
pub const SCHEMA_VERSION: i64 = 2;

/// The refusal for a store made by a newer daemon (`StoreError::NewerSchema`).
pub fn newer_schema(store: &str, found: i64) -> String {
    format!(
        "decision store {store} has schema version {found}, written by a newer cotx-coordinator; this one ({}) knows versions up to {SCHEMA_VERSION}: \
         run the newer daemon (a store is never downgraded)",
        env!("CARGO_PKG_VERSION")
    )
}

/// Which store this is and how far it has come: what a daemon's witness file compares
/// (crate::ha::witness) to notice a store that went back to an older copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Random, made with the store: another id is another store.
    pub store_id: String,
    /// How many times `mark-restored` ran on it (each seals every epoch it held).
    pub restores: i64,
    /// Bumped by every lease claim and renewal: it only grows while the store is the same.
    pub tick: i64,
}

/// What `mark-restored` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Epochs sealed: a gtid of theirs without a record is no longer presumed aborted.
    pub sealed: u64,
    pub restores: i64,
}

/// Lease generations jump this far at a restore: a copy's grant counter is behind grants
/// given after it was taken, and generations must never repeat.
pub const RESTORE_GRANT_JUMP: i64 = 1_000_000;

/// The owner of a node id, as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeLease {
    pub node: String,
    pub holder: String,
    pub url: String,
    /// Milliseconds until the lease runs out by the store's clock (negative: expired).
    pub expires_in_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Granted under a new generation (cotx_protocol::lease).
    Granted(i64),
    HeldBy(NodeLease),
}

#[derive(Debug, Clone)]
pub enum Op {
    /// Conditional insert: an existing record for the gtid wins and is returned. The
    /// token is the lease grant of the gtid's node the write is made under: the store
    /// writes only while that grant is in force (`None`: unfenced, tools and tests only).
    Decide(DecisionRecord, Option<Token>),
    /// Operator resolution of a quarantined (unreadable) record: replaces it.
    Overwrite(DecisionRecord),
    /// Every branch is finished: the record is kept (answerable) until the retention.
    Forget(String),
    /// Deletes records finished more than `older_than_ms` ago, raising each epoch's purge
    /// watermark to the highest sequence number deleted (cotx_protocol::answer::forgotten).
    Purge {
        older_than_ms: u64,
    },
    Audit(AuditEntry),
    /// Durable before any gtid of this epoch is issued.
    RegisterEpoch {
        node: String,
        nonce: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The outcome in force after the op (ours, or the one recorded before).
    Decided(Outcome),
    /// A record exists for the gtid but cannot be read: nothing was written.
    Corrupt(String),
    /// The writer does not hold the lease of the gtid's node any more: nothing was written.
    Fenced(String),
    /// The gtid is at or below its epoch's purge watermark: no decision is written for it
    /// any more (a write stalled past the retention must not land unopposed).
    Forgotten,
    Done,
}

/// The answer to a conditional decision write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// The outcome in force: ours, or the one recorded before.
    Outcome(Outcome),
    Corrupt(String),
    Fenced(String),
    Forgotten,
}

pub trait DecisionLog: Send + 'static {
    /// Applies the ops in one durable transaction (one sync), all or nothing.
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, StoreError>;
    /// Unfinished records, and every row that cannot be read (finished or not).
    fn load(&mut self) -> Result<Loaded, StoreError>;
    fn get(&mut self, gtid: &str) -> Result<Stored, StoreError>;
    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, StoreError>;
    /// Claims (or renews) the lease on `node` for `holder`. `fence_expired`: a holder
    /// whose lease ran out is cut off (its store session ended) and the claim taken.
    /// Every grant draws a new generation from a counter that never goes back.
    fn claim_node(
        &mut self,
        node: &str,
        holder: &str,
        url: &str,
        ttl_ms: u64,
        fence_expired: bool,
    ) -> Result<Claim, StoreError>;
    /// Extends the lease of the grant `t` if it is still in force (cotx_protocol::lease::renewal);
    /// never grants anew.
    fn renew_node(&mut self, node: &str, t: &Token, ttl_ms: u64) -> Result<Renewal, StoreError>;
    /// Gives the lease up. `forget`: delete it (a taken-over node with nothing left);
    /// otherwise it is only marked expired, so that anything still in doubt is taken over.
    fn release_node(&mut self, node: &str, holder: &str, forget: bool) -> Result<(), StoreError>;
    fn nodes(&mut self) -> Result<Vec<NodeLease>, StoreError>;
    fn identity(&mut self) -> Result<Identity, StoreError>;
    /// After the store was restored from a copy, before any daemon runs on it: seals every
    /// epoch it holds (a missing record of theirs may be a commit made after the copy was
    /// taken: "forgotten", never presumed aborted), moves lease generations past any given
    /// since, and counts the restore. Refused while a daemon runs on the store.
    fn mark_restored(&mut self) -> Result<Restored, StoreError>;
    /// Several daemons on one store: replaces `node`'s published sessions with `mine` and
    /// returns the other daemons' published within `max_age_ms` (by the store's clock).
    /// Deadlock detection needs them to see a cycle through two daemons' transactions
    /// (coordinator::deadlocks). A store one daemon owns has nobody to tell.
    fn exchange_sessions(
        &mut self,
        _node: &str,
        _mine: &[SharedSession],
        _max_age_ms: u64,
    ) -> Result<Vec<SharedSession>, StoreError> {
        Ok(Vec::new())
    }
}

/// A session of an active transaction, as its daemon tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSession {
    pub gtid: String,
    pub resource: String,
    pub session: i64,
    /// When the transaction began (its daemon's unix ms): the victim is the youngest.
    pub begun_ms: u64,
}

/// The outcome of an existing row met by a conditional insert.
pub fn existing_outcome(s: &str) -> OpResult {
    match Outcome::parse(s) {
        Some(o) => OpResult::Decided(o),
        None => OpResult::Corrupt(format!("unknown outcome {s:?}")),
    }
}

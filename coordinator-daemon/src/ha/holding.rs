//! What the HA operations (lease.rs, takeover.rs) use of the daemon: the parts they
//! borrow (`Holding`, lent by the coordinator above this folder: `Parts::holding`), the
//! memory of transactions as a trait the coordinator's registry implements (`Memory`), and
//! what a regained grant does to that memory (`Reconciled`). So ha/ never imports
//! coordinator/ (scripts/structure.py checks folders as well as files).

use crate::config::Config;
use crate::participants::resources::ResourceClient;
use crate::state::Outcome;
use crate::store::{CorruptRecord, Store};
use crate::telemetry::metrics::Metrics;
use std::collections::HashMap;
use std::sync::Arc;

use super::ownership::Ownership;

/// What the lease operations use of the daemon, borrowed: its config, store, ownership,
/// metrics, resources (their node locks) and memory of transactions.
#[derive(Clone, Copy)]
pub struct Holding<'a> {
    pub cfg: &'a Config,
    pub store: &'a Store,
    pub owner: &'a Ownership,
    pub metrics: &'a Metrics,
    pub resources: &'a HashMap<String, Arc<ResourceClient>>,
    pub memory: &'a (dyn Memory + Sync),
}

/// What the lease operations do to the daemon's memory of transactions (implemented by
/// the coordinator's registry).
pub trait Memory {
    /// Gtids in memory of `node`.
    fn gtids_of(&self, node: &str) -> Vec<String>;
    /// The store's word after a regained grant, applied to one entry.
    fn reconcile(&self, gtid: &str, verdict: Reconciled, generation: i64);
    /// Drops what is held of a node no longer acted for.
    fn forget_node(&self, node: &str);
    /// Logs an error once per `key`.
    fn warn_once(&self, key: String, msg: &str, fields: serde_json::Value);
}

/// What the store's word on a transaction of ours does to memory, once our own node's
/// grant was lost and claimed again (cotx_protocol::answer::after_regrant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled {
    /// Recorded: kept, as decided there, under the new grant.
    Keep(Outcome),
    /// No record (or unreadable now): forgotten; every answer about it comes from the store.
    Drop,
    /// An unreadable record: forgotten here, stopped until an operator decides.
    Quarantine(CorruptRecord),
    /// The store says quarantine but gave no record to show (left as it is).
    Leave,
}

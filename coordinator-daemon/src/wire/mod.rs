//! The API's response bodies: the types the coordinator builds its answers from and the
//! OpenAPI document (api/openapi.rs) shows, so that the document cannot describe a shape
//! the daemon does not send. Below both coordinator/ and api/: it imports neither.
//! The JSON is the contract with the clients (Python, Go, Java, the console): a field's
//! `skip_serializing_if` says it is absent in some answers, an `Option` without it that it
//! is written as null.
//!
//! `common.rs`: the enums the bodies share, and `to_json`; `tx.rs`: transactions and
//! their branches, the long poll's answer; `calls.rs`: begin, register, a branch's report,
//! a decision; `ops.rs`: the operators' and the console's reports; `tests.rs`: the JSON
//! of each, pinned. (Siblings import each other's files, never this one.)

pub mod calls;
pub mod common;
pub mod ops;
pub mod tx;

#[cfg(test)]
mod tests;

pub use self::calls::{Ack, Begun, Decided, Decision, EnforcementMode, GtidLease, Registered, Shim, Xid};
pub use self::common::{to_json, BranchState, FinishedBy, Id, Kind, OutcomeArg};
pub use self::ops::{
    Audit, AuditEntry, BrokenCycle, Health, Incident, Incidents, LockWait, NodeLease, Nodes, Ready,
    ResourceEnforcement, ResourceInfo, Resources, Waits,
};
pub use self::tx::{Blocking, Branch, DecisionState, Quarantined, Transaction, TransactionList};

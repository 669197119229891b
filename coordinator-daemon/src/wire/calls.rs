//! The answers to a client's calls on one transaction: begin, register, a branch's
//! report (`Ack`), and a decision (commit, abort, force: `Decision`).

use crate::state::{Outcome, TxState};
use crate::wire::common::{BranchState, Kind, OutcomeArg};
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Begun {
    pub gtid: String,
    pub state: TxState,
    pub timeout_ms: u64,
    /// Begun with its first branch: that branch's registration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch: Option<Registered>,
    /// Begun with all its branches (`branches` in the request): their registrations, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branches: Option<Vec<Registered>>,
}

/// A range of gtids leased for the one-request commit: the gtids are
/// `prefix` + the lowercase hexadecimal of `first` .. `first + count - 1`. Each must be
/// committed (`POST /v1/transactions/{gtid}/commit` with its `branches`) before
/// `expires_in_ms` from the answer; after it, recovery records abort for any of them
/// found prepared and rolls it back.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct GtidLease {
    pub prefix: String,
    pub first: u64,
    pub count: u64,
    pub expires_in_ms: u64,
    /// PostgreSQL branches are prepared as `<gid_prefix>:<gtid>:<branch_id>`.
    pub gid_prefix: String,
    /// MariaDB branches as XID (gtrid = gtid, bqual = branch_id, this format id).
    pub xa_format_id: i64,
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Registered {
    pub gtid: String,
    pub branch_id: String,
    pub resource: String,
    pub kind: Kind,
    /// PostgreSQL: the PREPARE TRANSACTION id (absent for MariaDB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<String>,
    /// MariaDB: the XA id (absent for PostgreSQL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid: Option<Xid>,
    /// How commitment ordering is enforced for this branch (docs/client-mode.md).
    pub enforcement: EnforcementMode,
    /// Client mode: the slot the branch writes before it prepares (PostgreSQL
    /// `SELECT cotx.shim_touch(key)`, MariaDB `UPDATE cotx_shim SET v = v + 1 WHERE k = key`,
    /// the branch SERIALIZABLE). Absent in the other modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shim: Option<Shim>,
}

#[derive(Serialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EnforcementMode {
    /// pg_co / mysql_co enforces it.
    Engine,
    /// The shims: the client writes the slot (and on MariaDB runs SERIALIZABLE).
    Client,
    /// Plain 2PC (configured so, for comparisons).
    None,
}

#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Eq)]
pub struct Shim {
    pub key: i32,
    /// The branch may commit in one phase (`one_phase_branch`) when it is its
    /// transaction's only branch: after its slot write, as before a PREPARE
    /// (docs/client-mode.md, "One phase"). False where the resource's objects are too old.
    pub one_phase: bool,
}

#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Eq)]
pub struct Xid {
    pub format_id: i64,
    pub gtrid: String,
    pub bqual: String,
}

/// The answer to a branch's report (prepared, failed, finished) or to several branches
/// finished at once.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Ack {
    pub gtid: String,
    /// One branch's report: the branch (absent when several finished at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::wire::common::Id>)]
    pub branch_id: Option<String>,
    /// Several branches finished at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<crate::wire::common::Id>>)]
    pub branches: Option<Vec<String>>,
    /// The branch's (or branches') state now: prepared, failed or finished.
    pub state: BranchState,
    /// finished: the outcome the branch reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeArg>,
    /// failed: the transaction's decision (abort).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<OutcomeArg>,
    /// failed: `deadlock_victim` when the daemon had aborted the transaction to break a
    /// deadlock across databases (the branch's error was that cancel): retry it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aborted_as: Option<String>,
    /// failed, of a transaction the daemon had aborted before this report (a timeout, a
    /// deadlock victim: its waiting statement was cancelled): whether running it again
    /// may succeed, whatever error the branch saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

impl Ack {
    /// One branch's report.
    pub fn branch(gtid: &str, bid: &str, state: BranchState) -> Ack {
        Ack {
            gtid: gtid.to_string(),
            branch_id: Some(bid.to_string()),
            branches: None,
            state,
            outcome: None,
            decision: None,
            aborted_as: None,
            retryable: None,
        }
    }
}

#[derive(Serialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Decided {
    Commit,
    Abort,
    OnePhase,
    /// `decide_in`: the participant's commit decides (co.decide).
    InParticipant,
}

impl From<Outcome> for Decided {
    fn from(o: Outcome) -> Decided {
        match o {
            Outcome::Commit => Decided::Commit,
            Outcome::Abort => Decided::Abort,
        }
    }
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Decision {
    pub gtid: String,
    pub decision: Decided,
    /// one_phase, in_participant: the branch that carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::wire::common::Id>)]
    pub branch_id: Option<String>,
    /// The decision was already in the store (a commit whose earlier answer was lost).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_store: Option<bool>,
    /// force: what was done (presumed abort, completion attempted, decision being written).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// force of a decided transaction: branches still unfinished after one attempt each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfinished_branches: Option<u64>,
    /// force of a quarantined transaction: the branches found prepared, which recovery
    /// finishes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branches: Option<u64>,
}

impl Decision {
    pub fn new(gtid: &str, decision: Decided) -> Decision {
        Decision {
            gtid: gtid.to_string(),
            decision,
            branch_id: None,
            from_store: None,
            note: None,
            unfinished_branches: None,
            branches: None,
        }
    }
}

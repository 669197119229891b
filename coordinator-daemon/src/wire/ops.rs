//! The operators' and the console's reports: health, resources (with how each enforces
//! commitment ordering), node leases, incidents, the audit log.

use crate::store::AuditEntry as StoredAudit;
use crate::wire::common::Kind;
use serde::Serialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// /healthz, served without a credential.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Health {
    pub status: String,
    pub node_id: String,
    /// Resource name -> reachable.
    pub resources: BTreeMap<String, bool>,
}

/// /readyz, served without a credential: whether this daemon can take new transactions
/// now (200) or not (503), for load balancers and Kubernetes' readiness probes.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Ready {
    /// ready | not_ready
    pub status: String,
    pub node_id: String,
    /// Why not: its lease unconfirmed, its decision store not answering, a resource whose
    /// branches are refused (it can enforce commitment ordering neither way its
    /// `enforcement` allows). Empty when ready.
    pub problems: Vec<String>,
}

#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Eq)]
pub struct ResourceEnforcement {
    /// auto | engine | client | none (the config).
    pub configured: String,
    /// engine | client | none, or unknown (not probed / unreachable) or refused (branches
    /// are refused: `reason` says why).
    pub mode: String,
    pub reason: Option<String>,
    /// Client mode: slots of live branches (absent in the other modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots_in_use: Option<u64>,
    /// Client mode on MariaDB: why new branches wait (a restart with branches prepared).
    /// Client mode: null while the gate is open; absent in the other modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub restart_gate: Option<Option<String>>,
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct ResourceInfo {
    pub name: String,
    pub kind: Kind,
    /// Whether the last contact with it worked (null: not contacted yet).
    pub up: Option<bool>,
    /// Carries global decisions (pg_co's co.decisions).
    pub decisions: bool,
    /// Branches prepared on it, unfinished, of transactions in this daemon's memory.
    pub prepared_branches: u64,
    pub enforcement: ResourceEnforcement,
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Resources {
    pub resources: Vec<ResourceInfo>,
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct NodeLease {
    pub node: String,
    /// The daemon holding it (node@host/pid/epoch); empty once released.
    pub holder: String,
    /// Where its holder serves the API.
    pub url: String,
    /// Until the lease runs out by the store's clock (negative: expired).
    pub expires_in_ms: i64,
    /// Held by this daemon (its own node, or one it took over).
    pub mine: bool,
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Nodes {
    /// This daemon's node id and lease holder id.
    pub node_id: String,
    pub holder: String,
    /// Its own lease is known valid (false: it acts on nothing until renewed).
    pub lease_valid: bool,
    /// Nodes it took over from daemons whose lease ran out.
    pub adopted: Vec<String>,
    pub nodes: Vec<NodeLease>,
}

/// A branch that did not reach the decided outcome (kept in memory: the coordinator's
/// registry holds these very values).
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Incident {
    pub at_unix_ms: u64,
    pub gtid: String,
    pub branch_id: String,
    pub resource: String,
    pub message: String,
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Incidents {
    pub incidents: Vec<Incident>,
}

/// One lock wait the deadlock detector read, in which one of this daemon's live
/// transactions waits or is waited for: each side a gtid, or "session N at R (no global
/// transaction)".
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Eq)]
pub struct LockWait {
    pub waiter: String,
    pub blocker: String,
    pub resource: String,
    /// What is waited for, as the engine says (tables; table, index and key on MariaDB).
    pub on: String,
}

/// A wait cycle across databases this daemon broke.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct BrokenCycle {
    pub at_unix_ms: u64,
    pub victim: String,
    pub waits: Vec<String>,
}

/// What the deadlock detector saw at its last pass, and the cycles it broke lately.
#[derive(Serialize, ToSchema, Clone, Debug, Default)]
pub struct Waits {
    /// When the last pass read the resources' lock waits (none yet: null). Passes run only
    /// while a transaction has been active `timeouts.deadlock_check_ms`.
    pub checked_at_unix_ms: Option<u64>,
    pub waits: Vec<LockWait>,
    /// The latest first, at most 20.
    pub broken: Vec<BrokenCycle>,
}

/// One operator action (force), audited before it acts (`result` "attempt") and after.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct AuditEntry {
    pub at_unix_ms: u64,
    pub gtid: String,
    pub outcome: String,
    pub operator: String,
    pub reason: String,
    pub result: String,
}

impl From<StoredAudit> for AuditEntry {
    fn from(a: StoredAudit) -> AuditEntry {
        AuditEntry {
            at_unix_ms: a.at_unix_ms,
            gtid: a.gtid,
            outcome: a.outcome,
            operator: a.operator,
            reason: a.reason,
            result: a.result,
        }
    }
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Audit {
    pub audit: Vec<AuditEntry>,
}

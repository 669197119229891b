//! Transactions as the API shows them: one in memory (`from_tx`), one read back from the
//! store (`from_record`), the list, and the long poll's answer.

use crate::state::{self, Outcome, Tx, TxState};
use crate::store::{CorruptRecord, DecisionRecord};
use crate::wire::common::{BranchState, FinishedBy, Kind, OutcomeArg};
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Branch {
    pub branch_id: String,
    pub resource: String,
    /// Absent in a transaction read back from the store (the record keeps only the
    /// resource and the id), as are the other optional fields but `blocking`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<BranchState>,
    /// finished: the outcome it reached, and who finished it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeArg>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_by: Option<FinishedBy>,
    /// Why its prepare failed, or why completing it did not work yet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Completion attempts by the daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u64>,
    /// /v1/in-doubt, prepared branches: what the branch blocks on its resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocking: Option<Blocking>,
}

/// What a prepared branch does to others on its resource, as far as the resource tells:
/// one of the three sets of fields below is present, the others absent.
#[derive(Serialize, ToSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocking {
    /// PostgreSQL: locks the prepared transaction holds, and sessions waiting for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locks_held: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions_waiting_on_prepared: Option<i64>,
    /// MariaDB (no per-XID lock view): lock waits on the whole resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_waits_on_resource: Option<i64>,
    /// The resource could not be asked (unreachable, timed out, not configured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Blocking {
    pub fn error(e: impl Into<String>) -> Blocking {
        Blocking { error: Some(e.into()), ..Blocking::default() }
    }
}

/// A decision record the daemon could not read: its gtid is quarantined until an
/// operator decides.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Eq)]
pub struct Quarantined {
    pub gtid: String,
    /// What is wrong with the row.
    pub problem: String,
}

impl From<&CorruptRecord> for Quarantined {
    fn from(q: &CorruptRecord) -> Quarantined {
        Quarantined { gtid: q.gtid.clone(), problem: q.problem.clone() }
    }
}

impl Branch {
    pub fn from_branch(b: &state::Branch) -> Branch {
        Branch {
            branch_id: b.branch_id.clone(),
            resource: b.resource.clone(),
            kind: Some(b.kind.into()),
            state: Some(b.state.into()),
            outcome: b.outcome.map(Into::into),
            finished_by: b.finished_by.map(Into::into),
            note: b.note.clone(),
            attempts: Some(b.attempts.into()),
            blocking: None,
        }
    }
}

/// Two sources, two sets of fields: a transaction in memory has its clock fields and
/// flags (`in_doubt`, `age_ms`, `created_unix_ms`, `decided_unix_ms`, `recovered`), one
/// read back from the store has `from_store` and `node` instead. Each set is absent from
/// the other's answers (skipped).
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct Transaction {
    pub gtid: String,
    pub state: TxState,
    /// Null while undecided.
    pub decision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_doubt: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_unix_ms: Option<u64>,
    /// When the decision was taken (null until then; absent in answers from the store):
    /// the console's timeline of the transaction.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub decided_unix_ms: Option<Option<u64>>,
    pub abort_reason: Option<String>,
    /// Aborted by a refused prepare (serialization failure): worth retrying.
    pub retryable: bool,
    /// Rebuilt from the store by recovery.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovered: Option<bool>,
    /// Read back from the store (no longer in memory), and the node that recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_store: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub branches: Vec<Branch>,
}

impl Transaction {
    pub fn from_tx(t: &Tx) -> Transaction {
        Transaction {
            gtid: t.gtid.clone(),
            state: t.state(),
            decision: t.decision().map(|o| o.as_str().to_string()),
            in_doubt: Some(t.in_doubt()),
            age_ms: Some(t.created.elapsed().as_millis() as u64),
            created_unix_ms: Some(t.created_unix_ms),
            // Wall clock, derived from the monotonic one.
            decided_unix_ms: Some(
                t.decided.map(|d| t.created_unix_ms + d.saturating_duration_since(t.created).as_millis() as u64),
            ),
            abort_reason: t.abort_reason.clone(),
            retryable: t.retryable,
            recovered: Some(t.recovered),
            from_store: None,
            node: None,
            branches: t.branches.iter().map(Branch::from_branch).collect(),
        }
    }

    pub fn from_record(r: &DecisionRecord) -> Transaction {
        Transaction {
            gtid: r.gtid.clone(),
            state: record_state(r),
            decision: Some(r.outcome.as_str().to_string()),
            in_doubt: None,
            age_ms: None,
            created_unix_ms: None,
            decided_unix_ms: None,
            abort_reason: record_abort_reason(r),
            retryable: false,
            recovered: None,
            from_store: Some(true),
            node: Some(r.node.clone()),
            branches: r
                .branches
                .iter()
                .map(|(res, b)| Branch {
                    branch_id: b.clone(),
                    resource: res.clone(),
                    kind: None,
                    state: None,
                    outcome: None,
                    finished_by: None,
                    note: None,
                    attempts: None,
                    blocking: None,
                })
                .collect(),
        }
    }
}

fn record_state(r: &DecisionRecord) -> TxState {
    if r.outcome == Outcome::Commit {
        TxState::Committed
    } else {
        TxState::Aborted
    }
}

fn record_abort_reason(r: &DecisionRecord) -> Option<String> {
    (r.outcome == Outcome::Abort).then(|| format!("recorded abort ({})", r.source))
}

#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct TransactionList {
    pub transactions: Vec<Transaction>,
    /// /v1/in-doubt: decision records the daemon could not read (docs/ops.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<Vec<Quarantined>>,
}

/// The long poll's answer.
#[derive(Serialize, ToSchema, Clone, Debug)]
pub struct DecisionState {
    pub gtid: String,
    pub state: TxState,
    /// Null while undecided.
    pub decision: Option<OutcomeArg>,
    pub abort_reason: Option<String>,
    pub retryable: bool,
    /// Not in memory nor in the store: the decision resource (pg_co) said commit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_participant: Option<bool>,
}

impl DecisionState {
    pub fn from_tx(t: &Tx) -> DecisionState {
        DecisionState {
            gtid: t.gtid.clone(),
            state: t.state(),
            decision: t.decision().map(Into::into),
            abort_reason: t.abort_reason.clone(),
            retryable: t.retryable,
            from_participant: None,
        }
    }

    pub fn from_record(gtid: &str, r: &DecisionRecord) -> DecisionState {
        DecisionState {
            gtid: gtid.to_string(),
            state: record_state(r),
            decision: Some(r.outcome.into()),
            abort_reason: record_abort_reason(r),
            retryable: false,
            from_participant: None,
        }
    }

    /// Committed in a participant (pg_co's co.resolve), known nowhere else.
    pub fn committed_in_participant(gtid: &str) -> DecisionState {
        DecisionState {
            gtid: gtid.to_string(),
            state: TxState::Committed,
            decision: Some(OutcomeArg::Commit),
            abort_reason: None,
            retryable: false,
            from_participant: Some(true),
        }
    }
}

//! Refusals: every reason the daemon says no, as one enum that carries its wire name and
//! its HTTP status, so that a new code cannot be added without both (the compiler checks
//! the matches below). The messages say what was wrong in words; the codes are what
//! clients dispatch on (docs/coordinator.md, "Error codes").

use serde::Serialize;

/// A machine-readable reason for a refusal. Serialized as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    InvalidJson,
    InvalidBody,
    InvalidField,
    InvalidId,
    IdTooLong,
    ConfirmationRequired,
    Unauthorized,
    Forbidden,
    NotFound,
    UnknownTransaction,
    UnknownBranch,
    UnknownResource,
    ResourceRefused,
    OutcomeForgotten,
    MethodNotAllowed,
    DuplicateBranch,
    AlreadyPrepared,
    BranchNotPrepared,
    NoBranches,
    NotSingleBranch,
    NotDecided,
    OutcomeMismatch,
    TransactionAborted,
    /// Aborted to break a deadlock across databases (coordinator/deadlocks.rs): retry.
    DeadlockVictim,
    TransactionCommitted,
    TransactionOnePhase,
    WrongState,
    TransactionDeciding,
    NotADecisionResource,
    ContradictsDecision,
    PayloadTooLarge,
    WrongNode,
    TooManyTransactions,
    StoreUnavailable,
    OwnerUnavailable,
    Quarantined,
    LeaseUnconfirmed,
    LeaseLost,
    TooManyConnections,
    ResourceUnavailable,
    ResourceBusy,
    RestartGate,
}

impl RefusalCode {
    /// Every code, for the tests and the OpenAPI document.
    pub const ALL: &'static [RefusalCode] = &[
        RefusalCode::InvalidJson,
        RefusalCode::InvalidBody,
        RefusalCode::InvalidField,
        RefusalCode::InvalidId,
        RefusalCode::IdTooLong,
        RefusalCode::ConfirmationRequired,
        RefusalCode::Unauthorized,
        RefusalCode::Forbidden,
        RefusalCode::NotFound,
        RefusalCode::UnknownTransaction,
        RefusalCode::UnknownBranch,
        RefusalCode::UnknownResource,
        RefusalCode::ResourceRefused,
        RefusalCode::OutcomeForgotten,
        RefusalCode::MethodNotAllowed,
        RefusalCode::DuplicateBranch,
        RefusalCode::AlreadyPrepared,
        RefusalCode::BranchNotPrepared,
        RefusalCode::NoBranches,
        RefusalCode::NotSingleBranch,
        RefusalCode::NotDecided,
        RefusalCode::OutcomeMismatch,
        RefusalCode::TransactionAborted,
        RefusalCode::DeadlockVictim,
        RefusalCode::TransactionCommitted,
        RefusalCode::TransactionOnePhase,
        RefusalCode::WrongState,
        RefusalCode::TransactionDeciding,
        RefusalCode::NotADecisionResource,
        RefusalCode::ContradictsDecision,
        RefusalCode::PayloadTooLarge,
        RefusalCode::WrongNode,
        RefusalCode::TooManyTransactions,
        RefusalCode::StoreUnavailable,
        RefusalCode::OwnerUnavailable,
        RefusalCode::Quarantined,
        RefusalCode::LeaseUnconfirmed,
        RefusalCode::LeaseLost,
        RefusalCode::TooManyConnections,
        RefusalCode::ResourceUnavailable,
        RefusalCode::ResourceBusy,
        RefusalCode::RestartGate,
    ];

    /// The wire name (what `Serialize` writes).
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalCode::InvalidJson => "invalid_json",
            RefusalCode::InvalidBody => "invalid_body",
            RefusalCode::InvalidField => "invalid_field",
            RefusalCode::InvalidId => "invalid_id",
            RefusalCode::IdTooLong => "id_too_long",
            RefusalCode::ConfirmationRequired => "confirmation_required",
            RefusalCode::Unauthorized => "unauthorized",
            RefusalCode::Forbidden => "forbidden",
            RefusalCode::NotFound => "not_found",
            RefusalCode::UnknownTransaction => "unknown_transaction",
            RefusalCode::UnknownBranch => "unknown_branch",
            RefusalCode::UnknownResource => "unknown_resource",
            RefusalCode::ResourceRefused => "resource_refused",
            RefusalCode::OutcomeForgotten => "outcome_forgotten",
            RefusalCode::MethodNotAllowed => "method_not_allowed",
            RefusalCode::DuplicateBranch => "duplicate_branch",
            RefusalCode::AlreadyPrepared => "already_prepared",
            RefusalCode::BranchNotPrepared => "branch_not_prepared",
            RefusalCode::NoBranches => "no_branches",
            RefusalCode::NotSingleBranch => "not_single_branch",
            RefusalCode::NotDecided => "not_decided",
            RefusalCode::OutcomeMismatch => "outcome_mismatch",
            RefusalCode::TransactionAborted => "transaction_aborted",
            RefusalCode::DeadlockVictim => "deadlock_victim",
            RefusalCode::TransactionCommitted => "transaction_committed",
            RefusalCode::TransactionOnePhase => "transaction_one_phase",
            RefusalCode::WrongState => "wrong_state",
            RefusalCode::TransactionDeciding => "transaction_deciding",
            RefusalCode::NotADecisionResource => "not_a_decision_resource",
            RefusalCode::ContradictsDecision => "contradicts_decision",
            RefusalCode::PayloadTooLarge => "payload_too_large",
            RefusalCode::WrongNode => "wrong_node",
            RefusalCode::TooManyTransactions => "too_many_transactions",
            RefusalCode::StoreUnavailable => "store_unavailable",
            RefusalCode::OwnerUnavailable => "owner_unavailable",
            RefusalCode::Quarantined => "quarantined",
            RefusalCode::LeaseUnconfirmed => "lease_unconfirmed",
            RefusalCode::LeaseLost => "lease_lost",
            RefusalCode::TooManyConnections => "too_many_connections",
            RefusalCode::ResourceUnavailable => "resource_unavailable",
            RefusalCode::ResourceBusy => "resource_busy",
            RefusalCode::RestartGate => "restart_gate",
        }
    }

    /// The HTTP status the API answers with.
    pub fn http_status(self) -> u16 {
        match self {
            RefusalCode::InvalidJson => 400,
            RefusalCode::InvalidBody => 400,
            RefusalCode::InvalidField => 400,
            RefusalCode::InvalidId => 400,
            RefusalCode::IdTooLong => 400,
            RefusalCode::ConfirmationRequired => 400,
            RefusalCode::Unauthorized => 401,
            RefusalCode::Forbidden => 403,
            RefusalCode::NotFound => 404,
            RefusalCode::UnknownTransaction => 404,
            RefusalCode::UnknownBranch => 404,
            RefusalCode::UnknownResource => 404,
            RefusalCode::ResourceRefused => 409,
            RefusalCode::OutcomeForgotten => 410,
            RefusalCode::MethodNotAllowed => 405,
            RefusalCode::DuplicateBranch => 409,
            RefusalCode::AlreadyPrepared => 409,
            RefusalCode::BranchNotPrepared => 409,
            RefusalCode::NoBranches => 409,
            RefusalCode::NotSingleBranch => 409,
            RefusalCode::NotDecided => 409,
            RefusalCode::OutcomeMismatch => 409,
            RefusalCode::TransactionAborted => 409,
            RefusalCode::DeadlockVictim => 409,
            RefusalCode::TransactionCommitted => 409,
            RefusalCode::TransactionOnePhase => 409,
            RefusalCode::WrongState => 409,
            RefusalCode::TransactionDeciding => 409,
            RefusalCode::NotADecisionResource => 409,
            RefusalCode::ContradictsDecision => 409,
            RefusalCode::PayloadTooLarge => 413,
            RefusalCode::WrongNode => 421,
            RefusalCode::TooManyTransactions => 429,
            RefusalCode::StoreUnavailable => 503,
            RefusalCode::OwnerUnavailable => 503,
            RefusalCode::Quarantined => 503,
            RefusalCode::LeaseUnconfirmed => 503,
            RefusalCode::LeaseLost => 503,
            RefusalCode::TooManyConnections => 503,
            RefusalCode::ResourceUnavailable => 503,
            RefusalCode::ResourceBusy => 503,
            RefusalCode::RestartGate => 503,
        }
    }
}

impl std::fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused request: a code and a message; `owner_url` when another daemon owns the
/// transaction (the client asks it instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: RefusalCode,
    pub message: String,
    pub owner_url: Option<String>,
}

impl Refusal {
    pub fn new(code: RefusalCode, message: impl Into<String>) -> Refusal {
        Refusal { code, message: message.into(), owner_url: None }
    }
}

pub fn refuse<T>(code: RefusalCode, message: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal::new(code, message))
}

#[cfg(test)]
mod tests {
    use super::RefusalCode;

    /// The wire name is the serde name, and no status is a server error (a refusal is the
    /// client's to handle).
    #[test]
    fn names_and_statuses() {
        let mut seen = std::collections::HashSet::new();
        for c in RefusalCode::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), serde_json::json!(c.as_str()));
            assert!(seen.insert(c.as_str()), "{c:?} twice");
            assert!((400..600).contains(&c.http_status()) && c.http_status() != 500, "{c:?}");
        }
    }
}

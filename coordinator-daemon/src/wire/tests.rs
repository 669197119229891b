//! The JSON of the bodies, field by field: which fields are absent and which are null is
//! what the clients (Python, Go, Java, the console) read, and it was so before these types
//! (the `json!` literals they replaced). Pinned here, where a changed attribute shows.

use crate::config::ResourceKind;
use crate::state::{Outcome, Tx};
use crate::store::DecisionRecord;
use crate::wire::calls::{Ack, Decided, Decision};
use crate::wire::common::{to_json, BranchState, OutcomeArg};
use crate::wire::ops::ResourceEnforcement;
use crate::wire::tx::{DecisionState, Transaction};
use serde_json::json;
use std::time::Duration;

fn keys(v: &serde_json::Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(|k| k.as_str()).collect()
}

#[test]
fn a_transaction_in_memory_has_its_clock_fields_and_nulls_until_decided() {
    let mut t = Tx::new("n1-1-1".into(), Duration::from_secs(5));
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    let v = to_json(&Transaction::from_tx(&t));
    assert_eq!(
        keys(&v),
        [
            "abort_reason",
            "age_ms",
            "branches",
            "created_unix_ms",
            "decided_unix_ms",
            "decision",
            "gtid",
            "in_doubt",
            "recovered",
            "retryable",
            "state"
        ]
    );
    assert!(v["decision"].is_null() && v["decided_unix_ms"].is_null() && v["abort_reason"].is_null(), "{v}");
    assert_eq!(
        v["branches"],
        json!([{"branch_id": "b1", "resource": "pg", "kind": "postgres", "state": "registered", "attempts": 0}])
    );
}

#[test]
fn a_transaction_from_the_store_has_from_store_and_node_instead() {
    let r = DecisionRecord {
        gtid: "n1-1-2".into(),
        outcome: Outcome::Abort,
        branches: vec![("pg".into(), "b1".into())],
        decided_unix_ms: 1,
        node: "n1".into(),
        source: "operator".into(),
    };
    assert_eq!(
        to_json(&Transaction::from_record(&r)),
        json!({"gtid": "n1-1-2", "state": "aborted", "decision": "abort",
        "abort_reason": "recorded abort (operator)", "retryable": false, "from_store": true, "node": "n1",
        "branches": [{"resource": "pg", "branch_id": "b1"}]})
    );
    assert_eq!(
        to_json(&DecisionState::from_record("n1-1-2", &r)),
        json!({"gtid": "n1-1-2", "state": "aborted", "decision": "abort",
        "abort_reason": "recorded abort (operator)", "retryable": false})
    );
    assert_eq!(
        to_json(&DecisionState::committed_in_participant("g")),
        json!({"gtid": "g", "state": "committed", "decision": "commit",
        "abort_reason": null, "retryable": false, "from_participant": true})
    );
}

#[test]
fn acks_and_decisions_carry_only_their_case_s_fields() {
    assert_eq!(
        to_json(&Ack::branch("g", "b", BranchState::Prepared)),
        json!({"gtid": "g", "branch_id": "b", "state": "prepared"})
    );
    let failed = Ack { decision: Some(OutcomeArg::Abort), ..Ack::branch("g", "b", BranchState::Failed) };
    assert_eq!(to_json(&failed), json!({"gtid": "g", "branch_id": "b", "state": "failed", "decision": "abort"}));
    assert_eq!(
        to_json(&Decision::new("g", Decided::InParticipant)),
        json!({"gtid": "g", "decision": "in_participant"})
    );
    let stored = Decision { from_store: Some(true), ..Decision::new("g", Outcome::Commit.into()) };
    assert_eq!(to_json(&stored), json!({"gtid": "g", "decision": "commit", "from_store": true}));
}

#[test]
fn enforcement_shows_slots_and_gate_in_client_mode_only() {
    let e = ResourceEnforcement {
        configured: "none".into(),
        mode: "none".into(),
        reason: None,
        slots_in_use: None,
        restart_gate: None,
    };
    assert_eq!(to_json(&e), json!({"configured": "none", "mode": "none", "reason": null}));
    let c = ResourceEnforcement {
        slots_in_use: Some(2),
        restart_gate: Some(None),
        configured: "client".into(),
        mode: "client".into(),
        ..e
    };
    assert_eq!(
        to_json(&c),
        json!({"configured": "client", "mode": "client", "reason": null, "slots_in_use": 2, "restart_gate": null})
    );
}

#[test]
fn blocking_shows_what_its_resource_told() {
    use crate::wire::tx::{Blocking, Quarantined};
    assert_eq!(to_json(&Blocking::error("timed out")), json!({"error": "timed out"}));
    let pg = Blocking { locks_held: Some(3), sessions_waiting_on_prepared: Some(1), ..Blocking::default() };
    assert_eq!(to_json(&pg), json!({"locks_held": 3, "sessions_waiting_on_prepared": 1}));
    let q = crate::store::CorruptRecord { gtid: "g".into(), problem: "bad".into() };
    assert_eq!(to_json(&Quarantined::from(&q)), json!({"gtid": "g", "problem": "bad"}));
}

#![cfg(test)]
//! Whole flows of the coordinator over a temporary SQLite store, and the coordinators the
//! other modules' unit tests start (`coord`, `coord_with`, `coord_src`).

use super::*;
use crate::refusal::RefusalCode;
use crate::store::sqlite::SqliteLog;
use serde_json::json;
use std::time::Duration;

/// A coordinator that owns its node (claimed, epoch registered), as at start.
/// Its resource's database is never reached: `enforcement = "none"` (plain 2PC) unless
/// `enforcement` says otherwise.
pub(crate) async fn coord(name: &str) -> Arc<Coordinator> {
    coord_with(name, "none").await
}

pub(crate) async fn coord_with(name: &str, enforcement: &str) -> Arc<Coordinator> {
    coord_src(name, enforcement, "").await
}

/// `resource_extra`: more lines of the resource's table (e.g. `decisions = true`).
pub(crate) async fn coord_src(name: &str, enforcement: &str, resource_extra: &str) -> Arc<Coordinator> {
    let d = std::env::temp_dir().join(format!("cotx-coord-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let src = format!(
        "allow_no_auth = true\nnode_id = \"u1\"\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n[[resources]]\nname = \"pg\"\nkind = \"postgres\"\ndsn = \"host=127.0.0.1 port=1 user=x connect_timeout=1\"\nenforcement = \"{enforcement}\"\n{resource_extra}",
        d.join("s.db").display()
    );
    let cfg = crate::config::parse(&src, None).unwrap();
    let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 64);
    let c = Coordinator::new(cfg, store, None).unwrap();
    crate::ha::lease::claim_at_start(&c.parts().holding()).await.unwrap();
    c
}

/// The console's reports: the node lease this daemon holds, and prepared branches
/// counted on their resource (nothing contacted yet: health unknown, not "down").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_for_the_console() {
    let c = coord("reports").await;
    let n = wire::to_json(&c.nodes_report().await.unwrap());
    assert_eq!(n["node_id"], "u1");
    assert_eq!(n["lease_valid"], true);
    let own: Vec<_> = n["nodes"].as_array().unwrap().iter().filter(|l| l["node"] == "u1").collect();
    assert_eq!(own.len(), 1, "{n}");
    assert_eq!(own[0]["mine"], true);
    assert_eq!(own[0]["holder"], c.holder());
    assert!(own[0]["expires_in_ms"].as_i64().unwrap() > 0, "{n}");
    let g = c.begin(None).unwrap().gtid;
    c.register(&g, "pg", "b1").await.unwrap();
    c.register(&g, "pg", "b2").await.unwrap();
    c.prepared(&g, "b1").await.unwrap();
    let r = wire::to_json(&c.resources_report());
    assert_eq!(
        r["resources"],
        json!([{"name": "pg", "kind": "postgres", "up": null, "decisions": false, "prepared_branches": 1,
        "enforcement": {"configured": "none", "mode": "none", "reason": null}}])
    );
    let t = wire::to_json(&c.get(&g).await.unwrap());
    assert!(t["created_unix_ms"].as_u64().unwrap() > 0 && t["decided_unix_ms"].is_null(), "{t}");
}

/// A resource whose enforcement cannot be told (here: unreachable) gets no branch: it is
/// never plain 2PC by default. Nothing is left registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_of_unknown_enforcement_gets_no_branch() {
    for mode in ["auto", "engine", "client"] {
        let c = coord_with(&format!("unknown-{mode}"), mode).await;
        let g = c.begin(None).unwrap().gtid;
        let e = c.register(&g, "pg", "b1").await.unwrap_err();
        assert_eq!(e.code, RefusalCode::ResourceUnavailable, "{mode}: {e:?}");
        assert!(
            e.message.contains("resource pg") && e.message.contains("cannot tell how commitment ordering is enforced"),
            "{}",
            e.message
        );
        assert!(c.get(&g).await.unwrap().branches.is_empty());
        let e = c.begin_with_branch(None, "pg", "b1", None).await.unwrap_err();
        assert_eq!(e.code, RefusalCode::ResourceUnavailable);
        assert_eq!(c.resources_report().resources[0].enforcement.mode, "unknown");
    }
}

/// Decision in a participant: one acknowledgement for every branch, the decision
/// branch named anywhere in it (the others are checked against its outcome).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_acknowledgement_finishes_a_decision_in_a_participant_whatever_its_order() {
    let c = coord_src("dip-ack", "none", "decisions = true\n").await;
    let two = [("pg".to_string(), "b0".to_string(), None), ("pg".to_string(), "b1".to_string(), None)];
    let g = c.begin_with_branches(None, &two).await.unwrap().gtid;
    let d = c.commit_decide_in(&g, &["b0".to_string()], "b1").await.unwrap();
    assert_eq!(wire::to_json(&d)["decision"], "in_participant");
    c.finished_many(&g, &["b0".to_string(), "b1".to_string()], Outcome::Commit).await.unwrap();
    let t = wire::to_json(&c.get(&g).await.unwrap());
    assert_eq!(t["state"], "committed", "{t}");
    assert!(
        t["branches"].as_array().unwrap().iter().all(|b| b["state"] == "finished" && b["finished_by"] == "owner"),
        "{t}"
    );
}

/// The one-request commit with `decide_in`: the leased gtid enters memory deciding in
/// that branch, nothing written; a decide_in naming no listed branch, or a decision branch
/// on a resource without decisions, leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_request_commit_hands_the_decision_to_a_participant() {
    use super::one_request::DecideBy;
    let c = coord_src("dip-leased", "none", "decisions = true\n").await;
    let lease = c.lease_gtids(Some(3), None).unwrap();
    let gtid = |i: u64| format!("{}{:x}", lease.prefix, lease.first + i);
    let two = [("pg".to_string(), "b0".to_string(), None), ("pg".to_string(), "b1".to_string(), None)];
    let d = c.commit_leased(&gtid(0), &two, DecideBy::Participant("b1")).await.unwrap();
    assert_eq!(wire::to_json(&d)["decision"], "in_participant");
    let t = wire::to_json(&c.get(&gtid(0)).await.unwrap());
    assert_eq!(t["state"], "deciding", "{t}");
    assert!(c.wait_decision(&gtid(0), 0).await.unwrap().decision.is_none(), "deciding: never presumed aborted");
    c.finished_many(&gtid(0), &["b1".to_string(), "b0".to_string()], Outcome::Commit).await.unwrap();
    assert_eq!(wire::to_json(&c.get(&gtid(0)).await.unwrap())["state"], "committed");

    let e = c.commit_leased(&gtid(1), &two, DecideBy::Participant("b9")).await.unwrap_err();
    assert_eq!(e.code, RefusalCode::InvalidField, "{e:?}");
    assert!(e.message.contains("\"b9\" is not one of the listed branches"), "{}", e.message);
    assert!(c.get(&gtid(1)).await.is_err(), "a refused request leaves nothing in memory");

    let plain = coord("dip-leased-plain").await;
    let lease = plain.lease_gtids(Some(1), None).unwrap();
    let g = format!("{}{:x}", lease.prefix, lease.first);
    let e = plain.commit_leased(&g, &two, DecideBy::Participant("b1")).await.unwrap_err();
    assert_eq!(e.code, RefusalCode::NotADecisionResource, "{e:?}");
    assert!(plain.get(&g).await.is_err(), "refused after it entered memory: out again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_branch_at_begin_is_all_or_nothing() {
    let c = coord("branches").await;
    let two = [("pg".to_string(), "b1".to_string(), None), ("pg".to_string(), "b2".to_string(), None)];
    let b = c.begin_with_branches(None, &two).await.unwrap();
    let regs = b.branches.unwrap();
    assert_eq!(regs.iter().map(|r| r.branch_id.as_str()).collect::<Vec<_>>(), ["b1", "b2"]);
    assert!(regs.iter().all(|r| r.gid.is_some()));
    let n = c.list(None).unwrap().transactions.len();
    // A refused first branch leaves nothing; a refused later one aborts the transaction.
    let first_bad = [("nope".to_string(), "b1".to_string(), None)];
    assert_eq!(c.begin_with_branches(None, &first_bad).await.unwrap_err().code, RefusalCode::UnknownResource);
    assert_eq!(c.list(None).unwrap().transactions.len(), n);
    let later_bad = [("pg".to_string(), "b1".to_string(), None), ("nope".to_string(), "b2".to_string(), None)];
    assert_eq!(c.begin_with_branches(None, &later_bad).await.unwrap_err().code, RefusalCode::UnknownResource);
    let aborted = c.list(Some("aborted")).unwrap().transactions;
    assert_eq!(aborted.len(), 1);
    assert!(
        wire::to_json(&aborted[0])["abort_reason"].as_str().unwrap().contains("b2"),
        "{:?}",
        wire::to_json(&aborted[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_is_all_or_nothing_and_durable_first() {
    let c = coord("commit").await;
    let g = c.begin(None).unwrap().gtid;
    c.register(&g, "pg", "b1").await.unwrap();
    c.register(&g, "pg", "b2").await.unwrap();
    let before = wire::to_json(&c.get(&g).await.unwrap())["branches"].clone();
    let e = c.commit_with(&g, "coordinator", &["b1".into(), "zz".into()]).await.unwrap_err();
    assert_eq!(e.code, RefusalCode::UnknownBranch);
    assert_eq!(
        wire::to_json(&c.get(&g).await.unwrap())["branches"],
        before,
        "a refused commit must not mark b1 prepared"
    );
    let e = c.commit_with(&g, "coordinator", &["b1".into()]).await.unwrap_err();
    assert_eq!(e.code, RefusalCode::BranchNotPrepared);
    assert_eq!(wire::to_json(&c.get(&g).await.unwrap())["branches"], before);
    let r = c.commit_with(&g, "coordinator", &["b1".into(), "b2".into()]).await.unwrap();
    assert_eq!(r.decision, wire::Decided::Commit);
    // Durable before the answer.
    let recs = c.store.load().await.unwrap().records;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].branches, vec![("pg".to_string(), "b1".to_string()), ("pg".to_string(), "b2".to_string())]);
    // Finished by owners → the record is deleted.
    c.finished_many(&g, &["b1".into(), "b2".into()], Outcome::Commit).await.unwrap();
    for _ in 0..100 {
        if c.store.load().await.unwrap().records.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("record not deleted after all branches finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_by_state_and_names_the_accepted_values() {
    let c = coord("list").await;
    let g = c.begin(None).unwrap().gtid;
    let gtids =
        |f: &str| -> Vec<String> { c.list(Some(f)).unwrap().transactions.into_iter().map(|t| t.gtid).collect() };
    assert_eq!(gtids("active"), vec![g.clone()]);
    assert!(gtids("committed").is_empty() && gtids("in_doubt").is_empty());
    let e = c.list(Some("prepared")).unwrap_err();
    assert_eq!(e.code, RefusalCode::InvalidField);
    for v in ["active", "one_phase", "deciding", "in_doubt"] {
        assert!(e.message.contains(v), "{}", e.message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_aborts_and_presumed_abort_leaves_no_record() {
    let c = coord("timeout").await;
    let g = c.begin(Some(10)).unwrap().gtid;
    c.register(&g, "pg", "b1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    c.tick();
    assert_eq!(c.get(&g).await.unwrap().state, crate::state::TxState::Aborted);
    assert_eq!(c.prepared(&g, "b1").await.unwrap_err().code, RefusalCode::TransactionAborted);
    assert!(c.store.load().await.unwrap().records.is_empty());
    // Begin with a refused first branch leaves nothing behind.
    let n = c.list(None).unwrap().transactions.len();
    assert_eq!(c.begin_with_branch(None, "nope", "b1", None).await.unwrap_err().code, RefusalCode::UnknownResource);
    assert_eq!(c.list(None).unwrap().transactions.len(), n);
}

/// Presumed abort only for our own nodes: another node's unknown gtid is never "abort".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_gtid_of_another_node_is_not_presumed_abort() {
    let c = coord("other").await;
    let own = naming::new_gtid("u1", 1, 1);
    assert_eq!(c.wait_decision(&own, 0).await.unwrap_err().code, RefusalCode::UnknownTransaction);
    let other = naming::new_gtid("u2", 1, 1);
    // No lease row of u2 in this store: still not ours to presume (only its owner may).
    assert_eq!(c.wait_decision(&other, 0).await.unwrap_err().code, RefusalCode::OwnerUnavailable);
    // u2 holds (held) a lease in this store: its transactions are its own to answer.
    c.store.claim_node("u2", "someone", "http://127.0.0.1:1", 60_000, false).await.unwrap();
    let e = c.wait_decision(&other, 0).await.unwrap_err();
    assert_eq!((e.code, e.owner_url.as_deref()), (RefusalCode::WrongNode, Some("http://127.0.0.1:1")), "{e:?}");
    assert_eq!(c.abort(&other, "x").await.unwrap_err().code, RefusalCode::WrongNode);
}

/// Caps: undecided transactions beyond limits.max_active are refused with 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_transactions_are_capped() {
    let d = std::env::temp_dir().join(format!("cotx-coord-cap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let src = format!(
        "allow_no_auth = true\nnode_id = \"u1\"\n[limits]\nmax_active = 2\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n",
        d.join("s.db").display()
    );
    let cfg = crate::config::parse(&src, None).unwrap();
    let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 64);
    let c = Coordinator::new(cfg, store, None).unwrap();
    c.begin(None).unwrap();
    c.begin(None).unwrap();
    let e = c.begin(None).unwrap_err();
    assert_eq!(e.code, RefusalCode::TooManyTransactions);
    assert_eq!(c.begin(Some(86_400_000)).unwrap_err().code, RefusalCode::InvalidField);
}

#![cfg(test)]
use super::*;
use crate::state::Outcome;
use crate::store::{CorruptRecord, DecisionRecord};

fn rec(o: Outcome) -> Stored {
    Stored::Record(DecisionRecord {
        gtid: "g".into(),
        outcome: o,
        branches: vec![],
        decided_unix_ms: 1,
        node: "n1".into(),
        source: "x".into(),
    })
}

/// Every case of the store's word after a regained grant.
#[test]
fn memory_keeps_only_what_the_store_confirms() {
    assert_eq!(reconcile(Ok(rec(Outcome::Commit))), Reconciled::Keep(Outcome::Commit));
    assert_eq!(reconcile(Ok(rec(Outcome::Abort))), Reconciled::Keep(Outcome::Abort));
    assert_eq!(
        reconcile(Ok(Stored::Absent { forgotten: false })),
        Reconciled::Drop,
        "no record: not ours to keep (a takeover may have decided it)"
    );
    assert_eq!(reconcile(Ok(Stored::Absent { forgotten: true })), Reconciled::Drop);
    let q = CorruptRecord { gtid: "g".into(), problem: "bad".into() };
    assert_eq!(reconcile(Ok(Stored::Corrupt(q.clone()))), Reconciled::Quarantine(q));
    assert_eq!(
        reconcile(Err(StoreError::Unavailable("store down".into()))),
        Reconciled::Drop,
        "unreadable now: forgotten, the store answers later"
    );
}

/// The loss travels as a value from the renewal to the loop's reaction: our node is
/// claimed again under a new grant, memory keeps what the store confirms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_is_found_by_a_renewal_and_regained() {
    let c = crate::coordinator::tests::coord("regain").await;
    let p = c.parts();
    let before = p.owner.generation_of("u1");
    let undecided = c.begin(None).unwrap().gtid;
    let committed = c.begin(None).unwrap().gtid;
    c.register(&committed, "pg", "b1").await.unwrap();
    c.commit_with(&committed, "coordinator", &["b1".into()]).await.unwrap();
    assert!(renew_all(&p.holding()).await.lost.is_none());
    // Taken over, finished and handed back while we were away: the row is gone.
    p.store.release_node("u1", &p.owner.holder, true).await.unwrap();
    let round = renew_all(&p.holding()).await;
    let lost = round.lost.expect("the renewal finds the grant gone");
    assert!(round.answered);
    assert!(p.registry.contains(&undecided), "nothing is done until the loop reacts");
    regain(&p.holding(), lost).await;
    assert!(p.owner.generation_of("u1") > before, "a new grant");
    assert!(!p.owner.regaining() && !p.owner.lease.expired());
    assert_eq!(p.metrics.lease_losses.load(Relaxed), 1);
    assert!(!p.registry.contains(&undecided), "no record: dropped");
    let kept = p.registry.with_entry(&committed, |e| (e.grant, e.tx.state())).here();
    assert_eq!(kept, Some((p.owner.generation_of("u1"), crate::state::TxState::Committed)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_report_names_our_lease() {
    let c = crate::coordinator::tests::coord("nodes").await;
    let r = nodes_report(&c.parts().holding()).await.unwrap();
    assert_eq!((r.node_id.as_str(), r.lease_valid), ("u1", true));
    assert!(r.adopted.is_empty());
    c.parts().owner.lease.revoke();
    assert!(!nodes_report(&c.parts().holding()).await.unwrap().lease_valid);
}

#[test]
fn the_reclaim_row_is_never_a_node() {
    assert_eq!(reclaim_key("n1"), "n1!reclaim");
    assert!(reclaim_key("n1").contains('!'), "the takeover loop skips rows with '!'");
}

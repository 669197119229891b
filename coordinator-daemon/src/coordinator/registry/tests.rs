#![cfg(test)]
use super::*;

fn reg_with(gtid: &str, timeout: Duration) -> Registry {
    let r = Registry::default();
    r.insert(gtid, Entry::new(Tx::new(gtid.into(), timeout), false, 1));
    r
}

#[test]
fn the_cap_on_undecided_transactions_holds_without_a_walk_per_begin() {
    let r = Registry::default();
    let t = Duration::from_secs(60);
    let new = |g: &str| Entry::new(Tx::new(g.into(), t), false, 1);
    for i in 0..3 {
        assert_eq!(r.insert_capped(&format!("g{i}"), new(&format!("g{i}")), 3), Ok(()));
    }
    assert_eq!(r.insert_capped("g3", new("g3"), 3), Err(3));
    // Decided ones do not count, once the walk has seen them decided.
    r.with_entry("g0", |e| e.tx.abort("x".into(), false));
    assert_eq!(
        r.insert_capped("g3", new("g3"), 3),
        Ok(()),
        "counted exactly when the bound says the cap may be reached"
    );
    assert_eq!(r.insert_capped("g4", new("g4"), 3), Err(3));
    r.expire(Instant::now(), t);
    assert_eq!(r.undecided_bound.load(Relaxed), 3);
}

#[test]
fn a_lookup_says_whether_the_gtid_is_here_and_publishes() {
    let g = naming::new_gtid("n1", 1, 1);
    let r = reg_with(&g, Duration::from_secs(60));
    let rx = r.with_entry(&g, |e| e.watch.subscribe()).here().unwrap();
    assert_eq!(r.with_entry("nope", |_| 1), Lookup::NotHere);
    assert_eq!(r.with_entry(&g, |e| e.tx.abort("x".into(), false)), Lookup::Here(()));
    assert_eq!(*rx.borrow(), Some(Outcome::Abort), "the decision is published to long polls");
}

#[test]
fn timeouts_abort_active_transactions_and_retention_drops_finished_ones() {
    let g = naming::new_gtid("n1", 1, 1);
    let r = reg_with(&g, Duration::from_millis(10));
    let now = Instant::now();
    assert!(r.expire(now, Duration::from_secs(60)).is_empty(), "not yet past its deadline");
    let later = now + Duration::from_millis(20);
    assert_eq!(r.expire(later, Duration::from_secs(60)), vec![g.clone()]);
    let (state, retryable) = r.with_entry(&g, |e| (e.tx.state(), e.tx.retryable)).here().unwrap();
    assert_eq!((state, retryable), (TxState::Aborted, true));
    assert!(r.expire(later, Duration::from_secs(60)).is_empty() && r.contains(&g), "kept for the retention");
    // Being completed: kept past the retention.
    r.with_entry(&g, |e| e.completing = true);
    r.expire(later + Duration::from_secs(61), Duration::from_secs(60));
    assert!(r.contains(&g));
    r.with_entry(&g, |e| e.completing = false);
    r.expire(later + Duration::from_secs(61), Duration::from_secs(60));
    assert!(!r.contains(&g), "aborted, nothing in doubt, past the retention: dropped");
}

#[test]
fn a_committed_transaction_stays_until_its_branches_are_finished() {
    let g = naming::new_gtid("n1", 1, 2);
    let r = reg_with(&g, Duration::from_secs(60));
    r.with_entry(&g, |e| {
        e.tx.register("b1", "pg", ResourceKind::Postgres).unwrap();
        e.tx.prepared("b1").unwrap();
    });
    assert!(r.apply_decision(&g, Outcome::Commit));
    assert!(!r.apply_decision(&g, Outcome::Commit), "applied once");
    assert_eq!(r.decided_prepared_on("pg"), vec![(g.clone(), "b1".to_string())]);
    assert!(r.has_unfinished_of("n1") && !r.has_unfinished_of("n2"));
    let far = Instant::now() + Duration::from_secs(3600);
    r.expire(far, Duration::from_secs(1));
    assert!(r.contains(&g), "a prepared branch keeps it");
    assert!(r.active_set().is_empty());
    assert_eq!(r.decision_of(&g, Duration::from_secs(60)), Some((Outcome::Commit, true)), "owners' grace running");
    assert_eq!(r.decision_of(&g, Duration::ZERO), Some((Outcome::Commit, false)));
}

#[test]
fn records_are_adopted_for_nodes_we_act_for_only() {
    let mine = naming::new_gtid("n1", 1, 1);
    let theirs = naming::new_gtid("n2", 1, 1);
    let rec = |g: &str, o| DecisionRecord {
        gtid: g.into(),
        outcome: o,
        branches: vec![("pg".into(), "b1".into()), ("gone".into(), "b2".into())],
        decided_unix_ms: 5,
        node: "n1".into(),
        source: "test".into(),
    };
    let r = Registry::default();
    let generation = |n: &str| (n == "n1").then_some(4);
    let kind = |res: &str| (res == "pg").then_some(ResourceKind::Postgres);
    let (n, settled) =
        r.adopt_records(&[rec(&mine, Outcome::Commit), rec(&theirs, Outcome::Commit)], 1000, &generation, &kind);
    assert_eq!((n, settled.len()), (1, 0));
    assert!(r.contains(&mine) && !r.contains(&theirs));
    let new = |i| {
        let g = naming::new_gtid("n1", 2, i);
        (g.clone(), Entry::new(Tx::new(g, Duration::from_secs(60)), false, 4))
    };
    let (g1, e1) = new(1);
    assert_eq!(r.insert_capped(&g1, e1, 2), Ok(()), "one committed, one undecided");
    let (g2, e2) = new(2);
    assert_eq!(r.insert_capped(&g2, e2, 1), Err(1), "one undecided already");
    assert!(!r.contains(&g2));
    r.remove(&g1);
    let (grant, state, recovered) = r.with_entry(&mine, |e| (e.grant, e.tx.state(), e.tx.recovered)).here().unwrap();
    assert_eq!((grant, state, recovered), (4, TxState::Committed, true));
    // Still committing in memory: the record settles it (the caller applies it).
    let g = naming::new_gtid("n1", 1, 9);
    let mut tx = Tx::new(g.clone(), Duration::from_secs(60));
    tx.register("b1", "pg", ResourceKind::Postgres).unwrap();
    tx.begin_commit(&["b1".to_string()]).unwrap();
    assert_eq!(tx.state(), TxState::Committing);
    r.insert(&g, Entry::new(tx, false, 4));
    let (n, settled) = r.adopt_records(&[rec(&g, Outcome::Commit)], 1000, &generation, &kind);
    assert_eq!((n, settled), (0, vec![(g.clone(), Outcome::Commit)]));
}

#[test]
fn reconciling_keeps_drops_or_quarantines() {
    let r = Registry::default();
    let g: Vec<String> = (1..=4).map(|i| naming::new_gtid("n1", 1, i)).collect();
    for x in &g {
        r.insert(x, Entry::new(Tx::new(x.clone(), Duration::from_secs(60)), false, 1));
    }
    r.reconcile(&g[0], Reconciled::Keep(Outcome::Commit), 9);
    r.reconcile(&g[1], Reconciled::Keep(Outcome::Abort), 9);
    r.reconcile(&g[2], Reconciled::Drop, 9);
    r.reconcile(&g[3], Reconciled::Quarantine(CorruptRecord { gtid: g[3].clone(), problem: "bad".into() }), 9);
    assert_eq!(
        r.with_entry(&g[0], |e| (e.tx.state(), e.grant, e.recorded)).here(),
        Some((TxState::Committed, 9, true))
    );
    assert_eq!(r.with_entry(&g[1], |e| e.tx.state()).here(), Some(TxState::Aborted));
    assert!(!r.contains(&g[2]) && !r.contains(&g[3]));
    assert!(r.is_quarantined(&g[3]) && !r.is_quarantined(&g[2]));
    assert_eq!(r.gtids_of("n1").len(), 2);
    r.forget_node("n1");
    assert!(r.gtids_of("n1").is_empty());
}

#![cfg(test)]

use super::*;

fn tx() -> Tx {
    Tx::new("n1.a-1".into(), Duration::from_secs(10))
}

#[test]
fn happy_path() {
    let mut t = tx();
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    t.register("b2", "m", ResourceKind::Mariadb).unwrap();
    assert_eq!(t.check_commit().unwrap_err().code, RefusalCode::BranchNotPrepared);
    t.prepared("b1").unwrap();
    t.prepared("b2").unwrap();
    t.check_commit().unwrap();
    t.state = TxState::Committed;
    assert!(t.in_doubt());
    t.finish("b1", Outcome::Commit, FinishedBy::Owner).unwrap();
    t.finish("b1", Outcome::Commit, FinishedBy::Daemon).unwrap();
    assert_eq!(t.branches[0].finished_by, Some(FinishedBy::Owner));
    t.finish("b2", Outcome::Commit, FinishedBy::Daemon).unwrap();
    assert!(t.all_finished() && !t.in_doubt());
}

#[test]
fn refusals_change_nothing() {
    let mut t = tx();
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    let before = format!("{:?}", t.branches);
    assert_eq!(t.register("b1", "pg", ResourceKind::Postgres).unwrap_err().code, RefusalCode::DuplicateBranch);
    assert_eq!(t.prepared("zz").unwrap_err().code, RefusalCode::UnknownBranch);
    assert_eq!(t.finish("b1", Outcome::Commit, FinishedBy::Owner).unwrap_err().code, RefusalCode::NotDecided);
    assert_eq!(format!("{:?}", t.branches), before);
    assert_eq!(t.state, TxState::Active);
    t.prepared("b1").unwrap();
    assert_eq!(t.prepared("b1").unwrap_err().code, RefusalCode::AlreadyPrepared);
}

#[test]
fn commit_after_abort_and_late_prepare() {
    let mut t = tx();
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    t.abort("timeout".into(), false);
    assert_eq!(t.check_commit().unwrap_err().code, RefusalCode::TransactionAborted);
    // The late prepare of an aborted transaction is refused: the owner rolls back.
    assert_eq!(t.prepared("b1").unwrap_err().code, RefusalCode::TransactionAborted);
    assert_eq!(t.register("b2", "pg", ResourceKind::Postgres).unwrap_err().code, RefusalCode::TransactionAborted);
    assert_eq!(t.finish("b1", Outcome::Commit, FinishedBy::Owner).unwrap_err().code, RefusalCode::OutcomeMismatch);
    t.check_abort().unwrap();
}

#[test]
fn prepared_after_commit_decision_refused() {
    let mut t = tx();
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    t.prepared("b1").unwrap();
    t.state = TxState::Committed;
    assert_eq!(t.prepared("b1").unwrap_err().code, RefusalCode::TransactionCommitted);
    assert_eq!(t.check_abort().unwrap_err().code, RefusalCode::TransactionCommitted);
    assert_eq!(t.register("b2", "pg", ResourceKind::Postgres).unwrap_err().code, RefusalCode::TransactionCommitted);
}

#[test]
fn failed_prepare_aborts_retryably() {
    let mut t = tx();
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    t.register("b2", "m", ResourceKind::Mariadb).unwrap();
    t.prepared("b2").unwrap();
    t.failed("b1", "40001", true).unwrap();
    assert_eq!(t.state, TxState::Aborted);
    assert!(t.retryable);
    assert!(t.in_doubt()); // b2 still prepared: must be rolled back
}

#[test]
fn decision_in_participant() {
    let mut t = tx();
    t.register("b1", "m", ResourceKind::Mariadb).unwrap();
    t.register("d", "pg", ResourceKind::Postgres).unwrap();
    assert_eq!(t.check_decide_in("d").unwrap_err().code, RefusalCode::BranchNotPrepared);
    t.prepared("b1").unwrap();
    t.check_decide_in("d").unwrap();
    assert_eq!(t.check_decide_in("b1").unwrap_err().code, RefusalCode::WrongState);
    t.state = TxState::Deciding;
    t.decide_in = Some("d".into());
    // Undecided: never presumed abort, no client abort, other branches wait.
    assert!(t.is_undecided() && t.decision().is_none());
    assert_eq!(t.check_abort().unwrap_err().code, RefusalCode::TransactionDeciding);
    assert_eq!(t.finish("b1", Outcome::Commit, FinishedBy::Owner).unwrap_err().code, RefusalCode::NotDecided);
    assert_eq!(t.failed("b1", "x", false).unwrap_err().code, RefusalCode::TransactionDeciding);
    t.finish("d", Outcome::Commit, FinishedBy::Owner).unwrap();
    assert_eq!(t.decision(), Some(Outcome::Commit));
    assert!(t.in_doubt(), "b1 is still prepared and gets the commit");
    t.finish("b1", Outcome::Commit, FinishedBy::Owner).unwrap();
    assert!(t.all_finished());

    let mut t = tx();
    t.register("b1", "m", ResourceKind::Mariadb).unwrap();
    t.register("d", "pg", ResourceKind::Postgres).unwrap();
    t.prepared("b1").unwrap();
    t.state = TxState::Deciding;
    t.decide_in = Some("d".into());
    t.failed("d", "40001 rule A", true).unwrap();
    assert_eq!(t.decision(), Some(Outcome::Abort));
    assert!(t.retryable);

    // Found aborted in the participant (co.resolve: the owner's session was lost before its
    // COMMIT took effect): nothing committed anywhere, so safe to run again.
    let mut t = tx();
    t.register("b1", "m", ResourceKind::Mariadb).unwrap();
    t.register("d", "pg", ResourceKind::Postgres).unwrap();
    t.prepared("b1").unwrap();
    t.state = TxState::Deciding;
    t.decide_in = Some("d".into());
    t.decided_in_participant(Outcome::Abort, FinishedBy::Recovery);
    assert_eq!(t.decision(), Some(Outcome::Abort));
    assert!(t.retryable, "an abort found in the participant is retryable");
}

#[test]
fn one_phase() {
    let mut t = tx();
    assert_eq!(t.check_one_phase("b1").unwrap_err().code, RefusalCode::UnknownBranch);
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    t.check_one_phase("b1").unwrap();
    t.register("b2", "pg", ResourceKind::Postgres).unwrap();
    assert_eq!(t.check_one_phase("b1").unwrap_err().code, RefusalCode::NotSingleBranch);
    let mut t = tx();
    t.register("b1", "pg", ResourceKind::Postgres).unwrap();
    t.state = TxState::OnePhase;
    t.finish("b1", Outcome::Commit, FinishedBy::Owner).unwrap();
    assert_eq!(t.state, TxState::Committed);
}

//! The state machine of one global transaction and its branches. Plain data and checks,
//! no I/O: every API call first validates here and changes nothing when refused.
//! (crate::state re-exports it.)

use crate::config::ResourceKind;
use serde::Serialize;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A transaction's outcome: the protocol crate's (shared with the model checker).
pub use cotx_protocol::Outcome;

/// Also the `state` of the API's bodies (crate::wire: Transaction, Begun, DecisionState).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TxState {
    /// Accepting branches; no decision.
    Active,
    /// Commit decided in memory, the durable record is being written. Still "active"
    /// for recovery: its branches must not be rolled back.
    Committing,
    Committed,
    Aborted,
    /// Single branch committing in one phase on its own session: nothing is prepared.
    OnePhase,
    /// Every other branch prepared; the decision branch (`Tx::decide_in`) commits in one
    /// phase with the global decision written inside it (pg_co's `co.decide`). No store
    /// record: the decision is that commit. Undecided until its owner reports or the
    /// daemon reads the outcome there (`co.resolve`).
    Deciding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchState {
    Registered,
    Prepared,
    /// Its prepare was refused or failed; the owner rolled it back.
    Failed,
    Finished,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishedBy {
    Owner,
    Daemon,
    Recovery,
}

#[derive(Debug, Clone, Serialize)]
pub struct Branch {
    pub branch_id: String,
    pub resource: String,
    pub kind: ResourceKind,
    pub state: BranchState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_by: Option<FinishedBy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub attempts: u32,
    /// The branch's database session as its client reported it (PostgreSQL backend pid,
    /// MariaDB connection id): how the deadlock detector maps a lock wait to this
    /// transaction, and whose waiting statement an abort cancels. Not in the API's bodies.
    #[serde(skip)]
    pub session: Option<i64>,
    /// When its owner reported it prepared (or the daemon loaded it so). A read-only
    /// MariaDB branch is lost in any restart after its PREPARE, before the decision too:
    /// completion compares the server's uptime with this (participants/branch_sql.rs
    /// `maria_gone`).
    #[serde(skip)]
    pub prepared_at: Option<Instant>,
}

#[derive(Debug, Clone)]
pub struct Tx {
    pub gtid: String,
    /// Changed only by the transitions below (one owner of the state machine); read with
    /// `state()`.
    state: TxState,
    pub branches: Vec<Branch>,
    pub created: Instant,
    pub created_unix_ms: u64,
    pub deadline: Instant,
    pub decided: Option<Instant>,
    pub abort_reason: Option<String>,
    /// The abort came from a refused prepare (serialization failure): worth retrying.
    pub retryable: bool,
    /// Loaded from the store at start: branch states are unknown until recovery looks.
    pub recovered: bool,
    /// The branch whose commit carries the global decision (decision in the participant).
    pub decide_in: Option<String>,
    /// Aborted to break a deadlock across databases: refusals say `deadlock_victim`.
    pub deadlock_victim: bool,
}

use crate::refusal::{refuse, Refusal, RefusalCode};

pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Tx {
    pub fn new(gtid: String, timeout: Duration) -> Tx {
        let now = Instant::now();
        Tx {
            gtid,
            state: TxState::Active,
            branches: Vec::new(),
            created: now,
            created_unix_ms: unix_ms(),
            deadline: now + timeout,
            decided: None,
            abort_reason: None,
            retryable: false,
            recovered: false,
            decide_in: None,
            deadlock_victim: false,
        }
    }

    pub fn state(&self) -> TxState {
        self.state
    }

    /// Two-phase commit begins: `prepared` are marked prepared and the commit checked, all
    /// or nothing (a refusal leaves the transaction as it was), then `Committing` until
    /// the decision is durable.
    pub fn begin_commit(&mut self, prepared: &[String]) -> Result<(), Refusal> {
        let mut next = self.clone();
        for bid in prepared {
            next.prepared(bid)?;
        }
        next.check_commit()?;
        next.state = TxState::Committing;
        *self = next;
        Ok(())
    }

    /// Commit with the decision inside branch `bid` (`Deciding` until its outcome is
    /// known): `prepared` marked prepared, the shape checked, and `allowed` asked whether
    /// the branch's resource may decide; all or nothing.
    pub fn begin_decide_in(
        &mut self,
        prepared: &[String],
        bid: &str,
        allowed: impl FnOnce(&Branch) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        let mut next = self.clone();
        for p in prepared {
            next.prepared(p)?;
        }
        next.check_decide_in(bid)?;
        allowed(next.branches.iter().find(|b| b.branch_id == bid).expect("checked"))?;
        next.state = TxState::Deciding;
        next.decide_in = Some(bid.to_string());
        *self = next;
        Ok(())
    }

    /// One-phase commit of its single branch begins (`OnePhase` until its owner reports).
    pub fn begin_one_phase(&mut self, bid: &str) -> Result<(), Refusal> {
        self.check_one_phase(bid)?;
        self.state = TxState::OnePhase;
        Ok(())
    }

    /// A decision the store (or a participant) holds, applied: committed (decided at its
    /// first application), or aborted for `abort_reason`.
    pub fn settle(&mut self, o: Outcome, abort_reason: impl FnOnce() -> String) {
        match o {
            Outcome::Commit => {
                self.state = TxState::Committed;
                self.decided.get_or_insert_with(Instant::now);
            }
            Outcome::Abort => self.abort(abort_reason(), false),
        }
    }

    /// A transaction found committed inside a participant by recovery (no record of it
    /// here): committed, its decision branch unnamed.
    pub fn committed_in_participant(&mut self) {
        self.settle(Outcome::Commit, String::new);
        self.decide_in = Some(String::new());
    }

    /// How long ago branch `bid` was prepared, else the decision was taken, in ms (0:
    /// unknown): how long a MariaDB restart may have been losing a read-only branch.
    pub fn prepared_ms_ago(&self, bid: &str) -> u64 {
        let prepared = self.branches.iter().find(|b| b.branch_id == bid).and_then(|b| b.prepared_at);
        prepared.or(self.decided).map(|t| t.elapsed().as_millis() as u64).unwrap_or(0)
    }

    pub fn decision(&self) -> Option<Outcome> {
        match self.state {
            TxState::Committed => Some(Outcome::Commit),
            TxState::Aborted => Some(Outcome::Abort),
            _ => None,
        }
    }

    pub fn is_undecided(&self) -> bool {
        matches!(self.state, TxState::Active | TxState::Committing | TxState::OnePhase | TxState::Deciding)
    }

    /// Prepared somewhere and not finished: the engines hold locks for us.
    pub fn in_doubt(&self) -> bool {
        self.branches.iter().any(|b| b.state == BranchState::Prepared)
    }

    pub fn all_finished(&self) -> bool {
        self.branches.iter().all(|b| matches!(b.state, BranchState::Finished | BranchState::Failed))
    }

    fn branch_idx(&self, bid: &str) -> Result<usize, Refusal> {
        match self.branches.iter().position(|b| b.branch_id == bid) {
            Some(i) => Ok(i),
            None => refuse(RefusalCode::UnknownBranch, format!("transaction {} has no branch {bid:?}", self.gtid)),
        }
    }

    fn decided_refusal<T>(&self, what: &str) -> Result<T, Refusal> {
        match self.state {
            TxState::Aborted => refuse(
                if self.deadlock_victim { RefusalCode::DeadlockVictim } else { RefusalCode::TransactionAborted },
                format!(
                    "{what}: transaction {} was aborted ({})",
                    self.gtid,
                    self.abort_reason.as_deref().unwrap_or("no reason")
                ),
            ),
            TxState::Committed | TxState::Committing => refuse(
                RefusalCode::TransactionCommitted,
                format!("{what}: transaction {} is already decided commit", self.gtid),
            ),
            TxState::OnePhase => refuse(
                RefusalCode::TransactionOnePhase,
                format!("{what}: transaction {} is committing in one phase", self.gtid),
            ),
            TxState::Deciding => refuse(
                RefusalCode::TransactionDeciding,
                format!("{what}: transaction {} is being decided in its decision branch", self.gtid),
            ),
            TxState::Active => refuse(RefusalCode::WrongState, format!("{what}: transaction {} is active", self.gtid)),
        }
    }

    /// Would `register` take this branch? (Asked before client mode prepares a helper.)
    pub fn check_register(&self, bid: &str) -> Result<(), Refusal> {
        if self.state != TxState::Active {
            return self.decided_refusal("register branch");
        }
        if self.branches.iter().any(|b| b.branch_id == bid) {
            return refuse(
                RefusalCode::DuplicateBranch,
                format!("branch {bid:?} is already registered in {}", self.gtid),
            );
        }
        Ok(())
    }

    pub fn register(&mut self, bid: &str, resource: &str, kind: ResourceKind) -> Result<(), Refusal> {
        self.check_register(bid)?;
        self.branches.push(Branch {
            branch_id: bid.to_string(),
            resource: resource.to_string(),
            kind,
            state: BranchState::Registered,
            outcome: None,
            finished_by: None,
            note: None,
            attempts: 0,
            session: None,
            prepared_at: None,
        });
        Ok(())
    }

    pub fn prepared(&mut self, bid: &str) -> Result<(), Refusal> {
        let i = self.branch_idx(bid)?;
        if self.state != TxState::Active {
            // Includes the late prepare of an aborted transaction: the owner must roll
            // its branch back (the client does so on any refusal here).
            return self.decided_refusal("branch prepared");
        }
        match self.branches[i].state {
            BranchState::Registered => {
                self.branches[i].state = BranchState::Prepared;
                self.branches[i].prepared_at = Some(Instant::now());
                Ok(())
            }
            BranchState::Prepared => {
                refuse(RefusalCode::AlreadyPrepared, format!("branch {bid:?} is already prepared"))
            }
            s => refuse(RefusalCode::WrongState, format!("branch {bid:?} is {s:?}, cannot become prepared")),
        }
    }

    /// The branch's prepare failed (refused by the engine's CO check, or any error); the
    /// owner rolled it back. The transaction aborts.
    pub fn failed(&mut self, bid: &str, reason: &str, retryable: bool) -> Result<(), Refusal> {
        let i = self.branch_idx(bid)?;
        match self.state {
            TxState::Active | TxState::Aborted => {}
            // The decision branch's commit was refused or rolled back: abort.
            TxState::Deciding if self.decide_in.as_deref() == Some(bid) => {
                self.branches[i].state = BranchState::Finished;
                self.branches[i].outcome = Some(Outcome::Abort);
                self.branches[i].finished_by = Some(FinishedBy::Owner);
                self.branches[i].note = Some(reason.to_string());
                self.abort(format!("decision branch {bid} failed: {reason}"), retryable);
                return Ok(());
            }
            _ => return self.decided_refusal("branch failed"),
        }
        match self.branches[i].state {
            BranchState::Registered | BranchState::Prepared => {}
            s => return refuse(RefusalCode::WrongState, format!("branch {bid:?} is {s:?}")),
        }
        self.branches[i].state = BranchState::Failed;
        self.branches[i].note = Some(reason.to_string());
        if self.state == TxState::Active {
            self.abort(format!("branch {bid} failed: {reason}"), retryable);
        }
        Ok(())
    }

    /// Checks for a two-phase commit: at least one branch, every branch prepared.
    pub fn check_commit(&self) -> Result<(), Refusal> {
        if self.state != TxState::Active {
            return self.decided_refusal("commit");
        }
        if self.branches.is_empty() {
            return refuse(RefusalCode::NoBranches, format!("transaction {} has no branches", self.gtid));
        }
        if let Some(b) = self.branches.iter().find(|b| b.state != BranchState::Prepared) {
            return refuse(
                RefusalCode::BranchNotPrepared,
                format!("branch {:?} is {:?}, not prepared", b.branch_id, b.state),
            );
        }
        Ok(())
    }

    /// One-phase commit of a transaction with exactly one branch, not prepared.
    pub fn check_one_phase(&self, bid: &str) -> Result<(), Refusal> {
        if self.state != TxState::Active {
            return self.decided_refusal("one-phase commit");
        }
        let i = self.branch_idx(bid)?;
        if self.branches.len() != 1 {
            return refuse(
                RefusalCode::NotSingleBranch,
                format!("transaction {} has {} branches; one phase needs exactly one", self.gtid, self.branches.len()),
            );
        }
        if self.branches[i].state != BranchState::Registered {
            return refuse(
                RefusalCode::WrongState,
                format!("branch {bid:?} is {:?}; one phase needs an unprepared branch", self.branches[i].state),
            );
        }
        Ok(())
    }

    /// Commit with the decision inside branch `bid`'s one-phase commit: every other branch
    /// prepared, `bid` registered and not prepared.
    pub fn check_decide_in(&self, bid: &str) -> Result<(), Refusal> {
        if self.state != TxState::Active {
            return self.decided_refusal("commit");
        }
        let i = self.branch_idx(bid)?;
        if self.branches[i].state != BranchState::Registered {
            return refuse(
                RefusalCode::WrongState,
                format!("branch {bid:?} is {:?}; the decision branch must not be prepared", self.branches[i].state),
            );
        }
        if let Some(b) = self.branches.iter().find(|b| b.branch_id != bid && b.state != BranchState::Prepared) {
            return refuse(
                RefusalCode::BranchNotPrepared,
                format!("branch {:?} is {:?}, not prepared", b.branch_id, b.state),
            );
        }
        Ok(())
    }

    /// The outcome of the decision branch is known (its owner's report, or co.resolve).
    pub fn decided_in_participant(&mut self, o: Outcome, by: FinishedBy) {
        if self.state != TxState::Deciding {
            return;
        }
        if let Some(i) = self.decide_in.as_deref().and_then(|b| self.branches.iter().position(|x| x.branch_id == b)) {
            let b = &mut self.branches[i];
            b.state = BranchState::Finished;
            b.outcome = Some(o);
            b.finished_by = Some(by);
        }
        match o {
            Outcome::Commit => {
                self.state = TxState::Committed;
                self.decided = Some(Instant::now());
            }
            // Nothing committed anywhere, and its owner lost its session (or died) before
            // its COMMIT took effect: running the transaction again is safe and may work, so
            // the clients' retry rules run it again ("retryable").
            Outcome::Abort => self.abort("the decision branch did not commit".into(), true),
        }
    }

    pub fn abort(&mut self, reason: String, retryable: bool) {
        self.state = TxState::Aborted;
        self.decided = Some(Instant::now());
        self.abort_reason = Some(reason);
        self.retryable = retryable;
    }

    /// Aborts an active transaction to break a deadlock across databases (retryable).
    /// False when it is no longer active: it was decided meanwhile and is left alone.
    pub fn abort_as_deadlock_victim(&mut self, reason: String) -> bool {
        if self.state != TxState::Active {
            return false;
        }
        self.abort(reason, true);
        self.deadlock_victim = true;
        true
    }

    /// Records the database session a branch runs on (see `Branch::session`).
    pub fn set_session(&mut self, bid: &str, session: i64) -> Result<(), Refusal> {
        let i = self.branch_idx(bid)?;
        self.branches[i].session = Some(session);
        Ok(())
    }

    /// The sessions of branches not yet prepared, by resource: where a statement of this
    /// transaction may be waiting for a lock.
    pub fn active_sessions(&self) -> Vec<(String, i64)> {
        self.branches
            .iter()
            .filter(|b| b.state == BranchState::Registered)
            .filter_map(|b| b.session.map(|s| (b.resource.clone(), s)))
            .collect()
    }

    pub fn check_abort(&self) -> Result<(), Refusal> {
        match self.state {
            TxState::Active | TxState::Aborted => Ok(()),
            _ => self.decided_refusal("abort"),
        }
    }

    /// The owner (or the daemon) finished a branch with `outcome`.
    pub fn finish(&mut self, bid: &str, outcome: Outcome, by: FinishedBy) -> Result<(), Refusal> {
        let i = self.branch_idx(bid)?;
        if self.state == TxState::Deciding && self.decide_in.as_deref() == Some(bid) {
            self.decided_in_participant(outcome, by);
            return Ok(());
        }
        match (self.state, outcome) {
            (TxState::Committed, Outcome::Commit) | (TxState::Aborted, Outcome::Abort) | (TxState::OnePhase, _) => {}
            (TxState::Active | TxState::Committing | TxState::Deciding, _) => {
                return refuse(RefusalCode::NotDecided, format!("transaction {} is not decided yet", self.gtid))
            }
            _ => {
                return refuse(
                    RefusalCode::OutcomeMismatch,
                    format!(
                        "branch finished with {} but the decision is {}",
                        outcome.as_str(),
                        self.decision().map(|o| o.as_str()).unwrap_or("none")
                    ),
                )
            }
        }
        let b = &mut self.branches[i];
        if b.state == BranchState::Finished {
            // Idempotent: an owner's ack after the daemon completed the branch is fine.
            return Ok(());
        }
        b.state = BranchState::Finished;
        b.outcome = Some(outcome);
        b.finished_by = Some(by);
        if self.state == TxState::OnePhase {
            match outcome {
                Outcome::Commit => {
                    self.state = TxState::Committed;
                    self.decided = Some(Instant::now());
                }
                Outcome::Abort => self.abort("one-phase branch rolled back".into(), false),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

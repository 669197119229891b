//! The one-request commit: a client draws its gtids from a range the daemon leased to it,
//! prepares its branches under a gtid the daemon has never heard of, and sends them with
//! its commit request — the only request of the transaction.
//!
//! What changes for the rest of the protocol: the daemon's memory is no longer complete for
//! the gtids of its own epoch. Before, a gtid of the current epoch not in memory had never
//! been begun here, or was decided and forgotten: presumed abort was its truth, so recovery
//! rolled its branches back with nothing written, and the daemon answered "abort". A leased
//! gtid can have prepared branches and a commit request on its way: rolled back with no
//! record, the late commit would find nothing in the store and record commit over a branch
//! already rolled back (a split); answered "abort", the same late commit contradicts it.
//!
//! The rule, in three places the daemon calls:
//! - recovery ([`recovery`]): a leased gtid is treated as another epoch's: while its range's
//!   lease runs, its branches are left alone (the client may still commit); once the lease
//!   has lapsed, an abort is recorded before anything is rolled back
//!   (`recovery::Action::RecordAbort`, a conditional insert: a commit recorded first wins);
//! - the commit request ([`commit`]): accepted only from the epoch that leased the range,
//!   and recorded with the same conditional insert as every commit — the outcome in force
//!   is what the client hears, so a commit arriving after recovery's abort record is told
//!   "abort" and never splits;
//! - answers ([`presumes_abort`]): no record for a leased gtid means nothing yet, never
//!   "abort" (its commit may still arrive): only a record answers.
//!
//! A daemon restarted (a new epoch), or another daemon that took the node over, does not
//! know the ranges of the old epoch; both treat its gtids as another epoch's (abort
//! recorded before any rollback), and neither accepts their commit request: only the
//! leasing process could still record a commit, and its writes are fenced by its node
//! grant. The model (coordinator-daemon/model, mode "leased") checks the rule, and two
//! broken variants of it.

use crate::recovery::{self, Action};

/// Where a gtid stands with respect to the ranges the current process leased.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Range {
    /// Not a gtid of a range this process leased (begun here, or of another epoch).
    NotLeased,
    /// In a range whose lease still runs: the client may still send its commit.
    Live,
    /// In a range whose lease ran out.
    Lapsed,
}

/// What recovery does with a prepared branch: [`recovery::decide`], with a leased gtid
/// never counted as one whose memory is complete. `current_epoch`: the gtid is of this
/// process's epoch and node grant.
pub fn recovery(
    decision: Option<(crate::outcome::Outcome, bool)>,
    active: bool,
    recorded_commit: bool,
    current_epoch: bool,
    range: Range,
) -> Action {
    if range == Range::Live && decision.is_none() && !recorded_commit {
        return Action::Leave;
    }
    recovery::decide(decision, active, recorded_commit, current_epoch && range == Range::NotLeased)
}

/// What the daemon does with a commit request carrying its branches for a gtid not in
/// its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Commit {
    /// Record commit with the conditional insert (the outcome in force is the answer),
    /// then complete the branches with it.
    Record,
    /// Not a gtid this process leased: nothing is written; the answer is what the store
    /// (or presumed abort, for a gtid it may presume) says.
    Answer,
}

pub fn commit(range: Range) -> Commit {
    match range {
        // A lapsed lease is no reason to refuse: recovery's abort, if it came first, is
        // in the store and the conditional insert returns it.
        Range::Live | Range::Lapsed => Commit::Record,
        Range::NotLeased => Commit::Answer,
    }
}

/// Whether "no record" may be answered "abort" for a gtid of a node we act for: never
/// for a gtid of a range we leased (a commit may still come).
pub fn presumes_abort(node_ours: bool, range: Range) -> bool {
    node_ours && range == Range::NotLeased
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Outcome;

    #[test]
    fn a_leased_gtid_is_left_while_its_lease_runs_then_its_abort_is_recorded_first() {
        assert_eq!(recovery(None, false, false, true, Range::Live), Action::Leave);
        assert_eq!(recovery(None, false, false, true, Range::Lapsed), Action::RecordAbort);
        assert_eq!(recovery(None, false, false, true, Range::NotLeased), Action::Rollback, "begun here: as before");
        assert_eq!(recovery(None, false, false, false, Range::NotLeased), Action::RecordAbort);
        // A commit that landed wins, lease or not.
        assert_eq!(recovery(None, false, true, true, Range::Live), Action::Commit);
        assert_eq!(recovery(Some((Outcome::Commit, false)), false, true, true, Range::Lapsed), Action::Commit);
        // Delivered and undecided: active, left alone.
        assert_eq!(recovery(None, true, false, true, Range::Lapsed), Action::Leave);
    }

    #[test]
    fn only_the_leasing_process_records_a_commit_and_never_presumes_its_gtids_aborted() {
        assert_eq!(commit(Range::Live), Commit::Record);
        assert_eq!(commit(Range::Lapsed), Commit::Record);
        assert_eq!(commit(Range::NotLeased), Commit::Answer);
        assert!(presumes_abort(true, Range::NotLeased));
        assert!(!presumes_abort(true, Range::Live));
        assert!(!presumes_abort(true, Range::Lapsed));
        assert!(!presumes_abort(false, Range::NotLeased));
    }
}

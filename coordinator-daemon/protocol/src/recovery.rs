//! What recovery does with one prepared branch it found (the daemon's recovery pass reads
//! the resources, the active set and the store in Citus' order, then asks this).

use crate::outcome::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Commit,
    Rollback,
    /// Undecided (active) or within its owner's grace period: leave it.
    Leave,
    /// Another epoch, no record: record abort first (a conditional insert: a paused
    /// previous owner's commit, if it landed first, wins), then act on what the store says.
    RecordAbort,
}

/// `decision`: in memory (with "owner grace running"); `active`: undecided in memory;
/// `recorded_commit`: the store holds a commit; `ours`: the gtid is of our current epoch
/// and grant (our memory is complete for it).
pub fn decide(decision: Option<(Outcome, bool)>, active: bool, recorded_commit: bool, ours: bool) -> Action {
    match decision {
        Some((_, true)) => Action::Leave,
        Some((Outcome::Commit, false)) => Action::Commit,
        Some((Outcome::Abort, false)) if recorded_commit => Action::Commit,
        Some((Outcome::Abort, false)) => Action::Rollback,
        None if recorded_commit => Action::Commit,
        None if active => Action::Leave,
        None if ours => Action::Rollback,
        None => Action::RecordAbort,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_decisions() {
        // Unknown, not active, our epoch: presumed abort.
        assert_eq!(decide(None, false, false, true), Action::Rollback);
        // Unknown, another epoch: an abort is recorded first (its old owner may wake up).
        assert_eq!(decide(None, false, false, false), Action::RecordAbort);
        // Undecided and live: leave it.
        assert_eq!(decide(None, true, false, true), Action::Leave);
        // Recorded commit (e.g. after a restart): commit.
        assert_eq!(decide(None, false, true, false), Action::Commit);
        assert_eq!(decide(Some((Outcome::Commit, false)), false, true, true), Action::Commit);
        // Owner still in its grace period: leave it to the owner.
        assert_eq!(decide(Some((Outcome::Commit, true)), false, true, true), Action::Leave);
        assert_eq!(decide(Some((Outcome::Abort, false)), false, false, true), Action::Rollback);
    }
}

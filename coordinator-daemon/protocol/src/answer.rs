//! What a daemon may say about a gtid. Two sources: its memory (transactions it runs or
//! recovered) and the store (decision records, kept for a retention after their branches
//! finished, and per epoch a watermark of the records purged since).
//!
//! The rules, each closing a way the same gtid got two answers in a hostile run
//! (regress/pytest/coordinator/test_coordinator_stale.py):
//! - a quarantined gtid (its record exists but cannot be read) is answered "quarantined"
//!   by every daemon, even one that holds a decision in memory: the store is the truth
//!   the other daemons read, and an operator decides (defect 3);
//! - memory is only consulted while the daemon's node grant is the one it was filled
//!   under (a lost grant drops it: [`after_regrant`]) (defect 1);
//! - "no record" means abort (presumed abort) only while the record could still be there:
//!   a gtid at or below its epoch's purge watermark is "forgotten", never "aborted"
//!   (defect 4).

use crate::outcome::Outcome;

/// What the store holds for a gtid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stored {
    Record(Outcome),
    /// A row that cannot be read.
    Corrupt,
    /// No row. `forgotten`: the gtid is at or below its epoch's purge watermark.
    Absent {
        forgotten: bool,
    },
}

/// The daemon's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    Decided(Outcome),
    /// In memory, undecided: ask again (long poll).
    Pending,
    /// Its record cannot be read: an operator decides.
    Quarantined,
    /// Its record was purged after the retention: the outcome is no longer known.
    Forgotten,
    /// No record, never will be: abort.
    PresumedAbort,
    /// Another node's transaction, not decided in the store: its owner answers.
    AskOwner,
}

/// `memory`: `Some(decision)` when the gtid is in memory (`None` inside: undecided).
/// `stored`: read when it is not in memory (or when the memory cannot decide). `ours`: the
/// gtid's node is one this daemon acts for (its own, or taken over).
pub fn answer(quarantined: bool, memory: Option<Option<Outcome>>, stored: Option<Stored>, ours: bool) -> Answer {
    if quarantined {
        return Answer::Quarantined;
    }
    match (memory, stored) {
        (Some(Some(o)), _) => Answer::Decided(o),
        (Some(None), Some(Stored::Record(o))) => Answer::Decided(o),
        (Some(None), _) => Answer::Pending,
        (None, Some(Stored::Record(o))) => Answer::Decided(o),
        (None, Some(Stored::Corrupt)) => Answer::Quarantined,
        (None, Some(Stored::Absent { forgotten: true })) => Answer::Forgotten,
        (None, _) if ours => Answer::PresumedAbort,
        (None, _) => Answer::AskOwner,
    }
}

/// Whether a gtid's record, if it ever existed, may have been purged: `seq` is the gtid's
/// sequence number in its epoch, `watermark` the highest purged one of that epoch.
pub fn forgotten(seq: u64, watermark: Option<u64>) -> bool {
    watermark.is_some_and(|w| seq <= w)
}

/// Whether a missing record may have existed: purged (at or below the watermark), or of an
/// epoch sealed when the store was restored from an older copy (a commit recorded after
/// the copy was taken is missing from it). Either way "forgotten", never "aborted".
pub fn unknown_if_absent(seq: u64, watermark: Option<u64>, sealed: bool) -> bool {
    sealed || forgotten(seq, watermark)
}

/// What a daemon that lost its node grant and got a new one does with a transaction it
/// held in memory from before: it trusts only the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconcile {
    /// Recorded: keep it with that outcome (branches unknown until recovery looks).
    Keep(Outcome),
    /// Not recorded: another daemon may have rolled its branches back meanwhile, and
    /// nothing can commit it any more (a stale commit is fenced): forget it; recovery
    /// presumes abort for whatever of it is still prepared.
    Drop,
    Quarantine,
}

pub fn after_regrant(stored: Stored) -> Reconcile {
    match stored {
        Stored::Record(o) => Reconcile::Keep(o),
        Stored::Corrupt => Reconcile::Quarantine,
        Stored::Absent { .. } => Reconcile::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Outcome::*;

    #[test]
    fn quarantine_wins_over_memory() {
        assert_eq!(answer(true, Some(Some(Commit)), None, true), Answer::Quarantined);
        assert_eq!(answer(false, None, Some(Stored::Corrupt), false), Answer::Quarantined);
    }

    #[test]
    fn forgotten_is_never_abort() {
        assert_eq!(answer(false, None, Some(Stored::Absent { forgotten: true }), true), Answer::Forgotten);
        assert_eq!(answer(false, None, Some(Stored::Absent { forgotten: false }), true), Answer::PresumedAbort);
        assert_eq!(answer(false, None, Some(Stored::Absent { forgotten: false }), false), Answer::AskOwner);
        assert_eq!(answer(false, None, Some(Stored::Record(Commit)), false), Answer::Decided(Commit));
        assert!(forgotten(5, Some(5)) && !forgotten(6, Some(5)) && !forgotten(1, None));
    }

    #[test]
    fn a_sealed_epoch_forgets_every_missing_record() {
        assert!(unknown_if_absent(1, None, true) && unknown_if_absent(u64::MAX, Some(3), true));
        assert!(!unknown_if_absent(4, Some(3), false) && unknown_if_absent(3, Some(3), false));
    }

    #[test]
    fn memory_and_store() {
        assert_eq!(answer(false, Some(None), None, true), Answer::Pending);
        // A commit whose write landed while memory still says committing.
        assert_eq!(answer(false, Some(None), Some(Stored::Record(Commit)), true), Answer::Decided(Commit));
        assert_eq!(answer(false, Some(Some(Abort)), None, true), Answer::Decided(Abort));
    }

    #[test]
    fn regrant_trusts_only_the_store() {
        assert_eq!(after_regrant(Stored::Record(Abort)), Reconcile::Keep(Abort));
        assert_eq!(after_regrant(Stored::Absent { forgotten: false }), Reconcile::Drop);
        assert_eq!(after_regrant(Stored::Corrupt), Reconcile::Quarantine);
    }
}

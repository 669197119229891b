//! A global transaction whose every branch wrote nothing: its commit decision
//! is taken in the daemon's memory, with no synced store write.
//!
//! Why presumed abort loses nothing then: a read-only branch has nothing to redo, so a
//! branch rolled back after a crash instead of committed changes no data. What remains
//! to protect is the serializability of what the transaction read, which commitment
//! ordering gives. Let p be the moment the last branch of T prepared and e the moment the
//! first branch of T ended (commit or rollback). If p < e, T's reads are serializable at
//! p whatever each branch's ending: its in-edges are wr edges from transactions committed
//! before T read (before p); its out-edges T -rw-> Tj at a database D either met Tj
//! already prepared or committed at D when T prepared there (rule A refused T's PREPARE),
//! or made Tj wait at its own PREPARE or local COMMIT at D until T's branch there ended
//! (rule B; on MariaDB T's S locks held to XA COMMIT/ROLLBACK): Tj's commit point is after
//! e > p. In client mode the helper and the slot give the same two orders.
//!
//! So the in-memory commit is sound as long as no branch of T can have ended before its
//! last PREPARE. Within one daemon process a branch of an undecided transaction it holds
//! is never rolled back; the one danger is a daemon that took T's node over (the owner
//! paused past its lease) and rolled back a prepared branch while the client still
//! prepared another. The takeover writes its abort record before it rolls anything back
//! (`recovery::Action::RecordAbort`), so the owner reads the store (a read, no sync) after
//! every branch is prepared and before it answers: no record means no branch has ended
//! yet, and any that ends later ends after p. A record wins (`in_memory_commit`).
//!
//! What is given up: the commit answered is not durable. After the daemon forgets T (a
//! restart, or every branch finished), T reads as aborted (presumed abort), and a branch
//! still prepared after a crash is rolled back. For a read-only transaction the two
//! outcomes are the same data. The model (coordinator-daemon/model) checks the path with
//! the properties restated over branches that wrote, and "no branch ended before the last
//! PREPARE" for the commit answered from memory.

use crate::answer::Stored;
use crate::outcome::Outcome;

/// How a commit is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommitPath {
    /// The decision record is written and synced before the answer (2PC, presumed abort).
    Durable,
    /// Every branch is read-only: decided in memory, nothing written.
    InMemory,
}

/// `read_only`: for each branch of the transaction, whether its owner said it wrote
/// nothing. In memory only when there is at least one branch and every one is read-only:
/// a single writing branch has something to redo, and its commit must be durable.
pub fn commit_path(read_only: impl IntoIterator<Item = bool>) -> CommitPath {
    let mut any = false;
    for ro in read_only {
        if !ro {
            return CommitPath::Durable;
        }
        any = true;
    }
    if any {
        CommitPath::InMemory
    } else {
        CommitPath::Durable
    }
}

/// The in-memory commit's verdict from the store's word on the gtid, read after every
/// branch was prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// No record: nobody decided it; commit in memory.
    Commit,
    /// A record exists (a takeover's abort, written before it rolled anything back): it
    /// is the outcome.
    Decided(Outcome),
    /// At or below its epoch's purge watermark, or unreadable: nothing is decided here.
    Refuse,
}

pub fn in_memory_commit(stored: Stored) -> Verdict {
    match stored {
        Stored::Absent { forgotten: false } => Verdict::Commit,
        Stored::Record(o) => Verdict::Decided(o),
        Stored::Absent { forgotten: true } | Stored::Corrupt => Verdict::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_all_read_only_transaction_skips_the_sync() {
        assert_eq!(commit_path([true, true]), CommitPath::InMemory);
        assert_eq!(commit_path([true]), CommitPath::InMemory);
        assert_eq!(commit_path([true, false]), CommitPath::Durable, "one writer: durable");
        assert_eq!(commit_path([false]), CommitPath::Durable);
        assert_eq!(commit_path([]), CommitPath::Durable, "no branch said anything: as before");
    }

    #[test]
    fn a_record_or_an_unknown_past_wins_over_the_memory_commit() {
        assert_eq!(in_memory_commit(Stored::Absent { forgotten: false }), Verdict::Commit);
        assert_eq!(in_memory_commit(Stored::Record(Outcome::Abort)), Verdict::Decided(Outcome::Abort));
        assert_eq!(in_memory_commit(Stored::Absent { forgotten: true }), Verdict::Refuse);
        assert_eq!(in_memory_commit(Stored::Corrupt), Verdict::Refuse);
    }
}

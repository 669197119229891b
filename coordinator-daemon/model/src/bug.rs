//! The deliberately broken variants of the protocol (each must give a counterexample).

/// A deliberately broken variant of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    None,
    /// The takeover writes its abort record unconditionally (overwrites a commit).
    TakeoverWithoutConditionalInsert,
    /// The owner's decision writes skip the store's fencing check.
    ZombieSkipsLeaseCheck,
    /// Recovery acts on every prepared branch with our gid prefix (not only our epochs').
    RecoveryTrustsGidPrefix,
    /// Decision in a participant: the daemon tells the client "commit" when it hands the
    /// decision to the participant, before the deciding commit.
    DipReportsBeforeDecidingCommit,
    /// A daemon whose grant was lost claims its node again and keeps its memory, and
    /// finished records are deleted with no watermark (the coordinator before grants and
    /// retention: the stale-daemon defect needs both — each alone is caught by the other defence).
    AnswersFromMemoryAfterRegrant,
    /// Finished records are purged with no watermark: a purged gtid reads as never
    /// recorded (defect 4), and a late write for it lands unopposed.
    PurgeWithoutWatermark,
    /// All-read-only commit taken for a transaction with one writing branch:
    /// the sync skipped when any branch, not every branch, is read-only.
    InMemoryWithAWriter,
    /// All-read-only commit decided in memory without reading the store first: a
    /// takeover's abort (and its rollback of a branch before the last PREPARE) unseen.
    ReadOnlySkipsStoreCheck,
    /// One-request commit: recovery treats a leased gtid of its own epoch as one whose
    /// memory is complete (as before leases): unknown, so presumed aborted and rolled back
    /// with no abort record; the late commit then finds nothing in the store.
    LeasedGtidRolledBackUnrecorded,
    /// One-request commit: the commit is recorded without checking for an existing
    /// record (an unconditional insert overwrites recovery's abort).
    LeasedCommitOverwrites,
    /// One-request commit: a leased gtid with no record is answered "abort" (presumed)
    /// while its commit request may still be on its way.
    LeasedGtidAnsweredAbort,
    /// One-request commit with the decision in a participant: recovery presumes abort for
    /// a leased gtid without asking the decision participant first (as if only begun
    /// transactions could be deciding there).
    LeasedDipRecoveryAsksNoParticipant,
    /// One-request commit with the decision in a participant, the request sent while the
    /// last PREPARE is in flight: the client commits the decision branch without waiting
    /// for that PREPARE's answer.
    DipDecidesBeforeLastPrepare,
}

impl Bug {
    pub const BROKEN: [Bug; 13] = [
        Bug::TakeoverWithoutConditionalInsert,
        Bug::ZombieSkipsLeaseCheck,
        Bug::RecoveryTrustsGidPrefix,
        Bug::DipReportsBeforeDecidingCommit,
        Bug::AnswersFromMemoryAfterRegrant,
        Bug::PurgeWithoutWatermark,
        Bug::InMemoryWithAWriter,
        Bug::ReadOnlySkipsStoreCheck,
        Bug::LeasedGtidRolledBackUnrecorded,
        Bug::LeasedCommitOverwrites,
        Bug::LeasedGtidAnsweredAbort,
        Bug::LeasedDipRecoveryAsksNoParticipant,
        Bug::DipDecidesBeforeLastPrepare,
    ];
    pub(crate) fn no_watermark(self) -> bool {
        matches!(self, Bug::PurgeWithoutWatermark | Bug::AnswersFromMemoryAfterRegrant)
    }
    /// The mode the variant needs (its bug lives in the decision-in-participant path).
    pub fn dip(self) -> bool {
        matches!(
            self,
            Bug::DipReportsBeforeDecidingCommit
                | Bug::LeasedDipRecoveryAsksNoParticipant
                | Bug::DipDecidesBeforeLastPrepare
        )
    }
    /// The variant's bug lives in the read-only commit path.
    pub fn read_only(self) -> bool {
        matches!(self, Bug::InMemoryWithAWriter | Bug::ReadOnlySkipsStoreCheck)
    }
    /// The variant's bug lives in the one-request commit of a leased gtid.
    pub fn leased(self) -> bool {
        matches!(
            self,
            Bug::LeasedGtidRolledBackUnrecorded
                | Bug::LeasedCommitOverwrites
                | Bug::LeasedGtidAnsweredAbort
                | Bug::LeasedDipRecoveryAsksNoParticipant
                | Bug::DipDecidesBeforeLastPrepare
        )
    }
}

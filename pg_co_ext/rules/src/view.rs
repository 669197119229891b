//! What pg_co's check sees: SSI's flags, the deciding transaction and its rw-conflict
//! peers as plain values, the commit point, the settings. Shared by the rules of
//! commit.rs and read_only.rs.

/// Bits of `SERIALIZABLEXACT.flags` (storage/predicate_internals.h; the same in 15 to 18).
/// pg_co's build asserts each against the C macro of the major it builds for (build.rs).
pub mod flags {
    pub const COMMITTED: u32 = 0x0001;
    pub const PREPARED: u32 = 0x0002;
    pub const ROLLED_BACK: u32 = 0x0004;
    pub const READ_ONLY: u32 = 0x0020;
    pub const SUMMARY_CONFLICT_IN: u32 = 0x0200;
    pub const SUMMARY_CONFLICT_OUT: u32 = 0x0400;
}

/// What pg_co's own shared memory says about a peer: it passed our check and is between
/// that check and the point where PostgreSQL's flags tell the same story.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Preparing,
    Committing,
}

/// One side of an rw-antidependency, as seen in the SSI conflict lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub xid: u32,
    /// 0 for a prepared transaction (after PREPARE TRANSACTION or after crash recovery).
    pub pid: i32,
    pub flags: u32,
    pub prepare_seq: u64,
    pub marker: Option<Marker>,
}

/// Where a peer is in its life, as far as CO cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    Active,
    /// Passed our PRE_PREPARE check, PREPARE TRANSACTION not finished yet.
    Preparing,
    /// A local COMMIT in progress.
    Committing,
    /// Prepared and not yet COMMIT/ROLLBACK PREPARED.
    InDoubt,
    Committed {
        two_phase: bool,
    },
    RolledBack,
}

pub fn classify(p: &Peer) -> PeerState {
    if p.flags & flags::ROLLED_BACK != 0 {
        return PeerState::RolledBack;
    }
    if p.flags & flags::COMMITTED != 0 {
        // PostPrepare sets pid = 0 and nothing sets it back: a committed sxact with pid 0
        // went through PREPARE TRANSACTION.
        return PeerState::Committed { two_phase: p.pid == 0 };
    }
    // PostgreSQL sets PREPARED during PREPARE *and* during a plain COMMIT; only our marker
    // tells a PREPARE in progress from a COMMIT in progress.
    if p.marker == Some(Marker::Preparing) {
        return PeerState::Preparing;
    }
    if p.flags & flags::PREPARED != 0 {
        return if p.pid == 0 { PeerState::InDoubt } else { PeerState::Committing };
    }
    if p.marker == Some(Marker::Committing) {
        return PeerState::Committing;
    }
    PeerState::Active
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// PREPARE TRANSACTION (a 2PC subtransaction reaches its prepare point).
    Prepare,
    /// A local COMMIT (the transaction is its own decision).
    LocalCommit,
    /// The one-phase COMMIT of a global transaction's last branch that carries the global
    /// decision (`co.decide`): at once this branch's prepare, its commit and the global
    /// decision. Rule A as at [`Point::Prepare`], rules B and C as at
    /// [`Point::LocalCommit`] (docs/pg_co.md, "The global decision inside a commit").
    Decision,
}

impl Point {
    /// The point is (also) this branch's prepare: rule A applies.
    pub(crate) fn prepares(self) -> bool {
        matches!(self, Point::Prepare | Point::Decision)
    }
    /// The point makes the branch's writes visible here at once: rule C applies.
    pub(crate) fn commits_locally(self) -> bool {
        matches!(self, Point::LocalCommit | Point::Decision)
    }
}

/// The deciding transaction itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelfView {
    pub flags: u32,
    /// PredXact->LastSxactCommitSeqNo when the snapshot was taken.
    pub last_commit_before_snapshot: u64,
    /// The transaction wrote (it has an xid).
    pub wrote: bool,
    /// PostgreSQL summarized a reader that committed after this transaction's snapshot and
    /// still keeps its read locks, which PostgreSQL's write-side check ignores: a write of
    /// ours may have missed "that reader -rw-> us" (rule S).
    pub summarized_concurrent_reader: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Rule C: local readers that missed a 2PC write prepared before their snapshot.
    pub rule_c: bool,
    /// Rule S: local writers that may have missed an edge from a summarized reader.
    pub rule_s: bool,
    /// Rule C for READ ONLY readers (also needs `rule_c`): [`decide_read_only`].
    pub rule_c_read_only: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { rule_c: true, rule_s: true, rule_c_read_only: true }
    }
}

pub fn state_name(st: PeerState) -> &'static str {
    match st {
        PeerState::Active => "active",
        PeerState::Preparing => "preparing",
        PeerState::Committing => "committing",
        PeerState::InDoubt => "prepared (in doubt)",
        PeerState::Committed { two_phase: true } => "committed (via COMMIT PREPARED)",
        PeerState::Committed { two_phase: false } => "committed",
        PeerState::RolledBack => "rolled back",
    }
}

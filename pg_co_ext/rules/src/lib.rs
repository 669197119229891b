//! The commitment-ordering (CO) decisions of `pg_co`, free of PostgreSQL so that unit tests
//! reach them without a server. The extension copies what PostgreSQL's SSI knows about the
//! deciding transaction and its rw-conflict peers into [`SelfView`] and [`Peer`] values,
//! and asks [`decide`] what to do; for a READ ONLY reader at its COMMIT it also asks
//! [`decide_read_only`] (module [`read_only`]). The rules and their derivations: docs/pg_co.md.

pub mod read_only;
pub use read_only::{decide_read_only, MissedCommit};

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
    Committed { two_phase: bool },
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
    fn prepares(self) -> bool {
        matches!(self, Point::Prepare | Point::Decision)
    }
    /// The point makes the branch's writes visible here at once: rule C applies.
    fn commits_locally(self) -> bool {
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Rule A: T -rw-> X and X already committed or is prepared/committing: X's commit
    /// came (or will come) before T's prepare although CO needs T's commit first.
    RuleAOutEdge(Peer, PeerState),
    /// Rule A, conservative: PostgreSQL folded some of T's out-edges into a summary.
    RuleASummarized,
    /// Rule B: X -rw-> T and X is in doubt: T must not reach its commit point before X is
    /// decided. The caller refuses or waits for X and asks again.
    RuleBInDoubtReader(Peer, PeerState),
    /// Rule C: local reader L -rw-> Y where Y was prepared before L's snapshot.
    RuleCStaleLocalRead(Peer, PeerState),
    /// Rule S: a local writer T with an out-edge T -rw-> X to a transaction X that already
    /// reached its commit point (None: PostgreSQL summarized that edge), while a reader
    /// R concurrent with T was summarized: R -rw-> T may exist unrecorded, closing the
    /// cycle T -> X -> ... -> R -> T that PostgreSQL's own check cannot see.
    RuleSSummarizedReader(Option<(Peer, PeerState)>),
    /// Rule C for a READ ONLY reader L (only from [`decide_read_only`]): L's snapshot may
    /// have missed this 2PC transaction, prepared before that snapshot and committed since.
    RuleCReadOnly(MissedCommit),
}

/// The decision at one commit point. Rule A comes first: waiting cannot cure it.
pub fn decide(point: Point, me: &SelfView, out_edges: &[Peer], in_edges: &[Peer], s: &Settings) -> Verdict {
    if point.prepares() {
        if me.flags & flags::SUMMARY_CONFLICT_OUT != 0 {
            return Verdict::RuleASummarized;
        }
        for p in out_edges {
            let st = classify(p);
            if matches!(st, PeerState::Committed { .. } | PeerState::InDoubt | PeerState::Preparing | PeerState::Committing) {
                return Verdict::RuleAOutEdge(*p, st);
            }
        }
    }
    if point.commits_locally() && s.rule_c {
        for p in out_edges {
            let st = classify(p);
            let two_phase = matches!(st, PeerState::InDoubt | PeerState::Committed { two_phase: true });
            if two_phase && p.prepare_seq <= me.last_commit_before_snapshot {
                return Verdict::RuleCStaleLocalRead(*p, st);
            }
        }
    }
    // At a prepare rule A already refused every out-edge to a transaction past its
    // commit point, which is all rule S needs (docs/pg_co.md, "Rule S").
    if point == Point::LocalCommit && s.rule_s && me.wrote && me.summarized_concurrent_reader {
        if me.flags & flags::SUMMARY_CONFLICT_OUT != 0 {
            return Verdict::RuleSSummarizedReader(None);
        }
        for p in out_edges {
            let st = classify(p);
            if matches!(st, PeerState::Committed { .. } | PeerState::InDoubt | PeerState::Preparing | PeerState::Committing) {
                return Verdict::RuleSSummarizedReader(Some((*p, st)));
            }
        }
    }
    for p in in_edges {
        let st = classify(p);
        if matches!(st, PeerState::InDoubt | PeerState::Preparing) {
            return Verdict::RuleBInDoubtReader(*p, st);
        }
    }
    Verdict::Allow
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(flags: u32, pid: i32) -> Peer {
        Peer { xid: 700, pid, flags, prepare_seq: 10, marker: None }
    }
    const ACTIVE: (u32, i32) = (0, 42);
    const IN_DOUBT: (u32, i32) = (flags::PREPARED, 0);
    const COMMITTED: (u32, i32) = (flags::PREPARED | flags::COMMITTED, 42);
    const COMMITTING: (u32, i32) = (flags::PREPARED, 42);
    const ROLLED_BACK: (u32, i32) = (flags::ROLLED_BACK, 42);
    fn p(x: (u32, i32)) -> Peer {
        peer(x.0, x.1)
    }
    fn me() -> SelfView {
        SelfView { flags: 0, last_commit_before_snapshot: 20, ..SelfView::default() }
    }
    fn d(point: Point, out: &[Peer], inn: &[Peer]) -> Verdict {
        decide(point, &me(), out, inn, &Settings::default())
    }

    #[test]
    fn classify_states() {
        assert_eq!(classify(&p(ACTIVE)), PeerState::Active);
        assert_eq!(classify(&p(IN_DOUBT)), PeerState::InDoubt);
        assert_eq!(classify(&p(COMMITTING)), PeerState::Committing);
        assert_eq!(classify(&p(COMMITTED)), PeerState::Committed { two_phase: false });
        assert_eq!(classify(&peer(flags::PREPARED | flags::COMMITTED, 0)), PeerState::Committed { two_phase: true });
        assert_eq!(classify(&p(ROLLED_BACK)), PeerState::RolledBack);
        let mut prep = p(COMMITTING);
        prep.marker = Some(Marker::Preparing);
        assert_eq!(classify(&prep), PeerState::Preparing, "our marker tells a PREPARE from a COMMIT");
        let mut early = p(ACTIVE);
        early.marker = Some(Marker::Preparing);
        assert_eq!(classify(&early), PeerState::Preparing, "marked before PostgreSQL's flag is set");
    }

    #[test]
    fn rule_a_refuses_out_edge_to_finished_or_finishing_peer() {
        for st in [IN_DOUBT, COMMITTED, COMMITTING] {
            assert!(matches!(d(Point::Prepare, &[p(st)], &[]), Verdict::RuleAOutEdge(..)), "{st:?}");
        }
        let mut preparing = p(ACTIVE);
        preparing.marker = Some(Marker::Preparing);
        assert!(matches!(d(Point::Prepare, &[preparing], &[]), Verdict::RuleAOutEdge(..)));
    }

    #[test]
    fn rule_a_allows_out_edge_to_active_or_aborted_peer() {
        assert_eq!(d(Point::Prepare, &[p(ACTIVE), p(ROLLED_BACK)], &[]), Verdict::Allow);
    }

    #[test]
    fn rule_a_not_applied_at_local_commit() {
        assert_eq!(d(Point::LocalCommit, &[p(COMMITTED)], &[]), Verdict::Allow);
    }

    #[test]
    fn summarized_out_conflicts_refuse_prepare_only() {
        let me = SelfView { flags: flags::SUMMARY_CONFLICT_OUT, last_commit_before_snapshot: 0, ..SelfView::default() };
        let s = Settings::default();
        assert_eq!(decide(Point::Prepare, &me, &[], &[], &s), Verdict::RuleASummarized);
        assert_eq!(decide(Point::LocalCommit, &me, &[], &[], &s), Verdict::Allow);
    }

    #[test]
    fn rule_b_blocks_on_in_doubt_or_preparing_reader_at_both_points() {
        let mut preparing = p(ACTIVE);
        preparing.marker = Some(Marker::Preparing);
        for point in [Point::Prepare, Point::LocalCommit] {
            assert!(matches!(d(point, &[], &[p(IN_DOUBT)]), Verdict::RuleBInDoubtReader(_, PeerState::InDoubt)));
            assert!(matches!(d(point, &[], &[preparing]), Verdict::RuleBInDoubtReader(_, PeerState::Preparing)));
            assert_eq!(d(point, &[], &[p(ACTIVE), p(COMMITTED), p(ROLLED_BACK), p(COMMITTING)]), Verdict::Allow);
        }
    }

    #[test]
    fn rule_a_wins_over_rule_b() {
        assert!(matches!(d(Point::Prepare, &[p(COMMITTED)], &[p(IN_DOUBT)]), Verdict::RuleAOutEdge(..)));
    }

    #[test]
    fn rule_c_refuses_local_reader_of_data_prepared_before_its_snapshot() {
        let mut y = p(IN_DOUBT);
        y.prepare_seq = 15; // before snapshot (20)
        assert!(matches!(d(Point::LocalCommit, &[y], &[]), Verdict::RuleCStaleLocalRead(..)));
        let mut y_committed = peer(flags::PREPARED | flags::COMMITTED, 0);
        y_committed.prepare_seq = 15;
        assert!(matches!(d(Point::LocalCommit, &[y_committed], &[]), Verdict::RuleCStaleLocalRead(..)));
        y.prepare_seq = 25; // prepared after the snapshot: no G can sit in between
        assert_eq!(d(Point::LocalCommit, &[y], &[]), Verdict::Allow);
        let off = Settings { rule_c: false, ..Settings::default() };
        y.prepare_seq = 15;
        assert_eq!(decide(Point::LocalCommit, &me(), &[y], &[], &off), Verdict::Allow);
    }

    #[test]
    fn decision_commit_applies_rule_a_like_a_prepare() {
        // A plain local COMMIT with an out-edge to a finished peer is allowed; the same
        // commit carrying the global decision is also this branch's prepare: refused.
        for st in [COMMITTED, COMMITTING] {
            assert_eq!(d(Point::LocalCommit, &[p(st)], &[]), Verdict::Allow, "{st:?}");
        }
        for st in [IN_DOUBT, COMMITTED, COMMITTING] {
            assert!(matches!(d(Point::Decision, &[p(st)], &[]), Verdict::RuleAOutEdge(..)), "{st:?}");
        }
        let me = SelfView { flags: flags::SUMMARY_CONFLICT_OUT, last_commit_before_snapshot: 0, ..SelfView::default() };
        assert_eq!(decide(Point::Decision, &me, &[], &[], &Settings::default()), Verdict::RuleASummarized);
        assert_eq!(d(Point::Decision, &[p(ACTIVE), p(ROLLED_BACK)], &[]), Verdict::Allow);
    }

    #[test]
    fn decision_commit_applies_rule_b() {
        let mut preparing = p(ACTIVE);
        preparing.marker = Some(Marker::Preparing);
        assert!(matches!(d(Point::Decision, &[], &[p(IN_DOUBT)]), Verdict::RuleBInDoubtReader(..)));
        assert!(matches!(d(Point::Decision, &[], &[preparing]), Verdict::RuleBInDoubtReader(..)));
        assert_eq!(d(Point::Decision, &[], &[p(ACTIVE), p(COMMITTED), p(ROLLED_BACK), p(COMMITTING)]), Verdict::Allow);
    }

    #[test]
    fn rule_a_at_decision_covers_rule_c() {
        // Every peer rule C refuses (in doubt or committed through 2PC) is one rule A
        // already refuses at a decision commit, whatever the snapshot and with rule C off.
        let off = Settings { rule_c: false, ..Settings::default() };
        for x in [IN_DOUBT, (flags::PREPARED | flags::COMMITTED, 0)] {
            for seq in [1, 15, 25] {
                let mut y = p(x);
                y.prepare_seq = seq;
                assert!(matches!(d(Point::Decision, &[y], &[]), Verdict::RuleAOutEdge(..)));
                assert!(matches!(decide(Point::Decision, &me(), &[y], &[], &off), Verdict::RuleAOutEdge(..)));
            }
        }
    }

    #[test]
    fn rule_c_ignores_local_peers() {
        let mut x = p(COMMITTED);
        x.prepare_seq = 1;
        assert_eq!(d(Point::LocalCommit, &[x], &[]), Verdict::Allow);
    }

    #[test]
    fn rule_s_summarized_reader() {
        let exposed = SelfView { flags: 0, last_commit_before_snapshot: 20, wrote: true, summarized_concurrent_reader: true };
        let committed = p(COMMITTED);
        let s = Settings::default();
        // A writer whose out-edge goes to a committed transaction while a concurrent reader
        // was summarized: the unrecorded edge could close a cycle.
        assert_eq!(decide(Point::LocalCommit, &exposed, &[committed], &[], &s), Verdict::RuleSSummarizedReader(Some((committed, PeerState::Committed { two_phase: false }))));
        let flagged = SelfView { flags: flags::SUMMARY_CONFLICT_OUT, ..exposed };
        assert_eq!(decide(Point::LocalCommit, &flagged, &[], &[], &s), Verdict::RuleSSummarizedReader(None));
        // Each condition alone is not enough.
        assert_eq!(decide(Point::LocalCommit, &exposed, &[p(ACTIVE)], &[], &s), Verdict::Allow, "out-edge to an active peer: no cycle through a committed one");
        assert_eq!(decide(Point::LocalCommit, &SelfView { wrote: false, ..exposed }, &[committed], &[], &s), Verdict::Allow, "a reader loses no in-edge");
        assert_eq!(decide(Point::LocalCommit, &SelfView { summarized_concurrent_reader: false, ..exposed }, &[committed], &[], &s), Verdict::Allow);
        assert_eq!(decide(Point::LocalCommit, &exposed, &[committed], &[], &Settings { rule_s: false, ..s }), Verdict::Allow, "switched off");
        // At a prepare rule A refuses first; at a decision commit too.
        assert!(matches!(decide(Point::Prepare, &exposed, &[committed], &[], &s), Verdict::RuleAOutEdge(..)));
        assert!(matches!(decide(Point::Decision, &exposed, &[committed], &[], &s), Verdict::RuleAOutEdge(..)));
    }
}

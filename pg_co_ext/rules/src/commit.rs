//! Rules A, B, C (local readers) and S at PREPARE and COMMIT: what the deciding
//! transaction's view of SSI's rw-conflicts says to do.

use crate::verdict::Verdict;
use crate::view::{classify, flags, Peer, PeerState, Point, SelfView, Settings};

/// The decision at one commit point. Rule A comes first: waiting cannot cure it.
pub fn decide(point: Point, me: &SelfView, out_edges: &[Peer], in_edges: &[Peer], s: &Settings) -> Verdict {
    if point.prepares() {
        if me.flags & flags::SUMMARY_CONFLICT_OUT != 0 {
            return Verdict::RuleASummarized;
        }
        for p in out_edges {
            let st = classify(p);
            if matches!(
                st,
                PeerState::Committed { .. } | PeerState::InDoubt | PeerState::Preparing | PeerState::Committing
            ) {
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
            if matches!(
                st,
                PeerState::Committed { .. } | PeerState::InDoubt | PeerState::Preparing | PeerState::Committing
            ) {
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

#[cfg(test)]
mod tests {
    use crate::*;

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
        let exposed =
            SelfView { flags: 0, last_commit_before_snapshot: 20, wrote: true, summarized_concurrent_reader: true };
        let committed = p(COMMITTED);
        let s = Settings::default();
        // A writer whose out-edge goes to a committed transaction while a concurrent reader
        // was summarized: the unrecorded edge could close a cycle.
        assert_eq!(
            decide(Point::LocalCommit, &exposed, &[committed], &[], &s),
            Verdict::RuleSSummarizedReader(Some((committed, PeerState::Committed { two_phase: false })))
        );
        let flagged = SelfView { flags: flags::SUMMARY_CONFLICT_OUT, ..exposed };
        assert_eq!(decide(Point::LocalCommit, &flagged, &[], &[], &s), Verdict::RuleSSummarizedReader(None));
        // Each condition alone is not enough.
        assert_eq!(
            decide(Point::LocalCommit, &exposed, &[p(ACTIVE)], &[], &s),
            Verdict::Allow,
            "out-edge to an active peer: no cycle through a committed one"
        );
        assert_eq!(
            decide(Point::LocalCommit, &SelfView { wrote: false, ..exposed }, &[committed], &[], &s),
            Verdict::Allow,
            "a reader loses no in-edge"
        );
        assert_eq!(
            decide(
                Point::LocalCommit,
                &SelfView { summarized_concurrent_reader: false, ..exposed },
                &[committed],
                &[],
                &s
            ),
            Verdict::Allow
        );
        assert_eq!(
            decide(Point::LocalCommit, &exposed, &[committed], &[], &Settings { rule_s: false, ..s }),
            Verdict::Allow,
            "switched off"
        );
        // At a prepare rule A refuses first; at a decision commit too.
        assert!(matches!(decide(Point::Prepare, &exposed, &[committed], &[], &s), Verdict::RuleAOutEdge(..)));
        assert!(matches!(decide(Point::Decision, &exposed, &[committed], &[], &s), Verdict::RuleAOutEdge(..)));
    }
}

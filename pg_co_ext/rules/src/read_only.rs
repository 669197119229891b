//! Rule C for READ ONLY readers (docs/pg_co.md, "Rule C for READ ONLY readers"): the
//! decision, free of PostgreSQL and of pg_co's shared memory.
//!
//! PostgreSQL drops a READ ONLY reader L's rw edge to a 2PC transaction Y when Y commits,
//! so [`crate::decide`]'s edge check cannot see L -rw-> Y once Y's COMMIT PREPARED came
//! between L's snapshot and L's COMMIT. The extension keeps its own record of every COMMIT
//! PREPARED (in flight, or done with its commit sequence number) and copies what it knows
//! about L into [`Reader`]; [`decide_read_only`] then refuses L when its snapshot may have
//! missed such a Y. Reading the records is the shell's job ([`CommitRecords`]): they live in
//! shared memory and are read lazily, in the order this module asks for them.

use crate::verdict::{MissedCommit, Verdict};
use crate::view::{Point, Settings};

/// What the extension knows about the committing transaction L.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reader {
    /// `XactReadOnly`.
    pub read_only: bool,
    /// `XactIsoLevel == XACT_SERIALIZABLE`.
    pub serializable: bool,
    /// The snapshot position (lastCommitBeforeSnapshot) noted at L's first ExecutorStart:
    /// None not noted (no statement ran through the executor yet); Some(None) L had no
    /// serializable state then (PostgreSQL had already found its snapshot safe).
    pub noted_seq: Option<Option<u64>>,
    /// The snapshot position PostgreSQL still holds at COMMIT (None: L was released).
    pub seq_now: Option<u64>,
    /// `XactDeferrable`.
    pub deferrable: bool,
    /// `FirstSnapshotSet`: L took a snapshot (read something).
    pub took_snapshot: bool,
    /// When L began (µs since 2000, PostgreSQL's TimestampTz).
    pub began_us: u64,
}

/// A COMMIT PREPARED in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// 0 when pg_co could not tell Y's xid (prepared before a restart, or out of its gid ring).
    pub xid: u32,
    /// Y's prepareSeqNo; 0 when unknown (prepared before every snapshot: the careful side).
    pub prepare_seq: u64,
}

/// A finished COMMIT PREPARED.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    pub xid: u32,
    pub prepare_seq: u64,
    /// PostgreSQL's last commit sequence number right after Y committed (>= Y's
    /// commitSeqNo); 0 for a ring entry never written.
    pub commit_seq: u64,
    /// When the COMMIT PREPARED finished (µs since 2000).
    pub end_us: u64,
}

/// The largest values of the records the ring no longer holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overwritten {
    pub max_commit_seq: u64,
    pub max_end_us: u64,
}

/// The extension's commit records, read on demand.
pub trait CommitRecords {
    /// The COMMIT PREPAREDs in flight now.
    fn in_flight(&self) -> impl Iterator<Item = InFlight>;
    /// Every ring entry; None for one that kept being rewritten while read (the careful
    /// side: the decision refuses).
    fn done(&self) -> impl Iterator<Item = Option<Done>>;
    /// Asked only after [`Self::done`] was read through: an entry overwritten during that
    /// scan raised these values before it was rewritten, so a later read cannot miss it.
    fn overwritten(&self) -> Overwritten;
    /// Whether L's snapshot does not see `xid` (0: unknown, counted as not seen). Asked
    /// only for a DEFERRABLE reader without a snapshot position that took a snapshot.
    fn invisible(&self, xid: u32) -> bool;
}

impl MissedCommit {
    const UNKNOWN: MissedCommit = MissedCommit { xid: 0, in_flight: false };
}

/// Rule C for a READ ONLY serializable reader at its local COMMIT: Allow, or
/// [`Verdict::RuleCReadOnly`] with the first 2PC transaction it may have missed. The shell
/// asks after the edge check ([`crate::decide`]), not before (docs/pg_co.md says why).
pub fn decide_read_only(point: Point, r: &Reader, s: &Settings, records: &impl CommitRecords) -> Verdict {
    // A decision commit is also a prepare and co.decide refuses READ ONLY transactions;
    // rule C for READ ONLY readers belongs to a plain local COMMIT.
    let applies = point == Point::LocalCommit && r.read_only && r.serializable && s.rule_c && s.rule_c_read_only;
    if !applies {
        return Verdict::Allow;
    }
    let snapshot = match r.noted_seq {
        Some(noted) => noted.or(r.seq_now),
        None => r.seq_now,
    };
    let missed = match snapshot {
        Some(snap) => missed_by_position(snap, records),
        // No SSI state at the first ExecutorStart: safe from its snapshot on (no Y was in
        // doubt), except a DEFERRABLE reader, which PostgreSQL releases once its snapshot
        // turns safe, possibly by Y's commit during the wait.
        None if r.deferrable => missed_by_visibility(r, records),
        None => None,
    };
    missed.map_or(Verdict::Allow, Verdict::RuleCReadOnly)
}

/// Snapshot position S known: some Y prepared at or before S (so before L's snapshot) is
/// in flight, or committed after S (so L missed it), or the ring forgot a commit after S.
fn missed_by_position(snap: u64, records: &impl CommitRecords) -> Option<MissedCommit> {
    if let Some(f) = records.in_flight().find(|f| f.prepare_seq <= snap) {
        return Some(MissedCommit { xid: f.xid, in_flight: true });
    }
    for e in records.done() {
        let Some(e) = e else { return Some(MissedCommit::UNKNOWN) };
        if e.commit_seq != 0 && e.prepare_seq <= snap && e.commit_seq > snap {
            return Some(MissedCommit { xid: e.xid, in_flight: false });
        }
    }
    (records.overwritten().max_commit_seq > snap).then_some(MissedCommit::UNKNOWN)
}

/// A DEFERRABLE reader without a snapshot position: the 2PC transactions its snapshot does
/// not see whose COMMIT PREPARED is in flight or ended after the reader began; an
/// overwritten entry that ended after that counts too.
fn missed_by_visibility(r: &Reader, records: &impl CommitRecords) -> Option<MissedCommit> {
    if !r.took_snapshot {
        return None; // it read nothing
    }
    // No "started before it" filter on xmax: a transaction in progress at the snapshot can
    // have an xid >= xmax, which is latestCompletedXid + 1.
    if let Some(f) = records.in_flight().find(|f| records.invisible(f.xid)) {
        return Some(MissedCommit { xid: f.xid, in_flight: true });
    }
    for e in records.done() {
        let Some(e) = e else { return Some(MissedCommit::UNKNOWN) };
        if e.commit_seq != 0 && e.end_us >= r.began_us && records.invisible(e.xid) {
            return Some(MissedCommit { xid: e.xid, in_flight: false });
        }
    }
    (records.overwritten().max_end_us >= r.began_us).then_some(MissedCommit::UNKNOWN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Records as plain values; counts what the decision asked for.
    #[derive(Default)]
    struct Recs {
        in_flight: Vec<InFlight>,
        done: Vec<Option<Done>>,
        overwritten: Overwritten,
        invisible: Vec<u32>,
        asked_invisible: Cell<usize>,
        asked_any: Cell<bool>,
    }

    impl CommitRecords for Recs {
        fn in_flight(&self) -> impl Iterator<Item = InFlight> {
            self.asked_any.set(true);
            self.in_flight.clone().into_iter()
        }
        fn done(&self) -> impl Iterator<Item = Option<Done>> {
            self.asked_any.set(true);
            self.done.clone().into_iter()
        }
        fn overwritten(&self) -> Overwritten {
            self.asked_any.set(true);
            self.overwritten
        }
        fn invisible(&self, xid: u32) -> bool {
            self.asked_invisible.set(self.asked_invisible.get() + 1);
            xid == 0 || self.invisible.contains(&xid)
        }
    }

    const SNAP: u64 = 20;
    const BEGAN: u64 = 1_000;

    /// A READ ONLY serializable reader whose snapshot position was noted at S = 20.
    fn reader() -> Reader {
        Reader {
            read_only: true,
            serializable: true,
            noted_seq: Some(Some(SNAP)),
            seq_now: None,
            deferrable: false,
            took_snapshot: true,
            began_us: BEGAN,
        }
    }
    fn deferrable() -> Reader {
        Reader { noted_seq: Some(None), deferrable: true, ..reader() }
    }
    fn done(xid: u32, prepare_seq: u64, commit_seq: u64, end_us: u64) -> Option<Done> {
        Some(Done { xid, prepare_seq, commit_seq, end_us })
    }
    fn d(r: &Reader, recs: &Recs) -> Verdict {
        decide_read_only(Point::LocalCommit, r, &Settings::default(), recs)
    }
    fn refused(xid: u32, in_flight: bool) -> Verdict {
        Verdict::RuleCReadOnly(MissedCommit { xid, in_flight })
    }

    #[test]
    fn refuses_in_flight_commit_prepared_before_snapshot() {
        let recs = Recs {
            in_flight: vec![InFlight { xid: 9, prepare_seq: 30 }, InFlight { xid: 7, prepare_seq: SNAP }],
            ..Recs::default()
        };
        assert_eq!(d(&reader(), &recs), refused(7, true));
        let unknown = Recs { in_flight: vec![InFlight { xid: 0, prepare_seq: 0 }], ..Recs::default() };
        assert_eq!(d(&reader(), &unknown), refused(0, true), "unknown prepare position: the careful side");
    }

    #[test]
    fn allows_in_flight_commit_prepared_after_snapshot() {
        let recs = Recs { in_flight: vec![InFlight { xid: 9, prepare_seq: SNAP + 1 }], ..Recs::default() };
        assert_eq!(d(&reader(), &recs), Verdict::Allow);
    }

    #[test]
    fn refuses_commit_after_snapshot_of_transaction_prepared_before() {
        let recs = Recs { done: vec![done(5, 10, SNAP, 0), done(6, 10, SNAP + 5, 0)], ..Recs::default() };
        assert_eq!(d(&reader(), &recs), refused(6, false));
    }

    #[test]
    fn allows_commits_the_snapshot_saw_or_prepared_after_it() {
        let recs = Recs {
            done: vec![
                done(5, 10, SNAP, 0),     // committed before the snapshot: seen
                done(6, SNAP + 1, 40, 0), // prepared after the snapshot: no G in between
                done(0, 0, 0, 0),         // never written
            ],
            overwritten: Overwritten { max_commit_seq: SNAP, max_end_us: u64::MAX },
            ..Recs::default()
        };
        assert_eq!(d(&reader(), &recs), Verdict::Allow);
        assert_eq!(recs.asked_invisible.get(), 0, "visibility is the DEFERRABLE fallback only");
    }

    #[test]
    fn refuses_when_the_ring_forgot_or_could_not_be_read() {
        let forgot = Recs { overwritten: Overwritten { max_commit_seq: SNAP + 1, max_end_us: 0 }, ..Recs::default() };
        assert_eq!(d(&reader(), &forgot), refused(0, false));
        let torn = Recs { done: vec![None, done(6, 10, SNAP + 5, 0)], ..Recs::default() };
        assert_eq!(d(&reader(), &torn), refused(0, false));
    }

    #[test]
    fn noted_position_wins_over_the_one_at_commit() {
        let recs = Recs { done: vec![done(6, 10, 25, 0)], ..Recs::default() };
        // Noted at 20: missed the commit at 25. PostgreSQL's position now (30) would not see it.
        assert_eq!(d(&Reader { seq_now: Some(30), ..reader() }, &recs), refused(6, false));
        // Not noted (no ExecutorStart) or noted without SSI state: the position at commit.
        assert_eq!(d(&Reader { noted_seq: None, seq_now: Some(30), ..reader() }, &recs), Verdict::Allow);
        assert_eq!(d(&Reader { noted_seq: None, seq_now: Some(20), ..reader() }, &recs), refused(6, false));
        assert_eq!(d(&Reader { noted_seq: Some(None), seq_now: Some(20), ..reader() }, &recs), refused(6, false));
    }

    #[test]
    fn safe_from_the_start_unless_deferrable() {
        let recs = Recs {
            in_flight: vec![InFlight { xid: 7, prepare_seq: 0 }],
            done: vec![done(6, 10, 25, BEGAN)],
            invisible: vec![6, 7],
            ..Recs::default()
        };
        for noted in [None, Some(None)] {
            let r = Reader { noted_seq: noted, seq_now: None, ..reader() };
            assert_eq!(d(&r, &recs), Verdict::Allow, "{noted:?}");
            assert!(!recs.asked_any.get(), "nothing to read for a reader released as safe");
        }
    }

    #[test]
    fn deferrable_reader_refused_for_commits_its_snapshot_does_not_see() {
        let in_flight = Recs {
            in_flight: vec![InFlight { xid: 8, prepare_seq: 99 }, InFlight { xid: 7, prepare_seq: 99 }],
            invisible: vec![7],
            ..Recs::default()
        };
        assert_eq!(d(&deferrable(), &in_flight), refused(7, true));
        let ended = Recs {
            done: vec![done(5, 1, 2, BEGAN - 1), done(6, 1, 2, BEGAN)],
            invisible: vec![5, 6],
            ..Recs::default()
        };
        assert_eq!(d(&deferrable(), &ended), refused(6, false), "ended before the reader began: not a candidate");
        let forgot = Recs { overwritten: Overwritten { max_commit_seq: 0, max_end_us: BEGAN }, ..Recs::default() };
        assert_eq!(d(&deferrable(), &forgot), refused(0, false));
        let torn = Recs { done: vec![None], ..Recs::default() };
        assert_eq!(d(&deferrable(), &torn), refused(0, false));
    }

    #[test]
    fn deferrable_reader_allowed_when_it_sees_them_or_read_nothing() {
        let recs = Recs {
            in_flight: vec![InFlight { xid: 7, prepare_seq: 0 }],
            done: vec![done(6, 1, 2, BEGAN + 1), done(5, 1, 2, BEGAN - 1), done(0, 0, 0, BEGAN + 1)],
            overwritten: Overwritten { max_commit_seq: u64::MAX, max_end_us: BEGAN - 1 },
            invisible: vec![5],
            ..Recs::default()
        };
        assert_eq!(d(&deferrable(), &recs), Verdict::Allow);
        let nothing_read =
            Recs { in_flight: vec![InFlight { xid: 7, prepare_seq: 0 }], invisible: vec![7], ..Recs::default() };
        assert_eq!(d(&Reader { took_snapshot: false, ..deferrable() }, &nothing_read), Verdict::Allow);
        assert_eq!(nothing_read.asked_invisible.get(), 0, "no snapshot to ask");
    }

    #[test]
    fn applies_only_to_read_only_serializable_readers_at_local_commit_with_both_settings_on() {
        let recs = Recs { in_flight: vec![InFlight { xid: 7, prepare_seq: 0 }], ..Recs::default() };
        assert_eq!(d(&Reader { read_only: false, ..reader() }, &recs), Verdict::Allow);
        assert_eq!(d(&Reader { serializable: false, ..reader() }, &recs), Verdict::Allow);
        for point in [Point::Prepare, Point::Decision] {
            assert_eq!(decide_read_only(point, &reader(), &Settings::default(), &recs), Verdict::Allow, "{point:?}");
        }
        for s in [
            Settings { rule_c: false, ..Settings::default() },
            Settings { rule_c_read_only: false, ..Settings::default() },
        ] {
            assert_eq!(decide_read_only(Point::LocalCommit, &reader(), &s, &recs), Verdict::Allow, "{s:?}");
        }
        assert!(!recs.asked_any.get(), "records are not read when the rule does not apply");
        assert_eq!(d(&reader(), &recs), refused(7, true));
    }
}

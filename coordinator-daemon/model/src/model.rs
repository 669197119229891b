//! The `stateright::Model` of the protocol: initial states, the actions possible in each
//! state, their effects, and the properties checked.

use crate::bug::Bug;
use crate::proto::Proto;
use crate::state::*;
use cotx_protocol::answer::{self, Reconcile};
use cotx_protocol::lease::{self, ClaimVerdict, Renewal};
use cotx_protocol::leased::{self, Range};
use cotx_protocol::recovery::{self, Action as Rec};
use cotx_protocol::Outcome::{Abort, Commit};
use stateright::{Model, Property};

impl Model for Proto {
    type State = State;
    type Action = Act;

    fn init_states(&self) -> Vec<State> {
        let mut d: Vec<Daemon> = (0..self.daemons)
            .map(|_| Daemon { up: true, inc: 0, grant: None, mem: None, regaining: false, pending: None })
            .collect();
        // X was begun on daemon 0 under grant 1; its branches are prepared and reported.
        // Leased: X's gtid is of a range daemon 0 leased; no daemon knows X yet.
        d[0].grant = Some(1);
        d[0].mem = if self.leased { None } else { Some((Mem::Active, 1)) };
        vec![State {
            row: Some(LeaseRow { holder: 0, inc: 0, generation: 1, expired: false }),
            next_gen: 2,
            record: None,
            first_record: None,
            finished: false,
            purged: false,
            // Leased: branch 1 is prepared after the start, so a recovery pass may run
            // while the client still works; with dip too, branch 0 decides later.
            br: match (self.dip, self.ro || self.leased) {
                (true, true) => [Br::Active, Br::Active],
                (true, false) => [Br::Active, Br::Prepared],
                (false, true) => [Br::Prepared, Br::Active],
                (false, false) => [Br::Prepared, Br::Prepared],
            },
            unflushed: false,
            dip_decision: None,
            dip_go: false,
            foreign: Br::Prepared,
            foreign_other: Br::Prepared,
            d,
            told: [false, false],
            fenced_write_landed: false,
            ended_early: false,
            faults: self.faults,
            lease: if self.leased { Range::Live } else { Range::NotLeased },
            inflight: false,
            sends: 0,
            refused: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Act>) {
        let n = self.daemons as u8;
        for d in 0..n {
            let x = &s.d[d as usize];
            if s.acts(d) {
                if s.told == [false, false] && !self.leased {
                    out.push(Act::Commit(d));
                }
                if self.leased && matches!(x.mem, Some((Mem::Decided(_), _))) && x.pending.is_none() {
                    out.push(Act::Forget(d));
                }
                out.push(Act::Ask(d));
                if x.grant.is_some() {
                    out.push(Act::Renew(d));
                    if x.pending.is_none() {
                        out.push(Act::Recover(d));
                    }
                    if d != 0 {
                        out.push(Act::Release(d));
                    }
                }
                if d != 0 && x.grant.is_none() {
                    out.push(Act::TakeOver(d));
                }
                if matches!(x.mem, Some((Mem::Committing, _))) && x.pending.is_none() {
                    out.push(Act::Retry(d));
                }
                if matches!(x.mem, Some((Mem::Active, _))) {
                    out.push(Act::Timeout(d));
                }
                if matches!(x.mem, Some((Mem::Deciding, _))) {
                    out.push(Act::Resolve(d));
                }
                if matches!(x.mem, Some((Mem::Decided(_), _))) {
                    for b in 0..2 {
                        if s.br[b as usize] == Br::Prepared {
                            out.push(Act::Complete(d, b));
                        }
                    }
                }
            }
            if x.up && x.regaining {
                out.push(Act::Regain(d));
            }
            if let Some(w) = x.pending {
                out.push(if w.admitted { Act::StoreInsert { d, reply_lost: false } } else { Act::StoreAdmit(d) });
                if w.admitted {
                    out.push(Act::StoreInsert { d, reply_lost: true });
                }
                if s.faults > 0 {
                    out.push(Act::LoseWrite(d));
                }
            }
            if s.faults > 0 && x.up {
                out.push(Act::Crash(d));
            }
            if !x.up {
                out.push(Act::Restart(d));
            }
        }
        if s.told != [false, false] {
            for b in 0..2 {
                if s.br[b as usize] == Br::Prepared {
                    out.push(Act::AppFinish(b));
                }
            }
        }
        if (self.ro || self.leased) && s.br[1] == Br::Active && !s.purged {
            out.push(Act::PrepareLast);
            if self.leased {
                out.push(Act::PrepareRefused);
            }
        }
        if self.leased {
            // The client commits once it prepared its last branch — with dip, it may send
            // while that PREPARE is still in flight, since the decision waits for both
            // answers —; it sends again after a lost connection (at most twice on a path).
            let ready = !s.refused && (self.dip || s.br[1] != Br::Active);
            if s.told == [false, false] && ready && !s.inflight && s.sends < 2 {
                out.push(Act::Send);
            }
            if s.inflight && s.acts(0) && s.d[0].pending.is_none() {
                out.push(Act::Deliver);
            }
            if s.lease == Range::Live {
                out.push(Act::Lapse);
            }
        }
        // The decision branch commits once the hand-over is answered and the client's
        // last PREPARE has answered (branch 1 no longer active).
        let prepared_last = s.br[1] != Br::Active || self.bug == Bug::DipDecidesBeforeLastPrepare;
        if self.dip && s.dip_go && s.br[0] == Br::Active && prepared_last {
            out.push(Act::DecideInParticipant);
        }
        out.push(Act::MarkFinished);
        out.push(Act::Purge);
        out.push(Act::Flush);
        out.push(Act::ForeignDecide);
        out.push(Act::ForeignFinish);
        if s.faults > 0 {
            out.push(Act::Expire);
            out.push(Act::MariaRevive);
        }
    }

    fn next_state(&self, last: &State, a: Act) -> Option<State> {
        let mut s = self.step(last, a)?;
        if self.ro {
            s.note_early_end();
        }
        Some(s)
    }

    // Each property is written as the guarantee reads in docs/guarantees.md ("no branch
    // committed and another aborted"), not in clippy's minimal form.
    #[allow(clippy::nonminimal_bool)]
    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // Over the branches that wrote: a read-only branch's ending changes no data.
            Property::always("no split", |p: &Proto, s: &State| {
                let w = p.writes();
                let ended = |o: Br| (0..2).any(|b| w[b] && s.br[b] == o);
                !(ended(Br::Committed) && ended(Br::Aborted))
                    && !(s.foreign == Br::Aborted && s.foreign_other == Br::Committed)
            }),
            Property::always("a decision never changes", |_, s: &State| {
                s.record.is_none() || s.record == s.first_record
            }),
            Property::always("no branch goes against the outcome in force", |p: &Proto, s: &State| {
                let w = p.writes();
                let against = |o: Br| (0..2).any(|b| w[b] && s.br[b] == o);
                match s.truth(w) {
                    Some(Commit) => !against(Br::Aborted),
                    Some(Abort) => !against(Br::Committed),
                    None => true,
                }
            }),
            // An all-read-only X may be told commit from memory (no record) as long as no
            // branch ended before its last PREPARE (cotx_protocol::read_only); it may then
            // also read as aborted later (presumed abort): for it the same data.
            Property::always("the client hears only the outcome in force", |p: &Proto, s: &State| {
                let w = p.writes();
                let all_ro = w == [false, false];
                let commit_durable = s.first_record == Some(Commit) || s.dip_decision == Some(Commit);
                let commit_ok = commit_durable || (all_ro && !s.ended_early);
                (all_ro || !(s.told[0] && s.told[1]))
                    && (!s.told[0] || commit_ok)
                    && (!s.told[1] || s.truth(w) != Some(Commit))
            }),
            Property::always("a fenced write never lands", |_, s: &State| !s.fenced_write_landed),
            Property::eventually("every prepared branch is finished", |_, s: &State| {
                !s.prepared() && s.foreign != Br::Prepared
            }),
        ]
    }
}

impl Proto {
    /// One action's effect (`next_state` adds the bookkeeping every step shares).
    fn step(&self, last: &State, a: Act) -> Option<State> {
        let mut s = last.clone();
        match a {
            Act::PrepareLast => s.br[1] = Br::Prepared,
            Act::PrepareRefused => {
                s.br[1] = Br::Aborted;
                s.refused = true;
                if s.br[0] == Br::Active {
                    s.br[0] = Br::Aborted;
                }
            }
            Act::Commit(d) => {
                let x = s.d[d as usize].clone();
                // The daemon commits only once every branch is reported prepared.
                if self.ro && s.br[1] == Br::Active {
                    return None;
                }
                match x.mem {
                    Some((Mem::Active, g)) if self.dip => {
                        if s.br[1] != Br::Prepared {
                            return None;
                        }
                        s.d[d as usize].mem = Some((Mem::Deciding, g));
                        s.dip_go = true;
                        if self.bug == Bug::DipReportsBeforeDecidingCommit {
                            s.tell(Commit);
                        }
                    }
                    Some((Mem::Active, g)) if self.ro && self.in_memory() => self.commit_in_memory(&mut s, d, g)?,
                    Some((Mem::Active, g)) => {
                        s.d[d as usize].mem = Some((Mem::Committing, g));
                        Self::issue(&mut s, d, Commit, g, false);
                    }
                    Some((Mem::Decided(o), _)) => s.tell(o),
                    Some(_) => return None,
                    // Not in memory: the store's record answers a commit asked again.
                    None => match self.answer(&mut s, d) {
                        Some(o) => s.tell(o),
                        None => return None,
                    },
                }
            }
            Act::Ask(d) => match self.answer(&mut s, d) {
                Some(o) if !s.told[oi(o)] => s.tell(o),
                _ => return None,
            },
            Act::Send => {
                s.inflight = true;
                s.sends += 1;
            }
            Act::Deliver => {
                s.inflight = false;
                let x = s.d[0].clone();
                match x.mem {
                    Some((Mem::Decided(o), _)) => s.tell(o),
                    // Committing: its write's reply answers (a repeated request waits for it).
                    Some(_) => {}
                    None => match leased::commit(self.range(&s, 0)) {
                        leased::Commit::Record if self.ro && self.in_memory() => {
                            // With every branch listed read-only: the in-memory commit.
                            self.commit_in_memory(&mut s, 0, x.grant?)?
                        }
                        leased::Commit::Record if self.dip => {
                            // With decide_in: nothing written, branch 0 decides.
                            s.d[0].mem = Some((Mem::Deciding, x.grant?));
                            s.dip_go = true;
                            if self.bug == Bug::DipReportsBeforeDecidingCommit {
                                s.tell(Commit);
                            }
                        }
                        leased::Commit::Record => {
                            let g = x.grant?;
                            s.d[0].mem = Some((Mem::Committing, g));
                            Self::issue(&mut s, 0, Commit, g, false);
                        }
                        leased::Commit::Answer => {
                            if let Some(o) = self.answer(&mut s, 0) {
                                s.tell(o);
                            }
                        }
                    },
                }
            }
            Act::Lapse => s.lease = Range::Lapsed,
            Act::Forget(d) => {
                if s.prepared() {
                    return None;
                }
                s.d[d as usize].mem = None;
            }
            Act::AppFinish(b) => {
                // The application finishes its own branch with what it was told.
                let o = if s.told[0] { Commit } else { Abort };
                s.br[b as usize] = if o == Commit { Br::Committed } else { Br::Aborted };
                if o == Abort && b == 1 {
                    s.unflushed = true;
                }
            }
            Act::DecideInParticipant => {
                // co.decide: the unique decision row orders it against co.resolve.
                match s.dip_decision {
                    None | Some(Commit) => {
                        s.dip_decision = Some(Commit);
                        s.br[0] = Br::Committed;
                        s.tell(Commit);
                        if let Some((Mem::Deciding, g)) = s.d[0].mem {
                            if s.d[0].up {
                                s.d[0].mem = Some((Mem::Decided(Commit), g));
                            }
                        }
                    }
                    Some(Abort) => {
                        s.br[0] = Br::Aborted;
                        s.tell(Abort);
                    }
                }
            }
            Act::StoreAdmit(d) => {
                let mut w = s.d[d as usize].pending?;
                let overwrites = !w.recovery && self.bug == Bug::LeasedCommitOverwrites;
                if let (Some(o), false) = (s.record, overwrites) {
                    s.d[d as usize].pending = None;
                    Self::reply(&mut s, d, w, Some(o));
                    return Some(s);
                }
                let tok = s.token(d, w.generation);
                let ok = lease::admits(s.row_view().as_ref(), &tok);
                if ok || (self.bug == Bug::ZombieSkipsLeaseCheck && !w.recovery) {
                    w.admitted = true;
                    w.unfenced = !ok;
                    s.d[d as usize].pending = Some(w);
                } else {
                    s.d[d as usize].pending = None;
                    Self::reply(&mut s, d, w, None);
                }
            }
            Act::StoreInsert { d, reply_lost } => {
                let w = s.d[d as usize].pending?;
                s.d[d as usize].pending = None;
                let result = match s.record {
                    Some(_) if w.recovery && self.bug == Bug::TakeoverWithoutConditionalInsert => {
                        s.record = Some(w.outcome);
                        w.outcome
                    }
                    Some(_) if !w.recovery && self.bug == Bug::LeasedCommitOverwrites => {
                        s.record = Some(w.outcome);
                        w.outcome
                    }
                    // Conditional insert: the outcome in force wins.
                    Some(o) => o,
                    // Below the purge watermark no decision is written any more (a write
                    // stalled past the retention would otherwise land unopposed).
                    None if s.purged => {
                        if !reply_lost {
                            Self::reply(&mut s, d, w, None);
                        }
                        return Some(s);
                    }
                    None => {
                        s.record = Some(w.outcome);
                        s.first_record.get_or_insert(w.outcome);
                        s.finished = false;
                        s.fenced_write_landed |= w.unfenced;
                        w.outcome
                    }
                };
                if !reply_lost {
                    Self::reply(&mut s, d, w, Some(result));
                }
            }
            Act::Retry(d) => {
                let (_, g) = s.d[d as usize].mem?;
                Self::issue(&mut s, d, Commit, g, false);
            }
            Act::Renew(d) => {
                let g = s.d[d as usize].grant?;
                match lease::renewal(s.row_view().as_ref(), &s.token(d, g)) {
                    Renewal::Renewed => {
                        let r = s.row.as_mut()?;
                        if !r.expired {
                            return None;
                        }
                        r.expired = false;
                    }
                    Renewal::Lost(_) if d != 0 => {
                        // A taken-over node is no longer ours: let it go.
                        let x = &mut s.d[d as usize];
                        x.grant = None;
                        x.mem = None;
                    }
                    Renewal::Lost(_) if self.bug == Bug::AnswersFromMemoryAfterRegrant => {
                        // Defect 1: claim it again at once and go on with what memory holds.
                        match lease::claim(s.row_view().as_ref(), s.lock_free(), false) {
                            ClaimVerdict::Grant => {
                                let g = s.next_gen;
                                s.next_gen += 1;
                                s.row = Some(LeaseRow { holder: d, inc: s.d[0].inc, generation: g, expired: false });
                                s.d[0].grant = Some(g);
                                if let Some((m, _)) = s.d[0].mem {
                                    s.d[0].mem = Some((m, g));
                                }
                            }
                            _ => {
                                s.d[0].grant = None;
                                s.d[0].regaining = true;
                            }
                        }
                    }
                    Renewal::Lost(_) => {
                        s.d[0].grant = None;
                        s.d[0].regaining = true;
                    }
                }
            }
            Act::Regain(d) => {
                // The daemon's store writes go through one writer in order: a write of
                // ours already past the fence check commits before our claim runs.
                if s.d[d as usize].pending.is_some_and(|w| w.admitted) {
                    return None;
                }
                let g = s.claim(d)?;
                let stored = s.stored();
                let x = &mut s.d[d as usize];
                x.grant = Some(g);
                x.regaining = false;
                if x.mem.is_some() {
                    x.mem = match answer::after_regrant(stored) {
                        Reconcile::Keep(o) => Some((Mem::Decided(o), g)),
                        Reconcile::Drop | Reconcile::Quarantine => None,
                    };
                }
            }
            Act::TakeOver(d) => {
                // Expired leases, and released nodes with a prepared branch back.
                if s.row.is_none() && !s.prepared() {
                    return None;
                }
                let g = s.claim(d)?;
                s.d[d as usize].grant = Some(g);
            }
            Act::Recover(d) => {
                let mut changed = false;
                // The foreign branch: whose() leaves another epoch's branch alone; the broken
                // variant presumes abort for anything with our prefix.
                if self.bug == Bug::RecoveryTrustsGidPrefix && s.foreign == Br::Prepared {
                    s.foreign = Br::Aborted;
                    changed = true;
                }
                if !s.prepared() || !s.in_force(d) {
                    return if changed { Some(s) } else { None };
                }
                let x = s.d[d as usize].clone();
                let g = x.grant?;
                let decision = match x.mem {
                    Some((Mem::Decided(o), _)) => Some((o, false)),
                    _ => None,
                };
                let active = matches!(x.mem, Some((Mem::Active | Mem::Committing | Mem::Deciding, _)));
                let current = d == 0 && x.inc == 0;
                let recorded_commit = s.record == Some(Commit);
                let action = if self.bug == Bug::LeasedGtidRolledBackUnrecorded {
                    recovery::decide(decision, active, recorded_commit, current)
                } else {
                    leased::recovery(decision, active, recorded_commit, current, self.range(&s, d))
                };
                let mut o = match action {
                    Rec::Leave => return if changed { Some(s) } else { None },
                    Rec::Commit => Some(Commit),
                    Rec::Rollback => Some(Abort),
                    Rec::RecordAbort => None,
                };
                // (The broken variant runs leased: X's gtid is a leased one.)
                let asks = self.bug != Bug::LeasedDipRecoveryAsksNoParticipant;
                if self.dip && asks && decision.is_none() && s.record.is_none() && action != Rec::Leave {
                    // Before presuming abort: the decision may be in the participant
                    // (co.resolve records abort where none committed).
                    o = Some(*s.dip_decision.get_or_insert(Abort));
                }
                match o {
                    Some(o) => {
                        if x.mem == Some((Mem::Decided(o), g)) {
                            return if changed { Some(s) } else { None };
                        }
                        s.d[d as usize].mem = Some((Mem::Decided(o), g));
                    }
                    None => Self::issue(&mut s, d, Abort, g, true),
                }
            }
            Act::Resolve(d) => {
                let (_, g) = s.d[d as usize].mem?;
                let o = *s.dip_decision.get_or_insert(Abort);
                s.d[d as usize].mem = Some((Mem::Decided(o), g));
            }
            Act::Complete(d, b) => {
                // The participant accepts it only from the holder of the node's lock.
                if !s.in_force(d) {
                    return None;
                }
                let Some((Mem::Decided(o), _)) = s.d[d as usize].mem else { return None };
                s.br[b as usize] = if o == Commit { Br::Committed } else { Br::Aborted };
                if o == Abort && b == 1 {
                    s.unflushed = true;
                }
            }
            Act::Release(d) => {
                if s.prepared() || !s.in_force(d) || s.d[d as usize].pending.is_some() {
                    return None;
                }
                if s.record.is_some() {
                    s.finished = true;
                }
                s.row = None;
                let x = &mut s.d[d as usize];
                x.grant = None;
                x.mem = None;
            }
            Act::MarkFinished => {
                if s.record.is_none() || s.finished || s.prepared() || (self.dip && s.br[0] == Br::Active) {
                    return None;
                }
                s.finished = true;
            }
            Act::Purge => {
                if !s.finished || s.purged || s.record.is_none() {
                    return None;
                }
                s.record = None;
                s.purged = !self.bug.no_watermark();
                if !s.purged {
                    s.finished = false;
                }
            }
            Act::Timeout(d) => {
                let (_, g) = s.d[d as usize].mem?;
                s.d[d as usize].mem = Some((Mem::Decided(Abort), g));
            }
            Act::Flush => {
                if !s.unflushed {
                    return None;
                }
                s.unflushed = false;
            }
            Act::ForeignDecide => {
                if s.foreign_other != Br::Prepared {
                    return None;
                }
                s.foreign_other = Br::Committed;
            }
            Act::ForeignFinish => {
                if s.foreign != Br::Prepared || s.foreign_other != Br::Committed {
                    return None;
                }
                s.foreign = Br::Committed;
            }
            Act::Expire => {
                let r = s.row.as_mut()?;
                if r.expired {
                    return None;
                }
                r.expired = true;
                s.faults -= 1;
            }
            Act::Crash(d) => {
                // Its store session ends with it, and an open write with it.
                let x = &mut s.d[d as usize];
                x.pending = None;
                x.up = false;
                x.grant = None;
                x.mem = None;
                x.regaining = false;
                s.faults -= 1;
            }
            Act::Restart(d) => {
                if s.d[d as usize].inc >= 2 {
                    return None;
                }
                let x = &mut s.d[d as usize];
                x.up = true;
                x.inc += 1;
                // The owner claims its node at start (and waits while it is held).
                x.regaining = d == 0;
            }
            Act::LoseWrite(d) => {
                s.d[d as usize].pending = None;
                s.faults -= 1;
            }
            Act::MariaRevive => {
                if !s.unflushed || s.br[1] != Br::Aborted {
                    return None;
                }
                s.br[1] = Br::Prepared;
                s.unflushed = false;
                s.faults -= 1;
            }
        }
        Some(s)
    }
}

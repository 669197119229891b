//! A model of the coordinator's commit protocol, checked exhaustively with `stateright`.
//!
//! Every decision the model's daemons and store take is made by the daemon's own code, the
//! `cotx-protocol` crate: lease renewal and claims (`lease::renewal`, `lease::claim`), the
//! store's fencing check (`lease::admits`), what recovery does with a prepared branch
//! (`recovery::decide`), what a daemon answers (`answer::answer`) and what it keeps of its
//! memory under a new grant (`answer::after_regrant`). The model adds only what the I/O
//! shells do around them: one global transaction X of node N (owned by daemon 0) with two
//! branches — branch 0 on PostgreSQL, branch 1 on MariaDB — plus a foreign prepared branch
//! that carries our gid prefix but belongs to another deployment.
//!
//! Actors and their actions (each a step the checker interleaves in every order):
//! - daemons: commit (client request), decision writes (retries), renewals, regaining a
//!   lost grant, takeover, recovery passes, branch completion, release, timeouts, and, as
//!   faults, crash (memory lost) and restart;
//! - the store: decision writes in two steps (the fence check, then the conditional
//!   insert — a claim may come in between: the model does not rely on the PostgreSQL
//!   store's row lock), lease rows with generations, purge after the retention; faults:
//!   a lease running out (a holder paused or cut off past its ttl, or its clock skewed),
//!   a write lost (message loss, or a failover to a synchronous standby losing an
//!   uncommitted transaction), a reply lost;
//! - participants: prepared branches survive restarts; MariaDB's unflushed XA ROLLBACK
//!   can bring a branch back as prepared after a crash (fault);
//! - the client/application: asks any daemon for the decision (retries on another), and
//!   finishes its own branches once told the outcome; in `dip` mode it commits the
//!   decision branch with `co.decide` (the participant's unique decision row).
//!
//! Properties: no split; a decision never changes; no client told an outcome other than
//! the one in force (never "commit" without a durable commit record or, in dip, the
//! deciding branch's commit); a fenced write never lands; and, once faults stop, every
//! prepared branch is finished (checked on every terminal state).
//!
//! `Bug` switches one piece of the protocol for a deliberately broken one: each must
//! produce a counterexample, so the model's silence on the real protocol means something.

use cotx_protocol::answer::{self, Answer, Reconcile, Stored};
use cotx_protocol::lease::{self, ClaimVerdict, Renewal, Row, Token};
use cotx_protocol::recovery::{self, Action as Rec};
use cotx_protocol::Outcome::{self, Abort, Commit};
use stateright::{Model, Property};

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
}

impl Bug {
    pub const BROKEN: [Bug; 6] = [
        Bug::TakeoverWithoutConditionalInsert,
        Bug::ZombieSkipsLeaseCheck,
        Bug::RecoveryTrustsGidPrefix,
        Bug::DipReportsBeforeDecidingCommit,
        Bug::AnswersFromMemoryAfterRegrant,
        Bug::PurgeWithoutWatermark,
    ];
    fn no_watermark(self) -> bool {
        matches!(self, Bug::PurgeWithoutWatermark | Bug::AnswersFromMemoryAfterRegrant)
    }
    /// The mode the variant needs (its bug lives in the decision-in-participant path).
    pub fn dip(self) -> bool {
        self == Bug::DipReportsBeforeDecidingCommit
    }
}

#[derive(Clone, Debug)]
pub struct Proto {
    /// Daemons sharing the store: daemon 0 owns node N; the others may take it over.
    pub daemons: usize,
    /// Faults the checker may inject on one path.
    pub faults: u8,
    /// Decision in a participant (branch 0 decides with co.decide) instead of the store.
    pub dip: bool,
    pub bug: Bug,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Br {
    /// Not prepared (dip's decision branch until it commits).
    Active,
    Prepared,
    Committed,
    Aborted,
}

/// A daemon's memory of X.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mem {
    Active,
    Committing,
    Deciding,
    Decided(Outcome),
}

/// A decision write on its way through the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Write {
    pub outcome: Outcome,
    pub inc: u8,
    pub generation: i64,
    /// Recovery's abort record (after a takeover or a restart), not the owner's commit.
    pub recovery: bool,
    /// Past the fence check, not yet inserted.
    pub admitted: bool,
    /// Admitted although its grant was not in force (only a broken variant does that).
    pub unfenced: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Daemon {
    pub up: bool,
    /// Process start: a restart is a new lease holder and a new epoch.
    pub inc: u8,
    /// Our grant of node N's lease.
    pub grant: Option<i64>,
    /// X in memory, with the generation it entered memory under.
    pub mem: Option<(Mem, i64)>,
    /// Own grant lost, not yet reconciled under a new one (daemon 0 only).
    pub regaining: bool,
    pub pending: Option<Write>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseRow {
    pub holder: u8,
    pub inc: u8,
    pub generation: i64,
    pub expired: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub row: Option<LeaseRow>,
    pub next_gen: i64,
    pub record: Option<Outcome>,
    /// The first outcome ever recorded for X (kept after a purge).
    pub first_record: Option<Outcome>,
    pub finished: bool,
    /// Purged after the retention: X is below its epoch's purge watermark.
    pub purged: bool,
    pub br: [Br; 2],
    /// MariaDB's rollback of branch 1 is not flushed yet.
    pub unflushed: bool,
    /// dip: the decision row in participant 0 (co.decide / co.resolve).
    pub dip_decision: Option<Outcome>,
    /// dip: the daemon handed the decision to the participant.
    pub dip_go: bool,
    /// A branch with our gid prefix of another deployment, and that deployment's other branch.
    pub foreign: Br,
    pub foreign_other: Br,
    pub d: Vec<Daemon>,
    /// What the client heard: [commit, abort].
    pub told: [bool; 2],
    pub fenced_write_landed: bool,
    pub faults: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    Commit(u8),
    Ask(u8),
    AppFinish(u8),
    DecideInParticipant,
    StoreAdmit(u8),
    StoreInsert { d: u8, reply_lost: bool },
    Retry(u8),
    Renew(u8),
    Regain(u8),
    TakeOver(u8),
    Recover(u8),
    Resolve(u8),
    Complete(u8, u8),
    Release(u8),
    MarkFinished,
    Purge,
    Timeout(u8),
    Flush,
    ForeignDecide,
    ForeignFinish,
    // Faults.
    Expire,
    Crash(u8),
    Restart(u8),
    LoseWrite(u8),
    MariaRevive,
}

fn holder(d: u8, inc: u8) -> String {
    format!("d{d}.{inc}")
}

fn oi(o: Outcome) -> usize {
    match o {
        Commit => 0,
        Abort => 1,
    }
}

impl State {
    fn row_view(&self) -> Option<Row> {
        self.row.as_ref().map(|r| Row { holder: holder(r.holder, r.inc), generation: r.generation, expires_in_ms: if r.expired { -1 } else { 1 } })
    }
    fn token(&self, d: u8, generation: i64) -> Token {
        Token { holder: holder(d, self.d[d as usize].inc), generation }
    }
    /// The store's answer for X (cotx_protocol::answer::Stored).
    fn stored(&self) -> Stored {
        match self.record {
            Some(o) => Stored::Record(o),
            None => Stored::Absent { forgotten: self.purged },
        }
    }
    /// No live store session holds N's lock: no row, or its holder's process is gone.
    fn lock_free(&self) -> bool {
        match &self.row {
            None => true,
            Some(r) => {
                let h = &self.d[r.holder as usize];
                !h.up || h.inc != r.inc
            }
        }
    }
    fn acts(&self, d: u8) -> bool {
        let x = &self.d[d as usize];
        x.up && !x.regaining
    }
    /// Whether d's grant is the one in force (the node lock at the participants follows it).
    fn in_force(&self, d: u8) -> bool {
        match self.d[d as usize].grant {
            Some(g) => lease::admits(self.row_view().as_ref(), &self.token(d, g)),
            None => false,
        }
    }
    fn prepared(&self) -> bool {
        self.br.contains(&Br::Prepared)
    }
    /// The outcome in force, if any: recorded, decided in the participant, or visible in
    /// a branch.
    fn truth(&self) -> Option<Outcome> {
        self.first_record.or(self.dip_decision).or_else(|| {
            if self.br.contains(&Br::Committed) {
                Some(Commit)
            } else {
                None
            }
        })
    }
    /// A claim of N by d with fencing of an expired holder (cotx_protocol::lease::claim):
    /// the new grant's generation, None while a live holder has it.
    fn claim(&mut self, d: u8) -> Option<i64> {
        if lease::claim(self.row_view().as_ref(), self.lock_free(), true) == ClaimVerdict::Held {
            return None;
        }
        let g = self.next_gen;
        self.next_gen += 1;
        self.row = Some(LeaseRow { holder: d, inc: self.d[d as usize].inc, generation: g, expired: false });
        Some(g)
    }
    fn tell(&mut self, o: Outcome) {
        self.told[oi(o)] = true;
    }
}

impl Proto {
    pub fn new(daemons: usize, faults: u8, bug: Bug) -> Proto {
        Proto { daemons, faults, dip: bug.dip(), bug }
    }

    /// d's answer to "what is X's decision" (cotx_protocol::answer::answer), in dip mode
    /// resolving an unknown gtid at the decision participant first.
    fn answer(&self, s: &mut State, d: u8) -> Option<Outcome> {
        let x = s.d[d as usize].clone();
        let memory = x.mem.map(|(m, _)| match m {
            Mem::Decided(o) => Some(o),
            _ => None,
        });
        let committing = matches!(x.mem, Some((Mem::Committing, _)));
        let stored = if memory.is_none() || committing { Some(s.stored()) } else { None };
        // Presumed abort only by the owner under its grant (cotx_protocol::answer): a
        // daemon that took the node over answers from the store only, since the paused
        // owner's write may still land (its recovery records abort first).
        let ours = d == 0 && x.grant.is_some();
        match answer::answer(false, memory, stored, ours) {
            Answer::Decided(o) => Some(o),
            Answer::PresumedAbort if self.dip => Some(*s.dip_decision.get_or_insert(Abort)),
            Answer::PresumedAbort => Some(Abort),
            Answer::Pending | Answer::Quarantined | Answer::Forgotten | Answer::AskOwner => None,
        }
    }

    fn issue(s: &mut State, d: u8, outcome: Outcome, generation: i64, recovery: bool) {
        let inc = s.d[d as usize].inc;
        s.d[d as usize].pending = Some(Write { outcome, inc, generation, recovery, admitted: false, unfenced: false });
    }

    /// A write's result reaches its daemon (if the same process is still there).
    fn reply(s: &mut State, d: u8, w: Write, result: Option<Outcome>) {
        let x = &mut s.d[d as usize];
        if !x.up || x.inc != w.inc {
            return;
        }
        match (result, x.mem) {
            (Some(o), Some((Mem::Committing, g))) if !w.recovery => {
                x.mem = Some((Mem::Decided(o), g));
                s.tell(o);
            }
            (Some(o), _) if w.recovery => x.mem = Some((Mem::Decided(o), w.generation)),
            // Fenced: nothing was written; memory waits for the store's word.
            _ => {}
        }
    }
}

impl Model for Proto {
    type State = State;
    type Action = Act;

    fn init_states(&self) -> Vec<State> {
        let mut d: Vec<Daemon> =
            (0..self.daemons).map(|_| Daemon { up: true, inc: 0, grant: None, mem: None, regaining: false, pending: None }).collect();
        // X was begun on daemon 0 under grant 1; its branches are prepared and reported.
        d[0].grant = Some(1);
        d[0].mem = Some((Mem::Active, 1));
        vec![State {
            row: Some(LeaseRow { holder: 0, inc: 0, generation: 1, expired: false }),
            next_gen: 2,
            record: None,
            first_record: None,
            finished: false,
            purged: false,
            br: if self.dip { [Br::Active, Br::Prepared] } else { [Br::Prepared, Br::Prepared] },
            unflushed: false,
            dip_decision: None,
            dip_go: false,
            foreign: Br::Prepared,
            foreign_other: Br::Prepared,
            d,
            told: [false, false],
            fenced_write_landed: false,
            faults: self.faults,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Act>) {
        let n = self.daemons as u8;
        for d in 0..n {
            let x = &s.d[d as usize];
            if s.acts(d) {
                if s.told == [false, false] {
                    out.push(Act::Commit(d));
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
        if self.dip && s.dip_go && s.br[0] == Br::Active {
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
        let mut s = last.clone();
        match a {
            Act::Commit(d) => {
                let x = s.d[d as usize].clone();
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
                if let Some(o) = s.record {
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
                let ours = d == 0 && x.inc == 0;
                let action = recovery::decide(decision, active, s.record == Some(Commit), ours);
                let mut o = match action {
                    Rec::Leave => return if changed { Some(s) } else { None },
                    Rec::Commit => Some(Commit),
                    Rec::Rollback => Some(Abort),
                    Rec::RecordAbort => None,
                };
                if self.dip && decision.is_none() && s.record.is_none() && action != Rec::Leave {
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

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no split", |_, s: &State| {
                !(s.br.contains(&Br::Committed) && s.br.contains(&Br::Aborted))
                    && !(s.foreign == Br::Aborted && s.foreign_other == Br::Committed)
            }),
            Property::always("a decision never changes", |_, s: &State| {
                s.record.is_none() || s.record == s.first_record
            }),
            Property::always("no branch goes against the outcome in force", |_, s: &State| match s.truth() {
                Some(Commit) => !s.br.contains(&Br::Aborted),
                Some(Abort) => !s.br.contains(&Br::Committed),
                None => true,
            }),
            Property::always("the client hears only the outcome in force", |_, s: &State| {
                let commit_durable = s.first_record == Some(Commit) || s.dip_decision == Some(Commit);
                !(s.told[0] && s.told[1]) && (!s.told[0] || commit_durable) && (!s.told[1] || s.truth() != Some(Commit))
            }),
            Property::always("a fenced write never lands", |_, s: &State| !s.fenced_write_landed),
            Property::eventually("every prepared branch is finished", |_, s: &State| {
                !s.prepared() && s.foreign != Br::Prepared
            }),
        ]
    }
}

/// What one check found: states, depth, time, and the properties it broke (with a trace).
pub struct Outcomes {
    pub unique_states: usize,
    pub max_depth: usize,
    pub seconds: f64,
    pub violations: Vec<(&'static str, String)>,
}

/// Checks `p` exhaustively up to `depth` steps (BFS).
pub fn check(p: Proto, depth: usize, threads: usize) -> Outcomes {
    use stateright::Checker;
    let t0 = std::time::Instant::now();
    let names: Vec<&'static str> = p.properties().iter().map(|x| x.name).collect();
    let c = p.clone().checker().threads(threads).target_max_depth(depth).spawn_bfs().join();
    let mut violations = vec![];
    for name in names {
        if let Some(path) = c.discovery(name) {
            let steps: Vec<String> = path.into_actions().iter().map(|a| format!("{a:?}")).collect();
            violations.push((name, steps.join(" → ")));
        }
    }
    Outcomes { unique_states: c.unique_state_count(), max_depth: c.max_depth(), seconds: t0.elapsed().as_secs_f64(), violations }
}

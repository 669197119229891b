//! What the checker explores: the state of daemons, store, participants and client, and the
//! actions between states.

use cotx_protocol::answer::Stored;
use cotx_protocol::lease::{self, ClaimVerdict, Row, Token};
use cotx_protocol::leased::Range;
use cotx_protocol::Outcome::{self, Abort, Commit};

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
    /// A branch of X ended (committed or rolled back) while another was not prepared yet:
    /// X's reads are then not protected by commitment ordering up to its last PREPARE.
    pub ended_early: bool,
    pub faults: u8,
    /// Leased mode: X's range at daemon 0's first process (NotLeased in other modes).
    pub lease: Range,
    /// Leased mode: the client's commit request (with X's branches) is on its way to
    /// daemon 0, and how many it sent (a retry after a lost connection).
    pub inflight: bool,
    pub sends: u8,
    /// Leased mode: branch 1's PREPARE was refused (the client sends nothing and rolls
    /// back the branch it holds open).
    pub refused: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// The client prepares X's last branch (read-only mode: branch 1 starts unprepared).
    PrepareLast,
    /// Leased mode: the database refuses branch 1's PREPARE (a serialization failure, a
    /// deadlock): the branch is rolled back, and so is dip's decision branch if still open.
    PrepareRefused,
    Commit(u8),
    /// Leased mode: the client sends its one commit request, with X's branches.
    Send,
    /// Leased mode: daemon 0 handles the commit request.
    Deliver,
    /// Leased mode: the lease of X's range runs out.
    Lapse,
    /// Leased mode: a daemon forgets X, decided and with no branch prepared.
    Forget(u8),
    Ask(u8),
    AppFinish(u8),
    DecideInParticipant,
    StoreAdmit(u8),
    StoreInsert {
        d: u8,
        reply_lost: bool,
    },
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

pub(crate) fn holder(d: u8, inc: u8) -> String {
    format!("d{d}.{inc}")
}

pub(crate) fn oi(o: Outcome) -> usize {
    match o {
        Commit => 0,
        Abort => 1,
    }
}

impl State {
    pub(crate) fn row_view(&self) -> Option<Row> {
        self.row.as_ref().map(|r| Row {
            holder: holder(r.holder, r.inc),
            generation: r.generation,
            expires_in_ms: if r.expired { -1 } else { 1 },
        })
    }
    pub(crate) fn token(&self, d: u8, generation: i64) -> Token {
        Token { holder: holder(d, self.d[d as usize].inc), generation }
    }
    /// The store's answer for X (cotx_protocol::answer::Stored).
    pub(crate) fn stored(&self) -> Stored {
        match self.record {
            Some(o) => Stored::Record(o),
            None => Stored::Absent { forgotten: self.purged },
        }
    }
    /// No live store session holds N's lock: no row, or its holder's process is gone.
    pub(crate) fn lock_free(&self) -> bool {
        match &self.row {
            None => true,
            Some(r) => {
                let h = &self.d[r.holder as usize];
                !h.up || h.inc != r.inc
            }
        }
    }
    pub(crate) fn acts(&self, d: u8) -> bool {
        let x = &self.d[d as usize];
        x.up && !x.regaining
    }
    /// Whether d's grant is the one in force (the node lock at the participants follows it).
    pub(crate) fn in_force(&self, d: u8) -> bool {
        match self.d[d as usize].grant {
            Some(g) => lease::admits(self.row_view().as_ref(), &self.token(d, g)),
            None => false,
        }
    }
    /// A branch ended while another is still unprepared (see `ended_early`).
    pub(crate) fn note_early_end(&mut self) {
        if self.br.contains(&Br::Active) && self.br.iter().any(|b| matches!(b, Br::Committed | Br::Aborted)) {
            self.ended_early = true;
        }
    }
    pub(crate) fn prepared(&self) -> bool {
        self.br.contains(&Br::Prepared)
    }
    /// The outcome in force, if any: recorded, decided in the participant, or visible in
    /// a branch that wrote (a read-only branch's ending shows nothing).
    pub(crate) fn truth(&self, writes: [bool; 2]) -> Option<Outcome> {
        self.first_record.or(self.dip_decision).or_else(|| {
            if (0..2).any(|b| writes[b] && self.br[b] == Br::Committed) {
                Some(Commit)
            } else {
                None
            }
        })
    }
    /// A claim of N by d with fencing of an expired holder (cotx_protocol::lease::claim):
    /// the new grant's generation, None while a live holder has it.
    pub(crate) fn claim(&mut self, d: u8) -> Option<i64> {
        if lease::claim(self.row_view().as_ref(), self.lock_free(), true) == ClaimVerdict::Held {
            return None;
        }
        let g = self.next_gen;
        self.next_gen += 1;
        self.row = Some(LeaseRow { holder: d, inc: self.d[d as usize].inc, generation: g, expired: false });
        Some(g)
    }
    pub(crate) fn tell(&mut self, o: Outcome) {
        self.told[oi(o)] = true;
    }
}

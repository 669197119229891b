//! The model's parameters (daemons, faults, decision in a participant, a bug) and the
//! protocol steps that the actions of model.rs share.

use crate::bug::Bug;
use crate::state::*;
use cotx_protocol::answer::{self, Answer, Stored};
use cotx_protocol::leased::{self, Range};
use cotx_protocol::read_only::{self, CommitPath, Verdict};
use cotx_protocol::Outcome::{self, Abort, Commit};

#[derive(Clone, Debug)]
pub struct Proto {
    /// Daemons sharing the store: daemon 0 owns node N; the others may take it over.
    pub daemons: usize,
    /// Faults the checker may inject on one path.
    pub faults: u8,
    /// Decision in a participant (branch 0 decides with co.decide) instead of the store.
    pub dip: bool,
    /// The read-only commit path: the client lists X's branches that wrote
    /// nothing (both, or with `Bug::InMemoryWithAWriter` only branch 1), and branch 1 is
    /// prepared by the client after the start, so a branch may end before the last
    /// PREPARE (the case the store read guards against).
    pub ro: bool,
    /// The one-request commit (cotx_protocol::leased): X's gtid is drawn from a range
    /// daemon 0 leased to the client, unknown to every daemon until the client's commit
    /// request (with X's branches) reaches daemon 0; branch 1 is prepared after the start.
    pub leased: bool,
    pub bug: Bug,
}

impl Proto {
    pub fn new(daemons: usize, faults: u8, bug: Bug) -> Proto {
        Proto { daemons, faults, dip: bug.dip(), ro: bug.read_only(), leased: bug.leased(), bug }
    }

    /// Which of X's branches wrote something.
    pub(crate) fn writes(&self) -> [bool; 2] {
        match (self.ro, self.bug) {
            (_, Bug::InMemoryWithAWriter) => [true, false],
            (true, _) => [false, false],
            (false, _) => [true, true],
        }
    }

    /// The daemon's choice of commit path from the client's read-only list
    /// (cotx_protocol::read_only::commit_path; the broken variant asks "any" for "every").
    pub(crate) fn in_memory(&self) -> bool {
        let listed = self.writes().map(|w| !w);
        if self.bug == Bug::InMemoryWithAWriter {
            return listed.contains(&true);
        }
        read_only::commit_path(listed) == CommitPath::InMemory
    }

    /// The in-memory commit by daemon d (every branch reported prepared): the store read
    /// first (cotx_protocol::read_only::in_memory_commit). None: refused, nothing changes.
    pub(crate) fn commit_in_memory(&self, s: &mut State, d: u8, g: i64) -> Option<()> {
        let stored =
            if self.bug == Bug::ReadOnlySkipsStoreCheck { Stored::Absent { forgotten: false } } else { s.stored() };
        let o = match read_only::in_memory_commit(stored) {
            Verdict::Commit => Commit,
            Verdict::Decided(o) => o,
            Verdict::Refuse => return None,
        };
        s.d[d as usize].mem = Some((Mem::Decided(o), g));
        s.tell(o);
        Some(())
    }

    /// d's answer to "what is X's decision" (cotx_protocol::answer::answer), in dip mode
    /// resolving an unknown gtid at the decision participant first.
    pub(crate) fn answer(&self, s: &mut State, d: u8) -> Option<Outcome> {
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
        let node_ours = d == 0 && x.grant.is_some();
        let ours = if self.bug == Bug::LeasedGtidAnsweredAbort {
            node_ours
        } else {
            leased::presumes_abort(node_ours, self.range(s, d))
        };
        match answer::answer(false, memory, stored, ours) {
            Answer::Decided(o) => Some(o),
            Answer::PresumedAbort if self.dip => Some(*s.dip_decision.get_or_insert(Abort)),
            Answer::PresumedAbort => Some(Abort),
            Answer::Pending | Answer::Quarantined | Answer::Forgotten | Answer::AskOwner => None,
        }
    }

    /// Where X stands among the ranges d's process leased: only daemon 0's first process
    /// leased X's range (a restarted process is a new epoch and knows none of the old one's).
    pub(crate) fn range(&self, s: &State, d: u8) -> Range {
        if self.leased && d == 0 && s.d[0].inc == 0 {
            s.lease
        } else {
            Range::NotLeased
        }
    }

    pub(crate) fn issue(s: &mut State, d: u8, outcome: Outcome, generation: i64, recovery: bool) {
        let inc = s.d[d as usize].inc;
        s.d[d as usize].pending = Some(Write { outcome, inc, generation, recovery, admitted: false, unfenced: false });
    }

    /// A write's result reaches its daemon (if the same process is still there).
    pub(crate) fn reply(s: &mut State, d: u8, w: Write, result: Option<Outcome>) {
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

//! The model's parameters (daemons, faults, decision in a participant, a bug) and the
//! protocol steps that the actions of model.rs share.

use crate::bug::Bug;
use crate::state::*;
use cotx_protocol::answer::{self, Answer};
use cotx_protocol::Outcome::{self, Abort};

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

impl Proto {
    pub fn new(daemons: usize, faults: u8, bug: Bug) -> Proto {
        Proto { daemons, faults, dip: bug.dip(), bug }
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
        let ours = d == 0 && x.grant.is_some();
        match answer::answer(false, memory, stored, ours) {
            Answer::Decided(o) => Some(o),
            Answer::PresumedAbort if self.dip => Some(*s.dip_decision.get_or_insert(Abort)),
            Answer::PresumedAbort => Some(Abort),
            Answer::Pending | Answer::Quarantined | Answer::Forgotten | Answer::AskOwner => None,
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

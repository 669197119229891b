//! Slots of the shim table (cotx.shim / cotx_shim), one per live client-mode branch (pure).
//!
//! Distinct slots keep branches from conflicting with each other through the shim itself:
//! two branches writing one row would wait on each other (MariaDB) or fail with a
//! serialization error (PostgreSQL). Slots are reused first-in first-out, so a slot freed
//! by a committed branch is taken again as late as possible (a new branch whose snapshot
//! is older than that commit would otherwise meet its write).

use std::collections::{HashSet, VecDeque};

#[derive(Debug, Default)]
pub struct Slots {
    free: VecDeque<i32>,
    busy: HashSet<i32>,
    size: i32,
}

impl Slots {
    /// Slots 1..=size, the first one taken being `start` (a restarted daemon starts
    /// elsewhere than where its previous run's branches may still hold rows).
    pub fn new(size: i32, start: i32) -> Slots {
        let size = size.max(0);
        let mut free: VecDeque<i32> = (1..=size).collect();
        if size > 0 {
            free.rotate_left(((start - 1).rem_euclid(size)) as usize);
        }
        Slots { free, busy: HashSet::new(), size }
    }

    pub fn size(&self) -> i32 {
        self.size
    }

    pub fn take(&mut self) -> Option<i32> {
        while let Some(k) = self.free.pop_front() {
            if self.busy.insert(k) {
                return Some(k);
            }
        }
        None
    }

    pub fn give(&mut self, k: i32) {
        if self.busy.remove(&k) {
            self.free.push_back(k);
        }
    }

    /// Marks a slot in use by something found prepared (a helper of an earlier run).
    pub fn reserve(&mut self, k: i32) {
        if (1..=self.size).contains(&k) && self.busy.insert(k) {
            self.free.retain(|x| *x != k);
        }
    }

    pub fn in_use(&self) -> usize {
        self.busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_distinct_reused_last_and_run_out() {
        let mut s = Slots::new(3, 2);
        assert_eq!((s.take(), s.take()), (Some(2), Some(3)));
        s.give(2);
        assert_eq!(s.take(), Some(1));
        assert_eq!(s.take(), Some(2));
        assert_eq!(s.take(), None);
        assert_eq!(s.in_use(), 3);
        s.give(9); // not ours: ignored
        assert_eq!(s.take(), None);
    }

    #[test]
    fn a_reserved_slot_is_not_handed_out() {
        let mut s = Slots::new(2, 1);
        s.reserve(1);
        assert_eq!(s.take(), Some(2));
        assert_eq!(s.take(), None);
        s.give(1);
        assert_eq!(s.take(), Some(1));
    }
}

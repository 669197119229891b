//! Shared, pre-prepared PostgreSQL helper transactions (pure: no I/O; the caller passes
//! the time). Sonata's §5, in our words: one helper reads a *block* of `n` consecutive
//! slot rows and is prepared ahead of need; each client-mode branch of the resource takes
//! one key of a ready helper's block and writes that row before its own PREPARE, so the
//! edge helper -rw-> branch exists as with a helper of its own (docs/client-mode.md, "Why
//! a shared helper is as good as one per branch"). The registration path then asks the
//! database nothing in the common case; the pool is refilled off it (shared_helpers.rs).
//!
//! A helper goes (is rolled back) only when no branch that took one of its keys may still
//! commit: every key it handed out belongs to a branch that is settled (finished, failed,
//! or its transaction aborted). It goes as soon as that is true of an exhausted helper
//! (every key handed out), and after `IDLE` without a new taker for a helper that has keys
//! left (light load: no helper lives on for nothing). A helper with a live branch never
//! goes, whatever its age. A helper one of whose branches committed in one phase goes
//! only once no slot of its block is write-locked (the caller looks, `lock_check`): that
//! branch commits on its client's session after the daemon's answer, and the daemon
//! counts it settled when its owner says so, or when its transaction is forgotten.
//!
//! Blocks are whole: block b (1-based) holds keys (b-1)·n+1 ..= b·n, so a helper's gid
//! names its block by its first key and `n` (naming::pg_shared_helper_gid), and a restarted
//! daemon knows which rows a dangling helper still reads.

use super::slots::Slots;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Keys per helper unless the resource says otherwise (`client_helper_block`): Sonata's 10.
pub const DEFAULT_BLOCK: i32 = crate::config::CLIENT_HELPER_BLOCK_DEFAULT;
/// The largest block a resource may configure.
pub const MAX_BLOCK: i32 = crate::config::CLIENT_HELPER_BLOCK_MAX;
/// Ready helpers with keys left that the pool keeps ahead of need, per resource.
pub const POOL_READY: usize = 2;
/// A helper with no live branch that handed out no key for this long is rolled back.
pub const IDLE: Duration = Duration::from_millis(1000);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Its PREPARE TRANSACTION is under way: no key is handed out yet.
    Preparing,
    /// Prepared: hands out keys while it has some left.
    Ready,
    /// To be rolled back (no live branch); hands out nothing more.
    Retiring,
}

#[derive(Debug, Clone)]
struct Helper {
    block: i32,
    stage: Stage,
    /// Keys handed out so far (the next key is first + handed).
    handed: i32,
    /// Branches holding one of its keys that may still commit.
    live: i32,
    last_use: Instant,
    /// Retiring and its rollback handed to a caller (no two callers roll it back at once).
    claimed: bool,
    /// A branch of it committed in one phase: before the rollback the caller checks that
    /// no slot of the block is write-locked (its transaction may not have ended yet).
    lock_check: bool,
}

/// A key for a branch, and the helper whose block holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub helper: u64,
    pub key: i32,
}

/// One PostgreSQL resource's helpers and the blocks of the shim table.
#[derive(Debug)]
pub struct Pool {
    n: i32,
    blocks: Slots,
    helpers: HashMap<u64, Helper>,
}

impl Pool {
    /// `slots` rows in the shim table, `n` keys per block (clamped to 1..=MAX_BLOCK); the
    /// first block handed out holds `start_key` (a restarted daemon starts elsewhere).
    pub fn new(slots: i32, n: i32, start_key: i32) -> Pool {
        let n = n.clamp(1, MAX_BLOCK);
        let count = slots.max(0) / n;
        Pool { n, blocks: Slots::new(count, (start_key - 1).max(0) / n + 1), helpers: HashMap::new() }
    }

    pub fn block_size(&self) -> i32 {
        self.n
    }

    /// Rows the pool may hand out (whole blocks only).
    pub fn slots(&self) -> i32 {
        self.blocks.size() * self.n
    }

    /// The first key of block `b`.
    pub fn first_key(&self, b: i32) -> i32 {
        (b - 1) * self.n + 1
    }

    fn block_of(&self, key: i32) -> i32 {
        (key - 1) / self.n + 1
    }

    /// Marks the blocks of keys `first .. first+count` in use by something found prepared
    /// (a helper of an earlier run, of another size, or of the old one-per-branch kind).
    pub fn reserve_keys(&mut self, first: i32, count: i32) {
        for k in first..first.saturating_add(count.max(1)) {
            self.blocks.reserve(self.block_of(k));
        }
    }

    /// Those blocks again, once what held them was rolled back. A block a helper of ours
    /// holds stays taken.
    pub fn give_keys(&mut self, first: i32, count: i32) {
        for k in first..first.saturating_add(count.max(1)) {
            let b = self.block_of(k);
            if !self.helpers.values().any(|h| h.block == b) {
                self.blocks.give(b);
            }
        }
    }

    /// Helpers to start now so that `POOL_READY` ready ones have keys left.
    pub fn wanted(&self) -> usize {
        let ahead = self
            .helpers
            .values()
            .filter(|h| h.stage == Stage::Preparing || (h.stage == Stage::Ready && h.handed < self.n))
            .count();
        POOL_READY.saturating_sub(ahead)
    }

    /// A new helper `id` (unique in the daemon run: it is in the gid) on a free block, to
    /// be prepared by the caller; its first key. None when every block is taken.
    pub fn start(&mut self, id: u64, now: Instant) -> Option<i32> {
        let block = self.blocks.take()?;
        let h = Helper {
            block,
            stage: Stage::Preparing,
            handed: 0,
            live: 0,
            last_use: now,
            claimed: false,
            lock_check: false,
        };
        self.helpers.insert(id, h);
        Some(self.first_key(block))
    }

    /// Its PREPARE succeeded: it may hand out keys.
    pub fn prepared(&mut self, id: u64, now: Instant) {
        if let Some(h) = self.helpers.get_mut(&id) {
            h.stage = Stage::Ready;
            h.last_use = now;
        }
    }

    /// Its PREPARE failed. `absent`: surely not prepared, its block is free again;
    /// otherwise (a timeout) the block stays taken until a sweep has looked.
    pub fn failed(&mut self, id: u64, absent: bool) {
        if let Some(h) = self.helpers.remove(&id) {
            if absent {
                self.blocks.give(h.block);
            }
        }
    }

    /// A key for a new branch, from the ready helper that handed out the most (one block
    /// is used up before the next is started on). None: no ready helper has a key left.
    pub fn take(&mut self, now: Instant) -> Option<Taken> {
        let id = self
            .helpers
            .iter()
            .filter(|(_, h)| h.stage == Stage::Ready && h.handed < self.n)
            .max_by_key(|(id, h)| (h.handed, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id)?;
        self.take_from(id, now)
    }

    /// A key of this helper's block (the one a registration prepared inline).
    pub fn take_from(&mut self, id: u64, now: Instant) -> Option<Taken> {
        let n = self.n;
        let first = self.helpers.get(&id).map(|h| self.first_key(h.block))?;
        let h = self.helpers.get_mut(&id)?;
        if h.stage != Stage::Ready || h.handed >= n {
            return None;
        }
        let key = first + h.handed;
        h.handed += 1;
        h.live += 1;
        h.last_use = now;
        Some(Taken { helper: id, key })
    }

    /// A branch holding a key of helper `id` no longer needs protection (`one_phase`: it
    /// committed in one phase, so the helper's rollback waits for its slot's lock). Some(id)
    /// when the helper may go now (every key handed out, no live branch): it is marked
    /// retiring and the caller rolls it back.
    pub fn done(&mut self, id: u64, now: Instant, one_phase: bool) -> Option<u64> {
        let n = self.n;
        let h = self.helpers.get_mut(&id)?;
        h.live = (h.live - 1).max(0);
        h.lock_check |= one_phase;
        h.last_use = now;
        if h.stage == Stage::Ready && h.live == 0 && h.handed >= n {
            h.stage = Stage::Retiring;
            h.claimed = true;
            return Some(id);
        }
        None
    }

    /// Ready helpers with no live branch that handed out no key for `idle`: marked
    /// retiring, for the caller to roll back.
    pub fn idle(&mut self, now: Instant, idle: Duration) -> Vec<u64> {
        let mut out = Vec::new();
        for (id, h) in self.helpers.iter_mut() {
            if h.stage == Stage::Ready && h.live == 0 && now.saturating_duration_since(h.last_use) >= idle {
                h.stage = Stage::Retiring;
                h.claimed = true;
                out.push(*id);
            }
        }
        out
    }

    /// Retiring helpers nobody is rolling back (a rollback that failed), claimed for the
    /// caller to try again.
    pub fn claim_retiring(&mut self) -> Vec<u64> {
        let mut out = Vec::new();
        for (id, h) in self.helpers.iter_mut() {
            if h.stage == Stage::Retiring && !h.claimed {
                h.claimed = true;
                out.push(*id);
            }
        }
        out
    }

    /// Its rollback failed: left for the next `claim_retiring`.
    pub fn unclaim(&mut self, id: u64) {
        if let Some(h) = self.helpers.get_mut(&id) {
            h.claimed = false;
        }
    }

    /// A retiring helper was rolled back (or found gone): its block is free again.
    pub fn gone(&mut self, id: u64) {
        if let Some(h) = self.helpers.get(&id) {
            if h.stage == Stage::Retiring {
                let b = h.block;
                self.helpers.remove(&id);
                self.blocks.give(b);
            }
        }
    }

    /// Must the caller see no write-locked slot in its block before rolling it back?
    pub fn lock_check(&self, id: u64) -> bool {
        self.helpers.get(&id).is_some_and(|h| h.lock_check)
    }

    /// Its first key, while it is ours.
    pub fn first_of(&self, id: u64) -> Option<i32> {
        self.helpers.get(&id).map(|h| self.first_key(h.block))
    }

    pub fn has(&self, id: u64) -> bool {
        self.helpers.contains_key(&id)
    }

    /// Helpers in memory (any stage).
    pub fn helper_count(&self) -> usize {
        self.helpers.len()
    }

    /// Keys held by live branches (the listing's "slots in use").
    pub fn live_keys(&self) -> usize {
        self.helpers.values().map(|h| h.live.max(0) as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(p: &mut Pool, t: Instant) -> (u64, i32) {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1000);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let first = p.start(id, t).expect("a free block");
        p.prepared(id, t);
        (id, first)
    }

    #[test]
    fn a_block_serves_n_branches_then_goes_when_the_last_is_settled() {
        let t = Instant::now();
        let mut p = Pool::new(100, 10, 1);
        assert_eq!(p.take(t), None, "nothing prepared: the registration prepares inline");
        let (h, first) = ready(&mut p, t);
        assert_eq!(first, 1);
        let keys: Vec<i32> = (0..10).map(|_| p.take(t).unwrap().key).collect();
        assert_eq!(keys, (1..=10).collect::<Vec<_>>());
        assert_eq!(p.take(t), None, "exhausted");
        for _ in 0..9 {
            assert_eq!(p.done(h, t, false), None, "a branch of it may still commit");
        }
        assert_eq!(p.idle(t + IDLE * 10, IDLE), Vec::<u64>::new(), "never idle with a live branch");
        assert!(!p.lock_check(h));
        assert_eq!(p.done(h, t, false), Some(h), "last branch settled: it goes");
        assert!(p.claim_retiring().is_empty(), "claimed by the caller that got it");
        p.unclaim(h);
        assert_eq!(p.claim_retiring(), vec![h], "a failed rollback is tried again");
        p.gone(h);
        assert_eq!(p.helper_count(), 0);
    }

    #[test]
    fn a_helper_with_a_one_phase_branch_asks_for_the_lock_check() {
        let t = Instant::now();
        let mut p = Pool::new(10, 2, 1);
        let (h, _) = ready(&mut p, t);
        p.take(t).unwrap();
        p.take(t).unwrap();
        assert_eq!(p.done(h, t, true), None);
        assert!(p.lock_check(h), "one branch committed in one phase");
        assert_eq!(p.done(h, t, false), Some(h));
        assert!(p.lock_check(h), "kept until the helper goes");
    }

    #[test]
    fn n_branches_use_ceil_n_over_block_helpers() {
        let t = Instant::now();
        let mut p = Pool::new(4096, 10, 1);
        let mut helpers = std::collections::HashSet::new();
        for _ in 0..25 {
            let k = match p.take(t) {
                Some(k) => k,
                None => {
                    let (id, _) = ready(&mut p, t);
                    p.take_from(id, t).unwrap()
                }
            };
            helpers.insert(k.helper);
        }
        assert_eq!(helpers.len(), 3);
    }

    #[test]
    fn the_pool_keeps_ready_helpers_ahead_and_fills_one_block_first() {
        let t = Instant::now();
        let mut p = Pool::new(100, 10, 1);
        assert_eq!(p.wanted(), POOL_READY);
        let a = 1;
        p.start(a, t).unwrap();
        assert_eq!(p.wanted(), POOL_READY - 1, "a preparing helper counts as ahead");
        assert_eq!(p.take(t), None, "no key from a helper not prepared yet");
        p.prepared(a, t);
        let (b, _) = ready(&mut p, t);
        assert_eq!(p.wanted(), 0);
        let first = p.take(t).unwrap().helper;
        assert!(first == a || first == b);
        for _ in 0..9 {
            assert_eq!(p.take(t).unwrap().helper, first, "the started block is used up first");
        }
        assert_eq!(p.wanted(), 1);
    }

    #[test]
    fn a_partly_used_helper_goes_after_idle_and_a_failed_prepare_frees_its_block_only_when_sure() {
        let t = Instant::now();
        let mut p = Pool::new(20, 10, 1);
        let (h, _) = ready(&mut p, t);
        p.take(t).unwrap();
        assert_eq!(p.done(h, t, false), None, "keys left: kept for the next branches");
        assert!(p.idle(t + IDLE / 2, IDLE).is_empty());
        assert_eq!(p.idle(t + IDLE, IDLE), vec![h]);
        assert_eq!(p.take(t + IDLE), None, "a retiring helper hands out nothing");
        p.gone(h);
        assert!(p.start(7, t).is_some() && p.start(8, t).is_some());
        assert_eq!(p.start(9, t), None, "two blocks only");
        p.failed(7, true);
        p.failed(8, false);
        assert!(p.start(10, t).is_some(), "the sure failure's block is free again");
        assert_eq!(p.start(11, t), None, "the doubtful one's block waits for a sweep");
    }

    #[test]
    fn blocks_found_prepared_are_not_handed_out() {
        let t = Instant::now();
        let mut p = Pool::new(30, 10, 1);
        p.reserve_keys(11, 10); // a shared helper of an earlier run: block 2
        p.reserve_keys(25, 1); // an old one-per-branch helper on slot 25: block 3
        assert_eq!(p.start(1, t), Some(1));
        assert_eq!(p.start(2, t), None);
        p.give_keys(25, 1);
        assert_eq!(p.start(3, t), Some(21));
        assert_eq!(p.slots(), 30);
        assert_eq!(Pool::new(4096, 10, 1).slots(), 4090, "whole blocks only");
        assert_eq!(Pool::new(100, 0, 1).block_size(), 1, "clamped");
    }
}

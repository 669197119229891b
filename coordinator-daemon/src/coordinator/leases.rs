//! Ranges of gtids leased to clients for the one-request commit (cotx_protocol::leased):
//! a client draws its gtids from a range, prepares its branches under one this daemon has
//! never heard of, and sends them with its commit request.
//!
//! What this daemon must remember is which gtids of its epoch it handed out: for those,
//! "not in memory" no longer means "never begun or finished" (recovery records an abort
//! before any rollback, and no record is never answered "abort"). A range's lease runs
//! for its ttl (the client may commit meanwhile; recovery leaves its gtids alone); after
//! it, the range is remembered as lapsed for the rest of the process's life — forgetting
//! it would let recovery presume a gtid aborted (no record) while a commit request that
//! read the range before it was forgotten records commit. Lapsed ranges that touch are
//! merged, so when every client leases, the whole history is one range.

use crate::naming;
use crate::store::gtid_seq;
use cotx_protocol::leased::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Leased {
    first: u64,
    /// One past the last.
    end: u64,
    until: Instant,
}

#[derive(Default)]
pub struct Leases {
    /// In the order they were leased (so by `first`), disjoint.
    ranges: Mutex<Vec<Leased>>,
}

impl Leases {
    /// Leases `count` sequence numbers from `seq` (the epoch's one sequence, shared with
    /// begin) for `ttl`; returns the first.
    pub fn lease(&self, seq: &AtomicU64, count: u64, ttl: Duration) -> u64 {
        let now = Instant::now();
        let mut r = self.ranges.lock().unwrap();
        // Drawn under the lock: ranges are pushed in sequence order.
        let first = seq.fetch_add(count, Relaxed);
        merge_lapsed(&mut r, now);
        r.push(Leased { first, end: first + count, until: now + ttl });
        first
    }

    /// Where a gtid stands: NotLeased unless it is of our epoch `(node, nonce)` and of a
    /// range we leased.
    pub fn range_of(&self, gtid: &str, node: &str, nonce: u64) -> Range {
        if naming::gtid_epoch(gtid) != Some((node, nonce)) {
            return Range::NotLeased;
        }
        let Some(seq) = gtid_seq(gtid) else { return Range::NotLeased };
        let r = self.ranges.lock().unwrap();
        let i = r.partition_point(|l| l.end <= seq);
        match r.get(i) {
            Some(l) if l.first <= seq && Instant::now() < l.until => Range::Live,
            Some(l) if l.first <= seq => Range::Lapsed,
            _ => Range::NotLeased,
        }
    }

    /// Ranges remembered (after merging), for the gauge and tests.
    pub fn len(&self) -> usize {
        self.ranges.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Merges neighbouring lapsed ranges that touch (no gtid of begin between them).
fn merge_lapsed(r: &mut Vec<Leased>, now: Instant) {
    let mut out: Vec<Leased> = Vec::with_capacity(r.len());
    for l in r.drain(..) {
        match out.last_mut() {
            Some(p) if p.end == l.first && p.until <= now && l.until <= now => p.end = l.end,
            _ => out.push(l),
        }
    }
    *r = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_live_for_its_ttl_then_lapsed_for_good() {
        let l = Leases::default();
        let seq = AtomicU64::new(5);
        let first = l.lease(&seq, 10, Duration::from_millis(40));
        assert_eq!(first, 5);
        assert_eq!(seq.load(Relaxed), 15, "begin's next gtid is past the range");
        let g = |s| naming::new_gtid("n1", 7, s);
        assert_eq!(l.range_of(&g(5), "n1", 7), Range::Live);
        assert_eq!(l.range_of(&g(14), "n1", 7), Range::Live);
        assert_eq!(l.range_of(&g(15), "n1", 7), Range::NotLeased, "begin's");
        assert_eq!(l.range_of(&g(4), "n1", 7), Range::NotLeased);
        assert_eq!(l.range_of(&g(5), "n1", 8), Range::NotLeased, "another epoch's");
        assert_eq!(l.range_of(&naming::new_gtid("n2", 7, 5), "n1", 7), Range::NotLeased);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(l.range_of(&g(9), "n1", 7), Range::Lapsed);
    }

    #[test]
    fn lapsed_ranges_that_touch_merge_and_stay_known() {
        let l = Leases::default();
        let seq = AtomicU64::new(1);
        l.lease(&seq, 10, Duration::from_millis(1));
        l.lease(&seq, 10, Duration::from_millis(1));
        seq.fetch_add(1, Relaxed); // a begin in between
        l.lease(&seq, 10, Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        l.lease(&seq, 10, Duration::from_secs(60));
        assert_eq!(l.len(), 3, "[1,21) merged, [22,32) apart, the live one");
        let g = |s| naming::new_gtid("n1", 7, s);
        assert_eq!(l.range_of(&g(20), "n1", 7), Range::Lapsed);
        assert_eq!(l.range_of(&g(21), "n1", 7), Range::NotLeased);
        assert_eq!(l.range_of(&g(22), "n1", 7), Range::Lapsed);
        assert_eq!(l.range_of(&g(32), "n1", 7), Range::Live);
    }
}

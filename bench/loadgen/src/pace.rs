//! The open loop (`--rate R`): global transactions arrive at fixed times t0 + k / R, whatever
//! the completions. The client tasks are the pool of sessions that serve the arrivals: a
//! free task claims the next arrival and waits for its time; when every task is busy,
//! arrivals wait for one (their latency counts from the scheduled time, so a mode that
//! cannot keep up shows it in its latencies and in `missed`, never as a lower offered
//! rate). In the closed loop (no `--rate`) each task starts its next transaction as soon as
//! the last one is done, so a slower mode also issues fewer, and its servers' background
//! work is spread over fewer transactions: at a fixed rate the modes compare CPU per
//! transaction at equal throughput.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

pub struct Pace {
    t0: Instant,
    interval_s: f64,
    next: AtomicU64,
}

impl Pace {
    /// `rate`: transactions per second, over all clients; Err unless finite and above 0.
    pub fn new(t0: Instant, rate: f64) -> Result<Pace, String> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!("--rate {rate}: expected transactions per second above 0"));
        }
        Ok(Pace { t0, interval_s: 1.0 / rate, next: AtomicU64::new(0) })
    }

    /// The next arrival's scheduled time (each arrival is claimed once, by one client).
    pub fn claim(&self) -> Instant {
        self.at(self.next.fetch_add(1, Relaxed))
    }

    fn at(&self, k: u64) -> Instant {
        self.t0 + Duration::from_secs_f64(k as f64 * self.interval_s)
    }

    /// Arrivals scheduled in [from, to): what the window offered.
    pub fn scheduled_between(&self, from: Instant, to: Instant) -> u64 {
        let first = |t: Instant| (t.saturating_duration_since(self.t0).as_secs_f64() / self.interval_s).ceil() as u64;
        // ceil of the offsets: arrival k is in [from, to) iff first(from) <= k < first(to).
        let (a, b) = (first(from), first(to));
        // Floating point at an exact boundary: check the two ends against the times themselves.
        let a = if a > 0 && self.at(a - 1) >= from { a - 1 } else { a };
        let b = if b > 0 && self.at(b - 1) >= to { b - 1 } else { b };
        b.saturating_sub(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_evenly_spaced_and_counted_per_window() {
        let t0 = Instant::now();
        let p = Pace::new(t0, 100.0).unwrap();
        assert_eq!(p.claim(), t0);
        assert_eq!(p.claim(), t0 + Duration::from_millis(10));
        assert_eq!(p.claim(), t0 + Duration::from_millis(20));
        let s = |a: u64, b: u64| p.scheduled_between(t0 + Duration::from_millis(a), t0 + Duration::from_millis(b));
        // 1 s of warm-up then 5 s measured at 100/s: arrivals 100..=599.
        assert_eq!(s(1000, 6000), 500);
        assert_eq!(s(0, 1000), 100);
        assert_eq!(s(5, 15), 1); // only the arrival at 10 ms
        assert_eq!(s(10, 20), 1); // from is inclusive, to exclusive
        assert_eq!(s(3, 3), 0);
        // A fractional rate.
        let p = Pace::new(t0, 3.0).unwrap();
        assert_eq!(p.scheduled_between(t0, t0 + Duration::from_secs(10)), 30);
    }

    #[test]
    fn a_rate_must_be_positive() {
        let t0 = Instant::now();
        for bad in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            assert!(Pace::new(t0, bad).is_err(), "{bad}");
        }
    }
}

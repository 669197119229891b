//! This daemon's clock against the decision store's (pure: the renewal loop feeds it).
//!
//! A lease is renewed every `renew_ms` by the daemon's clock and expires `ttl_ms` after a
//! renewal by the store's. A daemon whose clock runs slow (a bad host clock, a VM's, a
//! faked one) renews too late by the store's clock: it loses its lease and takes it back
//! every few seconds, and its transactions are aborted by takeover, with nothing saying
//! why. Between two renewals the daemon measures its own elapsed time and the store's (the
//! lease's time left before a renewal, subtracted from the ttl), and says when their rate
//! stays off. Only a store with a clock of its own can tell: PostgreSQL's; SQLite's clock
//! is the daemon's.

/// A rate outside [1/TOLERANCE, TOLERANCE] for `SAMPLES` renewals in a row is reported.
pub const TOLERANCE: f64 = 1.25;
pub const SAMPLES: usize = 3;
/// Intervals shorter than this (by the store) are too short to measure against
/// scheduling noise.
pub const MIN_STORE_MS: i64 = 200;

#[derive(Debug, Default)]
pub struct ClockWatch {
    /// The rates (ours / the store's) of the last renewals, newest last.
    rates: Vec<f64>,
    reported: bool,
}

/// What the watch says after a renewal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClockNews {
    /// Off for `SAMPLES` renewals in a row: say it (once per episode).
    Skewed(f64),
    /// Back within the tolerance after being reported.
    Normal(f64),
    Nothing,
}

impl ClockWatch {
    /// One interval between renewals: `local_ms` by our clock, `store_left_ms` the lease's
    /// time left by the store's clock just before this renewal.
    pub fn sample(&mut self, local_ms: u64, ttl_ms: u64, store_left_ms: i64) -> ClockNews {
        let store_ms = ttl_ms as i64 - store_left_ms;
        if store_ms < MIN_STORE_MS {
            return ClockNews::Nothing;
        }
        let rate = local_ms as f64 / store_ms as f64;
        self.rates.push(rate);
        if self.rates.len() > SAMPLES {
            self.rates.remove(0);
        }
        let off = |r: &f64| *r > TOLERANCE || *r < 1.0 / TOLERANCE;
        if self.rates.len() == SAMPLES && self.rates.iter().all(off) && !self.reported {
            self.reported = true;
            return ClockNews::Skewed(self.rate());
        }
        if self.reported && !off(&rate) {
            self.reported = false;
            self.rates.clear();
            return ClockNews::Normal(rate);
        }
        ClockNews::Nothing
    }

    /// The mean rate of the last renewals (1.0 when nothing was measured).
    pub fn rate(&self) -> f64 {
        if self.rates.is_empty() {
            1.0
        } else {
            self.rates.iter().sum::<f64>() / self.rates.len() as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_clock_is_said_once_and_its_recovery_too() {
        let mut w = ClockWatch::default();
        // ttl 5000, renewals every 1500 ms by our clock, 7500 ms by the store's (x0.2):
        // the lease ran out 2500 ms before each renewal.
        assert_eq!(w.sample(1500, 5000, -2500), ClockNews::Nothing);
        assert_eq!(w.sample(1500, 5000, -2500), ClockNews::Nothing);
        match w.sample(1500, 5000, -2500) {
            ClockNews::Skewed(r) => assert!((r - 0.2).abs() < 1e-9, "{r}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(w.sample(1500, 5000, -2500), ClockNews::Nothing, "said once");
        assert!(matches!(w.sample(1500, 5000, 3500), ClockNews::Normal(_)));
        assert_eq!(w.rate(), 1.0);
    }

    #[test]
    fn a_normal_clock_and_noise_say_nothing() {
        let mut w = ClockWatch::default();
        for left in [3500, 3400, 3600, 3450, 3000] {
            assert_eq!(w.sample(1500, 5000, left), ClockNews::Nothing);
        }
        // One late renewal (a pause) among normal ones: not a clock.
        assert_eq!(w.sample(1500, 5000, -4000), ClockNews::Nothing);
        assert_eq!(w.sample(1500, 5000, 3500), ClockNews::Nothing);
        // Too short to measure.
        assert_eq!(w.sample(10, 5000, 4990), ClockNews::Nothing);
    }

    #[test]
    fn a_fast_clock_is_said_too() {
        let mut w = ClockWatch::default();
        let news: Vec<ClockNews> = (0..3).map(|_| w.sample(1500, 5000, 5000 - 500)).collect();
        assert!(matches!(news[2], ClockNews::Skewed(r) if (r - 3.0).abs() < 1e-9), "{news:?}");
    }
}

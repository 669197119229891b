//! Gauges computed from the live state at scrape time: filled by the coordinator
//! (coordinator/housekeeping.rs), rendered by telemetry/metrics.rs. Here, below both, so
//! that neither imports the other.

#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    pub in_doubt: usize,
    pub active: usize,
    pub oldest_in_doubt_s: f64,
    pub quarantined: usize,
    pub unconfigured_branches: usize,
    pub adopted_nodes: usize,
}

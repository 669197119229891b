//! Prometheus text metrics: plain atomics, rendered on demand.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Decision latency buckets in seconds (commit request → decision durable).
const BUCKETS: [f64; 12] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

#[derive(Default)]
pub struct Metrics {
    pub begun: AtomicU64,
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub one_phase: AtomicU64,
    pub decided_in_participant: AtomicU64,
    pub timeouts: AtomicU64,
    pub refused_requests: AtomicU64,
    pub recovery_commit: AtomicU64,
    pub recovery_rollback: AtomicU64,
    pub recovery_runs: AtomicU64,
    pub recovery_errors: AtomicU64,
    pub completion_commit: AtomicU64,
    pub completion_rollback: AtomicU64,
    pub completion_retries: AtomicU64,
    pub incidents: AtomicU64,
    pub forced: AtomicU64,
    /// Begins refused because limits.max_active undecided transactions existed.
    pub overloaded: AtomicU64,
    /// Connections refused because limits.max_connections were open.
    pub connections_refused: AtomicU64,
    /// Prepared branches of our node from an epoch our store does not know (left alone).
    pub foreign_branches: AtomicU64,
    pub takeovers: AtomicU64,
    /// Our own node's grant found gone at a renewal (lease.rs, `regain`).
    pub lease_losses: AtomicU64,
    lat_buckets: [AtomicU64; 12],
    lat_count: AtomicU64,
    lat_sum_us: AtomicU64,
}

impl Metrics {
    pub fn observe_decision(&self, secs: f64) {
        for (i, b) in BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.lat_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.lat_count.fetch_add(1, Relaxed);
        self.lat_sum_us.fetch_add((secs * 1e6) as u64, Relaxed);
    }

    /// `g`: gauges the caller computes from the live state.
    pub fn render(&self, g: &crate::telemetry::gauges::Gauges, store_batches: u64, store_ops: u64, resources_up: &[(String, bool)]) -> String {
        let (in_doubt, active) = (g.in_doubt, g.active);
        let mut s = String::new();
        let c = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let _ = writeln!(s, "# HELP cotx_transactions_total Global transactions by outcome.\n# TYPE cotx_transactions_total counter");
        for (o, v) in [("commit", &self.committed), ("abort", &self.aborted), ("one_phase", &self.one_phase)] {
            let _ = writeln!(s, "cotx_transactions_total{{outcome=\"{o}\"}} {}", v.load(Relaxed));
        }
        c(&mut s, "cotx_transactions_begun_total", "Global transactions begun.", self.begun.load(Relaxed));
        c(&mut s, "cotx_decided_in_participant_total", "Commits handed to a decision branch (co.decide).", self.decided_in_participant.load(Relaxed));
        c(&mut s, "cotx_timeouts_total", "Transactions aborted by timeout.", self.timeouts.load(Relaxed));
        c(&mut s, "cotx_refused_requests_total", "API requests refused with a 4xx.", self.refused_requests.load(Relaxed));
        let _ = writeln!(s, "# HELP cotx_recovery_actions_total Branches finished by recovery or completion.\n# TYPE cotx_recovery_actions_total counter");
        for (k, v) in [
            ("recovery_commit", &self.recovery_commit),
            ("recovery_rollback", &self.recovery_rollback),
            ("completion_commit", &self.completion_commit),
            ("completion_rollback", &self.completion_rollback),
            ("retry", &self.completion_retries),
            ("forced", &self.forced),
        ] {
            let _ = writeln!(s, "cotx_recovery_actions_total{{action=\"{k}\"}} {}", v.load(Relaxed));
        }
        c(&mut s, "cotx_recovery_runs_total", "Recovery passes.", self.recovery_runs.load(Relaxed));
        c(&mut s, "cotx_recovery_errors_total", "Recovery passes that could not reach a resource.", self.recovery_errors.load(Relaxed));
        c(&mut s, "cotx_incidents_total", "Branches that did not reach the decided outcome (e.g. MariaDB 1402).", self.incidents.load(Relaxed));
        let _ = writeln!(s, "# HELP cotx_in_doubt Transactions with a prepared, unfinished branch.\n# TYPE cotx_in_doubt gauge\ncotx_in_doubt {in_doubt}");
        let _ = writeln!(s, "# HELP cotx_active Undecided transactions.\n# TYPE cotx_active gauge\ncotx_active {active}");
        let gauge = |s: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(&mut s, "cotx_in_doubt_oldest_seconds", "Age of the oldest transaction with a prepared, unfinished branch.", g.oldest_in_doubt_s);
        gauge(&mut s, "cotx_quarantined", "Transactions stopped because their decision record cannot be read (operator: force).", g.quarantined as f64);
        gauge(&mut s, "cotx_unconfigured_resource_branches", "Prepared branches on resources no longer in the config.", g.unconfigured_branches as f64);
        gauge(&mut s, "cotx_adopted_nodes", "Nodes taken over from daemons whose lease ran out.", g.adopted_nodes as f64);
        c(&mut s, "cotx_takeovers_total", "Nodes taken over.", self.takeovers.load(Relaxed));
        c(&mut s, "cotx_lease_losses_total", "Times this daemon found its own node's lease grant gone and reclaimed the node (memory reconciled with the store).", self.lease_losses.load(Relaxed));
        c(&mut s, "cotx_foreign_branches_total", "Prepared branches of our node id from an epoch our store does not know (left alone).", self.foreign_branches.load(Relaxed));
        c(&mut s, "cotx_overloaded_total", "Begins refused with 429 (limits.max_active).", self.overloaded.load(Relaxed));
        c(&mut s, "cotx_connections_refused_total", "Connections refused (limits.max_connections).", self.connections_refused.load(Relaxed));
        c(&mut s, "cotx_store_batches_total", "Durable store writes (syncs).", store_batches);
        c(&mut s, "cotx_store_ops_total", "Store operations (decisions, deletions, audit).", store_ops);
        let _ = writeln!(s, "# HELP cotx_resource_up Whether the last contact with a resource worked.\n# TYPE cotx_resource_up gauge");
        for (n, up) in resources_up {
            let _ = writeln!(s, "cotx_resource_up{{resource=\"{n}\"}} {}", *up as u8);
        }
        let _ = writeln!(s, "# HELP cotx_decision_seconds Commit request to durable decision.\n# TYPE cotx_decision_seconds histogram");
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(s, "cotx_decision_seconds_bucket{{le=\"{b}\"}} {}", self.lat_buckets[i].load(Relaxed));
        }
        let n = self.lat_count.load(Relaxed);
        let _ = writeln!(s, "cotx_decision_seconds_bucket{{le=\"+Inf\"}} {n}");
        let _ = writeln!(s, "cotx_decision_seconds_sum {}", self.lat_sum_us.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(s, "cotx_decision_seconds_count {n}");
        s
    }
}

/// Enforcement per resource (`cotx_resource_enforcement{resource, mode}` = 1 for its
/// current mode: engine, client, none, unknown, refused), client mode's live holds, and
/// MariaDB restart gates closed.
pub fn render_enforcement(modes: &[(String, serde_json::Value)], held: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "# HELP cotx_resource_enforcement How commitment ordering is enforced at a resource (1 for its current mode).\n# TYPE cotx_resource_enforcement gauge");
    for (n, v) in modes {
        let mode = v["mode"].as_str().unwrap_or("unknown");
        let _ = writeln!(s, "cotx_resource_enforcement{{resource=\"{n}\",mode=\"{mode}\"}} 1");
    }
    let _ = writeln!(s, "# HELP cotx_client_mode_holds Live client-mode branches holding a shim slot (and on PostgreSQL a helper transaction).\n# TYPE cotx_client_mode_holds gauge\ncotx_client_mode_holds {held}");
    let _ = writeln!(s, "# HELP cotx_restart_gate_closed Client-mode MariaDB resources refusing new branches after a restart.\n# TYPE cotx_restart_gate_closed gauge");
    for (n, v) in modes {
        if v["mode"] == "client" {
            let _ = writeln!(s, "cotx_restart_gate_closed{{resource=\"{n}\"}} {}", v["restart_gate"].is_string() as u8);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn histogram_is_cumulative() {
        let m = super::Metrics::default();
        m.observe_decision(0.0003);
        m.observe_decision(0.2);
        let g = crate::telemetry::gauges::Gauges { in_doubt: 1, active: 2, ..Default::default() };
        let t = m.render(&g, 3, 4, &[("pg".into(), true)]);
        assert!(t.contains("cotx_decision_seconds_bucket{le=\"0.0005\"} 1"), "{t}");
        assert!(t.contains("cotx_decision_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(t.contains("cotx_in_doubt 1"));
        assert!(t.contains("cotx_resource_up{resource=\"pg\"} 1"));
    }
}

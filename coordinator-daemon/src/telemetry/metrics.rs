//! Prometheus metrics: plain atomics bumped at the call sites (`c.metrics.x.fetch_add`),
//! rendered on demand through `prometheus-client`'s Prometheus text (0.0.4) encoder.
//!
//! Why a `Collector` over a snapshot rather than the crate's own `Counter`s: the counters
//! are public `AtomicU64`s that other modules bump directly, and several series are not
//! ours to count (the store's batches, the live gauges, resources' reachability), so each
//! scrape takes one snapshot and the collector describes it. The 0.0.4 encoder (not the
//! OpenMetrics one) keeps the exposition as it was: `# TYPE cotx_x_total counter` with the
//! `_total` in the family name, and no `# EOF`, so `render_enforcement` can be appended.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Decision latency buckets in seconds (commit request → decision durable).
const BUCKETS: [f64; 12] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

#[derive(Default)]
pub struct Metrics {
    pub begun: AtomicU64,
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub one_phase: AtomicU64,
    pub decided_in_participant: AtomicU64,
    /// Commits of all-read-only transactions decided in memory, with no store sync.
    pub read_only_commits: AtomicU64,
    /// Ranges of gtids leased for the one-request commit.
    pub gtid_leases: AtomicU64,
    pub timeouts: AtomicU64,
    pub refused_requests: AtomicU64,
    /// Every API request answered (the requests per transaction of a workload).
    pub requests: AtomicU64,
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
    /// Deadlocks across databases (coordinator/deadlocks.rs): passes that read lock waits,
    /// cycles found, victims aborted, waiting statements cancelled (victims and aborts),
    /// and the victims' summed age when aborted (an upper bound of how long each waited).
    pub deadlock_checks: AtomicU64,
    pub deadlock_cycles: AtomicU64,
    pub deadlock_victims: AtomicU64,
    pub statements_cancelled: AtomicU64,
    pub deadlock_victim_age_ms: AtomicU64,
    /// Branches reported failed (a refused prepare, a failed statement: each aborts its
    /// transaction), by resource: where a storm of retried transactions comes from.
    pub branch_failures: Mutex<BTreeMap<String, u64>>,
    /// Branch registrations refused by the resource's enforcement (restart gate, slots
    /// all held, mode unknown or refused), by resource and refusal code: the 503s a storm
    /// of retries meets before any branch runs.
    pub branch_refusals: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// This daemon's clock rate against the decision store's, x1000 (ha/clock.rs; 1000
    /// with a SQLite store, whose clock is ours).
    pub clock_rate_milli: AtomicU64,
    /// Per bucket, the observations that fell in it and in no lower one (not cumulative:
    /// the encoder accumulates them); the last slot holds those above 1 s.
    lat_buckets: [AtomicU64; 13],
    lat_count: AtomicU64,
    lat_sum_us: AtomicU64,
}

impl Metrics {
    pub fn observe_decision(&self, secs: f64) {
        let i = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(BUCKETS.len());
        self.lat_buckets[i].fetch_add(1, Relaxed);
        self.lat_count.fetch_add(1, Relaxed);
        self.lat_sum_us.fetch_add((secs * 1e6) as u64, Relaxed);
    }

    pub fn branch_failed(&self, resource: &str) {
        *self.branch_failures.lock().unwrap().entry(resource.to_string()).or_default() += 1;
    }

    pub fn branch_refused(&self, resource: &str, code: &'static str) {
        *self.branch_refusals.lock().unwrap().entry((resource.to_string(), code)).or_default() += 1;
    }

    /// `g`: gauges the caller computes from the live state.
    pub fn render(
        &self,
        g: &crate::telemetry::gauges::Gauges,
        store_batches: u64,
        store_ops: u64,
        resources_up: &[(String, bool)],
    ) -> String {
        let v = |a: &AtomicU64| a.load(Relaxed);
        let counter = |name, help, n| Series { name, help, kind: Kind::Counter(n) };
        let gauge = |name, help, x: f64| Series { name, help, kind: Kind::Gauge(x) };
        let labelled = |name, help, kind, label, rows: Vec<(String, f64)>| Series {
            name,
            help,
            kind: Kind::Labelled { kind, label, rows },
        };
        let count = |rows: &[(&str, &AtomicU64)]| rows.iter().map(|(k, a)| (k.to_string(), v(a) as f64)).collect();
        // Every resource has its row from the start (0), so a rate over it is never empty.
        let mut failures: BTreeMap<String, u64> = resources_up.iter().map(|(n, _)| (n.clone(), 0)).collect();
        failures.extend(self.branch_failures.lock().unwrap().iter().map(|(n, x)| (n.clone(), *x)));
        let mut buckets: Vec<(f64, u64)> = BUCKETS.iter().zip(&self.lat_buckets).map(|(b, n)| (*b, v(n))).collect();
        buckets.push((f64::INFINITY, v(&self.lat_buckets[BUCKETS.len()])));
        // Same order, names, HELP and labels as the hand-written text this replaced.
        let series = vec![
            labelled("cotx_transactions", "Global transactions by outcome.", MetricType::Counter, "outcome",
                count(&[("commit", &self.committed), ("abort", &self.aborted), ("one_phase", &self.one_phase)])),
            counter("cotx_transactions_begun", "Global transactions begun.", v(&self.begun)),
            counter("cotx_decided_in_participant", "Commits handed to a decision branch (co.decide).", v(&self.decided_in_participant)),
            counter("cotx_read_only_commits", "Commits of all-read-only transactions decided in memory (no store sync).", v(&self.read_only_commits)),
            counter("cotx_gtid_leases", "Ranges of gtids leased for the one-request commit.", v(&self.gtid_leases)),
            counter("cotx_timeouts", "Transactions aborted by timeout.", v(&self.timeouts)),
            counter("cotx_refused_requests", "API requests refused with a 4xx.", v(&self.refused_requests)),
            counter("cotx_requests", "API requests answered.", v(&self.requests)),
            labelled("cotx_recovery_actions", "Branches finished by recovery or completion.", MetricType::Counter, "action",
                count(&[
                    ("recovery_commit", &self.recovery_commit),
                    ("recovery_rollback", &self.recovery_rollback),
                    ("completion_commit", &self.completion_commit),
                    ("completion_rollback", &self.completion_rollback),
                    ("retry", &self.completion_retries),
                    ("forced", &self.forced),
                ])),
            labelled("cotx_branch_failures", "Branches reported failed (refused prepare, failed statement), each aborting its transaction, by resource.", MetricType::Counter, "resource",
                failures.into_iter().map(|(n, x)| (n, x as f64)).collect()),
            Series { name: "cotx_branch_refusals", help: "Branch registrations refused by the resource's enforcement (restart_gate, resource_busy, resource_unavailable, resource_refused), by resource and code.",
                kind: Kind::MultiCounter(self.branch_refusals.lock().unwrap().iter()
                    .map(|((r, code), n)| (vec![("resource", r.clone()), ("code", code.to_string())], *n)).collect()) },
            counter("cotx_recovery_runs", "Recovery passes.", v(&self.recovery_runs)),
            counter("cotx_recovery_errors", "Recovery passes that could not reach a resource.", v(&self.recovery_errors)),
            counter("cotx_incidents", "Branches that did not reach the decided outcome (e.g. MariaDB 1402).", v(&self.incidents)),
            gauge("cotx_in_doubt", "Transactions with a prepared, unfinished branch.", g.in_doubt as f64),
            gauge("cotx_active", "Undecided transactions.", g.active as f64),
            gauge("cotx_in_doubt_oldest_seconds", "Age of the oldest transaction with a prepared, unfinished branch.", g.oldest_in_doubt_s),
            gauge("cotx_quarantined", "Transactions stopped because their decision record cannot be read (operator: force).", g.quarantined as f64),
            gauge("cotx_unconfigured_resource_branches", "Prepared branches on resources no longer in the config.", g.unconfigured_branches as f64),
            gauge("cotx_adopted_nodes", "Nodes taken over from daemons whose lease ran out.", g.adopted_nodes as f64),
            counter("cotx_takeovers", "Nodes taken over.", v(&self.takeovers)),
            counter("cotx_lease_losses", "Times this daemon found its own node's lease grant gone and reclaimed the node (memory reconciled with the store).", v(&self.lease_losses)),
            counter("cotx_deadlock_checks", "Passes that read the resources' lock waits (only while a transaction has been active timeouts.deadlock_check_ms).", v(&self.deadlock_checks)),
            counter("cotx_deadlock_cycles", "Wait cycles across databases found.", v(&self.deadlock_cycles)),
            counter("cotx_deadlock_victims", "Transactions aborted to break a wait cycle across databases (retryable: deadlock_victim).", v(&self.deadlock_victims)),
            counter("cotx_deadlock_victim_age_ms", "Summed age in ms of the deadlock victims when aborted (divided by victims: how long a cycle lasted at most).", v(&self.deadlock_victim_age_ms)),
            counter("cotx_statements_cancelled", "Waiting statements cancelled: of deadlock victims, and of transactions aborted by timeout or an operator.", v(&self.statements_cancelled)),
            gauge("cotx_clock_rate", "This daemon's clock rate against the decision store's (1: in step; PostgreSQL store only).", match v(&self.clock_rate_milli) { 0 => 1.0, m => m as f64 / 1e3 }),
            counter("cotx_foreign_branches", "Prepared branches of our node id from an epoch our store does not know (left alone).", v(&self.foreign_branches)),
            counter("cotx_overloaded", "Begins refused with 429 (limits.max_active).", v(&self.overloaded)),
            counter("cotx_connections_refused", "Connections refused (limits.max_connections).", v(&self.connections_refused)),
            counter("cotx_store_batches", "Durable store writes (syncs).", store_batches),
            counter("cotx_store_ops", "Store operations (decisions, deletions, audit).", store_ops),
            labelled("cotx_resource_up", "Whether the last contact with a resource worked.", MetricType::Gauge, "resource",
                resources_up.iter().map(|(n, up)| (n.clone(), *up as u8 as f64)).collect()),
            Series { name: "cotx_decision_seconds", help: "Commit request to durable decision.",
                kind: Kind::Histogram { buckets, count: v(&self.lat_count), sum: v(&self.lat_sum_us) as f64 / 1e6 } },
        ];
        encode(series)
    }
}

/// Enforcement per resource (`cotx_resource_enforcement{resource, mode}` = 1 for its
/// current mode: engine, client, none, unknown, refused), client mode's live holds, and
/// MariaDB restart gates closed, and PostgreSQL's shared helpers (`helpers`: prepared
/// and rolled back since start, in memory now).
pub fn render_enforcement(modes: &[(String, serde_json::Value)], held: usize, helpers: (u64, u64, usize)) -> String {
    let rows = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| -> Vec<(String, f64)> {
        modes.iter().filter_map(|(n, v)| f(v).map(|x| (n.clone(), x))).collect()
    };
    let enforcement = modes
        .iter()
        .map(|(n, v)| {
            (vec![("resource", n.clone()), ("mode", v["mode"].as_str().unwrap_or("unknown").to_string())], 1.0)
        })
        .collect();
    encode(vec![
        Series {
            name: "cotx_resource_enforcement",
            help: "How commitment ordering is enforced at a resource (1 for its current mode).",
            kind: Kind::MultiLabelled(enforcement),
        },
        Series {
            name: "cotx_client_mode_holds",
            help: "Live client-mode branches holding a shim slot (and on PostgreSQL a helper transaction).",
            kind: Kind::Gauge(held as f64),
        },
        Series {
            name: "cotx_client_helpers_prepared",
            help: "PostgreSQL client-mode helper transactions prepared (one per block of branches).",
            kind: Kind::Counter(helpers.0),
        },
        Series {
            name: "cotx_client_helpers_rolled_back",
            help: "PostgreSQL client-mode helper transactions rolled back by this daemon's pool.",
            kind: Kind::Counter(helpers.1),
        },
        Series {
            name: "cotx_client_helpers_live",
            help: "PostgreSQL client-mode helper transactions of this daemon preparing, ready or retiring.",
            kind: Kind::Gauge(helpers.2 as f64),
        },
        Series {
            name: "cotx_restart_gate_closed",
            help: "Client-mode MariaDB resources refusing new branches after a restart.",
            kind: Kind::Labelled {
                kind: MetricType::Gauge,
                label: "resource",
                rows: rows(&|v| (v["mode"] == "client").then(|| v["restart_gate"].is_string() as u8 as f64)),
            },
        },
    ])
}

/// One metric family of a scrape, its values already read.
#[derive(Debug)]
struct Series {
    /// For counters without the `_total` the encoder appends.
    name: &'static str,
    help: &'static str,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Counter(u64),
    Gauge(f64),
    /// One label; counters' values are whole numbers kept as f64.
    Labelled {
        kind: MetricType,
        label: &'static str,
        rows: Vec<(String, f64)>,
    },
    /// Gauges with several labels.
    MultiLabelled(Vec<(Vec<(&'static str, String)>, f64)>),
    /// Counters with several labels.
    MultiCounter(Vec<(Vec<(&'static str, String)>, u64)>),
    /// Non-cumulative bucket counts, the last one +Inf.
    Histogram {
        buckets: Vec<(f64, u64)>,
        count: u64,
        sum: f64,
    },
}

/// The scrape as a `Collector`: a registry holds it for the one encoding.
#[derive(Debug)]
struct Scrape(Vec<Series>);

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for s in &self.0 {
            match &s.kind {
                Kind::Counter(n) => {
                    let c = ConstCounter::new(*n);
                    c.encode(enc.encode_descriptor(s.name, s.help, None, c.metric_type())?)?;
                }
                Kind::Gauge(x) => {
                    let m = enc.encode_descriptor(s.name, s.help, None, MetricType::Gauge)?;
                    match whole(*x) {
                        Some(n) => ConstGauge::new(n).encode(m)?,
                        None => ConstGauge::new(*x).encode(m)?,
                    }
                }
                Kind::Labelled { kind, label, rows } => {
                    let mut m = enc.encode_descriptor(s.name, s.help, None, *kind)?;
                    for (value, x) in rows {
                        let labels = [(*label, value.as_str())];
                        let mut row = m.encode_family(&labels)?;
                        match kind {
                            MetricType::Counter => row
                                .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
                                    &(*x as u64),
                                    None,
                                )?,
                            _ => gauge_value(&mut row, *x)?,
                        }
                    }
                }
                Kind::MultiLabelled(rows) => {
                    let mut m = enc.encode_descriptor(s.name, s.help, None, MetricType::Gauge)?;
                    for (labels, x) in rows {
                        gauge_value(&mut m.encode_family(labels)?, *x)?;
                    }
                }
                Kind::MultiCounter(rows) => {
                    let mut m = enc.encode_descriptor(s.name, s.help, None, MetricType::Counter)?;
                    for (labels, n) in rows {
                        m.encode_family(labels)?
                            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(n, None)?;
                    }
                }
                Kind::Histogram { buckets, count, sum } => {
                    let mut m = enc.encode_descriptor(s.name, s.help, None, MetricType::Histogram)?;
                    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(*sum, *count, buckets, None)?;
                }
            }
        }
        Ok(())
    }
}

/// Whole gauge values print as integers ("1", not the encoder's "1.0"), as before.
fn whole(x: f64) -> Option<i64> {
    (x.fract() == 0.0 && x.abs() < 9e15).then_some(x as i64)
}

fn gauge_value(m: &mut prometheus_client::encoding::MetricEncoder, x: f64) -> Result<(), std::fmt::Error> {
    match whole(x) {
        Some(n) => m.encode_gauge(&n),
        None => m.encode_gauge(&x),
    }
}

fn encode(series: Vec<Series>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape(series)));
    let mut s = String::with_capacity(4096);
    // Writing to a String cannot fail; the collector itself returns no error of its own.
    prometheus_client::encoding::prometheus_text::encode(&mut s, &registry).expect("metrics text");
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
        assert!(t.contains("cotx_branch_failures_total{resource=\"pg\"} 0"), "{t}");
        m.branch_failed("pg");
        m.branch_failed("gone");
        let t = m.render(&g, 3, 4, &[("pg".into(), true)]);
        assert!(t.contains("cotx_branch_failures_total{resource=\"pg\"} 1"), "{t}");
        assert!(t.contains("cotx_branch_failures_total{resource=\"gone\"} 1"), "{t}");
        assert!(t.contains("# TYPE cotx_branch_refusals_total counter\n"), "{t}");
        m.branch_refused("my", "restart_gate");
        m.branch_refused("my", "restart_gate");
        let t = m.render(&g, 3, 4, &[("pg".into(), true)]);
        assert!(t.contains("cotx_branch_refusals_total{resource=\"my\",code=\"restart_gate\"} 2"), "{t}");
    }

    /// The cost of one scrape's text (`cargo test --release -p coordinator-daemon render_cost -- --ignored --nocapture`):
    /// about 21 us through prometheus-client against 15 us for the hand-written text it
    /// replaced (same 5.4 kB, byte for byte), at one scrape every few seconds.
    #[test]
    #[ignore]
    fn render_cost() {
        let m = super::Metrics::default();
        for i in 0..1000 {
            m.observe_decision(i as f64 / 3000.0);
            m.committed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let g =
            crate::telemetry::gauges::Gauges { in_doubt: 1, active: 2, oldest_in_doubt_s: 1.5, ..Default::default() };
        let up: Vec<(String, bool)> = (0..4).map(|i| (format!("r{i}"), i % 2 == 0)).collect();
        let modes: Vec<(String, serde_json::Value)> = (0..4)
            .map(|i| {
                (
                    format!("r{i}"),
                    serde_json::json!({"mode": if i % 2 == 0 { "client" } else { "engine" }, "restart_gate": null}),
                )
            })
            .collect();
        let once = || m.render(&g, 3, 4, &up) + &super::render_enforcement(&modes, 2, (3, 1, 2));
        std::fs::write(std::env::var("COTX_METRICS_DUMP").unwrap_or("/dev/null".into()), once()).unwrap();
        let n = 20_000;
        let t = std::time::Instant::now();
        let mut bytes = 0;
        for _ in 0..n {
            bytes += once().len();
        }
        println!("render: {:.2} us per scrape ({} bytes)", t.elapsed().as_secs_f64() * 1e6 / n as f64, bytes / n);
    }
}

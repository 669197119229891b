//! `cotx-coordinator bench-store`: decisions per second of the store alone.
//!
//! SQLite (`--path`): one store, `clients` concurrent writers; with `--backend applog` the
//! same writers and group-commit thread write to the append-only decision log instead
//! (store/applog, `[store] kind = "log"`), opened as the daemon opens it. PostgreSQL (`--pg-dsn`):
//! `writers` store handles on one shared table, each with its own connection, writer
//! thread (group commit) and node id under a lease it claimed, as that many daemons
//! sharing a replicated store would be; every decision is fenced by its node's grant as
//! the daemon writes it (the lease row read FOR SHARE in the same transaction).

use crate::config;
use crate::naming;
use crate::serve::open_store;
use crate::state;
use crate::store::{self, Claim, Decided, Token};

/// What `bench-store --path` runs.
pub struct SqliteBench {
    /// Decisions in total.
    pub n: usize,
    /// Concurrent writers.
    pub clients: usize,
    pub group_commit: bool,
    /// Each decision is then marked finished, as the daemon does once its branches are
    /// done (a write nobody waits for, riding with a later sync).
    pub finish: bool,
    /// Each writer pauses this long after each decision: the pace of transactions that
    /// spend their time in the databases, so that the store's thread waits for work.
    pub pace: Option<std::time::Duration>,
    /// store.commit_delay_us.
    pub commit_delay_us: u64,
    pub backend: Backend,
    /// store.sync_method (the log only).
    pub sync_method: crate::config::SyncMethod,
}

/// What `bench-store --path` writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The daemon's SQLite store.
    Sqlite,
    /// The daemon's append-only decision log (`[store] kind = "log"`, store/applog).
    Applog,
}

/// The store `bench-store --path` measures, as the daemon opens it with the same
/// batching: the SQLite store or the append-only log.
fn open(path: &str, b: &SqliteBench) -> Result<store::Store, String> {
    let (path, group_commit, max_batch, commit_delay_us) = (path.to_string(), b.group_commit, 1024, b.commit_delay_us);
    let cfg = match b.backend {
        Backend::Sqlite => config::StoreConfig::Sqlite { path, group_commit, max_batch, commit_delay_us },
        Backend::Applog => {
            config::StoreConfig::Log { path, group_commit, max_batch, commit_delay_us, sync_method: b.sync_method }
        }
    };
    Ok(open_store(&cfg)?)
}

/// Decisions/s of the SQLite store alone, the decisions written as the daemon writes
/// them: gtids of a registered epoch, each fenced by the node's lease grant. Also prints
/// the store thread's CPU per decision: where the in-process coordinator's profile puts
/// most of its cost, measured here without the databases beside it.
pub fn bench_store(path: &str, b: &SqliteBench) -> Result<(), String> {
    let SqliteBench { n, clients, group_commit: group, finish, pace, commit_delay_us, backend, .. } = *b;
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(format!("{path}-wal"));
    let _ = std::fs::remove_file(format!("{path}-shm"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let s = open(path, b)?;
        let (node, nonce) = ("bench".to_string(), state::unix_ms());
        let token = claim(&s, &node, "bench-store", path).await?;
        s.write(store::Op::RegisterEpoch { node: node.clone(), nonce }).await?;
        let (cpu0, batches0) = (store::store_thread_cpu_s(), s.stats.batches.load(std::sync::atomic::Ordering::Relaxed));
        let t0 = std::time::Instant::now();
        let mut hs = vec![];
        for c in 0..clients {
            let (s, node, token) = (s.clone(), node.clone(), token.clone());
            let per = n / clients + usize::from(c < n % clients);
            hs.push(tokio::spawn(async move {
                for i in 0..per {
                    let gtid = decide_commit(&s, &node, nonce, c, i, &token).await?;
                    if finish {
                        s.write_later(store::Op::Forget(gtid));
                    }
                    if let Some(p) = pace {
                        tokio::time::sleep(p).await;
                    }
                }
                Ok::<(), String>(())
            }));
        }
        for h in hs {
            h.await.map_err(|e| e.to_string())??;
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = store::store_thread_cpu_s() - cpu0;
        let batches = s.stats.batches.load(std::sync::atomic::Ordering::Relaxed) - batches0;
        println!(
            "{{\"store\": \"{}\", \"group_commit\": {group}, \"finish\": {finish}, \"pace_ms\": {}, \"commit_delay_us\": {commit_delay_us}, \"decisions\": {n}, \"clients\": {clients}, \"seconds\": {secs:.3}, \"decisions_per_s\": {:.0}, \"syncs\": {batches}, \"decisions_per_sync\": {:.1}, \"store_cpu_ms_per_decision\": {:.4}}}",
            match backend {
                Backend::Sqlite => "sqlite",
                Backend::Applog => "applog",
            },
            pace.map_or(0.0, |p| p.as_secs_f64() * 1000.0),
            n as f64 / secs,
            n as f64 / batches.max(1) as f64,
            cpu * 1000.0 / n as f64
        );
        Ok(())
    })
}

/// The lease of `node` for `holder`, as a daemon claims it at start (`store`: where, for
/// the refusal). fence_expired: a node row left by a killed earlier run is taken over once
/// expired.
async fn claim(s: &store::Store, node: &str, holder: &str, store: &str) -> Result<Token, String> {
    match s.claim_node(node, holder, "http://127.0.0.1:0", 600_000, true).await? {
        Claim::Granted(generation) => Ok(Token { holder: holder.to_string(), generation }),
        Claim::HeldBy(l) => Err(format!("node {node} of {store} is held by {l:?}: another bench-store running?")),
    }
}

/// Decision `i` of writer `c` written as the daemon writes a commit: a gtid of the node's
/// epoch (sequence numbers distinct per writer), fenced by its lease. Returns the gtid.
async fn decide_commit(
    s: &store::Store,
    node: &str,
    nonce: u64,
    c: usize,
    i: usize,
    token: &Token,
) -> Result<String, String> {
    let gtid = naming::new_gtid(node, nonce, ((c as u64) << 32) | i as u64);
    let rec = store::DecisionRecord {
        gtid: gtid.clone(),
        outcome: state::Outcome::Commit,
        branches: vec![("pg".into(), "b1".into()), ("m".into(), "b2".into())],
        decided_unix_ms: state::unix_ms(),
        node: node.to_string(),
        source: "bench".into(),
    };
    match s.decide(rec, Some(token.clone())).await? {
        Decided::Outcome(state::Outcome::Commit) => Ok(gtid),
        other => Err(format!("decision not written as commit: {other:?}")),
    }
}

/// The value at quantile `p` of sorted `xs` (linear interpolation, as the bench harness).
fn quantile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let k = (xs.len() - 1) as f64 * p;
    let lo = k as usize;
    let hi = (lo + 1).min(xs.len() - 1);
    xs[lo] + (xs[hi] - xs[lo]) * (k - lo as f64)
}

/// Decisions/s and per-decision p50/p99 of the PostgreSQL store alone: `writers` store
/// handles (distinct node ids, each under its own lease) on table `table` of `dsn`,
/// `clients` concurrent decisions spread over them (client c writes through handle
/// c mod writers), `n` decisions in total. The gtids carry a fresh epoch (the start time)
/// so that runs on the same table never collide; the leases are released (and their
/// node rows forgotten) at the end.
pub fn bench_pg_store(
    dsn: &str,
    table: &str,
    n: usize,
    clients: usize,
    writers: usize,
    group: bool,
) -> Result<(), String> {
    let writers = writers.max(1);
    let clients = clients.max(writers);
    let cfg = config::StoreConfig::Postgres {
        dsn: dsn.to_string(),
        table: table.to_string(),
        group_commit: group,
        max_batch: 1024,
        commit_delay_us: 0,
        tls: None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let nonce = state::unix_ms();
        let holder = format!("bench-store-{}", std::process::id());
        let mut stores = vec![];
        for w in 0..writers {
            let s = open_store(&cfg)?;
            let node = format!("benchstore{w}");
            let token = claim(&s, &node, &holder, &format!("table {table}")).await?;
            stores.push((s, node, token));
        }
        let t0 = std::time::Instant::now();
        let mut hs = vec![];
        for c in 0..clients {
            let (s, node, token) = stores[c % writers].clone();
            let per = n / clients + usize::from(c < n % clients);
            hs.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per);
                for i in 0..per {
                    let t = std::time::Instant::now();
                    decide_commit(&s, &node, nonce, c, i, &token).await?;
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                Ok::<Vec<f64>, String>(lat)
            }));
        }
        let mut lat = Vec::with_capacity(n);
        for h in hs {
            lat.extend(h.await.map_err(|e| e.to_string())??);
        }
        let secs = t0.elapsed().as_secs_f64();
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let batches: u64 = stores.iter().map(|(s, _, _)| s.stats.batches.load(std::sync::atomic::Ordering::Relaxed)).sum();
        for (s, node, _) in &stores {
            let _ = s.release_node(node, &holder, true).await;
        }
        println!(
            "{{\"store\": \"postgres\", \"writers\": {writers}, \"group_commit\": {group}, \"decisions\": {n}, \"clients\": {clients}, \"seconds\": {secs:.3}, \"decisions_per_s\": {:.0}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"syncs\": {batches}, \"decisions_per_sync\": {:.1}}}",
            n as f64 / secs,
            quantile(&lat, 0.5),
            quantile(&lat, 0.99),
            n as f64 / batches.max(1) as f64
        );
        Ok(())
    })
}

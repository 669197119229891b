//! `serve`: the daemon's start-up order (store → witness → node lease → resource locks →
//! records → recovery, ticks and the API) and its stop; opening the decision store.

use std::sync::Arc;
use std::time::Duration;

use crate::api;
use crate::config;
use crate::coordinator::{self, recovery};
use crate::ha::lease;
use crate::store;
use crate::telemetry::otlp;

/// Says why the daemon or a command cannot go on, and exits with status 2 (the command
/// line's "bad arguments or config", also used for a start that cannot proceed).
pub fn die(msg: &str) -> ! {
    eprintln!("{msg}");
    std::process::exit(2);
}

/// Opens the configured decision log (synchronously: not on an async worker).
pub fn open_log(cfg: &config::StoreConfig) -> Result<Box<dyn store::DecisionLog>, store::StoreError> {
    Ok(match cfg {
        config::StoreConfig::Sqlite { path, .. } => Box::new(store::sqlite::SqliteLog::open(path)?),
        config::StoreConfig::Log { path, sync_method, .. } => {
            Box::new(store::applog::AppLog::open(path, *sync_method)?)
        }
        config::StoreConfig::Postgres { dsn, table, tls, .. } => {
            Box::new(store::postgres::PgLog::open(dsn, table, tls.as_ref())?)
        }
    })
}

pub fn open_store(cfg: &config::StoreConfig) -> Result<store::Store, store::StoreError> {
    let (max_batch, delay_us) = match cfg {
        config::StoreConfig::Sqlite { group_commit, max_batch, commit_delay_us, .. }
        | config::StoreConfig::Log { group_commit, max_batch, commit_delay_us, .. }
        | config::StoreConfig::Postgres { group_commit, max_batch, commit_delay_us, .. } => {
            if *group_commit {
                (*max_batch, *commit_delay_us)
            } else {
                (1, 0)
            }
        }
    };
    let cfg = cfg.clone();
    store::Store::open_in_thread(move || open_log(&cfg), max_batch, std::time::Duration::from_micros(delay_us))
}

pub fn mark_restored(cfg: &config::Config) -> Result<(), String> {
    let mut log = open_log(&cfg.store).map_err(|e| format!("cannot open the decision store: {e}"))?;
    let r = log.mark_restored()?;
    println!(
        "decision store marked restored (restore #{}): {} epoch(s) sealed. A prepared branch of theirs without a record is now \
         reported as forgotten, never presumed aborted: decide it with `cotx-coordinator force` after checking its other branches",
        r.restores, r.sealed
    );
    Ok(())
}

pub fn serve(cfg: config::Config) -> Result<(), String> {
    // `limits.worker_threads` (default 1): each worker more is a thread to wake per request;
    // with one, the daemon's CPU per transaction fell by about a tenth (bench/RESULTS.md).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.limits.worker_threads)
        .thread_name("cotx-api")
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let tls = match cfg.tls.as_ref().map(api::tls_acceptor).transpose() {
            Ok(t) => t,
            Err(e) => die(&format!("cannot set up TLS: {e}")),
        };
        let listener = match tokio::net::TcpListener::bind(cfg.listen).await {
            Ok(l) => l,
            Err(e) => die(&format!("cannot listen on {}: {e}", cfg.listen)),
        };
        let c = match start(cfg).await {
            Ok(c) => c,
            Err(e) => die(&e),
        };
        tracing::info!(addr = %c.cfg.listen, node_id = %c.cfg.node_id, holder = %c.holder(), advertise_url = %c.cfg.advertise_url, "listening");
        let server = tokio::spawn(api::serve(c.clone(), listener, tls));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = server => {}
        }
        stop(&c).await;
    });
    std::process::exit(0);
}

/// How long the start waits for its first recovery pass before it serves anyway.
const FIRST_PASS_WAIT: Duration = Duration::from_secs(5);

/// Everything the daemon does before it serves, in its order, and the tasks that run
/// beside the API (lease renewal, recovery passes, the tick): the daemon and the
/// coordinator in a caller's process (crate::in_process) start the same way.
pub async fn start(cfg: config::Config) -> Result<Arc<coordinator::Coordinator>, String> {
    let nonce = coordinator::Coordinator::new_nonce();
    let store = open_store(&cfg.store).map_err(|e| format!("cannot open the decision store: {e}"))?;
    let c = coordinator::Coordinator::new(cfg, store, Some(nonce))?;
    // A store that went back to an older copy is not acted on (crate::ha::witness).
    lease::check_witness(&c.parts().holding()).await.map_err(|e| format!("refusing to start: {e}"))?;
    // Own the node id (store lease, then the lock at every resource) before anything else.
    lease::claim_at_start(&c.parts().holding()).await.map_err(|e| format!("cannot own node {}: {e}", c.cfg.node_id))?;
    lease::check_witness(&c.parts().holding()).await.map_err(|e| format!("refusing to start: {e}"))?;
    lease::lock_resources_at_start(&c.parts().holding())
        .await
        .map_err(|e| format!("cannot own node {}: {e}", c.cfg.node_id))?;
    let l = c.store.load().await.map_err(|e| format!("cannot read the decision store: {e}"))?;
    for q in &l.corrupt {
        c.quarantine(q);
    }
    let n = c.adopt_records(&l.records);
    tracing::info!(records = n, quarantined = l.corrupt.len(), "decisions loaded");
    if let Some(e) = &c.cfg.telemetry.otlp_endpoint {
        otlp::start(e, &c.cfg.node_id);
    }
    lease::spawn_renewal(c.parts().clone(), coordinator::parts::Parts::holding);
    // Recovery at start, then periodically. The first pass is waited for (within
    // FIRST_PASS_WAIT) before the daemon serves: what its last run left prepared is decided
    // before new work comes, so a client-mode registration is not refused `restart_gate`
    // for a branch the pass was about to commit. A pass that takes longer (a database slow
    // or away) goes on in the background and the daemon serves meanwhile.
    let rc = c.parts().clone();
    let (first_done, first) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        recovery::run_pass(&rc).await;
        let _ = first_done.send(());
        loop {
            tokio::time::sleep(Duration::from_millis(rc.cfg.timeouts.recovery_interval_ms)).await;
            recovery::run_pass(&rc).await;
        }
    });
    let tc = c.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tc.tick();
        }
    });
    if tokio::time::timeout(FIRST_PASS_WAIT, first).await.is_err() {
        tracing::warn!(
            waited_ms = FIRST_PASS_WAIT.as_millis() as u64,
            "the first recovery pass is still running: serving meanwhile"
        );
    }
    Ok(c)
}

/// The orderly stop. Every acknowledged decision is already durable: stopping needs no
/// flush, but the branches of decided transactions are finished first (within 5 s), so
/// that a rolling restart does not leave them prepared and holding locks until the next
/// recovery. The lease is marked expired: a restart owns the node at once, and whatever is
/// still in doubt is taken over by another daemon meanwhile. Client mode: helpers of
/// branches that no longer need them go now (the others stay for recovery: their branches
/// may still commit).
pub async fn stop(c: &coordinator::Coordinator) {
    let _ = tokio::time::timeout(Duration::from_secs(5), c.finish_decided_at_stop()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), c.release_at_stop()).await;
    let _ = c.store.release_node(&c.cfg.node_id, c.holder(), false).await;
    tracing::info!("stopping");
}

//! cotx-coordinator: the commit coordinator of cotx. `serve` runs the daemon; the other
//! subcommands are for operators (see docs/coordinator.md).

mod api;
mod cli;
mod completion;
mod config;
mod coordinator;
mod housekeeping;
mod lease;
mod log;
mod metrics;
mod naming;
mod openapi;
mod operator;
mod recovery;
mod resources;
mod state;
mod store;

use std::sync::Arc;
use std::time::Duration;

const USAGE: &str = "usage:
  cotx-coordinator serve --config FILE
  cotx-coordinator check-config --config FILE
  cotx-coordinator in-doubt --config FILE [--json]
  cotx-coordinator show --config FILE GTID [--json]
  cotx-coordinator force --config FILE GTID commit|abort --yes-i-know --operator NAME --reason TEXT
  cotx-coordinator audit --config FILE
  cotx-coordinator bench-store --path FILE [--n N] [--clients C] [--no-group-commit]";

struct Args {
    pos: Vec<String>,
    opts: std::collections::HashMap<String, String>,
    flags: std::collections::HashSet<String>,
}

fn parse_args() -> Args {
    let mut a = Args { pos: vec![], opts: Default::default(), flags: Default::default() };
    let mut it = std::env::args().skip(1).peekable();
    while let Some(x) = it.next() {
        if let Some(name) = x.strip_prefix("--") {
            match name {
                "json" | "yes-i-know" | "no-group-commit" => {
                    a.flags.insert(name.to_string());
                }
                _ => {
                    a.opts.insert(name.to_string(), it.next().unwrap_or_default());
                }
            }
        } else {
            a.pos.push(x);
        }
    }
    a
}

fn die(msg: &str) -> ! {
    eprintln!("{msg}");
    std::process::exit(2);
}

fn load_config(a: &Args) -> config::Config {
    let Some(p) = a.opts.get("config") else { die(&format!("--config FILE is required\n{USAGE}")) };
    match config::load(p) {
        Ok(c) => c,
        Err(e) => die(&format!("{p}: {e}")),
    }
}

fn main() {
    let a = parse_args();
    let cmd = a.pos.first().cloned().unwrap_or_default();
    let r = match cmd.as_str() {
        "serve" => {
            let cfg = load_config(&a);
            serve(cfg);
            Ok(())
        }
        "check-config" => {
            let cfg = load_config(&a);
            println!("config ok: node {}, {} resource(s), listen {}", cfg.node_id, cfg.resources.len(), cfg.listen);
            Ok(())
        }
        "in-doubt" => cli::in_doubt(&load_config(&a), a.flags.contains("json")),
        "show" => {
            let g = a.pos.get(1).unwrap_or_else(|| die("show needs a GTID"));
            cli::show(&load_config(&a), g, a.flags.contains("json"))
        }
        "force" => {
            let cfg = load_config(&a);
            let (Some(g), Some(o)) = (a.pos.get(1), a.pos.get(2)) else { die("force needs GTID and commit|abort") };
            if o != "commit" && o != "abort" {
                die("outcome must be commit or abort");
            }
            if !a.flags.contains("yes-i-know") {
                die("forcing an outcome overrides the protocol: add --yes-i-know (an audit record is written)");
            }
            let op = a.opts.get("operator").cloned().or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "unknown".into());
            let Some(reason) = a.opts.get("reason") else { die("--reason TEXT is required") };
            cli::force(&cfg, g, o, &op, reason)
        }
        "audit" => cli::audit(&load_config(&a)),
        "bench-store" => bench_store(&a),
        _ => die(USAGE),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn open_store(cfg: &config::StoreConfig, holder: &str) -> Result<store::Store, String> {
    let holder = holder.to_string();
    match cfg.clone() {
        config::StoreConfig::Sqlite { path, group_commit, max_batch } => store::Store::open_in_thread(
            move || Ok(Box::new(store::sqlite::SqliteLog::open(&path)?) as Box<dyn store::DecisionLog>),
            if group_commit { max_batch } else { 1 },
        ),
        config::StoreConfig::Postgres { dsn, table, group_commit, max_batch } => store::Store::open_in_thread(
            move || Ok(Box::new(store::postgres::PgLog::open(&dsn, &table, &holder)?) as Box<dyn store::DecisionLog>),
            if group_commit { max_batch } else { 1 },
        ),
    }
}

fn serve(cfg: config::Config) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let nonce = coordinator::Coordinator::new_nonce();
        let holder = coordinator::holder_id(&cfg.node_id, nonce);
        let store = match open_store(&cfg.store, &holder) {
            Ok(s) => s,
            Err(e) => die(&format!("cannot open the decision store: {e}")),
        };
        let listener = match tokio::net::TcpListener::bind(cfg.listen).await {
            Ok(l) => l,
            Err(e) => die(&format!("cannot listen on {}: {e}", cfg.listen)),
        };
        let c = match coordinator::Coordinator::new(cfg, store, Some(nonce)) {
            Ok(c) => c,
            Err(e) => die(&e),
        };
        // Own the node id (store lease, then the lock at every resource) before anything else.
        if let Err(e) = lease::claim_at_start(&c).await {
            die(&format!("cannot own node {}: {e}", c.cfg.node_id));
        }
        if let Err(e) = lease::lock_resources_at_start(&c).await {
            die(&format!("cannot own node {}: {e}", c.cfg.node_id));
        }
        match c.store.load().await {
            Ok(l) => {
                for q in &l.corrupt {
                    c.quarantine(q);
                }
                let n = c.adopt_records(&l.records);
                log::log("info", "decisions loaded", serde_json::json!({"records": n, "quarantined": l.corrupt.len()}));
            }
            Err(e) => die(&format!("cannot read the decision store: {e}")),
        }
        log::log("info", "listening", serde_json::json!({"addr": c.cfg.listen.to_string(), "node_id": c.cfg.node_id, "holder": c.holder, "advertise_url": c.cfg.advertise_url}));
        lease::spawn_renewal(c.clone());
        // Recovery at start, then periodically.
        let rc = c.clone();
        tokio::spawn(async move {
            loop {
                recovery::run_pass(&rc).await;
                tokio::time::sleep(Duration::from_millis(rc.cfg.timeouts.recovery_interval_ms)).await;
            }
        });
        let tc = c.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                tc.tick();
            }
        });
        let server = tokio::spawn(api::serve(c.clone(), listener));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = server => {}
        }
        // Every acknowledged decision is already durable: stopping needs no flush. The lease
        // is marked expired: a restart owns the node at once, and whatever is still in
        // doubt is taken over by another daemon meanwhile.
        let _ = c.store.release_node(&c.cfg.node_id, &c.holder, false).await;
        log::log("info", "stopping", serde_json::json!({}));
    });
    std::process::exit(0);
}

/// Decisions/s of the store alone: `clients` concurrent writers, `n` decisions in total.
fn bench_store(a: &Args) -> Result<(), String> {
    let path = a.opts.get("path").ok_or("--path FILE is required")?;
    let n: usize = a.opts.get("n").map(|s| s.parse().unwrap_or(20000)).unwrap_or(20000);
    let clients: usize = a.opts.get("clients").map(|s| s.parse().unwrap_or(64)).unwrap_or(64);
    let group = !a.flags.contains("no-group-commit");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(format!("{path}-wal"));
    let _ = std::fs::remove_file(format!("{path}-shm"));
    let cfg = config::StoreConfig::Sqlite { path: path.clone(), group_commit: group, max_batch: 1024 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let s = open_store(&cfg, "bench")?;
        let t0 = std::time::Instant::now();
        let mut hs = vec![];
        for c in 0..clients {
            let s = s.clone();
            let per = n / clients + usize::from(c < n % clients);
            hs.push(tokio::spawn(async move {
                for i in 0..per {
                    let rec = store::DecisionRecord {
                        gtid: format!("b.{c}-{i}"),
                        outcome: state::Outcome::Commit,
                        branches: vec![("pg".into(), "b1".into()), ("m".into(), "b2".into())],
                        decided_unix_ms: state::unix_ms(),
                        node: "b".into(),
                        source: "bench".into(),
                    };
                    s.decide(rec).await?;
                }
                Ok::<(), String>(())
            }));
        }
        for h in hs {
            h.await.map_err(|e| e.to_string())??;
        }
        let secs = t0.elapsed().as_secs_f64();
        let batches = s.stats.batches.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "{{\"store\": \"sqlite\", \"group_commit\": {group}, \"decisions\": {n}, \"clients\": {clients}, \"seconds\": {secs:.3}, \"decisions_per_s\": {:.0}, \"syncs\": {batches}, \"decisions_per_sync\": {:.1}}}",
            n as f64 / secs,
            n as f64 / batches.max(1) as f64
        );
        Ok(())
    })
}

#[allow(dead_code)]
fn _assert_send(c: Arc<coordinator::Coordinator>) -> Arc<coordinator::Coordinator> {
    c
}

//! cotx-coordinator: the commit coordinator of cotx. `serve` runs the daemon; the other
//! subcommands are for operators (see docs/coordinator.md).

mod api;
mod cli;
mod completion;
mod dbtls;
mod auth;
mod config;
mod console;
mod coordinator;
mod decisions;
mod enforcement;
mod holds;
mod housekeeping;
mod lease;
mod log;
mod metrics;
mod naming;
mod openapi;
mod otlp;
mod operator;
mod recovery;
mod resources;
mod state;
mod store;
mod witness;

use std::sync::Arc;
use std::time::Duration;

/// The commit coordinator of cotx: durable two-phase commit decisions across PostgreSQL
/// and MariaDB (docs/coordinator.md).
///
/// Exit status: 0 done; 1 a command failed (the daemon said no, or could not be reached);
/// 2 bad arguments or an invalid config. (A daemon that loses its node lease no longer
/// exits: it claims the node again and reconciles its memory with the store.)
#[derive(clap::Parser)]
#[command(name = "cotx-coordinator", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct ConfigArg {
    /// The TOML config file (coordinator.example.toml documents every key).
    #[arg(long, env = "COTX_CONFIG", value_name = "FILE")]
    config: String,
    /// Bearer token; overrides `token`/`token_file` of the config.
    #[arg(long = "token-env-only", env = "COTX_TOKEN", hide = true, hide_env_values = true)]
    token: Option<String>,
}

/// How an operator command reaches the daemon: by URL with its own credential (no
/// database secrets), or through the daemon's config file.
#[derive(clap::Args)]
struct ApiArg {
    /// The daemon's base URL, e.g. https://coordinator.example:7420 (the credential comes
    /// from COTX_TOKEN or --token-file: the operator credential of `[auth]`).
    #[arg(long, env = "COTX_URL", value_name = "URL")]
    url: Option<String>,
    /// With an https --url: the CA that signed the daemon's certificate.
    #[arg(long, env = "COTX_CA_FILE", value_name = "FILE")]
    ca_file: Option<String>,
    /// With --url: a file holding the bearer credential (instead of COTX_TOKEN).
    #[arg(long, value_name = "FILE")]
    token_file: Option<String>,
    /// Without --url: the daemon's config file (its address, CA and token).
    #[arg(long, env = "COTX_CONFIG", value_name = "FILE")]
    config: Option<String>,
    #[arg(long = "token-env-only", env = "COTX_TOKEN", hide = true, hide_env_values = true)]
    token: Option<String>,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Run the daemon.
    Serve {
        #[command(flatten)]
        c: ConfigArg,
        /// Log format: human-readable `text` or `json` lines; overrides `[log] format`.
        #[arg(long, env = "COTX_LOG_FORMAT", value_parser = ["text", "json"])]
        log_format: Option<String>,
    },
    /// Check a config file and say what it configures.
    CheckConfig(ConfigArg),
    /// In-doubt transactions (prepared, unfinished), oldest first, with what they block.
    InDoubt {
        #[command(flatten)]
        c: ApiArg,
        /// Print the daemon's JSON.
        #[arg(long)]
        json: bool,
    },
    /// One transaction: state, decision, branches.
    Show {
        #[command(flatten)]
        c: ApiArg,
        gtid: String,
        #[arg(long)]
        json: bool,
    },
    /// Force an outcome (audited; never contradicts a recorded decision).
    Force {
        #[command(flatten)]
        c: ApiArg,
        gtid: String,
        #[arg(value_parser = ["commit", "abort"])]
        outcome: String,
        /// Required: forcing an outcome overrides the protocol.
        #[arg(long)]
        yes_i_know: bool,
        /// Who forces it (default: $USER).
        #[arg(long, env = "USER")]
        operator: Option<String>,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: String,
    },
    /// The operator audit log.
    Audit(ApiArg),
    /// The resources: health, prepared branches, and how commitment ordering is enforced
    /// at each (engine, client, none; refused or unknown with the reason).
    Resources {
        #[command(flatten)]
        c: ApiArg,
        #[arg(long)]
        json: bool,
    },
    /// After restoring the decision store from a copy (a backup, a snapshot, PITR), with
    /// every daemon stopped: seal the copy's epochs, so a commit recorded after the copy
    /// was taken is never presumed aborted (docs/ops.md, "Backup and restore").
    MarkRestored(ConfigArg),
    /// Decisions/s of the SQLite store alone.
    BenchStore {
        #[arg(long, value_name = "FILE")]
        path: String,
        #[arg(long, default_value_t = 20000)]
        n: usize,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long)]
        no_group_commit: bool,
    },
}

fn die(msg: &str) -> ! {
    eprintln!("{msg}");
    std::process::exit(2);
}

fn load_config(a: &ConfigArg) -> config::Config {
    let mut c = match config::load(&a.config) {
        Ok(c) => c,
        Err(e) => die(&format!("{}: {e}", a.config)),
    };
    if let Some(t) = &a.token {
        if t.trim().len() < 16 {
            die("COTX_TOKEN must be at least 16 characters");
        }
        c.token = Some(t.trim().to_string());
    }
    c
}

/// Where an operator command sends its requests.
fn target(a: &ApiArg) -> cli::Target {
    let token = match (&a.token_file, &a.token) {
        (Some(f), _) => match std::fs::read_to_string(f) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => die(&format!("--token-file {f}: {e}")),
        },
        (None, t) => t.as_ref().map(|t| t.trim().to_string()),
    };
    match (&a.url, &a.config) {
        (Some(url), _) => cli::Target::from_url(url, a.ca_file.clone(), token).unwrap_or_else(|e| die(&e)),
        (None, Some(config)) => {
            let mut t = cli::Target::from_config(&load_config(&ConfigArg { config: config.clone(), token: None }));
            if token.is_some() {
                t = t.with_token(token);
            }
            t
        }
        (None, None) => die("say where the daemon is: --url URL (with COTX_TOKEN or --token-file), or --config FILE"),
    }
}

fn main() {
    use clap::Parser;
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve { c, log_format } => {
            let mut cfg = load_config(&c);
            if let Some(f) = log_format.as_deref().and_then(log::Format::parse) {
                cfg.log.format = f;
            }
            log::init(cfg.log.format, cfg.log.level);
            serve(cfg)
        }
        Cmd::CheckConfig(c) => {
            let cfg = load_config(&c);
            println!("config ok: node {}, {} resource(s), listen {}", cfg.node_id, cfg.resources.len(), cfg.listen);
            Ok(())
        }
        Cmd::InDoubt { c, json } => cli::in_doubt(&target(&c), json),
        Cmd::Show { c, gtid, json } => cli::show(&target(&c), &gtid, json),
        Cmd::Resources { c, json } => cli::resources(&target(&c), json),
        Cmd::Force { c, gtid, outcome, yes_i_know, operator, reason } => {
            if !yes_i_know {
                die("forcing an outcome overrides the protocol: add --yes-i-know (an audit record is written)");
            }
            let op = operator.unwrap_or_else(|| "unknown".into());
            cli::force(&target(&c), &gtid, &outcome, &op, &reason)
        }
        Cmd::Audit(c) => cli::audit(&target(&c)),
        Cmd::MarkRestored(c) => mark_restored(&load_config(&c)),
        Cmd::BenchStore { path, n, clients, no_group_commit } => bench_store(&path, n, clients, !no_group_commit),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Opens the configured decision log (synchronously: not on an async worker).
fn open_log(cfg: &config::StoreConfig) -> Result<Box<dyn store::DecisionLog>, String> {
    Ok(match cfg {
        config::StoreConfig::Sqlite { path, .. } => Box::new(store::sqlite::SqliteLog::open(path)?),
        config::StoreConfig::Postgres { dsn, table, tls, .. } => Box::new(store::postgres::PgLog::open(dsn, table, tls.as_ref())?),
    })
}

fn open_store(cfg: &config::StoreConfig) -> Result<store::Store, String> {
    let max_batch = match cfg {
        config::StoreConfig::Sqlite { group_commit, max_batch, .. } | config::StoreConfig::Postgres { group_commit, max_batch, .. } => {
            if *group_commit { *max_batch } else { 1 }
        }
    };
    let cfg = cfg.clone();
    store::Store::open_in_thread(move || open_log(&cfg), max_batch)
}

fn mark_restored(cfg: &config::Config) -> Result<(), String> {
    let mut log = open_log(&cfg.store).map_err(|e| format!("cannot open the decision store: {e}"))?;
    let r = log.mark_restored()?;
    println!(
        "decision store marked restored (restore #{}): {} epoch(s) sealed. A prepared branch of theirs without a record is now \
         reported as forgotten, never presumed aborted: decide it with `cotx-coordinator force` after checking its other branches",
        r.restores, r.sealed
    );
    Ok(())
}

fn serve(cfg: config::Config) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let nonce = coordinator::Coordinator::new_nonce();
        let store = match open_store(&cfg.store) {
            Ok(s) => s,
            Err(e) => die(&format!("cannot open the decision store: {e}")),
        };
        let tls = match cfg.tls.as_ref().map(api::tls_acceptor).transpose() {
            Ok(t) => t,
            Err(e) => die(&format!("cannot set up TLS: {e}")),
        };
        let listener = match tokio::net::TcpListener::bind(cfg.listen).await {
            Ok(l) => l,
            Err(e) => die(&format!("cannot listen on {}: {e}", cfg.listen)),
        };
        let c = match coordinator::Coordinator::new(cfg, store, Some(nonce)) {
            Ok(c) => c,
            Err(e) => die(&e),
        };
        // A store that went back to an older copy is not acted on (crate::witness).
        if let Err(e) = lease::check_witness(&c).await {
            die(&format!("refusing to start: {e}"));
        }
        // Own the node id (store lease, then the lock at every resource) before anything else.
        if let Err(e) = lease::claim_at_start(&c).await {
            die(&format!("cannot own node {}: {e}", c.cfg.node_id));
        }
        if let Err(e) = lease::check_witness(&c).await {
            die(&format!("refusing to start: {e}"));
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
                tracing::info!(records = n, quarantined = l.corrupt.len(), "decisions loaded");
            }
            Err(e) => die(&format!("cannot read the decision store: {e}")),
        }
        tracing::info!(addr = %c.cfg.listen, node_id = %c.cfg.node_id, holder = %c.holder, advertise_url = %c.cfg.advertise_url, "listening");
        if let Some(e) = &c.cfg.telemetry.otlp_endpoint {
            otlp::start(e, &c.cfg.node_id);
        }
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
        let server = tokio::spawn(api::serve(c.clone(), listener, tls));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = server => {}
        }
        // Every acknowledged decision is already durable: stopping needs no flush. The lease
        // is marked expired: a restart owns the node at once, and whatever is still in
        // doubt is taken over by another daemon meanwhile.
        // Client mode: helpers of branches that no longer need them go now (the others
        // stay for recovery: their branches may still commit).
        let _ = tokio::time::timeout(Duration::from_secs(5), c.release_settled_holds()).await;
        let _ = c.store.release_node(&c.cfg.node_id, &c.holder, false).await;
        tracing::info!("stopping");
    });
    std::process::exit(0);
}

/// Decisions/s of the store alone: `clients` concurrent writers, `n` decisions in total.
fn bench_store(path: &str, n: usize, clients: usize, group: bool) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(format!("{path}-wal"));
    let _ = std::fs::remove_file(format!("{path}-shm"));
    let cfg = config::StoreConfig::Sqlite { path: path.to_string(), group_commit: group, max_batch: 1024 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let s = open_store(&cfg)?;
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
                    s.decide(rec, None).await?;
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

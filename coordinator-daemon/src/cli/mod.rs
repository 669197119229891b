//! The command line (clap): `serve` runs the daemon (crate::serve); the other subcommands
//! are for operators (see docs/coordinator.md) and talk to a daemon through `client`.

pub mod bench_store;
pub mod client;
pub mod listing;

use crate::config;
use crate::serve::{self, die};
use crate::telemetry::log;

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
    /// The transactions in the daemon's memory (undecided, and decided ones until their
    /// branches are finished and their outcome retention ran out), oldest first.
    Transactions {
        #[command(flatten)]
        c: ApiArg,
        /// Only those in this state (in_doubt: decided, with a branch still prepared).
        #[arg(long, value_parser = listing::STATES)]
        state: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Branches that did not reach the decided outcome, since the daemon started.
    Incidents {
        #[command(flatten)]
        c: ApiArg,
        #[arg(long)]
        json: bool,
    },
    /// The node leases in the decision store: who holds each, until when, and the nodes
    /// this daemon took over.
    Nodes {
        #[command(flatten)]
        c: ApiArg,
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
    /// Decisions/s of the store alone: SQLite (--path) or PostgreSQL (--pg-dsn, with
    /// --writers store handles of distinct node ids, as that many daemons sharing it).
    BenchStore {
        #[arg(long, value_name = "FILE", required_unless_present = "pg_dsn", conflicts_with = "pg_dsn")]
        path: Option<String>,
        /// A PostgreSQL store's DSN (its database must exist; the table is made if missing).
        #[arg(long, value_name = "DSN")]
        pg_dsn: Option<String>,
        /// The PostgreSQL store's table (a scratch one: the bench's records stay in it).
        #[arg(long, default_value = "cotx_bench_decisions", requires = "pg_dsn")]
        table: String,
        /// PostgreSQL: store handles writing concurrently, one node id and lease each.
        #[arg(long, default_value_t = 1, requires = "pg_dsn")]
        writers: usize,
        #[arg(long, default_value_t = 20000)]
        n: usize,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long)]
        no_group_commit: bool,
        /// SQLite: mark each decision finished after it is written, as the daemon does.
        #[arg(long, conflicts_with = "pg_dsn")]
        finish: bool,
        /// SQLite: each client pauses this long after each decision (the pace of
        /// transactions that spend their time in the databases), so the store's thread
        /// waits for work as it does in a daemon.
        #[arg(long, value_name = "MS", conflicts_with = "pg_dsn", value_parser = pace_ms)]
        pace_ms: Option<std::time::Duration>,
        /// SQLite: the store's commit delay (store.commit_delay_us of the config).
        #[arg(long, default_value_t = 0, conflicts_with_all = ["pg_dsn", "no_group_commit"],
              value_parser = clap::value_parser!(u64).range(0..=100_000))]
        commit_delay_us: u64,
        /// With --path: `sqlite`, the daemon's SQLite store; or `applog`, the append-only
        /// decision log (`[store] kind = "log"`): each batch one checksummed frame appended
        /// to a preallocated file and made durable, to compare its CPU per decision with SQLite's.
        #[arg(long, value_enum, default_value = "sqlite", conflicts_with = "pg_dsn")]
        backend: bench_store::Backend,
        /// With --backend applog: `direct` or `fdatasync` (store.sync_method of the config).
        #[arg(long, default_value = "direct", value_parser = sync_method)]
        sync_method: crate::config::SyncMethod,
    },
}

/// `--pace-ms`: milliseconds, a finite number from 0 to 60000.
fn pace_ms(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(ms) if (0.0..=60_000.0).contains(&ms) => Ok(std::time::Duration::from_secs_f64(ms / 1000.0)),
        _ => Err(format!("{s:?} is not a pause in milliseconds from 0 to 60000")),
    }
}

fn sync_method(s: &str) -> Result<crate::config::SyncMethod, String> {
    use crate::config::SyncMethod;
    SyncMethod::parse(s).ok_or_else(|| format!("{s:?} is not a sync method; expected {}", SyncMethod::NAMES))
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
fn target(a: &ApiArg) -> client::Target {
    let token = match (&a.token_file, &a.token) {
        (Some(f), _) => match std::fs::read_to_string(f) {
            Ok(t) => Some(t.trim().to_string()),
            Err(e) => die(&format!("--token-file {f}: {e}")),
        },
        (None, t) => t.as_ref().map(|t| t.trim().to_string()),
    };
    match (&a.url, &a.config) {
        (Some(url), _) => client::Target::from_url(url, a.ca_file.clone(), token).unwrap_or_else(|e| die(&e)),
        (None, Some(config)) => {
            let mut t = client::Target::from_config(&load_config(&ConfigArg { config: config.clone(), token: None }));
            if token.is_some() {
                t = t.with_token(token);
            }
            t
        }
        (None, None) => die("say where the daemon is: --url URL (with COTX_TOKEN or --token-file), or --config FILE"),
    }
}

/// The binary's entry point (src/main.rs).
pub fn main() {
    use clap::Parser;
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve { c, log_format } => {
            let mut cfg = load_config(&c);
            if let Some(f) = log_format.as_deref().and_then(log::Format::parse) {
                cfg.log.format = f;
            }
            log::init(cfg.log.format, cfg.log.level);
            serve::serve(cfg)
        }
        Cmd::CheckConfig(c) => {
            let cfg = load_config(&c);
            println!("config ok: node {}, {} resource(s), listen {}", cfg.node_id, cfg.resources.len(), cfg.listen);
            Ok(())
        }
        Cmd::InDoubt { c, json } => client::in_doubt(&target(&c), json),
        Cmd::Show { c, gtid, json } => client::show(&target(&c), &gtid, json),
        Cmd::Resources { c, json } => client::resources(&target(&c), json),
        Cmd::Transactions { c, state, json } => listing::transactions(&target(&c), state.as_deref(), json),
        Cmd::Incidents { c, json } => listing::incidents(&target(&c), json),
        Cmd::Nodes { c, json } => listing::nodes(&target(&c), json),
        Cmd::Force { c, gtid, outcome, yes_i_know, operator, reason } => {
            if !yes_i_know {
                die("forcing an outcome overrides the protocol: add --yes-i-know (an audit record is written)");
            }
            let op = operator.unwrap_or_else(|| "unknown".into());
            client::force(&target(&c), &gtid, &outcome, &op, &reason)
        }
        Cmd::Audit(c) => client::audit(&target(&c)),
        Cmd::MarkRestored(c) => serve::mark_restored(&load_config(&c)),
        Cmd::BenchStore {
            path,
            pg_dsn,
            table,
            writers,
            n,
            clients,
            no_group_commit,
            finish,
            pace_ms,
            commit_delay_us,
            backend,
            sync_method,
        } => match (path, pg_dsn) {
            (_, Some(dsn)) => bench_store::bench_pg_store(&dsn, &table, n, clients, writers, !no_group_commit),
            (Some(path), None) => bench_store::bench_store(
                &path,
                &bench_store::SqliteBench {
                    n,
                    clients,
                    group_commit: !no_group_commit,
                    finish,
                    pace: pace_ms,
                    commit_delay_us,
                    backend,
                    sync_method,
                },
            ),
            (None, None) => Err("bench-store needs --path FILE (SQLite) or --pg-dsn DSN (PostgreSQL)".into()),
        },
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

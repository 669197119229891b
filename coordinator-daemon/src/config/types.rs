//! The checked configuration: what the daemon runs with once `parse` accepted the file,
//! and `ConfigError`, the refusal that names line and field.

use crate::dbtls::DbTls;
use serde::Deserialize;
use std::net::SocketAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceKind {
    Postgres,
    Mariadb,
}

impl ResourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Postgres => "postgres",
            ResourceKind::Mariadb => "mariadb",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Timeouts {
    pub transaction_ms: u64,
    pub owner_grace_ms: u64,
    pub recovery_interval_ms: u64,
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    pub long_poll_max_ms: u64,
    pub retention_ms: u64,
    /// Decision records stay in the store (answerable) this long after their branches
    /// finished; then they are purged and their gtids answer "outcome_forgotten".
    pub outcome_retention_ms: u64,
    /// Deadlocks across databases (coordinator/deadlocks.rs): once a transaction has been
    /// active this long, its resources' lock waits are read every this-many ms and a cycle
    /// is broken. 0: never (each engine's own timeouts then end such a wait).
    pub deadlock_check_ms: u64,
}

/// Ownership of the node id (docs/coordinator.md, "Several daemons").
#[derive(Debug, Clone)]
pub struct Lease {
    pub ttl_ms: u64,
    pub renew_ms: u64,
    /// Take over the transactions of nodes whose lease ran out (shared store only).
    pub takeover: bool,
}

/// TLS for the API: PEM files (paths relative to the config file's directory).
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert_file: String,
    pub key_file: String,
    pub ca_file: String,
}

/// Protection against slow or greedy clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Undecided transactions at once; more are refused with 429 and Retry-After.
    pub max_active: usize,
    /// Cap on a transaction's timeout_ms.
    pub max_transaction_ms: u64,
    pub max_connections: usize,
    /// A request's headers must arrive within this time.
    pub header_timeout_ms: u64,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout_ms: u64,
    /// Threads of the runtime that serves the API and runs the daemon's tasks. One by
    /// default: a request is a few microseconds of work between waits, and a second worker
    /// mostly adds wake-ups (measured: bench/RESULTS.md, "One API thread and the append-only decision log").
    pub worker_threads: usize,
}

/// `[log]`: the log format and the least severe level written.
#[derive(Debug, Clone)]
pub struct Log {
    pub format: crate::telemetry::log::Format,
    pub level: tracing::Level,
}

/// `[telemetry]`: where request spans are exported (OTLP over HTTP, JSON encoding).
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    /// e.g. `http://127.0.0.1:4318`; spans are POSTed to `<endpoint>/v1/traces`.
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Clone)]
pub enum StoreConfig {
    Sqlite {
        path: String,
        group_commit: bool,
        max_batch: usize,
        commit_delay_us: u64,
    },
    /// The append-only decision log (store/applog): one file, one daemon.
    Log {
        path: String,
        group_commit: bool,
        max_batch: usize,
        commit_delay_us: u64,
        /// `store.sync_method`: direct writes (default) or write + fdatasync.
        sync_method: SyncMethod,
    },
    Postgres {
        dsn: String,
        table: String,
        group_commit: bool,
        max_batch: usize,
        commit_delay_us: u64,
        tls: Option<DbTls>,
    },
}

#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    pub kind: ResourceKind,
    pub dsn: String,
    pub pool_size: usize,
    /// May carry global decisions (pg_co's co.decisions): a decision branch may live here,
    /// and recovery asks it (co.resolve) before it presumes abort.
    pub decisions: bool,
    /// `tls` / `tls_ca_file`: None leaves TLS to the DSN (crate::dbtls).
    pub tls: Option<DbTls>,
    /// How commitment ordering is enforced there (crate::participants::enforcement): auto by default.
    pub enforcement: Configured,
    /// PostgreSQL client mode: branches served by one shared helper transaction
    /// (participants/enforcement/helpers.rs); 10 by default.
    pub client_helper_block: i32,
}

/// `client_helper_block`: Sonata's 10 by default; at most 64 (a helper's SIREAD locks
/// grow with its block).
pub const CLIENT_HELPER_BLOCK_DEFAULT: i32 = 10;
pub const CLIENT_HELPER_BLOCK_MAX: i32 = 64;

#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: String,
    pub listen: SocketAddr,
    /// The credential with every role (older configs; `[auth]` splits it per role).
    pub token: Option<String>,
    pub auth: Auth,
    pub gid_prefix: String,
    pub timeouts: Timeouts,
    pub store: StoreConfig,
    /// Where this daemon keeps its witness of the store (crate::ha::witness): `store.witness_file`,
    /// by default `<path>.witness` beside a SQLite store; none for a PostgreSQL store
    /// unless set.
    pub witness_file: Option<String>,
    pub resources: Vec<Resource>,
    /// How other daemons and clients reach this one (the store's node table carries it).
    pub advertise_url: String,
    pub lease: Lease,
    pub limits: Limits,
    pub tls: Option<Tls>,
    pub log: Log,
    pub telemetry: Telemetry,
}

impl Config {
    /// The engine of a configured resource (None: not configured).
    pub fn kind_of(&self, resource: &str) -> Option<ResourceKind> {
        self.resources.iter().find(|r| r.name == resource).map(|r| r.kind)
    }
}

/// One credential per role (crate::api::auth says what each may call).
#[derive(Debug, Clone, Default)]
pub struct Auth {
    pub client: Option<String>,
    pub operator: Option<String>,
    pub metrics: Option<String>,
}

/// A config error: where it is and what is wrong.
#[derive(Debug)]
pub struct ConfigError {
    pub line: Option<usize>,
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "config error at line {l}, field `{}`: {}", self.field, self.message),
            None => write!(f, "config error, field `{}`: {}", self.field, self.message),
        }
    }
}

/// How a resource's commitment ordering is to be enforced (`[[resources]] enforcement =
/// ...`); the modes and the rule choosing one are participants/enforcement/rules.rs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Configured {
    #[default]
    Auto,
    Engine,
    Client,
    None,
}

impl Configured {
    pub fn as_str(self) -> &'static str {
        match self {
            Configured::Auto => "auto",
            Configured::Engine => "engine",
            Configured::Client => "client",
            Configured::None => "none",
        }
    }
}

/// How each batch is made durable: `store.sync_method`, as PostgreSQL's `wal_sync_method`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncMethod {
    /// One write through a second handle opened O_DIRECT | O_DSYNC (store/applog/file.rs):
    /// no page cache, no separate sync call. It cost the store's thread 5-13 % less CPU
    /// per decision than a buffered write and an fdatasync (bench/RESULTS.md, "Direct
    /// writes to the decision log"). Where the file system refuses O_DIRECT, the log falls
    /// back to `Fdatasync` and says so once.
    #[default]
    Direct,
    /// A buffered write, then fdatasync.
    Fdatasync,
}

impl SyncMethod {
    pub const NAMES: &'static str = "\"direct\" or \"fdatasync\"";

    pub fn parse(s: &str) -> Option<SyncMethod> {
        match s {
            "direct" => Some(SyncMethod::Direct),
            "fdatasync" => Some(SyncMethod::Fdatasync),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SyncMethod::Direct => "direct",
            SyncMethod::Fdatasync => "fdatasync",
        }
    }
}

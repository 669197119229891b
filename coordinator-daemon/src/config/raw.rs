//! The file as TOML gives it: every key optional, each with its place in the file
//! (`Spanned`) so that `check` and `parse` can name the line of a bad value.

use super::types::ResourceKind;
use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) node_id: Option<Spanned<String>>,
    pub(super) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) allow_non_loopback: bool,
    pub(super) token: Option<Spanned<String>>,
    pub(super) token_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) allow_no_auth: bool,
    pub(super) gid_prefix: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) timeouts: RawTimeouts,
    pub(super) store: Option<Spanned<RawStore>>,
    #[serde(default)]
    pub(super) resources: Vec<Spanned<RawResource>>,
    pub(super) advertise_url: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) lease: RawLease,
    #[serde(default)]
    pub(super) limits: RawLimits,
    pub(super) tls: Option<Spanned<RawTls>>,
    #[serde(default)]
    pub(super) log: RawLog,
    #[serde(default)]
    pub(super) telemetry: RawTelemetry,
    #[serde(default)]
    pub(super) auth: RawAuth,
}

/// One credential per role (crate::api::auth): each inline or from a file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    pub(super) client_token: Option<Spanned<String>>,
    pub(super) client_token_file: Option<Spanned<String>>,
    pub(super) operator_token: Option<Spanned<String>>,
    pub(super) operator_token_file: Option<Spanned<String>>,
    pub(super) metrics_token: Option<Spanned<String>>,
    pub(super) metrics_token_file: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) format: Option<Spanned<String>>,
    pub(super) level: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert_file: Spanned<String>,
    pub(super) key_file: Spanned<String>,
    /// What the operator commands trust (default: cert_file itself, for a self-signed one).
    pub(super) ca_file: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLease {
    pub(super) ttl_ms: Option<Spanned<u64>>,
    pub(super) renew_ms: Option<Spanned<u64>>,
    pub(super) takeover: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) max_active: Option<Spanned<u64>>,
    pub(super) max_transaction_ms: Option<Spanned<u64>>,
    pub(super) max_connections: Option<Spanned<u64>>,
    pub(super) header_timeout_ms: Option<Spanned<u64>>,
    pub(super) idle_timeout_ms: Option<Spanned<u64>>,
    pub(super) worker_threads: Option<Spanned<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimeouts {
    pub(super) transaction_ms: Option<Spanned<u64>>,
    pub(super) owner_grace_ms: Option<Spanned<u64>>,
    pub(super) recovery_interval_ms: Option<Spanned<u64>>,
    pub(super) retry_initial_ms: Option<Spanned<u64>>,
    pub(super) retry_max_ms: Option<Spanned<u64>>,
    pub(super) long_poll_max_ms: Option<Spanned<u64>>,
    pub(super) retention_ms: Option<Spanned<u64>>,
    pub(super) outcome_retention_ms: Option<Spanned<u64>>,
    pub(super) deadlock_check_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) kind: Spanned<String>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) dsn: Option<Spanned<String>>,
    pub(super) table: Option<Spanned<String>>,
    pub(super) group_commit: Option<bool>,
    pub(super) max_batch: Option<Spanned<u64>>,
    pub(super) commit_delay_us: Option<Spanned<u64>>,
    pub(super) sync_method: Option<Spanned<String>>,
    pub(super) tls: Option<Spanned<String>>,
    pub(super) tls_ca_file: Option<Spanned<String>>,
    pub(super) witness_file: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResource {
    pub(super) name: Spanned<String>,
    pub(super) kind: Spanned<ResourceKind>,
    pub(super) dsn: Spanned<String>,
    pub(super) pool_size: Option<Spanned<u64>>,
    pub(super) decisions: Option<Spanned<bool>>,
    pub(super) tls: Option<Spanned<String>>,
    pub(super) tls_ca_file: Option<Spanned<String>>,
    pub(super) enforcement: Option<Spanned<String>>,
    pub(super) client_helper_block: Option<Spanned<u64>>,
}

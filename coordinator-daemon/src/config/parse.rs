//! From the TOML text to a checked `Config`, section by section; the first error stops
//! it, with its line and field.

use super::check::{dsn_error, line_of, relative_to, Ctx};
use super::raw::{RawConfig, RawResource};
use super::store_section::store;
use super::types::*;
use crate::naming;
use std::net::SocketAddr;
use toml::Spanned;

pub fn load(path: &str) -> Result<Config, ConfigError> {
    let src = std::fs::read_to_string(path).map_err(|e| ConfigError {
        line: None,
        field: "(file)".into(),
        message: format!("cannot read {path}: {e}"),
    })?;
    parse(&src, std::path::Path::new(path).parent())
}

pub fn parse(src: &str, base: Option<&std::path::Path>) -> Result<Config, ConfigError> {
    let raw = read_toml(src)?;
    let cx = &Ctx { src };
    let (node_id, gid_prefix) = names(cx, &raw)?;
    let listen = listen(cx, &raw)?;
    let (token, auth) = credentials(cx, base, &raw)?;
    let timeouts = timeouts(cx, &raw)?;
    let (store, witness_file) = store(cx, base, &raw)?;
    let lease = lease(cx, &raw)?;
    let limits = limits(cx, &raw, &timeouts)?;
    let log = log(cx, &raw)?;
    let telemetry = telemetry(cx, &raw)?;
    let tls = tls(cx, base, &raw)?;
    let advertise_url = advertise_url(cx, &raw, listen, tls.is_some())?;
    let resources = resources(cx, base, &raw)?;
    let witness_file = witness_file.or(match &store {
        StoreConfig::Sqlite { path, .. } | StoreConfig::Log { path, .. } => Some(format!("{path}.witness")),
        StoreConfig::Postgres { .. } => None,
    });
    Ok(Config {
        node_id,
        listen,
        token,
        auth,
        gid_prefix,
        timeouts,
        store,
        witness_file,
        resources,
        advertise_url,
        lease,
        limits,
        tls,
        log,
        telemetry,
    })
}

/// The text as TOML, or where it is not.
fn read_toml(src: &str) -> Result<RawConfig, ConfigError> {
    toml::from_str(src).map_err(|e| {
        let line = e.span().map(|s| line_of(src, s.start));
        // toml points at the offending spot: name the key written on that line.
        let msg = e.message().trim().to_string();
        let field = e
            .span()
            .and_then(|sp| {
                let start = src[..sp.start.min(src.len())].rfind('\n').map(|i| i + 1).unwrap_or(0);
                let line = src[start..].lines().next().unwrap_or("");
                line.split_once('=').map(|(k, _)| k.trim().to_string())
            })
            .unwrap_or_else(|| "(syntax)".into());
        ConfigError { line, field, message: msg }
    })
}

/// `node_id` (required) and `gid_prefix`.
fn names(cx: &Ctx, raw: &RawConfig) -> Result<(String, String), ConfigError> {
    let node_id = match &raw.node_id {
        // No default: two daemons that both fell back to one would recover (and roll
        // back) each other's transactions.
        None => {
            return cx.err(None, "node_id",
                "required: every daemon needs its own node id (1..16 of A-Z a-z 0-9 _ -); it names its transactions and is leased exclusively")
        }
        Some(n) => {
            if let Err(m) = naming::check_token_name("node_id", n.get_ref(), naming::NODE_MAX) {
                return cx.err(Some(n.span()), "node_id", m);
            }
            n.get_ref().clone()
        }
    };
    let gid_prefix = match &raw.gid_prefix {
        None => "cotx".to_string(),
        Some(p) => {
            if let Err(m) = naming::check_token_name("gid_prefix", p.get_ref(), naming::PREFIX_MAX) {
                return cx.err(Some(p.span()), "gid_prefix", m);
            }
            p.get_ref().clone()
        }
    };
    Ok((node_id, gid_prefix))
}

/// `listen`: loopback unless exposed on purpose, with TLS.
fn listen(cx: &Ctx, raw: &RawConfig) -> Result<SocketAddr, ConfigError> {
    Ok(match &raw.listen {
        None => "127.0.0.1:7420".parse().unwrap(),
        Some(l) => match l.get_ref().parse::<SocketAddr>() {
            Ok(a) => {
                // Plain HTTP only on loopback: a token and decisions never cross a network
                // in clear text.
                if !a.ip().is_loopback() && (!raw.allow_non_loopback || raw.tls.is_none()) {
                    return cx.err(Some(l.span()), "listen",
                        "not a loopback address; exposing the API needs allow_non_loopback = true and a [tls] section (plain HTTP is served on loopback only)");
                }
                a
            }
            Err(e) => return cx.err(Some(l.span()), "listen", format!("not an ip:port address: {e}")),
        },
    })
}

/// The API's credentials: `token` and the per-role ones in `[auth]`, each its own.
fn credentials(
    cx: &Ctx,
    base: Option<&std::path::Path>,
    raw: &RawConfig,
) -> Result<(Option<String>, Auth), ConfigError> {
    let token = cx.secret(base, &raw.token, &raw.token_file, "token")?;
    let a = &raw.auth;
    let auth = Auth {
        client: cx.secret(base, &a.client_token, &a.client_token_file, "auth.client_token")?,
        operator: cx.secret(base, &a.operator_token, &a.operator_token_file, "auth.operator_token")?,
        metrics: cx.secret(base, &a.metrics_token, &a.metrics_token_file, "auth.metrics_token")?,
    };
    let named = [
        ("token", &token),
        ("auth.client_token", &auth.client),
        ("auth.operator_token", &auth.operator),
        ("auth.metrics_token", &auth.metrics),
    ];
    let set: Vec<(&str, &String)> = named.iter().filter_map(|(n, v)| v.as_ref().map(|v| (*n, v))).collect();
    if set.is_empty() && !raw.allow_no_auth {
        return cx.err(
            None,
            "token",
            "required (or token_file, or per-role credentials in [auth]); set allow_no_auth = true to run without one",
        );
    }
    for (i, (n, v)) in set.iter().enumerate() {
        if let Some((m, _)) = set[..i].iter().find(|(_, w)| w == v) {
            return cx.err(None, n, format!("the same secret as {m}: each role needs its own credential (a request is granted by which one it presents)"));
        }
    }
    Ok((token, auth))
}

/// `[timeouts]`, each bounded, and the orders between them.
fn timeouts(cx: &Ctx, raw: &RawConfig) -> Result<Timeouts, ConfigError> {
    let t = &raw.timeouts;
    let timeouts = Timeouts {
        transaction_ms: cx.ms(&t.transaction_ms, "timeouts.transaction_ms", 30_000, 10, 86_400_000)?,
        owner_grace_ms: cx.ms(&t.owner_grace_ms, "timeouts.owner_grace_ms", 2_000, 0, 3_600_000)?,
        recovery_interval_ms: cx.ms(&t.recovery_interval_ms, "timeouts.recovery_interval_ms", 5_000, 50, 3_600_000)?,
        retry_initial_ms: cx.ms(&t.retry_initial_ms, "timeouts.retry_initial_ms", 100, 1, 60_000)?,
        retry_max_ms: cx.ms(&t.retry_max_ms, "timeouts.retry_max_ms", 10_000, 1, 3_600_000)?,
        long_poll_max_ms: cx.ms(&t.long_poll_max_ms, "timeouts.long_poll_max_ms", 30_000, 0, 600_000)?,
        retention_ms: cx.ms(&t.retention_ms, "timeouts.retention_ms", 60_000, 0, 86_400_000)?,
        outcome_retention_ms: cx.ms(
            &t.outcome_retention_ms,
            "timeouts.outcome_retention_ms",
            3_600_000,
            0,
            30 * 86_400_000,
        )?,
        deadlock_check_ms: cx.ms(&t.deadlock_check_ms, "timeouts.deadlock_check_ms", 500, 0, 3_600_000)?,
    };
    if timeouts.outcome_retention_ms < timeouts.retention_ms {
        return cx.err(
            t.outcome_retention_ms.as_ref().map(|s| s.span()),
            "timeouts.outcome_retention_ms",
            "must be >= timeouts.retention_ms (a finished transaction leaves memory before its record may go)",
        );
    }
    if timeouts.retry_max_ms < timeouts.retry_initial_ms {
        return cx.err(
            t.retry_max_ms.as_ref().map(|s| s.span()),
            "timeouts.retry_max_ms",
            "must be >= retry_initial_ms",
        );
    }
    Ok(timeouts)
}

/// `[lease]`: renewed at least twice within its ttl.
fn lease(cx: &Ctx, raw: &RawConfig) -> Result<Lease, ConfigError> {
    let l = &raw.lease;
    let ttl_ms = cx.ms(&l.ttl_ms, "lease.ttl_ms", 10_000, 1_000, 600_000)?;
    let lease = Lease {
        ttl_ms,
        renew_ms: cx.ms(&l.renew_ms, "lease.renew_ms", (ttl_ms / 4).max(200), 100, 600_000)?,
        takeover: l.takeover.unwrap_or(true),
    };
    if lease.renew_ms * 2 > lease.ttl_ms {
        return cx.err(l.renew_ms.as_ref().map(|s| s.span()), "lease.renew_ms", "must be at most half of lease.ttl_ms");
    }
    Ok(lease)
}

/// `[limits]`, and the transaction timeout within them.
fn limits(cx: &Ctx, raw: &RawConfig, timeouts: &Timeouts) -> Result<Limits, ConfigError> {
    let t = &raw.timeouts;
    let m = &raw.limits;
    let limits = Limits {
        max_active: cx.ms(&m.max_active, "limits.max_active", 10_000, 1, 10_000_000)? as usize,
        max_transaction_ms: cx.ms(&m.max_transaction_ms, "limits.max_transaction_ms", 3_600_000, 10, 86_400_000)?,
        max_connections: cx.ms(&m.max_connections, "limits.max_connections", 1024, 1, 1_000_000)? as usize,
        header_timeout_ms: cx.ms(&m.header_timeout_ms, "limits.header_timeout_ms", 5_000, 10, 600_000)?,
        idle_timeout_ms: cx.ms(&m.idle_timeout_ms, "limits.idle_timeout_ms", 60_000, 10, 3_600_000)?,
        worker_threads: cx.ms(&m.worker_threads, "limits.worker_threads", 1, 1, 256)? as usize,
    };
    if timeouts.transaction_ms > limits.max_transaction_ms {
        return cx.err(
            t.transaction_ms.as_ref().map(|s| s.span()),
            "timeouts.transaction_ms",
            "must be <= limits.max_transaction_ms",
        );
    }
    Ok(limits)
}

/// `[log]`: format and level.
fn log(cx: &Ctx, raw: &RawConfig) -> Result<Log, ConfigError> {
    Ok(Log {
        format: match &raw.log.format {
            None => crate::telemetry::log::Format::Text,
            Some(f) => match crate::telemetry::log::Format::parse(f.get_ref()) {
                Some(x) => x,
                None => return cx.err(Some(f.span()), "log.format", "must be \"text\" or \"json\""),
            },
        },
        level: match &raw.log.level {
            None => tracing::Level::INFO,
            Some(l) => match l.get_ref().as_str() {
                "error" => tracing::Level::ERROR,
                "warn" => tracing::Level::WARN,
                "info" => tracing::Level::INFO,
                "debug" => tracing::Level::DEBUG,
                _ => return cx.err(Some(l.span()), "log.level", "must be \"error\", \"warn\", \"info\" or \"debug\""),
            },
        },
    })
}

/// `[telemetry]`: the OTLP endpoint, if any.
fn telemetry(cx: &Ctx, raw: &RawConfig) -> Result<Telemetry, ConfigError> {
    Ok(Telemetry {
        otlp_endpoint: match &raw.telemetry.otlp_endpoint {
            None => None,
            Some(e) => match crate::telemetry::otlp::parse_endpoint(e.get_ref()) {
                Ok(_) => Some(e.get_ref().trim_end_matches('/').to_string()),
                Err(m) => return cx.err(Some(e.span()), "telemetry.otlp_endpoint", m),
            },
        },
    })
}

/// `[tls]` of the API: its files readable now.
fn tls(cx: &Ctx, base: Option<&std::path::Path>, raw: &RawConfig) -> Result<Option<Tls>, ConfigError> {
    let rel = |p: &str| relative_to(base, p).display().to_string();
    Ok(match &raw.tls {
        None => None,
        Some(t) => {
            let t = t.get_ref();
            for (f, field) in [(&t.cert_file, "tls.cert_file"), (&t.key_file, "tls.key_file")] {
                if let Err(e) = std::fs::metadata(rel(f.get_ref())) {
                    return cx.err(Some(f.span()), field, format!("cannot read {}: {e}", rel(f.get_ref())));
                }
            }
            Some(Tls {
                cert_file: rel(t.cert_file.get_ref()),
                key_file: rel(t.key_file.get_ref()),
                ca_file: rel(t.ca_file.as_ref().unwrap_or(&t.cert_file).get_ref()),
            })
        }
    })
}

/// `advertise_url`: how other daemons and clients reach this one (default: `listen`).
fn advertise_url(cx: &Ctx, raw: &RawConfig, listen: SocketAddr, tls: bool) -> Result<String, ConfigError> {
    Ok(match &raw.advertise_url {
        None => format!("{}://{listen}", if tls { "https" } else { "http" }),
        Some(u) => {
            let v = u.get_ref();
            if !(v.starts_with("http://") || v.starts_with("https://"))
                || v.len() > 200
                || v.contains(char::is_whitespace)
            {
                return cx.err(
                    Some(u.span()),
                    "advertise_url",
                    "must be an http:// or https:// URL (≤ 200 characters)",
                );
            }
            v.trim_end_matches('/').to_string()
        }
    })
}

/// `[[resources]]`, each checked, names unique.
fn resources(cx: &Ctx, base: Option<&std::path::Path>, raw: &RawConfig) -> Result<Vec<Resource>, ConfigError> {
    let mut resources: Vec<Resource> = Vec::new();
    for (i, r) in raw.resources.iter().enumerate() {
        resources.push(resource(cx, base, i, r, &resources)?);
    }
    Ok(resources)
}

fn resource(
    cx: &Ctx,
    base: Option<&std::path::Path>,
    i: usize,
    r: &Spanned<RawResource>,
    resources: &[Resource],
) -> Result<Resource, ConfigError> {
    let rr = r.get_ref();
    let field = |f: &str| format!("resources[{i}].{f}");
    let name = rr.name.get_ref();
    if let Err(m) = naming::check_token_name("name", name, 64) {
        return cx.err(Some(rr.name.span()), &field("name"), m);
    }
    if resources.iter().any(|x| &x.name == name) {
        return cx.err(Some(rr.name.span()), &field("name"), format!("duplicate resource name {name:?}"));
    }
    let kind = *rr.kind.get_ref();
    let dsn = rr.dsn.get_ref();
    if let Some(e) = dsn_error(kind, dsn) {
        return cx.err(Some(rr.dsn.span()), &field("dsn"), format!("not a valid {} DSN: {e}", kind.as_str()));
    }
    let pool_size = match &rr.pool_size {
        None => 2,
        Some(p) if *p.get_ref() == 0 || *p.get_ref() > 64 => {
            return cx.err(Some(p.span()), &field("pool_size"), "must be between 1 and 64")
        }
        Some(p) => *p.get_ref() as usize,
    };
    let decisions = match &rr.decisions {
        Some(d) if *d.get_ref() && kind != ResourceKind::Postgres => {
            return cx.err(
                Some(d.span()),
                &field("decisions"),
                "only a postgres resource with pg_co can carry global decisions",
            )
        }
        Some(d) => *d.get_ref(),
        None => false,
    };
    let tls = cx.db_tls(base, &field(""), kind, &rr.dsn, &rr.tls, &rr.tls_ca_file)?;
    let enforcement = match rr.enforcement.as_ref().map(|e| (e, e.get_ref().as_str())) {
        None | Some((_, "auto")) => Configured::Auto,
        Some((_, "engine")) => Configured::Engine,
        Some((_, "client")) => Configured::Client,
        Some((_, "none")) => Configured::None,
        Some((e, other)) => {
            return cx.err(
                Some(e.span()),
                &field("enforcement"),
                format!("must be \"auto\", \"engine\", \"client\" or \"none\", not {other:?}"),
            )
        }
    };
    if decisions && enforcement == Configured::Client {
        return cx.err(
            rr.enforcement.as_ref().map(|e| e.span()),
            &field("enforcement"),
            "a decision resource (decisions = true) needs pg_co: engine mode, not client",
        );
    }
    let max = super::types::CLIENT_HELPER_BLOCK_MAX;
    let client_helper_block = match &rr.client_helper_block {
        None => super::types::CLIENT_HELPER_BLOCK_DEFAULT,
        Some(b) if *b.get_ref() == 0 || *b.get_ref() > max as u64 => {
            return cx.err(Some(b.span()), &field("client_helper_block"), format!("must be between 1 and {max}"))
        }
        Some(b) => *b.get_ref() as i32,
    };
    Ok(Resource {
        name: name.clone(),
        kind,
        dsn: dsn.clone(),
        pool_size,
        decisions,
        tls,
        enforcement,
        client_helper_block,
    })
}

#[cfg(test)]
mod tests;

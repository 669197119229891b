//! From the TOML text to a checked `Config`, section by section; the first error stops
//! it, with its line and field.

use super::check::{line_of, pg_dsn_hint, relative_to, Ctx};
use super::raw::RawConfig;
use super::types::*;
use crate::naming;
use std::net::SocketAddr;

pub fn load(path: &str) -> Result<Config, ConfigError> {
    let src = std::fs::read_to_string(path).map_err(|e| ConfigError {
        line: None,
        field: "(file)".into(),
        message: format!("cannot read {path}: {e}"),
    })?;
    parse(&src, std::path::Path::new(path).parent())
}

pub fn parse(src: &str, base: Option<&std::path::Path>) -> Result<Config, ConfigError> {
    let raw: RawConfig = toml::from_str(src).map_err(|e| {
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
    })?;
    let cx = Ctx { src };

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
    let listen: SocketAddr = match &raw.listen {
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
    };
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
    let witness_file = match raw.store.as_ref().and_then(|s| s.get_ref().witness_file.as_ref()) {
        Some(w) if w.get_ref().is_empty() => return cx.err(Some(w.span()), "store.witness_file", "must not be empty"),
        Some(w) => Some(relative_to(base, w.get_ref()).display().to_string()),
        None => None,
    };
    let store = match &raw.store {
        None => StoreConfig::Sqlite {
            path: "cotx-decisions.db".into(),
            group_commit: true,
            max_batch: 1024,
            commit_delay_us: 0,
        },
        Some(s) => {
            let sp = s.span();
            let s = s.get_ref();
            let max_batch = match &s.max_batch {
                None => 1024,
                Some(m) if *m.get_ref() == 0 || *m.get_ref() > 100_000 => {
                    return cx.err(Some(m.span()), "store.max_batch", "must be between 1 and 100000")
                }
                Some(m) => *m.get_ref() as usize,
            };
            let group_commit = s.group_commit.unwrap_or(true);
            // As PostgreSQL's commit_delay (0 to 100000 microseconds); it only has decisions
            // to gather with group commit on.
            let commit_delay_us = match &s.commit_delay_us {
                None => 0,
                Some(d) if *d.get_ref() > 100_000 => {
                    return cx.err(
                        Some(d.span()),
                        "store.commit_delay_us",
                        "must be between 0 and 100000 (microseconds)",
                    )
                }
                Some(d) if *d.get_ref() > 0 && !group_commit => {
                    return cx.err(
                        Some(d.span()),
                        "store.commit_delay_us",
                        "needs group_commit = true (with one decision per sync there is nothing to wait for)",
                    )
                }
                Some(d) => *d.get_ref(),
            };
            match s.kind.get_ref().as_str() {
                "sqlite" => {
                    if let Some(d) = &s.dsn {
                        return cx.err(Some(d.span()), "store.dsn", "only for kind = \"postgres\"");
                    }
                    for (v, n) in [(&s.tls, "store.tls"), (&s.tls_ca_file, "store.tls_ca_file")] {
                        if let Some(v) = v {
                            return cx.err(Some(v.span()), n, "only for kind = \"postgres\"");
                        }
                    }
                    let path = match &s.path {
                        Some(p) if !p.get_ref().is_empty() => p.get_ref().clone(),
                        Some(p) => return cx.err(Some(p.span()), "store.path", "must not be empty"),
                        None => return cx.err(Some(sp), "store.path", "required for kind = \"sqlite\""),
                    };
                    let path = relative_to(base, &path).display().to_string();
                    StoreConfig::Sqlite { path, group_commit, max_batch, commit_delay_us }
                }
                "postgres" => {
                    if let Some(p) = &s.path {
                        return cx.err(Some(p.span()), "store.path", "only for kind = \"sqlite\"");
                    }
                    let dsn = match &s.dsn {
                        Some(d) => {
                            if let Err(e) = d.get_ref().parse::<tokio_postgres::Config>() {
                                return cx.err(
                                    Some(d.span()),
                                    "store.dsn",
                                    format!("not a PostgreSQL connection string: {e}{}", pg_dsn_hint(d.get_ref())),
                                );
                            }
                            d.get_ref().clone()
                        }
                        None => return cx.err(Some(sp), "store.dsn", "required for kind = \"postgres\""),
                    };
                    let table = match &s.table {
                        None => "cotx_decisions".to_string(),
                        Some(t) => {
                            let ok = !t.get_ref().is_empty()
                                && t.get_ref().len() <= 48
                                && t.get_ref()
                                    .bytes()
                                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                                && !t.get_ref().as_bytes()[0].is_ascii_digit();
                            if !ok {
                                return cx.err(
                                    Some(t.span()),
                                    "store.table",
                                    "must be a lowercase SQL identifier ([a-z_][a-z0-9_]*, ≤ 48)",
                                );
                            }
                            t.get_ref().clone()
                        }
                    };
                    let tls = cx.db_tls(
                        base,
                        "store.",
                        ResourceKind::Postgres,
                        s.dsn.as_ref().unwrap(),
                        &s.tls,
                        &s.tls_ca_file,
                    )?;
                    StoreConfig::Postgres { dsn, table, group_commit, max_batch, commit_delay_us, tls }
                }
                other => {
                    return cx.err(
                        Some(s.kind.span()),
                        "store.kind",
                        format!("unknown store kind {other:?}; expected \"sqlite\" or \"postgres\""),
                    )
                }
            }
        }
    };
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
    let m = &raw.limits;
    let limits = Limits {
        max_active: cx.ms(&m.max_active, "limits.max_active", 10_000, 1, 10_000_000)? as usize,
        max_transaction_ms: cx.ms(&m.max_transaction_ms, "limits.max_transaction_ms", 3_600_000, 10, 86_400_000)?,
        max_connections: cx.ms(&m.max_connections, "limits.max_connections", 1024, 1, 1_000_000)? as usize,
        header_timeout_ms: cx.ms(&m.header_timeout_ms, "limits.header_timeout_ms", 5_000, 10, 600_000)?,
        idle_timeout_ms: cx.ms(&m.idle_timeout_ms, "limits.idle_timeout_ms", 60_000, 10, 3_600_000)?,
    };
    if timeouts.transaction_ms > limits.max_transaction_ms {
        return cx.err(
            t.transaction_ms.as_ref().map(|s| s.span()),
            "timeouts.transaction_ms",
            "must be <= limits.max_transaction_ms",
        );
    }
    let log = Log {
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
    };
    let telemetry = Telemetry {
        otlp_endpoint: match &raw.telemetry.otlp_endpoint {
            None => None,
            Some(e) => match crate::telemetry::otlp::parse_endpoint(e.get_ref()) {
                Ok(_) => Some(e.get_ref().trim_end_matches('/').to_string()),
                Err(m) => return cx.err(Some(e.span()), "telemetry.otlp_endpoint", m),
            },
        },
    };
    let rel = |p: &str| relative_to(base, p).display().to_string();
    let tls = match &raw.tls {
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
    };
    let advertise_url = match &raw.advertise_url {
        None => format!("{}://{listen}", if tls.is_some() { "https" } else { "http" }),
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
    };
    let mut resources: Vec<Resource> = Vec::new();
    for (i, r) in raw.resources.iter().enumerate() {
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
        let bad = match kind {
            ResourceKind::Postgres => {
                dsn.parse::<tokio_postgres::Config>().err().map(|e| format!("{e}{}", pg_dsn_hint(dsn)))
            }
            ResourceKind::Mariadb => mysql_async::Opts::from_url(dsn).err().map(|e| e.to_string()),
        };
        if let Some(e) = bad {
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
        use crate::participants::enforcement::Configured;
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
        resources.push(Resource { name: name.clone(), kind, dsn: dsn.clone(), pool_size, decisions, tls, enforcement });
    }
    let witness_file = witness_file.or(match &store {
        StoreConfig::Sqlite { path, .. } => Some(format!("{path}.witness")),
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

#[cfg(test)]
mod tests;

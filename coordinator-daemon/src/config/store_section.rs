//! The `[store]` section, from the TOML as given to a checked `StoreConfig`: the kind
//! (SQLite, PostgreSQL or the append-only log), its batching, its connection and TLS, the witness file.

use super::check::{dsn_error, relative_to, Ctx};
use super::raw::{RawConfig, RawStore};
use super::types::*;

/// How the store gathers decisions into one transaction (both kinds).
#[derive(Clone, Copy)]
struct Batching {
    group_commit: bool,
    max_batch: usize,
    commit_delay_us: u64,
}

/// `[store]` and its witness file.
pub(super) fn store(
    cx: &Ctx,
    base: Option<&std::path::Path>,
    raw: &RawConfig,
) -> Result<(StoreConfig, Option<String>), ConfigError> {
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
            let batching = Batching { group_commit, max_batch, commit_delay_us };
            if let Some(m) = s.sync_method.as_ref().filter(|_| s.kind.get_ref() != "log") {
                return cx.err(
                    Some(m.span()),
                    "store.sync_method",
                    "only for kind = \"log\" (SQLite and PostgreSQL sync their own files)",
                );
            }
            match s.kind.get_ref().as_str() {
                "sqlite" | "log" => file_store(cx, base, sp, s, batching)?,
                "postgres" => postgres_store(cx, base, sp, s, batching)?,
                other => {
                    return cx.err(
                        Some(s.kind.span()),
                        "store.kind",
                        format!("unknown store kind {other:?}; expected \"sqlite\", \"postgres\" or \"log\""),
                    )
                }
            }
        }
    };
    Ok((store, witness_file))
}

/// `kind = "sqlite"` or `"log"`: one file at `path`, relative to the config file.
fn file_store(
    cx: &Ctx,
    base: Option<&std::path::Path>,
    sp: std::ops::Range<usize>,
    s: &RawStore,
    b: Batching,
) -> Result<StoreConfig, ConfigError> {
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
        None => return cx.err(Some(sp), "store.path", format!("required for kind = {:?}", s.kind.get_ref())),
    };
    let path = relative_to(base, &path).display().to_string();
    let Batching { group_commit, max_batch, commit_delay_us } = b;
    // As PostgreSQL's wal_sync_method: how each batch is made durable.
    let sync_method = match &s.sync_method {
        None => SyncMethod::default(),
        Some(m) => match SyncMethod::parse(m.get_ref()) {
            Some(m) => m,
            None => {
                return cx.err(
                    Some(m.span()),
                    "store.sync_method",
                    format!("unknown sync method {:?}; expected {}", m.get_ref(), SyncMethod::NAMES),
                )
            }
        },
    };
    Ok(match s.kind.get_ref().as_str() {
        "log" => StoreConfig::Log { path, group_commit, max_batch, commit_delay_us, sync_method },
        _ => StoreConfig::Sqlite { path, group_commit, max_batch, commit_delay_us },
    })
}

fn postgres_store(
    cx: &Ctx,
    base: Option<&std::path::Path>,
    sp: std::ops::Range<usize>,
    s: &RawStore,
    b: Batching,
) -> Result<StoreConfig, ConfigError> {
    if let Some(p) = &s.path {
        return cx.err(Some(p.span()), "store.path", "only for kind = \"sqlite\" or \"log\"");
    }
    let Some(dsn) = &s.dsn else { return cx.err(Some(sp), "store.dsn", "required for kind = \"postgres\"") };
    if let Some(why) = dsn_error(ResourceKind::Postgres, dsn.get_ref()) {
        return cx.err(Some(dsn.span()), "store.dsn", format!("not a PostgreSQL connection string: {why}"));
    }
    let table = match &s.table {
        None => "cotx_decisions".to_string(),
        Some(t) => {
            let ok = !t.get_ref().is_empty()
                && t.get_ref().len() <= 48
                && t.get_ref().bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
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
    let tls = cx.db_tls(base, "store.", ResourceKind::Postgres, dsn, &s.tls, &s.tls_ca_file)?;
    let Batching { group_commit, max_batch, commit_delay_us } = b;
    Ok(StoreConfig::Postgres { dsn: dsn.get_ref().clone(), table, group_commit, max_batch, commit_delay_us, tls })
}

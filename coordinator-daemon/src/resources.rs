//! The daemon's own connections to the resources: list our prepared branches, and commit
//! or roll back a branch whose owner is gone. Connections are made lazily and dropped on
//! error, so a database that was down is simply reconnected at the next attempt.

use crate::config::{Resource, ResourceKind};
use crate::naming;
use crate::state::Outcome;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

/// What happened when the daemon tried to finish a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// We committed / rolled it back.
    Done,
    /// Not prepared there (any more): somebody finished it before us.
    Gone,
    /// MariaDB: the owner's session still holds it; try again later.
    OwnerAttached,
    /// Finished, but not as decided (MariaDB 1402 on a read-only branch lost with its
    /// session). Recorded, never retried.
    Incident(String),
    /// Database unreachable or another error: retry with backoff.
    Retry(String),
}

pub struct ResourceClient {
    pub name: String,
    #[allow(dead_code)]
    pub kind: ResourceKind,
    prefix: String,
    inner: Inner,
}

enum Inner {
    Pg { cfg: tokio_postgres::Config, conns: Vec<Mutex<Option<tokio_postgres::Client>>>, next: AtomicUsize },
    Maria { pool: mysql_async::Pool },
}

impl ResourceClient {
    pub fn new(r: &Resource, prefix: &str) -> Result<ResourceClient, String> {
        let inner = match r.kind {
            ResourceKind::Postgres => {
                let mut cfg: tokio_postgres::Config = r.dsn.parse().map_err(|e| format!("{}: {e}", r.name))?;
                cfg.connect_timeout(CONNECT_TIMEOUT);
                cfg.application_name("cotx-coordinator");
                Inner::Pg { cfg, conns: (0..r.pool_size).map(|_| Mutex::new(None)).collect(), next: AtomicUsize::new(0) }
            }
            ResourceKind::Mariadb => {
                let opts = mysql_async::Opts::from_url(&r.dsn).map_err(|e| format!("{}: {e}", r.name))?;
                let constraints = mysql_async::PoolConstraints::new(0, r.pool_size).unwrap_or_default();
                let opts = mysql_async::OptsBuilder::from_opts(opts)
                    .pool_opts(mysql_async::PoolOpts::default().with_constraints(constraints))
                    .prefer_socket(false);
                Inner::Maria { pool: mysql_async::Pool::new(opts) }
            }
        };
        Ok(ResourceClient { name: r.name.clone(), kind: r.kind, prefix: prefix.to_string(), inner })
    }

    async fn pg_simple(&self, sql: &str) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error> {
        let Inner::Pg { cfg, conns, next } = &self.inner else { unreachable!() };
        let slot = &conns[next.fetch_add(1, Ordering::Relaxed) % conns.len()];
        let mut guard = slot.lock().await;
        if guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            let (client, conn) = cfg.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            *guard = Some(client);
        }
        let r = guard.as_ref().unwrap().simple_query(sql).await;
        if r.is_err() && guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            *guard = None;
        }
        r
    }

    /// Our prepared branches on this resource, as (gtid, branch id).
    pub async fn list_prepared(&self) -> Result<Vec<(String, String)>, String> {
        match tokio::time::timeout(QUERY_TIMEOUT, self.list_prepared_inner()).await {
            Ok(r) => r,
            Err(_) => Err(format!("{}: timed out listing prepared transactions", self.name)),
        }
    }

    async fn list_prepared_inner(&self) -> Result<Vec<(String, String)>, String> {
        match &self.inner {
            Inner::Pg { .. } => {
                let like = format!("{}:%", self.prefix);
                let sql = format!("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE {}", naming::quote_pg(&like));
                let msgs = self.pg_simple(&sql).await.map_err(|e| format!("{}: {e}", self.name))?;
                Ok(msgs
                    .into_iter()
                    .filter_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|g| naming::parse_pg_gid(&self.prefix, g)),
                        _ => None,
                    })
                    .collect())
            }
            Inner::Maria { pool } => {
                use mysql_async::prelude::Queryable;
                let mut conn = pool.get_conn().await.map_err(|e| format!("{}: {e}", self.name))?;
                let rows: Vec<(i64, i64, i64, Vec<u8>)> =
                    conn.query("XA RECOVER").await.map_err(|e| format!("{}: {e}", self.name))?;
                Ok(rows
                    .into_iter()
                    .filter_map(|(f, gl, bl, data)| naming::parse_xa_row(f, gl.max(0) as usize, bl.max(0) as usize, &data))
                    .collect())
            }
        }
    }

    /// Gives one branch its outcome from the daemon's own connection.
    pub async fn complete(&self, gtid: &str, bid: &str, outcome: Outcome) -> Completion {
        match tokio::time::timeout(QUERY_TIMEOUT, self.complete_inner(gtid, bid, outcome)).await {
            Ok(r) => r,
            Err(_) => Completion::Retry(format!("{}: timed out", self.name)),
        }
    }

    async fn complete_inner(&self, gtid: &str, bid: &str, outcome: Outcome) -> Completion {
        match &self.inner {
            Inner::Pg { .. } => {
                let gid = match naming::pg_gid(&self.prefix, gtid, bid) {
                    Ok(g) => g,
                    Err(e) => return Completion::Incident(e.message),
                };
                let verb = match outcome {
                    Outcome::Commit => "COMMIT PREPARED",
                    Outcome::Abort => "ROLLBACK PREPARED",
                };
                match self.pg_simple(&format!("{verb} {}", naming::quote_pg(&gid))).await {
                    Ok(_) => Completion::Done,
                    Err(e) => match e.code().map(|c| c.code()) {
                        // undefined_object: no such prepared transaction (finished already).
                        Some("42704") => Completion::Gone,
                        // object_in_use: its owner is finishing it right now.
                        Some("55000") => Completion::OwnerAttached,
                        _ => Completion::Retry(format!("{}: {e}", self.name)),
                    },
                }
            }
            Inner::Maria { pool } => {
                use mysql_async::prelude::Queryable;
                let xid = match naming::xa_xid_sql(gtid, bid) {
                    Ok(x) => x,
                    Err(e) => return Completion::Incident(e.message),
                };
                let mut conn = match pool.get_conn().await {
                    Ok(c) => c,
                    Err(e) => return Completion::Retry(format!("{}: {e}", self.name)),
                };
                // XA COMMIT answers 1397 both for "unknown" and for "attached to a live
                // session": XA RECOVER tells them apart (it lists attached ones too).
                let rows: Vec<(i64, i64, i64, Vec<u8>)> = match conn.query("XA RECOVER").await {
                    Ok(r) => r,
                    Err(e) => return Completion::Retry(format!("{}: {e}", self.name)),
                };
                let listed = rows.iter().any(|(f, gl, bl, d)| {
                    naming::parse_xa_row(*f, (*gl).max(0) as usize, (*bl).max(0) as usize, d)
                        .map(|(g, b)| g == gtid && b == bid)
                        .unwrap_or(false)
                });
                if !listed {
                    return Completion::Gone;
                }
                let verb = match outcome {
                    Outcome::Commit => "XA COMMIT",
                    Outcome::Abort => "XA ROLLBACK",
                };
                match conn.query_drop(format!("{verb} {xid}")).await {
                    Ok(()) => Completion::Done,
                    Err(mysql_async::Error::Server(se)) => match (se.code, outcome) {
                        (1397, _) | (1399, _) | (1440, _) => Completion::OwnerAttached,
                        // XA_RBROLLBACK and friends (1402..=1404, 1614): the branch was rolled
                        // back behind our back (read-only branch whose session closed).
                        (1402..=1404 | 1614, Outcome::Commit) => {
                            Completion::Incident(format!("{}: {} ({}): branch was rolled back, not committed", self.name, se.message, se.code))
                        }
                        (1402..=1404 | 1614, Outcome::Abort) => Completion::Done,
                        _ => Completion::Retry(format!("{}: {} ({})", self.name, se.message, se.code)),
                    },
                    Err(e) => Completion::Retry(format!("{}: {e}", self.name)),
                }
            }
        }
    }

    /// What a prepared branch is doing to others, for operators: locks it holds
    /// (PostgreSQL) and sessions on the resource waiting for a prepared transaction.
    pub async fn blocking_info(&self, gtid: &str, bid: &str) -> serde_json::Value {
        use serde_json::json;
        let r = tokio::time::timeout(QUERY_TIMEOUT, async {
            match &self.inner {
                Inner::Pg { .. } => {
                    let gid = naming::pg_gid(&self.prefix, gtid, bid).map_err(|e| e.message)?;
                    // Locks of a prepared transaction keep its old virtualtransaction and a
                    // null pid; pg_blocking_pids() reports such a holder as pid 0.
                    let sql = format!(
                        "SELECT (SELECT count(*) FROM pg_locks l2 WHERE l2.pid IS NULL AND l2.virtualtransaction IN \
                           (SELECT l1.virtualtransaction FROM pg_locks l1 JOIN pg_prepared_xacts p \
                              ON l1.locktype = 'transactionid' AND l1.transactionid = p.transaction WHERE p.gid = {})), \
                         (SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND 0 = ANY(pg_blocking_pids(pid)))",
                        naming::quote_pg(&gid)
                    );
                    let msgs = self.pg_simple(&sql).await.map_err(|e| e.to_string())?;
                    for m in msgs {
                        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                            let held: i64 = r.get(0).and_then(|v| v.parse().ok()).unwrap_or(0);
                            let waiting: i64 = r.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
                            return Ok(json!({"locks_held": held, "sessions_waiting_on_prepared": waiting}));
                        }
                    }
                    Err("no row".to_string())
                }
                Inner::Maria { pool } => {
                    use mysql_async::prelude::Queryable;
                    let mut conn = pool.get_conn().await.map_err(|e| e.to_string())?;
                    let n: Option<i64> = conn
                        .query_first("SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS")
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(json!({"lock_waits_on_resource": n.unwrap_or(0)}))
                }
            }
        })
        .await;
        match r {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => json!({"error": e}),
            Err(_) => json!({"error": "timed out"}),
        }
    }
}

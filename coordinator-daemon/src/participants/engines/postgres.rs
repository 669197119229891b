//! PostgreSQL resources: a small pool of connections made lazily and dropped on error,
//! node locks as session advisory locks, prepared transactions in `pg_prepared_xacts`.

use super::engine::{Engine, Fut, Wait, CONNECT_TIMEOUT, QUERY_TIMEOUT};
use super::error::ResourceError;
use super::node_locks::{Attempt, LockSessions, NodeLocks};
use crate::config::Resource;
use crate::naming;
use crate::participants::branch_sql::{self, Completion};
use crate::state::Outcome;
use crate::wire::Blocking;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Mutex;
use tokio_postgres::{Client, SimpleQueryMessage};

/// A driver error with what the database said: SQLSTATE and message (not "db error").
pub fn pg_err(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {} (SQLSTATE {})", d.severity(), d.message(), d.code().code()),
        None => crate::dbtls::chain(e),
    }
}

/// A driver error as a `ResourceError` of its kind, its text `msg`.
fn failed(e: &tokio_postgres::Error, msg: String) -> ResourceError {
    ResourceError::from_driver(e.as_db_error().is_some(), msg)
}

/// The first column of the first row of a simple query's answer.
pub(crate) fn simple_first(msgs: &[SimpleQueryMessage]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

// A prepared transaction holds its locks without a session: pg_blocking_pids() reports it
// as 0. Such an edge cannot close a cycle the detector could break by a cancel (the
// prepared branch waits for nobody), so it is left out.
const WAITS: &str = "SELECT w.pid, b.pid, \
       coalesce((SELECT string_agg(DISTINCT l.relation::regclass::text, ',') FROM pg_locks l \
                  WHERE l.pid = w.pid AND l.relation IS NOT NULL AND l.locktype = 'relation' \
                    AND l.relation >= 16384), '') \
  FROM (SELECT DISTINCT pid FROM pg_locks WHERE NOT granted AND pid IS NOT NULL) w, \
       LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid) \
 WHERE b.pid <> 0";

pub(crate) struct Postgres {
    name: String,
    prefix: String,
    cfg: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    conns: Vec<Mutex<Option<Client>>>,
    next: AtomicUsize,
    /// The connection holding each node's lock.
    locks: NodeLocks<Client>,
}

impl Postgres {
    pub(crate) fn new(r: &Resource, prefix: &str, node: &str) -> Result<Postgres, String> {
        let (mut cfg, tls) = crate::dbtls::pg(&r.dsn, r.tls.as_ref()).map_err(|e| format!("{}: {e}", r.name))?;
        cfg.connect_timeout(CONNECT_TIMEOUT);
        cfg.application_name(format!("cotx-coordinator:{node}"));
        Ok(Postgres {
            name: r.name.clone(),
            prefix: prefix.to_string(),
            cfg,
            tls,
            conns: (0..r.pool_size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            locks: NodeLocks::new(),
        })
    }

    async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        let (client, conn) = self.cfg.connect(self.tls.clone()).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(client)
    }

    /// One statement on the next pooled connection, made again if it was closed.
    pub(crate) async fn simple(&self, sql: &str) -> Result<Vec<SimpleQueryMessage>, tokio_postgres::Error> {
        let slot = &self.conns[self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len()];
        let mut guard = slot.lock().await;
        if guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            *guard = Some(self.connect().await?);
        }
        let r = guard.as_ref().unwrap().simple_query(sql).await;
        if r.is_err() && guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            *guard = None;
        }
        r
    }

    /// Several statements in one round trip on one connection; on an error the same
    /// connection is rolled back, so a failed explicit transaction block is not left open
    /// for the next user of that connection.
    pub(crate) async fn batch(&self, sql: &str) -> Result<Vec<SimpleQueryMessage>, String> {
        let slot = &self.conns[self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len()];
        let mut guard = slot.lock().await;
        if guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            *guard = Some(self.connect().await.map_err(|e| format!("{}: {}", self.name, pg_err(&e)))?);
        }
        let client = guard.as_ref().unwrap();
        match tokio::time::timeout(QUERY_TIMEOUT, client.simple_query(sql)).await {
            Ok(Ok(m)) => Ok(m),
            Ok(Err(e)) => {
                if client.is_closed() || client.simple_query("ROLLBACK").await.is_err() {
                    *guard = None;
                }
                Err(format!("{}: {}", self.name, pg_err(&e)))
            }
            Err(_) => {
                *guard = None; // a statement may still be running on it: drop the connection
                Err(format!("{}: timed out", self.name))
            }
        }
    }

    async fn blocking_inner(&self, gtid: &str, bid: &str) -> Result<Blocking, ResourceError> {
        let gid = naming::pg_gid(&self.prefix, gtid, bid).map_err(|e| ResourceError::Sql(e.message))?;
        // Locks of a prepared transaction keep its old virtualtransaction and a null pid;
        // pg_blocking_pids() reports such a holder as pid 0.
        let sql = format!(
            "SELECT (SELECT count(*) FROM pg_locks l2 WHERE l2.pid IS NULL AND l2.virtualtransaction IN \
               (SELECT l1.virtualtransaction FROM pg_locks l1 JOIN pg_prepared_xacts p \
                  ON l1.locktype = 'transactionid' AND l1.transactionid = p.transaction WHERE p.gid = {})), \
             (SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND 0 = ANY(pg_blocking_pids(pid)))",
            naming::quote_pg(&gid)
        );
        let msgs = self.simple(&sql).await.map_err(|e| failed(&e, pg_err(&e)))?;
        for m in msgs {
            if let SimpleQueryMessage::Row(r) = m {
                let held: i64 = r.get(0).and_then(|v| v.parse().ok()).unwrap_or(0);
                let waiting: i64 = r.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
                return Ok(Blocking {
                    locks_held: Some(held),
                    sessions_waiting_on_prepared: Some(waiting),
                    ..Blocking::default()
                });
            }
        }
        Err(ResourceError::Sql("no row".to_string()))
    }
}

/// Node locks as session advisory locks.
impl LockSessions for Postgres {
    type Conn = Client;

    fn still_held<'a>(&'a self, conn: &'a mut Client, _lock: &'a str) -> Fut<'a, bool> {
        Box::pin(async move { !conn.is_closed() })
    }

    fn attempt<'a>(&'a self, lock: &'a str) -> Fut<'a, Result<Attempt<Client>, ResourceError>> {
        Box::pin(async move {
            let client = self
                .connect()
                .await
                .map_err(|e| ResourceError::Unreachable(format!("{}: {}", self.name, pg_err(&e))))?;
            let key = format!("{}, hashtext({})", naming::XA_FORMAT_ID, naming::quote_pg(lock));
            let got = client
                .simple_query(&format!("SELECT pg_try_advisory_lock({key})"))
                .await
                .map_err(|e| failed(&e, pg_err(&e)))?;
            if simple_first(&got).as_deref() == Some("t") {
                return Ok(Attempt::Taken(client));
            }
            let holder_q = format!(
                "SELECT l.pid::text || ' (' || coalesce(a.application_name, '') || ')' FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid) \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ({})::oid \
                   AND l.objid = (hashtext({}))::oid AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                naming::XA_FORMAT_ID, naming::quote_pg(lock)
            );
            let holder = client.simple_query(&holder_q).await.ok().and_then(|m| simple_first(&m)).unwrap_or_default();
            let pid = holder.split_whitespace().next().unwrap_or("0").parse::<i64>().unwrap_or(0);
            Ok(Attempt::HeldBy { conn: client, said: format!("pid {holder}"), session: pid })
        })
    }

    fn end<'a>(&'a self, conn: &'a mut Client, pid: i64) -> Fut<'a, ()> {
        Box::pin(async move {
            let _ = conn.simple_query(&format!("SELECT pg_terminate_backend({pid})")).await;
        })
    }
}

impl Engine for Postgres {
    fn hold_lock<'a>(&'a self, node: &'a str, lock: &'a str, fence: bool) -> Fut<'a, Result<(), ResourceError>> {
        Box::pin(self.locks.hold(self, &self.name, node, lock, fence))
    }

    fn release_lock<'a>(&'a self, node: &'a str) -> Fut<'a, ()> {
        Box::pin(self.locks.release(node))
    }

    fn server_identity(&self) -> Fut<'_, Result<String, ResourceError>> {
        Box::pin(async move {
            let m = self
                .simple("SELECT current_database() || '@' || coalesce(inet_server_addr()::text, 'local') || ':' || current_setting('port') || ':' || current_setting('data_directory')")
                .await
                .map_err(|e| failed(&e, pg_err(&e)))?;
            simple_first(&m).ok_or_else(|| ResourceError::Sql("no row".into()))
        })
    }

    fn list_prepared(&self) -> Fut<'_, Result<Vec<(String, String)>, ResourceError>> {
        Box::pin(async move {
            let msgs = self
                .simple(&branch_sql::pg_list_prepared(&self.prefix))
                .await
                .map_err(|e| failed(&e, format!("{}: {}", self.name, pg_err(&e))))?;
            Ok(msgs
                .into_iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(r) => r.get(0).and_then(|g| naming::parse_pg_gid(&self.prefix, g)),
                    _ => None,
                })
                .collect())
        })
    }

    /// `prepared_ms_ago` matters to MariaDB only.
    fn complete<'a>(&'a self, gtid: &'a str, bid: &'a str, outcome: Outcome, _: u64) -> Fut<'a, Completion> {
        Box::pin(async move {
            let sql = match branch_sql::pg_finish(&self.prefix, gtid, bid, outcome) {
                Ok(q) => q,
                Err(e) => return Completion::Incident(e),
            };
            match self.simple(&sql).await {
                Ok(_) => Completion::Done,
                Err(e) => branch_sql::pg_refused(e.code().map(|c| c.code()), format!("{}: {}", self.name, pg_err(&e))),
            }
        })
    }

    fn blocking<'a>(&'a self, gtid: &'a str, bid: &'a str) -> Fut<'a, Result<Blocking, ResourceError>> {
        Box::pin(self.blocking_inner(gtid, bid))
    }

    fn lock_waits(&self) -> Fut<'_, Result<Vec<Wait>, ResourceError>> {
        Box::pin(async move {
            let msgs = self.simple(WAITS).await.map_err(|e| failed(&e, pg_err(&e)))?;
            Ok(msgs
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(r) => Some(Wait {
                        waiter: r.get(0)?.parse().ok()?,
                        blocker: r.get(1)?.parse().ok()?,
                        on: r.get(2).unwrap_or("").to_string(),
                    }),
                    _ => None,
                })
                .collect())
        })
    }

    fn cancel_if_waiting(&self, session: i64) -> Fut<'_, Result<bool, ResourceError>> {
        Box::pin(async move {
            let sql = format!(
                "SELECT pg_cancel_backend(pid) FROM (SELECT DISTINCT pid FROM pg_locks \
                  WHERE NOT granted AND pid = {session}) w"
            );
            let msgs = self.simple(&sql).await.map_err(|e| failed(&e, pg_err(&e)))?;
            Ok(simple_first(&msgs).as_deref() == Some("t"))
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

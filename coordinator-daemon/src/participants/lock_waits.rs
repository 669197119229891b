//! Who waits for whom at a resource, and cancelling a waiting statement: what the deadlock
//! detector (coordinator/deadlocks.rs) and an abort that must act (a timeout, an operator)
//! need of the databases. Sessions are PostgreSQL backend pids and MariaDB connection
//! ids, as the clients report them at registration.
//!
//! Privileges (docs/ops.md, "Deadlocks across databases"): PostgreSQL reads `pg_locks` and
//! `pg_blocking_pids()`, which every role may; cancelling another role's statement needs
//! membership in `pg_signal_backend`. MariaDB reads `information_schema.INNODB_LOCK_WAITS`
//! (the PROCESS privilege) and cancels with `KILL QUERY` (CONNECTION ADMIN, or the same user).

use crate::config::ResourceKind;
use mysql_async::prelude::Queryable;
use std::time::Duration;

use super::resources::{my_err, pg_err, ResourceClient};

const TIMEOUT: Duration = Duration::from_secs(5);

/// One lock wait at a resource: `waiter` waits for a lock `blocker` holds (both sessions).
/// `on`: what is waited for, for the log (tables; MariaDB adds the index record's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub waiter: i64,
    pub blocker: i64,
    pub on: String,
}

// A prepared transaction holds its locks without a session: pg_blocking_pids() reports it
// as 0, INNODB_TRX as thread 0. Such an edge cannot close a cycle the detector could break
// by a cancel (the prepared branch waits for nobody), so it is left out.
const PG_WAITS: &str = "SELECT w.pid, b.pid, \
       coalesce((SELECT string_agg(DISTINCT l.relation::regclass::text, ',') FROM pg_locks l \
                  WHERE l.pid = w.pid AND l.relation IS NOT NULL AND l.locktype = 'relation' \
                    AND l.relation >= 16384), '') \
  FROM (SELECT DISTINCT pid FROM pg_locks WHERE NOT granted AND pid IS NOT NULL) w, \
       LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid) \
 WHERE b.pid <> 0";

const MARIA_WAITS: &str = "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id, \
       concat(coalesce(l.lock_table, ''), ' ', coalesce(l.lock_index, ''), ' ', coalesce(l.lock_data, '')) \
  FROM information_schema.INNODB_LOCK_WAITS w \
  JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
  JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
  LEFT JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id \
 WHERE r.trx_mysql_thread_id <> 0 AND b.trx_mysql_thread_id <> 0";

impl ResourceClient {
    /// Every lock wait between two sessions at this resource, now.
    pub async fn lock_waits(&self) -> Result<Vec<Wait>, String> {
        let r = tokio::time::timeout(TIMEOUT, async {
            match self.kind {
                ResourceKind::Postgres => {
                    let msgs = self.pg_simple(PG_WAITS).await.map_err(|e| pg_err(&e))?;
                    Ok(msgs
                        .iter()
                        .filter_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::Row(r) => Some(Wait {
                                waiter: r.get(0)?.parse().ok()?,
                                blocker: r.get(1)?.parse().ok()?,
                                on: r.get(2).unwrap_or("").to_string(),
                            }),
                            _ => None,
                        })
                        .collect())
                }
                ResourceKind::Mariadb => {
                    let mut conn = self.maria_conn().await?;
                    let rows: Vec<(i64, i64, String)> = conn.query(MARIA_WAITS).await.map_err(|e| my_err(&e))?;
                    Ok(rows
                        .into_iter()
                        .map(|(waiter, blocker, on)| Wait { waiter, blocker, on: on.trim().into() })
                        .collect())
                }
            }
        })
        .await;
        r.unwrap_or_else(|_| Err(format!("{}: reading lock waits timed out", self.name)))
    }

    /// Cancels the statement of `session` if it is waiting for a lock right now (a session
    /// that stopped waiting, or whose id now names another session, is left alone).
    /// Ok(true): a cancel was sent.
    pub async fn cancel_if_waiting(&self, session: i64) -> Result<bool, String> {
        let r = tokio::time::timeout(TIMEOUT, async {
            match self.kind {
                ResourceKind::Postgres => {
                    let sql = format!(
                        "SELECT pg_cancel_backend(pid) FROM (SELECT DISTINCT pid FROM pg_locks \
                          WHERE NOT granted AND pid = {session}) w"
                    );
                    let msgs = self.pg_simple(&sql).await.map_err(|e| pg_err(&e))?;
                    Ok(super::resources::simple_first(&msgs).as_deref() == Some("t"))
                }
                ResourceKind::Mariadb => {
                    let mut conn = self.maria_conn().await?;
                    let waiting: Option<i64> = conn
                        .exec_first(
                            "SELECT count(*) FROM information_schema.INNODB_TRX \
                              WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'",
                            (session,),
                        )
                        .await
                        .map_err(|e| my_err(&e))?;
                    if waiting.unwrap_or(0) == 0 {
                        return Ok(false);
                    }
                    conn.query_drop(format!("KILL QUERY {session}")).await.map_err(|e| my_err(&e))?;
                    Ok(true)
                }
            }
        })
        .await;
        r.unwrap_or_else(|_| Err(format!("{}: cancelling session {session} timed out", self.name)))
    }
}

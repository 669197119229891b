//! MariaDB resources: a pool of connections, node locks by GET_LOCK on a connection kept
//! for each, XA branches as XA RECOVER lists them (server-wide).

use super::engine::{Engine, Fut, Wait, QUERY_TIMEOUT};
use super::error::ResourceError;
use super::node_locks::{Attempt, LockSessions, NodeLocks};
use crate::config::Resource;
use crate::naming;
use crate::participants::branch_sql::{self, Completion};
use crate::state::Outcome;
use crate::wire::Blocking;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

/// A driver error with what the server said: its message, error code and SQLSTATE.
pub(crate) fn my_err(e: &mysql_async::Error) -> String {
    match e {
        mysql_async::Error::Server(se) => format!("{} (error {}, SQLSTATE {})", se.message, se.code, se.state),
        other => crate::dbtls::chain(other),
    }
}

/// A driver error as a `ResourceError` of its kind, its text `msg`.
fn failed(e: &mysql_async::Error, msg: String) -> ResourceError {
    ResourceError::from_driver(matches!(e, mysql_async::Error::Server(_)), msg)
}

// A prepared transaction holds its locks without a session: INNODB_TRX reports it as thread
// 0. Such an edge cannot close a cycle the detector could break by a cancel (the prepared
// branch waits for nobody), so it is left out.
const WAITS: &str = "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id, \
       concat(coalesce(l.lock_table, ''), ' ', coalesce(l.lock_index, ''), ' ', coalesce(l.lock_data, '')) \
  FROM information_schema.INNODB_LOCK_WAITS w \
  JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
  JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
  LEFT JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id \
 WHERE r.trx_mysql_thread_id <> 0 AND b.trx_mysql_thread_id <> 0";

pub(crate) struct Mariadb {
    name: String,
    pool: mysql_async::Pool,
    opts: mysql_async::Opts,
    /// The connection holding each node's lock.
    locks: NodeLocks<Conn>,
}

/// Our branches among XA RECOVER's rows, as (gtid, branch id).
fn ours(rows: &[(i64, i64, i64, Vec<u8>)]) -> impl Iterator<Item = (String, String)> + '_ {
    rows.iter().filter_map(|(f, gl, bl, d)| naming::parse_xa_row(*f, (*gl).max(0) as usize, (*bl).max(0) as usize, d))
}

impl Mariadb {
    pub(crate) fn new(r: &Resource) -> Result<Mariadb, String> {
        let opts = mysql_async::Opts::from_url(&r.dsn).map_err(|e| format!("{}: {e}", r.name))?;
        let constraints = mysql_async::PoolConstraints::new(0, r.pool_size).unwrap_or_default();
        let opts = mysql_async::OptsBuilder::from_opts(opts)
            .pool_opts(mysql_async::PoolOpts::default().with_constraints(constraints))
            .prefer_socket(false);
        let opts = crate::dbtls::maria(opts, r.tls.as_ref());
        Ok(Mariadb {
            name: r.name.clone(),
            pool: mysql_async::Pool::new(opts.clone()),
            opts: opts.into(),
            locks: NodeLocks::new(),
        })
    }

    /// A pooled connection, its wait bounded.
    pub(crate) async fn conn(&self) -> Result<Conn, String> {
        match tokio::time::timeout(QUERY_TIMEOUT, self.pool.get_conn()).await {
            Ok(r) => r.map_err(|e| format!("{}: {}", self.name, my_err(&e))),
            Err(_) => Err(format!("{}: timed out connecting", self.name)),
        }
    }

    async fn complete_inner(&self, gtid: &str, bid: &str, outcome: Outcome, prepared_ms_ago: u64) -> Completion {
        let sql = match branch_sql::maria_finish(gtid, bid, outcome) {
            Ok(q) => q,
            Err(e) => return Completion::Incident(e),
        };
        let mut conn = match self.pool.get_conn().await {
            Ok(c) => c,
            Err(e) => return Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
        };
        // XA COMMIT answers 1397 both for "unknown" and for "attached to a live session":
        // XA RECOVER tells them apart (it lists attached ones too).
        let rows: Vec<(i64, i64, i64, Vec<u8>)> = match conn.query("XA RECOVER").await {
            Ok(r) => r,
            Err(e) => return Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
        };
        if !ours(&rows).any(|(g, b)| g == gtid && b == bid) {
            return match outcome {
                Outcome::Commit => self.gone_after_commit(&mut conn, gtid, bid, prepared_ms_ago).await,
                Outcome::Abort => Completion::Gone,
            };
        }
        match conn.query_drop(sql).await {
            Ok(()) => Completion::Done,
            Err(mysql_async::Error::Server(se)) => {
                branch_sql::maria_refused(&self.name, se.code, &se.message, &se.state, outcome)
            }
            Err(e) => Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
        }
    }

    /// A branch of a committed transaction that MariaDB no longer lists, and that its owner
    /// did not report finished: committed by its owner (acknowledgement lost) — or lost, if
    /// it was read-only and its session ended (mysql_co lists it) or the server restarted
    /// since the branch was prepared. The lost cases are incidents, never "finished".
    async fn gone_after_commit(&self, conn: &mut Conn, gtid: &str, bid: &str, prepared_ms_ago: u64) -> Completion {
        // mysql_co spells the XID as XA RECOVER FORMAT='SQL' does; ours are plain text.
        let Ok(sql_xid) = naming::xa_xid_sql(gtid, bid) else { return Completion::Gone };
        let lost: Result<Option<i64>, _> = conn
            .query_first(format!(
                "SELECT COUNT(*) FROM information_schema.MYSQL_CO_LOST_BRANCHES WHERE XID = {}",
                naming::quote_maria(&sql_xid)
            ))
            .await;
        if let Ok(Some(n)) = lost {
            if n > 0 {
                return Completion::Incident(format!(
                    "{}: read-only branch was rolled back when its session ended before the decision (mysql_co lists it as lost)",
                    self.name
                ));
            }
        }
        let up: Result<Option<String>, _> = conn
            .query_first("SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'")
            .await;
        match up {
            Ok(u) => branch_sql::maria_gone(&self.name, u.and_then(|u| u.parse::<u64>().ok()), prepared_ms_ago),
            Err(e) => Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
        }
    }

    async fn cancel_inner(&self, session: i64) -> Result<bool, ResourceError> {
        let mut conn = self.conn().await.map_err(ResourceError::Unreachable)?;
        let waiting: Option<i64> = conn
            .exec_first(
                "SELECT count(*) FROM information_schema.INNODB_TRX \
                  WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'",
                (session,),
            )
            .await
            .map_err(|e| failed(&e, my_err(&e)))?;
        if waiting.unwrap_or(0) == 0 {
            return Ok(false);
        }
        conn.query_drop(format!("KILL QUERY {session}")).await.map_err(|e| failed(&e, my_err(&e)))?;
        Ok(true)
    }
}

/// Node locks by GET_LOCK on a connection kept for each.
impl LockSessions for Mariadb {
    type Conn = Conn;

    fn still_held<'a>(&'a self, conn: &'a mut Conn, lock: &'a str) -> Fut<'a, bool> {
        let q = format!("SELECT IS_USED_LOCK({}) = CONNECTION_ID()", naming::quote_maria(lock));
        Box::pin(async move { matches!(conn.query_first::<Option<i64>, _>(q).await, Ok(Some(Some(1)))) })
    }

    fn attempt<'a>(&'a self, lock: &'a str) -> Fut<'a, Result<Attempt<Conn>, ResourceError>> {
        Box::pin(async move {
            let mut conn = Conn::new(self.opts.clone())
                .await
                .map_err(|e| ResourceError::Unreachable(format!("{}: {}", self.name, my_err(&e))))?;
            let got: Option<Option<i64>> = conn
                .query_first(format!("SELECT GET_LOCK({}, 0)", naming::quote_maria(lock)))
                .await
                .map_err(|e| failed(&e, my_err(&e)))?;
            if got == Some(Some(1)) {
                return Ok(Attempt::Taken(conn));
            }
            let holder: Option<Option<i64>> = conn
                .query_first(format!("SELECT IS_USED_LOCK({})", naming::quote_maria(lock)))
                .await
                .map_err(|e| failed(&e, my_err(&e)))?;
            let holder = holder.flatten().unwrap_or(0);
            Ok(Attempt::HeldBy { conn, said: format!("connection {holder}"), session: holder })
        })
    }

    fn end<'a>(&'a self, conn: &'a mut Conn, holder: i64) -> Fut<'a, ()> {
        Box::pin(async move {
            let _ = conn.query_drop(format!("KILL CONNECTION {holder}")).await;
        })
    }
}

impl Engine for Mariadb {
    fn hold_lock<'a>(&'a self, node: &'a str, lock: &'a str, fence: bool) -> Fut<'a, Result<(), ResourceError>> {
        Box::pin(self.locks.hold(self, &self.name, node, lock, fence))
    }

    fn release_lock<'a>(&'a self, node: &'a str) -> Fut<'a, ()> {
        Box::pin(self.locks.release(node))
    }

    fn server_identity(&self) -> Fut<'_, Result<String, ResourceError>> {
        Box::pin(async move {
            let mut conn = self.pool.get_conn().await.map_err(|e| failed(&e, my_err(&e)))?;
            let v: Option<String> = conn
                .query_first("SELECT CONCAT(@@hostname, ':', @@port, ':', @@datadir)")
                .await
                .map_err(|e| failed(&e, my_err(&e)))?;
            v.ok_or_else(|| ResourceError::Sql("no row".into()))
        })
    }

    fn list_prepared(&self) -> Fut<'_, Result<Vec<(String, String)>, ResourceError>> {
        let failed = |e: mysql_async::Error| failed(&e, format!("{}: {}", self.name, my_err(&e)));
        Box::pin(async move {
            let mut conn = self.pool.get_conn().await.map_err(failed)?;
            let rows: Vec<(i64, i64, i64, Vec<u8>)> = conn.query("XA RECOVER").await.map_err(failed)?;
            Ok(ours(&rows).collect())
        })
    }

    fn complete<'a>(
        &'a self,
        gtid: &'a str,
        bid: &'a str,
        outcome: Outcome,
        prepared_ms_ago: u64,
    ) -> Fut<'a, Completion> {
        Box::pin(self.complete_inner(gtid, bid, outcome, prepared_ms_ago))
    }

    /// XA has no view of a prepared branch's locks: the resource's lock waits, whoever waits.
    fn blocking<'a>(&'a self, _gtid: &'a str, _bid: &'a str) -> Fut<'a, Result<Blocking, ResourceError>> {
        Box::pin(async move {
            let mut conn = self.pool.get_conn().await.map_err(|e| failed(&e, e.to_string()))?;
            let n: Option<i64> = conn
                .query_first("SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS")
                .await
                .map_err(|e| failed(&e, e.to_string()))?;
            Ok(Blocking { lock_waits_on_resource: Some(n.unwrap_or(0)), ..Blocking::default() })
        })
    }

    fn lock_waits(&self) -> Fut<'_, Result<Vec<Wait>, ResourceError>> {
        Box::pin(async move {
            let mut conn = self.conn().await.map_err(ResourceError::Unreachable)?;
            let rows: Vec<(i64, i64, String)> = conn.query(WAITS).await.map_err(|e| failed(&e, my_err(&e)))?;
            Ok(rows.into_iter().map(|(waiter, blocker, on)| Wait { waiter, blocker, on: on.trim().into() }).collect())
        })
    }

    fn cancel_if_waiting(&self, session: i64) -> Fut<'_, Result<bool, ResourceError>> {
        Box::pin(self.cancel_inner(session))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

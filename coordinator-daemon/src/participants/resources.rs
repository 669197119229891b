//! The daemon's own connections to the resources: list our prepared branches, and commit
//! or roll back a branch whose owner is gone. Connections are made lazily and dropped on
//! error, so a database that was down is simply reconnected at the next attempt.
//!
//! Node locks: before the daemon acts for a node at a resource it holds a lock named after
//! the node there (PostgreSQL session advisory lock, MariaDB GET_LOCK) on a connection of
//! its own, so two daemons that share databases but not a store cannot both act as one node.

use crate::config::{Resource, ResourceKind};
use crate::naming;
use crate::state::Outcome;
use crate::wire::Blocking;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Mutex;

/// A driver error with what the database said: SQLSTATE and message (not "db error").
pub fn pg_err(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {} (SQLSTATE {})", d.severity(), d.message(), d.code().code()),
        None => crate::dbtls::chain(e),
    }
}

pub(crate) fn my_err(e: &mysql_async::Error) -> String {
    match e {
        mysql_async::Error::Server(se) => format!("{} (error {}, SQLSTATE {})", se.message, se.code, se.state),
        other => crate::dbtls::chain(other),
    }
}

/// A connection that holds one node's lock at this resource.
enum LockConn {
    Pg(tokio_postgres::Client),
    Maria(mysql_async::Conn),
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

use super::branch_sql;
pub use super::branch_sql::Completion;

pub struct ResourceClient {
    pub name: String,
    pub kind: ResourceKind,
    prefix: String,
    inner: Inner,
    locks: Mutex<HashMap<String, LockConn>>,
}

// One per resource, made once: the size of the PostgreSQL variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Inner {
    Pg {
        cfg: tokio_postgres::Config,
        tls: tokio_postgres_rustls::MakeRustlsConnect,
        conns: Vec<Mutex<Option<tokio_postgres::Client>>>,
        next: AtomicUsize,
    },
    Maria {
        pool: mysql_async::Pool,
        opts: mysql_async::Opts,
    },
}

impl ResourceClient {
    pub fn new(r: &Resource, prefix: &str, node: &str) -> Result<ResourceClient, String> {
        let inner = match r.kind {
            ResourceKind::Postgres => {
                let (mut cfg, tls) =
                    crate::dbtls::pg(&r.dsn, r.tls.as_ref()).map_err(|e| format!("{}: {e}", r.name))?;
                cfg.connect_timeout(CONNECT_TIMEOUT);
                cfg.application_name(format!("cotx-coordinator:{node}"));
                Inner::Pg {
                    cfg,
                    tls,
                    conns: (0..r.pool_size).map(|_| Mutex::new(None)).collect(),
                    next: AtomicUsize::new(0),
                }
            }
            ResourceKind::Mariadb => {
                let opts = mysql_async::Opts::from_url(&r.dsn).map_err(|e| format!("{}: {e}", r.name))?;
                let constraints = mysql_async::PoolConstraints::new(0, r.pool_size).unwrap_or_default();
                let opts = mysql_async::OptsBuilder::from_opts(opts)
                    .pool_opts(mysql_async::PoolOpts::default().with_constraints(constraints))
                    .prefer_socket(false);
                let opts = crate::dbtls::maria(opts, r.tls.as_ref());
                Inner::Maria { pool: mysql_async::Pool::new(opts.clone()), opts: opts.into() }
            }
        };
        Ok(ResourceClient {
            name: r.name.clone(),
            kind: r.kind,
            prefix: prefix.to_string(),
            inner,
            locks: Mutex::new(HashMap::new()),
        })
    }

    fn lock_name(&self, node: &str) -> String {
        branch_sql::lock_name(&self.prefix, node)
    }

    /// Holds (or takes) the lock of `node` at this resource. `fence`: the store says the
    /// current holder's lease ran out, so its lock session is ended and the lock taken.
    /// Err names who holds it.
    pub async fn hold_node_lock(&self, node: &str, fence: bool) -> Result<(), String> {
        match tokio::time::timeout(QUERY_TIMEOUT, self.hold_node_lock_inner(node, fence)).await {
            Ok(r) => r,
            Err(_) => Err(format!("{}: timed out taking the node lock", self.name)),
        }
    }

    async fn hold_node_lock_inner(&self, node: &str, fence: bool) -> Result<(), String> {
        let name = self.lock_name(node);
        let mut locks = self.locks.lock().await;
        // Still held? (A restarted database or a cut connection loses it.)
        let alive = match locks.get_mut(node) {
            Some(LockConn::Pg(c)) => !c.is_closed(),
            Some(LockConn::Maria(c)) => {
                use mysql_async::prelude::Queryable;
                matches!(
                    c.query_first::<Option<i64>, _>(format!(
                        "SELECT IS_USED_LOCK({}) = CONNECTION_ID()",
                        naming::quote_maria(&name)
                    ))
                    .await,
                    Ok(Some(Some(1)))
                )
            }
            None => false,
        };
        if alive {
            return Ok(());
        }
        locks.remove(node);
        let who = format!("{}: node {node} is held by another session on this resource", self.name);
        for attempt in 0..3 {
            match &self.inner {
                Inner::Pg { cfg, tls, .. } => {
                    let (client, conn) =
                        cfg.connect(tls.clone()).await.map_err(|e| format!("{}: {}", self.name, pg_err(&e)))?;
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    let key = format!("{}, hashtext({})", naming::XA_FORMAT_ID, naming::quote_pg(&name));
                    let got = client
                        .simple_query(&format!("SELECT pg_try_advisory_lock({key})"))
                        .await
                        .map_err(|e| pg_err(&e))?;
                    if simple_first(&got).as_deref() == Some("t") {
                        locks.insert(node.to_string(), LockConn::Pg(client));
                        return Ok(());
                    }
                    let holder_q = format!(
                        "SELECT l.pid::text || ' (' || coalesce(a.application_name, '') || ')' FROM pg_locks l LEFT JOIN pg_stat_activity a USING (pid) \
                         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ({})::oid \
                           AND l.objid = (hashtext({}))::oid AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                        naming::XA_FORMAT_ID, naming::quote_pg(&name)
                    );
                    let holder =
                        client.simple_query(&holder_q).await.ok().and_then(|m| simple_first(&m)).unwrap_or_default();
                    if !fence || attempt == 2 {
                        return Err(format!("{who} (pid {holder})"));
                    }
                    let pid = holder.split_whitespace().next().unwrap_or("0").to_string();
                    let _ = client
                        .simple_query(&format!("SELECT pg_terminate_backend({})", pid.parse::<i64>().unwrap_or(0)))
                        .await;
                }
                Inner::Maria { opts, .. } => {
                    use mysql_async::prelude::Queryable;
                    let mut conn = mysql_async::Conn::new(opts.clone())
                        .await
                        .map_err(|e| format!("{}: {}", self.name, my_err(&e)))?;
                    let got: Option<Option<i64>> = conn
                        .query_first(format!("SELECT GET_LOCK({}, 0)", naming::quote_maria(&name)))
                        .await
                        .map_err(|e| my_err(&e))?;
                    if got == Some(Some(1)) {
                        locks.insert(node.to_string(), LockConn::Maria(conn));
                        return Ok(());
                    }
                    let holder: Option<Option<i64>> = conn
                        .query_first(format!("SELECT IS_USED_LOCK({})", naming::quote_maria(&name)))
                        .await
                        .map_err(|e| my_err(&e))?;
                    let holder = holder.flatten().unwrap_or(0);
                    if !fence || attempt == 2 {
                        return Err(format!("{who} (connection {holder})"));
                    }
                    let _ = conn.query_drop(format!("KILL CONNECTION {holder}")).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(who)
    }

    /// Gives up the lock of a node taken over (its branches are finished).
    pub async fn release_node_lock(&self, node: &str) {
        self.locks.lock().await.remove(node);
    }

    /// What identifies the server behind this resource: two MariaDB resources on one server
    /// would list (and complete) each other's branches, since XA RECOVER is server-wide.
    pub async fn server_identity(&self) -> Result<String, String> {
        match &self.inner {
            Inner::Pg { .. } => {
                let m = self
                    .pg_simple("SELECT current_database() || '@' || coalesce(inet_server_addr()::text, 'local') || ':' || current_setting('port') || ':' || current_setting('data_directory')")
                    .await
                    .map_err(|e| pg_err(&e))?;
                simple_first(&m).ok_or_else(|| "no row".into())
            }
            Inner::Maria { pool, .. } => {
                use mysql_async::prelude::Queryable;
                let mut conn = pool.get_conn().await.map_err(|e| my_err(&e))?;
                let v: Option<String> = conn
                    .query_first("SELECT CONCAT(@@hostname, ':', @@port, ':', @@datadir)")
                    .await
                    .map_err(|e| my_err(&e))?;
                v.ok_or_else(|| "no row".into())
            }
        }
    }

    pub(crate) async fn pg_simple(
        &self,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error> {
        let Inner::Pg { cfg, tls, conns, next } = &self.inner else { unreachable!() };
        let slot = &conns[next.fetch_add(1, Ordering::Relaxed) % conns.len()];
        let mut guard = slot.lock().await;
        if guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            let (client, conn) = cfg.connect(tls.clone()).await?;
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

    /// Several statements in one round trip on one connection (simple query protocol); on
    /// an error the same connection is rolled back, so a failed explicit transaction block
    /// is not left open for the next user of that connection.
    pub(crate) async fn pg_batch(&self, sql: &str) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, String> {
        let Inner::Pg { cfg, tls, conns, next } = &self.inner else {
            return Err(format!("{}: not a PostgreSQL resource", self.name));
        };
        let slot = &conns[next.fetch_add(1, Ordering::Relaxed) % conns.len()];
        let mut guard = slot.lock().await;
        if guard.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            let (client, conn) =
                cfg.connect(tls.clone()).await.map_err(|e| format!("{}: {}", self.name, pg_err(&e)))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            *guard = Some(client);
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

    /// A pooled MariaDB connection (client mode's probes and slots).
    pub(crate) async fn maria_conn(&self) -> Result<mysql_async::Conn, String> {
        let Inner::Maria { pool, .. } = &self.inner else {
            return Err(format!("{}: not a MariaDB resource", self.name));
        };
        match tokio::time::timeout(QUERY_TIMEOUT, pool.get_conn()).await {
            Ok(r) => r.map_err(|e| format!("{}: {}", self.name, my_err(&e))),
            Err(_) => Err(format!("{}: timed out connecting", self.name)),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
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
                let msgs = self
                    .pg_simple(&branch_sql::pg_list_prepared(&self.prefix))
                    .await
                    .map_err(|e| format!("{}: {}", self.name, pg_err(&e)))?;
                Ok(msgs
                    .into_iter()
                    .filter_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            r.get(0).and_then(|g| naming::parse_pg_gid(&self.prefix, g))
                        }
                        _ => None,
                    })
                    .collect())
            }
            Inner::Maria { pool, .. } => {
                use mysql_async::prelude::Queryable;
                let mut conn = pool.get_conn().await.map_err(|e| format!("{}: {}", self.name, my_err(&e)))?;
                let rows: Vec<(i64, i64, i64, Vec<u8>)> =
                    conn.query("XA RECOVER").await.map_err(|e| format!("{}: {}", self.name, my_err(&e)))?;
                Ok(rows
                    .into_iter()
                    .filter_map(|(f, gl, bl, data)| {
                        naming::parse_xa_row(f, gl.max(0) as usize, bl.max(0) as usize, &data)
                    })
                    .collect())
            }
        }
    }

    /// Gives one branch its outcome from the daemon's own connection. `decided_ms_ago`:
    /// how long ago the decision was made (a MariaDB branch gone after a server restart
    /// since then may have been a read-only branch lost in the restart).
    pub async fn complete(&self, gtid: &str, bid: &str, outcome: Outcome, decided_ms_ago: u64) -> Completion {
        match tokio::time::timeout(QUERY_TIMEOUT, self.complete_inner(gtid, bid, outcome, decided_ms_ago)).await {
            Ok(r) => r,
            Err(_) => Completion::Retry(format!("{}: timed out", self.name)),
        }
    }

    async fn complete_inner(&self, gtid: &str, bid: &str, outcome: Outcome, decided_ms_ago: u64) -> Completion {
        match &self.inner {
            Inner::Pg { .. } => {
                let sql = match branch_sql::pg_finish(&self.prefix, gtid, bid, outcome) {
                    Ok(q) => q,
                    Err(e) => return Completion::Incident(e),
                };
                match self.pg_simple(&sql).await {
                    Ok(_) => Completion::Done,
                    Err(e) => {
                        branch_sql::pg_refused(e.code().map(|c| c.code()), format!("{}: {}", self.name, pg_err(&e)))
                    }
                }
            }
            Inner::Maria { pool, .. } => {
                use mysql_async::prelude::Queryable;
                let sql = match branch_sql::maria_finish(gtid, bid, outcome) {
                    Ok(q) => q,
                    Err(e) => return Completion::Incident(e),
                };
                let mut conn = match pool.get_conn().await {
                    Ok(c) => c,
                    Err(e) => return Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
                };
                // XA COMMIT answers 1397 both for "unknown" and for "attached to a live
                // session": XA RECOVER tells them apart (it lists attached ones too).
                let rows: Vec<(i64, i64, i64, Vec<u8>)> = match conn.query("XA RECOVER").await {
                    Ok(r) => r,
                    Err(e) => return Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
                };
                let listed = rows.iter().any(|(f, gl, bl, d)| {
                    naming::parse_xa_row(*f, (*gl).max(0) as usize, (*bl).max(0) as usize, d)
                        .map(|(g, b)| g == gtid && b == bid)
                        .unwrap_or(false)
                });
                if !listed {
                    return match outcome {
                        Outcome::Commit => self.maria_gone_after_commit(&mut conn, gtid, bid, decided_ms_ago).await,
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
        }
    }

    /// A branch of a committed transaction that MariaDB no longer lists, and that its owner
    /// did not report finished: committed by its owner (acknowledgement lost) — or lost, if
    /// it was read-only and its session ended (mysql_co lists it) or the server restarted
    /// since the decision. The lost cases are incidents, never "finished".
    async fn maria_gone_after_commit(
        &self,
        conn: &mut mysql_async::Conn,
        gtid: &str,
        bid: &str,
        decided_ms_ago: u64,
    ) -> Completion {
        use mysql_async::prelude::Queryable;
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
            Ok(u) => branch_sql::maria_gone(&self.name, u.and_then(|u| u.parse::<u64>().ok()), decided_ms_ago),
            Err(e) => Completion::Retry(format!("{}: {}", self.name, my_err(&e))),
        }
    }

    /// What a prepared branch is doing to others, for operators: locks it holds
    /// (PostgreSQL) and sessions on the resource waiting for a prepared transaction.
    pub async fn blocking_info(&self, gtid: &str, bid: &str) -> Blocking {
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
                    let msgs = self.pg_simple(&sql).await.map_err(|e| pg_err(&e))?;
                    for m in msgs {
                        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                            let held: i64 = r.get(0).and_then(|v| v.parse().ok()).unwrap_or(0);
                            let waiting: i64 = r.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
                            return Ok(Blocking { locks_held: Some(held), sessions_waiting_on_prepared: Some(waiting), ..Blocking::default() });
                        }
                    }
                    Err("no row".to_string())
                }
                Inner::Maria { pool, .. } => {
                    use mysql_async::prelude::Queryable;
                    let mut conn = pool.get_conn().await.map_err(|e| e.to_string())?;
                    let n: Option<i64> = conn
                        .query_first("SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS")
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(Blocking { lock_waits_on_resource: Some(n.unwrap_or(0)), ..Blocking::default() })
                }
            }
        })
        .await;
        match r {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => Blocking::error(e),
            Err(_) => Blocking::error("timed out"),
        }
    }
}

pub(crate) fn simple_first(msgs: &[tokio_postgres::SimpleQueryMessage]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    })
}

//! The daemon's own connections to the resources: list our prepared branches, and commit
//! or roll back a branch whose owner is gone. Connections are made lazily and dropped on
//! error, so a database that was down is simply reconnected at the next attempt.
//!
//! Node locks: before the daemon acts for a node at a resource it holds a lock named after
//! the node there (PostgreSQL session advisory lock, MariaDB GET_LOCK) on a connection of
//! its own, so two daemons that share databases but not a store cannot both act as one node.
//!
//! What differs between PostgreSQL and MariaDB is in `engines/`: the engine is picked once,
//! here, and each operation below bounds its call by a timeout.

use super::engines::{Engine, Mariadb, Postgres, QUERY_TIMEOUT};
use crate::config::{Resource, ResourceKind};
use crate::state::Outcome;
use crate::wire::Blocking;

use super::branch_sql;
pub use super::branch_sql::Completion;
pub(crate) use super::engines::{my_err, simple_first};
pub use super::engines::{pg_err, ResourceError};

/// The daemon's connections to its resources, by name (`Parts::resources`, lent to the
/// operations that talk to resources).
pub type Clients = std::collections::HashMap<String, std::sync::Arc<ResourceClient>>;

pub struct ResourceClient {
    pub name: String,
    /// Read by what only one engine does (client mode, decisions in a participant, leases).
    pub kind: ResourceKind,
    prefix: String,
    engine: Box<dyn Engine>,
}

impl ResourceClient {
    pub fn new(r: &Resource, prefix: &str, node: &str) -> Result<ResourceClient, String> {
        let engine: Box<dyn Engine> = match r.kind {
            ResourceKind::Postgres => Box::new(Postgres::new(r, prefix, node)?),
            ResourceKind::Mariadb => Box::new(Mariadb::new(r)?),
        };
        Ok(ResourceClient { name: r.name.clone(), kind: r.kind, prefix: prefix.to_string(), engine })
    }

    /// Holds (or takes) the lock of `node` at this resource. `fence`: the store says the
    /// current holder's lease ran out, so its lock session is ended and the lock taken.
    /// `Held` names who holds it.
    pub async fn node_lock(&self, node: &str, fence: bool) -> Result<(), ResourceError> {
        let lock = branch_sql::lock_name(&self.prefix, node);
        match tokio::time::timeout(QUERY_TIMEOUT, self.engine.hold_lock(node, &lock, fence)).await {
            Ok(r) => r,
            Err(_) => Err(ResourceError::Unreachable(format!("{}: timed out taking the node lock", self.name))),
        }
    }

    /// `node_lock` for the callers that only report why it failed (completion).
    pub async fn hold_node_lock(&self, node: &str, fence: bool) -> Result<(), String> {
        Ok(self.node_lock(node, fence).await?)
    }

    /// Gives up the lock of a node taken over (its branches are finished).
    pub async fn release_node_lock(&self, node: &str) {
        self.engine.release_lock(node).await
    }

    /// What identifies the server behind this resource: two MariaDB resources on one server
    /// would list (and complete) each other's branches, since XA RECOVER is server-wide.
    pub async fn server_identity(&self) -> Result<String, ResourceError> {
        self.engine.server_identity().await
    }

    fn postgres(&self) -> Option<&Postgres> {
        self.engine.as_any().downcast_ref()
    }

    /// One statement on a pooled connection of a PostgreSQL resource.
    pub(crate) async fn pg_simple(
        &self,
        sql: &str,
    ) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, tokio_postgres::Error> {
        let Some(pg) = self.postgres() else { unreachable!() };
        pg.simple(sql).await
    }

    /// Several statements in one round trip on one connection (simple query protocol); on
    /// an error the same connection is rolled back, so a failed explicit transaction block
    /// is not left open for the next user of that connection.
    pub(crate) async fn pg_batch(&self, sql: &str) -> Result<Vec<tokio_postgres::SimpleQueryMessage>, String> {
        let Some(pg) = self.postgres() else {
            return Err(format!("{}: not a PostgreSQL resource", self.name));
        };
        pg.batch(sql).await
    }

    /// A pooled MariaDB connection (client mode's probes and slots).
    pub(crate) async fn maria_conn(&self) -> Result<mysql_async::Conn, String> {
        let Some(maria) = self.engine.as_any().downcast_ref::<Mariadb>() else {
            return Err(format!("{}: not a MariaDB resource", self.name));
        };
        maria.conn().await
    }

    /// The engine, for lock_waits.rs.
    pub(super) fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Our prepared branches on this resource, as (gtid, branch id).
    pub async fn list_prepared(&self) -> Result<Vec<(String, String)>, ResourceError> {
        match tokio::time::timeout(QUERY_TIMEOUT, self.engine.list_prepared()).await {
            Ok(r) => r,
            Err(_) => {
                Err(ResourceError::Unreachable(format!("{}: timed out listing prepared transactions", self.name)))
            }
        }
    }

    /// Gives one branch its outcome from the daemon's own connection. `prepared_ms_ago`:
    /// how long ago the branch was prepared, else the decision made (a MariaDB branch gone
    /// after a server restart since then may have been a read-only branch lost in it).
    pub async fn complete(&self, gtid: &str, bid: &str, outcome: Outcome, prepared_ms_ago: u64) -> Completion {
        match tokio::time::timeout(QUERY_TIMEOUT, self.engine.complete(gtid, bid, outcome, prepared_ms_ago)).await {
            Ok(r) => r,
            Err(_) => Completion::Retry(format!("{}: timed out", self.name)),
        }
    }

    /// What a prepared branch is doing to others, for operators: locks it holds
    /// (PostgreSQL) and sessions on the resource waiting for a prepared transaction.
    pub async fn blocking_info(&self, gtid: &str, bid: &str) -> Blocking {
        match tokio::time::timeout(QUERY_TIMEOUT, self.engine.blocking(gtid, bid)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => Blocking::error(e),
            Err(_) => Blocking::error("timed out"),
        }
    }
}

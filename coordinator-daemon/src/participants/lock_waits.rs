//! Who waits for whom at a resource, and cancelling a waiting statement: what the deadlock
//! detector (coordinator/deadlocks.rs) and an abort that must act (a timeout, an operator)
//! need of the databases. Sessions are PostgreSQL backend pids and MariaDB connection
//! ids, as the clients report them at registration.
//!
//! Privileges (docs/ops.md, "Deadlocks across databases"): PostgreSQL reads `pg_locks` and
//! `pg_blocking_pids()`, which every role may; cancelling another role's statement needs
//! membership in `pg_signal_backend`. MariaDB reads `information_schema.INNODB_LOCK_WAITS`
//! (the PROCESS privilege) and cancels with `KILL QUERY` (CONNECTION ADMIN, or the same user).

use std::time::Duration;

pub use super::engines::Wait;
use super::resources::{ResourceClient, ResourceError};

const TIMEOUT: Duration = Duration::from_secs(5);

impl ResourceClient {
    /// Every lock wait between two sessions at this resource, now (the queries: engines/).
    pub async fn lock_waits(&self) -> Result<Vec<Wait>, ResourceError> {
        let r = tokio::time::timeout(TIMEOUT, self.engine().lock_waits()).await;
        r.unwrap_or_else(|_| Err(ResourceError::Unreachable(format!("{}: reading lock waits timed out", self.name))))
    }

    /// Cancels the statement of `session` if it is waiting for a lock right now (a session
    /// that stopped waiting, or whose id now names another session, is left alone).
    /// Ok(true): a cancel was sent.
    pub async fn cancel_if_waiting(&self, session: i64) -> Result<bool, ResourceError> {
        let r = tokio::time::timeout(TIMEOUT, self.engine().cancel_if_waiting(session)).await;
        r.unwrap_or_else(|_| {
            Err(ResourceError::Unreachable(format!("{}: cancelling session {session} timed out", self.name)))
        })
    }
}

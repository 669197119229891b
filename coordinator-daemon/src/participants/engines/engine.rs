//! What every engine does on a resource, and what the engines share: the `Engine` trait
//! (boxed futures, so that one resource's client holds its engine as a trait object), the
//! timeouts, and a lock wait as both engines report it.

use super::error::ResourceError;
use crate::participants::branch_sql::Completion;
use crate::state::Outcome;
use crate::wire::Blocking;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

/// An engine's operation in flight (`async fn` in a trait cannot be called through `dyn`).
pub(crate) type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One lock wait at a resource: `waiter` waits for a lock `blocker` holds (both sessions).
/// `on`: what is waited for, for the log (tables; MariaDB adds the index record's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub waiter: i64,
    pub blocker: i64,
    pub on: String,
}

/// A resource's engine: its connections and what the daemon asks of them. Errors name the
/// resource; the caller (resources.rs, lock_waits.rs) bounds each call by a timeout.
pub(crate) trait Engine: Send + Sync + 'static {
    /// Holds (or takes) the lock named `lock` of `node`, on a connection kept for it.
    /// `fence`: the current holder's lease ran out, so its session is ended and the lock
    /// taken. Err names who holds it.
    fn hold_lock<'a>(&'a self, node: &'a str, lock: &'a str, fence: bool) -> Fut<'a, Result<(), ResourceError>>;
    /// Drops the connection holding `node`'s lock.
    fn release_lock<'a>(&'a self, node: &'a str) -> Fut<'a, ()>;
    /// What identifies the server behind the resource.
    fn server_identity(&self) -> Fut<'_, Result<String, ResourceError>>;
    /// Our prepared branches, as (gtid, branch id).
    fn list_prepared(&self) -> Fut<'_, Result<Vec<(String, String)>, ResourceError>>;
    /// Gives one branch its outcome (resources.rs, `ResourceClient::complete`).
    fn complete<'a>(
        &'a self,
        gtid: &'a str,
        bid: &'a str,
        outcome: Outcome,
        prepared_ms_ago: u64,
    ) -> Fut<'a, Completion>;
    /// What a prepared branch is doing to others.
    fn blocking<'a>(&'a self, gtid: &'a str, bid: &'a str) -> Fut<'a, Result<Blocking, ResourceError>>;
    /// Every lock wait between two sessions, now (lock_waits.rs).
    fn lock_waits(&self) -> Fut<'_, Result<Vec<Wait>, ResourceError>>;
    /// Cancels `session`'s statement if it waits for a lock now; true: a cancel was sent.
    fn cancel_if_waiting(&self, session: i64) -> Fut<'_, Result<bool, ResourceError>>;
    /// The engine itself, for what only one engine has (client mode's probes, the
    /// decisions in a participant): resources.rs's `pg_simple`, `pg_batch`, `maria_conn`.
    fn as_any(&self) -> &dyn std::any::Any;
}

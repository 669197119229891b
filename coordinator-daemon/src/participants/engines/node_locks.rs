//! Node locks, as both engines hold them: one connection kept per node with the lock taken
//! on it, checked before it is relied on (a restarted database or a cut connection loses
//! it), else taken again on a new connection; with `fence` (the holder's lease ran out)
//! the session holding it is ended first, three attempts at most. The engine says how to
//! check, take and end (`LockSessions`; `postgres.rs`: advisory locks; `mariadb.rs`:
//! GET_LOCK).

use super::engine::Fut;
use super::error::ResourceError;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::Mutex;

/// One attempt at a node's lock, on a new connection.
pub(crate) enum Attempt<C> {
    /// Taken: this connection now holds it.
    Taken(C),
    /// Held by another session: `said` names it (the error's text), `session` is what
    /// ending it takes.
    HeldBy { conn: C, said: String, session: i64 },
}

/// What an engine does with the sessions that hold node locks.
pub(crate) trait LockSessions: Sync {
    type Conn: Send;
    /// Does the kept connection still hold `lock`?
    fn still_held<'a>(&'a self, conn: &'a mut Self::Conn, lock: &'a str) -> Fut<'a, bool>;
    /// Tries to take `lock` on a new connection.
    fn attempt<'a>(&'a self, lock: &'a str) -> Fut<'a, Result<Attempt<Self::Conn>, ResourceError>>;
    /// Ends the session `session` (the holder whose lease ran out), from `conn`.
    fn end<'a>(&'a self, conn: &'a mut Self::Conn, session: i64) -> Fut<'a, ()>;
}

/// The connection holding each node's lock.
pub(crate) struct NodeLocks<C>(Mutex<HashMap<String, C>>);

impl<C: Send> NodeLocks<C> {
    pub(crate) fn new() -> Self {
        NodeLocks(Mutex::new(HashMap::new()))
    }

    /// Holds (or takes) `node`'s lock, named `lock`, at `resource`: the kept connection
    /// while it still holds it, else attempts on new connections; with `fence`, the
    /// holder's session is ended between attempts. Err names who holds it.
    pub(crate) async fn hold<E: LockSessions<Conn = C>>(
        &self,
        engine: &E,
        resource: &str,
        node: &str,
        lock: &str,
        fence: bool,
    ) -> Result<(), ResourceError> {
        let mut locks = self.0.lock().await;
        // Still held? (A restarted database or a cut connection loses it.)
        if let Some(c) = locks.get_mut(node) {
            if engine.still_held(c, lock).await {
                return Ok(());
            }
        }
        locks.remove(node);
        let who = format!("{resource}: node {node} is held by another session on this resource");
        for n in 0..3 {
            match engine.attempt(lock).await? {
                Attempt::Taken(conn) => {
                    locks.insert(node.to_string(), conn);
                    return Ok(());
                }
                Attempt::HeldBy { mut conn, said, session } => {
                    if !fence || n == 2 {
                        return Err(ResourceError::Held(format!("{who} ({said})")));
                    }
                    engine.end(&mut conn, session).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Err(ResourceError::Held(who))
    }

    /// Drops the connection holding `node`'s lock (the lock goes with it).
    pub(crate) async fn release(&self, node: &str) {
        self.0.lock().await.remove(node);
    }
}

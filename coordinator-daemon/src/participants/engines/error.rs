//! What can go wrong on a resource, by what its caller does about it: a database that
//! cannot be reached is retried (and its node lock taken before acting there), a node lock
//! held by another session means another daemon acts as the node, and an error the
//! database answered is reported. Each variant's text is the message the daemon has
//! always given (logs, reports and tests read it); in JSON (the logs' fields) too.

use serde::{Serialize, Serializer};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResourceError {
    /// No connection, or no answer in time: the database is down, cut off or slow.
    #[error("{0}")]
    Unreachable(String),
    /// The node's lock is held by another session on this resource.
    #[error("{0}")]
    Held(String),
    /// The database answered a statement with an error (or with no row).
    #[error("{0}")]
    Sql(String),
}

impl ResourceError {
    /// A driver error's kind: an answer from the server is a SQL error, anything else
    /// (connection refused or lost, TLS, I/O) means the database was not reached.
    pub(crate) fn from_driver(answered: bool, msg: String) -> ResourceError {
        if answered {
            ResourceError::Sql(msg)
        } else {
            ResourceError::Unreachable(msg)
        }
    }
}

impl Serialize for ResourceError {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// For the callers that still speak in text (their `Result<_, String>`): the same message.
impl From<ResourceError> for String {
    fn from(e: ResourceError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer from the server is a SQL error; no answer means unreachable. The text and
    /// its JSON are the message as before.
    #[test]
    fn kind_by_whether_the_server_answered() {
        assert_eq!(ResourceError::from_driver(true, "m".into()), ResourceError::Sql("m".into()));
        assert_eq!(ResourceError::from_driver(false, "m".into()), ResourceError::Unreachable("m".into()));
        let e = ResourceError::Held("pg: node n1 is held by another session on this resource (pid 7 ())".into());
        assert_eq!(serde_json::json!({ "error": e }), serde_json::json!({ "error": e.to_string() }));
        assert_eq!(String::from(e), "pg: node n1 is held by another session on this resource (pid 7 ())");
    }
}

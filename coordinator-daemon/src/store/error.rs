//! What can go wrong with the decision store, by what its caller does about it. Each
//! variant's text is the message the daemon has always given (logs and refusals show it,
//! tests read it), so `Display` carries it whole; in JSON (the logs' fields) an error is
//! that text too.

use serde::{Serialize, Serializer};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The database failed or did not answer (connection, I/O, a statement's error). The
    /// same request may succeed later; a decision write's fate is unknown (a retry is
    /// safe: decisions are conditional inserts).
    #[error("{0}")]
    Unavailable(String),
    /// The store cannot be reached as configured (the DSN, its TLS): fixed in the config.
    #[error("{0}")]
    Setup(String),
    /// Written by a newer daemon: refused untouched, whatever the retries (the text:
    /// log.rs, `newer_schema`).
    #[error("{0}")]
    NewerSchema(String),
    /// Something else holds what this needs: another process has the SQLite file, a
    /// daemon runs on the store during `mark-restored`, a holder's session did not end.
    #[error("{0}")]
    Conflict(String),
    /// The writer thread is gone (the daemon stops, or the thread died).
    #[error("{0}")]
    Stopped(&'static str),
    /// A write that must answer an outcome answered none.
    #[error("store returned no outcome")]
    NoOutcome,
}

impl Serialize for StoreError {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// For the callers that still speak in text (their `Result<_, String>`): the same message.
impl From<StoreError> for String {
    fn from(e: StoreError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logs and refusals show an error as they always did: its text, in JSON too.
    #[test]
    fn an_error_reads_as_its_message() {
        let e = StoreError::Conflict("decision store s.db is in use by another process".into());
        assert_eq!(serde_json::json!({ "error": e }), serde_json::json!({ "error": e.to_string() }));
        assert_eq!(String::from(e), "decision store s.db is in use by another process");
        assert_eq!(StoreError::Stopped("store writer stopped").to_string(), "store writer stopped");
    }
}

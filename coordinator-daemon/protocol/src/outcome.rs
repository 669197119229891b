//! A global transaction's outcome, shared by every part of the protocol.

use serde::{Deserialize, Serialize};

/// A global transaction's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Commit,
    Abort,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Commit => "commit",
            Outcome::Abort => "abort",
        }
    }
    pub fn parse(s: &str) -> Option<Outcome> {
        match s {
            "commit" => Some(Outcome::Commit),
            "abort" => Some(Outcome::Abort),
            _ => None,
        }
    }
}

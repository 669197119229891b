//! The coordinator's commit protocol as pure functions: no I/O, no clocks, no globals.
//! The daemon (`coordinator-daemon`) calls them at each step, and the model checker
//! (`coordinator-daemon/model`) calls the very same functions in every state it explores,
//! so what the model proves is about this code, not a paraphrase of it.
//!
//! - [`lease`]: node leases as grants (holder + generation), renewal, the fencing check a
//!   store applies to every decision write.
//! - [`recovery`]: what a prepared branch found by recovery gets.
//! - [`answer`]: what a daemon may answer about a gtid, from memory and from the store.

pub mod answer;
pub mod lease;
pub mod recovery;

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

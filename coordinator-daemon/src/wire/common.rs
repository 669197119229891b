//! What the response bodies share: the enums of their fields (each with its conversion
//! from the daemon's own type), and the conversion of a body to a JSON value.

use crate::config::ResourceKind;
use crate::state::{self, Outcome};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A body as the JSON value the API's replies are written from.
pub fn to_json<T: Serialize>(body: &T) -> serde_json::Value {
    // Plain data (strings, numbers, maps with string keys): it cannot fail.
    serde_json::to_value(body).expect("a response body serializes")
}

/// A gtid or branch id (checked by crate::naming; this type only describes it, for the
/// document: the bodies carry them as strings).
#[derive(ToSchema)]
#[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
#[allow(dead_code)]
pub struct Id(String);

/// An outcome as the API names it, in requests (api/dto.rs) and answers.
#[derive(Deserialize, Serialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeArg {
    Commit,
    Abort,
}

impl From<OutcomeArg> for Outcome {
    fn from(o: OutcomeArg) -> Outcome {
        match o {
            OutcomeArg::Commit => Outcome::Commit,
            OutcomeArg::Abort => Outcome::Abort,
        }
    }
}

impl From<Outcome> for OutcomeArg {
    fn from(o: Outcome) -> OutcomeArg {
        match o {
            Outcome::Commit => OutcomeArg::Commit,
            Outcome::Abort => OutcomeArg::Abort,
        }
    }
}

#[derive(Serialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Postgres,
    Mariadb,
}

impl From<ResourceKind> for Kind {
    fn from(k: ResourceKind) -> Kind {
        match k {
            ResourceKind::Postgres => Kind::Postgres,
            ResourceKind::Mariadb => Kind::Mariadb,
        }
    }
}

#[derive(Serialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BranchState {
    Registered,
    Prepared,
    Failed,
    Finished,
}

impl From<state::BranchState> for BranchState {
    fn from(s: state::BranchState) -> BranchState {
        match s {
            state::BranchState::Registered => BranchState::Registered,
            state::BranchState::Prepared => BranchState::Prepared,
            state::BranchState::Failed => BranchState::Failed,
            state::BranchState::Finished => BranchState::Finished,
        }
    }
}

#[derive(Serialize, ToSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FinishedBy {
    /// The client that owns the branch.
    Owner,
    /// This daemon's completion.
    Daemon,
    Recovery,
}

impl From<state::FinishedBy> for FinishedBy {
    fn from(f: state::FinishedBy) -> FinishedBy {
        match f {
            state::FinishedBy::Owner => FinishedBy::Owner,
            state::FinishedBy::Daemon => FinishedBy::Daemon,
            state::FinishedBy::Recovery => FinishedBy::Recovery,
        }
    }
}

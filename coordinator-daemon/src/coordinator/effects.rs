//! What an operation leaves to start once it returns: work that outlives the call (a
//! transaction's branches finished in the background, client mode's holds let go of, the
//! pool of ready helpers topped up, a decision write retried). The operations borrow only
//! the parts they use and write here what must follow, as openraft's engine handlers push
//! commands for its runtime; whoever holds the parts shared (the API's entry points in
//! mod.rs, the background loops) starts them with `completion::start`, in order.

use crate::store::{DecisionRecord, Token};

#[derive(Debug, Default)]
#[must_use = "effects are started by the caller that holds the parts shared (completion::start)"]
pub struct Effects(Vec<Effect>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Finish the prepared branches of a decided transaction (completion::spawn_completion).
    Complete(String),
    /// Let go of client mode's holds of a transaction's settled branches (holds::spawn_release_of).
    ReleaseOf(String),
    /// Top up a PostgreSQL resource's ready helpers (holds::spawn_refill).
    Refill(String),
    /// Write a decision again until the store answers (its first write's answer was lost).
    RetryDecision(DecisionRecord, Option<Token>),
}

impl Effects {
    pub fn complete(&mut self, gtid: &str) {
        self.0.push(Effect::Complete(gtid.to_string()));
    }

    pub fn release_of(&mut self, gtid: &str) {
        self.0.push(Effect::ReleaseOf(gtid.to_string()));
    }

    pub fn refill(&mut self, resource: &str) {
        self.0.push(Effect::Refill(resource.to_string()));
    }

    pub fn retry_decision(&mut self, rec: DecisionRecord, fence: Option<Token>) {
        self.0.push(Effect::RetryDecision(rec, fence));
    }

    pub fn into_vec(self) -> Vec<Effect> {
        self.0
    }

    #[cfg(test)]
    pub fn as_slice(&self) -> &[Effect] {
        &self.0
    }
}

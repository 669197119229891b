//! The `state` filter of the transaction list (GET /v1/transactions?state=...).

use crate::refusal::{refuse, Refusal, RefusalCode};
use crate::state::tx::{Tx, TxState};

/// The `state` filter of the transaction list: one state, or `in_doubt` (`Tx::in_doubt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateFilter {
    Active,
    Committing,
    Committed,
    Aborted,
    OnePhase,
    Deciding,
    InDoubt,
}

impl StateFilter {
    /// Parses the query value; the error names every accepted value (serde lists them).
    pub fn parse(s: &str) -> Result<StateFilter, Refusal> {
        serde_json::from_value(serde_json::Value::String(s.to_string()))
            .or_else(|e| refuse(RefusalCode::InvalidField, format!("state: {e}")))
    }

    /// Exhaustive on purpose: a new state cannot be added without its filter.
    fn of(s: TxState) -> StateFilter {
        match s {
            TxState::Active => StateFilter::Active,
            TxState::Committing => StateFilter::Committing,
            TxState::Committed => StateFilter::Committed,
            TxState::Aborted => StateFilter::Aborted,
            TxState::OnePhase => StateFilter::OnePhase,
            TxState::Deciding => StateFilter::Deciding,
        }
    }

    pub fn matches(self, tx: &Tx) -> bool {
        match self {
            StateFilter::InDoubt => tx.in_doubt(),
            f => StateFilter::of(tx.state()) == f,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_filter_matches_its_state_and_in_doubt_means_a_prepared_branch_of_a_decided_one() {
        assert_eq!(StateFilter::parse("one_phase"), Ok(StateFilter::OnePhase));
        let e = StateFilter::parse("prepared").unwrap_err();
        assert_eq!(e.code, RefusalCode::InvalidField);
        let mut t = Tx::new("n1-1-1".into(), Duration::from_secs(1));
        assert!(
            StateFilter::Active.matches(&t) && !StateFilter::Aborted.matches(&t) && !StateFilter::InDoubt.matches(&t)
        );
        t.abort("x".into(), false);
        assert!(StateFilter::Aborted.matches(&t) && !StateFilter::Active.matches(&t));
    }
}

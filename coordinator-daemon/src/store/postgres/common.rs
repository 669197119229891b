//! What the PostgreSQL store's files share: its error text and its clock.

use crate::store::error::StoreError;

pub(super) fn e(x: postgres::Error) -> StoreError {
    StoreError::Unavailable(match x.as_db_error() {
        Some(d) => format!("postgres store: {} (SQLSTATE {})", d.message(), d.code().code()),
        None => format!("postgres store: {}", crate::dbtls::chain(&x)),
    })
}

/// The store's clock in ms: every daemon compares lease expiries against one clock.
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

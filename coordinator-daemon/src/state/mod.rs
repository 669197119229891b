//! Transactions as plain data: the state machine of one global transaction and its
//! branches (`tx`), and the list's state filter (`filter`). No I/O.

pub mod filter;
pub mod tx;

pub use self::filter::StateFilter;
pub use self::tx::*;
pub use crate::refusal::{refuse, Refusal, RefusalCode};

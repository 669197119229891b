//! The commitment-ordering (CO) decisions of `pg_co`, free of PostgreSQL so that unit tests
//! reach them without a server. The extension copies what PostgreSQL's SSI knows about the
//! deciding transaction and its rw-conflict peers into [`SelfView`] and [`Peer`] values,
//! and asks [`decide`] what to do; for a READ ONLY reader at its COMMIT it also asks
//! [`decide_read_only`] (module [`read_only`]). What both read and decide is in [`view`]
//! and [`verdict`]; the rules in [`commit`] and [`read_only`]; this file only re-exports. The rules and their derivations: docs/pg_co.md.

pub mod commit;
pub mod read_only;
pub mod verdict;
pub mod view;

pub use commit::decide;
pub use read_only::decide_read_only;
pub use verdict::{MissedCommit, Verdict};
pub use view::*;

//! The coordinator's commit protocol as pure functions: no I/O, no clocks, no globals.
//! The daemon (`coordinator-daemon`) calls them at each step, and the model checker
//! (`coordinator-daemon/model`) calls the very same functions in every state it explores,
//! so what the model proves is about this code, not a paraphrase of it.
//!
//! - [`lease`]: node leases as grants (holder + generation), renewal, the fencing check a
//!   store applies to every decision write.
//! - [`recovery`]: what a prepared branch found by recovery gets.
//! - [`answer`]: what a daemon may answer about a gtid, from memory and from the store.
//! - [`read_only`]: the commit of an all-read-only transaction, decided in memory.
//! - [`leased`]: the one-request commit of a gtid drawn from a range leased to a client.

pub mod answer;
pub mod lease;
pub mod leased;
pub mod outcome;
pub mod read_only;
pub mod recovery;

pub use outcome::Outcome;

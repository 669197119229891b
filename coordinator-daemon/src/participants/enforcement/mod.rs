//! How commitment ordering is enforced at each resource, and the pure rules behind it.
//!
//! - `engine`: pg_co / mysql_co is loaded and enforcing: the engine refuses what would
//!   break commitment ordering (docs/pg_co.md, docs/mysql_co.md).
//! - `client`: neither can be installed (managed services, MySQL 8): Sonata's shims, run by
//!   the daemon and the clients (docs/client-mode.md): on PostgreSQL prepared helper
//!   transactions, each shared by a block of branches and prepared ahead of need (helpers.rs:
//!   the pool's rules; shared_helpers.rs: its I/O), on MariaDB/MySQL SERIALIZABLE
//!   branches that write a slot row, plus the restart gate (gate.rs).
//! - `none`: plain 2PC, only when configured so (baselines, comparisons): logged at start.
//!
//! `auto` (the default) is engine when the engine can, else client when the resource can,
//! else the resource is refused with the reason: never plain 2PC by accident.
//!
//! rules.rs, gate.rs, slots.rs and helpers.rs are pure (unit tests beside each); probe.rs asks
//! the databases, runtime.rs keeps the per-resource state the daemon acts on, and
//! shared_helpers.rs PostgreSQL's pools of helpers (under runtime.rs). This file only
//! declares them and re-exports the rules' types, so that no child imports its parent.

pub mod gate;
pub mod helpers;
pub mod probe;
pub mod rules;
pub mod runtime;
pub mod shared_helpers;
pub mod slots;

pub use rules::{decide, needs, Configured, Effective, Mode, Probe};

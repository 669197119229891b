//! One implementation per database engine of what the daemon does on a resource through
//! its own connections (`engine.rs`: the `Engine` trait, as `store/` has `DecisionLog`):
//! `postgres.rs` and `mariadb.rs`; what goes wrong there, by kind: `error.rs`; the node
//! locks both hold the same way (kept, checked, fenced): `node_locks.rs`. `resources.rs` picks the engine once, when it makes a
//! resource's client, and every operation dispatches through the trait.

mod engine;
mod error;
mod mariadb;
mod node_locks;
mod postgres;

pub use engine::Wait;
pub(crate) use engine::{Engine, QUERY_TIMEOUT};
pub use error::ResourceError;
pub(crate) use mariadb::{my_err, Mariadb};
pub use postgres::pg_err;
pub(crate) use postgres::{simple_first, Postgres};

//! cotx-coordinator: the commit coordinator of cotx. `serve` runs the daemon; the other
//! subcommands are for operators (see docs/coordinator.md).

pub mod api;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod dbtls;
pub mod ha;
pub mod in_process;
pub mod naming;
pub mod participants;
pub mod refusal;
pub mod serve;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod wire;

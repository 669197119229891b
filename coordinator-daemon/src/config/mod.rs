//! Configuration file (TOML). Everything is checked at start; an invalid file is refused
//! with the line and the field, never half-applied.
//!
//! `types.rs`: the checked config; `raw.rs`: the file as TOML gives it; `check.rs`: the
//! checks the sections share; `parse.rs`: from the text (`load`, `parse`) to `Config`,
//! one named step per section; `store_section.rs`: the `[store]` section.

mod check;
mod parse;
mod raw;
mod store_section;
mod types;

pub use parse::{load, parse};
pub use types::*;

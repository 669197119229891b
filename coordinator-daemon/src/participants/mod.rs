//! The databases a global transaction spans: connections and completion of branches
//! (`resources`), and how each resource enforces commitment ordering (`enforcement`).

pub mod enforcement;
pub mod resources;

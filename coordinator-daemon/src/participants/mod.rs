//! The databases a global transaction spans: connections and completion of branches
//! (`resources`; its statements and what their answers mean: `branch_sql`), and how each
//! resource enforces commitment ordering (`enforcement`).

pub mod branch_sql;
pub mod enforcement;
pub mod resources;

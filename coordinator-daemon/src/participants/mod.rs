//! The databases a global transaction spans: connections and completion of branches
//! (`resources`; its statements and what their answers mean: `branch_sql`; what differs
//! between PostgreSQL and MariaDB: `engines`), and how each
//! resource enforces commitment ordering (`enforcement`); who waits for whom there and
//! cancelling a waiting statement (`lock_waits`).

pub mod branch_sql;
pub mod enforcement;
mod engines;
pub mod lock_waits;
pub mod resources;

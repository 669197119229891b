//! The decision store: where a commit decision becomes durable before anybody hears of it.
//!
//! Presumed abort: only commit decisions (and operator-forced outcomes) are written; no
//! record means abort. A record is forgotten only after every branch is confirmed finished.
//!
//! Every backend implements [`DecisionLog`], a plain synchronous interface applied by one
//! writer thread. Group commit lives here, not in the backends: the writer takes every
//! request queued while the previous batch was being synced and applies them in one
//! transaction, so many decisions share one fsync.

pub mod applog;
mod error;
mod file_lock;
mod group_commit;
mod log;
pub mod postgres;
mod record;
pub mod sqlite;
#[cfg(test)]
mod testkit;

pub use error::StoreError;
pub use group_commit::{Store, StoreStats, STORE_THREAD};
pub use log::{
    existing_outcome, newer_schema, Claim, Decided, DecisionLog, Identity, NodeLease, Op, OpResult, Renewal, Restored,
    SharedSession, Token, RESTORE_GRANT_JUMP, SCHEMA_VERSION,
};
pub use record::{
    branches_to_json, gtid_seq, loaded_from, parse_row, purge_watermarks, AuditEntry, CorruptRecord, DecisionRecord,
    Loaded, Stored,
};

/// CPU seconds this process's decision-store threads have used so far (/proc's schedstat
/// gives nanoseconds on CPU): what the store costs when the coordinator runs in the
/// caller's process, and in `bench-store`.
pub fn store_thread_cpu_s() -> f64 {
    let mut ns = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() == STORE_THREAD {
                let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
                ns += s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    ns as f64 / 1e9
}

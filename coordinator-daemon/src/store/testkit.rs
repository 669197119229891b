//! What the stores' unit tests share: a fresh scratch directory and a decision record.
#![cfg(test)]

use crate::state::Outcome;
use crate::store::DecisionRecord;

/// A fresh, empty directory for one test's store files (per test name and process).
pub fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cotx-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A decision for `g` with two branches, node "n", decided by the coordinator.
pub fn rec(g: &str, o: Outcome) -> DecisionRecord {
    DecisionRecord {
        gtid: g.into(),
        outcome: o,
        branches: vec![("pg".into(), "b1".into()), ("m".into(), "b2".into())],
        decided_unix_ms: 1,
        node: "n".into(),
        source: "coordinator".into(),
    }
}

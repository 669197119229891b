//! What the store holds and how a row reads back: decision records, audit entries, rows
//! that cannot be read (corrupt records, never taken for aborts), and the encodings the
//! backends share (branch lists as JSON, purge watermarks from gtids).

use crate::state::Outcome;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub gtid: String,
    pub outcome: Outcome,
    /// (resource, branch id) of every branch: recovery needs them after a restart.
    pub branches: Vec<(String, String)>,
    pub decided_unix_ms: u64,
    pub node: String,
    /// "coordinator" or "operator".
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    pub at_unix_ms: u64,
    pub gtid: String,
    pub outcome: String,
    pub operator: String,
    pub reason: String,
    pub result: String,
}

/// A row that exists but cannot be read (an unknown outcome, a branch list that does not
/// parse). Never read as abort: its gtid is quarantined until an operator decides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorruptRecord {
    pub gtid: String,
    pub problem: String,
}

/// What the store holds for one gtid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    Record(DecisionRecord),
    Corrupt(CorruptRecord),
    /// No row. `forgotten`: the gtid is at or below its epoch's purge watermark, so a
    /// record of it may have existed and been purged after the retention (never "abort").
    Absent {
        forgotten: bool,
    },
}

impl Stored {
    /// The protocol's view of it (cotx_protocol::answer).
    pub fn view(&self) -> cotx_protocol::answer::Stored {
        use cotx_protocol::answer::Stored as V;
        match self {
            Stored::Record(r) => V::Record(r.outcome),
            Stored::Corrupt(_) => V::Corrupt,
            Stored::Absent { forgotten } => V::Absent { forgotten: *forgotten },
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub records: Vec<DecisionRecord>,
    pub corrupt: Vec<CorruptRecord>,
    /// Every (node, nonce) that a daemon registered in this store before issuing gtids:
    /// recovery acts only on gtids of these epochs (a same-named node with another store
    /// is somebody else's).
    pub epochs: Vec<(String, u64)>,
}

/// Parses one stored row; a row that cannot be read becomes a [`CorruptRecord`].
pub fn parse_row(gtid: String, outcome: &str, branches: &str, decided_ms: i64, node: String, source: String) -> Stored {
    let o = Outcome::parse(outcome);
    let b = serde_json::from_str::<Vec<(String, String)>>(branches);
    match (o, b) {
        (Some(outcome), Ok(branches)) if !(branches.is_empty() && outcome == Outcome::Commit) => {
            Stored::Record(DecisionRecord {
                gtid,
                outcome,
                branches,
                decided_unix_ms: decided_ms.max(0) as u64,
                node,
                source,
            })
        }
        (None, _) => Stored::Corrupt(CorruptRecord { gtid, problem: format!("unknown outcome {outcome:?}") }),
        (_, Err(e)) => {
            Stored::Corrupt(CorruptRecord { gtid, problem: format!("branch list does not parse ({e}): {branches:?}") })
        }
        (_, Ok(_)) => {
            Stored::Corrupt(CorruptRecord { gtid, problem: "commit record with an empty branch list".into() })
        }
    }
}

pub fn loaded_from(rows: Vec<Stored>, epochs: Vec<(String, u64)>) -> Loaded {
    let mut l = Loaded { epochs, ..Default::default() };
    for r in rows {
        match r {
            Stored::Record(x) => l.records.push(x),
            Stored::Corrupt(x) => l.corrupt.push(x),
            Stored::Absent { .. } => {}
        }
    }
    l
}

/// The sequence number of a gtid within its epoch (naming::new_gtid), for the purge
/// watermark.
pub fn gtid_seq(gtid: &str) -> Option<u64> {
    u64::from_str_radix(gtid.rsplit_once('-')?.1, 16).ok()
}

/// The highest purged sequence number per epoch among `gtids`.
pub fn purge_watermarks(gtids: &[String]) -> std::collections::BTreeMap<(String, u64), u64> {
    let mut m = std::collections::BTreeMap::new();
    for g in gtids {
        if let (Some((node, nonce)), Some(seq)) = (crate::naming::gtid_epoch(g), gtid_seq(g)) {
            let w = m.entry((node.to_string(), nonce)).or_insert(0);
            *w = seq.max(*w);
        }
    }
    m
}

pub fn branches_to_json(b: &[(String, String)]) -> String {
    serde_json::to_string(b).unwrap_or_else(|_| "[]".into())
}

//! The decision store: where a commit decision becomes durable before anybody hears of it.
//!
//! Presumed abort: only commit decisions (and operator-forced outcomes) are written; no
//! record means abort. A record is forgotten only after every branch is confirmed finished.
//!
//! Every backend implements [`DecisionLog`], a plain synchronous interface applied by one
//! writer thread. Group commit lives here, not in the backends: the writer takes every
//! request queued while the previous batch was being synced and applies them in one
//! transaction, so many decisions share one fsync.

pub mod postgres;
pub mod sqlite;

use crate::state::Outcome;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

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

#[derive(Debug, Clone)]
pub enum Op {
    /// Conditional insert: an existing record for the gtid wins and is returned.
    Decide(DecisionRecord),
    Forget(String),
    Audit(AuditEntry),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The outcome in force after the op (ours, or the one recorded before).
    Decided(Outcome),
    Done,
}

pub trait DecisionLog: Send + 'static {
    /// Applies the ops in one durable transaction (one sync), all or nothing.
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, String>;
    fn load(&mut self) -> Result<Vec<DecisionRecord>, String>;
    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, String>;
}

enum Req {
    Write(Op, Option<oneshot::Sender<Result<OpResult, String>>>),
    Load(oneshot::Sender<Result<Vec<DecisionRecord>, String>>),
    Audit(oneshot::Sender<Result<Vec<AuditEntry>, String>>),
}

#[derive(Default, Debug)]
pub struct StoreStats {
    pub batches: AtomicU64,
    pub ops: AtomicU64,
    pub errors: AtomicU64,
}

/// Front of the store: cheap to clone, usable from async code.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Req>,
    pub stats: Arc<StoreStats>,
}

impl Store {
    /// Starts the writer thread. `max_batch` = 1 disables group commit.
    #[cfg(test)]
    pub fn start(log: Box<dyn DecisionLog>, max_batch: usize) -> Store {
        Store::open_in_thread(move || Ok(log), max_batch).expect("store thread")
    }

    /// Opens the log inside the writer thread (the synchronous PostgreSQL client runs its
    /// own runtime and must not be created on an async worker) and starts the writer.
    pub fn open_in_thread<F>(open: F, max_batch: usize) -> Result<Store, String>
    where
        F: FnOnce() -> Result<Box<dyn DecisionLog>, String> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Req>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let stats = Arc::new(StoreStats::default());
        let st = stats.clone();
        std::thread::Builder::new()
            .name("decision-store".into())
            .spawn(move || match open() {
                Ok(mut log) => {
                    let _ = ready_tx.send(Ok(()));
                    writer_loop(&mut *log, rx, max_batch.max(1), &st)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| e.to_string())?;
        ready_rx.recv().map_err(|_| "store thread died".to_string())??;
        Ok(Store { tx, stats })
    }

    pub async fn write(&self, op: Op) -> Result<OpResult, String> {
        let (s, r) = oneshot::channel();
        self.tx.send(Req::Write(op, Some(s))).map_err(|_| "store writer stopped".to_string())?;
        r.await.map_err(|_| "store writer stopped".to_string())?
    }

    /// Fire and forget (deleting finished records: losing one only delays its cleanup).
    pub fn write_later(&self, op: Op) {
        let _ = self.tx.send(Req::Write(op, None));
    }

    pub async fn decide(&self, rec: DecisionRecord) -> Result<Outcome, String> {
        match self.write(Op::Decide(rec)).await? {
            OpResult::Decided(o) => Ok(o),
            OpResult::Done => Err("store returned no outcome".into()),
        }
    }

    pub async fn load(&self) -> Result<Vec<DecisionRecord>, String> {
        let (s, r) = oneshot::channel();
        self.tx.send(Req::Load(s)).map_err(|_| "store writer stopped".to_string())?;
        r.await.map_err(|_| "store writer stopped".to_string())?
    }

    pub async fn audit_log(&self) -> Result<Vec<AuditEntry>, String> {
        let (s, r) = oneshot::channel();
        self.tx.send(Req::Audit(s)).map_err(|_| "store writer stopped".to_string())?;
        r.await.map_err(|_| "store writer stopped".to_string())?
    }
}

fn writer_loop(log: &mut dyn DecisionLog, rx: mpsc::Receiver<Req>, max_batch: usize, stats: &StoreStats) {
    let mut pending: Option<Req> = None;
    loop {
        let first = match pending.take() {
            Some(r) => r,
            None => match rx.recv() {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        match first {
            Req::Load(s) => {
                let _ = s.send(log.load());
            }
            Req::Audit(s) => {
                let _ = s.send(log.audit_log());
            }
            Req::Write(op, s) => {
                // Group commit: everything that queued up while we were busy joins this batch.
                let mut ops = vec![op];
                let mut replies = vec![s];
                while ops.len() < max_batch {
                    match rx.try_recv() {
                        Ok(Req::Write(op, s)) => {
                            ops.push(op);
                            replies.push(s);
                        }
                        Ok(other) => {
                            pending = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let res = log.write_batch(&ops);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.ops.fetch_add(ops.len() as u64, Ordering::Relaxed);
                match res {
                    Ok(results) => {
                        for (s, r) in replies.into_iter().zip(results) {
                            if let Some(s) = s {
                                let _ = s.send(Ok(r));
                            }
                        }
                    }
                    Err(e) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        for s in replies.into_iter().flatten() {
                            let _ = s.send(Err(e.clone()));
                        }
                    }
                }
            }
        }
    }
}

pub fn branches_to_json(b: &[(String, String)]) -> String {
    serde_json::to_string(b).unwrap_or_else(|_| "[]".into())
}

pub fn branches_from_json(s: &str) -> Vec<(String, String)> {
    serde_json::from_str(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A log that records batch sizes and is slow to "sync", so requests pile up.
    struct SlowLog(Arc<Mutex<Vec<usize>>>);
    impl DecisionLog for SlowLog {
        fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, String> {
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.0.lock().unwrap().push(ops.len());
            Ok(ops.iter().map(|_| OpResult::Decided(Outcome::Commit)).collect())
        }
        fn load(&mut self) -> Result<Vec<DecisionRecord>, String> {
            Ok(vec![])
        }
        fn audit_log(&mut self) -> Result<Vec<AuditEntry>, String> {
            Ok(vec![])
        }
    }

    fn rec(i: usize) -> DecisionRecord {
        DecisionRecord { gtid: format!("n.g-{i}"), outcome: Outcome::Commit, branches: vec![], decided_unix_ms: 0, node: "n".into(), source: "coordinator".into() }
    }

    async fn run(max_batch: usize) -> Vec<usize> {
        let sizes = Arc::new(Mutex::new(vec![]));
        let store = Store::start(Box::new(SlowLog(sizes.clone())), max_batch);
        let mut hs = vec![];
        for i in 0..50 {
            let s = store.clone();
            hs.push(tokio::spawn(async move { s.decide(rec(i)).await }));
        }
        for h in hs {
            assert_eq!(h.await.unwrap().unwrap(), Outcome::Commit);
        }
        let v = sizes.lock().unwrap().clone();
        v
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_batches_concurrent_decisions() {
        let sizes = run(1024).await;
        assert_eq!(sizes.iter().sum::<usize>(), 50);
        assert!(sizes.len() < 50, "no batching happened: {sizes:?}");
        let sizes = run(1).await;
        assert_eq!(sizes.len(), 50, "group commit off must write one op per batch");
    }
}

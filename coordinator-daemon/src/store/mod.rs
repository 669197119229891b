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
pub use cotx_protocol::lease::{Renewal, Token};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

/// The decision store's schema version, kept in the store's meta row. 1: releases up to
/// 0.1.0 (no meta row; brought up to date in place). 2: the meta row (version, store id,
/// restores, tick) and epochs sealed by a restore. A daemon refuses a store of a newer
/// version: it would misread what a newer daemon wrote (never run an older daemon on it).
pub const SCHEMA_VERSION: i64 = 2;

/// The refusal for a store made by a newer daemon.
pub fn newer_schema(store: &str, found: i64) -> String {
    format!(
        "decision store {store} has schema version {found}, written by a newer cotx-coordinator; this one ({}) knows versions up to {SCHEMA_VERSION}: \
         run the newer daemon (a store is never downgraded)",
        env!("CARGO_PKG_VERSION")
    )
}

/// Which store this is and how far it has come: what a daemon's witness file compares
/// (crate::ha::witness) to notice a store that went back to an older copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Random, made with the store: another id is another store.
    pub store_id: String,
    /// How many times `mark-restored` ran on it (each seals every epoch it held).
    pub restores: i64,
    /// Bumped by every lease claim and renewal: it only grows while the store is the same.
    pub tick: i64,
}

/// What `mark-restored` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Epochs sealed: a gtid of theirs without a record is no longer presumed aborted.
    pub sealed: u64,
    pub restores: i64,
}

/// Lease generations jump this far at a restore: a copy's grant counter is behind grants
/// given after it was taken, and generations must never repeat.
pub const RESTORE_GRANT_JUMP: i64 = 1_000_000;

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
    Absent { forgotten: bool },
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

/// The owner of a node id, as the store sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeLease {
    pub node: String,
    pub holder: String,
    pub url: String,
    /// Milliseconds until the lease runs out by the store's clock (negative: expired).
    pub expires_in_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Granted under a new generation (cotx_protocol::lease).
    Granted(i64),
    HeldBy(NodeLease),
}

#[derive(Debug, Clone)]
pub enum Op {
    /// Conditional insert: an existing record for the gtid wins and is returned. The
    /// token is the lease grant of the gtid's node the write is made under: the store
    /// writes only while that grant is in force (`None`: unfenced, tools and tests only).
    Decide(DecisionRecord, Option<Token>),
    /// Operator resolution of a quarantined (unreadable) record: replaces it.
    Overwrite(DecisionRecord),
    /// Every branch is finished: the record is kept (answerable) until the retention.
    Forget(String),
    /// Deletes records finished more than `older_than_ms` ago, raising each epoch's purge
    /// watermark to the highest sequence number deleted (cotx_protocol::answer::forgotten).
    Purge { older_than_ms: u64 },
    Audit(AuditEntry),
    /// Durable before any gtid of this epoch is issued.
    RegisterEpoch { node: String, nonce: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The outcome in force after the op (ours, or the one recorded before).
    Decided(Outcome),
    /// A record exists for the gtid but cannot be read: nothing was written.
    Corrupt(String),
    /// The writer does not hold the lease of the gtid's node any more: nothing was written.
    Fenced(String),
    /// The gtid is at or below its epoch's purge watermark: no decision is written for it
    /// any more (a write stalled past the retention must not land unopposed).
    Forgotten,
    Done,
}

/// The answer to a conditional decision write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// The outcome in force: ours, or the one recorded before.
    Outcome(Outcome),
    Corrupt(String),
    Fenced(String),
    Forgotten,
}

pub trait DecisionLog: Send + 'static {
    /// Applies the ops in one durable transaction (one sync), all or nothing.
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, String>;
    /// Unfinished records, and every row that cannot be read (finished or not).
    fn load(&mut self) -> Result<Loaded, String>;
    fn get(&mut self, gtid: &str) -> Result<Stored, String>;
    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, String>;
    /// Claims (or renews) the lease on `node` for `holder`. `fence_expired`: a holder
    /// whose lease ran out is cut off (its store session ended) and the claim taken.
    /// Every grant draws a new generation from a counter that never goes back.
    fn claim_node(&mut self, node: &str, holder: &str, url: &str, ttl_ms: u64, fence_expired: bool) -> Result<Claim, String>;
    /// Extends the lease of the grant `t` if it is still in force (cotx_protocol::lease::renewal);
    /// never grants anew.
    fn renew_node(&mut self, node: &str, t: &Token, ttl_ms: u64) -> Result<Renewal, String>;
    /// Gives the lease up. `forget`: delete it (a taken-over node with nothing left);
    /// otherwise it is only marked expired, so that anything still in doubt is taken over.
    fn release_node(&mut self, node: &str, holder: &str, forget: bool) -> Result<(), String>;
    fn nodes(&mut self) -> Result<Vec<NodeLease>, String>;
    fn identity(&mut self) -> Result<Identity, String>;
    /// After the store was restored from a copy, before any daemon runs on it: seals every
    /// epoch it holds (a missing record of theirs may be a commit made after the copy was
    /// taken: "forgotten", never presumed aborted), moves lease generations past any given
    /// since, and counts the restore. Refused while a daemon runs on the store.
    fn mark_restored(&mut self) -> Result<Restored, String>;
}

/// Parses one stored row; a row that cannot be read becomes a [`CorruptRecord`].
pub fn parse_row(gtid: String, outcome: &str, branches: &str, decided_ms: i64, node: String, source: String) -> Stored {
    let o = Outcome::parse(outcome);
    let b = serde_json::from_str::<Vec<(String, String)>>(branches);
    match (o, b) {
        (Some(outcome), Ok(branches)) if !(branches.is_empty() && outcome == Outcome::Commit) => Stored::Record(DecisionRecord {
            gtid,
            outcome,
            branches,
            decided_unix_ms: decided_ms.max(0) as u64,
            node,
            source,
        }),
        (None, _) => Stored::Corrupt(CorruptRecord { gtid, problem: format!("unknown outcome {outcome:?}") }),
        (_, Err(e)) => Stored::Corrupt(CorruptRecord { gtid, problem: format!("branch list does not parse ({e}): {branches:?}") }),
        (_, Ok(_)) => Stored::Corrupt(CorruptRecord { gtid, problem: "commit record with an empty branch list".into() }),
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

type Reply<T> = oneshot::Sender<Result<T, String>>;

enum Req {
    Write(Op, Option<Reply<OpResult>>),
    Load(Reply<Loaded>),
    Get(String, Reply<Stored>),
    Audit(Reply<Vec<AuditEntry>>),
    Claim { node: String, holder: String, url: String, ttl_ms: u64, fence_expired: bool, reply: Reply<Claim> },
    Renew { node: String, token: Token, ttl_ms: u64, reply: Reply<Renewal> },
    Release { node: String, holder: String, forget: bool, reply: Reply<()> },
    Nodes(Reply<Vec<NodeLease>>),
    Identity(Reply<Identity>),
}

#[derive(Default, Debug)]
pub struct StoreStats {
    pub batches: AtomicU64,
    pub ops: AtomicU64,
    pub errors: AtomicU64,
    /// Unix ms at which the writer began the request it is working on; 0 when idle. A
    /// store that stops answering (paused, partitioned) shows here: the daemon warns.
    pub busy_since_ms: AtomicU64,
}

impl StoreStats {
    /// How long the writer has been waiting on the store for its current request.
    pub fn stalled_ms(&self) -> u64 {
        match self.busy_since_ms.load(Ordering::Relaxed) {
            0 => 0,
            t => crate::state::unix_ms().saturating_sub(t),
        }
    }
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

    pub async fn decide(&self, rec: DecisionRecord, fence: Option<Token>) -> Result<Decided, String> {
        match self.write(Op::Decide(rec, fence)).await? {
            OpResult::Decided(o) => Ok(Decided::Outcome(o)),
            OpResult::Corrupt(why) => Ok(Decided::Corrupt(why)),
            OpResult::Fenced(why) => Ok(Decided::Fenced(why)),
            OpResult::Forgotten => Ok(Decided::Forgotten),
            OpResult::Done => Err("store returned no outcome".into()),
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Req) -> Result<T, String> {
        let (s, r) = oneshot::channel();
        self.tx.send(make(s)).map_err(|_| "store writer stopped".to_string())?;
        r.await.map_err(|_| "store writer stopped".to_string())?
    }

    pub async fn load(&self) -> Result<Loaded, String> {
        self.ask(Req::Load).await
    }

    pub async fn get(&self, gtid: &str) -> Result<Stored, String> {
        self.ask(|r| Req::Get(gtid.to_string(), r)).await
    }

    pub async fn audit_log(&self) -> Result<Vec<AuditEntry>, String> {
        self.ask(Req::Audit).await
    }

    pub async fn claim_node(&self, node: &str, holder: &str, url: &str, ttl_ms: u64, fence_expired: bool) -> Result<Claim, String> {
        let (node, holder, url) = (node.to_string(), holder.to_string(), url.to_string());
        self.ask(|reply| Req::Claim { node, holder, url, ttl_ms, fence_expired, reply }).await
    }

    pub async fn renew_node(&self, node: &str, token: &Token, ttl_ms: u64) -> Result<Renewal, String> {
        let (node, token) = (node.to_string(), token.clone());
        self.ask(|reply| Req::Renew { node, token, ttl_ms, reply }).await
    }

    pub async fn release_node(&self, node: &str, holder: &str, forget: bool) -> Result<(), String> {
        let (node, holder) = (node.to_string(), holder.to_string());
        self.ask(|reply| Req::Release { node, holder, forget, reply }).await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeLease>, String> {
        self.ask(Req::Nodes).await
    }

    pub async fn identity(&self) -> Result<Identity, String> {
        self.ask(Req::Identity).await
    }
}

fn writer_loop(log: &mut dyn DecisionLog, rx: mpsc::Receiver<Req>, max_batch: usize, stats: &StoreStats) {
    let mut pending: Option<Req> = None;
    loop {
        stats.busy_since_ms.store(0, Ordering::Relaxed);
        let first = match pending.take() {
            Some(r) => r,
            None => match rx.recv() {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        stats.busy_since_ms.store(crate::state::unix_ms().max(1), Ordering::Relaxed);
        match first {
            Req::Load(s) => {
                let _ = s.send(log.load());
            }
            Req::Get(g, s) => {
                let _ = s.send(log.get(&g));
            }
            Req::Audit(s) => {
                let _ = s.send(log.audit_log());
            }
            Req::Claim { node, holder, url, ttl_ms, fence_expired, reply } => {
                let _ = reply.send(log.claim_node(&node, &holder, &url, ttl_ms, fence_expired));
            }
            Req::Renew { node, token, ttl_ms, reply } => {
                let _ = reply.send(log.renew_node(&node, &token, ttl_ms));
            }
            Req::Release { node, holder, forget, reply } => {
                let _ = reply.send(log.release_node(&node, &holder, forget));
            }
            Req::Nodes(s) => {
                let _ = s.send(log.nodes());
            }
            Req::Identity(s) => {
                let _ = s.send(log.identity());
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

/// The outcome of an existing row met by a conditional insert.
pub fn existing_outcome(s: &str) -> OpResult {
    match Outcome::parse(s) {
        Some(o) => OpResult::Decided(o),
        None => OpResult::Corrupt(format!("unknown outcome {s:?}")),
    }
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
        fn load(&mut self) -> Result<Loaded, String> {
            Ok(Loaded::default())
        }
        fn get(&mut self, _: &str) -> Result<Stored, String> {
            Ok(Stored::Absent { forgotten: false })
        }
        fn audit_log(&mut self) -> Result<Vec<AuditEntry>, String> {
            Ok(vec![])
        }
        fn claim_node(&mut self, _: &str, _: &str, _: &str, _: u64, _: bool) -> Result<Claim, String> {
            Ok(Claim::Granted(1))
        }
        fn renew_node(&mut self, _: &str, _: &Token, _: u64) -> Result<Renewal, String> {
            Ok(Renewal::Renewed)
        }
        fn release_node(&mut self, _: &str, _: &str, _: bool) -> Result<(), String> {
            Ok(())
        }
        fn nodes(&mut self) -> Result<Vec<NodeLease>, String> {
            Ok(vec![])
        }
        fn identity(&mut self) -> Result<Identity, String> {
            Ok(Identity { store_id: "slow".into(), restores: 0, tick: 0 })
        }
        fn mark_restored(&mut self) -> Result<Restored, String> {
            Ok(Restored { sealed: 0, restores: 1 })
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
            hs.push(tokio::spawn(async move { s.decide(rec(i), None).await }));
        }
        for h in hs {
            assert_eq!(h.await.unwrap().unwrap(), Decided::Outcome(Outcome::Commit));
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

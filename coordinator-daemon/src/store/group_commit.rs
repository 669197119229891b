//! Group commit: one writer thread applies every request queued while the previous batch
//! was being synced, in one transaction, so many decisions share one fsync. `Store` is its
//! cheap, cloneable front for async code.

use super::error::StoreError;
use super::log::*;
use super::record::{AuditEntry, DecisionRecord, Loaded, Stored};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, Notify};

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

enum Req {
    Write(Op, Reply<OpResult>),
    /// The held writes have reached a batch: write them now.
    Flush,
    /// Anything else, answered alone after the writes queued before it.
    Ask(Ask),
}

enum Ask {
    Load(Reply<Loaded>),
    Get(String, Reply<Stored>),
    Audit(Reply<Vec<AuditEntry>>),
    Claim { node: String, holder: String, url: String, ttl_ms: u64, fence_expired: bool, reply: Reply<Claim> },
    Renew { node: String, token: Token, ttl_ms: u64, reply: Reply<Renewal> },
    Release { node: String, holder: String, forget: bool, reply: Reply<()> },
    Nodes(Reply<Vec<NodeLease>>),
    Identity(Reply<Identity>),
    Sessions { node: String, mine: Vec<SharedSession>, max_age_ms: u64, reply: Reply<Vec<SharedSession>> },
}

#[derive(Default, Debug)]
pub struct StoreStats {
    pub batches: AtomicU64,
    pub ops: AtomicU64,
    pub errors: AtomicU64,
    /// Batches that waited `commit_delay` for more decisions to join them.
    pub delayed: AtomicU64,
    /// Requests the writer took from its channel: each may have woken its thread.
    pub received: AtomicU64,
    /// Unix ms at which the writer began the request it is working on; 0 when idle. A
    /// store that stops answering (paused, partitioned) shows here: the daemon warns.
    pub busy_since_ms: AtomicU64,
    /// A write failed and none has been answered since.
    failing: AtomicBool,
    /// Notified by the first write answered after a failure: decision writes waiting
    /// to be retried go then, not after a delay that grew while the store was away
    /// (coordinator/completion.rs).
    pub back: Notify,
}

impl StoreStats {
    /// How long the writer has been waiting on the store for its current request.
    pub fn stalled_ms(&self) -> u64 {
        match self.busy_since_ms.load(Ordering::Relaxed) {
            0 => 0,
            t => crate::state::unix_ms().saturating_sub(t),
        }
    }

    /// Notes a write's result (a batch, a lease's claim, renewal or release): the first
    /// answered after a failure wakes `back`'s waiters. Any error counts (a claim's
    /// conflict too): a waiter woken for nothing only retries once early.
    fn answered<T>(&self, r: &Result<T, StoreError>) {
        match r {
            Err(_) => self.failing.store(true, Ordering::Relaxed),
            Ok(_) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    self.back.notify_waiters();
                }
            }
        }
    }
}

/// The writer thread's name: what a profile or /proc/<pid>/task shows, and how the load
/// driver finds the in-process coordinator's store thread to count its CPU.
pub const STORE_THREAD: &str = "decision-store";

const STOPPED: StoreError = StoreError::Stopped("store writer stopped");

/// Writes nobody waits for (finished marks, purges), held for the next batch. They are
/// not sent on the writer's channel: a send wakes the writer's thread, and that wake per
/// finished transaction was about a fifth of its CPU in the driver's process
/// (bench/RESULTS.md, "Writes nobody waits for"). The writer takes them whenever it
/// wakes, and after LATER_MS idle.
type Held = Mutex<Vec<Op>>;

fn take_held(held: &Held) -> Vec<Op> {
    std::mem::take(&mut *held.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Front of the store: cheap to clone, usable from async code.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Req>,
    held: Arc<Held>,
    max_batch: usize,
    pub stats: Arc<StoreStats>,
}

impl Store {
    /// Starts the writer thread. `max_batch` = 1 disables group commit.
    #[cfg(test)]
    pub fn start(log: Box<dyn DecisionLog>, max_batch: usize) -> Store {
        Store::open_in_thread(move || Ok(log), max_batch, Duration::ZERO).expect("store thread")
    }

    /// Opens the log inside the writer thread (the synchronous PostgreSQL client runs its
    /// own runtime and must not be created on an async worker) and starts the writer.
    pub fn open_in_thread<F>(open: F, max_batch: usize, commit_delay: Duration) -> Result<Store, StoreError>
    where
        F: FnOnce() -> Result<Box<dyn DecisionLog>, StoreError> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel::<Req>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), StoreError>>();
        let stats = Arc::new(StoreStats::default());
        let st = stats.clone();
        let held = Arc::new(Held::default());
        let h = held.clone();
        let max_batch = max_batch.max(1);
        std::thread::Builder::new()
            .name(STORE_THREAD.into())
            .spawn(move || match open() {
                Ok(mut log) => {
                    let _ = ready_tx.send(Ok(()));
                    let mut w = Writer { log: &mut *log, rx, held: &h, max_batch, stats: &st, pending: None };
                    w.run(Delay::new(commit_delay))
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        ready_rx.recv().map_err(|_| StoreError::Stopped("store thread died"))??;
        Ok(Store { tx, held, max_batch, stats })
    }

    pub async fn write(&self, op: Op) -> Result<OpResult, StoreError> {
        let (s, r) = oneshot::channel();
        self.tx.send(Req::Write(op, s)).map_err(|_| STOPPED)?;
        r.await.map_err(|_| STOPPED)?
    }

    /// Fire and forget (deleting finished records: losing one only delays its cleanup).
    /// Held for the next batch or LATER_MS; the writer is woken only for a full batch.
    pub fn write_later(&self, op: Op) {
        let full = {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            held.push(op);
            held.len() >= self.max_batch
        };
        if full {
            let _ = self.tx.send(Req::Flush);
        }
    }

    pub async fn decide(&self, rec: DecisionRecord, fence: Option<Token>) -> Result<Decided, StoreError> {
        match self.write(Op::Decide(rec, fence)).await? {
            OpResult::Decided(o) => Ok(Decided::Outcome(o)),
            OpResult::Corrupt(why) => Ok(Decided::Corrupt(why)),
            OpResult::Fenced(why) => Ok(Decided::Fenced(why)),
            OpResult::Forgotten => Ok(Decided::Forgotten),
            OpResult::Done => Err(StoreError::NoOutcome),
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Ask) -> Result<T, StoreError> {
        let (s, r) = oneshot::channel();
        self.tx.send(Req::Ask(make(s))).map_err(|_| STOPPED)?;
        r.await.map_err(|_| STOPPED)?
    }

    pub async fn load(&self) -> Result<Loaded, StoreError> {
        self.ask(Ask::Load).await
    }

    pub async fn get(&self, gtid: &str) -> Result<Stored, StoreError> {
        self.ask(|r| Ask::Get(gtid.to_string(), r)).await
    }

    pub async fn audit_log(&self) -> Result<Vec<AuditEntry>, StoreError> {
        self.ask(Ask::Audit).await
    }

    pub async fn claim_node(
        &self,
        node: &str,
        holder: &str,
        url: &str,
        ttl_ms: u64,
        fence_expired: bool,
    ) -> Result<Claim, StoreError> {
        let (node, holder, url) = (node.to_string(), holder.to_string(), url.to_string());
        self.ask(|reply| Ask::Claim { node, holder, url, ttl_ms, fence_expired, reply }).await
    }

    pub async fn renew_node(&self, node: &str, token: &Token, ttl_ms: u64) -> Result<Renewal, StoreError> {
        let (node, token) = (node.to_string(), token.clone());
        self.ask(|reply| Ask::Renew { node, token, ttl_ms, reply }).await
    }

    pub async fn release_node(&self, node: &str, holder: &str, forget: bool) -> Result<(), StoreError> {
        let (node, holder) = (node.to_string(), holder.to_string());
        self.ask(|reply| Ask::Release { node, holder, forget, reply }).await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeLease>, StoreError> {
        self.ask(Ask::Nodes).await
    }

    pub async fn identity(&self) -> Result<Identity, StoreError> {
        self.ask(Ask::Identity).await
    }

    pub async fn exchange_sessions(
        &self,
        node: &str,
        mine: Vec<SharedSession>,
        max_age_ms: u64,
    ) -> Result<Vec<SharedSession>, StoreError> {
        let node = node.to_string();
        self.ask(|reply| Ask::Sessions { node, mine, max_age_ms, reply }).await
    }
}

/// How long a write nobody waits for (a finished transaction's record marked for purging)
/// may wait for a batch somebody waits for: alone it would cost a sync of its own, one
/// more per transaction, when the next decision's sync can carry it.
const LATER_MS: u64 = 100;

/// While waits seldom pay (fewer than a quarter of the recent ones gathered another
/// decision), only one batch in this many + 1 waits, to find out whether they pay again: a
/// lone caller pays the delay on a few decisions, then on one in nine.
const SKIP_WHILE_WAITS_DO_NOT_PAY: u32 = 8;

/// `store.commit_delay_us`, as PostgreSQL's commit_delay: a batch with room waits this
/// long before its sync, so that decisions arriving meanwhile share it. A sync costs the
/// decision store's thread more CPU than anything else it does (bench/RESULTS.md, "The
/// decision store's commit delay"); waiting trades a little latency for fewer syncs,
/// and only while the waits pay (other decisions join them).
struct Delay {
    wait: Duration,
    /// How often recent waits gathered another decision (moving average, 0..1).
    payoff: f32,
    skipped: u32,
}

impl Delay {
    fn new(wait: Duration) -> Delay {
        Delay { wait, payoff: 0.5, skipped: 0 }
    }

    /// Whether this batch waits.
    fn now(&mut self) -> bool {
        if self.wait.is_zero() {
            return false;
        }
        if self.payoff >= 0.25 || self.skipped >= SKIP_WHILE_WAITS_DO_NOT_PAY {
            self.skipped = 0;
            return true;
        }
        self.skipped += 1;
        false
    }

    /// After a wait: did another decision join?
    fn paid(&mut self, joined: bool) {
        self.payoff = 0.75 * self.payoff + if joined { 0.25 } else { 0.0 };
    }
}

type Batch = Vec<(Op, Option<Reply<OpResult>>)>;

/// The writer thread's state: the log, its channel, the held writes.
struct Writer<'a> {
    log: &'a mut dyn DecisionLog,
    rx: mpsc::Receiver<Req>,
    held: &'a Held,
    max_batch: usize,
    stats: &'a StoreStats,
    /// A request taken while gathering a batch that cannot join it: next.
    pending: Option<Req>,
}

impl Writer<'_> {
    fn run(&mut self, mut delay: Delay) {
        let idle = Duration::from_millis(LATER_MS);
        loop {
            self.stats.busy_since_ms.store(0, Ordering::Relaxed);
            let first = match self.pending.take() {
                Some(r) => r,
                None => match self.rx.recv_timeout(idle) {
                    Ok(r) => self.received(r),
                    Err(e) => {
                        // Idle for LATER_MS: the held writes go alone.
                        self.write_held();
                        if e == mpsc::RecvTimeoutError::Disconnected {
                            return;
                        }
                        continue;
                    }
                },
            };
            match first {
                Req::Flush => self.write_held(),
                Req::Write(op, s) => self.write(op, s, &mut delay),
                Req::Ask(ask) => {
                    // Reads see every write queued before them.
                    self.write_held();
                    self.stats.busy_since_ms.store(crate::state::unix_ms().max(1), Ordering::Relaxed);
                    self.answer(ask);
                }
            }
        }
    }

    fn received(&self, r: Req) -> Req {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// Group commit: the held writes and everything that queued up while we were busy
    /// join this batch.
    fn write(&mut self, op: Op, reply: Reply<OpResult>, delay: &mut Delay) {
        let mut batch: Batch = vec![];
        self.join(&mut batch, op, reply);
        self.drain_writes(&mut batch);
        let waiting = |b: &Batch| b.iter().filter(|(_, s)| s.is_some()).count();
        let before = waiting(&batch);
        if self.pending.is_none() && batch.len() < self.max_batch && delay.now() {
            // Asleep, not in recv: the decisions that come meanwhile do not wake us.
            std::thread::sleep(delay.wait);
            self.drain_writes(&mut batch);
            delay.paid(waiting(&batch) > before);
            self.stats.delayed.fetch_add(1, Ordering::Relaxed);
        }
        // Held since the last join: they ride with this sync.
        self.held_into(&mut batch);
        write_batch(self.log, batch, self.stats);
    }

    /// A write joins the batch after every held write: one held before it was sent (a
    /// finished mark, then a decision of the same caller) stays before it.
    fn join(&self, batch: &mut Batch, op: Op, reply: Reply<OpResult>) {
        self.held_into(batch);
        batch.push((op, Some(reply)));
    }

    /// Every held write joins the batch, nobody waiting for its answer.
    fn held_into(&self, batch: &mut Batch) {
        batch.extend(take_held(self.held).into_iter().map(|op| (op, None)));
    }

    /// Every write already queued joins the batch (up to `max_batch`); the first other
    /// request stops it and is kept for after the batch.
    fn drain_writes(&mut self, batch: &mut Batch) {
        while batch.len() < self.max_batch {
            match self.rx.try_recv() {
                Ok(r) => match self.received(r) {
                    Req::Write(op, s) => self.join(batch, op, s),
                    Req::Flush => {}
                    ask @ Req::Ask(_) => {
                        self.pending = Some(ask);
                        return;
                    }
                },
                Err(_) => return,
            }
        }
    }

    fn write_held(&mut self) {
        let mut batch = vec![];
        self.held_into(&mut batch);
        if !batch.is_empty() {
            write_batch(self.log, batch, self.stats);
        }
    }

    fn answer(&mut self, ask: Ask) {
        let log = &mut *self.log;
        let stats = self.stats;
        match ask {
            Ask::Load(s) => reply(None, s, log.load()),
            Ask::Get(g, s) => reply(None, s, log.get(&g)),
            Ask::Audit(s) => reply(None, s, log.audit_log()),
            Ask::Claim { node, holder, url, ttl_ms, fence_expired, reply: s } => {
                reply(Some(stats), s, log.claim_node(&node, &holder, &url, ttl_ms, fence_expired))
            }
            Ask::Renew { node, token, ttl_ms, reply: s } => {
                reply(Some(stats), s, log.renew_node(&node, &token, ttl_ms))
            }
            Ask::Release { node, holder, forget, reply: s } => {
                reply(Some(stats), s, log.release_node(&node, &holder, forget))
            }
            Ask::Nodes(s) => reply(None, s, log.nodes()),
            Ask::Identity(s) => reply(None, s, log.identity()),
            Ask::Sessions { node, mine, max_age_ms, reply: s } => {
                reply(Some(stats), s, log.exchange_sessions(&node, &mine, max_age_ms))
            }
        }
    }
}

/// Answers one request; a write's result is noted first (`StoreStats::answered`). Reads
/// are not: a store that answers reads but refuses writes (a full disk, a read-only
/// standby) must not wake the decision writes waiting to be retried.
fn reply<T>(writes: Option<&StoreStats>, s: Reply<T>, r: Result<T, StoreError>) {
    if let Some(stats) = writes {
        stats.answered(&r);
    }
    let _ = s.send(r);
}

/// One transaction of the log for every op of the batch, each answered (if asked) with
/// its result or the batch's error.
fn write_batch(log: &mut dyn DecisionLog, batch: Batch, stats: &StoreStats) {
    // Busy from here, whoever called: a batch of held writes (nobody waits for them) that
    // hangs on the store must show as a stall too, or the writer is stuck unseen.
    stats.busy_since_ms.store(crate::state::unix_ms().max(1), Ordering::Relaxed);
    let (ops, replies): (Vec<Op>, Vec<_>) = batch.into_iter().unzip();
    let res = log.write_batch(&ops);
    stats.answered(&res);
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

#[cfg(test)]
mod tests;

//! The live transactions: the map of entries (state machine, long-poll channel, what is
//! durable), the gtids quarantined until an operator decides, the conditions logged once,
//! and the committed decision rows (decision in a participant) waiting to be deleted.
//! Memory only: nothing here talks to a database, and what it needs of the node's
//! ownership is passed in.

use crate::config::ResourceKind;
use crate::ha::holding::{Memory, Reconciled};
use crate::naming;
use crate::state::{BranchState, Outcome, Tx, TxState};
use crate::store::{CorruptRecord, DecisionRecord, Op, Store};
use crate::telemetry::log::log;
use serde_json::{json, Value};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub struct Entry {
    pub tx: Tx,
    pub watch: watch::Sender<Option<Outcome>>,
    /// A durable record exists (two-phase commit or recovered): delete it when done.
    pub recorded: bool,
    pub forgotten: bool,
    pub completing: bool,
    /// Its committed decision row (decision in a participant) is queued for deletion, or
    /// must stay (learnt in a recovery pass that could not list every resource).
    pub dip_forgotten: bool,
    /// The generation of the lease grant of the gtid's node under which this entry came
    /// into memory: its decision is written under that grant only (a stale write is
    /// fenced by the store), never under a later one.
    pub grant: i64,
}

impl Entry {
    pub fn new(tx: Tx, recorded: bool, grant: i64) -> Entry {
        let (w, _) = watch::channel(tx.decision());
        Entry { tx, watch: w, recorded, forgotten: false, completing: false, dip_forgotten: false, grant }
    }

    /// Makes the current decision visible to long polls, present and future (a plain
    /// `send` with nobody subscribed would store nothing).
    pub fn publish(&mut self) {
        let d = self.tx.decision();
        self.watch.send_if_modified(|v| {
            let changed = *v != d;
            *v = d;
            changed
        });
    }
}

/// A branch that did not reach the decided outcome: kept as /v1/incidents shows it.
pub use crate::wire::Incident;

/// Whether a gtid is in memory: a lookup's answer, not a refusal (what to say about a
/// gtid that is not here is the caller's business: the store's record, its owner, ...).
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<T> {
    Here(T),
    NotHere,
}

impl<T> Lookup<T> {
    pub fn here(self) -> Option<T> {
        match self {
            Lookup::Here(t) => Some(t),
            Lookup::NotHere => None,
        }
    }
}

#[derive(Default)]
pub struct Registry {
    pub txs: Mutex<HashMap<String, Entry>>,
    /// Records that exist but cannot be read: their gtids are stopped until an operator
    /// decides (never presumed abort).
    pub quarantined: Mutex<HashMap<String, CorruptRecord>>,
    /// Keys of conditions already logged once (foreign branches, unknown resources).
    warned: Mutex<HashSet<String>>,
    /// Committed decision rows (decision in a participant) whose transactions are
    /// finished: deleted in batches by the recovery pass.
    pub decisions_to_forget: Mutex<Vec<String>>,
    /// A bound on the undecided transactions without walking the map (every begin would
    /// walk the whole map under its lock once retention keeps `max_active` entries): how
    /// many were undecided at the last retention sweep (expiry.rs), plus every insert since.
    pub(super) undecided_bound: std::sync::atomic::AtomicUsize,
    /// (expiry.rs) Every undecided transaction's deadline, soonest first (entries of transactions
    /// decided or gone since are skipped when they come up): timeouts without a walk of
    /// the map at every tick.
    pub(super) deadlines: Mutex<BinaryHeap<Reverse<(Instant, String)>>>,
    /// When the retention sweep (a walk of the whole map) last ran.
    pub(super) last_sweep: Mutex<Option<Instant>>,
    /// (expiry.rs) When each transaction deciding in a participant stops waiting for its
    /// owner's report, soonest first: one heap entry instead of a task and timer each.
    pub(super) graces: Mutex<BinaryHeap<Reverse<(Instant, String)>>>,
    /// (deadlocks.rs) Transactions with a branch whose database session is known, by when
    /// they have been active long enough for the deadlock detector to look: the tick asks
    /// the top of this heap, so no transaction that long means no query to any database.
    pub(super) waits_due: Mutex<BinaryHeap<Reverse<(Instant, String)>>>,
    /// When the detector last read lock waits, and whether a pass is running now.
    pub(super) waits_checked: Mutex<(Option<Instant>, bool)>,
    /// (one_request.rs) One insert-if-new at a time.
    entering: Mutex<()>,
}

/// Our transactions' sessions at the resources, as the deadlock detector maps lock waits:
/// (resource, session) -> gtid, and when each began (unix ms: the victim is the youngest).
#[derive(Debug, Default)]
pub struct Sessions {
    pub of: HashMap<(String, i64), String>,
    pub begun: HashMap<String, u64>,
}

impl Registry {
    /// Runs `f` on the gtid's entry and publishes its decision after.
    pub fn with_entry<T>(&self, gtid: &str, f: impl FnOnce(&mut Entry) -> T) -> Lookup<T> {
        let mut txs = self.txs.lock().unwrap();
        match txs.get_mut(gtid) {
            Some(e) => {
                let r = f(e);
                e.publish();
                Lookup::Here(r)
            }
            None => Lookup::NotHere,
        }
    }

    /// Records the session of a branch (its client's report) and, for the transaction's
    /// first such branch, when the deadlock detector should start looking at it (`after`
    /// from its start): one heap entry per transaction.
    pub fn note_session(&self, gtid: &str, bid: &str, session: i64, after: Duration) -> Lookup<()> {
        let first_due = self.with_entry(gtid, |e| {
            let first = e.tx.branches.iter().all(|b| b.session.is_none());
            e.tx.set_session(bid, session).ok().filter(|_| first).map(|_| e.tx.created + after)
        });
        match first_due {
            Lookup::Here(Some(due)) => self.waits_due.lock().unwrap().push(Reverse((due, gtid.to_string()))),
            Lookup::Here(None) => {}
            Lookup::NotHere => return Lookup::NotHere,
        }
        Lookup::Here(())
    }

    /// Has a transaction with a known session been active long enough to look for lock
    /// waits? Decided or gone transactions at the top of the heap are dropped on the way.
    pub fn waits_due(&self, now: Instant) -> bool {
        let mut heap = self.waits_due.lock().unwrap();
        let txs = self.txs.lock().unwrap();
        while let Some(Reverse((due, g))) = heap.peek() {
            if txs.get(g).is_some_and(|e| e.tx.state() == TxState::Active) {
                return *due <= now;
            }
            heap.pop();
        }
        false
    }

    /// Starts a detector pass if one is due: a watched transaction is old enough, the last
    /// pass began `every` or more ago and none is running. `pass_done` must follow.
    pub fn start_wait_check(&self, now: Instant, every: Duration) -> bool {
        let mut w = self.waits_checked.lock().unwrap();
        if w.1 || w.0.is_some_and(|t| now.duration_since(t) < every) || !self.waits_due(now) {
            return false;
        }
        *w = (Some(now), true);
        true
    }

    pub fn wait_check_done(&self) {
        self.waits_checked.lock().unwrap().1 = false;
    }

    /// The sessions of every active transaction the detector watches (and the heap
    /// without the decided ones).
    pub fn live_sessions(&self) -> Sessions {
        let mut heap = self.waits_due.lock().unwrap();
        let txs = self.txs.lock().unwrap();
        let mut out = Sessions::default();
        heap.retain(|Reverse((_, g))| txs.get(g).is_some_and(|e| e.tx.state() == TxState::Active));
        for Reverse((_, g)) in heap.iter() {
            let tx = &txs[g].tx;
            for (res, s) in tx.active_sessions() {
                out.of.insert((res, s), g.clone());
            }
            out.begun.insert(g.clone(), tx.created_unix_ms);
        }
        out
    }

    /// The sessions of a transaction's branches not yet prepared (an abort cancels their
    /// waiting statements).
    pub fn sessions_of(&self, gtid: &str) -> Vec<(String, i64)> {
        self.txs.lock().unwrap().get(gtid).map(|e| e.tx.active_sessions()).unwrap_or_default()
    }

    pub fn insert(&self, gtid: &str, e: Entry) {
        let mut txs = self.txs.lock().unwrap();
        self.undecided_bound.fetch_add(1, Relaxed);
        self.deadlines.lock().unwrap().push(Reverse((e.tx.deadline, gtid.to_string())));
        txs.insert(gtid.to_string(), e);
    }

    pub fn remove(&self, gtid: &str) {
        self.txs.lock().unwrap().remove(gtid);
    }

    pub fn contains(&self, gtid: &str) -> bool {
        self.txs.lock().unwrap().contains_key(gtid)
    }

    /// Logs `msg` once per `key` (conditions that recovery meets again at every pass).
    pub fn warn_once(&self, key: String, msg: &str, fields: Value) {
        if self.warned.lock().unwrap().insert(key) {
            log("error", msg, fields);
        }
    }

    pub fn quarantine(&self, c: &CorruptRecord) {
        if self.quarantined.lock().unwrap().insert(c.gtid.clone(), c.clone()).is_none() {
            log("error", "transaction quarantined until an operator decides (cotx-coordinator force): its outcome cannot be read from the store",
                json!({"gtid": c.gtid, "problem": c.problem}));
        }
    }

    pub fn is_quarantined(&self, gtid: &str) -> bool {
        self.quarantined.lock().unwrap().contains_key(gtid)
    }

    pub fn unquarantine(&self, gtid: &str) {
        self.quarantined.lock().unwrap().remove(gtid);
    }

    /// Durable decisions not yet in memory, of nodes `generation` knows (Some: we act for
    /// the node, under that grant generation). Returns how many were taken in, and the
    /// records of transactions memory still shows committing (their write's answer was
    /// lost): the caller applies those decisions.
    pub fn adopt_records(
        &self,
        recs: &[DecisionRecord],
        timeout_ms: u64,
        generation: &dyn Fn(&str) -> Option<i64>,
        kind_of: &dyn Fn(&str) -> Option<ResourceKind>,
    ) -> (usize, Vec<(String, Outcome)>) {
        let mut settled = vec![];
        let mut txs = self.txs.lock().unwrap();
        let mut n = 0;
        for r in recs {
            if let Some(e) = txs.get(&r.gtid) {
                if e.tx.state() == TxState::Committing {
                    settled.push((r.gtid.clone(), r.outcome));
                }
                continue;
            }
            let Some(grant) = naming::gtid_node(&r.gtid).and_then(generation) else { continue };
            let mut tx = Tx::new(r.gtid.clone(), Duration::from_millis(timeout_ms));
            tx.recovered = true;
            tx.created_unix_ms = r.decided_unix_ms;
            for (res, bid) in &r.branches {
                if kind_of(res).is_none() {
                    self.warn_once(format!("unconfigured:{}:{res}", r.gtid), "a decided transaction has a branch on a resource that is not configured: it cannot be finished from here",
                        json!({"gtid": r.gtid, "resource": res, "branch_id": bid, "outcome": r.outcome.as_str()}));
                }
                let _ = tx.register(bid, res, kind_of(res).unwrap_or(ResourceKind::Postgres));
                let _ = tx.prepared(bid);
            }
            tx.settle(r.outcome, || format!("recorded abort ({})", r.source));
            txs.insert(r.gtid.clone(), Entry::new(tx, true, grant));
            n += 1;
        }
        (n, settled)
    }

    /// Applies a decision the store holds; false when memory had it already (a retry and
    /// a recovery pass may both bring it). A gtid not here is still a decision taken
    /// (true: counted by the caller).
    pub fn apply_decision(&self, gtid: &str, o: Outcome) -> bool {
        let mut txs = self.txs.lock().unwrap();
        let Some(e) = txs.get_mut(gtid) else { return true };
        if e.tx.decision() == Some(o) {
            return false;
        }
        e.tx.settle(o, || "store holds an abort decision".into());
        e.recorded = true;
        e.publish();
        true
    }

    /// The store's word after a regained grant, applied to one entry (see `Reconciled`).
    pub fn reconcile(&self, gtid: &str, verdict: Reconciled, generation: i64) {
        let mut txs = self.txs.lock().unwrap();
        match verdict {
            Reconciled::Keep(o) => {
                if let Some(e) = txs.get_mut(gtid) {
                    e.grant = generation;
                    e.recorded = true;
                    e.tx.recovered = true;
                    e.tx.settle(o, || "recorded abort (a daemon that took this node over)".into());
                    e.publish();
                }
            }
            Reconciled::Drop => {
                txs.remove(gtid);
            }
            Reconciled::Quarantine(q) => {
                txs.remove(gtid);
                drop(txs);
                self.quarantine(&q);
            }
            Reconciled::Leave => {}
        }
    }

    /// Gtids in memory of `node`.
    pub fn gtids_of(&self, node: &str) -> Vec<String> {
        self.txs.lock().unwrap().keys().filter(|g| naming::gtid_node(g) == Some(node)).cloned().collect()
    }

    /// Drops what we hold of a node we no longer act for.
    pub fn forget_node(&self, node: &str) {
        self.txs.lock().unwrap().retain(|g, _| naming::gtid_node(g) != Some(node));
    }

    /// Deletes the durable record once every branch is confirmed finished; queues a
    /// committed decision row in a participant for deletion likewise.
    pub fn maybe_forget(&self, gtid: &str, store: &Store) {
        let mut txs = self.txs.lock().unwrap();
        if let Some(e) = txs.get_mut(gtid) {
            if e.recorded && !e.forgotten && e.tx.decision().is_some() && e.tx.all_finished() {
                e.forgotten = true;
                store.write_later(Op::Forget(gtid.to_string()));
            }
            // Abort rows stay: see decisions.rs.
            if e.tx.decide_in.is_some()
                && !e.dip_forgotten
                && e.tx.decision() == Some(Outcome::Commit)
                && e.tx.all_finished()
            {
                e.dip_forgotten = true;
                self.decisions_to_forget.lock().unwrap().push(gtid.to_string());
            }
        }
    }

    pub fn forget_finished(&self, store: &Store) {
        let gtids: Vec<String> = self.txs.lock().unwrap().keys().cloned().collect();
        for g in gtids {
            self.maybe_forget(&g, store);
        }
    }

    /// Undecided transactions (the "active set"): their prepared branches are left alone.
    pub fn active_set(&self) -> HashSet<String> {
        self.txs.lock().unwrap().values().filter(|e| e.tx.is_undecided()).map(|e| e.tx.gtid.clone()).collect()
    }

    /// Inserts a new entry unless `cap` transactions are undecided (Err: how many are).
    /// Counted only when the map could hold that many (decided ones stay for retention).
    pub fn insert_capped(&self, gtid: &str, e: Entry, cap: usize) -> Result<(), usize> {
        let mut txs = self.txs.lock().unwrap();
        let bound = self.undecided_bound.load(Relaxed);
        // Walk only when the bound says the cap may be reached (then count exactly).
        let active =
            if txs.len() < cap || bound < cap { 0 } else { txs.values().filter(|e| e.tx.is_undecided()).count() };
        if active >= cap {
            return Err(active);
        }
        self.undecided_bound.store(bound.max(active) + 1, Relaxed);
        self.deadlines.lock().unwrap().push(Reverse((e.tx.deadline, gtid.to_string())));
        txs.insert(gtid.to_string(), e);
        Ok(())
    }

    /// `insert_capped` unless the gtid is in memory already (Ok(false): nothing changed).
    pub fn insert_new_capped(&self, gtid: &str, e: Entry, cap: usize) -> Result<bool, usize> {
        // Look and insert one caller at a time: two requests for one gtid enter it once.
        let _one_at_a_time = self.entering.lock().unwrap();
        if self.txs.lock().unwrap().contains_key(gtid) {
            return Ok(false);
        }
        self.insert_capped(gtid, e, cap).map(|()| true)
    }

    /// Decision known in memory, and whether its owners' grace period is still running.
    pub fn decision_of(&self, gtid: &str, grace: Duration) -> Option<(Outcome, bool)> {
        let txs = self.txs.lock().unwrap();
        let e = txs.get(gtid)?;
        let o = e.tx.decision()?;
        // Loaded from the store: its owners are long gone, no grace.
        Some((o, !e.tx.recovered && e.tx.decided.map(|d| d.elapsed() < grace).unwrap_or(false)))
    }

    /// Branches recorded as prepared in decided transactions on `resource`.
    pub fn decided_prepared_on(&self, resource: &str) -> Vec<(String, String)> {
        let txs = self.txs.lock().unwrap();
        txs.values()
            .filter(|e| e.tx.decision().is_some())
            .flat_map(|e| {
                e.tx.branches
                    .iter()
                    .filter(|b| b.resource == resource && b.state == BranchState::Prepared)
                    .map(|b| (e.tx.gtid.clone(), b.branch_id.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Decided transactions in memory with a branch still prepared.
    pub fn decided_unfinished(&self) -> Vec<String> {
        let txs = self.txs.lock().unwrap();
        txs.values().filter(|e| e.tx.decision().is_some() && e.tx.in_doubt()).map(|e| e.tx.gtid.clone()).collect()
    }

    /// Whether any transaction of `node` in memory is undecided or has a prepared branch.
    pub fn has_unfinished_of(&self, node: &str) -> bool {
        self.txs
            .lock()
            .unwrap()
            .values()
            .any(|e| naming::gtid_node(&e.tx.gtid) == Some(node) && (e.tx.is_undecided() || e.tx.in_doubt()))
    }

    /// How long ago branch `bid` of the gtid was prepared, else its decision was taken, in
    /// ms (0: unknown or not here).
    pub fn prepared_ms_ago(&self, gtid: &str, bid: &str) -> u64 {
        let txs = self.txs.lock().unwrap();
        let Some(e) = txs.get(gtid) else { return 0 };
        e.tx.prepared_ms_ago(bid)
    }
}

/// The lease operations' view of memory (ha/lease.rs): the registry's own methods.
impl Memory for Registry {
    fn gtids_of(&self, node: &str) -> Vec<String> {
        Registry::gtids_of(self, node)
    }
    fn reconcile(&self, gtid: &str, verdict: Reconciled, generation: i64) {
        Registry::reconcile(self, gtid, verdict, generation)
    }
    fn forget_node(&self, node: &str) {
        Registry::forget_node(self, node)
    }
    fn warn_once(&self, key: String, msg: &str, fields: Value) {
        Registry::warn_once(self, key, msg, fields)
    }
}

#[cfg(test)]
mod tests;

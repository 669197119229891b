//! The coordinator proper: the registry of live transactions, the API's operations on
//! them, and the answers about gtids this daemon does not hold in memory. Every operation
//! validates against the state machine first (a refusal changes nothing), then applies; a
//! commit answers only once its decision is durable.
//!
//! The same type is extended by completion.rs (finishing branches), operator.rs (force,
//! audit, in-doubt report), housekeeping.rs (timeouts, retention, what recovery reads),
//! ha/lease.rs (owning node ids) and recovery.rs.

pub mod completion;
pub mod decisions;
pub mod holds;
pub mod housekeeping;
pub mod operator;
pub mod recovery;

use crate::config::{Config, ResourceKind};
use crate::telemetry::log::log;
use crate::telemetry::metrics::Metrics;
use crate::naming;
use crate::participants::resources::ResourceClient;
use crate::state::{self, refuse, FinishedBy, Outcome, Refusal, StateFilter, Tx, TxState};
use crate::store::{CorruptRecord, Decided, DecisionRecord, Store, Stored, Token};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use crate::refusal::RefusalCode;

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

#[derive(Clone, Debug, serde::Serialize)]
pub struct Incident {
    pub at_unix_ms: u64,
    pub gtid: String,
    pub branch_id: String,
    pub resource: String,
    pub message: String,
}

pub struct Coordinator {
    pub cfg: Config,
    pub store: Store,
    pub metrics: Metrics,
    pub resources: HashMap<String, Arc<ResourceClient>>,
    pub txs: Mutex<HashMap<String, Entry>>,
    /// This start's epoch: part of every gtid issued, registered in the store first.
    pub nonce: u64,
    seq: AtomicU64,
    /// Who holds our leases: unique per process start.
    pub holder: String,
    pub resource_up: Mutex<HashMap<String, bool>>,
    pub incidents: Mutex<Vec<Incident>>,
    /// Records that exist but cannot be read: their gtids are stopped until an operator
    /// decides (never presumed abort).
    pub quarantined: Mutex<HashMap<String, CorruptRecord>>,
    /// Nodes whose lease we took over from a daemon that stopped renewing it.
    pub adopted: Mutex<HashSet<String>>,
    /// Epochs the store knows (refreshed by every recovery pass).
    pub epochs: Mutex<HashSet<(String, u64)>>,
    /// Until when our lease is known valid: past it, act on nothing until it is renewed.
    pub lease: crate::ha::lease::LeaseClock,
    /// Keys of conditions already logged once (foreign branches, unknown resources).
    pub warned: Mutex<HashSet<String>>,
    /// Committed decision rows (decision in a participant) whose transactions are
    /// finished: deleted in batches by the recovery pass.
    pub decisions_to_forget: Mutex<Vec<String>>,
    /// The lease grants we act under, by node: our own and the nodes taken over.
    pub grants: Mutex<HashMap<String, Token>>,
    /// Our own grant was lost and memory is not yet reconciled with the store under a new
    /// one: nothing is answered from memory, nothing acted on (lease.rs, `regain`).
    pub regaining: std::sync::atomic::AtomicBool,
    /// The store has stopped answering (logged once per stall).
    pub store_stalled: std::sync::atomic::AtomicBool,
    /// How each resource enforces commitment ordering, and client mode's live holds.
    pub enforcement: crate::participants::enforcement::runtime::Enforcement,
}

pub type Res = Result<Value, Refusal>;

// The API's connection tasks and the background loops hold an Arc<Coordinator> across
// awaits on tokio's multi-thread runtime: it must be Send and Sync (a compile error here,
// not a puzzling one at a `tokio::spawn` far away).
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Coordinator>()
};

fn nonce() -> u64 {
    // A per-start random value; /dev/urandom is always there on Linux, the clock is a fallback.
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if f.read_exact(&mut b).is_ok() {
            return u64::from_le_bytes(b) & 0xffff_ffff_ffff;
        }
    }
    state::unix_ms() & 0xffff_ffff_ffff
}

/// A lease holder id: host, process and epoch, so every start is a distinct holder.
pub fn holder_id(node: &str, nonce: u64) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{node}@{}/{}/{nonce:012x}", host.trim(), std::process::id())
}

impl Coordinator {
    pub fn new(cfg: Config, store: Store, nonce_value: Option<u64>) -> Result<Arc<Coordinator>, String> {
        let mut resources = HashMap::new();
        for r in &cfg.resources {
            resources.insert(r.name.clone(), Arc::new(ResourceClient::new(r, &cfg.gid_prefix, &cfg.node_id)?));
        }
        let n = nonce_value.unwrap_or_else(nonce);
        let cfg_resources = cfg.resources.clone();
        Ok(Arc::new(Coordinator {
            holder: holder_id(&cfg.node_id, n),
            cfg,
            store,
            metrics: Metrics::default(),
            resources,
            txs: Mutex::new(HashMap::new()),
            nonce: n,
            seq: AtomicU64::new(1),
            resource_up: Mutex::new(HashMap::new()),
            incidents: Mutex::new(Vec::new()),
            quarantined: Mutex::new(HashMap::new()),
            adopted: Mutex::new(HashSet::new()),
            epochs: Mutex::new(HashSet::new()),
            lease: crate::ha::lease::LeaseClock::new(),
            warned: Mutex::new(HashSet::new()),
            decisions_to_forget: Mutex::new(Vec::new()),
            grants: Mutex::new(HashMap::new()),
            regaining: std::sync::atomic::AtomicBool::new(false),
            store_stalled: std::sync::atomic::AtomicBool::new(false),
            enforcement: crate::participants::enforcement::runtime::Enforcement::new(&cfg_resources),
        }))
    }

    pub fn new_nonce() -> u64 {
        nonce()
    }

    pub fn kind_of(&self, resource: &str) -> Option<ResourceKind> {
        self.cfg.resources.iter().find(|r| r.name == resource).map(|r| r.kind)
    }

    /// Nodes this daemon acts for: its own and those it took over.
    pub fn acts_for(&self, node: &str) -> bool {
        node == self.cfg.node_id || self.adopted.lock().unwrap().contains(node)
    }

    /// Our current grant of `node`'s lease, if we hold one.
    pub fn grant(&self, node: &str) -> Option<Token> {
        self.grants.lock().unwrap().get(node).cloned()
    }

    fn generation_of(&self, node: &str) -> i64 {
        self.grant(node).map(|t| t.generation).unwrap_or(-1)
    }

    /// Logs `msg` once per `key` (conditions that recovery meets again at every pass).
    pub fn warn_once(&self, key: String, msg: &str, fields: Value) {
        if self.warned.lock().unwrap().insert(key) {
            log("error", msg, fields);
        }
    }

    /// Durable decisions of nodes we act for, not yet in memory: their branches are unknown
    /// until recovery looks, so recovery may act on them at once (no owner grace).
    /// A record of a transaction that memory still shows committing (its write's answer
    /// was lost, e.g. the store paused, and the retry has not come round yet) decides it
    /// now: clients waiting on it hear the outcome, completion starts.
    pub fn adopt_records(self: &Arc<Self>, recs: &[DecisionRecord]) -> usize {
        let mut settled = vec![];
        let n = self.adopt_records_inner(recs, &mut settled);
        for (g, o) in settled {
            log("info", "the store holds the decision of a transaction still committing in memory: applied", json!({"gtid": g, "outcome": o.as_str()}));
            self.apply_decision(&g, o);
        }
        n
    }

    fn adopt_records_inner(&self, recs: &[DecisionRecord], settled: &mut Vec<(String, Outcome)>) -> usize {
        let mut txs = self.txs.lock().unwrap();
        let mut n = 0;
        for r in recs {
            if let Some(e) = txs.get(&r.gtid) {
                if e.tx.state == TxState::Committing {
                    settled.push((r.gtid.clone(), r.outcome));
                }
                continue;
            }
            let Some(node) = naming::gtid_node(&r.gtid).filter(|x| self.acts_for(x)) else { continue };
            let mut tx = Tx::new(r.gtid.clone(), Duration::from_millis(self.cfg.timeouts.transaction_ms));
            tx.recovered = true;
            tx.created_unix_ms = r.decided_unix_ms;
            for (res, bid) in &r.branches {
                if self.kind_of(res).is_none() {
                    self.warn_once(format!("unconfigured:{}:{res}", r.gtid), "a decided transaction has a branch on a resource that is not configured: it cannot be finished from here",
                        json!({"gtid": r.gtid, "resource": res, "branch_id": bid, "outcome": r.outcome.as_str()}));
                }
                let _ = tx.register(bid, res, self.kind_of(res).unwrap_or(ResourceKind::Postgres));
                let _ = tx.prepared(bid);
            }
            match r.outcome {
                Outcome::Commit => tx.state = TxState::Committed,
                Outcome::Abort => tx.abort(format!("recorded abort ({})", r.source), false),
            }
            tx.decided = Some(Instant::now());
            txs.insert(r.gtid.clone(), Entry::new(tx, true, self.generation_of(node)));
            n += 1;
        }
        n
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

    fn with_tx<T>(&self, gtid: &str, f: impl FnOnce(&mut Entry) -> Result<T, Refusal>) -> Result<T, Refusal> {
        if let Err(e) = naming::check_id("gtid", gtid) {
            return refuse(e.code, e.message);
        }
        // The store's word over memory: a quarantined gtid is answered "quarantined" by
        // every daemon, the one that decided it included (cotx_protocol::answer).
        if self.is_quarantined(gtid) {
            return refuse(RefusalCode::Quarantined, format!("{gtid}: its outcome cannot be read from the store (an unreadable record, or one lost to a purge or a restore: see the in-doubt report); an operator must decide (cotx-coordinator force)"));
        }
        if self.regaining.load(Relaxed) {
            return refuse(RefusalCode::LeaseUnconfirmed, format!("node {} lost its lease and is taking it back: ask again", self.cfg.node_id));
        }
        let mut txs = self.txs.lock().unwrap();
        match txs.get_mut(gtid) {
            Some(e) => {
                let r = f(e);
                e.publish();
                r
            }
            None => Err(Refusal::new(RefusalCode::NotInMemory, gtid)),
        }
    }

    /// Why a gtid that is not in memory cannot be served here. Presumed abort
    /// (`unknown_transaction`) is answered only for nodes this daemon acts for; another
    /// node's transaction is sent to its owner, or waits for a takeover.
    pub async fn elsewhere(&self, gtid: &str) -> Refusal {
        if self.is_quarantined(gtid) {
            return Refusal::new(RefusalCode::Quarantined, format!("{gtid}: its outcome cannot be read from the store (an unreadable record, or one lost to a purge or a restore: see the in-doubt report); an operator must decide (cotx-coordinator force)"));
        }
        let unknown = || Refusal::new(RefusalCode::UnknownTransaction, format!("no transaction {gtid:?} (never begun, or aborted and finished: presumed abort)"));
        let Some((node, _)) = naming::gtid_epoch(gtid) else { return unknown() };
        // No record may mean abort only while a record could still be there: past its
        // epoch's purge watermark the outcome is forgotten, never "aborted".
        match self.store.get(gtid).await {
            Ok(Stored::Absent { forgotten: false }) => {}
            Ok(Stored::Absent { forgotten: true }) => {
                return Refusal::new(RefusalCode::OutcomeForgotten, format!("{gtid}: its record was purged after the retention (timeouts.outcome_retention_ms), or its epoch was sealed when the store was restored from an older copy (mark-restored); its outcome is no longer known"));
            }
            // Callers that answer with a record read it themselves (stored_decision).
            Ok(Stored::Record(_)) => {}
            Ok(Stored::Corrupt(c)) => {
                self.quarantine(&c);
                return Refusal::new(RefusalCode::Quarantined, format!("{gtid}: its outcome cannot be read from the store (an unreadable record, or one lost to a purge or a restore: see the in-doubt report); an operator must decide (cotx-coordinator force)"));
            }
            Err(e) => return Refusal::new(RefusalCode::StoreUnavailable, format!("cannot read the decision of {gtid}: {e}")),
        }
        // Presumed abort only by the node's owner under its grant (cotx_protocol::answer):
        // a daemon that took the node over, or any other, answers from the store only —
        // the previous owner's decision may still land (recovery records abort first).
        if node == self.cfg.node_id && self.grant(node).is_some() {
            return unknown();
        }
        if self.acts_for(node) {
            return Refusal::new(RefusalCode::OwnerUnavailable,
                format!("{gtid} belongs to node {node}, taken over by this daemon: its recovery records the outcome; ask again"));
        }
        match self.store.nodes().await {
            Ok(ls) if !ls.iter().any(|l| l.node == node) => Refusal::new(RefusalCode::OwnerUnavailable,
                format!("{gtid} belongs to node {node}, which no daemon of this store holds and which has no recorded outcome for it; ask its daemon")),
            Ok(ls) => match ls.into_iter().find(|l| l.node == node) {
                Some(l) if l.expires_in_ms > 0 && !l.url.is_empty() => Refusal {
                    code: RefusalCode::WrongNode,
                    message: format!("{gtid} belongs to node {node}, served at {}", l.url),
                    owner_url: Some(l.url),
                },
                _ => Refusal::new(RefusalCode::OwnerUnavailable,
                    format!("{gtid} belongs to node {node}, which holds no live lease: a takeover will decide it; ask again")),
            },
            Err(e) => Refusal::new(RefusalCode::StoreUnavailable, format!("cannot look up the owner of {gtid}: {e}")),
        }
    }

    /// The store's word on a gtid not in memory: its recorded decision, if any.
    pub async fn stored_decision(&self, gtid: &str) -> Result<Option<DecisionRecord>, Refusal> {
        if let Err(e) = naming::check_id("gtid", gtid) {
            return refuse(e.code, e.message);
        }
        match self.store.get(gtid).await {
            Ok(Stored::Record(r)) => Ok(Some(r)),
            Ok(Stored::Corrupt(c)) => {
                self.quarantine(&c);
                Err(self.elsewhere(gtid).await)
            }
            Ok(Stored::Absent { .. }) => Ok(None),
            Err(e) => refuse(RefusalCode::StoreUnavailable, format!("cannot read the decision of {gtid}: {e}")),
        }
    }

    /// Runs a synchronous operation on a gtid; when it is not in memory, says why.
    async fn on<T>(&self, gtid: &str, f: impl FnOnce(&mut Entry) -> Result<T, Refusal>) -> Result<T, Refusal> {
        match self.with_tx(gtid, f) {
            Err(r) if r.code == RefusalCode::NotInMemory => Err(self.elsewhere(gtid).await),
            other => other,
        }
    }

    /// `on` for the other modules of the coordinator.
    pub async fn on_tx<T>(&self, gtid: &str, f: impl FnOnce(&mut Entry) -> Result<T, Refusal>) -> Result<T, Refusal> {
        self.on(gtid, f).await
    }

    pub fn count_decision(&self, o: Outcome) {
        match o {
            Outcome::Commit => self.metrics.committed.fetch_add(1, Relaxed),
            Outcome::Abort => self.metrics.aborted.fetch_add(1, Relaxed),
        };
    }

    fn refuse_new_work(&self) -> Result<(), Refusal> {
        if self.lease.expired() {
            return refuse(RefusalCode::LeaseUnconfirmed, format!("node {}'s lease could not be renewed in time: no new work until it is", self.cfg.node_id));
        }
        Ok(())
    }

    pub fn begin(&self, timeout_ms: Option<u64>) -> Res {
        self.refuse_new_work()?;
        let t = timeout_ms.unwrap_or(self.cfg.timeouts.transaction_ms);
        let max = self.cfg.limits.max_transaction_ms;
        if !(10..=max).contains(&t) {
            return refuse(RefusalCode::InvalidField, format!("timeout_ms must be between 10 and {max} (limits.max_transaction_ms)"));
        }
        let gtid = naming::new_gtid(&self.cfg.node_id, self.nonce, self.seq.fetch_add(1, Relaxed));
        let tx = Tx::new(gtid.clone(), Duration::from_millis(t));
        {
            let mut txs = self.txs.lock().unwrap();
            // Counted only when the map could hold that many (decided ones stay for retention).
            let active = if txs.len() < self.cfg.limits.max_active { 0 } else { txs.values().filter(|e| e.tx.is_undecided()).count() };
            if active >= self.cfg.limits.max_active {
                self.metrics.overloaded.fetch_add(1, Relaxed);
                return refuse(RefusalCode::TooManyTransactions,
                    format!("{active} transactions are undecided (limits.max_active = {}); retry later", self.cfg.limits.max_active));
            }
            let grant = self.generation_of(&self.cfg.node_id);
            txs.insert(gtid.clone(), Entry::new(tx, false, grant));
        }
        self.metrics.begun.fetch_add(1, Relaxed);
        Ok(json!({"gtid": gtid, "state": "active", "timeout_ms": t}))
    }

    /// Begin and register the first branch, all or nothing: a refused registration
    /// leaves no transaction behind.
    pub async fn begin_with_branch(&self, timeout_ms: Option<u64>, resource: &str, bid: &str) -> Res {
        let mut begun = self.begin(timeout_ms)?;
        let gtid = begun["gtid"].as_str().unwrap_or_default().to_string();
        match self.register(&gtid, resource, bid).await {
            Ok(reg) => {
                begun.as_object_mut().unwrap().insert("branch".into(), reg);
                Ok(begun)
            }
            Err(e) => {
                self.txs.lock().unwrap().remove(&gtid);
                self.metrics.begun.fetch_sub(1, Relaxed);
                Err(e)
            }
        }
    }

    pub async fn register(&self, gtid: &str, resource: &str, bid: &str) -> Res {
        if let Err(e) = naming::check_id("branch_id", bid) {
            return refuse(e.code, e.message);
        }
        let Some(kind) = self.kind_of(resource) else {
            return refuse(RefusalCode::UnknownResource, format!("no resource named {resource:?} in the coordinator's config"));
        };
        let ids = match kind {
            ResourceKind::Postgres => match naming::pg_gid(&self.cfg.gid_prefix, gtid, bid) {
                Ok(g) => json!({"gid": g}),
                Err(e) => return refuse(e.code, e.message),
            },
            ResourceKind::Mariadb => json!({"xid": {"format_id": naming::XA_FORMAT_ID, "gtrid": gtid, "bqual": bid}}),
        };
        // Would the registration be taken? (Checked before client mode prepares a helper.)
        self.on(gtid, |e| e.tx.check_register(bid)).await?;
        let rc = self.resources[resource].clone();
        let keep = |g: &str, b: &str, prepared: bool| self.keep_helper(g, b, prepared);
        let adm = self.enforcement.admit(&rc, gtid, bid, &keep).await?;
        if let Err(e) = self.on(gtid, |e| e.tx.register(bid, resource, kind)).await {
            self.release_hold(gtid, bid).await;
            return Err(e);
        }
        let mut v = json!({"gtid": gtid, "branch_id": bid, "resource": resource, "kind": kind.as_str(), "enforcement": adm.mode.as_str()});
        v.as_object_mut().unwrap().extend(ids.as_object().unwrap().clone());
        if let Some(k) = adm.key {
            v["shim"] = json!({"key": k});
        }
        Ok(v)
    }

    pub async fn prepared(&self, gtid: &str, bid: &str) -> Res {
        self.on(gtid, |e| e.tx.prepared(bid)).await?;
        Ok(json!({"gtid": gtid, "branch_id": bid, "state": "prepared"}))
    }

    pub async fn failed(self: &Arc<Self>, gtid: &str, bid: &str, reason: &str, retryable: bool) -> Res {
        let newly = self
            .on(gtid, |e| {
                let was = e.tx.state;
                e.tx.failed(bid, reason, retryable)?;
                if was != TxState::Aborted && e.tx.state == TxState::Aborted {
                    return Ok(true);
                }
                Ok(false)
            })
            .await?;
        if newly {
            self.metrics.aborted.fetch_add(1, Relaxed);
            self.spawn_completion(gtid);
        }
        Ok(json!({"gtid": gtid, "branch_id": bid, "state": "failed", "decision": "abort"}))
    }

    pub async fn commit(self: &Arc<Self>, gtid: &str, source: &str) -> Res {
        self.commit_with(gtid, source, &[]).await
    }

    /// Commit; `prepared` lists branches whose "prepared" report rides along with the
    /// commit request (saves the root one round trip per branch). All or nothing.
    pub async fn commit_with(self: &Arc<Self>, gtid: &str, source: &str, prepared: &[String]) -> Res {
        self.refuse_new_work()?;
        let t0 = Instant::now();
        let entered = self.with_tx(gtid, |e| {
            let mut next = e.tx.clone();
            for bid in prepared {
                next.prepared(bid)?;
            }
            next.check_commit()?;
            e.tx = next;
            e.tx.state = TxState::Committing;
            Ok((e.tx.branches.iter().map(|b| (b.resource.clone(), b.branch_id.clone())).collect::<Vec<_>>(), e.grant))
        });
        let (branches, grant) = match entered {
            Ok(x) => x,
            // A commit asked again after the daemon forgot the transaction from memory
            // (restart, retention, lost lease): the store's record answers it.
            Err(r) if r.code == RefusalCode::NotInMemory => {
                return match self.stored_decision(gtid).await? {
                    Some(rec) => Ok(json!({"gtid": gtid, "decision": rec.outcome.as_str(), "from_store": true})),
                    None => Err(self.elsewhere(gtid).await),
                };
            }
            Err(r) => return Err(r),
        };
        let fence = Some(Token { holder: self.holder.clone(), generation: grant });
        let rec = DecisionRecord {
            gtid: gtid.to_string(),
            outcome: Outcome::Commit,
            branches,
            decided_unix_ms: state::unix_ms(),
            node: self.cfg.node_id.clone(),
            source: source.to_string(),
        };
        match self.store.decide(rec.clone(), fence.clone()).await {
            Ok(d) => {
                self.metrics.observe_decision(t0.elapsed().as_secs_f64());
                self.apply_decided(gtid, d)?;
                let o = self.with_tx(gtid, |e| Ok(e.tx.decision())).ok().flatten().unwrap_or(Outcome::Abort);
                Ok(json!({"gtid": gtid, "decision": o.as_str()}))
            }
            Err(err) => {
                // Unknown whether it is durable (e.g. a lost answer from a PostgreSQL store):
                // keep the transaction Committing (never rolled back) and retry the
                // idempotent conditional insert until the store answers.
                log("error", "decision store write failed; retrying", json!({"gtid": gtid, "error": err}));
                let me = self.clone();
                let g = gtid.to_string();
                tokio::spawn(async move {
                    let mut delay = me.cfg.timeouts.retry_initial_ms;
                    loop {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        if let Ok(d) = me.store.decide(rec.clone(), fence.clone()).await {
                            let _ = me.apply_decided(&g, d);
                            return;
                        }
                        delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
                    }
                });
                refuse(RefusalCode::StoreUnavailable, format!("decision store failed ({err}); the decision is pending, poll /decision"))
            }
        }
    }

    /// Applies what the store answered to a decision write.
    fn apply_decided(self: &Arc<Self>, gtid: &str, d: Decided) -> Result<(), Refusal> {
        match d {
            Decided::Outcome(o) => {
                self.apply_decision(gtid, o);
                Ok(())
            }
            Decided::Corrupt(problem) => {
                // The transaction stays Committing (never rolled back) until an operator decides.
                self.quarantine(&CorruptRecord { gtid: gtid.to_string(), problem });
                refuse(RefusalCode::Quarantined, format!("{gtid}: an unreadable decision record exists; an operator must decide"))
            }
            // Written under a grant that is gone: nothing was written. Memory is not
            // touched: the daemon that lost its grant reconciles it with the store
            // (lease.rs), and the outcome is whatever the store then says.
            Decided::Forgotten => refuse(RefusalCode::OutcomeForgotten, format!("{gtid}: below its epoch's purge watermark, or of an epoch sealed by a store restore; no decision is written for it any more")),
            Decided::Fenced(why) => {
                log("warn", "decision not written: this daemon's lease grant for the transaction's node is gone", json!({"gtid": gtid, "why": why}));
                refuse(RefusalCode::LeaseLost, format!("{gtid}: this daemon lost its lease of the transaction's node before the decision was written; ask again for the outcome"))
            }
        }
    }

    fn apply_decision(self: &Arc<Self>, gtid: &str, o: Outcome) {
        {
            let mut txs = self.txs.lock().unwrap();
            if let Some(e) = txs.get_mut(gtid) {
                if e.tx.decision() == Some(o) {
                    return; // applied already (a retry and a recovery pass may both bring it)
                }
                match o {
                    Outcome::Commit => {
                        e.tx.state = TxState::Committed;
                        e.tx.decided = Some(Instant::now());
                        e.recorded = true;
                    }
                    Outcome::Abort => {
                        e.tx.abort("store holds an abort decision".into(), false);
                        e.recorded = true;
                    }
                }
                e.publish();
            }
        }
        match o {
            Outcome::Commit => self.metrics.committed.fetch_add(1, Relaxed),
            Outcome::Abort => self.metrics.aborted.fetch_add(1, Relaxed),
        };
        self.spawn_completion(gtid);
    }

    pub async fn one_phase(&self, gtid: &str, bid: &str) -> Res {
        if self.enforcement.holds(gtid, bid) {
            return refuse(RefusalCode::WrongState, format!("branch {bid:?} is in client mode: it must be prepared (its protection is the slot it writes before PREPARE), never committed in one phase"));
        }
        self.on(gtid, |e| {
            e.tx.check_one_phase(bid)?;
            e.tx.state = TxState::OnePhase;
            Ok(())
        })
        .await?;
        self.metrics.one_phase.fetch_add(1, Relaxed);
        Ok(json!({"gtid": gtid, "decision": "one_phase", "branch_id": bid}))
    }

    pub async fn abort(self: &Arc<Self>, gtid: &str, reason: &str) -> Res {
        let newly = self
            .on(gtid, |e| {
                e.tx.check_abort()?;
                if e.tx.state == TxState::Aborted {
                    return Ok(false);
                }
                e.tx.abort(reason.to_string(), false);
                Ok(true)
            })
            .await?;
        if newly {
            self.metrics.aborted.fetch_add(1, Relaxed);
            self.spawn_completion(gtid);
        }
        Ok(json!({"gtid": gtid, "decision": "abort"}))
    }

    pub async fn finished(self: &Arc<Self>, gtid: &str, bid: &str, outcome: Outcome) -> Res {
        self.finished_many(gtid, &[bid.to_string()], outcome).await?;
        Ok(json!({"gtid": gtid, "branch_id": bid, "state": "finished", "outcome": outcome.as_str()}))
    }

    /// Several branches finished by their owner(s) in one call. All or nothing.
    pub async fn finished_many(self: &Arc<Self>, gtid: &str, bids: &[String], outcome: Outcome) -> Res {
        if bids.is_empty() || bids.len() > 1000 {
            return refuse(RefusalCode::InvalidField, "branches must list 1..1000 branch ids");
        }
        let decided_here = self
            .on(gtid, |e| {
                let mut next = e.tx.clone();
                let was = next.state;
                for bid in bids {
                    next.finish(bid, outcome, FinishedBy::Owner)?;
                }
                e.tx = next;
                Ok(was == TxState::Deciding && e.tx.state != TxState::Deciding)
            })
            .await?;
        if decided_here {
            // The decision branch reported its commit (or rollback): the other branches
            // get that outcome, from their owners or after the grace period from us.
            let o = self.with_tx(gtid, |e| Ok(e.tx.decision())).ok().flatten().unwrap_or(Outcome::Abort);
            self.count_decision(o);
            self.spawn_completion(gtid);
        }
        self.maybe_forget(gtid);
        Ok(json!({"gtid": gtid, "branches": bids, "state": "finished", "outcome": outcome.as_str()}))
    }

    pub fn tx_json(e: &Entry) -> Value {
        let t = &e.tx;
        json!({
            "gtid": t.gtid,
            "state": t.state,
            "decision": t.decision().map(|o| o.as_str()),
            "in_doubt": t.in_doubt(),
            "age_ms": t.created.elapsed().as_millis() as u64,
            "created_unix_ms": t.created_unix_ms,
            // When the decision was taken (wall clock, derived from the monotonic one): the
            // console's timeline of the transaction.
            "decided_unix_ms": t.decided.map(|d| t.created_unix_ms + d.saturating_duration_since(t.created).as_millis() as u64),
            "abort_reason": t.abort_reason,
            "retryable": t.retryable,
            "recovered": t.recovered,
            "branches": t.branches,
        })
    }

    fn record_json(r: &DecisionRecord) -> Value {
        json!({
            "gtid": r.gtid,
            "state": if r.outcome == Outcome::Commit { "committed" } else { "aborted" },
            "decision": r.outcome.as_str(),
            "abort_reason": if r.outcome == Outcome::Abort { Some(format!("recorded abort ({})", r.source)) } else { None },
            "retryable": false,
            "from_store": true,
            "node": r.node,
            "branches": r.branches.iter().map(|(res, b)| json!({"resource": res, "branch_id": b})).collect::<Vec<_>>(),
        })
    }

    pub async fn get(&self, gtid: &str) -> Res {
        match self.with_tx(gtid, |e| Ok(Self::tx_json(e))) {
            Err(r) if r.code == RefusalCode::NotInMemory => match self.stored_decision(gtid).await? {
                Some(rec) => Ok(Self::record_json(&rec)),
                None => Err(self.elsewhere(gtid).await),
            },
            other => other,
        }
    }

    pub async fn wait_decision(&self, gtid: &str, wait_ms: u64) -> Res {
        let mut rx = match self.with_tx(gtid, |e| Ok(e.watch.subscribe())) {
            Ok(rx) => rx,
            Err(r) if r.code == RefusalCode::NotInMemory => {
                // Any daemon answers a decided gtid from the store; an undecided one of
                // another node is its owner's to answer.
                return match self.stored_decision(gtid).await? {
                    Some(rec) => Ok(json!({"gtid": gtid, "state": Self::record_json(&rec)["state"], "decision": rec.outcome.as_str(),
                        "abort_reason": Self::record_json(&rec)["abort_reason"], "retryable": false})),
                    None => {
                        let e = self.elsewhere(gtid).await;
                        // Presumed abort is not ours to answer for a transaction that may
                        // have decided in a participant: ask there (which fences it).
                        if e.code == RefusalCode::UnknownTransaction && !self.decision_resources().is_empty() {
                            match self.resolve_in_participants(&[gtid.to_string()]).await.get(gtid) {
                                Some(Outcome::Commit) => return Ok(json!({"gtid": gtid, "state": "committed", "decision": "commit",
                                    "abort_reason": null, "retryable": false, "from_participant": true})),
                                Some(Outcome::Abort) => {}
                                None => return refuse(RefusalCode::StoreUnavailable, format!("{gtid}: a decision resource did not answer; ask again")),
                            }
                        }
                        Err(e)
                    }
                };
            }
            Err(r) => return Err(r),
        };
        let wait = Duration::from_millis(wait_ms.min(self.cfg.timeouts.long_poll_max_ms));
        let _ = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await;
        // Still committing: the write's answer may be lost while the record is in the
        // store; answer from it rather than "no decision" for a committed transaction
        // (the next recovery pass applies it to memory: adopt_records).
        if self.with_tx(gtid, |e| Ok(e.tx.state == TxState::Committing)).unwrap_or(false) {
            if let Ok(Stored::Record(r)) = self.store.get(gtid).await {
                return Ok(json!({"gtid": gtid, "state": Self::record_json(&r)["state"], "decision": r.outcome.as_str(),
                    "abort_reason": Self::record_json(&r)["abort_reason"], "retryable": false}));
            }
        }
        self.with_tx(gtid, |e| {
            Ok(json!({
                "gtid": gtid,
                "state": e.tx.state,
                "decision": e.tx.decision().map(|o| o.as_str()),
                "abort_reason": e.tx.abort_reason,
                "retryable": e.tx.retryable,
            }))
        })
    }

    pub fn list(&self, filter: Option<&str>) -> Res {
        let filter = filter.map(StateFilter::parse).transpose()?;
        let txs = self.txs.lock().unwrap();
        let mut out: Vec<(u128, Value)> = txs
            .values()
            .filter(|e| filter.map_or(true, |f| f.matches(&e.tx)))
            .map(|e| (e.tx.created.elapsed().as_millis(), Self::tx_json(e)))
            .collect();
        out.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(json!({"transactions": out.into_iter().map(|x| x.1).collect::<Vec<_>>()}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteLog;

    /// A coordinator that owns its node (claimed, epoch registered), as at start.
    /// Its resource's database is never reached: `enforcement = "none"` (plain 2PC) unless
    /// `enforcement` says otherwise.
    async fn coord(name: &str) -> Arc<Coordinator> {
        coord_with(name, "none").await
    }

    async fn coord_with(name: &str, enforcement: &str) -> Arc<Coordinator> {
        let d = std::env::temp_dir().join(format!("cotx-coord-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let src = format!(
            "allow_no_auth = true\nnode_id = \"u1\"\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n[[resources]]\nname = \"pg\"\nkind = \"postgres\"\ndsn = \"host=127.0.0.1 port=1 user=x connect_timeout=1\"\nenforcement = \"{enforcement}\"\n",
            d.join("s.db").display()
        );
        let cfg = crate::config::parse(&src, None).unwrap();
        let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 64);
        let c = Coordinator::new(cfg, store, None).unwrap();
        crate::ha::lease::claim_at_start(&c).await.unwrap();
        c
    }

    /// The console's reports: the node lease this daemon holds, and prepared branches
    /// counted on their resource (nothing contacted yet: health unknown, not "down").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_for_the_console() {
        let c = coord("reports").await;
        let n = c.nodes_report().await.unwrap();
        assert_eq!(n["node_id"], "u1");
        assert_eq!(n["lease_valid"], true);
        let own: Vec<_> = n["nodes"].as_array().unwrap().iter().filter(|l| l["node"] == "u1").collect();
        assert_eq!(own.len(), 1, "{n}");
        assert_eq!(own[0]["mine"], true);
        assert_eq!(own[0]["holder"], c.holder.as_str());
        assert!(own[0]["expires_in_ms"].as_i64().unwrap() > 0, "{n}");
        let g = c.begin(None).unwrap()["gtid"].as_str().unwrap().to_string();
        c.register(&g, "pg", "b1").await.unwrap();
        c.register(&g, "pg", "b2").await.unwrap();
        c.prepared(&g, "b1").await.unwrap();
        let r = c.resources_report();
        assert_eq!(r["resources"], json!([{"name": "pg", "kind": "postgres", "up": null, "decisions": false, "prepared_branches": 1,
            "enforcement": {"configured": "none", "mode": "none", "reason": null}}]));
        let t = c.get(&g).await.unwrap();
        assert!(t["created_unix_ms"].as_u64().unwrap() > 0 && t["decided_unix_ms"].is_null(), "{t}");
    }

    /// A resource whose enforcement cannot be told (here: unreachable) gets no branch: it is
    /// never plain 2PC by default. Nothing is left registered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resource_of_unknown_enforcement_gets_no_branch() {
        for mode in ["auto", "engine", "client"] {
            let c = coord_with(&format!("unknown-{mode}"), mode).await;
            let g = c.begin(None).unwrap()["gtid"].as_str().unwrap().to_string();
            let e = c.register(&g, "pg", "b1").await.unwrap_err();
            assert_eq!(e.code, RefusalCode::ResourceUnavailable, "{mode}: {e:?}");
            assert!(e.message.contains("resource pg") && e.message.contains("cannot tell how commitment ordering is enforced"), "{}", e.message);
            assert_eq!(c.get(&g).await.unwrap()["branches"], json!([]));
            let e = c.begin_with_branch(None, "pg", "b1").await.unwrap_err();
            assert_eq!(e.code, RefusalCode::ResourceUnavailable);
            assert_eq!(c.resources_report()["resources"][0]["enforcement"]["mode"], "unknown");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_is_all_or_nothing_and_durable_first() {
        let c = coord("commit").await;
        let g = c.begin(None).unwrap()["gtid"].as_str().unwrap().to_string();
        c.register(&g, "pg", "b1").await.unwrap();
        c.register(&g, "pg", "b2").await.unwrap();
        let before = c.get(&g).await.unwrap()["branches"].clone();
        let e = c.commit_with(&g, "coordinator", &["b1".into(), "zz".into()]).await.unwrap_err();
        assert_eq!(e.code, RefusalCode::UnknownBranch);
        assert_eq!(c.get(&g).await.unwrap()["branches"], before, "a refused commit must not mark b1 prepared");
        let e = c.commit_with(&g, "coordinator", &["b1".into()]).await.unwrap_err();
        assert_eq!(e.code, RefusalCode::BranchNotPrepared);
        assert_eq!(c.get(&g).await.unwrap()["branches"], before);
        let r = c.commit_with(&g, "coordinator", &["b1".into(), "b2".into()]).await.unwrap();
        assert_eq!(r["decision"], "commit");
        // Durable before the answer.
        let recs = c.store.load().await.unwrap().records;
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].branches, vec![("pg".to_string(), "b1".to_string()), ("pg".to_string(), "b2".to_string())]);
        // Finished by owners → the record is deleted.
        c.finished_many(&g, &["b1".into(), "b2".into()], Outcome::Commit).await.unwrap();
        for _ in 0..100 {
            if c.store.load().await.unwrap().records.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("record not deleted after all branches finished");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_filters_by_state_and_names_the_accepted_values() {
        let c = coord("list").await;
        let g = c.begin(None).unwrap()["gtid"].as_str().unwrap().to_string();
        let gtids = |f: &str| -> Vec<String> {
            c.list(Some(f)).unwrap()["transactions"].as_array().unwrap().iter().map(|t| t["gtid"].as_str().unwrap().to_string()).collect()
        };
        assert_eq!(gtids("active"), vec![g.clone()]);
        assert!(gtids("committed").is_empty() && gtids("in_doubt").is_empty());
        let e = c.list(Some("prepared")).unwrap_err();
        assert_eq!(e.code, RefusalCode::InvalidField);
        for v in ["active", "one_phase", "deciding", "in_doubt"] {
            assert!(e.message.contains(v), "{}", e.message);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeout_aborts_and_presumed_abort_leaves_no_record() {
        let c = coord("timeout").await;
        let g = c.begin(Some(10)).unwrap()["gtid"].as_str().unwrap().to_string();
        c.register(&g, "pg", "b1").await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        c.tick();
        assert_eq!(c.get(&g).await.unwrap()["state"], "aborted");
        assert_eq!(c.prepared(&g, "b1").await.unwrap_err().code, RefusalCode::TransactionAborted);
        assert!(c.store.load().await.unwrap().records.is_empty());
        // Begin with a refused first branch leaves nothing behind.
        let n = c.list(None).unwrap()["transactions"].as_array().unwrap().len();
        assert_eq!(c.begin_with_branch(None, "nope", "b1").await.unwrap_err().code, RefusalCode::UnknownResource);
        assert_eq!(c.list(None).unwrap()["transactions"].as_array().unwrap().len(), n);
    }

    /// Presumed abort only for our own nodes: another node's unknown gtid is never "abort".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unknown_gtid_of_another_node_is_not_presumed_abort() {
        let c = coord("other").await;
        let own = naming::new_gtid("u1", 1, 1);
        assert_eq!(c.wait_decision(&own, 0).await.unwrap_err().code, RefusalCode::UnknownTransaction);
        let other = naming::new_gtid("u2", 1, 1);
        // No lease row of u2 in this store: still not ours to presume (only its owner may).
        assert_eq!(c.wait_decision(&other, 0).await.unwrap_err().code, RefusalCode::OwnerUnavailable);
        // u2 holds (held) a lease in this store: its transactions are its own to answer.
        c.store.claim_node("u2", "someone", "http://127.0.0.1:1", 60_000, false).await.unwrap();
        let e = c.wait_decision(&other, 0).await.unwrap_err();
        assert_eq!((e.code, e.owner_url.as_deref()), (RefusalCode::WrongNode, Some("http://127.0.0.1:1")), "{e:?}");
        assert_eq!(c.abort(&other, "x").await.unwrap_err().code, RefusalCode::WrongNode);
    }

    /// Caps: undecided transactions beyond limits.max_active are refused with 429.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn active_transactions_are_capped() {
        let d = std::env::temp_dir().join(format!("cotx-coord-cap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let src = format!(
            "allow_no_auth = true\nnode_id = \"u1\"\n[limits]\nmax_active = 2\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n",
            d.join("s.db").display()
        );
        let cfg = crate::config::parse(&src, None).unwrap();
        let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 64);
        let c = Coordinator::new(cfg, store, None).unwrap();
        c.begin(None).unwrap();
        c.begin(None).unwrap();
        let e = c.begin(None).unwrap_err();
        assert_eq!(e.code, RefusalCode::TooManyTransactions);
        assert_eq!(c.begin(Some(86_400_000)).unwrap_err().code, RefusalCode::InvalidField);
    }
}

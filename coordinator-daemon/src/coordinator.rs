//! The coordinator proper: live transactions in memory, the decision store, the resource
//! clients. Every operation validates against the state machine first (a refusal changes
//! nothing), then applies; a commit answers only once its decision is durable.

use crate::config::{Config, ResourceKind};
use crate::metrics::Metrics;
use crate::naming;
use crate::resources::{Completion, ResourceClient};
use crate::state::{self, refuse, BranchState, FinishedBy, Outcome, Refusal, Tx, TxState};
use crate::store::{AuditEntry, DecisionRecord, Op, Store};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

struct Entry {
    tx: Tx,
    watch: watch::Sender<Option<Outcome>>,
    /// A durable record exists (two-phase commit or recovered): delete it when done.
    recorded: bool,
    forgotten: bool,
    completing: bool,
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
    txs: Mutex<HashMap<String, Entry>>,
    nonce: u64,
    seq: AtomicU64,
    pub resource_up: Mutex<HashMap<String, bool>>,
    pub incidents: Mutex<Vec<Incident>>,
}

pub type Res = Result<Value, Refusal>;

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

pub fn log(level: &str, msg: &str, fields: Value) {
    // Structured logs: one JSON object per line on stderr.
    let mut o = json!({"ts_ms": state::unix_ms(), "level": level, "msg": msg});
    if let (Some(m), Value::Object(f)) = (o.as_object_mut(), fields) {
        m.extend(f);
    }
    eprintln!("{o}");
}

impl Coordinator {
    pub fn new(cfg: Config, store: Store) -> Result<Arc<Coordinator>, String> {
        let mut resources = HashMap::new();
        for r in &cfg.resources {
            resources.insert(r.name.clone(), Arc::new(ResourceClient::new(r, &cfg.gid_prefix)?));
        }
        Ok(Arc::new(Coordinator {
            cfg,
            store,
            metrics: Metrics::default(),
            resources,
            txs: Mutex::new(HashMap::new()),
            nonce: nonce(),
            seq: AtomicU64::new(1),
            resource_up: Mutex::new(HashMap::new()),
            incidents: Mutex::new(Vec::new()),
        }))
    }

    fn kind_of(&self, resource: &str) -> Option<ResourceKind> {
        self.cfg.resources.iter().find(|r| r.name == resource).map(|r| r.kind)
    }

    /// Loads durable decisions at start: their branches are unknown until recovery looks.
    pub async fn load_records(&self) -> Result<usize, String> {
        let recs = self.store.load().await?;
        let mut txs = self.txs.lock().unwrap();
        let mut n = 0;
        for r in recs {
            if naming::gtid_node(&r.gtid) != Some(self.cfg.node_id.as_str()) || txs.contains_key(&r.gtid) {
                continue;
            }
            let mut tx = Tx::new(r.gtid.clone(), Duration::from_millis(self.cfg.timeouts.transaction_ms));
            tx.recovered = true;
            tx.created_unix_ms = r.decided_unix_ms;
            for (res, bid) in &r.branches {
                let kind = self.kind_of(res).unwrap_or(ResourceKind::Postgres);
                let _ = tx.register(bid, res, kind);
                let _ = tx.prepared(bid);
            }
            match r.outcome {
                Outcome::Commit => tx.state = TxState::Committed,
                Outcome::Abort => tx.abort(format!("recorded abort ({})", r.source), false),
            }
            // Recovered decisions are old: recovery may act on them at once.
            tx.decided = Instant::now().checked_sub(Duration::from_millis(self.cfg.timeouts.owner_grace_ms)).or(Some(Instant::now()));
            let (w, _) = watch::channel(tx.decision());
            txs.insert(r.gtid.clone(), Entry { tx, watch: w, recorded: true, forgotten: false, completing: false });
            n += 1;
        }
        Ok(n)
    }

    fn with_tx<T>(&self, gtid: &str, f: impl FnOnce(&mut Entry) -> Result<T, Refusal>) -> Result<T, Refusal> {
        if let Err(e) = naming::check_id("gtid", gtid) {
            return refuse(400, e.code, e.message);
        }
        let mut txs = self.txs.lock().unwrap();
        match txs.get_mut(gtid) {
            Some(e) => f(e),
            None => refuse(404, "unknown_transaction", format!("no transaction {gtid:?} (never begun, or finished and forgotten: presumed abort)")),
        }
    }

    pub fn begin(&self, timeout_ms: Option<u64>) -> Res {
        let t = timeout_ms.unwrap_or(self.cfg.timeouts.transaction_ms);
        if !(10..=86_400_000).contains(&t) {
            return refuse(400, "invalid_field", "timeout_ms must be between 10 and 86400000");
        }
        let gtid = naming::new_gtid(&self.cfg.node_id, self.nonce, self.seq.fetch_add(1, Relaxed));
        let tx = Tx::new(gtid.clone(), Duration::from_millis(t));
        let (w, _) = watch::channel(None);
        self.txs.lock().unwrap().insert(gtid.clone(), Entry { tx, watch: w, recorded: false, forgotten: false, completing: false });
        self.metrics.begun.fetch_add(1, Relaxed);
        Ok(json!({"gtid": gtid, "state": "active", "timeout_ms": t}))
    }

    /// Begin and register the first branch, all or nothing: a refused registration
    /// leaves no transaction behind.
    pub fn begin_with_branch(&self, timeout_ms: Option<u64>, resource: &str, bid: &str) -> Res {
        let mut begun = self.begin(timeout_ms)?;
        let gtid = begun["gtid"].as_str().unwrap_or_default().to_string();
        match self.register(&gtid, resource, bid) {
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

    pub fn register(&self, gtid: &str, resource: &str, bid: &str) -> Res {
        if let Err(e) = naming::check_id("branch_id", bid) {
            return refuse(400, e.code, e.message);
        }
        let Some(kind) = self.kind_of(resource) else {
            return refuse(404, "unknown_resource", format!("no resource named {resource:?} in the coordinator's config"));
        };
        let ids = match kind {
            ResourceKind::Postgres => match naming::pg_gid(&self.cfg.gid_prefix, gtid, bid) {
                Ok(g) => json!({"gid": g}),
                Err(e) => return refuse(400, e.code, e.message),
            },
            ResourceKind::Mariadb => json!({"xid": {"format_id": naming::XA_FORMAT_ID, "gtrid": gtid, "bqual": bid}}),
        };
        self.with_tx(gtid, |e| e.tx.register(bid, resource, kind))?;
        let mut v = json!({"gtid": gtid, "branch_id": bid, "resource": resource, "kind": kind.as_str()});
        v.as_object_mut().unwrap().extend(ids.as_object().unwrap().clone());
        Ok(v)
    }

    pub fn prepared(&self, gtid: &str, bid: &str) -> Res {
        self.with_tx(gtid, |e| e.tx.prepared(bid))?;
        Ok(json!({"gtid": gtid, "branch_id": bid, "state": "prepared"}))
    }

    pub fn failed(self: &Arc<Self>, gtid: &str, bid: &str, reason: &str, retryable: bool) -> Res {
        let newly = self.with_tx(gtid, |e| {
            let was = e.tx.state;
            e.tx.failed(bid, reason, retryable)?;
            if was != TxState::Aborted {
                let _ = e.watch.send(Some(Outcome::Abort));
                return Ok(true);
            }
            Ok(false)
        })?;
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
        let t0 = Instant::now();
        let branches = self.with_tx(gtid, |e| {
            let mut next = e.tx.clone();
            for bid in prepared {
                next.prepared(bid)?;
            }
            next.check_commit()?;
            e.tx = next;
            e.tx.state = TxState::Committing;
            Ok(e.tx.branches.iter().map(|b| (b.resource.clone(), b.branch_id.clone())).collect::<Vec<_>>())
        })?;
        let rec = DecisionRecord {
            gtid: gtid.to_string(),
            outcome: Outcome::Commit,
            branches,
            decided_unix_ms: state::unix_ms(),
            node: self.cfg.node_id.clone(),
            source: source.to_string(),
        };
        match self.store.decide(rec.clone()).await {
            Ok(o) => {
                self.metrics.observe_decision(t0.elapsed().as_secs_f64());
                self.apply_decision(gtid, o);
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
                        if let Ok(o) = me.store.decide(rec.clone()).await {
                            me.apply_decision(&g, o);
                            return;
                        }
                        delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
                    }
                });
                refuse(503, "store_unavailable", format!("decision store failed ({err}); the decision is pending, poll /decision"))
            }
        }
    }

    fn apply_decision(self: &Arc<Self>, gtid: &str, o: Outcome) {
        {
            let mut txs = self.txs.lock().unwrap();
            if let Some(e) = txs.get_mut(gtid) {
                match o {
                    Outcome::Commit => {
                        e.tx.state = TxState::Committed;
                        e.tx.decided = Some(Instant::now());
                        e.recorded = true;
                    }
                    Outcome::Abort => e.tx.abort("store holds an abort decision".into(), false),
                }
                let _ = e.watch.send(Some(o));
            }
        }
        match o {
            Outcome::Commit => self.metrics.committed.fetch_add(1, Relaxed),
            Outcome::Abort => self.metrics.aborted.fetch_add(1, Relaxed),
        };
        self.spawn_completion(gtid);
    }

    pub fn one_phase(&self, gtid: &str, bid: &str) -> Res {
        self.with_tx(gtid, |e| {
            e.tx.check_one_phase(bid)?;
            e.tx.state = TxState::OnePhase;
            Ok(())
        })?;
        self.metrics.one_phase.fetch_add(1, Relaxed);
        Ok(json!({"gtid": gtid, "decision": "one_phase", "branch_id": bid}))
    }

    pub fn abort(self: &Arc<Self>, gtid: &str, reason: &str) -> Res {
        let newly = self.with_tx(gtid, |e| {
            e.tx.check_abort()?;
            if e.tx.state == TxState::Aborted {
                return Ok(false);
            }
            e.tx.abort(reason.to_string(), false);
            let _ = e.watch.send(Some(Outcome::Abort));
            Ok(true)
        })?;
        if newly {
            self.metrics.aborted.fetch_add(1, Relaxed);
            self.spawn_completion(gtid);
        }
        Ok(json!({"gtid": gtid, "decision": "abort"}))
    }

    pub fn finished(&self, gtid: &str, bid: &str, outcome: Outcome) -> Res {
        self.with_tx(gtid, |e| {
            e.tx.finish(bid, outcome, FinishedBy::Owner)?;
            if e.tx.state == TxState::Committed && e.tx.branches.len() == 1 && !e.recorded {
                // One-phase commit reported by its owner; nothing durable to clean.
            }
            Ok(())
        })?;
        self.maybe_forget(gtid);
        Ok(json!({"gtid": gtid, "branch_id": bid, "state": "finished", "outcome": outcome.as_str()}))
    }

    /// Several branches finished by their owner(s) in one call. All or nothing.
    pub fn finished_many(&self, gtid: &str, bids: &[String], outcome: Outcome) -> Res {
        if bids.is_empty() || bids.len() > 1000 {
            return refuse(400, "invalid_field", "branches must list 1..1000 branch ids");
        }
        self.with_tx(gtid, |e| {
            let mut next = e.tx.clone();
            for bid in bids {
                next.finish(bid, outcome, FinishedBy::Owner)?;
            }
            e.tx = next;
            Ok(())
        })?;
        self.maybe_forget(gtid);
        Ok(json!({"gtid": gtid, "branches": bids, "state": "finished", "outcome": outcome.as_str()}))
    }

    /// Deletes the durable record once every branch is confirmed finished.
    fn maybe_forget(&self, gtid: &str) {
        let mut txs = self.txs.lock().unwrap();
        if let Some(e) = txs.get_mut(gtid) {
            if e.recorded && !e.forgotten && e.tx.decision().is_some() && e.tx.all_finished() {
                e.forgotten = true;
                self.store.write_later(Op::Forget(gtid.to_string()));
            }
        }
    }

    fn tx_json(e: &Entry) -> Value {
        let t = &e.tx;
        json!({
            "gtid": t.gtid,
            "state": t.state,
            "decision": t.decision().map(|o| o.as_str()),
            "in_doubt": t.in_doubt(),
            "age_ms": t.created.elapsed().as_millis() as u64,
            "created_unix_ms": t.created_unix_ms,
            "abort_reason": t.abort_reason,
            "retryable": t.retryable,
            "recovered": t.recovered,
            "branches": t.branches,
        })
    }

    pub fn get(&self, gtid: &str) -> Res {
        self.with_tx(gtid, |e| Ok(Self::tx_json(e)))
    }

    pub async fn wait_decision(&self, gtid: &str, wait_ms: u64) -> Res {
        let mut rx = self.with_tx(gtid, |e| Ok(e.watch.subscribe()))?;
        let wait = Duration::from_millis(wait_ms.min(self.cfg.timeouts.long_poll_max_ms));
        let _ = tokio::time::timeout(wait, rx.wait_for(|v| v.is_some())).await;
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
        let ok = ["active", "committing", "committed", "aborted", "one_phase", "in_doubt"];
        if let Some(f) = filter {
            if !ok.contains(&f) {
                return refuse(400, "invalid_field", format!("state must be one of {ok:?}"));
            }
        }
        let txs = self.txs.lock().unwrap();
        let mut out: Vec<(u128, Value)> = txs
            .values()
            .filter(|e| match filter {
                None => true,
                Some("in_doubt") => e.tx.in_doubt(),
                Some(f) => serde_json::to_value(e.tx.state).ok().and_then(|v| v.as_str().map(|s| s == f)).unwrap_or(false),
            })
            .map(|e| (e.tx.created.elapsed().as_millis(), Self::tx_json(e)))
            .collect();
        out.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(json!({"transactions": out.into_iter().map(|x| x.1).collect::<Vec<_>>()}))
    }

    /// In-doubt transactions, oldest first, each prepared branch with what it blocks.
    pub async fn in_doubt_report(&self) -> Res {
        let mut v = self.list(Some("in_doubt"))?;
        for t in v["transactions"].as_array_mut().into_iter().flatten() {
            let gtid = t["gtid"].as_str().unwrap_or_default().to_string();
            for b in t["branches"].as_array_mut().into_iter().flatten() {
                if b["state"] != "prepared" {
                    continue;
                }
                let res = b["resource"].as_str().unwrap_or_default().to_string();
                let bid = b["branch_id"].as_str().unwrap_or_default().to_string();
                if let Some(rc) = self.resources.get(&res) {
                    b["blocking"] = rc.blocking_info(&gtid, &bid).await;
                }
            }
        }
        Ok(v)
    }

    pub fn gauges(&self) -> (usize, usize) {
        let txs = self.txs.lock().unwrap();
        (txs.values().filter(|e| e.tx.in_doubt()).count(), txs.values().filter(|e| e.tx.is_undecided()).count())
    }

    /// Operator: force an outcome. Refuses to contradict a recorded decision; every call
    /// (refused or not) leaves an audit record.
    pub async fn force(self: &Arc<Self>, gtid: &str, outcome: Outcome, operator: &str, reason: &str) -> Res {
        if let Err(e) = naming::check_id("gtid", gtid) {
            return refuse(400, e.code, e.message);
        }
        let current = {
            let txs = self.txs.lock().unwrap();
            txs.get(gtid).map(|e| (e.tx.state, e.tx.check_commit().err()))
        };
        let result: Result<Value, Refusal> = match (current, outcome) {
            (None, Outcome::Abort) => Ok(json!({"gtid": gtid, "decision": "abort", "note": "no live transaction and no record: presumed abort; recovery rolls back any prepared branch"})),
            (None, Outcome::Commit) => refuse(409, "contradicts_decision", format!("{gtid} has no commit record: its outcome is abort (presumed abort)")),
            (Some((TxState::Committed | TxState::Committing, _)), Outcome::Abort) => {
                refuse(409, "contradicts_decision", format!("{gtid} is decided commit"))
            }
            (Some((TxState::Aborted, _)), Outcome::Commit) => refuse(409, "contradicts_decision", format!("{gtid} is decided abort")),
            (Some((TxState::Committed, _)), Outcome::Commit) | (Some((TxState::Aborted, _)), Outcome::Abort) => {
                // The operator wants it finished now: one attempt per branch without
                // waiting for the owners' grace period; what fails stays for the retries.
                let left = self.complete_now(gtid).await;
                Ok(json!({"gtid": gtid, "decision": outcome.as_str(), "note": "already decided; completion attempted", "unfinished_branches": left}))
            }
            (Some((TxState::Committing, _)), Outcome::Commit) => Ok(json!({"gtid": gtid, "decision": "commit", "note": "decision being written"})),
            (Some((TxState::OnePhase, _)), _) => refuse(409, "transaction_one_phase", format!("{gtid} commits in one phase on its owner's session")),
            (Some((TxState::Active, _)), Outcome::Abort) => self.abort(gtid, &format!("forced by {operator}: {reason}")),
            (Some((TxState::Active, Some(why))), Outcome::Commit) => Err(why),
            (Some((TxState::Active, None)), Outcome::Commit) => self.commit(gtid, "operator").await,
        };
        let entry = AuditEntry {
            at_unix_ms: state::unix_ms(),
            gtid: gtid.to_string(),
            outcome: outcome.as_str().to_string(),
            operator: operator.to_string(),
            reason: reason.to_string(),
            result: match &result {
                Ok(v) => format!("ok: {v}"),
                Err(r) => format!("refused: {} {}", r.code, r.message),
            },
        };
        if let Err(e) = self.store.write(Op::Audit(entry)).await {
            return refuse(503, "store_unavailable", format!("could not write the audit record: {e}"));
        }
        if result.is_ok() {
            self.metrics.forced.fetch_add(1, Relaxed);
        }
        log("warn", "operator forced an outcome", json!({"gtid": gtid, "outcome": outcome.as_str(), "operator": operator, "ok": result.is_ok()}));
        result
    }

    /// One completion attempt for every prepared branch of a decided transaction, now.
    /// Returns how many branches are still unfinished.
    pub async fn complete_now(self: &Arc<Self>, gtid: &str) -> usize {
        let todo: Vec<(String, String, Outcome)> = {
            let txs = self.txs.lock().unwrap();
            let Some(e) = txs.get(gtid) else { return 0 };
            let Some(o) = e.tx.decision() else { return 0 };
            e.tx.branches.iter().filter(|b| b.state == BranchState::Prepared).map(|b| (b.resource.clone(), b.branch_id.clone(), o)).collect()
        };
        let mut left = 0;
        for (res, bid, o) in todo {
            let c = match self.resources.get(&res) {
                Some(rc) => rc.complete(gtid, &bid, o).await,
                None => Completion::Retry(format!("resource {res} is not configured")),
            };
            if !self.note_completion(gtid, &res, &bid, o, c, FinishedBy::Daemon) {
                left += 1;
            }
        }
        self.maybe_forget(gtid);
        left
    }

    /// Finishes the prepared branches of a decided transaction whose owners did not, after
    /// a grace period for the owners; retries with exponential backoff.
    pub fn spawn_completion(self: &Arc<Self>, gtid: &str) {
        {
            let mut txs = self.txs.lock().unwrap();
            match txs.get_mut(gtid) {
                Some(e) if !e.completing => e.completing = true,
                _ => return,
            }
        }
        let me = self.clone();
        let gtid = gtid.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(me.cfg.timeouts.owner_grace_ms)).await;
            let mut delay = me.cfg.timeouts.retry_initial_ms;
            loop {
                let todo: Vec<(String, String, Outcome)> = {
                    let txs = me.txs.lock().unwrap();
                    let Some(e) = txs.get(&gtid) else { return };
                    let Some(o) = e.tx.decision() else { return };
                    e.tx.branches
                        .iter()
                        .filter(|b| b.state == BranchState::Prepared)
                        .map(|b| (b.resource.clone(), b.branch_id.clone(), o))
                        .collect()
                };
                if todo.is_empty() {
                    break;
                }
                let mut again = false;
                for (res, bid, o) in todo {
                    let c = match me.resources.get(&res) {
                        Some(rc) => rc.complete(&gtid, &bid, o).await,
                        None => Completion::Retry(format!("resource {res} is not configured")),
                    };
                    if !me.note_completion(&gtid, &res, &bid, o, c, FinishedBy::Daemon) {
                        again = true;
                    }
                }
                if !again {
                    break;
                }
                me.metrics.completion_retries.fetch_add(1, Relaxed);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                delay = (delay * 2).min(me.cfg.timeouts.retry_max_ms);
            }
            if let Some(e) = me.txs.lock().unwrap().get_mut(&gtid) {
                e.completing = false;
            }
            me.maybe_forget(&gtid);
        });
    }

    /// Applies the result of one completion attempt; true when the branch is settled.
    pub fn note_completion(&self, gtid: &str, res: &str, bid: &str, o: Outcome, c: Completion, by: FinishedBy) -> bool {
        self.resource_up.lock().unwrap().insert(res.to_string(), !matches!(c, Completion::Retry(_)));
        let settle = |note: Option<String>| {
            let mut txs = self.txs.lock().unwrap();
            if let Some(e) = txs.get_mut(gtid) {
                if let Some(b) = e.tx.branches.iter_mut().find(|b| b.branch_id == bid) {
                    if b.state == BranchState::Prepared || b.state == BranchState::Registered {
                        b.state = BranchState::Finished;
                        b.outcome = Some(o);
                        b.finished_by = Some(by);
                        b.note = note;
                    }
                }
            }
        };
        match c {
            Completion::Done => {
                let m = match (by, o) {
                    (FinishedBy::Recovery, Outcome::Commit) => &self.metrics.recovery_commit,
                    (FinishedBy::Recovery, Outcome::Abort) => &self.metrics.recovery_rollback,
                    (_, Outcome::Commit) => &self.metrics.completion_commit,
                    (_, Outcome::Abort) => &self.metrics.completion_rollback,
                };
                m.fetch_add(1, Relaxed);
                log("info", "branch completed", json!({"gtid": gtid, "branch_id": bid, "resource": res, "outcome": o.as_str(), "by": by}));
                settle(None);
                true
            }
            Completion::Gone => {
                settle(Some("not prepared any more (finished by its owner)".into()));
                true
            }
            Completion::Incident(msg) => {
                self.metrics.incidents.fetch_add(1, Relaxed);
                log("error", "incident: branch did not reach the decided outcome", json!({"gtid": gtid, "branch_id": bid, "resource": res, "error": msg}));
                self.incidents.lock().unwrap().push(Incident {
                    at_unix_ms: state::unix_ms(),
                    gtid: gtid.into(),
                    branch_id: bid.into(),
                    resource: res.into(),
                    message: msg.clone(),
                });
                settle(Some(format!("incident: {msg}")));
                true
            }
            Completion::OwnerAttached => false,
            Completion::Retry(err) => {
                log("warn", "branch completion failed; will retry", json!({"gtid": gtid, "branch_id": bid, "resource": res, "error": err}));
                false
            }
        }
    }

    /// Periodic housekeeping: abort what timed out, drop what is finished and old.
    pub fn tick(self: &Arc<Self>) {
        let now = Instant::now();
        let retention = Duration::from_millis(self.cfg.timeouts.retention_ms);
        let mut timed_out = vec![];
        {
            let mut txs = self.txs.lock().unwrap();
            for e in txs.values_mut() {
                if e.tx.state == TxState::Active && now >= e.tx.deadline {
                    e.tx.abort("timeout: not decided in time".into(), true);
                    let _ = e.watch.send(Some(Outcome::Abort));
                    timed_out.push(e.tx.gtid.clone());
                }
            }
            txs.retain(|_, e| {
                let old = e.tx.decided.map(|d| now.duration_since(d) >= retention).unwrap_or(false);
                match e.tx.state {
                    TxState::Committed => !(old && e.tx.all_finished() && !e.completing),
                    TxState::Aborted => !(old && !e.tx.in_doubt() && !e.completing),
                    TxState::OnePhase => now < e.tx.deadline + retention,
                    _ => true,
                }
            });
        }
        for g in timed_out {
            self.metrics.timeouts.fetch_add(1, Relaxed);
            self.metrics.aborted.fetch_add(1, Relaxed);
            log("info", "transaction timed out; aborted", json!({"gtid": g}));
            self.spawn_completion(&g);
        }
    }

    // ---- used by recovery ----

    /// Undecided transactions (the "active set"): their prepared branches are left alone.
    pub fn active_set(&self) -> HashSet<String> {
        self.txs.lock().unwrap().values().filter(|e| e.tx.is_undecided()).map(|e| e.tx.gtid.clone()).collect()
    }

    /// Decision known in memory, and whether its owners' grace period is still running.
    pub fn decision_of(&self, gtid: &str) -> Option<(Outcome, bool)> {
        let grace = Duration::from_millis(self.cfg.timeouts.owner_grace_ms);
        let txs = self.txs.lock().unwrap();
        let e = txs.get(gtid)?;
        let o = e.tx.decision()?;
        Some((o, e.tx.decided.map(|d| d.elapsed() < grace).unwrap_or(false)))
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

    pub fn forget_finished(&self) {
        let gtids: Vec<String> = self.txs.lock().unwrap().keys().cloned().collect();
        for g in gtids {
            self.maybe_forget(&g);
        }
    }

    /// A decision record from the store that is not in memory (another process wrote it,
    /// or a shared store): adopt it so recovery and clients see it.
    pub fn adopt_record(&self, r: &DecisionRecord) {
        let mut txs = self.txs.lock().unwrap();
        if txs.contains_key(&r.gtid) {
            return;
        }
        let mut tx = Tx::new(r.gtid.clone(), Duration::from_millis(self.cfg.timeouts.transaction_ms));
        tx.recovered = true;
        for (res, bid) in &r.branches {
            let _ = tx.register(bid, res, self.kind_of(res).unwrap_or(ResourceKind::Postgres));
            let _ = tx.prepared(bid);
        }
        match r.outcome {
            Outcome::Commit => tx.state = TxState::Committed,
            Outcome::Abort => tx.abort("recorded abort".into(), false),
        }
        tx.decided = Instant::now().checked_sub(Duration::from_millis(self.cfg.timeouts.owner_grace_ms)).or(Some(Instant::now()));
        let (w, _) = watch::channel(tx.decision());
        txs.insert(r.gtid.clone(), Entry { tx, watch: w, recorded: true, forgotten: false, completing: false });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteLog;

    fn coord(name: &str) -> Arc<Coordinator> {
        let d = std::env::temp_dir().join(format!("cotx-coord-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let src = format!(
            "allow_no_auth = true\nnode_id = \"u1\"\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n[[resources]]\nname = \"pg\"\nkind = \"postgres\"\ndsn = \"host=127.0.0.1 port=1 user=x\"\n",
            d.join("s.db").display()
        );
        let cfg = crate::config::parse(&src, None).unwrap();
        let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 64);
        Coordinator::new(cfg, store).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_is_all_or_nothing_and_durable_first() {
        let c = coord("commit");
        let g = c.begin(None).unwrap()["gtid"].as_str().unwrap().to_string();
        c.register(&g, "pg", "b1").unwrap();
        c.register(&g, "pg", "b2").unwrap();
        let before = c.get(&g).unwrap()["branches"].clone();
        let e = c.commit_with(&g, "coordinator", &["b1".into(), "zz".into()]).await.unwrap_err();
        assert_eq!(e.code, "unknown_branch");
        assert_eq!(c.get(&g).unwrap()["branches"], before, "a refused commit must not mark b1 prepared");
        let e = c.commit_with(&g, "coordinator", &["b1".into()]).await.unwrap_err();
        assert_eq!(e.code, "branch_not_prepared");
        assert_eq!(c.get(&g).unwrap()["branches"], before);
        let r = c.commit_with(&g, "coordinator", &["b1".into(), "b2".into()]).await.unwrap();
        assert_eq!(r["decision"], "commit");
        // Durable before the answer.
        let recs = c.store.load().await.unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].branches, vec![("pg".to_string(), "b1".to_string()), ("pg".to_string(), "b2".to_string())]);
        // Finished by owners → the record is deleted.
        c.finished_many(&g, &["b1".into(), "b2".into()], Outcome::Commit).unwrap();
        for _ in 0..100 {
            if c.store.load().await.unwrap().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("record not deleted after all branches finished");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeout_aborts_and_presumed_abort_leaves_no_record() {
        let c = coord("timeout");
        let g = c.begin(Some(10)).unwrap()["gtid"].as_str().unwrap().to_string();
        c.register(&g, "pg", "b1").unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        c.tick();
        assert_eq!(c.get(&g).unwrap()["state"], "aborted");
        assert_eq!(c.prepared(&g, "b1").unwrap_err().code, "transaction_aborted");
        assert!(c.store.load().await.unwrap().is_empty());
        // Begin with a refused first branch leaves nothing behind.
        let n = c.list(None).unwrap()["transactions"].as_array().unwrap().len();
        assert_eq!(c.begin_with_branch(None, "nope", "b1").unwrap_err().code, "unknown_resource");
        assert_eq!(c.list(None).unwrap()["transactions"].as_array().unwrap().len(), n);
    }
}

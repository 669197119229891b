//! The coordinator: the parts it is made of, composed, and the API's operations on them.
//! Every operation validates against the state machine first (a refusal changes nothing),
//! then applies; a commit answers only once its decision is durable. This file is the only
//! one that knows every part; each operation lives in the module that does it.
//!
//! What sits on what (an arrow: "imports"; nothing imports a module above it, and no
//! file below this one imports it):
//!
//! ```text
//!   mod.rs   Coordinator: the API's operations (delegating), each on `Operating`, the
//!            parts it borrows, then `completion::start` of the effects it left (tasks
//!            that outlive the call); serve.rs starts the loops
//!     ├─► operator ─► commit ─► begin ─► operating ─► holds   (commit ─► read_only ─► answers)
//!     │      │          │         │
//!     │      │          │         └─► answers ─► decisions ─► completion ─► holds
//!     │      └──────────┴─────────────────────────────────────────┘
//!     ├─► recovery ─► ha::takeover, decisions, holds, completion
//!     ├─► housekeeping ─► holds, decisions, completion, deadlocks ─► wait_graph
//!     ▼
//!   effects  what an operation leaves to follow it (data only, imported by all above)
//!   parts    Parts: cfg, store, metrics, resources, incidents, and:
//!     ├─► registry       live transactions, quarantine, Lookup (memory only)
//!     ├─► ha::ownership  node and holder ids, lease clock, grants, nodes taken over
//!     └─► participants   resources' connections, enforcement runtime
//!   (ha/ sits below all of this: its operations take `Parts::holding()`, the parts they
//!   use, and reach memory through `ha::holding::Memory`, which the registry implements.)
//! ```

pub mod answers;
pub mod begin;
pub mod commit;
pub mod completion;
pub mod deadlocks;
pub mod decisions;
pub mod effects;
pub mod expiry;
pub mod health;
pub mod holds;
pub mod housekeeping;
pub mod leases;
pub mod one_request;
pub mod operating;
pub mod operator;
pub mod parts;
pub mod read_only;
pub mod recovery;
pub mod registry;
pub mod wait_graph;

use crate::config::Config;
use crate::ha::lease;
use crate::ha::ownership;
use crate::naming;
use crate::state::Outcome;
use crate::store::{CorruptRecord, DecisionRecord, Store};
use crate::telemetry::gauges::Gauges;
use crate::wire;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use self::effects::Effects;
use self::operating::Operating;

pub use self::answers::Res;
pub use self::parts::Parts;
pub use self::registry::{Entry, Incident};

pub struct Coordinator {
    parts: Arc<Parts>,
    /// The sequence of this start's gtids (their epoch is `owner.nonce`).
    seq: AtomicU64,
}

/// The API's handlers read the parts directly (config, store, metrics, resources'
/// health, incidents, enforcement): a coordinator is its parts plus the operations.
impl std::ops::Deref for Coordinator {
    type Target = Parts;
    fn deref(&self) -> &Parts {
        &self.parts
    }
}

// The API's connection tasks and the background loops hold an Arc<Coordinator> (and
// Arc<Parts>) across awaits on tokio's multi-thread runtime: they must be Send and Sync
// (a compile error here, not a puzzling one at a `tokio::spawn` far away).
const _: () = {
    const fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Coordinator>()
};

impl Coordinator {
    pub fn new(cfg: Config, store: Store, nonce_value: Option<u64>) -> Result<Arc<Coordinator>, String> {
        let n = nonce_value.unwrap_or_else(ownership::nonce);
        Ok(Arc::new(Coordinator { parts: Arc::new(Parts::new(cfg, store, n)?), seq: AtomicU64::new(1) }))
    }

    pub fn new_nonce() -> u64 {
        ownership::nonce()
    }

    /// The parts, for the background loops (renewal, recovery) that outlive a request.
    pub fn parts(&self) -> &Arc<Parts> {
        &self.parts
    }

    pub fn holder(&self) -> &str {
        &self.parts.owner.holder
    }

    pub fn nonce(&self) -> u64 {
        self.parts.owner.nonce
    }

    pub fn quarantine(&self, q: &CorruptRecord) {
        self.parts.registry.quarantine(q);
    }

    /// What an operation on a transaction borrows of the parts (operating.rs).
    fn ops(&self) -> Operating<'_> {
        (&self.parts).into()
    }

    /// Starts what an operation left to follow it (effects.rs): the tasks outlive the
    /// call, so they take the parts shared; the operations themselves only borrow.
    fn start(&self, fx: Effects) {
        completion::start(&self.parts, fx)
    }

    pub fn adopt_records(&self, recs: &[DecisionRecord]) -> usize {
        let mut fx = Effects::default();
        let n = completion::adopt_records(&self.parts, &mut fx, recs);
        self.start(fx);
        n
    }

    pub fn begin(&self, timeout_ms: Option<u64>) -> Res<wire::Begun> {
        let gtid = naming::new_gtid(&self.parts.cfg.node_id, self.parts.owner.nonce, self.seq.fetch_add(1, Relaxed));
        begin::begin(self.ops(), gtid, timeout_ms)
    }

    /// A range of gtids for the one-request commit (one_request.rs).
    pub fn lease_gtids(&self, count: Option<u64>, ttl_ms: Option<u64>) -> Res<wire::GtidLease> {
        let p = &self.parts;
        one_request::lease(&p.cfg, &p.owner, &p.leases, &p.metrics, &self.seq, count, ttl_ms)
    }

    /// The one-request commit of a leased gtid with all its branches (one_request.rs).
    pub async fn commit_leased(
        &self,
        gtid: &str,
        branches: &[one_request::Branch],
        by: one_request::DecideBy<'_>,
    ) -> Res<wire::Decision> {
        let mut fx = Effects::default();
        let r = one_request::commit(self.ops(), &mut fx, gtid, branches, by).await;
        self.start(fx);
        r
    }

    /// Begin and register the first branch, all or nothing: a refused registration
    /// leaves no transaction behind.
    pub async fn begin_with_branch(
        &self,
        timeout_ms: Option<u64>,
        resource: &str,
        bid: &str,
        server_started: Option<i64>,
    ) -> Res<wire::Begun> {
        let begun = self.begin(timeout_ms)?;
        let mut fx = Effects::default();
        let r = begin::register(self.ops(), &mut fx, &begun.gtid, resource, bid, server_started).await;
        self.start(fx);
        match r {
            Ok(reg) => Ok(wire::Begun { branch: Some(reg), ..begun }),
            Err(e) => {
                begin::unbegin(&self.parts.registry, &self.parts.metrics, &begun.gtid);
                Err(e)
            }
        }
    }

    /// Begin and register every branch, in order: a refused first registration leaves no
    /// transaction behind; a later one aborts the transaction (its earlier branches may
    /// already hold client mode's helpers, which the abort lets go of) and is answered.
    pub async fn begin_with_branches(
        &self,
        timeout_ms: Option<u64>,
        branches: &[(String, String, Option<i64>)],
    ) -> Res<wire::Begun> {
        let mut fx = Effects::default();
        let r = self.begin_branches(&mut fx, timeout_ms, branches).await;
        self.start(fx);
        r
    }

    async fn begin_branches(
        &self,
        fx: &mut Effects,
        timeout_ms: Option<u64>,
        branches: &[(String, String, Option<i64>)],
    ) -> Res<wire::Begun> {
        let begun = self.begin(timeout_ms)?;
        let mut regs = Vec::with_capacity(branches.len());
        for (i, (resource, bid, started)) in branches.iter().enumerate() {
            match begin::register(self.ops(), fx, &begun.gtid, resource, bid, *started).await {
                Ok(reg) => regs.push(reg),
                Err(e) if i == 0 => {
                    begin::unbegin(&self.parts.registry, &self.parts.metrics, &begun.gtid);
                    return Err(e);
                }
                Err(e) => {
                    let _ = commit::abort(
                        self.ops(),
                        fx,
                        &begun.gtid,
                        &format!("registration of branch {bid:?} refused: {}", e.message),
                    )
                    .await;
                    return Err(e);
                }
            }
        }
        Ok(wire::Begun { branches: Some(regs), ..begun })
    }

    pub async fn register(&self, gtid: &str, resource: &str, bid: &str) -> Res<wire::Registered> {
        self.register_seen(gtid, resource, bid, None).await
    }

    /// register, with a MariaDB client's reading of the server's start (begin::register).
    pub async fn register_seen(
        &self,
        gtid: &str,
        resource: &str,
        bid: &str,
        server_started: Option<i64>,
    ) -> Res<wire::Registered> {
        let mut fx = Effects::default();
        let r = begin::register(self.ops(), &mut fx, gtid, resource, bid, server_started).await;
        self.start(fx);
        r
    }

    /// A branch's database session, as its client reported it at registration (the
    /// deadlock detector's map from lock waits to transactions; deadlocks.rs).
    pub fn note_session(&self, gtid: &str, bid: &str, session: Option<i64>) {
        if let Some(s) = session {
            let after = std::time::Duration::from_millis(self.parts.cfg.timeouts.deadlock_check_ms);
            let _ = self.parts.registry.note_session(gtid, bid, s, after);
        }
    }

    pub async fn prepared(&self, gtid: &str, bid: &str) -> Res<wire::Ack> {
        begin::prepared(self.ops(), gtid, bid).await
    }

    pub async fn failed(&self, gtid: &str, bid: &str, reason: &str, retryable: bool) -> Res<wire::Ack> {
        let mut fx = Effects::default();
        let r = commit::failed(self.ops(), &mut fx, gtid, bid, reason, retryable).await;
        fx.release_of(gtid);
        self.start(fx);
        r
    }

    pub async fn commit(&self, gtid: &str, source: &str) -> Res<wire::Decision> {
        self.commit_with(gtid, source, &[]).await
    }

    pub async fn commit_with(&self, gtid: &str, source: &str, prepared: &[String]) -> Res<wire::Decision> {
        let mut fx = Effects::default();
        let r = commit::commit_with(self.ops(), &mut fx, gtid, source, prepared).await;
        self.start(fx);
        r
    }

    /// A client's two-phase commit: `read_only` lists the branches that wrote nothing
    /// (every branch listed: decided in memory, read_only.rs).
    pub async fn commit_read_only(&self, gtid: &str, prepared: &[String], read_only: &[String]) -> Res<wire::Decision> {
        let mut fx = Effects::default();
        let r = commit::commit_listing(self.ops(), &mut fx, gtid, "coordinator", prepared, read_only).await;
        self.start(fx);
        r
    }

    pub async fn commit_decide_in(&self, gtid: &str, prepared: &[String], bid: &str) -> Res<wire::Decision> {
        commit::commit_decide_in(self.ops(), gtid, prepared, bid).await
    }

    pub async fn one_phase(&self, gtid: &str, bid: &str) -> Res<wire::Decision> {
        commit::one_phase(self.ops(), gtid, bid).await
    }

    pub async fn abort(&self, gtid: &str, reason: &str) -> Res<wire::Decision> {
        let mut fx = Effects::default();
        let r = commit::abort(self.ops(), &mut fx, gtid, reason).await;
        fx.release_of(gtid);
        self.start(fx);
        r
    }

    pub async fn finished(&self, gtid: &str, bid: &str, outcome: Outcome) -> Res<wire::Ack> {
        self.finished_many(gtid, &[bid.to_string()], outcome).await?;
        Ok(wire::Ack { outcome: Some(outcome.into()), ..wire::Ack::branch(gtid, bid, wire::BranchState::Finished) })
    }

    pub async fn finished_many(&self, gtid: &str, bids: &[String], outcome: Outcome) -> Res<wire::Ack> {
        let mut fx = Effects::default();
        let r = commit::finished_many(self.ops(), &mut fx, gtid, bids, outcome).await;
        fx.release_of(gtid);
        self.start(fx);
        r
    }

    pub async fn get(&self, gtid: &str) -> Res<wire::Transaction> {
        answers::get((&self.parts).into(), gtid).await
    }

    pub async fn wait_decision(&self, gtid: &str, wait_ms: u64) -> Res<wire::DecisionState> {
        answers::wait_decision((&self.parts).into(), gtid, wait_ms).await
    }

    pub fn list(&self, filter: Option<&str>) -> Res<wire::TransactionList> {
        answers::list((&self.parts).into(), filter)
    }

    pub async fn force(&self, gtid: &str, outcome: Outcome, operator: &str, reason: &str) -> Res<wire::Decision> {
        let mut fx = Effects::default();
        let r = operator::force(self.ops(), (&self.parts).into(), &mut fx, gtid, outcome, operator, reason).await;
        self.start(fx);
        r
    }

    pub async fn in_doubt_report(&self) -> Res<wire::TransactionList> {
        operator::in_doubt_report((&self.parts).into()).await
    }

    pub fn resources_report(&self) -> wire::Resources {
        let p = &self.parts;
        operator::resources_report(&p.cfg, &p.registry, &p.health, &p.enforcement)
    }

    pub async fn nodes_report(&self) -> Res<wire::Nodes> {
        lease::nodes_report(&self.parts.holding()).await
    }

    pub fn gauges(&self) -> Gauges {
        housekeeping::gauges(&self.parts.registry, &self.parts.owner, &self.parts.cfg)
    }

    /// Abort what timed out, drop what is finished and old (every 50 ms: serve.rs).
    pub fn tick(&self) {
        housekeeping::tick(&self.parts)
    }

    /// At the daemon's stop: the branches of what it decided finished where they can be.
    pub async fn finish_decided_at_stop(&self) {
        completion::finish_decided_at_stop((&self.parts).into()).await
    }

    /// At the daemon's stop: client mode's holds and unused helpers let go of.
    pub async fn release_at_stop(&self) {
        holds::release_at_stop((&self.parts).into()).await
    }
}

#[cfg(test)]
pub(crate) mod tests;

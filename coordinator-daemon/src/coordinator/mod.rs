//! The coordinator: the parts it is made of, composed, and the API's operations on them.
//! Every operation validates against the state machine first (a refusal changes nothing),
//! then applies; a commit answers only once its decision is durable. This file is the only
//! one that knows every part; each operation lives in the module that does it.
//!
//! What sits on what (an arrow: "imports"; nothing imports a module above it, and no
//! file below this one imports it):
//!
//! ```text
//!   mod.rs   Coordinator: the API's operations (delegating); serve.rs starts the loops
//!     ├─► operator ─► commit ─► begin ─► holds   (commit ─► read_only ─► answers)
//!     │      │          │         │
//!     │      │          │         └─► answers ─► decisions ─► completion
//!     │      └──────────┴─────────────────────────────────────────┘
//!     ├─► recovery ─► ha::takeover, decisions, holds, completion
//!     ├─► housekeeping ─► holds, decisions, completion, deadlocks ─► wait_graph
//!     ▼
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
pub mod expiry;
pub mod holds;
pub mod housekeeping;
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

    pub fn adopt_records(&self, recs: &[DecisionRecord]) -> usize {
        completion::adopt_records(&self.parts, recs)
    }

    pub fn begin(&self, timeout_ms: Option<u64>) -> Res<wire::Begun> {
        let gtid = naming::new_gtid(&self.parts.cfg.node_id, self.parts.owner.nonce, self.seq.fetch_add(1, Relaxed));
        begin::begin(&self.parts, gtid, timeout_ms)
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
        match begin::register(&self.parts, &begun.gtid, resource, bid, server_started).await {
            Ok(reg) => Ok(wire::Begun { branch: Some(reg), ..begun }),
            Err(e) => {
                begin::unbegin(&self.parts, &begun.gtid);
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
        let begun = self.begin(timeout_ms)?;
        let mut regs = Vec::with_capacity(branches.len());
        for (i, (resource, bid, started)) in branches.iter().enumerate() {
            match begin::register(&self.parts, &begun.gtid, resource, bid, *started).await {
                Ok(reg) => regs.push(reg),
                Err(e) if i == 0 => {
                    begin::unbegin(&self.parts, &begun.gtid);
                    return Err(e);
                }
                Err(e) => {
                    let _ = commit::abort(
                        &self.parts,
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
        begin::register(&self.parts, gtid, resource, bid, None).await
    }

    /// register, with a MariaDB client's reading of the server's start (begin::register).
    pub async fn register_seen(
        &self,
        gtid: &str,
        resource: &str,
        bid: &str,
        server_started: Option<i64>,
    ) -> Res<wire::Registered> {
        begin::register(&self.parts, gtid, resource, bid, server_started).await
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
        begin::prepared(&self.parts, gtid, bid).await
    }

    pub async fn failed(&self, gtid: &str, bid: &str, reason: &str, retryable: bool) -> Res<wire::Ack> {
        let r = commit::failed(&self.parts, gtid, bid, reason, retryable).await;
        holds::spawn_release_of(&self.parts, gtid);
        r
    }

    pub async fn commit(&self, gtid: &str, source: &str) -> Res<wire::Decision> {
        commit::commit_with(&self.parts, gtid, source, &[]).await
    }

    pub async fn commit_with(&self, gtid: &str, source: &str, prepared: &[String]) -> Res<wire::Decision> {
        commit::commit_with(&self.parts, gtid, source, prepared).await
    }

    /// A client's two-phase commit: `read_only` lists the branches that wrote nothing
    /// (every branch listed: decided in memory, read_only.rs).
    pub async fn commit_read_only(&self, gtid: &str, prepared: &[String], read_only: &[String]) -> Res<wire::Decision> {
        commit::commit_listing(&self.parts, gtid, "coordinator", prepared, read_only).await
    }

    pub async fn commit_decide_in(&self, gtid: &str, prepared: &[String], bid: &str) -> Res<wire::Decision> {
        commit::commit_decide_in(&self.parts, gtid, prepared, bid).await
    }

    pub async fn one_phase(&self, gtid: &str, bid: &str) -> Res<wire::Decision> {
        commit::one_phase(&self.parts, gtid, bid).await
    }

    pub async fn abort(&self, gtid: &str, reason: &str) -> Res<wire::Decision> {
        let r = commit::abort(&self.parts, gtid, reason).await;
        holds::spawn_release_of(&self.parts, gtid);
        r
    }

    pub async fn finished(&self, gtid: &str, bid: &str, outcome: Outcome) -> Res<wire::Ack> {
        commit::finished_many(&self.parts, gtid, &[bid.to_string()], outcome).await?;
        holds::spawn_release_of(&self.parts, gtid);
        Ok(wire::Ack { outcome: Some(outcome.into()), ..wire::Ack::branch(gtid, bid, wire::BranchState::Finished) })
    }

    pub async fn finished_many(&self, gtid: &str, bids: &[String], outcome: Outcome) -> Res<wire::Ack> {
        let r = commit::finished_many(&self.parts, gtid, bids, outcome).await;
        holds::spawn_release_of(&self.parts, gtid);
        r
    }

    pub async fn get(&self, gtid: &str) -> Res<wire::Transaction> {
        answers::get(&self.parts, gtid).await
    }

    pub async fn wait_decision(&self, gtid: &str, wait_ms: u64) -> Res<wire::DecisionState> {
        answers::wait_decision(&self.parts, gtid, wait_ms).await
    }

    pub fn list(&self, filter: Option<&str>) -> Res<wire::TransactionList> {
        answers::list(&self.parts, filter)
    }

    pub async fn force(&self, gtid: &str, outcome: Outcome, operator: &str, reason: &str) -> Res<wire::Decision> {
        operator::force(&self.parts, gtid, outcome, operator, reason).await
    }

    pub async fn in_doubt_report(&self) -> Res<wire::TransactionList> {
        operator::in_doubt_report(&self.parts).await
    }

    pub fn resources_report(&self) -> wire::Resources {
        operator::resources_report(&self.parts)
    }

    pub async fn nodes_report(&self) -> Res<wire::Nodes> {
        lease::nodes_report(&self.parts.holding()).await
    }

    pub fn gauges(&self) -> Gauges {
        housekeeping::gauges(&self.parts)
    }

    /// Abort what timed out, drop what is finished and old (every 50 ms: serve.rs).
    pub fn tick(&self) {
        housekeeping::tick(&self.parts)
    }

    pub async fn release_settled_holds(&self) {
        holds::release_settled_holds(&self.parts).await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::refusal::RefusalCode;
    use crate::store::sqlite::SqliteLog;
    use serde_json::json;
    use std::time::Duration;

    /// A coordinator that owns its node (claimed, epoch registered), as at start.
    /// Its resource's database is never reached: `enforcement = "none"` (plain 2PC) unless
    /// `enforcement` says otherwise.
    pub(crate) async fn coord(name: &str) -> Arc<Coordinator> {
        coord_with(name, "none").await
    }

    pub(crate) async fn coord_with(name: &str, enforcement: &str) -> Arc<Coordinator> {
        coord_src(name, enforcement, "").await
    }

    /// `resource_extra`: more lines of the resource's table (e.g. `decisions = true`).
    pub(crate) async fn coord_src(name: &str, enforcement: &str, resource_extra: &str) -> Arc<Coordinator> {
        let d = std::env::temp_dir().join(format!("cotx-coord-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let src = format!(
            "allow_no_auth = true\nnode_id = \"u1\"\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n[[resources]]\nname = \"pg\"\nkind = \"postgres\"\ndsn = \"host=127.0.0.1 port=1 user=x connect_timeout=1\"\nenforcement = \"{enforcement}\"\n{resource_extra}",
            d.join("s.db").display()
        );
        let cfg = crate::config::parse(&src, None).unwrap();
        let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 64);
        let c = Coordinator::new(cfg, store, None).unwrap();
        crate::ha::lease::claim_at_start(&c.parts().holding()).await.unwrap();
        c
    }

    /// The console's reports: the node lease this daemon holds, and prepared branches
    /// counted on their resource (nothing contacted yet: health unknown, not "down").
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_for_the_console() {
        let c = coord("reports").await;
        let n = wire::to_json(&c.nodes_report().await.unwrap());
        assert_eq!(n["node_id"], "u1");
        assert_eq!(n["lease_valid"], true);
        let own: Vec<_> = n["nodes"].as_array().unwrap().iter().filter(|l| l["node"] == "u1").collect();
        assert_eq!(own.len(), 1, "{n}");
        assert_eq!(own[0]["mine"], true);
        assert_eq!(own[0]["holder"], c.holder());
        assert!(own[0]["expires_in_ms"].as_i64().unwrap() > 0, "{n}");
        let g = c.begin(None).unwrap().gtid;
        c.register(&g, "pg", "b1").await.unwrap();
        c.register(&g, "pg", "b2").await.unwrap();
        c.prepared(&g, "b1").await.unwrap();
        let r = wire::to_json(&c.resources_report());
        assert_eq!(
            r["resources"],
            json!([{"name": "pg", "kind": "postgres", "up": null, "decisions": false, "prepared_branches": 1,
            "enforcement": {"configured": "none", "mode": "none", "reason": null}}])
        );
        let t = wire::to_json(&c.get(&g).await.unwrap());
        assert!(t["created_unix_ms"].as_u64().unwrap() > 0 && t["decided_unix_ms"].is_null(), "{t}");
    }

    /// A resource whose enforcement cannot be told (here: unreachable) gets no branch: it is
    /// never plain 2PC by default. Nothing is left registered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resource_of_unknown_enforcement_gets_no_branch() {
        for mode in ["auto", "engine", "client"] {
            let c = coord_with(&format!("unknown-{mode}"), mode).await;
            let g = c.begin(None).unwrap().gtid;
            let e = c.register(&g, "pg", "b1").await.unwrap_err();
            assert_eq!(e.code, RefusalCode::ResourceUnavailable, "{mode}: {e:?}");
            assert!(
                e.message.contains("resource pg")
                    && e.message.contains("cannot tell how commitment ordering is enforced"),
                "{}",
                e.message
            );
            assert!(c.get(&g).await.unwrap().branches.is_empty());
            let e = c.begin_with_branch(None, "pg", "b1", None).await.unwrap_err();
            assert_eq!(e.code, RefusalCode::ResourceUnavailable);
            assert_eq!(c.resources_report().resources[0].enforcement.mode, "unknown");
        }
    }

    /// Decision in a participant: one acknowledgement for every branch, the decision
    /// branch named anywhere in it (the others are checked against its outcome).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_acknowledgement_finishes_a_decision_in_a_participant_whatever_its_order() {
        let c = coord_src("dip-ack", "none", "decisions = true\n").await;
        let two = [("pg".to_string(), "b0".to_string(), None), ("pg".to_string(), "b1".to_string(), None)];
        let g = c.begin_with_branches(None, &two).await.unwrap().gtid;
        let d = c.commit_decide_in(&g, &["b0".to_string()], "b1").await.unwrap();
        assert_eq!(wire::to_json(&d)["decision"], "in_participant");
        c.finished_many(&g, &["b0".to_string(), "b1".to_string()], Outcome::Commit).await.unwrap();
        let t = wire::to_json(&c.get(&g).await.unwrap());
        assert_eq!(t["state"], "committed", "{t}");
        assert!(
            t["branches"].as_array().unwrap().iter().all(|b| b["state"] == "finished" && b["finished_by"] == "owner"),
            "{t}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_branch_at_begin_is_all_or_nothing() {
        let c = coord("branches").await;
        let two = [("pg".to_string(), "b1".to_string(), None), ("pg".to_string(), "b2".to_string(), None)];
        let b = c.begin_with_branches(None, &two).await.unwrap();
        let regs = b.branches.unwrap();
        assert_eq!(regs.iter().map(|r| r.branch_id.as_str()).collect::<Vec<_>>(), ["b1", "b2"]);
        assert!(regs.iter().all(|r| r.gid.is_some()));
        let n = c.list(None).unwrap().transactions.len();
        // A refused first branch leaves nothing; a refused later one aborts the transaction.
        let first_bad = [("nope".to_string(), "b1".to_string(), None)];
        assert_eq!(c.begin_with_branches(None, &first_bad).await.unwrap_err().code, RefusalCode::UnknownResource);
        assert_eq!(c.list(None).unwrap().transactions.len(), n);
        let later_bad = [("pg".to_string(), "b1".to_string(), None), ("nope".to_string(), "b2".to_string(), None)];
        assert_eq!(c.begin_with_branches(None, &later_bad).await.unwrap_err().code, RefusalCode::UnknownResource);
        let aborted = c.list(Some("aborted")).unwrap().transactions;
        assert_eq!(aborted.len(), 1);
        assert!(
            wire::to_json(&aborted[0])["abort_reason"].as_str().unwrap().contains("b2"),
            "{:?}",
            wire::to_json(&aborted[0])
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_is_all_or_nothing_and_durable_first() {
        let c = coord("commit").await;
        let g = c.begin(None).unwrap().gtid;
        c.register(&g, "pg", "b1").await.unwrap();
        c.register(&g, "pg", "b2").await.unwrap();
        let before = wire::to_json(&c.get(&g).await.unwrap())["branches"].clone();
        let e = c.commit_with(&g, "coordinator", &["b1".into(), "zz".into()]).await.unwrap_err();
        assert_eq!(e.code, RefusalCode::UnknownBranch);
        assert_eq!(
            wire::to_json(&c.get(&g).await.unwrap())["branches"],
            before,
            "a refused commit must not mark b1 prepared"
        );
        let e = c.commit_with(&g, "coordinator", &["b1".into()]).await.unwrap_err();
        assert_eq!(e.code, RefusalCode::BranchNotPrepared);
        assert_eq!(wire::to_json(&c.get(&g).await.unwrap())["branches"], before);
        let r = c.commit_with(&g, "coordinator", &["b1".into(), "b2".into()]).await.unwrap();
        assert_eq!(r.decision, wire::Decided::Commit);
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
        let g = c.begin(None).unwrap().gtid;
        let gtids =
            |f: &str| -> Vec<String> { c.list(Some(f)).unwrap().transactions.into_iter().map(|t| t.gtid).collect() };
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
        let g = c.begin(Some(10)).unwrap().gtid;
        c.register(&g, "pg", "b1").await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        c.tick();
        assert_eq!(c.get(&g).await.unwrap().state, crate::state::TxState::Aborted);
        assert_eq!(c.prepared(&g, "b1").await.unwrap_err().code, RefusalCode::TransactionAborted);
        assert!(c.store.load().await.unwrap().records.is_empty());
        // Begin with a refused first branch leaves nothing behind.
        let n = c.list(None).unwrap().transactions.len();
        assert_eq!(c.begin_with_branch(None, "nope", "b1", None).await.unwrap_err().code, RefusalCode::UnknownResource);
        assert_eq!(c.list(None).unwrap().transactions.len(), n);
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

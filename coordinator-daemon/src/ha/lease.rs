//! Owning a node id. A daemon acts for a node only under a grant of the node's lease in
//! the store (cotx_protocol::lease: holder + generation; renewed every `lease.renew_ms`,
//! valid for `lease.ttl_ms`) and with the node's lock at every resource it acts on
//! (resources.rs). At start it claims both or refuses to run; it registers its epoch
//! before issuing a gtid. When renewals fail (store unreachable) past the lease's
//! validity, it stops acting until one succeeds. When a renewal finds its grant gone —
//! taken over, or taken over, finished and handed back while it was paused — it has lost
//! the node even if it could claim it again at once: it stops acting, claims the node
//! under a new grant, and reconciles its memory with the store before acting again
//! (`regain`). With `lease.takeover`, it takes over nodes whose lease ran out, finishes
//! their branches (recording abort for undecided ones, so a paused owner that wakes up
//! loses), and releases them.

use crate::coordinator::Coordinator;
use crate::telemetry::log::log;
use crate::store::{Claim, Op, Renewal, Token};
use cotx_protocol::answer::{after_regrant, Reconcile};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use crate::refusal::RefusalCode;

fn mono_ms() -> u64 {
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Until when (monotonic ms) our lease is known valid, with a renewal period of margin.
pub struct LeaseClock(AtomicU64);

impl LeaseClock {
    pub fn new() -> LeaseClock {
        LeaseClock(AtomicU64::new(u64::MAX))
    }
    pub fn confirmed(&self, ttl_ms: u64, renew_ms: u64) {
        self.0.store(mono_ms() + ttl_ms.saturating_sub(renew_ms), Relaxed);
    }
    pub fn expired(&self) -> bool {
        mono_ms() > self.0.load(Relaxed)
    }
    /// Known invalid until confirmed again.
    pub fn revoke(&self) {
        self.0.store(0, Relaxed);
    }
}

/// Claims our node at start, waiting while a previous holder may still let go (its lease
/// runs out, or a daemon that took it over releases it). Err names the holder.
pub async fn claim_at_start(c: &Coordinator) -> Result<(), String> {
    let l = &c.cfg.lease;
    claim_own(c, Some(Instant::now() + Duration::from_millis(2 * l.ttl_ms + 2 * c.cfg.timeouts.recovery_interval_ms))).await?;
    c.lease.confirmed(l.ttl_ms, l.renew_ms);
    // The epoch is durable before any gtid of it exists: recovery acts only on known epochs.
    c.store.write(Op::RegisterEpoch { node: c.cfg.node_id.clone(), nonce: c.nonce }).await?;
    c.epochs.lock().unwrap().insert((c.cfg.node_id.clone(), c.nonce));
    Ok(())
}

/// Compares the store with this daemon's witness of it (crate::ha::witness) and, when it may
/// be acted on, writes down how far it has come. Err: the store went back to an older copy
/// (or cannot say what it is).
pub async fn check_witness(c: &Coordinator) -> Result<(), String> {
    let Some(path) = &c.cfg.witness_file else { return Ok(()) };
    let now = c.store.identity().await.map_err(|e| format!("cannot read the decision store's identity: {e}"))?;
    crate::ha::witness::check(crate::ha::witness::read(path)?.as_ref(), &now)?;
    if let Err(e) = crate::ha::witness::write(path, &now) {
        // Only the safety net is weaker: say so, keep running.
        c.warn_once(format!("witness:{e}"), "cannot write the witness file: a restored older store copy would not be noticed", json!({"error": e}));
    }
    Ok(())
}

/// Claims our own node under a new grant, asking a daemon that took it over to give it
/// back; waits until `deadline` (None: for as long as it takes).
async fn claim_own(c: &Coordinator, deadline: Option<Instant>) -> Result<(), String> {
    let l = &c.cfg.lease;
    let mut said = false;
    loop {
        match c.store.claim_node(&c.cfg.node_id, &c.holder, &c.cfg.advertise_url, l.ttl_ms, true).await {
            Ok(Claim::Granted(g)) => {
                c.grants.lock().unwrap().insert(c.cfg.node_id.clone(), Token { holder: c.holder.clone(), generation: g });
                break;
            }
            Err(e) if deadline.is_none() => {
                log("warn", "cannot claim our node yet; will retry", json!({"node_id": c.cfg.node_id, "error": e}));
                tokio::time::sleep(Duration::from_millis(l.renew_ms)).await;
            }
            Err(e) => return Err(e),
            Ok(Claim::HeldBy(h)) => {
                // A survivor that took our node over gives it back when asked (it releases
                // at its next renewal): the row is a request, never a lease.
                let _ = c.store.claim_node(&reclaim_key(&c.cfg.node_id), &c.holder, &c.cfg.advertise_url, l.ttl_ms, false).await;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(format!(
                        "node {} is held by {} ({}) whose lease runs {} ms more: another daemon runs as this node; give every daemon its own node_id",
                        c.cfg.node_id, h.holder, h.url, h.expires_in_ms
                    ));
                }
                if !said {
                    log("warn", "node lease held by another holder; waiting for it to run out or be released", json!({"node_id": c.cfg.node_id, "holder": h.holder, "url": h.url, "expires_in_ms": h.expires_in_ms}));
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let _ = c.store.release_node(&reclaim_key(&c.cfg.node_id), &c.holder, true).await;
    Ok(())
}

/// Our grant is gone (paused past the lease, taken over, finished
/// and handed back). Nothing from before may be acted on: stop, claim the node under a
/// new grant, and keep of memory only what the store confirms (cotx_protocol::answer::
/// after_regrant); nodes we had taken over are let go (their leases run out and a live
/// daemon takes them over).
async fn regain(c: &Arc<Coordinator>, why: String) {
    c.regaining.store(true, Relaxed);
    c.lease.revoke();
    c.metrics.lease_losses.fetch_add(1, Relaxed);
    log("error", "node lease lost: acting on nothing until the node is claimed again and memory is reconciled with the store",
        json!({"node_id": c.cfg.node_id, "holder": c.holder, "why": why}));
    let adopted: Vec<String> = c.adopted.lock().unwrap().drain().collect();
    for node in &adopted {
        forget_node(c, node);
    }
    let _ = claim_own(c, None).await;
    // Every entry of our node goes through the store's word.
    let own: Vec<String> = c.txs.lock().unwrap().keys().filter(|g| crate::naming::gtid_node(g) == Some(&c.cfg.node_id)).cloned().collect();
    let generation = c.grant(&c.cfg.node_id).map(|t| t.generation).unwrap_or(-1);
    let (mut kept, mut dropped) = (0, 0);
    for g in own {
        let verdict = match c.store.get(&g).await {
            Ok(s) => (after_regrant(s.view()), s),
            // Unreadable now: forget it; every answer about it then comes from the store.
            Err(_) => (Reconcile::Drop, crate::store::Stored::Absent { forgotten: false }),
        };
        let mut txs = c.txs.lock().unwrap();
        match verdict {
            (Reconcile::Keep(o), _) => {
                if let Some(e) = txs.get_mut(&g) {
                    e.grant = generation;
                    e.recorded = true;
                    e.tx.recovered = true;
                    match o {
                        crate::state::Outcome::Commit => e.tx.state = crate::state::TxState::Committed,
                        crate::state::Outcome::Abort => e.tx.abort("recorded abort (a daemon that took this node over)".into(), false),
                    }
                    e.tx.decided.get_or_insert_with(Instant::now);
                    e.publish();
                }
                kept += 1;
            }
            (Reconcile::Drop, _) => {
                txs.remove(&g);
                dropped += 1;
            }
            (Reconcile::Quarantine, crate::store::Stored::Corrupt(q)) => {
                txs.remove(&g);
                drop(txs);
                c.quarantine(&q);
            }
            (Reconcile::Quarantine, _) => {}
        }
    }
    let l = &c.cfg.lease;
    c.lease.confirmed(l.ttl_ms, l.renew_ms);
    c.regaining.store(false, Relaxed);
    log("warn", "node claimed again under a new grant: memory reconciled with the store", json!({"node_id": c.cfg.node_id, "generation": generation, "kept": kept, "dropped": dropped}));
}

/// Drops what we hold of a node we no longer act for.
fn forget_node(c: &Coordinator, node: &str) {
    c.grants.lock().unwrap().remove(node);
    c.txs.lock().unwrap().retain(|g, _| crate::naming::gtid_node(g) != Some(node));
}

/// Takes our node's lock at every reachable resource, refusing to run when another
/// session holds it; checks that no two MariaDB resources are one server.
pub async fn lock_resources_at_start(c: &Coordinator) -> Result<(), String> {
    // Same server twice first: its node lock (server-wide GET_LOCK) would look taken.
    let mut seen: Vec<(String, String)> = vec![];
    for (name, rc) in &c.resources {
        if rc.kind != crate::config::ResourceKind::Mariadb {
            continue;
        }
        if let Ok(id) = rc.server_identity().await {
            if let Some((other, _)) = seen.iter().find(|(_, i)| *i == id) {
                return Err(format!(
                    "resources {other:?} and {name:?} are the same MariaDB server ({id}): XA RECOVER is server-wide, so their branches cannot be told apart; configure one resource per MariaDB server (a branch may use any schema)"
                ));
            }
            seen.push((name.clone(), id));
        }
    }
    for (name, rc) in &c.resources {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match rc.hold_node_lock(&c.cfg.node_id, false).await {
                Ok(()) => break,
                Err(e) if e.contains("held by another session") => {
                    if Instant::now() >= deadline {
                        return Err(format!("{e}: another daemon acts as node {} on this database (a second deployment, or a copy with its own store?); give every daemon its own node_id", c.cfg.node_id));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    // Unreachable now: the lock is taken before recovery acts there.
                    log("warn", "resource unreachable at start; its node lock is taken before acting on it", json!({"resource": name, "error": e}));
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Renews our leases and, with takeover on, adopts nodes whose lease ran out.
pub fn spawn_renewal(c: Arc<Coordinator>) {
    tokio::spawn(async move {
        let l = c.cfg.lease.clone();
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(l.renew_ms)).await;
            let mut nodes = vec![c.cfg.node_id.clone()];
            nodes.extend(c.adopted.lock().unwrap().iter().cloned());
            let mut ok = true;
            let mut lost_own = None;
            for n in &nodes {
                let Some(tok) = c.grant(n) else { continue };
                match c.store.renew_node(n, &tok, l.ttl_ms).await {
                    Ok(Renewal::Renewed) => {}
                    Ok(Renewal::Lost(why)) if *n == c.cfg.node_id => lost_own = Some(format!("{why:?}")),
                    Ok(Renewal::Lost(why)) => {
                        log("warn", "a node we had taken over is no longer ours; leaving it", json!({"node": n, "why": format!("{why:?}")}));
                        c.adopted.lock().unwrap().remove(n);
                        forget_node(&c, n);
                    }
                    Err(e) => {
                        ok = false;
                        log("warn", "lease renewal failed; will retry", json!({"node": n, "error": e}));
                    }
                }
            }
            // A renewal long overdue: this process was paused or cut off (say so: it
            // explains what follows, a lost grant or a takeover elsewhere).
            let gap = last_renewed.elapsed().as_millis() as u64;
            if ok && gap > l.ttl_ms {
                log("warn", "lease renewed late: this daemon was paused or cut off from the store past its lease", json!({"node_id": c.cfg.node_id, "since_last_renewal_ms": gap, "ttl_ms": l.ttl_ms}));
            }
            if let Some(why) = lost_own {
                regain(&c, why).await;
                last_renewed = Instant::now();
                continue;
            }
            // The store is the one we saw, not an older copy put in its place.
            if ok {
                if let Err(why) = check_witness(&c).await {
                    ok = false;
                    c.lease.revoke();
                    c.warn_once(format!("witness:{why}"), "acting on nothing: the decision store is not the one this daemon saw", json!({"error": why}));
                }
            }
            if ok {
                last_renewed = Instant::now();
                if c.lease.expired() {
                    log("info", "lease confirmed again: acting again", json!({"node_id": c.cfg.node_id}));
                }
                c.lease.confirmed(l.ttl_ms, l.renew_ms);
            } else if c.lease.expired() {
                c.warn_once(format!("fenced:{}", mono_ms() / 60_000), "lease not renewed within its ttl: acting on nothing until the store answers",
                    json!({"node_id": c.cfg.node_id}));
            }
            if ok && l.takeover {
                take_over_expired(&c).await;
            }
        }
    });
}

async fn take_over_expired(c: &Arc<Coordinator>) {
    let Ok(leases) = c.store.nodes().await else { return };
    // Nodes whose own daemon is back and asks for them.
    let wanted: Vec<String> = leases.iter().filter_map(|l| l.node.strip_suffix("!reclaim").map(str::to_string)).collect();
    let adopted: Vec<String> = c.adopted.lock().unwrap().iter().cloned().collect();
    for node in adopted.into_iter().filter(|n| wanted.contains(n)) {
        log("info", "the owner of a taken-over node is back: giving it back", json!({"node": node}));
        release_adopted(c, &node, false).await;
    }
    for lease in leases {
        if lease.node == c.cfg.node_id || lease.node.contains('!') || wanted.contains(&lease.node) || lease.expires_in_ms > 0
            || c.adopted.lock().unwrap().contains(&lease.node)
        {
            continue;
        }
        match c.store.claim_node(&lease.node, &c.holder, &c.cfg.advertise_url, c.cfg.lease.ttl_ms, true).await {
            Ok(Claim::Granted(g)) => {
                c.grants.lock().unwrap().insert(lease.node.clone(), Token { holder: c.holder.clone(), generation: g });
                c.metrics.takeovers.fetch_add(1, Relaxed);
                log("warn", "took over a node whose lease ran out: finishing its transactions", json!({"node": lease.node, "previous_holder": lease.holder, "expired_ms_ago": -lease.expires_in_ms}));
                c.adopted.lock().unwrap().insert(lease.node);
            }
            Ok(Claim::HeldBy(_)) => {}
            Err(e) => log("warn", "takeover failed; will retry", json!({"node": lease.node, "error": e})),
        }
    }
}

/// Prepared branches of nodes that have no lease row at all: a takeover finished such a
/// node and forgot it, and then a branch of it came back — MariaDB's XA ROLLBACK of a
/// prepared branch is not durable (it is not flushed; a crash within about a second
/// brings the branch back prepared, and mysql_co's restart gate then refuses every
/// XA PREPARE until it is decided). Only epochs registered in our store count (never
/// another store's daemon); the claim is the ordinary takeover claim, so a live or
/// returning owner keeps its node.
pub async fn adopt_released_with_branches(c: &Coordinator, nodes: HashSet<String>) -> Vec<String> {
    let mut taken = Vec::new();
    if nodes.is_empty() || !c.cfg.lease.takeover {
        return taken;
    }
    let Ok(leases) = c.store.nodes().await else { return taken };
    for node in nodes {
        if leases.iter().any(|l| l.node == node || l.node == reclaim_key(&node)) || c.adopted.lock().unwrap().contains(&node) {
            continue; // leased (alive, or expired: the takeover loop handles it)
        }
        if let Ok(Claim::Granted(g)) = c.store.claim_node(&node, &c.holder, &c.cfg.advertise_url, c.cfg.lease.ttl_ms, true).await {
            c.grants.lock().unwrap().insert(node.clone(), Token { holder: c.holder.clone(), generation: g });
            c.metrics.takeovers.fetch_add(1, Relaxed);
            log("warn", "a prepared branch of a released node came back (a database lost a rollback in a crash): taking the node again to finish it", json!({"node": node}));
            c.adopted.lock().unwrap().insert(node.clone());
            taken.push(node);
        }
    }
    taken
}

/// A taken-over node is given back: `forget` when nothing of it is left (its lease row
/// goes), otherwise only marked expired — its own daemon, coming back, recovers the rest
/// (every decision we took for it is in the store), or another takeover does.
pub async fn release_adopted(c: &Coordinator, node: &str, forget: bool) {
    // Stop acting for it first: our completions of its gtids check this.
    c.adopted.lock().unwrap().remove(node);
    if let Err(e) = c.store.release_node(node, &c.holder, forget).await {
        log("warn", "could not release a taken-over node; will retry", json!({"node": node, "error": e}));
        c.adopted.lock().unwrap().insert(node.to_string());
        return;
    }
    c.grants.lock().unwrap().remove(node);
    for rc in c.resources.values() {
        rc.release_node_lock(node).await;
    }
    log("info", "released a taken-over node", json!({"node": node, "all_finished": forget}));
}

/// The row by which a returning daemon asks a survivor for its node back.
pub fn reclaim_key(node: &str) -> String {
    format!("{node}!reclaim")
}

impl Coordinator {
    /// Every node lease in the store (all daemons of the deployment, so the console shows
    /// who holds what and when it runs out) and what this daemon acts for.
    pub async fn nodes_report(&self) -> crate::coordinator::Res {
        let leases = self.store.nodes().await.map_err(|e| crate::state::Refusal::new(RefusalCode::StoreUnavailable, e))?;
        let mut adopted: Vec<String> = self.adopted.lock().unwrap().iter().cloned().collect();
        adopted.sort();
        let nodes: Vec<_> = leases
            .iter()
            .map(|l| json!({"node": l.node, "holder": l.holder, "url": l.url, "expires_in_ms": l.expires_in_ms, "mine": l.holder == self.holder}))
            .collect();
        Ok(json!({"node_id": self.cfg.node_id, "holder": self.holder, "lease_valid": !self.lease.expired(), "adopted": adopted, "nodes": nodes}))
    }
}

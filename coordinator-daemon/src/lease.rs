//! Owning a node id. A daemon acts for a node only while it holds the node's lease in the
//! store (renewed every `lease.renew_ms`, valid for `lease.ttl_ms`) and the node's lock at
//! every resource it acts on (resources.rs). At start it claims both or refuses to run; it
//! registers its epoch before issuing a gtid. When a renewal finds the lease taken, it
//! exits; when renewals fail (store unreachable) past the lease's validity, it stops acting
//! until one succeeds. With `lease.takeover`, it takes over nodes whose lease ran out,
//! finishes their branches (recording abort for undecided ones, so a paused owner that
//! wakes up loses), and releases them.

use crate::coordinator::Coordinator;
use crate::log::log;
use crate::store::{Claim, Op};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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
}

/// Our lease is gone to another holder: acting on would split transactions. Exit; a
/// supervisor restarts us and the restart waits for the lease.
pub fn lost(c: &Coordinator, why: &str) -> ! {
    log("error", "node lease lost: stopping (another daemon holds this node now)", json!({"node_id": c.cfg.node_id, "holder": c.holder, "why": why}));
    std::process::exit(3);
}

/// Claims our node at start, waiting while a previous holder may still let go (its lease
/// runs out, or a daemon that took it over releases it). Err names the holder.
pub async fn claim_at_start(c: &Coordinator) -> Result<(), String> {
    let l = &c.cfg.lease;
    let deadline = Instant::now() + Duration::from_millis(2 * l.ttl_ms + 2 * c.cfg.timeouts.recovery_interval_ms);
    let mut said = false;
    loop {
        match c.store.claim_node(&c.cfg.node_id, &c.holder, &c.cfg.advertise_url, l.ttl_ms, true).await? {
            Claim::Granted => break,
            Claim::HeldBy(h) => {
                // A survivor that took our node over gives it back when asked (it releases
                // at its next renewal): the row is a request, never a lease.
                let _ = c.store.claim_node(&reclaim_key(&c.cfg.node_id), &c.holder, &c.cfg.advertise_url, l.ttl_ms, false).await;
                if Instant::now() >= deadline {
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
    c.lease.confirmed(l.ttl_ms, l.renew_ms);
    // The epoch is durable before any gtid of it exists: recovery acts only on known epochs.
    c.store.write(Op::RegisterEpoch { node: c.cfg.node_id.clone(), nonce: c.nonce }).await?;
    c.epochs.lock().unwrap().insert((c.cfg.node_id.clone(), c.nonce));
    Ok(())
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
        loop {
            tokio::time::sleep(Duration::from_millis(l.renew_ms)).await;
            let mut nodes = vec![c.cfg.node_id.clone()];
            nodes.extend(c.adopted.lock().unwrap().iter().cloned());
            let mut ok = true;
            for n in &nodes {
                match c.store.claim_node(n, &c.holder, &c.cfg.advertise_url, l.ttl_ms, false).await {
                    Ok(Claim::Granted) => {}
                    Ok(Claim::HeldBy(h)) if *n == c.cfg.node_id => lost(&c, &format!("held by {} ({})", h.holder, h.url)),
                    Ok(Claim::HeldBy(h)) => {
                        log("warn", "a node we had taken over is held by another daemon now; leaving it", json!({"node": n, "holder": h.holder}));
                        c.adopted.lock().unwrap().remove(n);
                    }
                    Err(e) => {
                        ok = false;
                        log("warn", "lease renewal failed; will retry", json!({"node": n, "error": e}));
                    }
                }
            }
            if ok {
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
            Ok(Claim::Granted) => {
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
        if let Ok(Claim::Granted) = c.store.claim_node(&node, &c.holder, &c.cfg.advertise_url, c.cfg.lease.ttl_ms, true).await {
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
    for rc in c.resources.values() {
        rc.release_node_lock(node).await;
    }
    log("info", "released a taken-over node", json!({"node": node, "all_finished": forget}));
}

/// The row by which a returning daemon asks a survivor for its node back.
pub fn reclaim_key(node: &str) -> String {
    format!("{node}!reclaim")
}

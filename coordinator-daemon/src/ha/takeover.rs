//! Taking over nodes whose lease ran out (with `lease.takeover`): claiming them, taking a
//! released node again when a prepared branch of it came back, giving a node back to its
//! returning owner or once nothing of it is left. Finishing their branches is recovery's
//! (coordinator/recovery.rs); renewing their grants is lease.rs's.

use crate::store::Claim;
use crate::telemetry::log::log;
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;

use super::holding::Holding;

/// Records a grant of a node taken over.
fn took_over(c: &Holding<'_>, node: &str, generation: i64) {
    c.owner.granted(node, generation);
    c.metrics.takeovers.fetch_add(1, Relaxed);
}

pub async fn take_over_expired(c: &Holding<'_>) {
    let Ok(leases) = c.store.nodes().await else { return };
    // Nodes whose own daemon is back and asks for them.
    let wanted: Vec<String> =
        leases.iter().filter_map(|l| l.node.strip_suffix("!reclaim").map(str::to_string)).collect();
    for node in c.owner.adopted().into_iter().filter(|n| wanted.contains(n)) {
        log("info", "the owner of a taken-over node is back: giving it back", json!({"node": node}));
        release_adopted(c, &node, false).await;
    }
    for lease in leases {
        if lease.node == c.cfg.node_id
            || lease.node.contains('!')
            || wanted.contains(&lease.node)
            || lease.expires_in_ms > 0
            || c.owner.is_adopted(&lease.node)
        {
            continue;
        }
        match c.store.claim_node(&lease.node, &c.owner.holder, &c.cfg.advertise_url, c.cfg.lease.ttl_ms, true).await {
            Ok(Claim::Granted(g)) => {
                took_over(c, &lease.node, g);
                log(
                    "warn",
                    "took over a node whose lease ran out: finishing its transactions",
                    json!({"node": lease.node, "previous_holder": lease.holder, "expired_ms_ago": -lease.expires_in_ms}),
                );
                c.owner.adopt(&lease.node);
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
pub async fn adopt_released_with_branches(c: &Holding<'_>, nodes: HashSet<String>) -> Vec<String> {
    let mut taken = Vec::new();
    if nodes.is_empty() || !c.cfg.lease.takeover {
        return taken;
    }
    let Ok(leases) = c.store.nodes().await else { return taken };
    for node in nodes {
        if leases.iter().any(|l| l.node == node || l.node == reclaim_key(&node)) || c.owner.is_adopted(&node) {
            continue; // leased (alive, or expired: the takeover loop handles it)
        }
        if let Ok(Claim::Granted(g)) =
            c.store.claim_node(&node, &c.owner.holder, &c.cfg.advertise_url, c.cfg.lease.ttl_ms, true).await
        {
            took_over(c, &node, g);
            log("warn", "a prepared branch of a released node came back (a database lost a rollback in a crash): taking the node again to finish it", json!({"node": node}));
            c.owner.adopt(&node);
            taken.push(node);
        }
    }
    taken
}

/// A taken-over node is given back: `forget` when nothing of it is left (its lease row
/// goes), otherwise only marked expired — its own daemon, coming back, recovers the rest
/// (every decision we took for it is in the store), or another takeover does.
pub async fn release_adopted(c: &Holding<'_>, node: &str, forget: bool) {
    // Stop acting for it first: our completions of its gtids check this.
    c.owner.unadopt(node);
    if let Err(e) = c.store.release_node(node, &c.owner.holder, forget).await {
        log("warn", "could not release a taken-over node; will retry", json!({"node": node, "error": e}));
        c.owner.adopt(node);
        return;
    }
    c.owner.drop_grant(node);
    for rc in c.resources.values() {
        rc.release_node_lock(node).await;
    }
    log("info", "released a taken-over node", json!({"node": node, "all_finished": forget}));
}

/// The row by which a returning daemon asks a survivor for its node back.
pub fn reclaim_key(node: &str) -> String {
    format!("{node}!reclaim")
}

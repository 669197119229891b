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
//!
//! A lost grant is a value (`Fenced`) that the renewal loop, the one owner of the
//! reaction, acts on (`regain`); what memory keeps is a pure function of the store's word
//! (`reconcile`). What the daemon owns in memory is ha/ownership.rs.
//!
//! The operations take a [`Holding`] (ha/holding.rs): the few parts of the daemon they
//! use, borrowed; taking over other nodes is ha/takeover.rs.

use crate::config::{ResourceKind, StoreConfig};
use crate::participants::resources::ResourceError;
use crate::refusal::RefusalCode;
use crate::state::Refusal;
use crate::store::{Claim, Op, Renewal, StoreError, Stored};
use crate::telemetry::log::log;
use crate::wire::{NodeLease, Nodes};
use cotx_protocol::answer::{after_regrant, Reconcile};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::clock::{self, ClockNews, ClockWatch};
use super::holding::{Holding, Reconciled};
use super::ownership::mono_ms;
use super::takeover::{reclaim_key, take_over_expired};
use super::witness;

/// Our own node's grant is gone (paused past the lease, taken over, finished and handed
/// back): found by a renewal, handed to the renewal loop, which alone reacts (`regain`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fenced {
    pub why: String,
}

/// Claims our node at start, waiting while a previous holder may still let go (its lease
/// runs out, or a daemon that took it over releases it). Err names the holder.
pub async fn claim_at_start(c: &Holding<'_>) -> Result<(), String> {
    let l = &c.cfg.lease;
    claim_own(c, Some(Instant::now() + Duration::from_millis(2 * l.ttl_ms + 2 * c.cfg.timeouts.recovery_interval_ms)))
        .await?;
    c.owner.lease.confirmed(l.ttl_ms, l.renew_ms);
    // The epoch is durable before any gtid of it exists: recovery acts only on known epochs.
    c.store.write(Op::RegisterEpoch { node: c.cfg.node_id.clone(), nonce: c.owner.nonce }).await?;
    c.owner.epochs.lock().unwrap().insert((c.cfg.node_id.clone(), c.owner.nonce));
    Ok(())
}

/// Compares the store with this daemon's witness of it (crate::ha::witness) and, when it may
/// be acted on, writes down how far it has come. Err: the store went back to an older copy
/// (or cannot say what it is).
pub async fn check_witness(c: &Holding<'_>) -> Result<(), String> {
    let Some(path) = &c.cfg.witness_file else { return Ok(()) };
    let now = c.store.identity().await.map_err(|e| format!("cannot read the decision store's identity: {e}"))?;
    witness::check(witness::read(path)?.as_ref(), &now)?;
    if let Err(e) = witness::write(path, &now) {
        // Only the safety net is weaker: say so, keep running.
        c.memory.warn_once(
            format!("witness:{e}"),
            "cannot write the witness file: a restored older store copy would not be noticed",
            json!({"error": e}),
        );
    }
    Ok(())
}

/// Claims our own node under a new grant, asking a daemon that took it over to give it
/// back; waits until `deadline` (None: for as long as it takes).
async fn claim_own(c: &Holding<'_>, deadline: Option<Instant>) -> Result<(), String> {
    let l = &c.cfg.lease;
    let o = &c.owner;
    let mut said = false;
    loop {
        match c.store.claim_node(&o.node_id, &o.holder, &c.cfg.advertise_url, l.ttl_ms, true).await {
            Ok(Claim::Granted(g)) => {
                o.granted(&o.node_id, g);
                break;
            }
            Err(e) if deadline.is_none() => {
                log("warn", "cannot claim our node yet; will retry", json!({"node_id": o.node_id, "error": e}));
                tokio::time::sleep(Duration::from_millis(l.renew_ms)).await;
            }
            Err(e) => return Err(e.into()),
            Ok(Claim::HeldBy(h)) => {
                // A survivor that took our node over gives it back when asked (it releases
                // at its next renewal): the row is a request, never a lease.
                let _ = c
                    .store
                    .claim_node(&reclaim_key(&o.node_id), &o.holder, &c.cfg.advertise_url, l.ttl_ms, false)
                    .await;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(format!(
                        "node {} is held by {} ({}) whose lease runs {} ms more: another daemon runs as this node; give every daemon its own node_id",
                        o.node_id, h.holder, h.url, h.expires_in_ms
                    ));
                }
                if !said {
                    log(
                        "warn",
                        "node lease held by another holder; waiting for it to run out or be released",
                        json!({"node_id": o.node_id, "holder": h.holder, "url": h.url, "expires_in_ms": h.expires_in_ms}),
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let _ = c.store.release_node(&reclaim_key(&o.node_id), &o.holder, true).await;
    Ok(())
}

/// What memory keeps of one transaction of our node once the node is claimed again: the
/// store's word (cotx_protocol::answer::after_regrant). A store that cannot be read now
/// keeps nothing: every answer about the gtid then comes from the store.
pub fn reconcile(read: Result<Stored, StoreError>) -> Reconciled {
    let Ok(s) = read else { return Reconciled::Drop };
    match (after_regrant(s.view()), s) {
        (Reconcile::Keep(o), _) => Reconciled::Keep(o),
        (Reconcile::Drop, _) => Reconciled::Drop,
        (Reconcile::Quarantine, Stored::Corrupt(q)) => Reconciled::Quarantine(q),
        (Reconcile::Quarantine, _) => Reconciled::Leave,
    }
}

/// Our grant is gone. Nothing from before may be acted on: stop, claim the node under a
/// new grant, and keep of memory only what the store confirms (`reconcile`); nodes we had
/// taken over are let go (their leases run out and a live daemon takes them over).
async fn regain(c: &Holding<'_>, lost: Fenced) {
    c.owner.set_regaining(true);
    c.owner.lease.revoke();
    c.metrics.lease_losses.fetch_add(1, Relaxed);
    log(
        "error",
        "node lease lost: acting on nothing until the node is claimed again and memory is reconciled with the store",
        json!({"node_id": c.cfg.node_id, "holder": c.owner.holder, "why": lost.why}),
    );
    for node in c.owner.drain_adopted() {
        forget_node(c, &node);
    }
    let _ = claim_own(c, None).await;
    // Every entry of our node goes through the store's word.
    let generation = c.owner.generation_of(&c.cfg.node_id);
    let (mut kept, mut dropped) = (0, 0);
    for g in c.memory.gtids_of(&c.cfg.node_id) {
        let verdict = reconcile(c.store.get(&g).await);
        match verdict {
            Reconciled::Keep(_) => kept += 1,
            Reconciled::Drop => dropped += 1,
            _ => {}
        }
        c.memory.reconcile(&g, verdict, generation);
    }
    let l = &c.cfg.lease;
    c.owner.lease.confirmed(l.ttl_ms, l.renew_ms);
    c.owner.set_regaining(false);
    log(
        "warn",
        "node claimed again under a new grant: memory reconciled with the store",
        json!({"node_id": c.cfg.node_id, "generation": generation, "kept": kept, "dropped": dropped}),
    );
}

/// Drops what we hold of a node we no longer act for.
fn forget_node(c: &Holding<'_>, node: &str) {
    c.owner.drop_grant(node);
    c.memory.forget_node(node);
}

/// Takes our node's lock at every reachable resource, refusing to run when another
/// session holds it; checks that no two MariaDB resources are one server.
pub async fn lock_resources_at_start(c: &Holding<'_>) -> Result<(), String> {
    // Same server twice first: its node lock (server-wide GET_LOCK) would look taken.
    let mut seen: Vec<(String, String)> = vec![];
    for (name, rc) in c.resources {
        if rc.kind != ResourceKind::Mariadb {
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
    for (name, rc) in c.resources {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match rc.node_lock(&c.cfg.node_id, false).await {
                Ok(()) => break,
                Err(e @ ResourceError::Held(_)) => {
                    if Instant::now() >= deadline {
                        return Err(format!("{e}: another daemon acts as node {} on this database (a second deployment, or a copy with its own store?); give every daemon its own node_id", c.cfg.node_id));
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    // Unreachable now: the lock is taken before recovery acts there.
                    log(
                        "warn",
                        "resource unreachable at start; its node lock is taken before acting on it",
                        json!({"resource": name, "error": e}),
                    );
                    break;
                }
            }
        }
    }
    Ok(())
}

/// What one round of renewals found: whether every renewal was answered, and whether our
/// own node's grant is gone (a value: the loop reacts). A taken-over node whose grant is
/// gone is simply left here.
struct Round {
    answered: bool,
    lost: Option<Fenced>,
}

async fn renew_all(c: &Holding<'_>) -> Round {
    let ttl = c.cfg.lease.ttl_ms;
    let mut ok = true;
    let mut lost_own = None;
    for n in c.owner.nodes() {
        let Some(tok) = c.owner.grant(&n) else { continue };
        match c.store.renew_node(&n, &tok, ttl).await {
            Ok(Renewal::Renewed) => {}
            Ok(Renewal::Lost(why)) if n == c.cfg.node_id => lost_own = Some(Fenced { why: format!("{why:?}") }),
            Ok(Renewal::Lost(why)) => {
                log(
                    "warn",
                    "a node we had taken over is no longer ours; leaving it",
                    json!({"node": n, "why": format!("{why:?}")}),
                );
                c.owner.unadopt(&n);
                forget_node(c, &n);
            }
            Err(e) => {
                ok = false;
                log("warn", "lease renewal failed; will retry", json!({"node": n, "error": e}));
            }
        }
    }
    Round { answered: ok, lost: lost_own }
}

/// Renews our leases and, with takeover on, adopts nodes whose lease ran out. The one
/// owner of the reaction to a lost grant.
/// `holding` lends the operations their parts of `parts` (which the task keeps alive).
pub fn spawn_renewal<P: Send + Sync + 'static>(parts: Arc<P>, holding: for<'a> fn(&'a P) -> Holding<'a>) {
    tokio::spawn(async move {
        let c = &holding(&parts);
        let l = c.cfg.lease.clone();
        let mut last_renewed = Instant::now();
        let mut clock = ClockWatch::default();
        loop {
            tokio::time::sleep(Duration::from_millis(l.renew_ms)).await;
            let left = store_time_left(c).await;
            let local_ms = last_renewed.elapsed().as_millis() as u64;
            let round = renew_all(c).await;
            let mut ok = round.answered;
            if let (true, Some(left)) = (ok, left) {
                watch_clock(c, &mut clock, local_ms, left);
            }
            // A renewal long overdue: this process was paused or cut off (say so: it
            // explains what follows, a lost grant or a takeover elsewhere).
            let gap = last_renewed.elapsed().as_millis() as u64;
            if ok && gap > l.ttl_ms {
                log(
                    "warn",
                    "lease renewed late: this daemon was paused or cut off from the store past its lease",
                    json!({"node_id": c.cfg.node_id, "since_last_renewal_ms": gap, "ttl_ms": l.ttl_ms}),
                );
            }
            if let Some(lost) = round.lost {
                regain(c, lost).await;
                last_renewed = Instant::now();
                continue;
            }
            // The store is the one we saw, not an older copy put in its place.
            if ok {
                if let Err(why) = check_witness(c).await {
                    ok = false;
                    c.owner.lease.revoke();
                    c.memory.warn_once(
                        format!("witness:{why}"),
                        "acting on nothing: the decision store is not the one this daemon saw",
                        json!({"error": why}),
                    );
                }
            }
            if ok {
                last_renewed = Instant::now();
                if c.owner.lease.expired() {
                    log("info", "lease confirmed again: acting again", json!({"node_id": c.cfg.node_id}));
                }
                c.owner.lease.confirmed(l.ttl_ms, l.renew_ms);
            } else if c.owner.lease.expired() {
                c.memory.warn_once(
                    format!("fenced:{}", mono_ms() / 60_000),
                    "lease not renewed within its ttl: acting on nothing until the store answers",
                    json!({"node_id": c.cfg.node_id}),
                );
            }
            if ok && l.takeover {
                take_over_expired(c).await;
            }
        }
    });
}

/// Our node's lease time left by the store's clock (PostgreSQL store only: SQLite's clock
/// is ours, and nothing is read for it).
async fn store_time_left(c: &Holding<'_>) -> Option<i64> {
    if !matches!(c.cfg.store, StoreConfig::Postgres { .. }) {
        return None;
    }
    let leases = c.store.nodes().await.ok()?;
    leases.into_iter().find(|l| l.node == c.cfg.node_id).map(|l| l.expires_in_ms)
}

/// One renewal's interval into the clock watch: the rate exported, a skew said once.
fn watch_clock(c: &Holding<'_>, w: &mut ClockWatch, local_ms: u64, store_left_ms: i64) {
    let news = w.sample(local_ms, c.cfg.lease.ttl_ms, store_left_ms);
    c.metrics.clock_rate_milli.store((w.rate() * 1000.0) as u64, Relaxed);
    match news {
        ClockNews::Skewed(rate) => log(
            "error",
            "this daemon's clock runs at another rate than the decision store's: its lease is renewed late or early \
             by the store's clock (lost and taken back, transactions aborted by takeover); fix the host's clock",
            json!({"node_id": c.cfg.node_id, "rate": rate, "renewals": clock::SAMPLES}),
        ),
        ClockNews::Normal(rate) => {
            log("warn", "this daemon's clock runs with the decision store's again", json!({"rate": rate}))
        }
        ClockNews::Nothing => {}
    }
}

/// Every node lease in the store (all daemons of the deployment, so the console shows
/// who holds what and when it runs out) and what this daemon acts for.
pub async fn nodes_report(c: &Holding<'_>) -> Result<Nodes, Refusal> {
    let leases = c.store.nodes().await.map_err(|e| Refusal::new(RefusalCode::StoreUnavailable, e))?;
    let nodes = leases
        .into_iter()
        .map(|l| NodeLease {
            mine: l.holder == c.owner.holder,
            node: l.node,
            holder: l.holder,
            url: l.url,
            expires_in_ms: l.expires_in_ms,
        })
        .collect();
    Ok(Nodes {
        node_id: c.cfg.node_id.clone(),
        holder: c.owner.holder.clone(),
        lease_valid: !c.owner.lease.expired(),
        adopted: c.owner.adopted(),
        nodes,
    })
}

#[cfg(test)]
mod tests;

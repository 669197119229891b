//! Deadlocks across databases, broken in seconds: two global transactions that lock rows
//! in opposite order on two databases wait for each other, and neither engine sees the
//! cycle (PostgreSQL's `lock_timeout` is 0 by default, InnoDB waits 50 s). Once one of our
//! transactions with a known session has been active `timeouts.deadlock_check_ms`, each
//! housekeeping tick may run a pass (at most one per `deadlock_check_ms`): read the lock
//! waits of the resources our active transactions run on, build the wait-for graph
//! (wait_graph.rs), and for each cycle that crosses databases abort the youngest of our
//! transactions in it (retryable: `deadlock_victim`) and cancel its waiting statements.
//! Without such a transaction no database is asked anything.
//!
//! Several daemons on one store: each pass publishes our transactions' sessions in the
//! store and reads the other daemons' (store::postgres::sessions), so a cycle through two
//! daemons' transactions is one cycle to both. Both pick the same victim (the youngest of
//! all), and only its owner aborts it: each cycle is broken once.
//!
//! An abort that must act — a timeout — cancels the transaction's waiting statements too
//! (`spawn_cancel`): otherwise its session stays blocked, and so does every transaction
//! queued behind its rows.

use crate::telemetry::log::log;
use serde_json::json;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::completion;
use super::effects::Effects;
use super::parts::Parts;
use super::registry::{Registry, Sessions};
use super::wait_graph::{self, Cycle, Edge, Node};
use crate::config::Config;
use crate::participants::resources::{Clients, ResourceClient};
use crate::store::{SharedSession, Store};
use crate::telemetry::metrics::Metrics;
use crate::wire::{BrokenCycle, LockWait, Waits};

/// From the housekeeping tick: a pass in the background when one is due.
pub fn tick(c: &Arc<Parts>, now: Instant) {
    let every = c.cfg.timeouts.deadlock_check_ms;
    if every == 0 || !c.registry.start_wait_check(now, Duration::from_millis(every)) {
        return;
    }
    let c = c.clone();
    tokio::spawn(async move {
        let mut fx = Effects::default();
        pass(Detecting::from(&*c), &mut fx).await;
        completion::start(&c, fx);
        c.registry.wait_check_done();
    });
}

/// What a pass borrows: the lock waits of the resources, the sessions of memory and of
/// the store (other daemons'), the view it leaves for `/v1/waits`, the metrics; a victim's
/// branches are left to completion (effects.rs).
#[derive(Clone, Copy)]
struct Detecting<'a> {
    cfg: &'a Config,
    store: &'a Store,
    registry: &'a Registry,
    resources: &'a Clients,
    metrics: &'a Metrics,
    waits: &'a Mutex<Waits>,
}

impl<'a> From<&'a Parts> for Detecting<'a> {
    fn from(p: &'a Parts) -> Self {
        Detecting {
            cfg: &p.cfg,
            store: &p.store,
            registry: &p.registry,
            resources: &p.resources,
            metrics: &p.metrics,
            waits: &p.waits,
        }
    }
}

async fn pass(c: Detecting<'_>, fx: &mut Effects) {
    let ours = c.registry.live_sessions();
    let sessions =
        with_other_daemons(c.store, &c.cfg.node_id, c.cfg.timeouts.deadlock_check_ms, c.registry, &ours).await;
    let resources: BTreeSet<&String> = ours.of.keys().map(|(r, _)| r).collect();
    let mut edges = Vec::new();
    for name in resources {
        let Some(rc) = c.resources.get(name) else { continue };
        match rc.lock_waits().await {
            Ok(waits) => edges.extend(waits.into_iter().map(|w| Edge {
                resource: name.clone(),
                waiter: w.waiter,
                blocker: w.blocker,
                on: w.on,
            })),
            Err(e) => c.registry.warn_once(
                format!("lock-waits:{name}"),
                "cannot read the lock waits of a resource: deadlocks across databases through it are not broken \
                 (docs/ops.md, \"Deadlocks across databases\": privileges)",
                json!({"resource": name, "error": e}),
            ),
        }
    }
    c.metrics.deadlock_checks.fetch_add(1, Relaxed);
    seen(c.waits, &edges, &sessions, &ours);
    for cycle in wait_graph::cycles(&edges, &sessions.of, &sessions.begun) {
        if !ours.begun.contains_key(&cycle.victim) {
            continue; // another daemon's: it sees this cycle too, and breaks it
        }
        c.metrics.deadlock_cycles.fetch_add(1, Relaxed);
        let waits = describe(&cycle);
        let reason = format!("deadlock victim, the youngest in a wait cycle across databases: {}", waits.join("; "));
        let aborted = c.registry.with_entry(&cycle.victim, |e| e.tx.abort_as_deadlock_victim(reason.clone())).here()
            == Some(true);
        if !aborted {
            continue; // decided meanwhile: its locks go with its decision
        }
        let age_ms = sessions.begun.get(&cycle.victim).map(|b| crate::state::unix_ms().saturating_sub(*b)).unwrap_or(0);
        c.metrics.deadlock_victims.fetch_add(1, Relaxed);
        c.metrics.deadlock_victim_age_ms.fetch_add(age_ms, Relaxed);
        c.metrics.aborted.fetch_add(1, Relaxed);
        let members: Vec<String> = cycle.nodes.iter().map(name).collect();
        log(
            "warn",
            "deadlock across databases: aborted the youngest transaction of the cycle (retryable)",
            json!({"gtid": cycle.victim, "cycle": members, "waits": &waits, "victim_age_ms": age_ms}),
        );
        remember_broken(c.waits, &cycle.victim, waits);
        fx.complete(&cycle.victim);
        cancel_waiting(c.resources, c.metrics, &cycle.victim, c.registry.sessions_of(&cycle.victim)).await;
    }
}

/// Our sessions and those the other daemons on the store published in their last passes.
/// Ours win a session both name (theirs may be a pass old, and the session reused since).
async fn with_other_daemons(
    store: &Store,
    node_id: &str,
    check_ms: u64,
    registry: &Registry,
    ours: &Sessions,
) -> Sessions {
    let mine: Vec<SharedSession> = ours
        .of
        .iter()
        .map(|((resource, session), gtid)| SharedSession {
            gtid: gtid.clone(),
            resource: resource.clone(),
            session: *session,
            begun_ms: ours.begun.get(gtid).copied().unwrap_or(0),
        })
        .collect();
    // Fresh while their daemon passes (every deadlock_check_ms), gone soon after it stops.
    let max_age_ms = 2 * check_ms + 500;
    let theirs = match store.exchange_sessions(node_id, mine, max_age_ms).await {
        Ok(t) => t,
        Err(e) => {
            registry.warn_once(
                "sessions-exchange".into(),
                "cannot exchange sessions with the other daemons through the store: a deadlock through two daemons' \
                 transactions is left to their timeouts",
                json!({"error": e}),
            );
            Vec::new()
        }
    };
    let mut all = Sessions::default();
    for s in theirs {
        all.of.insert((s.resource, s.session), s.gtid.clone());
        all.begun.insert(s.gtid, s.begun_ms);
    }
    all.of.extend(ours.of.iter().map(|(k, v)| (k.clone(), v.clone())));
    all.begun.extend(ours.begun.iter().map(|(k, v)| (k.clone(), *v)));
    all
}

/// The waits of this pass that involve one of our transactions, for /v1/waits and the
/// console.
fn seen(seen_waits: &Mutex<Waits>, edges: &[Edge], sessions: &Sessions, ours: &Sessions) {
    let node = |r: &str, s: i64| {
        let key = (r.to_string(), s);
        match sessions.of.get(&key) {
            Some(g) => (ours.of.contains_key(&key), g.clone()),
            None => (false, name(&Node::Local(r.to_string(), s))),
        }
    };
    let mut waits: Vec<LockWait> = edges
        .iter()
        .filter_map(|e| {
            let ((gw, waiter), (gb, blocker)) = (node(&e.resource, e.waiter), node(&e.resource, e.blocker));
            (gw || gb).then(|| LockWait { waiter, blocker, resource: e.resource.clone(), on: e.on.clone() })
        })
        .collect();
    waits.dedup();
    let mut w = seen_waits.lock().unwrap();
    w.checked_at_unix_ms = Some(crate::state::unix_ms());
    w.waits = waits;
}

/// Kept for /v1/waits: the latest 20 cycles broken.
fn remember_broken(seen_waits: &Mutex<Waits>, victim: &str, waits: Vec<String>) {
    let mut w = seen_waits.lock().unwrap();
    w.broken.insert(0, BrokenCycle { at_unix_ms: crate::state::unix_ms(), victim: victim.to_string(), waits });
    w.broken.truncate(20);
}

fn name(n: &Node) -> String {
    match n {
        Node::Global(g) => g.clone(),
        Node::Local(r, s) => format!("session {s} at {r} (no global transaction)"),
    }
}

/// "A waits at R for B (on what)" for each wait of the cycle.
fn describe(c: &Cycle) -> Vec<String> {
    c.waits
        .iter()
        .map(|(a, b, r, on)| {
            let on = if on.is_empty() { String::new() } else { format!(" ({on})") };
            format!("{} waits at {r} for {}{on}", name(a), name(b))
        })
        .collect()
}

/// Cancels the statements of `gtid`'s unprepared branches (`sessions`: resource and
/// session of each) that wait for a lock now.
async fn cancel_waiting(
    resources: &HashMap<String, Arc<ResourceClient>>,
    metrics: &Metrics,
    gtid: &str,
    sessions: Vec<(String, i64)>,
) {
    for (res, session) in sessions {
        let Some(rc) = resources.get(&res) else { continue };
        match rc.cancel_if_waiting(session).await {
            Ok(true) => {
                metrics.statements_cancelled.fetch_add(1, Relaxed);
                log(
                    "info",
                    "cancelled the waiting statement of an aborted transaction",
                    json!({"gtid": gtid, "resource": res, "session": session}),
                );
            }
            Ok(false) => {}
            Err(e) => log(
                "warn",
                "could not cancel the waiting statement of an aborted transaction",
                json!({"gtid": gtid, "resource": res, "session": session, "error": e}),
            ),
        }
    }
}

/// An abort that must act (a timeout): its waiting statements cancelled in the
/// background. Nothing is asked of a database when no branch reported its session.
pub fn spawn_cancel(c: &Arc<Parts>, gtid: &str) {
    let sessions = c.registry.sessions_of(gtid);
    if sessions.is_empty() {
        return;
    }
    let (c, g) = (c.clone(), gtid.to_string());
    tokio::spawn(async move { cancel_waiting(&c.resources, &c.metrics, &g, sessions).await });
}

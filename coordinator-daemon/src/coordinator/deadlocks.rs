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
//! An abort that must act — a timeout — cancels the transaction's waiting statements too
//! (`spawn_cancel`): otherwise its session stays blocked, and so does every transaction
//! queued behind its rows.

use crate::telemetry::log::log;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::completion;
use super::parts::Parts;
use super::wait_graph::{self, Cycle, Edge, Node};

/// From the housekeeping tick: a pass in the background when one is due.
pub fn tick(c: &Arc<Parts>, now: Instant) {
    let every = c.cfg.timeouts.deadlock_check_ms;
    if every == 0 || !c.registry.start_wait_check(now, Duration::from_millis(every)) {
        return;
    }
    let c = c.clone();
    tokio::spawn(async move {
        pass(&c).await;
        c.registry.wait_check_done();
    });
}

async fn pass(c: &Arc<Parts>) {
    let sessions = c.registry.live_sessions();
    let resources: BTreeSet<&String> = sessions.of.keys().map(|(r, _)| r).collect();
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
    for cycle in wait_graph::cycles(&edges, &sessions.of, &sessions.begun) {
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
            json!({"gtid": cycle.victim, "cycle": members, "waits": waits, "victim_age_ms": age_ms}),
        );
        completion::spawn_completion(c, &cycle.victim);
        cancel_waiting(c, &cycle.victim, c.registry.sessions_of(&cycle.victim)).await;
    }
}

fn name(n: &Node) -> String {
    match n {
        Node::Global(g) => g.clone(),
        Node::Local(r, s) => format!("session {s} at {r} (no global transaction of this daemon)"),
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
async fn cancel_waiting(c: &Parts, gtid: &str, sessions: Vec<(String, i64)>) {
    for (res, session) in sessions {
        let Some(rc) = c.resources.get(&res) else { continue };
        match rc.cancel_if_waiting(session).await {
            Ok(true) => {
                c.metrics.statements_cancelled.fetch_add(1, Relaxed);
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
    tokio::spawn(async move { cancel_waiting(&c, &g, sessions).await });
}

//! Recovery, at start and periodically, in Citus' order:
//!   1. list the prepared branches on every resource (P1),
//!   2. take the active set (undecided transactions),
//!   3. read the decisions (the store),
//!   4. list the prepared branches again (P2).
//!
//! Only branches in both P1 and P2 are acted on: such a branch was prepared before we
//! looked at the active set, so if its transaction is not in that set it was decided before
//! step 2 and step 3 sees the decision (a commit is durable before its transaction leaves
//! the active set). A resource that cannot be listed is reported and retried next pass,
//! never skipped silently.
//!
//! Whose branches: only those of nodes we act for (ours, and nodes taken over), at
//! resources where we hold the node's lock, of epochs registered in our store (a daemon
//! of the same name with another store is somebody else). Branches of our current epoch
//! follow our memory: recorded commit → COMMIT, undecided → leave, else presumed abort.
//! Branches of any other epoch may still be decided by a paused previous holder, so an
//! undecided one first gets an abort record (conditional insert: whoever wrote first
//! wins), then the recorded outcome. A record that cannot be read stops its gtid.

use crate::config::{Config, ResourceKind};
use crate::ha::holding::Holding;
use crate::ha::ownership::Ownership;
use crate::ha::takeover;
use crate::naming;
use crate::participants::resources::{Clients, Completion};
use crate::state::{self, FinishedBy, Outcome};
use crate::store::{CorruptRecord, Decided, DecisionRecord, Op};
use crate::telemetry::log::log;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use super::completion::{self, Finishing};
use super::decisions;
use super::effects::Effects;
use super::health::ResourceHealth;
use super::holds::{self, Holds};
use super::leases::Leases;
use super::parts::Parts;
use super::registry::Registry;

/// What one branch found prepared gets: the protocol's pure rule (shared with the model).
pub use cotx_protocol::recovery::{decide, Action};

#[derive(Debug, Default)]
pub struct Report {
    pub committed: usize,
    pub rolled_back: usize,
    pub confirmed: usize,
    pub unreachable: Vec<String>,
}

/// Why a prepared branch is not ours to act on; the pass does something different for
/// each kind (nothing, a takeover looked for, a warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotOurs {
    /// Not named by any daemon.
    #[error("not a gtid of ours")]
    NotAGtid,
    /// A node we do not act for (released nodes with branches are taken again).
    #[error("another node")]
    AnotherNode,
    /// Our node, an epoch our store never registered: another daemon of the same name.
    #[error("foreign epoch")]
    ForeignEpoch,
}

/// Whether we may act on this gtid's branches, and why not.
/// Ok(true): of our current epoch (memory is the truth); Ok(false): of another epoch
/// we act for.
pub fn whose(o: &Ownership, gtid: &str, epochs: &HashSet<(String, u64)>) -> Result<bool, NotOurs> {
    let Some((node, nonce)) = naming::gtid_epoch(gtid) else { return Err(NotOurs::NotAGtid) };
    if !o.acts_for(node) {
        return Err(NotOurs::AnotherNode);
    }
    if !epochs.contains(&(node.to_string(), nonce)) {
        return Err(NotOurs::ForeignEpoch);
    }
    Ok(node == o.node_id && nonce == o.nonce)
}

/// What a pass reads to list the prepared branches and choose what each gets: the config
/// (our node, the owners' grace, the decision resources), whose nodes we act for, memory,
/// the resources' connections and their health (which the listing updates). Acting on a
/// branch borrows what finishing it uses (`completion::Finishing`) and leaves the work
/// that outlives the pass to it (effects.rs), which `run_pass` starts.
#[derive(Clone, Copy)]
struct Looking<'a> {
    cfg: &'a Config,
    owner: &'a Ownership,
    registry: &'a Registry,
    resources: &'a Clients,
    health: &'a ResourceHealth,
    leases: &'a Leases,
}

impl<'a> From<&'a Parts> for Looking<'a> {
    fn from(p: &'a Parts) -> Self {
        Looking {
            cfg: &p.cfg,
            owner: &p.owner,
            registry: &p.registry,
            resources: &p.resources,
            health: &p.health,
            leases: &p.leases,
        }
    }
}

impl Looking<'_> {
    fn decision_of(self, gtid: &str) -> Option<(Outcome, bool)> {
        self.registry.decision_of(gtid, Duration::from_millis(self.cfg.timeouts.owner_grace_ms))
    }

    /// The protocol's action for one gtid from what the pass saw (`current`: of our
    /// current epoch).
    /// A gtid of a range we leased is never presumed aborted with nothing recorded: left
    /// while its lease runs, its abort recorded first after (cotx_protocol::leased).
    fn action_of(self, g: &str, current: bool, seen: &Seen) -> Action {
        let recorded_commit = seen.recorded.get(g) == Some(&Outcome::Commit);
        let range = self.leases.range_of(g, &self.cfg.node_id, self.owner.nonce);
        cotx_protocol::leased::recovery(self.decision_of(g), seen.active.contains(g), recorded_commit, current, range)
    }

    fn mark(self, resource: &str, up: bool) {
        self.health.note(resource, up);
    }
}

/// What a pass saw of the store and memory (steps 2 and 3) and what it asked the decision
/// resources.
struct Seen {
    active: HashSet<String>,
    recorded: HashMap<String, Outcome>,
    epochs: HashSet<(String, u64)>,
    /// Gtids the pass would presume aborted, asked of the decision resources, and their
    /// answers (None: no decision resource to ask).
    unknown: HashSet<String>,
    in_participant: Option<HashMap<String, Outcome>>,
}

/// The prepared branches listed at each resource (P1 or P2).
type Listed = HashMap<String, HashSet<(String, String)>>;

pub async fn run_pass(c: &Arc<Parts>) -> Report {
    let mut rep = Report::default();
    if c.owner.lease.expired() {
        return rep; // our lease is unconfirmed: act on nothing
    }
    let look = Looking::from(&**c);
    let done = Finishing::from(c);
    holds::enforcement_pass(Holds::from(c)).await;
    let names: Vec<String> = c.resources.keys().cloned().collect();
    // 1. P1, at resources where we hold the locks of the nodes we act for.
    let p1 = list_first(look, &names, &mut rep).await;
    // 2. active set
    let active = c.registry.active_set();
    // 3. decisions: the store is the truth (it may be shared with other coordinators).
    let mut fx = Effects::default();
    let decisions = read_decisions(done, &mut fx, &mut rep).await;
    completion::start(c, std::mem::take(&mut fx));
    let Some((recorded, epochs)) = decisions else { return rep };
    // 4. P2; collect P1 ∩ P2 by gtid.
    let (both, p2) = list_second(look, &names, &p1, &mut rep).await;
    let mut seen = Seen { active, recorded, epochs, unknown: HashSet::new(), in_participant: None };
    ask_participants(look, &both, &mut seen).await;
    let mut nodes_with_branches: HashSet<String> = HashSet::new();
    let mut other_nodes: HashSet<String> = HashSet::new();
    for (g, branches) in &both {
        match whose(&c.owner, g, &seen.epochs) {
            Ok(current) => {
                if let Some(node) = naming::gtid_node(g) {
                    nodes_with_branches.insert(node.to_string());
                }
                act_on(look, done, &mut fx, g, branches, current, &seen, &mut rep).await;
                completion::start(c, std::mem::take(&mut fx));
            }
            Err(NotOurs::AnotherNode) => {
                if let Some((node, nonce)) = naming::gtid_epoch(g) {
                    if seen.epochs.contains(&(node.to_string(), nonce)) {
                        other_nodes.insert(node.to_string());
                    }
                }
            }
            Err(NotOurs::ForeignEpoch) => {
                c.metrics.foreign_branches.fetch_add(1, Relaxed);
                c.registry.warn_once(format!("foreign:{g}"), "prepared branch of our node from an epoch our store does not know: another daemon with the same node_id and another store made it; leaving it to that daemon",
                    json!({"gtid": g, "branches": branches}));
            }
            Err(NotOurs::NotAGtid) => {}
        }
    }
    confirm_vanished(look, done, &names, &p1, &p2, &mut rep).await;
    finish_pass(c.holding(), &c.registry, &mut rep, nodes_with_branches, other_nodes).await;
    rep
}

/// Step 1: P1, at each resource where we hold the locks of every node we act for; a
/// resource that cannot be locked or listed is reported unreachable.
async fn list_first(c: Looking<'_>, names: &[String], rep: &mut Report) -> Listed {
    let nodes = c.owner.nodes();
    let mut p1: Listed = HashMap::new();
    for n in names {
        let rc = &c.resources[n];
        let mut locked = true;
        for node in &nodes {
            if let Err(e) = rc.node_lock(node, *node != c.cfg.node_id).await {
                log(
                    "warn",
                    "recovery: cannot hold the node lock at this resource; will retry",
                    json!({"resource": n, "node": node, "error": e}),
                );
                locked = false;
            }
        }
        if !locked {
            c.mark(n, false);
            rep.unreachable.push(n.clone());
            continue;
        }
        match rc.list_prepared().await {
            Ok(v) => {
                p1.insert(n.clone(), v.into_iter().collect());
            }
            Err(e) => {
                log("warn", "recovery: resource unreachable; will retry", json!({"resource": n, "error": e}));
                c.mark(n, false);
                rep.unreachable.push(n.clone());
            }
        }
    }
    p1
}

/// Step 3: the store's decisions (applied to memory) and registered epochs. None: the
/// store did not answer, and without the decisions nothing may be rolled back.
async fn read_decisions(
    c: Finishing<'_>,
    fx: &mut Effects,
    rep: &mut Report,
) -> Option<(HashMap<String, Outcome>, HashSet<(String, u64)>)> {
    match c.store.load().await {
        Ok(l) => {
            for q in &l.corrupt {
                c.registry.quarantine(q);
            }
            completion::adopt_records(c, fx, &l.records);
            let recorded = l.records.into_iter().map(|r| (r.gtid, r.outcome)).collect();
            let e: HashSet<(String, u64)> = l.epochs.into_iter().collect();
            *c.owner.epochs.lock().unwrap() = e.clone();
            Some((recorded, e))
        }
        Err(e) => {
            log("error", "recovery: cannot read the decision store; pass skipped", json!({"error": e}));
            c.metrics.recovery_errors.fetch_add(1, Relaxed);
            rep.unreachable.push("(store)".into());
            None
        }
    }
}

/// Step 4: P2 at each resource listed in P1; the branches in both, by gtid.
async fn list_second(
    c: Looking<'_>,
    names: &[String],
    p1: &Listed,
    rep: &mut Report,
) -> (BTreeMap<String, Vec<(String, String)>>, Listed) {
    let mut both: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut second_of: Listed = HashMap::new();
    for n in names {
        let Some(first) = p1.get(n) else { continue };
        let second: HashSet<(String, String)> = match c.resources[n].list_prepared().await {
            Ok(v) => v.into_iter().collect(),
            Err(e) => {
                log("warn", "recovery: resource unreachable; will retry", json!({"resource": n, "error": e}));
                rep.unreachable.push(n.clone());
                continue;
            }
        };
        c.mark(n, true);
        for (g, b) in first.intersection(&second) {
            both.entry(g.clone()).or_default().push((n.clone(), b.clone()));
        }
        second_of.insert(n.clone(), second);
    }
    (both, second_of)
}

/// Gtids recovery would presume aborted may have committed with the decision inside a
/// participant: ask the decision resources first (one batch each).
async fn ask_participants(c: Looking<'_>, both: &BTreeMap<String, Vec<(String, String)>>, seen: &mut Seen) {
    seen.unknown = both
        .keys()
        .filter(|g| {
            let Ok(current) = whose(c.owner, g, &seen.epochs) else { return false };
            matches!(c.action_of(g, current, seen), Action::Rollback | Action::RecordAbort)
                && c.decision_of(g).is_none()
                && !c.registry.is_quarantined(g)
        })
        .cloned()
        .collect();
    if !seen.unknown.is_empty() && !decisions::decision_resources(c.cfg).is_empty() {
        let asked: Vec<String> = seen.unknown.iter().cloned().collect();
        seen.in_participant = Some(decisions::resolve_in_participants(c.cfg, c.resources, &asked).await);
    }
}

/// One gtid of ours found prepared in both lists: its action, then its branches finished.
#[allow(clippy::too_many_arguments)] // the pass's state, passed down as it is
async fn act_on(
    look: Looking<'_>,
    c: Finishing<'_>,
    fx: &mut Effects,
    g: &str,
    branches: &[(String, String)],
    current: bool,
    seen: &Seen,
    rep: &mut Report,
) {
    if c.registry.is_quarantined(g) {
        return; // an operator decides (cotx-coordinator force)
    }
    // Decided again rather than kept from the participants' filter: the participant
    // lookup awaited, and a decision may have been recorded for g meanwhile.
    let mut action = look.action_of(g, current, seen);
    if let (Some(found), true) = (&seen.in_participant, seen.unknown.contains(g)) {
        action = match found.get(g) {
            // Unanswered by some decision resource: it may hold a commit; wait.
            None => Action::Leave,
            Some(Outcome::Commit) => {
                decisions::adopt_participant_commit(
                    look.cfg,
                    look.owner,
                    look.registry,
                    g,
                    branches,
                    rep.unreachable.is_empty(),
                );
                Action::Commit
            }
            // co.resolve recorded abort there: no decision can commit any more.
            Some(Outcome::Abort) => action,
        };
    }
    let o = match action {
        Action::Leave => return,
        Action::Commit => Outcome::Commit,
        Action::Rollback => Outcome::Abort,
        Action::RecordAbort => match record_abort(c, fx, g, branches).await {
            Some(o) => o,
            None => return,
        },
    };
    for (n, b) in branches {
        let res = completion::complete_branch(c, g, n, b, o, c.registry.prepared_ms_ago(g, b)).await;
        let done = matches!(res, Completion::Done);
        if completion::note_completion(c, g, n, b, o, res, FinishedBy::Recovery) && done {
            match o {
                Outcome::Commit => rep.committed += 1,
                Outcome::Abort => rep.rolled_back += 1,
            }
        }
    }
    c.registry.maybe_forget(g, c.store);
}

/// Branches of decided transactions that are prepared in neither list are finished.
async fn confirm_vanished(
    look: Looking<'_>,
    c: Finishing<'_>,
    names: &[String],
    p1: &Listed,
    p2: &Listed,
    rep: &mut Report,
) {
    for n in names {
        let (Some(first), Some(second)) = (p1.get(n), p2.get(n)) else { continue };
        for (g, b) in c.registry.decided_prepared_on(n) {
            if let Some((o, false)) = look.decision_of(&g) {
                let key = (g.clone(), b.clone());
                if !first.contains(&key) && !second.contains(&key) {
                    let res = match (c.cfg.kind_of(n), o) {
                        // A MariaDB branch of a commit that vanished unreported may have been
                        // lost (read-only, session or server gone): the resource checks.
                        (Some(ResourceKind::Mariadb), Outcome::Commit) => {
                            completion::complete_branch(c, &g, n, &b, o, c.registry.prepared_ms_ago(&g, &b)).await
                        }
                        _ => Completion::Gone,
                    };
                    if completion::note_completion(c, &g, n, &b, o, res, FinishedBy::Recovery) {
                        rep.confirmed += 1;
                    }
                }
            }
        }
    }
}

/// The pass's end: counters, the retention sweep, taken-over nodes given back, the log.
async fn finish_pass(
    c: Holding<'_>,
    registry: &Registry,
    rep: &mut Report,
    mut nodes_with_branches: HashSet<String>,
    other_nodes: HashSet<String>,
) {
    if !rep.unreachable.is_empty() {
        c.metrics.recovery_errors.fetch_add(1, Relaxed);
    }
    c.metrics.recovery_runs.fetch_add(1, Relaxed);
    registry.forget_finished(c.store);
    c.store.write_later(Op::Purge { older_than_ms: c.cfg.timeouts.outcome_retention_ms });
    decisions::flush_forgotten_decisions(c.cfg, c.resources, registry).await;
    // Taken-over nodes with nothing of them prepared where we could look, and nothing
    // undecided, go back (forgotten only when every resource could be listed).
    // Adopted now, acted on from the next pass (which holds their resource locks first).
    nodes_with_branches.extend(takeover::adopt_released_with_branches(&c, other_nodes).await);
    for node in c.owner.adopted() {
        if !nodes_with_branches.contains(&node) && !registry.has_unfinished_of(&node) {
            takeover::release_adopted(&c, &node, rep.unreachable.is_empty()).await;
        }
    }
    if rep.committed + rep.rolled_back > 0 {
        log(
            "info",
            "recovery pass",
            json!({"committed": rep.committed, "rolled_back": rep.rolled_back, "confirmed": rep.confirmed, "unreachable": rep.unreachable}),
        );
    }
}

/// An undecided transaction of another epoch (a previous run, or a node taken over): its
/// abort is recorded before anything is rolled back, so its old owner, should it wake up,
/// finds the decision taken. Returns the outcome in force, None when the store did not
/// answer (nothing is done this pass).
async fn record_abort(
    c: Finishing<'_>,
    fx: &mut Effects,
    gtid: &str,
    branches: &[(String, String)],
) -> Option<Outcome> {
    let rec = DecisionRecord {
        gtid: gtid.to_string(),
        outcome: Outcome::Abort,
        branches: branches.to_vec(),
        decided_unix_ms: state::unix_ms(),
        node: c.cfg.node_id.clone(),
        source: "takeover".into(),
    };
    let node = naming::gtid_node(gtid).unwrap_or_default();
    let fence = c.owner.grant(node)?;
    match c.store.decide(rec.clone(), Some(fence)).await {
        Ok(Decided::Outcome(o)) => {
            let mut r = rec;
            r.outcome = o;
            completion::adopt_records(c, fx, std::slice::from_ref(&r));
            Some(o)
        }
        Ok(Decided::Corrupt(problem)) => {
            c.registry.quarantine(&CorruptRecord { gtid: gtid.to_string(), problem });
            None
        }
        Ok(Decided::Fenced(why)) => {
            log("warn", "recovery: lost the lease of this gtid's node; leaving it", json!({"gtid": gtid, "why": why}));
            None
        }
        Ok(Decided::Forgotten) => {
            // Quarantined: listed for the operator (in-doubt report, console), answered
            // "quarantined" by this daemon, and `force` records the operator's outcome.
            c.registry.quarantine(&CorruptRecord {
                gtid: gtid.to_string(),
                problem: format!(
                    "a branch is prepared ({}) but the record is gone: purged after the retention, or missing from a store restored from an older copy \
                     (its epoch was sealed by mark-restored); the outcome is not known: check the transaction's other branches, then force it",
                    branches.iter().map(|(r, b)| format!("{r}/{b}")).collect::<Vec<_>>().join(", ")
                ),
            });
            None
        }
        Err(e) => {
            log("warn", "recovery: cannot record an abort; will retry", json!({"gtid": gtid, "error": e}));
            None
        }
    }
}

#[cfg(test)]
mod tests;

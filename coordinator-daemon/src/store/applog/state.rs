//! The log store's state in memory, and what each op does to it: pure (no I/O, the time
//! is an argument). [`State::plan`] answers a batch and says which records it writes
//! without changing the state; [`State::apply`] applies records once they are durable (and
//! at replay). The answers are the SQLite store's (store/sqlite/mod.rs), op by op.

use super::format::Rec;
use crate::store::log::{existing_outcome, OpResult};
use crate::store::log::{Op, Token};
use crate::store::record::{branches_to_json, gtid_seq, parse_row, purge_watermarks, AuditEntry, Stored};
use cotx_protocol::lease;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A decision row, as the SQLite store's `decisions` table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub outcome: String,
    pub branches: String,
    pub decided_ms: i64,
    pub node: String,
    pub source: String,
    pub finished_ms: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Epoch {
    pub started_ms: i64,
    pub purged_seq: Option<u64>,
    pub sealed_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub url: String,
    pub generation: i64,
    pub expires_ms: i64,
}

/// Purge deletes at most this many records per op, as the SQLite store's LIMIT.
const PURGE_LIMIT: usize = 10_000;

#[derive(Debug, Clone, Default)]
pub struct State {
    pub version: i64,
    pub store_id: String,
    pub decisions: HashMap<String, Row>,
    /// (finished_ms, gtid) of every finished row: what Purge looks through.
    finished: BTreeSet<(i64, String)>,
    pub epochs: BTreeMap<(String, u64), Epoch>,
    pub nodes: BTreeMap<String, Lease>,
    pub audit: Vec<AuditEntry>,
    pub grants: i64,
    pub restores: i64,
    pub tick: i64,
}

/// What a batch planned so far has changed: looked at before the state, so that an op sees
/// the ops before it in its batch (a second Decide of one gtid, Purge then Decide).
#[derive(Default)]
struct Pending {
    decisions: HashMap<String, Option<Row>>,
    epochs: HashMap<(String, u64), Epoch>,
}

fn row_of(r: &crate::store::record::DecisionRecord) -> Row {
    Row {
        outcome: r.outcome.as_str().to_string(),
        branches: branches_to_json(&r.branches),
        decided_ms: r.decided_unix_ms as i64,
        node: r.node.clone(),
        source: r.source.clone(),
        finished_ms: None,
    }
}

/// A decision row after `r` (None: no row). The one place each record's effect on a row
/// is written: applying and planning both go through it.
fn next_row(r: &Rec, cur: Option<Row>) -> Option<Row> {
    match r {
        Rec::Decision { outcome, branches, decided_ms, node, source, finished_ms, .. } => Some(Row {
            outcome: outcome.clone(),
            branches: branches.clone(),
            decided_ms: *decided_ms,
            node: node.clone(),
            source: source.clone(),
            finished_ms: *finished_ms,
        }),
        Rec::Finished { at_ms, .. } => cur.map(|mut x| {
            x.finished_ms = x.finished_ms.or(Some(*at_ms));
            x
        }),
        Rec::Purged { .. } => None,
        _ => cur,
    }
}

/// An epoch after `r` (the same for applying and planning).
fn next_epoch(r: &Rec, cur: Option<Epoch>) -> Option<Epoch> {
    match r {
        Rec::Epoch { started_ms, .. } => Some(cur.unwrap_or(Epoch { started_ms: *started_ms, ..Default::default() })),
        Rec::Watermark { seq, at_ms, .. } => {
            let mut e = cur.unwrap_or(Epoch { started_ms: *at_ms, ..Default::default() });
            e.purged_seq = Some(e.purged_seq.unwrap_or(0).max(*seq));
            Some(e)
        }
        Rec::Sealed { at_ms, .. } => cur.map(|mut e| {
            e.sealed_ms = e.sealed_ms.or(Some(*at_ms));
            e
        }),
        _ => cur,
    }
}

fn gtid_of(r: &Rec) -> Option<&str> {
    match r {
        Rec::Decision { gtid, .. } | Rec::Finished { gtid, .. } | Rec::Purged { gtid } => Some(gtid),
        _ => None,
    }
}

fn epoch_of(r: &Rec) -> Option<(String, u64)> {
    match r {
        Rec::Epoch { node, nonce, .. } | Rec::Watermark { node, nonce, .. } | Rec::Sealed { node, nonce, .. } => {
            Some((node.clone(), *nonce))
        }
        _ => None,
    }
}

impl State {
    /// Applies a durable record.
    pub fn apply(&mut self, r: &Rec) {
        if let Some(g) = gtid_of(r) {
            let cur = self.decisions.remove(g);
            if let Some(f) = cur.as_ref().and_then(|x| x.finished_ms) {
                self.finished.remove(&(f, g.to_string()));
            }
            if let Some(n) = next_row(r, cur) {
                if let Some(f) = n.finished_ms {
                    self.finished.insert((f, g.to_string()));
                }
                self.decisions.insert(g.to_string(), n);
            }
            return;
        }
        if let Some(k) = epoch_of(r) {
            let cur = self.epochs.remove(&k);
            if let Some(e) = next_epoch(r, cur) {
                self.epochs.insert(k, e);
            }
            return;
        }
        match r {
            Rec::Header { version, store_id } => {
                self.version = *version;
                self.store_id = store_id.clone();
            }
            Rec::Lease { node, holder, url, generation, expires_ms } => {
                let l = Lease {
                    holder: holder.clone(),
                    url: url.clone(),
                    generation: *generation,
                    expires_ms: *expires_ms,
                };
                self.nodes.insert(node.clone(), l);
            }
            Rec::Renewed { node, expires_ms } => {
                if let Some(l) = self.nodes.get_mut(node) {
                    l.expires_ms = *expires_ms;
                }
            }
            Rec::Released { node, holder } if self.nodes.get(node).is_some_and(|l| &l.holder == holder) => {
                self.nodes.remove(node);
            }
            Rec::Audit(a) => self.audit.push(a.clone()),
            Rec::Meta { grants, restores, tick } => {
                (self.grants, self.restores, self.tick) = (*grants, *restores, *tick)
            }
            _ => {}
        }
    }

    /// The lease row of `node` by the clock `now` (cotx_protocol::lease).
    pub fn lease_row(&self, node: &str, now: i64) -> Option<lease::Row> {
        self.nodes.get(node).map(|l| lease::Row {
            holder: l.holder.clone(),
            generation: l.generation,
            expires_in_ms: l.expires_ms - now,
        })
    }

    pub fn stored(&self, gtid: &str) -> Stored {
        match self.decisions.get(gtid) {
            Some(r) => read_row(gtid, r),
            None => Stored::Absent { forgotten: self.purged(self.epoch_lookup(), gtid) },
        }
    }

    fn epoch_lookup(&self) -> impl Fn(&(String, u64)) -> Option<Epoch> + '_ {
        |k| self.epochs.get(k).cloned()
    }

    /// Whether a missing record of `gtid` may have existed (the SQLite store's `purged`).
    fn purged(&self, epoch: impl Fn(&(String, u64)) -> Option<Epoch>, gtid: &str) -> bool {
        let (Some((node, nonce)), Some(seq)) = (crate::naming::gtid_epoch(gtid), gtid_seq(gtid)) else {
            return false;
        };
        let e = epoch(&(node.to_string(), nonce));
        let (w, sealed) = e.map_or((None, false), |e| (e.purged_seq, e.sealed_ms.is_some()));
        cotx_protocol::answer::unknown_if_absent(seq, w, sealed)
    }

    /// The answers to `ops` and the records that make them durable, as if the ops were
    /// applied in order; the state is left as it is (all or nothing: it changes only once
    /// the records are on disk).
    pub fn plan(&self, ops: &[Op], now: i64) -> (Vec<OpResult>, Vec<Rec>) {
        let mut p = Pending::default();
        let mut recs = vec![];
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            let mut emit = |p: &mut Pending, r: Rec| {
                if let Some(g) = gtid_of(&r) {
                    let cur = p.decisions.get(g).cloned().unwrap_or_else(|| self.decisions.get(g).cloned());
                    p.decisions.insert(g.to_string(), next_row(&r, cur));
                } else if let Some(k) = epoch_of(&r) {
                    let cur = p.epochs.get(&k).cloned().or_else(|| self.epochs.get(&k).cloned());
                    if let Some(e) = next_epoch(&r, cur) {
                        p.epochs.insert(k, e);
                    }
                }
                recs.push(r);
            };
            out.push(match op {
                Op::Decide(r, fence) => {
                    let existing =
                        p.decisions.get(&r.gtid).cloned().unwrap_or_else(|| self.decisions.get(&r.gtid).cloned());
                    if let Some(x) = existing {
                        existing_outcome(&x.outcome)
                    } else if self.purged(|k| p.epochs.get(k).cloned().or_else(|| self.epochs.get(k).cloned()), &r.gtid)
                    {
                        // Below the purge watermark no decision is written any more.
                        OpResult::Forgotten
                    } else if let Some(why) = fence.as_ref().and_then(|f| self.fenced(&r.gtid, f, now)) {
                        OpResult::Fenced(why)
                    } else {
                        emit(&mut p, decision_rec(&r.gtid, row_of(r)));
                        OpResult::Decided(r.outcome)
                    }
                }
                Op::Overwrite(r) => {
                    emit(&mut p, decision_rec(&r.gtid, row_of(r)));
                    OpResult::Decided(r.outcome)
                }
                Op::RegisterEpoch { node, nonce } => {
                    let k = (node.clone(), *nonce);
                    if !p.epochs.contains_key(&k) && !self.epochs.contains_key(&k) {
                        emit(&mut p, Rec::Epoch { node: node.clone(), nonce: *nonce, started_ms: now });
                    }
                    OpResult::Done
                }
                Op::Forget(g) => {
                    let cur = p.decisions.get(g).cloned().unwrap_or_else(|| self.decisions.get(g).cloned());
                    if cur.is_some_and(|x| x.finished_ms.is_none()) {
                        emit(&mut p, Rec::Finished { gtid: g.clone(), at_ms: now });
                    }
                    OpResult::Done
                }
                Op::Purge { older_than_ms } => {
                    let gtids = self.purgeable(&p, now - *older_than_ms as i64);
                    for ((node, nonce), seq) in purge_watermarks(&gtids) {
                        emit(&mut p, Rec::Watermark { node, nonce, seq, at_ms: now });
                    }
                    for g in gtids {
                        emit(&mut p, Rec::Purged { gtid: g });
                    }
                    OpResult::Done
                }
                Op::Audit(a) => {
                    emit(&mut p, Rec::Audit(a.clone()));
                    OpResult::Done
                }
            });
        }
        (out, recs)
    }

    fn fenced(&self, gtid: &str, f: &Token, now: i64) -> Option<String> {
        let owner = crate::naming::gtid_node(gtid).unwrap_or_default();
        (!lease::admits(self.lease_row(owner, now).as_ref(), f))
            .then(|| format!("the lease of node {owner} is no longer grant {} of {}", f.generation, f.holder))
    }

    /// Rows finished before `cutoff`, oldest first, as this batch left them so far.
    fn purgeable(&self, p: &Pending, cutoff: i64) -> Vec<String> {
        let mut v: Vec<(i64, String)> = self
            .finished
            .range(..(cutoff, String::new()))
            .filter(|(_, g)| !p.decisions.contains_key(g))
            .cloned()
            .collect();
        v.extend(p.decisions.iter().filter_map(|(g, r)| {
            let f = r.as_ref()?.finished_ms?;
            (f < cutoff).then(|| (f, g.clone()))
        }));
        v.sort();
        v.into_iter().take(PURGE_LIMIT).map(|(_, g)| g).collect()
    }

    /// The records that make a fresh log hold this state (compaction).
    pub fn snapshot(&self) -> Vec<Rec> {
        let mut v = vec![Rec::Header { version: self.version, store_id: self.store_id.clone() }];
        v.push(Rec::Meta { grants: self.grants, restores: self.restores, tick: self.tick });
        for (g, r) in &self.decisions {
            v.push(decision_rec(g, r.clone()));
        }
        for ((node, nonce), e) in &self.epochs {
            let (node, nonce) = (node.clone(), *nonce);
            v.push(Rec::Epoch { node: node.clone(), nonce, started_ms: e.started_ms });
            if let Some(seq) = e.purged_seq {
                v.push(Rec::Watermark { node: node.clone(), nonce, seq, at_ms: e.started_ms });
            }
            if let Some(at_ms) = e.sealed_ms {
                v.push(Rec::Sealed { node, nonce, at_ms });
            }
        }
        for (node, l) in &self.nodes {
            let (holder, url) = (l.holder.clone(), l.url.clone());
            v.push(Rec::Lease { node: node.clone(), holder, url, generation: l.generation, expires_ms: l.expires_ms });
        }
        v.extend(self.audit.iter().cloned().map(Rec::Audit));
        v
    }
}

pub fn decision_rec(gtid: &str, r: Row) -> Rec {
    let Row { outcome, branches, decided_ms, node, source, finished_ms } = r;
    Rec::Decision { gtid: gtid.to_string(), outcome, branches, decided_ms, node, source, finished_ms }
}

pub fn read_row(gtid: &str, r: &Row) -> Stored {
    parse_row(gtid.to_string(), &r.outcome, &r.branches, r.decided_ms, r.node.clone(), r.source.clone())
}

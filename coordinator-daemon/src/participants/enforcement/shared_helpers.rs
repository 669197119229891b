//! PostgreSQL client mode's shared helpers: the I/O around the pure pool (helpers.rs),
//! one pool per PostgreSQL resource. A registration takes a key of a ready helper (no
//! SQL) or, when none is ready, prepares one inline (`take`); the pool is refilled in the
//! background (`refill`, spawned by the coordinator after a registration); a helper is
//! rolled back as soon as it may go (`settle`, when one of its branches is settled;
//! `retire_idle` from the housekeeping tick); `sweep` recovers the helpers no live state
//! of this run knows (a crash, a takeover, a PREPARE or rollback that failed).

use super::helpers::{Pool, Taken, IDLE};
use super::probe::{self, Listed};
use crate::config::{Resource, ResourceKind};
use crate::naming;
use crate::participants::resources::ResourceClient;
use crate::refusal::RefusalCode;
use crate::state::Refusal;
use crate::telemetry::log::log;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// Which dangling helper (gtid, branch id, is its branch prepared now) must stay.
pub type KeepHelper<'a> = &'a (dyn Fn(&str, &str, bool) -> bool + Sync);

struct At {
    pool: Pool,
    /// Keys per helper (`client_helper_block`).
    block: i32,
    /// A background refill is under way.
    refilling: bool,
    /// Helpers left by an earlier run (or a PREPARE that timed out) have been looked at
    /// since the resource went to client mode. New branches and refills wait for it.
    swept: bool,
}

pub struct SharedHelpers {
    at: Mutex<HashMap<String, At>>,
    /// This run's epoch (node, nonce): the helpers' gids name it.
    node: String,
    nonce: u64,
    /// Ids of helpers, unique in this run (in their gids).
    next: AtomicU64,
    /// cotx_client_helpers_prepared_total / _rolled_back_total.
    pub prepared: AtomicU64,
    pub rolled_back: AtomicU64,
}

/// The id in a helper's token (`<node>.<nonce>-<id>`).
fn token_id(token: &str) -> Option<u64> {
    token.rsplit_once('-').and_then(|(_, id)| u64::from_str_radix(id, 16).ok())
}

impl SharedHelpers {
    pub fn new(resources: &[Resource], node: &str, nonce: u64) -> SharedHelpers {
        let at = resources
            .iter()
            .filter(|r| r.kind == ResourceKind::Postgres)
            .map(|r| {
                let b = r.client_helper_block;
                (r.name.clone(), At { pool: Pool::new(0, b, 1), block: b, refilling: false, swept: false })
            })
            .collect();
        SharedHelpers {
            at: Mutex::new(at),
            node: node.to_string(),
            nonce,
            next: AtomicU64::new(1),
            prepared: AtomicU64::new(0),
            rolled_back: AtomicU64::new(0),
        }
    }

    fn with<T>(&self, resource: &str, f: impl FnOnce(&mut At) -> T) -> Option<T> {
        self.at.lock().unwrap().get_mut(resource).map(f)
    }

    fn gid(&self, rc: &ResourceClient, id: u64, first: i32, n: i32) -> String {
        naming::pg_shared_helper_gid(rc.prefix(), first, n, &naming::new_gtid(&self.node, self.nonce, id))
    }

    /// The shim table has `slots` rows: a new pool, while no helper of ours is in the old
    /// one (a resized table is taken up once they are gone).
    pub fn resize(&self, resource: &str, slots: i32, start: i32) {
        self.with(resource, |a| {
            let whole = slots / a.block.max(1) * a.block.max(1);
            if a.pool.slots() != whole && a.pool.helper_count() == 0 {
                a.pool = Pool::new(slots, a.block, start);
            }
        });
    }

    /// The resource (re)entered client mode: its helpers are looked at before any use.
    pub fn unswept(&self, resource: &str) {
        self.with(resource, |a| a.swept = false);
    }

    pub fn swept(&self, resource: &str) -> bool {
        self.with(resource, |a| a.swept).unwrap_or(false)
    }

    /// A key for a new branch (swept already): a ready helper's, or one prepared now.
    pub async fn take(&self, rc: &ResourceClient) -> Result<Taken, Refusal> {
        if let Some(Some(t)) = self.with(&rc.name, |a| a.pool.take(Instant::now())) {
            return Ok(t);
        }
        // No ready helper has a key left: one is prepared on the registration's path
        // (the cost of a helper per branch, once per block).
        let name = &rc.name;
        let id = self.prepare_one(rc).await.map_err(|e| {
            let (code, why) = if e.is_empty() {
                (
                    RefusalCode::ResourceBusy,
                    format!("all {} shim slots are held by helpers of live branches", probe::SHIM_SLOTS),
                )
            } else {
                (RefusalCode::ResourceUnavailable, format!("cannot prepare the helper transaction: {e}"))
            };
            Refusal::new(code, format!("resource {name} (client mode): {why}; retry later"))
        })?;
        // Prepared and not retired in between (a retire needs IDLE without a taker).
        self.with(name, |a| a.pool.take_from(id, Instant::now())).flatten().ok_or_else(|| {
            Refusal::new(RefusalCode::ResourceUnavailable, format!("resource {name} (client mode): helper lost; retry"))
        })
    }

    /// Starts a helper on a free block and prepares it; its id once it is ready. Err("")
    /// when no block is free, Err(why) when the PREPARE failed.
    async fn prepare_one(&self, rc: &ResourceClient) -> Result<u64, String> {
        let id = self.next.fetch_add(1, Relaxed);
        // In the pool (Preparing) before the PREPARE: a sweep meanwhile leaves it alone.
        let started = self.with(&rc.name, |a| a.pool.start(id, Instant::now()).map(|f| (f, a.pool.block_size())));
        let Some(Some((first, n))) = started else { return Err(String::new()) };
        match probe::pg_prepare_helper(rc, &self.gid(rc, id, first, n), first, n).await {
            Ok(()) => {
                self.prepared.fetch_add(1, Relaxed);
                self.with(&rc.name, |a| a.pool.prepared(id, Instant::now()));
                Ok(id)
            }
            Err(e) => {
                // The server's refusal: surely not prepared. Anything else (a timeout, a
                // lost connection) may have prepared it: its block waits for a sweep.
                let absent = e.contains("SQLSTATE");
                self.with(&rc.name, |a| {
                    a.pool.failed(id, absent);
                    a.swept &= absent;
                });
                Err(if e.is_empty() { "failed".into() } else { e })
            }
        }
    }

    /// Should a refill of the pool start now? Marks it started; the caller runs `refill`
    /// off the registration's path.
    pub fn begin_refill(&self, resource: &str) -> bool {
        self.with(resource, |a| {
            let go = !a.refilling && a.swept && a.pool.wanted() > 0;
            a.refilling |= go;
            go
        })
        .unwrap_or(false)
    }

    /// Prepares helpers until the pool has its ready ones (after `begin_refill`).
    pub async fn refill(&self, rc: &ResourceClient) {
        while self.with(&rc.name, |a| a.swept && a.pool.wanted() > 0) == Some(true) {
            if let Err(e) = self.prepare_one(rc).await {
                if !e.is_empty() {
                    log(
                        "warn",
                        "client mode: cannot prepare a helper ahead of need",
                        json!({"resource": rc.name, "error": e}),
                    );
                }
                break;
            }
        }
        self.with(&rc.name, |a| a.refilling = false);
    }

    /// A branch holding a key of `helper` is settled (`one_phase`: it committed in one
    /// phase); rolls the helper back if that was the last thing keeping it.
    pub async fn settle(&self, rc: &ResourceClient, helper: u64, one_phase: bool) {
        if let Some(Some(id)) = self.with(&rc.name, |a| a.pool.done(helper, Instant::now(), one_phase)) {
            self.roll_back(rc, id).await;
        }
    }

    /// Rolls back a retiring helper claimed by the caller; on failure it stays retiring
    /// and the next tick tries again. A helper one of whose branches committed in one
    /// phase stays while a slot of its block is write-locked: that branch's COMMIT, on
    /// its client's session after the daemon's answer, may not have ended yet (the ack
    /// may be lost, or its transaction forgotten by retention while the session hangs).
    async fn roll_back(&self, rc: &ResourceClient, id: u64) {
        let Some(Some((first, n, check))) =
            self.with(&rc.name, |a| a.pool.first_of(id).map(|f| (f, a.pool.block_size(), a.pool.lock_check(id))))
        else {
            return;
        };
        if check {
            match probe::pg_block_locked(rc, first, n).await {
                Ok(0) => {}
                Ok(_) => {
                    // A branch's transaction is still open: the next tick looks again.
                    self.with(&rc.name, |a| a.pool.unclaim(id));
                    return;
                }
                Err(e) => {
                    log(
                        "warn",
                        "client mode: cannot tell whether a helper's slots are still in use; will retry",
                        json!({"resource": rc.name, "error": e}),
                    );
                    self.with(&rc.name, |a| a.pool.unclaim(id));
                    return;
                }
            }
        }
        match probe::pg_rollback_helper(rc, &self.gid(rc, id, first, n)).await {
            Ok(_) => {
                self.rolled_back.fetch_add(1, Relaxed);
                self.with(&rc.name, |a| a.pool.gone(id));
            }
            Err(e) => {
                log(
                    "warn",
                    "client mode: cannot roll back a helper transaction; will retry",
                    json!({"resource": rc.name, "error": e}),
                );
                self.with(&rc.name, |a| a.pool.unclaim(id));
            }
        }
    }

    /// The housekeeping tick: helpers idle for `IDLE`, and rollbacks that failed.
    pub async fn retire_idle(&self, rc: &ResourceClient) {
        let ids = self.with(&rc.name, |a| {
            let mut ids = a.pool.idle(Instant::now(), IDLE);
            ids.extend(a.pool.claim_retiring());
            ids
        });
        for id in ids.unwrap_or_default() {
            self.roll_back(rc, id).await;
        }
    }

    /// The daemon stops: no more refills, and every helper no live branch holds (the ready
    /// ones among them) rolled back now. Left prepared they would wait for the next run's
    /// sweep, or forever if that run finds the resource in another mode.
    pub async fn let_go_unused(&self, rc: &ResourceClient) {
        self.unswept(&rc.name);
        let ids = self.with(&rc.name, |a| a.pool.idle(Instant::now(), std::time::Duration::ZERO));
        for id in ids.unwrap_or_default() {
            self.roll_back(rc, id).await;
        }
    }

    /// Helpers in memory (any stage), all resources: for /metrics and the tick.
    pub fn live(&self) -> usize {
        self.at.lock().unwrap().values().map(|a| a.pool.helper_count()).sum()
    }

    /// Keys held by live branches at `resource` (the listing's slots in use).
    pub fn live_keys(&self, resource: &str) -> Option<usize> {
        self.with(resource, |a| a.pool.live_keys())
    }

    /// Helpers prepared at `rc` that no live state of this run knows: rolled back unless a
    /// branch that may have written one of their keys may still commit. Run by every
    /// recovery pass, and before the first client-mode branch. The rule per kind:
    /// - one-per-branch (an older daemon's): kept while `keep` says its branch may commit;
    /// - shared, of this run and not in the pool: no branch ever got one of its keys (a
    ///   PREPARE that timed out): rolled back;
    /// - shared, of another run (the gid names it): its keys were given only to branches
    ///   of that run (gtids carry the same node and nonce). Kept while its node is not
    ///   ours to act for, or any branch of that run prepared here may still commit, or a
    ///   slot of its block is write-locked (a branch that run answered to commit in one
    ///   phase, whose client's COMMIT has not ended: this run does not know it); a branch
    ///   of a dead run neither prepared nor answered never commits (presumed abort).
    pub async fn sweep(&self, rc: &ResourceClient, keep: KeepHelper<'_>) -> Result<usize, String> {
        let helpers = probe::pg_list_helpers(rc).await?;
        // Listed after the helpers: a branch prepared meanwhile counts as prepared (kept).
        let prepared: HashSet<(String, String)> = rc.list_prepared().await?.into_iter().collect();
        let mut rolled_back = 0;
        for h in helpers {
            let (gid, first, n) = match &h {
                Listed::PerBranch { key, gtid, bid } => {
                    if keep(gtid, bid, prepared.contains(&(gtid.clone(), bid.clone()))) {
                        self.with(&rc.name, |a| a.pool.reserve_keys(*key, 1));
                        continue;
                    }
                    (naming::pg_helper_gid(rc.prefix(), *key, gtid, bid).map_err(|e| e.message)?, *key, 1)
                }
                Listed::Shared { first, n, token } => {
                    let epoch = naming::gtid_epoch(token);
                    if epoch == Some((self.node.as_str(), self.nonce)) {
                        let id = token_id(token).unwrap_or(0);
                        if self.with(&rc.name, |a| a.pool.has(id)).unwrap_or(true) {
                            continue;
                        }
                    } else if keep(token, "", false)
                        || prepared.iter().any(|(g, b)| naming::gtid_epoch(g) == epoch && keep(g, b, true))
                        || probe::pg_block_locked(rc, *first, *n).await? > 0
                    {
                        self.with(&rc.name, |a| a.pool.reserve_keys(*first, *n));
                        continue;
                    }
                    (naming::pg_shared_helper_gid(rc.prefix(), *first, *n, token), *first, *n)
                }
            };
            self.with(&rc.name, |a| a.pool.reserve_keys(first, n));
            probe::pg_rollback_helper(rc, &gid).await?;
            self.with(&rc.name, |a| a.pool.give_keys(first, n));
            rolled_back += 1;
            log(
                "info",
                "client mode: dangling helper transaction rolled back",
                json!({"resource": rc.name, "gid": gid}),
            );
        }
        self.with(&rc.name, |a| a.swept = true);
        Ok(rolled_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_helper() {
        assert_eq!(token_id(&naming::new_gtid("n1", 0xabc, 0x2f)), Some(0x2f));
        assert_eq!(token_id("n1.abc"), None);
    }
}

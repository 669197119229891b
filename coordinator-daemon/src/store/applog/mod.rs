//! `[store] kind = "log"`: the decision store as one append-only file, for one daemon.
//!
//! The whole state lives in memory (state.rs) and every write batch is appended to the
//! file as one checksummed frame (format.rs), durably (file.rs: one O_DIRECT | O_DSYNC
//! write, or a write and an fdatasync) before any of it is applied or answered: the
//! cheapest durable store, with the SQLite store's answers op by op. At open the file is replayed; a torn last batch (a crash
//! before its sync returned) is cut whole, damage followed by whole frames refuses the
//! open. When the file holds far more than the live state it is rewritten (compaction).
//!
//! One process per file: the same `<path>.lock` as the SQLite store (store/sqlite/schema.rs).

mod file;
mod format;
mod state;

use crate::config::SyncMethod;
use crate::state::unix_ms;
use crate::store::error::StoreError;
use crate::store::log::RESTORE_GRANT_JUMP;
use crate::store::log::{Claim, DecisionLog, Identity, NodeLease, Op, OpResult, Renewal, Restored, Token};
use crate::store::record::{loaded_from, AuditEntry, Loaded, Stored};
use cotx_protocol::lease;
use file::LogFile;
use format::{frame, Rec};
use state::{read_row, State};

/// Compaction is considered once the file has grown past this (smaller logs are read
/// back in no time whatever they hold).
const COMPACT_MIN: u64 = 8 << 20;
/// ... and rewrites the file when it holds this many times the live state's snapshot.
const COMPACT_RATIO: u64 = 4;

pub struct AppLog {
    file: LogFile,
    state: State,
    /// The file length at which compaction is considered next.
    next_check: u64,
    /// COMPACT_MIN (smaller in tests).
    compact_min: u64,
    buf: Vec<u8>,
    _lock: std::fs::File,
}

impl AppLog {
    /// Opens (or makes) the log at `path`, taking the one-process lock first.
    pub fn open(path: &str, sync: SyncMethod) -> Result<AppLog, StoreError> {
        let lock = crate::store::file_lock::lock_store(path, "log")?;
        let (file, state) = LogFile::open(path, sync)?;
        tracing::info!(store = path, sync_method = file.sync_method().name(), "decision log opened");
        let next_check = file.end.max(COMPACT_MIN);
        Ok(AppLog { file, state, next_check, compact_min: COMPACT_MIN, buf: Vec::with_capacity(64 << 10), _lock: lock })
    }

    /// Makes `recs` durable as one frame, then applies them: all or nothing.
    fn commit(&mut self, recs: &[Rec]) -> Result<(), StoreError> {
        if recs.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        frame(&mut self.buf, recs);
        self.file.append(&self.buf)?;
        for r in recs {
            self.state.apply(r);
        }
        self.maybe_compact()
    }

    /// Rewrites the file as a snapshot of the state when it holds much more. Safe here:
    /// it runs on the store's only thread between batches (nothing is being appended),
    /// from the state that the old file's frames give back, and the new file replaces the
    /// old one by rename after it is synced (file.rs `write_fresh`): a crash at any point
    /// leaves one of the two whole. A failure leaves the old file in use; once the rename
    /// is done the new one is in use, even if its directory sync failed (then retried
    /// before the next write: file.rs `dir_unsynced`).
    fn maybe_compact(&mut self) -> Result<(), StoreError> {
        if self.file.end < self.next_check {
            return Ok(());
        }
        let mut snap = vec![];
        frame(&mut snap, &self.state.snapshot());
        let live = snap.len() as u64;
        if self.file.end > COMPACT_RATIO * live {
            match LogFile::write_snapshot(&self.file.path, &snap, self.file.sync_method()) {
                Ok(f) => self.file = f,
                Err(e) => tracing::warn!(store = self.file.path, error = %e, "decision log: compaction failed"),
            }
        }
        self.next_check = self.file.end.max(COMPACT_RATIO * live).max(self.compact_min) + (self.compact_min / 8);
        Ok(())
    }

    /// The file's current length of frames (tests: compaction shrank it).
    #[cfg(test)]
    fn end(&self) -> u64 {
        self.file.end
    }
}

impl DecisionLog for AppLog {
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, StoreError> {
        let (out, recs) = self.state.plan(ops, unix_ms() as i64);
        self.commit(&recs)?;
        Ok(out)
    }

    fn load(&mut self) -> Result<Loaded, StoreError> {
        let mut rows: Vec<_> = self
            .state
            .decisions
            .iter()
            .filter(|(_, r)| r.finished_ms.is_none() || !matches!(r.outcome.as_str(), "commit" | "abort"))
            .collect();
        rows.sort_by(|a, b| (a.1.decided_ms, a.0).cmp(&(b.1.decided_ms, b.0)));
        let rows = rows.into_iter().map(|(g, r)| read_row(g, r)).collect();
        let epochs = self.state.epochs.keys().cloned().collect();
        Ok(loaded_from(rows, epochs))
    }

    fn get(&mut self, gtid: &str) -> Result<Stored, StoreError> {
        Ok(self.state.stored(gtid))
    }

    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(self.state.audit.clone())
    }

    /// The file lock makes this process the store's only user: the claim is recorded (for
    /// `nodes`) and always granted, under a new generation (as the SQLite store).
    fn claim_node(
        &mut self,
        node: &str,
        holder: &str,
        url: &str,
        ttl_ms: u64,
        _fence_expired: bool,
    ) -> Result<Claim, StoreError> {
        let s = &self.state;
        let g = s.grants + 1;
        let expires_ms = (unix_ms() + ttl_ms) as i64;
        let lease = Rec::Lease { node: node.into(), holder: holder.into(), url: url.into(), generation: g, expires_ms };
        let meta = Rec::Meta { grants: g, restores: s.restores, tick: s.tick + 1 };
        self.commit(&[lease, meta])?;
        Ok(Claim::Granted(g))
    }

    fn renew_node(&mut self, node: &str, t: &Token, ttl_ms: u64) -> Result<Renewal, StoreError> {
        let s = &self.state;
        let v = lease::renewal(s.lease_row(node, unix_ms() as i64).as_ref(), t);
        if v == Renewal::Renewed {
            let meta = Rec::Meta { grants: s.grants, restores: s.restores, tick: s.tick + 1 };
            self.commit(&[Rec::Renewed { node: node.into(), expires_ms: (unix_ms() + ttl_ms) as i64 }, meta])?;
        }
        Ok(v)
    }

    fn release_node(&mut self, node: &str, holder: &str, _forget: bool) -> Result<(), StoreError> {
        if self.state.nodes.get(node).is_some_and(|l| l.holder == holder) {
            self.commit(&[Rec::Released { node: node.into(), holder: holder.into() }])?;
        }
        Ok(())
    }

    fn nodes(&mut self) -> Result<Vec<NodeLease>, StoreError> {
        let now = unix_ms() as i64;
        Ok(self
            .state
            .nodes
            .iter()
            .map(|(node, l)| NodeLease {
                node: node.clone(),
                holder: l.holder.clone(),
                url: l.url.clone(),
                expires_in_ms: l.expires_ms - now,
            })
            .collect())
    }

    fn identity(&mut self) -> Result<Identity, StoreError> {
        let s = &self.state;
        Ok(Identity { store_id: s.store_id.clone(), restores: s.restores, tick: s.tick })
    }

    /// The file lock held since open makes this process the store's only user: no daemon
    /// runs on it meanwhile.
    fn mark_restored(&mut self) -> Result<Restored, StoreError> {
        let s = &self.state;
        let now = unix_ms() as i64;
        let mut recs: Vec<Rec> = s
            .epochs
            .iter()
            .filter(|(_, e)| e.sealed_ms.is_none())
            .map(|((node, nonce), _)| Rec::Sealed { node: node.clone(), nonce: *nonce, at_ms: now })
            .collect();
        let sealed = recs.len() as u64;
        let restores = s.restores + 1;
        recs.push(Rec::Meta { grants: s.grants + RESTORE_GRANT_JUMP, restores, tick: s.tick + 1 });
        self.commit(&recs)?;
        Ok(Restored { sealed, restores })
    }
}

#[cfg(test)]
mod tests;

//! `bench-store --backend applog`: a MEASUREMENT PROBE, not a store the daemon can run.
//!
//! It answers one question: would an append-only decision log cost the store's thread
//! less CPU per decision than SQLite's COMMIT does? It runs behind the same group-commit
//! thread (crate::store::Store, the same batching and commit delay) and does, per batch,
//! what such a log must do at the least: the same checks as the SQLite store's
//! conditional insert (the record already there, the epoch's purge watermark, the node's
//! lease grant), answered from indexes in memory; every write of the batch appended as a
//! length-prefixed, checksummed record to one preallocated file, in one `pwrite`; then one
//! `fdatasync`, what SQLite's WAL commit does per batch when built with HAVE_FDATASYNC
//! (its WAL file, once reused, is overwritten in place as this file is).
//!
//! What it leaves out, so its cost is a lower bound of a real log's: reading the log back
//! at start (only [`read_log`] exists, for the test), compaction of finished records (the
//! counterpart of SQLite's WAL checkpoints, which run on the store's thread and are in its
//! numbers), audit records, purges, restores. Those ops and reads are refused.
//!
//! Record layout: `len: u32 LE` (of the body), `crc: u32 LE` (CRC-32 of the length bytes
//! and the body), body (`kind: u8`, then the fields; strings as `u16 LE` length + bytes).
//! The file is zero-filled at open, so a zero length is the log's end; a record whose
//! checksum does not match, or that runs past the file, is a torn tail (an unacknowledged
//! batch cut by a crash).

use crate::state::{unix_ms, Outcome};
use crate::store::{
    Claim, DecisionLog, DecisionRecord, Identity, Loaded, NodeLease, Op, OpResult, Renewal, Restored, StoreError,
    Stored, Token,
};
use cotx_protocol::lease;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

const DECISION: u8 = 1;
const FINISHED: u8 = 2;
const EPOCH: u8 = 3;
const LEASE: u8 = 4;
const HEADER: usize = 8;

/// One record of the log, as [`read_log`] gives it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    Decision(DecisionRecord),
    Finished { gtid: String, at_ms: u64 },
    Epoch { node: String, nonce: u64 },
    Lease { node: String, holder: String, url: String, generation: i64, expires_ms: u64 },
}

/// Where reading the log stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// A zero length: the end of what was written.
    End(u64),
    /// A record at this offset that is cut or does not match its checksum.
    Torn(u64),
}

pub struct AppLog {
    file: File,
    end: u64,
    capacity: u64,
    buf: Vec<u8>,
    /// gtid -> (outcome, finished): the conditional insert's lookup and `Forget`'s.
    index: HashMap<String, (Outcome, bool)>,
    /// (node, nonce) -> purge watermark (none written by the probe; looked up as the
    /// SQLite store does before each new decision).
    epochs: HashMap<(String, u64), Option<u64>>,
    leases: HashMap<String, lease::Row>,
    expires: HashMap<String, u64>,
    grants: i64,
}

fn io(what: &str, e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("applog probe: {what}: {e}"))
}

fn refused(what: &str) -> StoreError {
    StoreError::Unavailable(format!("applog probe: {what} is not implemented (a measurement probe, not a store)"))
}

impl AppLog {
    /// A new log at `path` (an existing file is replaced), `capacity` bytes zero-filled and
    /// synced before anything is measured: later batches overwrite allocated blocks, so
    /// their fdatasync has no file size or extent to record, as SQLite's reused WAL.
    pub fn create(path: &str, capacity: u64) -> Result<AppLog, StoreError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io(path, e))?;
        let chunk = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < capacity {
            let k = (capacity - at).min(chunk.len() as u64) as usize;
            file.write_all_at(&chunk[..k], at).map_err(|e| io("preallocating", e))?;
            at += k as u64;
        }
        file.sync_all().map_err(|e| io("preallocating", e))?;
        Ok(AppLog {
            file,
            end: 0,
            capacity,
            buf: Vec::with_capacity(64 << 10),
            index: HashMap::new(),
            epochs: HashMap::new(),
            leases: HashMap::new(),
            expires: HashMap::new(),
            grants: 0,
        })
    }

    /// Appends the records staged in `buf` and makes them durable: one write, one fdatasync.
    fn flush(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let n = self.buf.len() as u64;
        if self.end + n > self.capacity {
            return Err(StoreError::Unavailable(format!(
                "applog probe: log full ({} bytes preallocated): give bench-store a larger --n",
                self.capacity
            )));
        }
        self.file.write_all_at(&self.buf, self.end).map_err(|e| io("append", e))?;
        self.file.sync_data().map_err(|e| io("fdatasync", e))?;
        self.end += n;
        self.buf.clear();
        Ok(())
    }

    fn decide(&mut self, r: &DecisionRecord, fence: Option<&Token>) -> OpResult {
        if let Some((o, _)) = self.index.get(&r.gtid) {
            return OpResult::Decided(*o);
        }
        if let (Some((node, nonce)), Some(seq)) = (crate::naming::gtid_epoch(&r.gtid), crate::store::gtid_seq(&r.gtid))
        {
            let w = self.epochs.get(&(node.to_string(), nonce)).copied().flatten();
            if cotx_protocol::answer::unknown_if_absent(seq, w, false) {
                return OpResult::Forgotten;
            }
        }
        if let Some(f) = fence {
            let owner = crate::naming::gtid_node(&r.gtid).unwrap_or_default();
            if !lease::admits(self.lease_row(owner).as_ref(), f) {
                return OpResult::Fenced(format!(
                    "the lease of node {owner} is no longer grant {} of {}",
                    f.generation, f.holder
                ));
            }
        }
        encode(&mut self.buf, &Rec::Decision(r.clone()));
        self.index.insert(r.gtid.clone(), (r.outcome, false));
        OpResult::Decided(r.outcome)
    }

    /// Applies `ops` to the indexes and encodes their records into `buf` (`added`,
    /// `marked`: the decisions it added and marked finished, to undo on failure).
    fn stage(
        &mut self,
        ops: &[Op],
        added: &mut Vec<String>,
        marked: &mut Vec<String>,
    ) -> Result<Vec<OpResult>, StoreError> {
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(match op {
                Op::Decide(r, fence) => {
                    let known = self.index.contains_key(&r.gtid);
                    let res = self.decide(r, fence.as_ref());
                    if !known && self.index.contains_key(&r.gtid) {
                        added.push(r.gtid.clone());
                    }
                    res
                }
                Op::Forget(g) => {
                    if let Some((_, finished @ false)) = self.index.get_mut(g) {
                        *finished = true;
                        marked.push(g.clone());
                        encode(&mut self.buf, &Rec::Finished { gtid: g.clone(), at_ms: unix_ms() });
                    }
                    OpResult::Done
                }
                Op::RegisterEpoch { node, nonce } => {
                    self.epochs.entry((node.clone(), *nonce)).or_insert(None);
                    encode(&mut self.buf, &Rec::Epoch { node: node.clone(), nonce: *nonce });
                    OpResult::Done
                }
                Op::Overwrite(_) | Op::Purge { .. } | Op::Audit(_) => {
                    return Err(refused("an overwrite, purge or audit record"))
                }
            });
        }
        Ok(out)
    }

    fn lease_row(&self, node: &str) -> Option<lease::Row> {
        let now = unix_ms() as i64;
        self.leases
            .get(node)
            .map(|r| lease::Row { expires_in_ms: self.expires.get(node).map_or(0, |e| *e as i64 - now), ..r.clone() })
    }
}

impl DecisionLog for AppLog {
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, StoreError> {
        let (mut added, mut marked) = (vec![], vec![]);
        let r = self.stage(ops, &mut added, &mut marked).and_then(|out| self.flush().map(|_| out));
        // All or nothing, as the SQLite store's transaction: a batch that is not durable
        // leaves nothing behind in the indexes.
        if r.is_err() {
            self.buf.clear();
            for g in added {
                self.index.remove(&g);
            }
            for g in marked {
                if let Some((_, finished)) = self.index.get_mut(&g) {
                    *finished = false;
                }
            }
        }
        r
    }

    fn load(&mut self) -> Result<Loaded, StoreError> {
        Err(refused("load"))
    }

    fn get(&mut self, _gtid: &str) -> Result<Stored, StoreError> {
        Err(refused("get"))
    }

    fn audit_log(&mut self) -> Result<Vec<crate::store::AuditEntry>, StoreError> {
        Err(refused("the audit log"))
    }

    /// The probe's process is the file's only user (as the SQLite store's lock makes it):
    /// always granted, under a new generation, recorded durably.
    fn claim_node(
        &mut self,
        node: &str,
        holder: &str,
        url: &str,
        ttl_ms: u64,
        _fence_expired: bool,
    ) -> Result<Claim, StoreError> {
        self.grants += 1;
        let expires_ms = unix_ms() + ttl_ms;
        let rec = Rec::Lease {
            node: node.into(),
            holder: holder.into(),
            url: url.into(),
            generation: self.grants,
            expires_ms,
        };
        encode(&mut self.buf, &rec);
        self.flush()?;
        self.leases
            .insert(node.into(), lease::Row { holder: holder.into(), generation: self.grants, expires_in_ms: 0 });
        self.expires.insert(node.into(), expires_ms);
        Ok(Claim::Granted(self.grants))
    }

    fn renew_node(&mut self, _node: &str, _t: &Token, _ttl_ms: u64) -> Result<Renewal, StoreError> {
        Err(refused("renew"))
    }

    fn release_node(&mut self, _node: &str, _holder: &str, _forget: bool) -> Result<(), StoreError> {
        Err(refused("release"))
    }

    fn nodes(&mut self) -> Result<Vec<NodeLease>, StoreError> {
        Err(refused("nodes"))
    }

    fn identity(&mut self) -> Result<Identity, StoreError> {
        Err(refused("identity"))
    }

    fn mark_restored(&mut self) -> Result<Restored, StoreError> {
        Err(refused("mark-restored"))
    }
}

/// A record's checksum: CRC-32 of its length bytes and its body (crc32fast: a torn or
/// stale tail is what it must catch, not an adversary).
fn checksum(len: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(body);
    h.finalize()
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    // Longer strings are cut: the daemon's ids are far shorter (naming.rs).
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.extend_from_slice(&(s.len() as u16).to_le_bytes());
    b.extend_from_slice(s);
}

/// Appends `r` to `b`: header (length, checksum) and body.
pub fn encode(b: &mut Vec<u8>, r: &Rec) {
    let start = b.len();
    b.extend_from_slice(&[0u8; HEADER]);
    match r {
        Rec::Decision(d) => {
            b.push(DECISION);
            b.push(match d.outcome {
                Outcome::Commit => 1,
                Outcome::Abort => 2,
            });
            b.extend_from_slice(&d.decided_unix_ms.to_le_bytes());
            for s in [&d.gtid, &d.node, &d.source] {
                put_str(b, s);
            }
            b.extend_from_slice(&(d.branches.len() as u16).to_le_bytes());
            for (res, id) in &d.branches {
                put_str(b, res);
                put_str(b, id);
            }
        }
        Rec::Finished { gtid, at_ms } => {
            b.push(FINISHED);
            b.extend_from_slice(&at_ms.to_le_bytes());
            put_str(b, gtid);
        }
        Rec::Epoch { node, nonce } => {
            b.push(EPOCH);
            b.extend_from_slice(&nonce.to_le_bytes());
            put_str(b, node);
        }
        Rec::Lease { node, holder, url, generation, expires_ms } => {
            b.push(LEASE);
            b.extend_from_slice(&generation.to_le_bytes());
            b.extend_from_slice(&expires_ms.to_le_bytes());
            for s in [node, holder, url] {
                put_str(b, s);
            }
        }
    }
    let len = (b.len() - start - HEADER) as u32;
    b[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = checksum(len, &b[start + HEADER..]);
    b[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// Reads a record body; None if it does not parse (then the tail is torn).
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

fn decode(body: &[u8]) -> Option<Rec> {
    let mut b = Body(body);
    let r = match b.u8()? {
        DECISION => {
            let outcome = match b.u8()? {
                1 => Outcome::Commit,
                2 => Outcome::Abort,
                _ => return None,
            };
            let decided_unix_ms = b.u64()?;
            let (gtid, node, source) = (b.str()?, b.str()?, b.str()?);
            let n = b.u16()?;
            let branches = (0..n).map(|_| Some((b.str()?, b.str()?))).collect::<Option<Vec<_>>>()?;
            Rec::Decision(DecisionRecord { gtid, outcome, branches, decided_unix_ms, node, source })
        }
        FINISHED => Rec::Finished { at_ms: b.u64()?, gtid: b.str()? },
        EPOCH => Rec::Epoch { nonce: b.u64()?, node: b.str()? },
        LEASE => {
            let (generation, expires_ms) = (b.u64()? as i64, b.u64()?);
            Rec::Lease { generation, expires_ms, node: b.str()?, holder: b.str()?, url: b.str()? }
        }
        _ => return None,
    };
    b.0.is_empty().then_some(r)
}

/// Every whole record of a log's bytes, in order, and where reading stopped.
pub fn read_log(bytes: &[u8]) -> (Vec<Rec>, Tail) {
    let mut out = vec![];
    let mut at = 0usize;
    loop {
        let Some(h) = bytes.get(at..at + HEADER) else {
            return (out, if at >= bytes.len() { Tail::End(at as u64) } else { Tail::Torn(at as u64) });
        };
        let len = u32::from_le_bytes(h[..4].try_into().unwrap());
        let crc = u32::from_le_bytes(h[4..].try_into().unwrap());
        if len == 0 && crc == 0 {
            return (out, Tail::End(at as u64));
        }
        let Some(body) = bytes.get(at + HEADER..at + HEADER + len as usize) else {
            return (out, Tail::Torn(at as u64));
        };
        match (checksum(len, body) == crc).then(|| decode(body)).flatten() {
            Some(r) => out.push(r),
            None => return (out, Tail::Torn(at as u64)),
        }
        at += HEADER + len as usize;
    }
}

#[cfg(test)]
mod tests;

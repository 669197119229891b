//! The log's bytes: records, frames, and reading a file back.
//!
//! A file is [`MAGIC`] then frames. A frame is one write batch, so a batch is durable whole
//! or not at all: `len: u32 LE` (of the body), `crc: u32 LE` (CRC-32 of the length bytes and
//! the body), body (records: `kind: u8`, then the fields; integers LE, strings as `u32 LE`
//! length + UTF-8). The first frame holds the [`Rec::Header`]. The file is zero-filled ahead
//! of the writes (file.rs), so an all-zero header is the end of what was written.

use crate::store::record::AuditEntry;

/// The first bytes of every decision log: another file is refused, never read as a log.
pub const MAGIC: &[u8; 8] = b"COTXLOG\n";
pub const FRAME_HEADER: usize = 8;

/// One change of the store's state (state.rs applies it). Each carries its own times, so
/// replaying the log gives back exactly the state the daemon had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    /// The format's version (log::SCHEMA_VERSION) and the store's random id.
    Header {
        version: i64,
        store_id: String,
    },
    /// A decision row, inserted or replaced whole (outcome and branch list as the SQLite
    /// store keeps them, read through record::parse_row).
    Decision {
        gtid: String,
        outcome: String,
        branches: String,
        decided_ms: i64,
        node: String,
        source: String,
        finished_ms: Option<i64>,
    },
    Finished {
        gtid: String,
        at_ms: i64,
    },
    Purged {
        gtid: String,
    },
    Epoch {
        node: String,
        nonce: u64,
        started_ms: i64,
    },
    Watermark {
        node: String,
        nonce: u64,
        seq: u64,
        at_ms: i64,
    },
    Sealed {
        node: String,
        nonce: u64,
        at_ms: i64,
    },
    Lease {
        node: String,
        holder: String,
        url: String,
        generation: i64,
        expires_ms: i64,
    },
    Renewed {
        node: String,
        expires_ms: i64,
    },
    Released {
        node: String,
        holder: String,
    },
    Audit(AuditEntry),
    /// The counters, as they are after the frame: the lease grant counter, restores, tick.
    Meta {
        grants: i64,
        restores: i64,
        tick: i64,
    },
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u32).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_i64(b: &mut Vec<u8>, v: i64) {
    b.extend_from_slice(&v.to_le_bytes());
}

/// An optional time: `i64::MIN` stands for none (no real time is that far back).
fn put_opt(b: &mut Vec<u8>, v: Option<i64>) {
    put_i64(b, v.unwrap_or(i64::MIN));
}

fn encode(b: &mut Vec<u8>, r: &Rec) {
    match r {
        Rec::Header { version, store_id } => {
            b.push(1);
            put_i64(b, *version);
            put_str(b, store_id);
        }
        Rec::Decision { gtid, outcome, branches, decided_ms, node, source, finished_ms } => {
            b.push(2);
            for s in [gtid, outcome, branches, node, source] {
                put_str(b, s);
            }
            put_i64(b, *decided_ms);
            put_opt(b, *finished_ms);
        }
        Rec::Finished { gtid, at_ms } => {
            b.push(3);
            put_str(b, gtid);
            put_i64(b, *at_ms);
        }
        Rec::Purged { gtid } => {
            b.push(4);
            put_str(b, gtid);
        }
        Rec::Epoch { node, nonce, started_ms } => {
            b.push(5);
            put_str(b, node);
            put_i64(b, *nonce as i64);
            put_i64(b, *started_ms);
        }
        Rec::Watermark { node, nonce, seq, at_ms } => {
            b.push(6);
            put_str(b, node);
            put_i64(b, *nonce as i64);
            put_i64(b, *seq as i64);
            put_i64(b, *at_ms);
        }
        Rec::Sealed { node, nonce, at_ms } => {
            b.push(7);
            put_str(b, node);
            put_i64(b, *nonce as i64);
            put_i64(b, *at_ms);
        }
        Rec::Lease { node, holder, url, generation, expires_ms } => {
            b.push(8);
            for s in [node, holder, url] {
                put_str(b, s);
            }
            put_i64(b, *generation);
            put_i64(b, *expires_ms);
        }
        Rec::Renewed { node, expires_ms } => {
            b.push(9);
            put_str(b, node);
            put_i64(b, *expires_ms);
        }
        Rec::Released { node, holder } => {
            b.push(10);
            put_str(b, node);
            put_str(b, holder);
        }
        Rec::Audit(a) => {
            b.push(11);
            put_i64(b, a.at_unix_ms as i64);
            for s in [&a.gtid, &a.outcome, &a.operator, &a.reason, &a.result] {
                put_str(b, s);
            }
        }
        Rec::Meta { grants, restores, tick } => {
            b.push(12);
            for v in [grants, restores, tick] {
                put_i64(b, *v);
            }
        }
    }
}

/// A record body being read; None when it does not parse.
struct Body<'a>(&'a [u8]);

impl<'a> Body<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn opt(&mut self) -> Option<Option<i64>> {
        self.i64().map(|v| (v != i64::MIN).then_some(v))
    }
    fn str(&mut self) -> Option<String> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

fn decode_one(b: &mut Body) -> Option<Rec> {
    Some(match b.take(1)?[0] {
        1 => Rec::Header { version: b.i64()?, store_id: b.str()? },
        2 => {
            let (gtid, outcome, branches, node, source) = (b.str()?, b.str()?, b.str()?, b.str()?, b.str()?);
            Rec::Decision { gtid, outcome, branches, node, source, decided_ms: b.i64()?, finished_ms: b.opt()? }
        }
        3 => Rec::Finished { gtid: b.str()?, at_ms: b.i64()? },
        4 => Rec::Purged { gtid: b.str()? },
        5 => Rec::Epoch { node: b.str()?, nonce: b.i64()? as u64, started_ms: b.i64()? },
        6 => Rec::Watermark { node: b.str()?, nonce: b.i64()? as u64, seq: b.i64()? as u64, at_ms: b.i64()? },
        7 => Rec::Sealed { node: b.str()?, nonce: b.i64()? as u64, at_ms: b.i64()? },
        8 => {
            let (node, holder, url) = (b.str()?, b.str()?, b.str()?);
            Rec::Lease { node, holder, url, generation: b.i64()?, expires_ms: b.i64()? }
        }
        9 => Rec::Renewed { node: b.str()?, expires_ms: b.i64()? },
        10 => Rec::Released { node: b.str()?, holder: b.str()? },
        11 => {
            let at_unix_ms = b.i64()? as u64;
            let (gtid, outcome, operator, reason, result) = (b.str()?, b.str()?, b.str()?, b.str()?, b.str()?);
            Rec::Audit(AuditEntry { at_unix_ms, gtid, outcome, operator, reason, result })
        }
        12 => Rec::Meta { grants: b.i64()?, restores: b.i64()?, tick: b.i64()? },
        _ => return None,
    })
}

fn checksum(len: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// Appends one frame holding `recs` to `b`.
pub fn frame(b: &mut Vec<u8>, recs: &[Rec]) {
    let start = b.len();
    b.extend_from_slice(&[0u8; FRAME_HEADER]);
    for r in recs {
        encode(b, r);
    }
    let len = (b.len() - start - FRAME_HEADER) as u32;
    let crc = checksum(len, &b[start + FRAME_HEADER..]);
    b[start..start + 4].copy_from_slice(&len.to_le_bytes());
    b[start + 4..start + FRAME_HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// The frame at `at` if a whole, matching one is there: its records and its length.
fn frame_at(bytes: &[u8], at: usize) -> Option<(Vec<Rec>, usize)> {
    let h = bytes.get(at..at + FRAME_HEADER)?;
    let len = u32::from_le_bytes(h[..4].try_into().ok()?) as usize;
    if len == 0 {
        return None;
    }
    let body = bytes.get(at + FRAME_HEADER..(at + FRAME_HEADER).checked_add(len)?)?;
    if checksum(len as u32, body) != u32::from_le_bytes(h[4..].try_into().ok()?) {
        return None;
    }
    let mut b = Body(body);
    let mut recs = vec![];
    while !b.0.is_empty() {
        recs.push(decode_one(&mut b)?);
    }
    Some((recs, FRAME_HEADER + len))
}

/// What reading a log's bytes found.
#[derive(Debug)]
pub struct Scan {
    /// Every whole frame's records, in order.
    pub frames: Vec<Vec<Rec>>,
    /// Where the next frame goes: after the last whole frame.
    pub end: usize,
    /// Bytes written past `end` that are no whole frame, with nothing valid after them:
    /// an unacknowledged batch cut by a crash (its `fdatasync` never returned). Zeroed at
    /// open. `end..torn_to`.
    pub torn_to: Option<usize>,
}

/// Why a log cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub enum Unreadable {
    /// Not a decision log (no magic).
    NotALog,
    /// A bad frame at this offset with a whole frame after it: damage in the middle, not a
    /// crash's torn tail (a crash only ever cuts the last batch).
    Corrupt(usize),
}

/// The format version in the header of `bytes`, read before anything else (a newer
/// daemon's frames after it may not parse here).
pub fn header_version(bytes: &[u8]) -> Option<i64> {
    match frame_at(bytes, MAGIC.len())?.0.first()? {
        Rec::Header { version, .. } => Some(*version),
        _ => None,
    }
}

/// Reads every frame of `bytes` (a whole file, magic first).
pub fn scan(bytes: &[u8]) -> Result<Scan, Unreadable> {
    if bytes.get(..MAGIC.len()) != Some(&MAGIC[..]) {
        return Err(Unreadable::NotALog);
    }
    let mut frames = vec![];
    let mut at = MAGIC.len();
    while let Some((recs, n)) = frame_at(bytes, at) {
        frames.push(recs);
        at += n;
    }
    // Past the last whole frame: zeros (the end), or a torn tail, or damage in the middle
    // if any whole frame follows (looked for at every offset: a torn frame's length may be
    // anything).
    if (at + 1..bytes.len().saturating_sub(FRAME_HEADER)).any(|o| frame_at(bytes, o).is_some()) {
        return Err(Unreadable::Corrupt(at));
    }
    let last = bytes[at..].iter().rposition(|&b| b != 0).map(|i| at + i + 1);
    Ok(Scan { frames, end: at, torn_to: last })
}

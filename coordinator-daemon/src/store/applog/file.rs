//! The log file's I/O: creating a log, reading it back at open (cutting a torn tail,
//! refusing damage in the middle), appending a batch durably (one O_DIRECT | O_DSYNC
//! write, or a write and an fdatasync), and writing a fresh file whole (creation and
//! compaction) by rename.

use super::format::{frame, header_version, scan, Rec, Unreadable, MAGIC};
use super::state::State;
use crate::config::SyncMethod;
use crate::store::error::StoreError;
use crate::store::log::{newer_schema, SCHEMA_VERSION};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Direct writes go in whole blocks at block offsets from block-aligned memory: 4 KiB
/// covers the logical block size of the disks and file systems met in practice (512 B or
/// 4 KiB); a larger one refuses the first write, and the log falls back to fdatasync.
const BLOCK: usize = 4096;

/// The file is zero-filled this far ahead of the writes. A batch then overwrites blocks
/// that are already allocated and synced, so its fdatasync has no file size or extent
/// to journal (as SQLite's reused WAL); growing costs one fsync of the file and one of
/// its directory per chunk.
#[cfg(not(test))]
const CHUNK: u64 = 4 << 20;
/// Unit tests open hundreds of logs (a torn batch cut at every byte): 64 KiB chunks keep
/// each open from writing and syncing 4 MiB of zeros, with the same code paths.
#[cfg(test)]
const CHUNK: u64 = 64 << 10;

pub struct LogFile {
    pub path: String,
    file: File,
    /// The appends' handle with `SyncMethod::Direct` (None: buffered and fdatasync).
    pub(super) direct: Option<Direct>,
    /// Where the next frame goes.
    pub end: u64,
    /// Zero-filled and synced up to here.
    allocated: u64,
    /// The rename that made this file the log is not known durable (its directory sync
    /// failed): nothing is appended until a sync of the directory goes through, so that
    /// no decision is acknowledged in a file a crash could still swap for the old one.
    dir_unsynced: bool,
}

fn unavailable(path: &str, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("decision log {path}: {what}: {e}"))
}

#[cfg(test)]
thread_local! {
    /// Tests: the directory sync after the next rewrite's rename fails, as an EIO from the
    /// disk (or EMFILE opening the directory) would; it goes through afterwards.
    pub static FAIL_RENAME_SYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes `path`'s directory entry (a new file, a rename) durable.
fn sync_dir(path: &str) -> Result<(), StoreError> {
    let dir = Path::new(path).parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| unavailable(path, "syncing its directory", e))
}

/// A new store's state: the current format and a random id (as SQLite's randomblob(16)).
pub fn fresh_state() -> Result<State, StoreError> {
    let mut id = [0u8; 16];
    getrandom::getrandom(&mut id).map_err(|e| StoreError::Unavailable(format!("no random store id: {e}")))?;
    let store_id = id.iter().map(|b| format!("{b:02x}")).collect();
    let mut s = State::default();
    s.apply(&Rec::Header { version: SCHEMA_VERSION, store_id });
    Ok(s)
}

impl LogFile {
    /// Writes `state` as a complete log (file.rs `write_snapshot`).
    pub fn write_fresh(path: &str, state: &State, sync: SyncMethod) -> Result<LogFile, StoreError> {
        let mut snap = vec![];
        frame(&mut snap, &state.snapshot());
        LogFile::write_snapshot(path, &snap, sync)
    }

    /// Writes a complete log, the header and `snap` (a state's snapshot frame), at
    /// `<path>.tmp`, syncs it, renames it over `path` and syncs the directory: whenever a
    /// crash comes, `path` is the old file or the new one, each whole (a `.tmp` left
    /// behind is removed at the next open). A failure removes the `.tmp` at once: a
    /// compaction that ran into a full disk must not keep the space it took from the
    /// running log.
    pub fn write_snapshot(path: &str, snap: &[u8], sync: SyncMethod) -> Result<LogFile, StoreError> {
        let tmp = format!("{path}.tmp");
        LogFile::write_snapshot_at(path, &tmp, snap, sync).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }

    fn write_snapshot_at(path: &str, tmp: &str, snap: &[u8], sync: SyncMethod) -> Result<LogFile, StoreError> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(snap);
        let end = bytes.len() as u64;
        let tail = bytes[end as usize / BLOCK * BLOCK..].to_vec();
        let allocated = (end / CHUNK + 1) * CHUNK;
        bytes.resize(allocated as usize, 0);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(tmp)
            .map_err(|e| unavailable(tmp, "creating", e))?;
        file.write_all_at(&bytes, 0).map_err(|e| unavailable(tmp, "writing", e))?;
        file.sync_all().map_err(|e| unavailable(tmp, "fsync", e))?;
        // Everything that can fail without harm comes before the rename (the direct handle
        // too: the same inode once renamed). After it the file at `path` is this one: the
        // caller must go on in it, never in the old one (unlinked: a restart would not
        // find what it holds from then on).
        let direct = Direct::open(tmp, sync, tail)?;
        std::fs::rename(tmp, path).map_err(|e| unavailable(path, "renaming the new file over it", e))?;
        let synced = sync_dir(path);
        #[cfg(test)]
        let synced = if FAIL_RENAME_SYNC.replace(false) {
            Err(unavailable(path, "syncing its directory", std::io::Error::from_raw_os_error(libc::EIO)))
        } else {
            synced
        };
        if let Err(e) = &synced {
            tracing::warn!(store = path, error = %e, "decision log: the new file's rename is not synced yet; retried before the next write");
        }
        Ok(LogFile { path: path.to_string(), file, direct, end, allocated, dir_unsynced: synced.is_err() })
    }

    /// Opens the log at `path` (made if missing) and replays it into a state.
    pub fn open(path: &str, sync: SyncMethod) -> Result<(LogFile, State), StoreError> {
        let _ = std::fs::remove_file(format!("{path}.tmp"));
        if !Path::new(path).exists() {
            let s = fresh_state()?;
            return Ok((LogFile::write_fresh(path, &s, sync)?, s));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| unavailable(path, "cannot open", e))?;
        let len = file.metadata().map_err(|e| unavailable(path, "stat", e))?.len();
        let mut bytes = vec![0u8; len as usize];
        file.read_exact_at(&mut bytes, 0).map_err(|e| unavailable(path, "reading", e))?;
        // A log of a newer format is refused before anything reads (or cuts) the rest.
        if let Some(v) = header_version(&bytes).filter(|v| *v > SCHEMA_VERSION) {
            return Err(StoreError::NewerSchema(newer_schema(path, v)));
        }
        let sc = scan(&bytes).map_err(|u| match u {
            Unreadable::NotALog => StoreError::Unavailable(format!(
                "{path} is not a cotx decision log (it does not begin with the log's header); nothing was changed"
            )),
            Unreadable::Corrupt(at) => StoreError::Unavailable(format!(
                "decision log {path} is damaged at byte offset {at}: a record there does not match its checksum \
                 and whole records follow it (not a torn tail left by a crash); nothing was changed: \
                 restore the file from a copy and run mark-restored"
            )),
        })?;
        let mut state = State::default();
        match sc.frames.first().and_then(|f| f.first()) {
            Some(Rec::Header { .. }) => {}
            _ => {
                return Err(StoreError::Unavailable(format!(
                    "decision log {path} has no header record; nothing was changed"
                )))
            }
        }
        for r in sc.frames.iter().flatten() {
            state.apply(r);
        }
        let tail = bytes[sc.end / BLOCK * BLOCK..sc.end].to_vec();
        let direct = Direct::open(path, sync, tail)?;
        let f =
            LogFile { path: path.to_string(), file, direct, end: sc.end as u64, allocated: len, dir_unsynced: false };
        if let Some(to) = sc.torn_to {
            // A batch whose fdatasync never returned (nobody was told it happened): cut,
            // so that the next batch is not read as following damage.
            tracing::warn!(store = path, offset = sc.end, bytes = to - sc.end, "decision log: torn last batch dropped");
            f.file
                .write_all_at(&vec![0u8; to - sc.end], f.end)
                .and_then(|_| f.file.sync_data())
                .map_err(|e| unavailable(path, "cutting the torn last batch", e))?;
        }
        Ok((f, state))
    }

    /// The sync method in use (Direct may have fallen back to Fdatasync).
    pub fn sync_method(&self) -> SyncMethod {
        if self.direct.is_some() {
            SyncMethod::Direct
        } else {
            SyncMethod::Fdatasync
        }
    }

    /// Appends one batch's frame durably: one direct write, or one write and one
    /// fdatasync. On an error nothing counts as written (the next batch goes to the same
    /// place).
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        if self.dir_unsynced {
            sync_dir(&self.path)?;
            self.dir_unsynced = false;
        }
        let need = self.end + bytes.len() as u64;
        if need > self.allocated {
            self.grow(need)?;
        }
        if let Some(d) = &mut self.direct {
            match d.append(self.end, bytes) {
                Ok(()) => {
                    self.end = need;
                    return Ok(());
                }
                // The file system or the device refuses this alignment: written nothing
                // that counts; from now on buffered writes and fdatasync.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(store = self.path, error = %e,
                        "decision log: direct write refused; falling back to write + fdatasync");
                    self.direct = None;
                }
                Err(e) => return Err(unavailable(&self.path, "append (O_DIRECT | O_DSYNC)", e)),
            }
        }
        self.file.write_all_at(bytes, self.end).map_err(|e| unavailable(&self.path, "append", e))?;
        self.file.sync_data().map_err(|e| unavailable(&self.path, "fdatasync", e))?;
        self.end = need;
        Ok(())
    }

    fn grow(&mut self, need: u64) -> Result<(), StoreError> {
        let to = (need / CHUNK + 1) * CHUNK;
        let zeros = vec![0u8; (to - self.allocated) as usize];
        self.file.write_all_at(&zeros, self.allocated).map_err(|e| unavailable(&self.path, "preallocating", e))?;
        self.file.sync_all().map_err(|e| unavailable(&self.path, "fsync", e))?;
        sync_dir(&self.path)?;
        self.allocated = to;
        Ok(())
    }
}

/// The O_DIRECT | O_DSYNC handle, and a copy of the file's last, partly filled block:
/// each append rewrites that block with the new frame after it (the same bytes where it
/// had some, zeros after the frame where the file has zeros), so that every write is whole
/// blocks at a block offset.
pub(super) struct Direct {
    file: File,
    /// The file's bytes from the last block boundary at or before `end` up to `end`.
    tail: Vec<u8>,
    /// Scratch, over-allocated by a block to hold a block-aligned slice.
    buf: Vec<u8>,
    /// Tests: moves the writes off the block boundary, which the kernel refuses (EINVAL)
    /// as a file system without direct I/O for this alignment would.
    #[cfg(test)]
    pub misalign: bool,
}

impl Direct {
    /// The direct handle for `sync = Direct`; None for `Fdatasync`, or where the file
    /// system refuses O_DIRECT at open (tmpfs: EINVAL), said once in the log.
    fn open(path: &str, sync: SyncMethod, tail: Vec<u8>) -> Result<Option<Direct>, StoreError> {
        if sync != SyncMethod::Direct {
            return Ok(None);
        }
        match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT | libc::O_DSYNC).open(path) {
            Ok(file) => Ok(Some(Direct {
                file,
                tail,
                buf: Vec::with_capacity(16 * BLOCK),
                #[cfg(test)]
                misalign: false,
            })),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(store = path, error = %e,
                    "decision log: the file system refuses O_DIRECT; each batch is written and fdatasync'd");
                Ok(None)
            }
            Err(e) => Err(unavailable(path, "opening for direct writes", e)),
        }
    }

    /// Writes `bytes` at `end` (the tail's end) and the tail before it, in whole blocks;
    /// O_DSYNC makes it durable when the call returns. The tail moves on only then.
    fn append(&mut self, end: u64, bytes: &[u8]) -> std::io::Result<()> {
        let head = self.tail.len();
        let used = head + bytes.len();
        let len = used.div_ceil(BLOCK) * BLOCK;
        self.buf.clear();
        self.buf.resize(len + BLOCK, 0);
        let at = self.buf.as_ptr().align_offset(BLOCK);
        let b = &mut self.buf[at..at + len];
        b[..head].copy_from_slice(&self.tail);
        b[head..used].copy_from_slice(bytes);
        #[cfg(test)]
        let end = end + self.misalign as u64;
        self.file.write_all_at(b, end - head as u64)?;
        let kept = used % BLOCK;
        self.tail.clear();
        self.tail.extend_from_slice(&b[used - kept..used]);
        Ok(())
    }
}

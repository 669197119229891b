//! The log file's I/O: creating a log, reading it back at open (cutting a torn tail,
//! refusing damage in the middle), appending a batch with one write and one fdatasync,
//! and writing a fresh file whole (creation and compaction) by rename.

use super::format::{frame, header_version, scan, Rec, Unreadable, MAGIC};
use super::state::State;
use crate::store::error::StoreError;
use crate::store::log::{newer_schema, SCHEMA_VERSION};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
    /// Where the next frame goes.
    pub end: u64,
    /// Zero-filled and synced up to here.
    allocated: u64,
}

fn unavailable(path: &str, what: &str, e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("decision log {path}: {what}: {e}"))
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
    /// Writes `state` as a complete log at `<path>.tmp`, syncs it, renames it over `path`
    /// and syncs the directory: whenever a crash comes, `path` is the old file or the new
    /// one, each whole (a `.tmp` left behind is removed at the next open).
    pub fn write_fresh(path: &str, state: &State) -> Result<LogFile, StoreError> {
        let tmp = format!("{path}.tmp");
        let mut bytes = MAGIC.to_vec();
        frame(&mut bytes, &state.snapshot());
        let end = bytes.len() as u64;
        let allocated = (end / CHUNK + 1) * CHUNK;
        bytes.resize(allocated as usize, 0);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| unavailable(&tmp, "creating", e))?;
        file.write_all_at(&bytes, 0).map_err(|e| unavailable(&tmp, "writing", e))?;
        file.sync_all().map_err(|e| unavailable(&tmp, "fsync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| unavailable(path, "renaming the new file over it", e))?;
        sync_dir(path)?;
        Ok(LogFile { path: path.to_string(), file, end, allocated })
    }

    /// Opens the log at `path` (made if missing) and replays it into a state.
    pub fn open(path: &str) -> Result<(LogFile, State), StoreError> {
        let _ = std::fs::remove_file(format!("{path}.tmp"));
        if !Path::new(path).exists() {
            let s = fresh_state()?;
            return Ok((LogFile::write_fresh(path, &s)?, s));
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
        let f = LogFile { path: path.to_string(), file, end: sc.end as u64, allocated: len };
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

    /// Appends one batch's frame: one write, one fdatasync. On an error nothing counts as
    /// written (the next batch goes to the same place).
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let need = self.end + bytes.len() as u64;
        if need > self.allocated {
            self.grow(need)?;
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

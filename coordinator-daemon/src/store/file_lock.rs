//! One process per store file: the lock both file stores (SQLite, the log) take at open.

use crate::store::error::StoreError;

/// Takes the one-process lock of the store file at `path` (`kind`: how the refusal names
/// it): an exclusive lock on `<path>.lock`, held for the life of the process (the kernel
/// drops it when the process dies, even by kill -9). The SQLite store and the log
/// store (store/applog) both take it.
pub fn lock_store(path: &str, kind: &str) -> Result<std::fs::File, StoreError> {
    let lock_path = format!("{path}.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|x| StoreError::Unavailable(format!("cannot open {lock_path}: {x}")))?;
    if let Err(x) = lock.try_lock() {
        return Err(StoreError::Conflict(format!(
            "decision store {path} is in use by another process ({lock_path} is locked: {x}); \
             one daemon per {kind} store — give each daemon its own store, or share a PostgreSQL store"
        )));
    }
    Ok(lock)
}

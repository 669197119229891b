//! Opening the SQLite store: the one-process lock, the refusal of a newer schema, WAL
//! with synchronous=FULL, and the schema made or brought up to date in place (columns
//! added by later versions, the meta row of schema version 2).

use crate::store::error::StoreError;
use crate::store::log::{newer_schema, SCHEMA_VERSION};
use rusqlite::Connection;

fn e(x: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {x}"))
}

/// The connection to a store made or brought up to date, and the lock file held for the
/// life of the process.
pub(super) fn open(path: &str) -> Result<(Connection, std::fs::File), StoreError> {
    let lock = crate::store::file_lock::lock_store(path, "SQLite")?;
    let conn = Connection::open(path)
        .map_err(|x| StoreError::Unavailable(format!("cannot open decision store {path}: {x}")))?;
    // A store of a newer schema is refused before anything touches it.
    let has_meta: bool = conn
        .query_row("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'meta'", [], |r| r.get(0))
        .map_err(|x| StoreError::Unavailable(format!("cannot read decision store {path}: {x}")))?;
    if has_meta {
        let v: i64 = conn.query_row("SELECT schema_version FROM meta WHERE id = 1", [], |r| r.get(0)).map_err(e)?;
        if v > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema(newer_schema(path, v)));
        }
    }
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(e)?;
    if mode.to_lowercase() != "wal" {
        return Err(StoreError::Unavailable(format!("decision store {path}: cannot switch to WAL (got {mode})")));
    }
    conn.execute_batch(
        "PRAGMA synchronous=FULL;
         PRAGMA busy_timeout=5000;
         CREATE TABLE IF NOT EXISTS decisions(
            gtid TEXT PRIMARY KEY, outcome TEXT NOT NULL, branches TEXT NOT NULL,
            decided_ms INTEGER NOT NULL, node TEXT NOT NULL, source TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS audit(
            id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, gtid TEXT NOT NULL, outcome TEXT NOT NULL,
            operator TEXT NOT NULL, reason TEXT NOT NULL, result TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS epochs(
            node TEXT NOT NULL, nonce INTEGER NOT NULL, started_ms INTEGER NOT NULL, PRIMARY KEY(node, nonce));
         CREATE TABLE IF NOT EXISTS nodes(
            node TEXT PRIMARY KEY, holder TEXT NOT NULL, url TEXT NOT NULL, expires_ms INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS meta(id INTEGER PRIMARY KEY CHECK (id = 1), schema_version INTEGER NOT NULL,
            store_id TEXT NOT NULL, restores INTEGER NOT NULL DEFAULT 0, restored_ms INTEGER, tick INTEGER NOT NULL DEFAULT 0);",
    )
    .map_err(e)?;
    // Lease generations, finished records kept for the retention, purge watermarks
    // (cotx_protocol): added in place to a store made by an older version.
    for (table, column, decl) in [
        ("nodes", "generation", "INTEGER NOT NULL DEFAULT 0"),
        ("decisions", "finished_ms", "INTEGER"),
        ("epochs", "purged_seq", "INTEGER"),
        ("epochs", "sealed_ms", "INTEGER"),
    ] {
        let has: bool = conn
            .query_row(
                &format!("SELECT count(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
                [column],
                |r| r.get(0),
            )
            .map_err(e)?;
        if !has {
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}")).map_err(e)?;
        }
    }
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS decisions_finished ON decisions(finished_ms) WHERE finished_ms IS NOT NULL",
    )
    .map_err(e)?;
    // A store without a meta row (new, or made by 0.1.0) gets one; then it is current.
    conn.execute_batch(&format!(
        "INSERT OR IGNORE INTO meta(id, schema_version, store_id) VALUES (1, {SCHEMA_VERSION}, lower(hex(randomblob(16))));
         UPDATE meta SET schema_version = {SCHEMA_VERSION} WHERE id = 1;"
    ))
    .map_err(e)?;
    Ok((conn, lock))
}

#[cfg(test)]
mod tests {
    use super::super::tests::tmpdir;
    use super::super::SqliteLog;
    use super::*;
    use crate::state::Outcome;
    use crate::store::{DecisionLog, Stored};

    /// A store made by release 0.1.0 (tests/store-0.1.0) is brought up to date in place:
    /// its records answer as before, it gets a meta row, and a second open changes nothing.
    #[test]
    fn a_store_of_release_0_1_0_is_upgraded_in_place() {
        let d = tmpdir("v010");
        let path = d.join("s.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(include_str!("../../../tests/store-0.1.0/sqlite.sql")).unwrap();
            c.execute_batch(
                "INSERT INTO decisions VALUES ('n.00000000000a-1', 'commit', '[[\"pg\",\"b1\"]]', 1, 'n', 'coordinator');
                 INSERT INTO epochs VALUES ('n', 10, 1);",
            )
            .unwrap();
        }
        let mut l = SqliteLog::open(path.to_str().unwrap()).unwrap();
        assert!(matches!(l.get("n.00000000000a-1").unwrap(), Stored::Record(r) if r.outcome == Outcome::Commit));
        assert_eq!(l.get("n.00000000000a-2").unwrap(), Stored::Absent { forgotten: false });
        assert_eq!(l.load().unwrap().epochs, vec![("n".to_string(), 10)]);
        let id = l.identity().unwrap();
        assert_eq!(id.store_id.len(), 32);
        let v: i64 = l.conn.query_row("SELECT schema_version FROM meta", [], |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        drop(l);
        let mut l = SqliteLog::open(path.to_str().unwrap()).unwrap();
        assert_eq!(l.identity().unwrap(), id, "a second open keeps the store's identity");
    }

    /// A store written by a newer daemon is refused before anything is changed in it.
    #[test]
    fn a_store_of_a_newer_schema_is_refused_untouched() {
        let d = tmpdir("newer");
        let path = d.join("s.db");
        drop(SqliteLog::open(path.to_str().unwrap()).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute_batch("UPDATE meta SET schema_version = 99; CREATE TABLE later(x)")
            .unwrap();
        let err = SqliteLog::open(path.to_str().unwrap()).err().unwrap();
        assert!(matches!(err, StoreError::NewerSchema(_)), "{err}");
        let err = err.to_string();
        assert!(err.contains("schema version 99") && err.contains("newer cotx-coordinator"), "{err}");
        let v: i64 =
            Connection::open(&path).unwrap().query_row("SELECT schema_version FROM meta", [], |r| r.get(0)).unwrap();
        assert_eq!(v, 99);
    }

    /// A second process (here: a second open) on the same file is refused by name.
    #[test]
    fn one_process_per_store_file() {
        let d = tmpdir("lock");
        let p = d.join("s.db");
        let l = SqliteLog::open(p.to_str().unwrap()).unwrap();
        let err = SqliteLog::open(p.to_str().unwrap()).err().expect("second open must be refused");
        assert!(matches!(err, StoreError::Conflict(_)), "{err}");
        let err = err.to_string();
        assert!(err.contains("in use by another process"), "{err}");
        drop(l);
        SqliteLog::open(p.to_str().unwrap()).unwrap();
    }
}

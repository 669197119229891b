//! Embedded decision store: one SQLite file in WAL mode with synchronous=FULL, so a
//! transaction is on disk (WAL fsynced) when COMMIT returns. A crash mid-write leaves a
//! torn WAL tail that SQLite ignores on open (frame checksums): the last, unacknowledged
//! batch is lost, every acknowledged one stays.

use super::{branches_from_json, branches_to_json, AuditEntry, DecisionLog, DecisionRecord, Op, OpResult};
use crate::state::Outcome;
use rusqlite::{params, Connection};
#[cfg(test)]
use rusqlite::OptionalExtension;

pub struct SqliteLog {
    conn: Connection,
}

fn e(x: rusqlite::Error) -> String {
    format!("sqlite: {x}")
}

impl SqliteLog {
    pub fn open(path: &str) -> Result<SqliteLog, String> {
        let conn = Connection::open(path).map_err(|x| format!("cannot open decision store {path}: {x}"))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(e)?;
        if mode.to_lowercase() != "wal" {
            return Err(format!("decision store {path}: cannot switch to WAL (got {mode})"));
        }
        conn.execute_batch(
            "PRAGMA synchronous=FULL;
             PRAGMA busy_timeout=5000;
             CREATE TABLE IF NOT EXISTS decisions(
                gtid TEXT PRIMARY KEY, outcome TEXT NOT NULL, branches TEXT NOT NULL,
                decided_ms INTEGER NOT NULL, node TEXT NOT NULL, source TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS audit(
                id INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, gtid TEXT NOT NULL, outcome TEXT NOT NULL,
                operator TEXT NOT NULL, reason TEXT NOT NULL, result TEXT NOT NULL);",
        )
        .map_err(e)?;
        Ok(SqliteLog { conn })
    }

    fn apply(tx: &rusqlite::Transaction, op: &Op) -> Result<OpResult, rusqlite::Error> {
        Ok(match op {
            Op::Decide(r) => {
                let n = tx.execute(
                    "INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES (?1,?2,?3,?4,?5,?6)
                     ON CONFLICT(gtid) DO NOTHING",
                    params![r.gtid, r.outcome.as_str(), branches_to_json(&r.branches), r.decided_unix_ms as i64, r.node, r.source],
                )?;
                if n == 1 {
                    OpResult::Decided(r.outcome)
                } else {
                    let o: String = tx.query_row("SELECT outcome FROM decisions WHERE gtid = ?1", [&r.gtid], |x| x.get(0))?;
                    OpResult::Decided(Outcome::parse(&o).unwrap_or(Outcome::Abort))
                }
            }
            Op::Forget(g) => {
                tx.execute("DELETE FROM decisions WHERE gtid = ?1", [g])?;
                OpResult::Done
            }
            Op::Audit(a) => {
                tx.execute(
                    "INSERT INTO audit(at_ms, gtid, outcome, operator, reason, result) VALUES (?1,?2,?3,?4,?5,?6)",
                    params![a.at_unix_ms as i64, a.gtid, a.outcome, a.operator, a.reason, a.result],
                )?;
                OpResult::Done
            }
        })
    }

    #[cfg(test)]
    pub fn get(&mut self, gtid: &str) -> Result<Option<Outcome>, String> {
        let o: Option<String> = self
            .conn
            .query_row("SELECT outcome FROM decisions WHERE gtid = ?1", [gtid], |r| r.get(0))
            .optional()
            .map_err(e)?;
        Ok(o.and_then(|s| Outcome::parse(&s)))
    }
}

impl DecisionLog for SqliteLog {
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, String> {
        let tx = self.conn.transaction().map_err(e)?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(Self::apply(&tx, op).map_err(e)?);
        }
        // One COMMIT = one WAL fsync for the whole batch (synchronous=FULL).
        tx.commit().map_err(e)?;
        Ok(out)
    }

    fn load(&mut self) -> Result<Vec<DecisionRecord>, String> {
        let mut st = self
            .conn
            .prepare("SELECT gtid, outcome, branches, decided_ms, node, source FROM decisions ORDER BY decided_ms")
            .map_err(e)?;
        let rows = st
            .query_map([], |r| {
                Ok(DecisionRecord {
                    gtid: r.get(0)?,
                    outcome: Outcome::parse(&r.get::<_, String>(1)?).unwrap_or(Outcome::Abort),
                    branches: branches_from_json(&r.get::<_, String>(2)?),
                    decided_unix_ms: r.get::<_, i64>(3)? as u64,
                    node: r.get(4)?,
                    source: r.get(5)?,
                })
            })
            .map_err(e)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(e)
    }

    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, String> {
        let mut st = self
            .conn
            .prepare("SELECT at_ms, gtid, outcome, operator, reason, result FROM audit ORDER BY id")
            .map_err(e)?;
        let rows = st
            .query_map([], |r| {
                Ok(AuditEntry {
                    at_unix_ms: r.get::<_, i64>(0)? as u64,
                    gtid: r.get(1)?,
                    outcome: r.get(2)?,
                    operator: r.get(3)?,
                    reason: r.get(4)?,
                    result: r.get(5)?,
                })
            })
            .map_err(e)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cotx-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn rec(g: &str, o: Outcome) -> DecisionRecord {
        DecisionRecord {
            gtid: g.into(),
            outcome: o,
            branches: vec![("pg".into(), "b1".into()), ("m".into(), "b2".into())],
            decided_unix_ms: 1,
            node: "n".into(),
            source: "coordinator".into(),
        }
    }

    #[test]
    fn conditional_insert_keeps_first_decision() {
        let d = tmpdir("cond");
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        let r = l.write_batch(&[Op::Decide(rec("g1", Outcome::Commit)), Op::Decide(rec("g1", Outcome::Abort))]).unwrap();
        assert_eq!(r, vec![OpResult::Decided(Outcome::Commit), OpResult::Decided(Outcome::Commit)]);
        let all = l.load().unwrap();
        assert_eq!(all, vec![rec("g1", Outcome::Commit)]);
        l.write_batch(&[Op::Forget("g1".into())]).unwrap();
        assert!(l.load().unwrap().is_empty());
        drop(l);
        // Survives reopen (and a forgotten record stays forgotten).
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        assert!(l.load().unwrap().is_empty());
        assert_eq!(l.get("g1").unwrap(), None);
    }

    /// A crash in the middle of writing the last batch tears the WAL's tail. The store
    /// must open, keep every acknowledged batch, and drop the torn one.
    #[test]
    fn torn_final_write() {
        let d = tmpdir("torn");
        let db = d.join("s.db");
        let wal = d.join("s.db-wal");
        let mut l = SqliteLog::open(db.to_str().unwrap()).unwrap();
        l.conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
        let batch_a: Vec<Op> = (0..20).map(|i| Op::Decide(rec(&format!("a{i}"), Outcome::Commit))).collect();
        l.write_batch(&batch_a).unwrap();
        let len_a = std::fs::metadata(&wal).unwrap().len();
        let batch_b: Vec<Op> = (0..20).map(|i| Op::Decide(rec(&format!("b{i}"), Outcome::Commit))).collect();
        l.write_batch(&batch_b).unwrap();
        let len_b = std::fs::metadata(&wal).unwrap().len();
        assert!(len_b > len_a);
        // "Crash": copy the files as they are on disk while the store is open, with the
        // last batch's WAL frames cut in the middle.
        let crash = d.join("crash");
        std::fs::create_dir_all(&crash).unwrap();
        std::fs::copy(&db, crash.join("s.db")).unwrap();
        let mut bytes = std::fs::read(&wal).unwrap();
        bytes.truncate((len_a + (len_b - len_a) / 2) as usize);
        std::fs::write(crash.join("s.db-wal"), &bytes).unwrap();
        drop(l);
        let mut l = SqliteLog::open(crash.join("s.db").to_str().unwrap()).unwrap();
        let got: Vec<String> = l.load().unwrap().into_iter().map(|r| r.gtid).collect();
        assert_eq!(got.len(), 20, "{got:?}");
        assert!(got.iter().all(|g| g.starts_with('a')));
        // And the store keeps working after the torn tail.
        l.write_batch(&[Op::Decide(rec("c1", Outcome::Commit))]).unwrap();
        assert_eq!(l.load().unwrap().len(), 21);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_on_sqlite() {
        let d = tmpdir("gc");
        let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 1024);
        let mut hs = vec![];
        for i in 0..400 {
            let s = store.clone();
            hs.push(tokio::spawn(async move { s.decide(rec(&format!("g{i}"), Outcome::Commit)).await }));
        }
        for h in hs {
            assert_eq!(h.await.unwrap().unwrap(), Outcome::Commit);
        }
        let batches = store.stats.batches.load(std::sync::atomic::Ordering::Relaxed);
        assert!(batches < 400, "expected fewer syncs than decisions, got {batches}");
        assert_eq!(store.load().await.unwrap().len(), 400);
    }
}

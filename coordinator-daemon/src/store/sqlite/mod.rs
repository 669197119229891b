//! Embedded decision store: one SQLite file in WAL mode with synchronous=FULL, so a
//! transaction is on disk (WAL fsynced) when COMMIT returns. A crash mid-write leaves a
//! torn WAL tail that SQLite ignores on open (frame checksums): the last, unacknowledged
//! batch is lost, every acknowledged one stays.

//!
//! One process per file: an exclusive lock on `<path>.lock` is taken at open and held for
//! the life of the process (the kernel drops it when the process dies, even by kill -9),
//! so a second daemon pointed at the same file refuses to start instead of sharing it.

mod schema;

use crate::state::unix_ms;
use crate::store::log::{
    existing_outcome, Claim, DecisionLog, Identity, NodeLease, Op, OpResult, Renewal, Restored, Token,
    RESTORE_GRANT_JUMP,
};
use crate::store::record::{
    branches_to_json, gtid_seq, loaded_from, parse_row, purge_watermarks, AuditEntry, Loaded, Stored,
};
use cotx_protocol::lease;
use rusqlite::{params, Connection};

pub struct SqliteLog {
    conn: Connection,
    _lock: std::fs::File,
}

fn e(x: rusqlite::Error) -> String {
    format!("sqlite: {x}")
}

impl SqliteLog {
    /// Opens (or makes) the store at `path`: schema.rs.
    pub fn open(path: &str) -> Result<SqliteLog, String> {
        let (conn, lock) = schema::open(path)?;
        Ok(SqliteLog { conn, _lock: lock })
    }

    fn rows(&self, filter: &str, arg: Option<&str>) -> Result<Vec<Stored>, String> {
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT gtid, outcome, branches, decided_ms, node, source FROM decisions {filter} ORDER BY decided_ms"
            ))
            .map_err(e)?;
        let map = |r: &rusqlite::Row| {
            Ok(parse_row(r.get(0)?, &r.get::<_, String>(1)?, &r.get::<_, String>(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        };
        let rows = match arg {
            Some(a) => st.query_map([a], map),
            None => st.query_map([], map),
        }
        .map_err(e)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(e)
    }

    fn lease_row(conn: &Connection, node: &str) -> Result<Option<lease::Row>, rusqlite::Error> {
        let now = unix_ms() as i64;
        match conn
            .prepare_cached("SELECT holder, generation, expires_ms FROM nodes WHERE node = ?1")?
            .query_row([node], |r| {
                Ok(lease::Row { holder: r.get(0)?, generation: r.get(1)?, expires_in_ms: r.get::<_, i64>(2)? - now })
            }) {
            Ok(r) => Ok(Some(r)),
            Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
            Err(x) => Err(x),
        }
    }

    /// Whether a missing record of gtid may have existed: at or below its epoch's purge
    /// watermark, or of an epoch sealed by a restore (cotx_protocol::answer::unknown_if_absent).
    fn purged(conn: &Connection, gtid: &str) -> Result<bool, rusqlite::Error> {
        let (Some((node, nonce)), Some(seq)) = (crate::naming::gtid_epoch(gtid), gtid_seq(gtid)) else {
            return Ok(false);
        };
        let (w, sealed): (Option<i64>, bool) = match conn
            .prepare_cached("SELECT purged_seq, sealed_ms IS NOT NULL FROM epochs WHERE node = ?1 AND nonce = ?2")?
            .query_row(params![node, nonce as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        {
            Ok(x) => x,
            Err(rusqlite::Error::QueryReturnedNoRows) => (None, false),
            Err(x) => return Err(x),
        };
        Ok(cotx_protocol::answer::unknown_if_absent(seq, w.map(|w| w as u64), sealed))
    }

    fn tick(conn: &Connection) -> Result<(), rusqlite::Error> {
        conn.prepare_cached("UPDATE meta SET tick = tick + 1 WHERE id = 1")?.execute([]).map(|_| ())
    }

    fn apply(tx: &rusqlite::Transaction, op: &Op) -> Result<OpResult, rusqlite::Error> {
        Ok(match op {
            Op::Decide(r, fence) => {
                let existing: Option<String> = match tx
                    .prepare_cached("SELECT outcome FROM decisions WHERE gtid = ?1")?
                    .query_row([&r.gtid], |x| x.get(0))
                {
                    Ok(o) => Some(o),
                    Err(rusqlite::Error::QueryReturnedNoRows) => None,
                    Err(x) => return Err(x),
                };
                if let Some(o) = existing {
                    return Ok(existing_outcome(&o));
                }
                // Below the purge watermark no decision is written any more.
                if Self::purged(tx, &r.gtid)? {
                    return Ok(OpResult::Forgotten);
                }
                if let Some(f) = fence {
                    let owner = crate::naming::gtid_node(&r.gtid).unwrap_or_default();
                    if !lease::admits(Self::lease_row(tx, owner)?.as_ref(), f) {
                        return Ok(OpResult::Fenced(format!(
                            "the lease of node {owner} is no longer grant {} of {}",
                            f.generation, f.holder
                        )));
                    }
                }
                // No row (read above, in this transaction of the store's only writer).
                tx.prepare_cached("INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES (?1,?2,?3,?4,?5,?6)")?.execute(
                    params![r.gtid, r.outcome.as_str(), branches_to_json(&r.branches), r.decided_unix_ms as i64, r.node, r.source],
                )?;
                OpResult::Decided(r.outcome)
            }
            Op::Overwrite(r) => {
                tx.execute(
                    "INSERT OR REPLACE INTO decisions(gtid, outcome, branches, decided_ms, node, source, finished_ms) VALUES (?1,?2,?3,?4,?5,?6,NULL)",
                    params![r.gtid, r.outcome.as_str(), branches_to_json(&r.branches), r.decided_unix_ms as i64, r.node, r.source],
                )?;
                OpResult::Decided(r.outcome)
            }
            Op::RegisterEpoch { node, nonce } => {
                tx.execute(
                    "INSERT OR IGNORE INTO epochs(node, nonce, started_ms) VALUES (?1, ?2, ?3)",
                    params![node, *nonce as i64, unix_ms() as i64],
                )?;
                OpResult::Done
            }
            Op::Forget(g) => {
                tx.prepare_cached("UPDATE decisions SET finished_ms = ?2 WHERE gtid = ?1 AND finished_ms IS NULL")?
                    .execute(params![g, unix_ms() as i64])?;
                OpResult::Done
            }
            Op::Purge { older_than_ms } => {
                let cutoff = unix_ms() as i64 - *older_than_ms as i64;
                let gtids: Vec<String> = {
                    let mut st = tx.prepare(
                        "SELECT gtid FROM decisions WHERE finished_ms < ?1 ORDER BY finished_ms LIMIT 10000",
                    )?;
                    let v = st.query_map([cutoff], |r| r.get(0))?.collect::<Result<Vec<String>, _>>()?;
                    v
                };
                for ((node, nonce), w) in purge_watermarks(&gtids) {
                    tx.execute(
                        "INSERT INTO epochs(node, nonce, started_ms, purged_seq) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT(node, nonce) DO UPDATE SET purged_seq = max(coalesce(purged_seq, 0), excluded.purged_seq)",
                        params![node, nonce as i64, unix_ms() as i64, w as i64],
                    )?;
                }
                for g in &gtids {
                    tx.execute("DELETE FROM decisions WHERE gtid = ?1", [g])?;
                }
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

    fn load(&mut self) -> Result<Loaded, String> {
        let rows = self.rows("WHERE finished_ms IS NULL OR outcome NOT IN ('commit', 'abort')", None)?;
        let mut st = self.conn.prepare("SELECT node, nonce FROM epochs").map_err(e)?;
        let epochs = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
            .map_err(e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(e)?;
        Ok(loaded_from(rows, epochs))
    }

    fn get(&mut self, gtid: &str) -> Result<Stored, String> {
        if let Some(s) = self.rows("WHERE gtid = ?1", Some(gtid))?.into_iter().next() {
            return Ok(s);
        }
        Ok(Stored::Absent { forgotten: Self::purged(&self.conn, gtid).map_err(e)? })
    }

    /// The file lock already makes this process the store's only user: the claim is
    /// recorded (for `nodes`) and always granted, under a new generation.
    fn claim_node(
        &mut self,
        node: &str,
        holder: &str,
        url: &str,
        ttl_ms: u64,
        _fence_expired: bool,
    ) -> Result<Claim, String> {
        let tx = self.conn.transaction().map_err(e)?;
        let g: i64 = tx
            .query_row(
                "INSERT INTO counters(name, value) VALUES ('grants', 1) ON CONFLICT(name) DO UPDATE SET value = value + 1 RETURNING value",
                [],
                |r| r.get(0),
            )
            .map_err(e)?;
        tx.execute(
            "INSERT OR REPLACE INTO nodes(node, holder, url, expires_ms, generation) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![node, holder, url, (unix_ms() + ttl_ms) as i64, g],
        )
        .map_err(e)?;
        Self::tick(&tx).map_err(e)?;
        tx.commit().map_err(e)?;
        Ok(Claim::Granted(g))
    }

    fn renew_node(&mut self, node: &str, t: &Token, ttl_ms: u64) -> Result<Renewal, String> {
        let v = lease::renewal(Self::lease_row(&self.conn, node).map_err(e)?.as_ref(), t);
        if v == Renewal::Renewed {
            let tx = self.conn.transaction().map_err(e)?;
            tx.execute("UPDATE nodes SET expires_ms = ?2 WHERE node = ?1", params![node, (unix_ms() + ttl_ms) as i64])
                .map_err(e)?;
            Self::tick(&tx).map_err(e)?;
            tx.commit().map_err(e)?;
        }
        Ok(v)
    }

    fn release_node(&mut self, node: &str, holder: &str, _forget: bool) -> Result<(), String> {
        self.conn.execute("DELETE FROM nodes WHERE node = ?1 AND holder = ?2", params![node, holder]).map_err(e)?;
        Ok(())
    }

    fn nodes(&mut self) -> Result<Vec<NodeLease>, String> {
        let now = unix_ms() as i64;
        let mut st = self.conn.prepare("SELECT node, holder, url, expires_ms FROM nodes ORDER BY node").map_err(e)?;
        let rows = st
            .query_map([], |r| {
                Ok(NodeLease {
                    node: r.get(0)?,
                    holder: r.get(1)?,
                    url: r.get(2)?,
                    expires_in_ms: r.get::<_, i64>(3)? - now,
                })
            })
            .map_err(e)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(e)
    }

    fn identity(&mut self) -> Result<Identity, String> {
        self.conn
            .query_row("SELECT store_id, restores, tick FROM meta WHERE id = 1", [], |r| {
                Ok(Identity { store_id: r.get(0)?, restores: r.get(1)?, tick: r.get(2)? })
            })
            .map_err(e)
    }

    /// The file lock held since open makes this process the store's only user: no daemon
    /// runs on it meanwhile.
    fn mark_restored(&mut self) -> Result<Restored, String> {
        let tx = self.conn.transaction().map_err(e)?;
        let now = unix_ms() as i64;
        let sealed = tx.execute("UPDATE epochs SET sealed_ms = ?1 WHERE sealed_ms IS NULL", [now]).map_err(e)? as u64;
        tx.execute(
            "INSERT INTO counters(name, value) VALUES ('grants', ?1) ON CONFLICT(name) DO UPDATE SET value = value + ?1",
            [RESTORE_GRANT_JUMP],
        )
        .map_err(e)?;
        let restores: i64 = tx
            .query_row("UPDATE meta SET restores = restores + 1, restored_ms = ?1, tick = tick + 1 WHERE id = 1 RETURNING restores", [now], |r| r.get(0))
            .map_err(e)?;
        tx.commit().map_err(e)?;
        Ok(Restored { sealed, restores })
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
    use crate::state::Outcome;
    use crate::store::{DecisionRecord, Store};

    pub(super) fn tmpdir(name: &str) -> std::path::PathBuf {
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
        let r = l
            .write_batch(&[Op::Decide(rec("g1", Outcome::Commit), None), Op::Decide(rec("g1", Outcome::Abort), None)])
            .unwrap();
        assert_eq!(r, vec![OpResult::Decided(Outcome::Commit), OpResult::Decided(Outcome::Commit)]);
        let all = l.load().unwrap().records;
        assert_eq!(all, vec![rec("g1", Outcome::Commit)]);
        l.write_batch(&[Op::Forget("g1".into())]).unwrap();
        assert!(l.load().unwrap().records.is_empty());
        drop(l);
        // Survives reopen; a finished record is no longer recovery's, but still answers.
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        assert!(l.load().unwrap().records.is_empty());
        assert_eq!(l.get("g1").unwrap(), Stored::Record(rec("g1", Outcome::Commit)));
    }

    /// After a restore, a missing record of an epoch the copy held is "forgotten" (it may be
    /// a commit made after the copy), never absent = abort; no decision is written for it
    /// any more; a new epoch is unaffected; lease generations jump; the tick grows.
    #[test]
    fn mark_restored_seals_the_copys_epochs() {
        let d = tmpdir("restored");
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        l.write_batch(&[
            Op::RegisterEpoch { node: "n".into(), nonce: 10 },
            Op::Decide(rec("n.00000000000a-1", Outcome::Commit), None),
        ])
        .unwrap();
        let Claim::Granted(g1) = l.claim_node("n", "h", "u", 1000, false).unwrap() else { panic!() };
        let before = l.identity().unwrap();
        assert_eq!(l.get("n.00000000000a-2").unwrap(), Stored::Absent { forgotten: false });
        let r = l.mark_restored().unwrap();
        assert_eq!(r, Restored { sealed: 1, restores: 1 });
        assert_eq!(l.get("n.00000000000a-2").unwrap(), Stored::Absent { forgotten: true });
        assert!(matches!(l.get("n.00000000000a-1").unwrap(), Stored::Record(_)), "records of the copy still answer");
        let w = l.write_batch(&[Op::Decide(rec("n.00000000000a-2", Outcome::Abort), None)]).unwrap();
        assert_eq!(w, vec![OpResult::Forgotten]);
        l.write_batch(&[Op::RegisterEpoch { node: "n".into(), nonce: 11 }]).unwrap();
        assert_eq!(l.get("n.00000000000b-1").unwrap(), Stored::Absent { forgotten: false });
        let Claim::Granted(g2) = l.claim_node("n", "h", "u", 1000, false).unwrap() else { panic!() };
        assert!(g2 > g1 + RESTORE_GRANT_JUMP - 1);
        let after = l.identity().unwrap();
        assert_eq!((after.store_id, after.restores), (before.store_id, 1));
        assert!(after.tick > before.tick);
        assert_eq!(l.mark_restored().unwrap().sealed, 1, "only the epoch registered since is sealed again");
    }

    /// A finished commit stays answerable for the retention; once
    /// purged, it reads as "forgotten" (the epoch's watermark), never as absent = abort.
    #[test]
    fn purged_records_read_as_forgotten_not_absent() {
        let d = tmpdir("purge");
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        let (g3, g5, g9) = ("n.00000000000a-3", "n.00000000000a-5", "n.00000000000a-9");
        l.write_batch(&[
            Op::Decide(rec(g3, Outcome::Commit), None),
            Op::Decide(rec(g5, Outcome::Commit), None),
            Op::Decide(rec(g9, Outcome::Commit), None),
        ])
        .unwrap();
        l.write_batch(&[Op::Forget(g3.into()), Op::Forget(g5.into())]).unwrap();
        // Not old enough yet: kept.
        l.write_batch(&[Op::Purge { older_than_ms: 60_000 }]).unwrap();
        assert!(matches!(l.get(g5).unwrap(), Stored::Record(_)));
        l.conn
            .execute_batch("UPDATE decisions SET finished_ms = finished_ms - 120000 WHERE finished_ms IS NOT NULL")
            .unwrap();
        l.write_batch(&[Op::Purge { older_than_ms: 60_000 }]).unwrap();
        assert_eq!(l.get(g5).unwrap(), Stored::Absent { forgotten: true });
        assert_eq!(l.get("n.00000000000a-4").unwrap(), Stored::Absent { forgotten: true });
        // Above the watermark: never recorded, presumed abort stays sound.
        assert_eq!(l.get("n.00000000000a-6").unwrap(), Stored::Absent { forgotten: false });
        // A decision stalled past the retention is not written under the watermark.
        let r = l
            .write_batch(&[
                Op::Decide(rec("n.00000000000a-4", Outcome::Commit), None),
                Op::Decide(rec("n.00000000000a-6", Outcome::Abort), None),
            ])
            .unwrap();
        assert_eq!(r, vec![OpResult::Forgotten, OpResult::Decided(Outcome::Abort)]);
        assert!(matches!(l.get(g9).unwrap(), Stored::Record(_)), "unfinished records are never purged");
    }

    /// A decision made under a lease grant that is no longer in force writes nothing.
    #[test]
    fn decisions_are_fenced_by_the_grant() {
        let d = tmpdir("fence");
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        let Claim::Granted(g1) = l.claim_node("n", "a", "", 60_000, false).unwrap() else { panic!() };
        let old = Token { holder: "a".into(), generation: g1 };
        let Claim::Granted(g2) = l.claim_node("n", "a", "", 60_000, false).unwrap() else { panic!() };
        assert!(g2 > g1, "every grant draws a new generation");
        let r = l.write_batch(&[Op::Decide(rec("n.1-1", Outcome::Commit), Some(old.clone()))]).unwrap();
        assert!(matches!(&r[0], OpResult::Fenced(_)), "{r:?}");
        assert_eq!(
            l.renew_node("n", &old, 1000).unwrap(),
            Renewal::Lost(lease::Lost::Regranted { holder: "a".into(), generation: g2 })
        );
        let new = Token { holder: "a".into(), generation: g2 };
        assert_eq!(l.renew_node("n", &new, 1000).unwrap(), Renewal::Renewed);
        let r = l.write_batch(&[Op::Decide(rec("n.1-1", Outcome::Commit), Some(new))]).unwrap();
        assert_eq!(r[0], OpResult::Decided(Outcome::Commit));
    }

    /// A row that exists but cannot be read is never taken for an abort: load reports it
    /// as corrupt, and a conditional insert for its gtid answers Corrupt (writes nothing).
    #[test]
    fn corrupt_rows_are_not_aborts() {
        let d = tmpdir("corrupt");
        let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
        l.write_batch(&[Op::Decide(rec("ok", Outcome::Commit), None)]).unwrap();
        l.conn
            .execute_batch(
                "INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES ('bad-outcome', 'comit', '[[\"pg\",\"b1\"]]', 1, 'n', 'coordinator');
                 INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES ('bad-branches', 'commit', 'garbage', 1, 'n', 'coordinator');",
            )
            .unwrap();
        let got = l.load().unwrap();
        assert_eq!(got.records, vec![rec("ok", Outcome::Commit)]);
        let mut bad: Vec<&str> = got.corrupt.iter().map(|c| c.gtid.as_str()).collect();
        bad.sort();
        assert_eq!(bad, vec!["bad-branches", "bad-outcome"]);
        let r = l.write_batch(&[Op::Decide(rec("bad-outcome", Outcome::Abort), None)]).unwrap();
        assert!(matches!(&r[0], OpResult::Corrupt(m) if m.contains("comit")), "{r:?}");
        assert!(matches!(l.get("bad-branches").unwrap(), Stored::Corrupt(_)));
        // The operator's overwrite replaces it.
        l.write_batch(&[Op::Overwrite(rec("bad-outcome", Outcome::Commit))]).unwrap();
        assert_eq!(l.get("bad-outcome").unwrap(), Stored::Record(rec("bad-outcome", Outcome::Commit)));
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
        let batch_a: Vec<Op> = (0..20).map(|i| Op::Decide(rec(&format!("a{i}"), Outcome::Commit), None)).collect();
        l.write_batch(&batch_a).unwrap();
        let len_a = std::fs::metadata(&wal).unwrap().len();
        let batch_b: Vec<Op> = (0..20).map(|i| Op::Decide(rec(&format!("b{i}"), Outcome::Commit), None)).collect();
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
        let got: Vec<String> = l.load().unwrap().records.into_iter().map(|r| r.gtid).collect();
        assert_eq!(got.len(), 20, "{got:?}");
        assert!(got.iter().all(|g| g.starts_with('a')));
        // And the store keeps working after the torn tail.
        l.write_batch(&[Op::Decide(rec("c1", Outcome::Commit), None)]).unwrap();
        assert_eq!(l.load().unwrap().records.len(), 21);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn group_commit_on_sqlite() {
        let d = tmpdir("gc");
        let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 1024);
        let mut hs = vec![];
        for i in 0..400 {
            let s = store.clone();
            hs.push(tokio::spawn(async move { s.decide(rec(&format!("g{i}"), Outcome::Commit), None).await }));
        }
        for h in hs {
            assert_eq!(h.await.unwrap().unwrap(), crate::store::Decided::Outcome(Outcome::Commit));
        }
        let batches = store.stats.batches.load(std::sync::atomic::Ordering::Relaxed);
        assert!(batches < 400, "expected fewer syncs than decisions, got {batches}");
        assert_eq!(store.load().await.unwrap().records.len(), 400);
    }
}

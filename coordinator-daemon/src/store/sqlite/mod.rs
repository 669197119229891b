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
use crate::store::error::StoreError;
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

fn e(x: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("sqlite: {x}"))
}

impl SqliteLog {
    /// Opens (or makes) the store at `path`: schema.rs.
    pub fn open(path: &str) -> Result<SqliteLog, StoreError> {
        let (conn, lock) = schema::open(path)?;
        Ok(SqliteLog { conn, _lock: lock })
    }

    fn rows(&self, filter: &str, arg: Option<&str>) -> Result<Vec<Stored>, StoreError> {
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
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, StoreError> {
        let tx = self.conn.transaction().map_err(e)?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(Self::apply(&tx, op).map_err(e)?);
        }
        // One COMMIT = one WAL fsync for the whole batch (synchronous=FULL).
        tx.commit().map_err(e)?;
        Ok(out)
    }

    fn load(&mut self) -> Result<Loaded, StoreError> {
        let rows = self.rows("WHERE finished_ms IS NULL OR outcome NOT IN ('commit', 'abort')", None)?;
        let mut st = self.conn.prepare("SELECT node, nonce FROM epochs").map_err(e)?;
        let epochs = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
            .map_err(e)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(e)?;
        Ok(loaded_from(rows, epochs))
    }

    fn get(&mut self, gtid: &str) -> Result<Stored, StoreError> {
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
    ) -> Result<Claim, StoreError> {
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

    fn renew_node(&mut self, node: &str, t: &Token, ttl_ms: u64) -> Result<Renewal, StoreError> {
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

    fn release_node(&mut self, node: &str, holder: &str, _forget: bool) -> Result<(), StoreError> {
        self.conn.execute("DELETE FROM nodes WHERE node = ?1 AND holder = ?2", params![node, holder]).map_err(e)?;
        Ok(())
    }

    fn nodes(&mut self) -> Result<Vec<NodeLease>, StoreError> {
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

    fn identity(&mut self) -> Result<Identity, StoreError> {
        self.conn
            .query_row("SELECT store_id, restores, tick FROM meta WHERE id = 1", [], |r| {
                Ok(Identity { store_id: r.get(0)?, restores: r.get(1)?, tick: r.get(2)? })
            })
            .map_err(e)
    }

    /// The file lock held since open makes this process the store's only user: no daemon
    /// runs on it meanwhile.
    fn mark_restored(&mut self) -> Result<Restored, StoreError> {
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

    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, StoreError> {
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
mod tests;

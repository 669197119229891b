//! Decision store in a PostgreSQL table, for several coordinators sharing one log or a log
//! kept in a replicated database. The decision is a conditional insert
//! (`ON CONFLICT DO NOTHING`): whoever writes first for a gtid wins, later writers read the
//! winner's outcome. A batch is one transaction: one commit (one WAL flush) for many.
//!
//! Node leases: a daemon owns its node id while its store session holds an advisory lock
//! named after the node and its row in `<table>_nodes` is renewed. A dead daemon's session
//! ends and frees the lock at once; a paused one keeps its session, so its row's expiry
//! (by the store's clock, not the daemons') decides: an expired holder's session is
//! terminated by whoever takes the node over.

use super::error::StoreError;
use super::log::{
    existing_outcome, newer_schema, Claim, DecisionLog, Identity, NodeLease, Op, OpResult, Renewal, Restored,
    SharedSession, Token, RESTORE_GRANT_JUMP, SCHEMA_VERSION,
};
use super::record::{branches_to_json, gtid_seq, loaded_from, parse_row, purge_watermarks, AuditEntry, Loaded, Stored};
use crate::naming::{self, XA_FORMAT_ID};
use cotx_protocol::lease;
use postgres::Client;

mod common;
mod schema;
mod sessions;

use common::{e, NOW_MS};
use schema::{make_schema, schema_version};

pub struct PgLog {
    /// The DSN with the TLS mode applied (crate::dbtls), and its TLS connector.
    cfg: postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    table: String,
    client: Option<Client>,
}

impl PgLog {
    /// `table` is checked by the config to be a plain lowercase identifier.
    pub fn open(dsn: &str, table: &str, tls: Option<&crate::dbtls::DbTls>) -> Result<PgLog, StoreError> {
        let (cfg, tls) = crate::dbtls::pg(dsn, tls).map_err(|m| StoreError::Setup(format!("postgres store: {m}")))?;
        let mut l = PgLog { cfg: cfg.into(), tls, table: table.to_string(), client: None };
        l.client()?;
        Ok(l)
    }

    fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            let mut c = self.cfg.connect(self.tls.clone()).map_err(e)?;
            match schema_version(&mut c, &self.table)? {
                Some(v) if v == SCHEMA_VERSION => {}
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(StoreError::NewerSchema(newer_schema(&format!("table {}", self.table), v)))
                }
                _ => make_schema(&mut c, &self.table)?,
            }
            self.client = Some(c);
        }
        Ok(self.client.as_mut().unwrap())
    }

    /// Runs `f` on the client; on error drops the connection (reconnect next time).
    fn with<T>(&mut self, f: impl FnOnce(&mut Client, &str) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let t = self.table.clone();
        let r = f(self.client()?, &t);
        if r.is_err() {
            self.client = None;
        }
        r
    }

    fn batch(c: &mut Client, t: &str, ops: &[Op]) -> Result<Vec<OpResult>, StoreError> {
        let mut tx = c.transaction().map_err(e)?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(match op {
                Op::Decide(r, fence) => {
                    let owner = naming::gtid_node(&r.gtid).unwrap_or_default();
                    let (holder, generation) = fence.as_ref().map(|f| (f.holder.as_str(), f.generation)).unwrap_or(("", 0));
                    // The lease row is locked (FOR SHARE) for this transaction: a takeover's
                    // claim waits until the decision is in, and then its recovery reads it.
                    let (nonce, seq) = epoch_seq(&r.gtid);
                    let rows = tx
                        .query(
                            &format!("INSERT INTO {t}(gtid, outcome, branches, decided_ms, node, source) SELECT $1,$2,$3,$4,$5,$6
                                      WHERE ($10 OR EXISTS (SELECT 1 FROM {t}_nodes WHERE node = $7 AND holder = $8 AND generation = $9 FOR SHARE))
                                        AND NOT EXISTS (SELECT 1 FROM {t}_epochs WHERE node = $7 AND nonce = $11 AND (purged_seq >= $12 OR sealed_ms IS NOT NULL))
                                      ON CONFLICT (gtid) DO NOTHING RETURNING outcome"),
                            &[&r.gtid, &r.outcome.as_str(), &branches_to_json(&r.branches), &(r.decided_unix_ms as i64), &r.node, &r.source, &owner, &holder, &generation, &fence.is_none(), &nonce, &seq],
                        )
                        .map_err(e)?;
                    if rows.is_empty() {
                        match tx.query_opt(&format!("SELECT outcome FROM {t} WHERE gtid = $1"), &[&r.gtid]).map_err(e)? {
                            Some(row) => existing_outcome(row.get::<_, &str>(0)),
                            None if tx
                                .query_opt(&format!("SELECT 1 FROM {t}_epochs WHERE node = $1 AND nonce = $2 AND (purged_seq >= $3 OR sealed_ms IS NOT NULL)"), &[&owner, &nonce, &seq])
                                .map_err(e)?
                                .is_some() => OpResult::Forgotten,
                            None => OpResult::Fenced(format!("the lease of node {owner} is no longer grant {generation} of {holder}")),
                        }
                    } else {
                        OpResult::Decided(r.outcome)
                    }
                }
                Op::Overwrite(r) => {
                    tx.execute(
                        &format!("INSERT INTO {t}(gtid, outcome, branches, decided_ms, node, source) VALUES ($1,$2,$3,$4,$5,$6)
                                  ON CONFLICT (gtid) DO UPDATE SET outcome = EXCLUDED.outcome, branches = EXCLUDED.branches,
                                  decided_ms = EXCLUDED.decided_ms, node = EXCLUDED.node, source = EXCLUDED.source, finished_ms = NULL"),
                        &[&r.gtid, &r.outcome.as_str(), &branches_to_json(&r.branches), &(r.decided_unix_ms as i64), &r.node, &r.source],
                    )
                    .map_err(e)?;
                    OpResult::Decided(r.outcome)
                }
                Op::Forget(g) => {
                    tx.execute(&format!("UPDATE {t} SET finished_ms = {NOW_MS} WHERE gtid = $1 AND finished_ms IS NULL"), &[g]).map_err(e)?;
                    OpResult::Done
                }
                Op::Purge { older_than_ms } => {
                    let gtids: Vec<String> = tx
                        .query(&format!("SELECT gtid FROM {t} WHERE finished_ms < {NOW_MS} - $1 ORDER BY finished_ms LIMIT 10000"), &[&(*older_than_ms as i64)])
                        .map_err(e)?
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    // The watermarks go in with the delete, in one transaction: no moment
                    // where a purged commit reads as "never recorded".
                    for ((node, nonce), w) in purge_watermarks(&gtids) {
                        tx.execute(
                            &format!("INSERT INTO {t}_epochs(node, nonce, started_ms, purged_seq) VALUES ($1, $2, {NOW_MS}, $3)
                                      ON CONFLICT (node, nonce) DO UPDATE SET purged_seq = GREATEST(COALESCE({t}_epochs.purged_seq, 0), EXCLUDED.purged_seq)"),
                            &[&node, &(nonce as i64), &(w as i64)],
                        )
                        .map_err(e)?;
                    }
                    tx.execute(&format!("DELETE FROM {t} WHERE gtid = ANY($1)"), &[&gtids]).map_err(e)?;
                    OpResult::Done
                }
                Op::Audit(a) => {
                    tx.execute(
                        &format!("INSERT INTO {t}_audit(at_ms, gtid, outcome, operator, reason, result) VALUES ($1,$2,$3,$4,$5,$6)"),
                        &[&(a.at_unix_ms as i64), &a.gtid, &a.outcome, &a.operator, &a.reason, &a.result],
                    )
                    .map_err(e)?;
                    OpResult::Done
                }
                Op::RegisterEpoch { node, nonce } => {
                    tx.execute(
                        &format!("INSERT INTO {t}_epochs(node, nonce, started_ms) VALUES ($1, $2, {NOW_MS}) ON CONFLICT DO NOTHING"),
                        &[node, &(*nonce as i64)],
                    )
                    .map_err(e)?;
                    OpResult::Done
                }
            });
        }
        tx.commit().map_err(e)?;
        Ok(out)
    }

    fn rows(c: &mut Client, t: &str, gtid: Option<&str>) -> Result<Vec<Stored>, StoreError> {
        // Without a gtid: what recovery needs (unfinished records) and every row whose
        // outcome cannot be read, finished or not (it quarantines them everywhere).
        let sql = format!(
            "SELECT gtid, outcome, branches, decided_ms, node, source FROM {t} {} ORDER BY decided_ms",
            if gtid.is_some() {
                "WHERE gtid = $1"
            } else {
                "WHERE finished_ms IS NULL OR outcome NOT IN ('commit', 'abort')"
            }
        );
        let rows = match gtid {
            Some(g) => c.query(&sql, &[&g]),
            None => c.query(&sql, &[]),
        }
        .map_err(e)?;
        Ok(rows.iter().map(|r| parse_row(r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))).collect())
    }

    fn lease_row(c: &mut Client, t: &str, node: &str) -> Result<Option<NodeLease>, StoreError> {
        let r = c
            .query_opt(
                &format!("SELECT node, holder, url, expires_ms - {NOW_MS} FROM {t}_nodes WHERE node = $1"),
                &[&node],
            )
            .map_err(e)?;
        Ok(r.map(|r| NodeLease { node: r.get(0), holder: r.get(1), url: r.get(2), expires_in_ms: r.get(3) }))
    }
}

/// Whether this session holds node's lock: already (a re-lock would stack counts), or
/// taken now because it was free.
fn hold_lock(c: &mut Client, t: &str, node: &str) -> Result<bool, StoreError> {
    let args = lock_args(t);
    Ok(c.query_one(
        &format!(
            "SELECT EXISTS(SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
                 AND objsubid = 2 AND classid = ({XA_FORMAT_ID})::oid AND objid = (hashtext('{t}:' || $1))::oid)
             OR pg_try_advisory_lock({args})"
        ),
        &[&node],
    )
    .map_err(e)?
    .get(0))
}

/// A gtid's epoch nonce and sequence number as the epochs table stores them (-1 when the
/// gtid is not of our naming: no watermark applies).
fn epoch_seq(gtid: &str) -> (i64, i64) {
    match (naming::gtid_epoch(gtid), gtid_seq(gtid)) {
        (Some((_, nonce)), Some(seq)) => (nonce as i64, seq as i64),
        _ => (-1, i64::MAX),
    }
}

/// The advisory lock of a node: (classid "cotx", hash of table and node).
fn lock_args(t: &str) -> String {
    format!("{XA_FORMAT_ID}, hashtext('{t}:' || $1)")
}

impl DecisionLog for PgLog {
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, StoreError> {
        // On error the connection is dropped and remade. A commit whose answer was lost is
        // harmless: decisions are conditional inserts, so the retry reads back what was written.
        self.with(|c, t| Self::batch(c, t, ops))
    }

    fn load(&mut self) -> Result<Loaded, StoreError> {
        self.with(|c, t| {
            let rows = Self::rows(c, t, None)?;
            let epochs = c
                .query(&format!("SELECT node, nonce FROM {t}_epochs"), &[])
                .map_err(e)?
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
                .collect();
            Ok(loaded_from(rows, epochs))
        })
    }

    fn get(&mut self, gtid: &str) -> Result<Stored, StoreError> {
        self.with(|c, t| {
            if let Some(s) = Self::rows(c, t, Some(gtid))?.into_iter().next() {
                return Ok(s);
            }
            let (Some((node, nonce)), Some(seq)) = (naming::gtid_epoch(gtid), gtid_seq(gtid)) else {
                return Ok(Stored::Absent { forgotten: false });
            };
            let (w, sealed) = c
                .query_opt(
                    &format!("SELECT purged_seq, sealed_ms IS NOT NULL FROM {t}_epochs WHERE node = $1 AND nonce = $2"),
                    &[&node, &(nonce as i64)],
                )
                .map_err(e)?
                .map(|r| (r.get::<_, Option<i64>>(0), r.get::<_, bool>(1)))
                .unwrap_or((None, false));
            Ok(Stored::Absent { forgotten: cotx_protocol::answer::unknown_if_absent(seq, w.map(|w| w as u64), sealed) })
        })
    }

    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, StoreError> {
        self.with(|c, t| {
            let rows = c
                .query(
                    &format!("SELECT at_ms, gtid, outcome, operator, reason, result FROM {t}_audit ORDER BY id"),
                    &[],
                )
                .map_err(e)?;
            Ok(rows
                .iter()
                .map(|r| AuditEntry {
                    at_unix_ms: r.get::<_, i64>(0) as u64,
                    gtid: r.get(1),
                    outcome: r.get(2),
                    operator: r.get(3),
                    reason: r.get(4),
                    result: r.get(5),
                })
                .collect())
        })
    }

    fn claim_node(
        &mut self,
        node: &str,
        holder: &str,
        url: &str,
        ttl_ms: u64,
        fence_expired: bool,
    ) -> Result<Claim, StoreError> {
        self.with(|c, t| {
            for _ in 0..20 {
                if hold_lock(c, t, node)? {
                    // The lock was free: whoever held the node before has no store session
                    // any more (dead, or cut off). Recovery of that holder's epochs records
                    // aborts before rolling back, so a holder that comes back loses.
                    // A new grant: a new generation, even for the same holder.
                    let g: i64 = c
                        .query_one(
                            &format!(
                                "INSERT INTO {t}_nodes(node, holder, url, expires_ms, generation) VALUES ($1, $2, $3, {NOW_MS} + $4, nextval('{t}_grants'))
                                 ON CONFLICT (node) DO UPDATE SET holder = EXCLUDED.holder, url = EXCLUDED.url, expires_ms = EXCLUDED.expires_ms,
                                 generation = EXCLUDED.generation RETURNING generation, nextval('{t}_ticks')"
                            ),
                            &[&node, &holder, &url, &(ttl_ms as i64)],
                        )
                        .map_err(e)?
                        .get(0);
                    return Ok(Claim::Granted(g));
                }
                let row = Self::lease_row(c, t, node)?;
                let verdict = lease::claim(row.as_ref().map(|r| lease::Row { holder: r.holder.clone(), generation: 0, expires_in_ms: r.expires_in_ms }).as_ref(), false, fence_expired);
                let held = row.unwrap_or(NodeLease { node: node.into(), holder: "(unknown: a session holds the lock)".into(), url: String::new(), expires_in_ms: 0 });
                if verdict != lease::ClaimVerdict::FenceThenGrant {
                    return Ok(Claim::HeldBy(held));
                }
                // Fence the expired holder: end its store session (it can no longer write),
                // then try again.
                c.execute(
                    &format!(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
                           AND classid = ({XA_FORMAT_ID})::oid AND objid = (hashtext('{t}:' || $1))::oid AND pid <> pg_backend_pid()"
                    ),
                    &[&node],
                )
                .map_err(e)?;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(StoreError::Conflict(format!("could not take over node {node}: its holder's session did not end")))
        })
    }

    fn renew_node(&mut self, node: &str, tok: &Token, ttl_ms: u64) -> Result<Renewal, StoreError> {
        self.with(|c, t| {
            // Our session still holds the node's lock, or (after a reconnect) takes it
            // again: a row unchanged since our grant proves nobody acted for the node.
            let locked = hold_lock(c, t, node)?;
            let mut tx = c.transaction().map_err(e)?;
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT holder, generation, expires_ms - {NOW_MS} FROM {t}_nodes WHERE node = $1 FOR UPDATE"
                    ),
                    &[&node],
                )
                .map_err(e)?
                .map(|r| lease::Row { holder: r.get(0), generation: r.get(1), expires_in_ms: r.get(2) });
            let verdict = match (locked, lease::renewal(row.as_ref(), tok)) {
                // Another session holds the lock: a claim is under way; our grant is over.
                (false, _) => Renewal::Lost(lease::Lost::Regranted {
                    holder: "(a store session holding the node's lock)".into(),
                    generation: -1,
                }),
                (true, v) => v,
            };
            if verdict == Renewal::Renewed {
                tx.execute(
                    &format!("UPDATE {t}_nodes SET expires_ms = {NOW_MS} + $2 WHERE node = $1"),
                    &[&node, &(ttl_ms as i64)],
                )
                .map_err(e)?;
                tx.execute(&format!("SELECT nextval('{t}_ticks')"), &[]).map_err(e)?;
            }
            tx.commit().map_err(e)?;
            Ok(verdict)
        })
    }

    fn release_node(&mut self, node: &str, holder: &str, forget: bool) -> Result<(), StoreError> {
        self.with(|c, t| {
            let sql = if forget {
                format!("DELETE FROM {t}_nodes WHERE node = $1 AND holder = $2")
            } else {
                format!("UPDATE {t}_nodes SET expires_ms = {NOW_MS} - 1 WHERE node = $1 AND holder = $2")
            };
            c.execute(&sql, &[&node, &holder]).map_err(e)?;
            c.execute(&format!("SELECT pg_advisory_unlock({})", lock_args(t)), &[&node]).map_err(e)?;
            Ok(())
        })
    }

    fn identity(&mut self) -> Result<Identity, StoreError> {
        self.with(|c, t| {
            let r = c
                .query_one(
                    &format!(
                        "SELECT store_id, restores, (SELECT last_value FROM {t}_ticks) FROM {t}_meta WHERE id = 1"
                    ),
                    &[],
                )
                .map_err(e)?;
            Ok(Identity { store_id: r.get(0), restores: r.get(1), tick: r.get(2) })
        })
    }

    fn exchange_sessions(
        &mut self,
        node: &str,
        mine: &[SharedSession],
        max_age_ms: u64,
    ) -> Result<Vec<SharedSession>, StoreError> {
        self.with(|c, t| sessions::exchange(c, t, node, mine, max_age_ms))
    }

    fn mark_restored(&mut self) -> Result<Restored, StoreError> {
        self.with(|c, t| {
            let mut tx = c.transaction().map_err(e)?;
            // A daemon running on the store holds its node's lock in a store session.
            let live: i64 = tx
                .query_one(
                    &format!(
                        "SELECT count(*) FROM pg_locks l JOIN {t}_nodes n ON l.objid = (hashtext('{t}:' || n.node))::oid
                          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ({XA_FORMAT_ID})::oid"
                    ),
                    &[],
                )
                .map_err(e)?
                .get(0);
            if live > 0 {
                return Err(StoreError::Conflict(format!(
                    "{live} daemon(s) hold node locks on this store: stop every daemon that uses it first"
                )));
            }
            let sealed = tx
                .execute(&format!("UPDATE {t}_epochs SET sealed_ms = {NOW_MS} WHERE sealed_ms IS NULL"), &[])
                .map_err(e)?;
            tx.execute(&format!("SELECT setval('{t}_grants', (SELECT last_value FROM {t}_grants) + $1)"), &[&RESTORE_GRANT_JUMP]).map_err(e)?;
            tx.execute(&format!("SELECT nextval('{t}_ticks')"), &[]).map_err(e)?;
            let restores: i64 = tx
                .query_one(&format!("UPDATE {t}_meta SET restores = restores + 1, restored_ms = {NOW_MS} WHERE id = 1 RETURNING restores"), &[])
                .map_err(e)?
                .get(0);
            tx.commit().map_err(e)?;
            Ok(Restored { sealed, restores })
        })
    }

    fn nodes(&mut self) -> Result<Vec<NodeLease>, StoreError> {
        self.with(|c, t| {
            let rows = c
                .query(&format!("SELECT node, holder, url, expires_ms - {NOW_MS} FROM {t}_nodes ORDER BY node"), &[])
                .map_err(e)?;
            Ok(rows
                .iter()
                .map(|r| NodeLease { node: r.get(0), holder: r.get(1), url: r.get(2), expires_in_ms: r.get(3) })
                .collect())
        })
    }
}

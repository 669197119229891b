//! Decision store in a PostgreSQL table, for several coordinators sharing one log or a log
//! kept in a replicated database. The decision is a conditional insert
//! (`ON CONFLICT DO NOTHING`): whoever writes first for a gtid wins, later writers read the
//! winner's outcome. A batch is one transaction: one commit (one WAL flush) for many.

use super::{branches_from_json, branches_to_json, AuditEntry, DecisionLog, DecisionRecord, Op, OpResult};
use crate::state::Outcome;
use postgres::{Client, NoTls};

pub struct PgLog {
    dsn: String,
    table: String,
    client: Option<Client>,
}

fn e(x: postgres::Error) -> String {
    format!("postgres store: {x}")
}

impl PgLog {
    /// `table` is checked by the config to be a plain lowercase identifier.
    pub fn open(dsn: &str, table: &str) -> Result<PgLog, String> {
        let mut l = PgLog { dsn: dsn.to_string(), table: table.to_string(), client: None };
        l.client()?;
        Ok(l)
    }

    fn client(&mut self) -> Result<&mut Client, String> {
        if self.client.as_ref().map(|c| c.is_closed()).unwrap_or(true) {
            let mut c = Client::connect(&self.dsn, NoTls).map_err(e)?;
            let t = &self.table;
            c.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {t}(gtid text PRIMARY KEY, outcome text NOT NULL, branches text NOT NULL,
                    decided_ms bigint NOT NULL, node text NOT NULL, source text NOT NULL);
                 CREATE TABLE IF NOT EXISTS {t}_audit(id bigserial PRIMARY KEY, at_ms bigint NOT NULL, gtid text NOT NULL,
                    outcome text NOT NULL, operator text NOT NULL, reason text NOT NULL, result text NOT NULL);"
            ))
            .map_err(e)?;
            self.client = Some(c);
        }
        Ok(self.client.as_mut().unwrap())
    }

    fn batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, String> {
        let t = self.table.clone();
        let c = self.client()?;
        let mut tx = c.transaction().map_err(e)?;
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(match op {
                Op::Decide(r) => {
                    let rows = tx
                        .query(
                            &format!("INSERT INTO {t}(gtid, outcome, branches, decided_ms, node, source) VALUES ($1,$2,$3,$4,$5,$6)
                                      ON CONFLICT (gtid) DO NOTHING RETURNING outcome"),
                            &[&r.gtid, &r.outcome.as_str(), &branches_to_json(&r.branches), &(r.decided_unix_ms as i64), &r.node, &r.source],
                        )
                        .map_err(e)?;
                    if rows.is_empty() {
                        let row = tx.query_one(&format!("SELECT outcome FROM {t} WHERE gtid = $1"), &[&r.gtid]).map_err(e)?;
                        OpResult::Decided(Outcome::parse(row.get::<_, &str>(0)).unwrap_or(Outcome::Abort))
                    } else {
                        OpResult::Decided(r.outcome)
                    }
                }
                Op::Forget(g) => {
                    tx.execute(&format!("DELETE FROM {t} WHERE gtid = $1"), &[g]).map_err(e)?;
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
            });
        }
        tx.commit().map_err(e)?;
        Ok(out)
    }
}

impl DecisionLog for PgLog {
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, String> {
        let r = self.batch(ops);
        if r.is_err() {
            // Reconnect next time. A commit whose answer was lost is harmless: decisions
            // are conditional inserts, so the retry reads back what was written.
            self.client = None;
        }
        r
    }

    fn load(&mut self) -> Result<Vec<DecisionRecord>, String> {
        let t = self.table.clone();
        let rows = self
            .client()?
            .query(&format!("SELECT gtid, outcome, branches, decided_ms, node, source FROM {t} ORDER BY decided_ms"), &[])
            .map_err(e)?;
        Ok(rows
            .iter()
            .map(|r| DecisionRecord {
                gtid: r.get(0),
                outcome: Outcome::parse(r.get::<_, &str>(1)).unwrap_or(Outcome::Abort),
                branches: branches_from_json(r.get::<_, &str>(2)),
                decided_unix_ms: r.get::<_, i64>(3) as u64,
                node: r.get(4),
                source: r.get(5),
            })
            .collect())
    }

    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, String> {
        let t = self.table.clone();
        let rows = self
            .client()?
            .query(&format!("SELECT at_ms, gtid, outcome, operator, reason, result FROM {t}_audit ORDER BY id"), &[])
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
    }
}

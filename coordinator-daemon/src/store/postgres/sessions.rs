//! The sessions several daemons on one PostgreSQL store tell each other, so that each
//! sees a deadlock cycle through another daemon's transactions (coordinator::deadlocks).
//!
//! An UNLOGGED table made on first use, outside the schema version: nothing in it must
//! survive a crash or a failover (a row lives one detection pass), an older daemon on the
//! same store never reads it, and a newer schema version would refuse older daemons during
//! a rolling upgrade. Written only while a daemon has a transaction that may wait, so a
//! deployment without waits never touches it.

use super::common::{e, NOW_MS};
use crate::store::error::StoreError;
use crate::store::log::SharedSession;
use postgres::error::SqlState;
use postgres::Client;

pub(super) fn exchange(
    c: &mut Client,
    t: &str,
    node: &str,
    mine: &[SharedSession],
    max_age_ms: u64,
) -> Result<Vec<SharedSession>, StoreError> {
    match exchange_once(c, t, node, mine, max_age_ms) {
        Err(x) if x.code() == Some(&SqlState::UNDEFINED_TABLE) => {
            c.batch_execute(&format!(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {t}_sessions(node text NOT NULL, gtid text NOT NULL,
                    resource text NOT NULL, session bigint NOT NULL, begun_ms bigint NOT NULL,
                    published_ms bigint NOT NULL)"
            ))
            .map_err(e)?;
            exchange_once(c, t, node, mine, max_age_ms).map_err(e)
        }
        r => r.map_err(e),
    }
}

fn exchange_once(
    c: &mut Client,
    t: &str,
    node: &str,
    mine: &[SharedSession],
    max_age_ms: u64,
) -> Result<Vec<SharedSession>, postgres::Error> {
    let mut tx = c.transaction()?;
    // Nothing here is worth a flush or a standby's confirmation.
    tx.batch_execute("SET LOCAL synchronous_commit = off")?;
    tx.execute(&format!("DELETE FROM {t}_sessions WHERE node = $1"), &[&node])?;
    if !mine.is_empty() {
        let gtids: Vec<&str> = mine.iter().map(|s| s.gtid.as_str()).collect();
        let resources: Vec<&str> = mine.iter().map(|s| s.resource.as_str()).collect();
        let sessions: Vec<i64> = mine.iter().map(|s| s.session).collect();
        let begun: Vec<i64> = mine.iter().map(|s| s.begun_ms as i64).collect();
        tx.execute(
            &format!(
                "INSERT INTO {t}_sessions(node, gtid, resource, session, begun_ms, published_ms)
                 SELECT $1, g, r, s, b, {NOW_MS} FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS u(g, r, s, b)"
            ),
            &[&node, &gtids, &resources, &sessions, &begun],
        )?;
    }
    let rows = tx.query(
        &format!(
            "SELECT gtid, resource, session, begun_ms FROM {t}_sessions WHERE node <> $1 AND published_ms > {NOW_MS} - $2"
        ),
        &[&node, &(max_age_ms as i64)],
    )?;
    tx.commit()?;
    Ok(rows
        .iter()
        .map(|r| SharedSession {
            gtid: r.get(0),
            resource: r.get(1),
            session: r.get(2),
            begun_ms: r.get::<_, i64>(3).max(0) as u64,
        })
        .collect())
}

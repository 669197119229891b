//! The PostgreSQL store's schema: its version, and making it or bringing it up to date.

use super::common::e;
use crate::store::error::StoreError;
use crate::store::log::SCHEMA_VERSION;
use postgres::Client;

/// The store's schema version from its meta row (None: no meta table, a store made by
/// release 0.1.0 or nothing yet). Read from the catalogs and the meta table only: a daemon
/// (re)connecting to a current store takes no lock on the decision tables. The DDL below
/// takes ACCESS EXCLUSIVE on the decision table; queued behind an open transaction there
/// (another daemon's decision whose commit waits for a synchronous standby mid-failover),
/// it would make every later reader and writer queue behind it: the whole store stopped
/// until that standby returned. The meta row is written in the DDL's transaction, so a
/// current version means every table and column is there.
pub(super) fn schema_version(c: &mut Client, t: &str) -> Result<Option<i64>, StoreError> {
    let meta = format!("{t}_meta");
    let exists: bool = c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&meta]).map_err(e)?.get(0);
    if !exists {
        return Ok(None);
    }
    Ok(c.query_opt(&format!("SELECT schema_version FROM {meta} WHERE id = 1"), &[])
        .map_err(e)?
        .map(|r| r.get::<_, i64>(0)))
}

/// Creates the tables or brings an older store up to date in place (idempotent). The lock
/// wait is bounded (the caller retries on error). Committed without waiting for a
/// synchronous standby: if the primary is lost before the standby has it, the next
/// connection finds the schema short and makes it again.
pub(super) fn make_schema(c: &mut Client, t: &str) -> Result<(), StoreError> {
    c.batch_execute(&format!(
        "BEGIN;
         SET LOCAL lock_timeout = '5s';
         SET LOCAL synchronous_commit = local;
         CREATE TABLE IF NOT EXISTS {t}(gtid text PRIMARY KEY, outcome text NOT NULL, branches text NOT NULL,
            decided_ms bigint NOT NULL, node text NOT NULL, source text NOT NULL);
         CREATE TABLE IF NOT EXISTS {t}_audit(id bigserial PRIMARY KEY, at_ms bigint NOT NULL, gtid text NOT NULL,
            outcome text NOT NULL, operator text NOT NULL, reason text NOT NULL, result text NOT NULL);
         CREATE TABLE IF NOT EXISTS {t}_epochs(node text NOT NULL, nonce bigint NOT NULL, started_ms bigint NOT NULL,
            PRIMARY KEY(node, nonce));
         CREATE TABLE IF NOT EXISTS {t}_nodes(node text PRIMARY KEY, holder text NOT NULL, url text NOT NULL,
            expires_ms bigint NOT NULL);
         -- Lease grants (cotx_protocol::lease), finished records kept for the retention,
         -- purge watermarks (cotx_protocol::answer). Added in place to older tables.
         CREATE SEQUENCE IF NOT EXISTS {t}_grants;
         ALTER TABLE {t}_nodes ADD COLUMN IF NOT EXISTS generation bigint NOT NULL DEFAULT 0;
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS finished_ms bigint;
         ALTER TABLE {t}_epochs ADD COLUMN IF NOT EXISTS purged_seq bigint;
         CREATE INDEX IF NOT EXISTS {t}_finished ON {t}(finished_ms) WHERE finished_ms IS NOT NULL;
         -- Schema version 2: the meta row (store identity, restores), the tick a daemon's
         -- witness file compares, epochs sealed by a restore.
         ALTER TABLE {t}_epochs ADD COLUMN IF NOT EXISTS sealed_ms bigint;
         CREATE SEQUENCE IF NOT EXISTS {t}_ticks;
         CREATE TABLE IF NOT EXISTS {t}_meta(id int PRIMARY KEY CHECK (id = 1), schema_version bigint NOT NULL,
            store_id text NOT NULL, restores bigint NOT NULL DEFAULT 0, restored_ms bigint);
         INSERT INTO {t}_meta(id, schema_version, store_id) VALUES (1, {SCHEMA_VERSION}, md5(random()::text || clock_timestamp()::text))
            ON CONFLICT (id) DO UPDATE SET schema_version = GREATEST({t}_meta.schema_version, EXCLUDED.schema_version);
         COMMIT;"
    ))
    .map_err(e)
}

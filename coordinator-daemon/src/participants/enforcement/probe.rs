//! What a resource can do, asked of the database itself: whether its engine enforces
//! commitment ordering (pg_co / mysql_co loaded, enabled, not observe-only) and whether
//! client mode can run there (it can prepare transactions; the shim objects of
//! sql/client_mode/ exist or can be created). Also the SQL of the PostgreSQL helper
//! transactions and of the MariaDB restart check. Only I/O: the rules are in mod.rs.

use super::rules::{needs, Configured, Probe};
use crate::config::ResourceKind;
use crate::naming;
use crate::participants::resources::{my_err, simple_first, ResourceClient};
use mysql_async::prelude::Queryable;
use tokio_postgres::SimpleQueryMessage;

/// Rows the daemon puts in the shim table: at most this many client-mode branches of one
/// resource are live at once (more wait, refused with a retry-later).
pub const SHIM_SLOTS: i32 = 4096;
const PG_SCRIPT: &str = include_str!("../../../../sql/client_mode/postgres.sql");
const MARIA_SCRIPT: &str = include_str!("../../../../sql/client_mode/mariadb.sql");

/// The probe's findings; Err when the resource could not be asked at all.
pub struct Found {
    pub probe: Probe,
    /// Rows in the shim table (0 when client mode is not possible or not needed).
    pub slots: i32,
    /// Client mode may commit a single branch in one phase here: MariaDB always;
    /// PostgreSQL when cotx.shim_locked exists (the daemon must be able to tell whether a
    /// helper's block still has a branch whose transaction has not ended).
    pub one_phase: bool,
}

fn rows(m: &[SimpleQueryMessage]) -> Vec<&tokio_postgres::SimpleQueryRow> {
    m.iter()
        .filter_map(|x| match x {
            SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .collect()
}

pub async fn probe(rc: &ResourceClient, cfg: Configured) -> Result<Found, String> {
    let (engine, client) = needs(cfg);
    let off = || Err("not asked (the config does not allow it)".to_string());
    match rc.kind {
        ResourceKind::Postgres => {
            let m = rc
                .pg_batch(
                    "SELECT (SELECT setting FROM pg_settings WHERE name = 'pg_co.enabled'), \
                            (SELECT setting FROM pg_settings WHERE name = 'pg_co.observe_only'), \
                            CASE WHEN pg_has_role('pg_read_all_settings', 'USAGE') \
                                 THEN current_setting('shared_preload_libraries') END, \
                            current_setting('max_prepared_transactions')",
                )
                .await?;
            let r = rows(&m);
            let r = r.first().ok_or_else(|| format!("{}: no row", rc.name))?;
            let (enabled, observe, spl, mpt) = (r.get(0), r.get(1), r.get(2), r.get(3).unwrap_or("0"));
            let e = if !engine { off() } else { pg_engine(enabled, observe, spl) };
            let (c, slots, one_phase) = if !client {
                (off(), 0, false)
            } else if mpt.trim() == "0" {
                (Err("max_prepared_transactions = 0: the server cannot prepare transactions".to_string()), 0, false)
            } else {
                match pg_shim(rc).await {
                    Ok((n, locked)) => (Ok(()), n, locked),
                    Err(e) if transient(&e) => return Err(format!("{}: {e}", rc.name)),
                    Err(e) => (Err(e), 0, false),
                }
            };
            Ok(Found { probe: Probe { engine: e, client: c }, slots, one_phase })
        }
        ResourceKind::Mariadb => {
            let mut conn = rc.maria_conn().await?;
            let e =
                if !engine { off() } else { maria_engine(&mut conn).await.map_err(|e| format!("{}: {e}", rc.name))? };
            let (c, slots) = if !client {
                (off(), 0)
            } else {
                match maria_shim(&mut conn).await {
                    Ok(n) => (Ok(()), n),
                    Err(e) if transient(&e) => return Err(format!("{}: {e}", rc.name)),
                    Err(e) => (Err(e), 0),
                }
            };
            Ok(Found { probe: Probe { engine: e, client: c }, slots, one_phase: true })
        }
    }
}

/// An error that says nothing about what the resource can do (another daemon creating
/// or filling the shim table at the same moment, a lost connection): the probe counts as
/// "could not ask", and the resource keeps its last known mode.
fn transient(e: &str) -> bool {
    ["SQLSTATE 40001", "SQLSTATE 40P01", "error 1213", "error 1205", "timed out", "connection"]
        .iter()
        .any(|m| e.contains(m))
}

/// pg_co enforces when it was preloaded (its settings exist: a placeholder setting of an
/// unloaded library is not in pg_settings), is enabled and is not observe-only.
/// `spl`: shared_preload_libraries, None when this role may not read it (an ordinary role
/// on a managed service: then the settings' presence is the evidence).
fn pg_engine(enabled: Option<&str>, observe: Option<&str>, spl: Option<&str>) -> Result<(), String> {
    let preloaded = spl.map(|spl| spl.split(',').any(|l| l.trim().trim_matches('"') == "pg_co")).unwrap_or(true);
    match (enabled, observe) {
        _ if !preloaded => Err("pg_co is not in shared_preload_libraries".into()),
        (None, _) => Err("pg_co is not loaded".into()),
        (Some(e), _) if e != "on" => Err(format!("pg_co.enabled = {e}")),
        (_, Some("on")) => Err("pg_co.observe_only = on (pg_co refuses nothing)".into()),
        _ => Ok(()),
    }
}

/// The shim objects, created when missing (sql/client_mode/postgres.sql), and their rows.
/// Created by the database's owner (the script run as it), they ask nothing of the
/// daemon's role: it counts the slots with cotx.shim_slots() and holds them with
/// cotx.shim_hold(), both SECURITY DEFINER and executable by PUBLIC. Returns the rows and
/// whether cotx.shim_locked() is there (one phase in client mode needs it).
async fn pg_shim(rc: &ResourceClient) -> Result<(i32, bool), String> {
    let have =
        "SELECT to_regclass('cotx.shim') IS NOT NULL AND to_regprocedure('cotx.shim_hold(integer)') IS NOT NULL \
                AND to_regprocedure('cotx.shim_touch(integer)') IS NOT NULL, \
                to_regprocedure('cotx.shim_slots()') IS NOT NULL, \
                to_regprocedure('cotx.shim_locked(integer, integer)') IS NOT NULL";
    let flags = |m: &[SimpleQueryMessage]| {
        rows(m)
            .first()
            .map(|r| (r.get(0) == Some("t"), r.get(1) == Some("t"), r.get(2) == Some("t")))
            .unwrap_or((false, false, false))
    };
    let (objects, mut counter, mut locked) = flags(&rc.pg_batch(have).await?);
    if !(objects && counter && locked) {
        // One creator at a time (several daemons may probe together).
        let script = format!("BEGIN; SELECT pg_advisory_xact_lock({}, 1); {PG_SCRIPT}\nCOMMIT;", naming::XA_FORMAT_ID);
        match rc.pg_batch(&script).await {
            Ok(_) => (counter, locked) = (true, true),
            // Objects of an older script (without cotx.shim_slots or cotx.shim_locked) that
            // this role may not replace: used as they are, counted directly if this role
            // may read the table, and no one phase in client mode.
            Err(_) if objects => {}
            Err(e) => {
                return Err(format!(
                    "cannot create the client-mode objects of sql/client_mode/postgres.sql ({e}); run that script as the database's owner"
                ))
            }
        }
    }
    let count = |m: &[SimpleQueryMessage]| simple_first(m).and_then(|v| v.parse::<i32>().ok()).unwrap_or(0);
    let n =
        count(&rc.pg_batch(if counter { "SELECT cotx.shim_slots()" } else { "SELECT count(*) FROM cotx.shim" }).await?);
    if n >= SHIM_SLOTS {
        return Ok((n, locked));
    }
    let fill = format!(
        "INSERT INTO cotx.shim (k) SELECT generate_series(1, {SHIM_SLOTS}) ON CONFLICT DO NOTHING; ANALYZE cotx.shim"
    );
    match rc.pg_batch(&fill).await {
        Ok(_) => Ok((SHIM_SLOTS, locked)),
        Err(e) if n > 0 => {
            crate::telemetry::log::log(
                "warn",
                "client mode: cannot add rows to cotx.shim; using those there",
                serde_json::json!({"resource": rc.name, "rows": n, "error": e}),
            );
            Ok((n, locked))
        }
        Err(e) => Err(format!("cotx.shim has no rows and none can be added: {e}; run sql/client_mode/postgres.sql as the database's owner")),
    }
}

async fn maria_engine(conn: &mut mysql_async::Conn) -> Result<Result<(), String>, String> {
    let status: Option<String> = conn
        .query_first("SELECT PLUGIN_STATUS FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'mysql_co'")
        .await
        .map_err(|e| my_err(&e))?;
    match status.as_deref() {
        None => return Ok(Err("mysql_co is not installed".into())),
        Some("ACTIVE") => {}
        Some(s) => return Ok(Err(format!("mysql_co is {s}"))),
    }
    let flags: Option<(i64, i64)> = conn
        .query_first("SELECT @@global.mysql_co_enabled, @@global.mysql_co_observe_only")
        .await
        .map_err(|e| my_err(&e))?;
    let health: Option<(String, String)> =
        conn.query_first("SHOW GLOBAL STATUS LIKE 'Mysql_co_health'").await.map_err(|e| my_err(&e))?;
    Ok(match (flags, health) {
        (Some((0, _)), _) => Err("mysql_co_enabled = OFF".into()),
        (Some((_, 1)), _) => Err("mysql_co_observe_only = ON (mysql_co refuses nothing)".into()),
        (_, Some((_, h))) if h != "OK" => Err(format!("Mysql_co_health = {h}")),
        (Some(_), Some(_)) => Ok(()),
        _ => Err("mysql_co's variables are missing".into()),
    })
}

/// The statements of sql/client_mode/mariadb.sql: comment lines dropped, split where a
/// line ends with ';' (the script's own rule; the client protocol takes one at a time).
fn maria_statements() -> Vec<String> {
    let mut out = vec![String::new()];
    for line in MARIA_SCRIPT.lines().filter(|l| !l.trim_start().starts_with("--")) {
        let last = out.last_mut().expect("never empty");
        last.push_str(line);
        last.push('\n');
        if line.trim_end().ends_with(';') {
            *last = last.trim().trim_end_matches(';').to_string();
            out.push(String::new());
        }
    }
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

async fn maria_shim(conn: &mut mysql_async::Conn) -> Result<i32, String> {
    let db: Option<Option<String>> = conn.query_first("SELECT DATABASE()").await.map_err(|e| my_err(&e))?;
    if db.flatten().is_none() {
        return Err("its DSN names no database: client mode keeps its table in the database the branches use".into());
    }
    let innodb: Option<String> = conn
        .query_first("SELECT SUPPORT FROM information_schema.ENGINES WHERE ENGINE = 'InnoDB'")
        .await
        .map_err(|e| my_err(&e))?;
    if !matches!(innodb.as_deref(), Some("YES" | "DEFAULT")) {
        return Err("InnoDB is not available (client mode needs its SERIALIZABLE locking and XA)".into());
    }
    let have: Option<i64> = conn
        .query_first("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'cotx_shim'")
        .await
        .map_err(|e| my_err(&e))?;
    if have != Some(1) {
        for stmt in maria_statements() {
            conn.query_drop(stmt).await.map_err(|e| {
                format!("cannot create the client-mode table of sql/client_mode/mariadb.sql ({}); run that script as the database's owner", my_err(&e))
            })?;
        }
    }
    let n: Option<i64> = conn.query_first("SELECT COUNT(*) FROM cotx_shim").await.map_err(|e| my_err(&e))?;
    let n = n.unwrap_or(0) as i32;
    if n >= SHIM_SLOTS {
        return Ok(n);
    }
    let mut err = None;
    for chunk in (1..=SHIM_SLOTS).collect::<Vec<_>>().chunks(1024) {
        let values: Vec<String> = chunk.iter().map(|k| format!("({k})")).collect();
        if let Err(e) = conn.query_drop(format!("INSERT IGNORE INTO cotx_shim (k) VALUES {}", values.join(","))).await {
            err = Some(my_err(&e));
            break;
        }
    }
    match err {
        None => Ok(SHIM_SLOTS),
        Some(e) if n > 0 => {
            crate::telemetry::log::log(
                "warn",
                "client mode: cannot add rows to cotx_shim; using those there",
                serde_json::json!({"rows": n, "error": e}),
            );
            Ok(n)
        }
        Some(e) => Err(format!(
            "cotx_shim has no rows and none can be added: {e}; run sql/client_mode/mariadb.sql as the database's owner"
        )),
    }
}

/// The server's start time (unix seconds) and our XIDs prepared there: what the restart
/// gate looks at (gate.rs).
pub async fn maria_start_and_prepared(
    rc: &ResourceClient,
) -> Result<(super::gate::Start, std::collections::HashSet<(String, String)>), String> {
    let started = maria_started(rc).await?;
    let prepared = rc.list_prepared().await?.into_iter().collect();
    Ok((started, prepared))
}

pub async fn maria_started(rc: &ResourceClient) -> Result<super::gate::Start, String> {
    let mut conn = rc.maria_conn().await?;
    let err = |e: mysql_async::Error| format!("{}: {}", rc.name, my_err(&e));
    // MariaDB keeps the status in information_schema; MySQL 8 moved it to
    // performance_schema (docs/mysql8-client-mode.md): there, the portable SHOW form.
    let (now, status): (Option<i64>, Vec<(String, String)>) = match conn
        .query::<(String, String), _>(
            "SELECT UPPER(VARIABLE_NAME), VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME IN ('UPTIME', 'CONNECTIONS') UNION ALL SELECT 'NOW', CAST(UNIX_TIMESTAMP() AS CHAR)",
        )
        .await
    {
        // One round trip: this runs at every client-mode registration on MariaDB.
        Ok(rows) => (rows.iter().find(|(k, _)| k == "NOW").and_then(|(_, v)| v.parse().ok()), rows),
        Err(mysql_async::Error::Server(se)) if se.code == 1109 => {
            let rows: Vec<(String, String)> =
                conn.query("SHOW GLOBAL STATUS WHERE Variable_name IN ('Uptime', 'Connections')").await.map_err(err)?;
            let rows = rows.into_iter().map(|(k, v)| (k.to_uppercase(), v)).collect();
            (conn.query_first("SELECT UNIX_TIMESTAMP()").await.map_err(err)?, rows)
        }
        Err(e) => return Err(err(e)),
    };
    let get = |k: &str| status.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.parse::<i64>().ok());
    match (now, get("UPTIME"), get("CONNECTIONS")) {
        (Some(now), Some(uptime), Some(connections)) => {
            Ok(super::gate::Start { started: now - uptime, uptime, connections })
        }
        _ => Err(format!("{}: no Uptime / Connections status", rc.name)),
    }
}

/// Prepares a shared helper: it reads the slot rows `first ..= first+n-1` that its
/// branches will write (helpers.rs, docs/client-mode.md). One round trip. READ WRITE is
/// said, not assumed: a helper that PostgreSQL counts as READ ONLY (a role whose
/// default_transaction_read_only is on) would not make the dangerous structure its
/// branches rely on (docs/client-mode.md, "Why a shared helper is as good").
pub async fn pg_prepare_helper(rc: &ResourceClient, gid: &str, first: i32, n: i32) -> Result<(), String> {
    let last = first + n - 1;
    rc.pg_batch(&format!(
        "BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE; \
         SELECT count(cotx.shim_hold(k)) FROM generate_series({first}, {last}) AS k; PREPARE TRANSACTION {}",
        naming::quote_pg(gid)
    ))
    .await
    .map(|_| ())
}

/// Rolls a helper back; Ok(false) when it was not there (rolled back already).
pub async fn pg_rollback_helper(rc: &ResourceClient, gid: &str) -> Result<bool, String> {
    match rc.pg_batch(&format!("ROLLBACK PREPARED {}", naming::quote_pg(gid))).await {
        Ok(_) => Ok(true),
        Err(e) if e.contains("SQLSTATE 42704") => Ok(false),
        Err(e) => Err(e),
    }
}

/// How many slots of the block `first .. first+n-1` are write-locked now: by a branch
/// that wrote its slot and whose transaction has not ended (open on its client's session,
/// or prepared). A READ COMMITTED transaction rolled back at once (not SERIALIZABLE: it
/// adds no edge to anyone); SKIP LOCKED never waits. Ok(0) where cotx.shim_locked is
/// missing (objects of an older script: no branch there committed in one phase).
pub async fn pg_block_locked(rc: &ResourceClient, first: i32, n: i32) -> Result<i32, String> {
    let sql = format!("BEGIN ISOLATION LEVEL READ COMMITTED; SELECT cotx.shim_locked({first}, {n}); ROLLBACK");
    match rc.pg_batch(&sql).await {
        Ok(m) => Ok(simple_first(&m).and_then(|v| v.parse::<i32>().ok()).unwrap_or(0)),
        Err(e) if e.contains("SQLSTATE 42883") => Ok(0),
        Err(e) => Err(e),
    }
}

/// A helper found prepared at a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    /// One-per-branch, of a daemon before shared helpers (a rolling upgrade leaves them):
    /// its slot and its branch.
    PerBranch { key: i32, gtid: String, bid: String },
    /// Shared: its block and the run that prepared it (gtid-shaped token).
    Shared { first: i32, n: i32, token: String },
}

/// The helpers of both kinds prepared at this resource (this database).
pub async fn pg_list_helpers(rc: &ResourceClient) -> Result<Vec<Listed>, String> {
    let like = naming::quote_pg(&format!("{}.%", rc.prefix()));
    let m = rc
        .pg_batch(&format!("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE {like}"))
        .await?;
    Ok(rows(&m).into_iter().filter_map(|r| r.get(0).and_then(|g| parse_helper(rc.prefix(), g))).collect())
}

fn parse_helper(prefix: &str, gid: &str) -> Option<Listed> {
    if let Some((key, gtid, bid)) = naming::parse_pg_helper_gid(prefix, gid) {
        return Some(Listed::PerBranch { key, gtid, bid });
    }
    naming::parse_pg_shared_helper_gid(prefix, gid).map(|(first, n, token)| Listed::Shared { first, n, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_co_counts_only_when_preloaded_enabled_and_enforcing() {
        assert!(transient(
            "cotx.shim has no rows and none can be added: ERROR: could not serialize access (SQLSTATE 40001)"
        ));
        assert!(transient("Deadlock found when trying to get lock (error 1213, SQLSTATE 40001)"));
        assert!(!transient("permission denied for database appdb (SQLSTATE 42501)"));
        assert!(pg_engine(Some("on"), Some("off"), Some("pg_co")).is_ok());
        assert!(pg_engine(Some("on"), Some("off"), Some("auto_explain, \"pg_co\"")).is_ok());
        assert_eq!(pg_engine(Some("on"), None, Some("")).unwrap_err(), "pg_co is not in shared_preload_libraries");
        assert_eq!(pg_engine(None, None, Some("pg_co")).unwrap_err(), "pg_co is not loaded");
        assert_eq!(pg_engine(Some("off"), Some("off"), Some("pg_co")).unwrap_err(), "pg_co.enabled = off");
        assert!(pg_engine(Some("on"), Some("on"), Some("pg_co")).unwrap_err().contains("observe_only"));
        assert!(pg_engine(Some("on"), Some("off"), Some("pg_co_other")).is_err());
        // A role that may not read shared_preload_libraries: pg_co's settings decide.
        assert!(pg_engine(Some("on"), Some("off"), None).is_ok());
        assert_eq!(pg_engine(None, None, None).unwrap_err(), "pg_co is not loaded");
    }

    #[test]
    fn both_kinds_of_helper_gid_are_recognized() {
        assert_eq!(
            parse_helper("cotx", "cotx.s17:n1.abc-1:pg-1"),
            Some(Listed::PerBranch { key: 17, gtid: "n1.abc-1".into(), bid: "pg-1".into() })
        );
        assert_eq!(
            parse_helper("cotx", "cotx.h11x10:n1.000000000abc-3"),
            Some(Listed::Shared { first: 11, n: 10, token: "n1.000000000abc-3".into() })
        );
        assert_eq!(parse_helper("cotx", "cotx:n1.abc-1:pg-1"), None, "a branch");
        assert_eq!(parse_helper("cotx", "other.h11x10:n1.000000000abc-3"), None);
    }

    #[test]
    fn the_scripts_create_and_fill_what_the_daemon_uses() {
        let stmts = maria_statements();
        assert_eq!(stmts.len(), 2, "{stmts:?}");
        assert!(stmts[0].starts_with("CREATE TABLE IF NOT EXISTS cotx_shim") && !stmts[0].contains(';'));
        assert!(stmts[1].starts_with("INSERT IGNORE INTO cotx_shim") && stmts[1].ends_with("AS slots"));
        // Both fill exactly the slots the daemon counts on.
        assert!(stmts[1].contains("i < 63") && stmts[1].contains("64 * b.i") && 64 * 64 == SHIM_SLOTS);
        assert!(PG_SCRIPT.contains(&format!("generate_series(1, {SHIM_SLOTS})")));
        assert!(PG_SCRIPT.contains("FUNCTION cotx.shim_slots() RETURNS bigint"));
        assert!(PG_SCRIPT.contains(
            "EXECUTE ON FUNCTION cotx.shim_hold(integer), cotx.shim_touch(integer), cotx.shim_slots(),\n    cotx.shim_locked(integer, integer) TO PUBLIC"
        ));
    }
}

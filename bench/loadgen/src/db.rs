//! Database sessions (tokio-postgres, mysql_async), statements with integer parameters,
//! and what an engine error means: the same refusal kinds as clients/python/cotx/refusals.py.

use std::collections::HashMap;
use std::error::Error as _;

use bytes::BytesMut;
use mysql_async::prelude::Queryable;
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// An integer parameter or result, whatever integer type the column has.
#[derive(Debug, Clone, Copy)]
pub struct Int(pub i64);

impl ToSql for Int {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *ty {
            Type::INT2 => (self.0 as i16).to_sql(ty, out),
            Type::INT4 => (self.0 as i32).to_sql(ty, out),
            _ => self.0.to_sql(ty, out),
        }
    }
    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::INT2 | Type::INT4 | Type::INT8)
    }
    to_sql_checked!();
}

impl<'a> FromSql<'a> for Int {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Int(match *ty {
            Type::INT2 => i16::from_sql(ty, raw)? as i64,
            Type::INT4 => i32::from_sql(ty, raw)? as i64,
            _ => i64::from_sql(ty, raw)?,
        }))
    }
    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::INT2 | Type::INT4 | Type::INT8)
    }
}

/// An engine (or transport) error with what the attempt log and the classifier need.
#[derive(Debug, Clone)]
pub struct DbError {
    pub db: &'static str, // "pg" | "my"
    pub sqlstate: Option<String>,
    pub errno: Option<u16>,
    pub message: String,
    pub detail: Option<String>,
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.db, self.sqlstate.as_deref().unwrap_or(""), self.message)
    }
}

impl DbError {
    pub fn from_pg(e: tokio_postgres::Error) -> DbError {
        if let Some(d) = e.as_db_error() {
            return DbError {
                db: "pg",
                sqlstate: Some(d.code().code().to_string()),
                errno: None,
                message: d.message().to_string(),
                detail: d.detail().map(str::to_string),
            };
        }
        let msg = match e.source() {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        };
        DbError { db: "pg", sqlstate: e.code().map(|c| c.code().to_string()), errno: None, message: msg, detail: None }
    }

    pub fn from_my(e: mysql_async::Error) -> DbError {
        match e {
            mysql_async::Error::Server(se) => DbError {
                db: "my",
                sqlstate: Some(se.state.clone()),
                errno: Some(se.code),
                message: se.message.clone(),
                detail: None,
            },
            other => DbError { db: "my", sqlstate: None, errno: None, message: other.to_string(), detail: None },
        }
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"db": self.db, "sqlstate": self.sqlstate, "errno": self.errno,
                           "message": self.message, "detail": self.detail})
    }

    /// The refusal kind (cotx.refusals.KINDS), or "other: ..." when it is none of those.
    pub fn kind(&self) -> String {
        let low = self.message.to_lowercase();
        if self.db == "pg" {
            if low.contains("pg_co refused") {
                if low.contains("rule a (summarized") {
                    return "pg_co rule A (summarized)".into();
                }
                for r in ["a", "b", "c"] {
                    if low.contains(&format!("commitment ordering rule {r}")) {
                        return format!("pg_co rule {}", r.to_uppercase());
                    }
                }
                if low.contains("not serializable") {
                    return "pg_co not serializable".into();
                }
                if low.contains("read only") {
                    return "pg_co read only".into();
                }
            }
            if low.contains("pg_co: lock_timeout expired while waiting") {
                return "pg_co rule B wait timeout".into();
            }
            match self.sqlstate.as_deref() {
                Some("40001") if low.contains("concurrent update") => return "pg concurrent update".into(),
                Some("40001") => return "pg serialization failure".into(),
                Some("40P01") => return "pg deadlock".into(),
                Some("55P03") => return "pg lock timeout".into(),
                Some("57014") => return "pg cancelled".into(),
                _ => {}
            }
        } else {
            let n = self.errno;
            if low.contains("mysql_co:") && matches!(n, Some(1402) | None) {
                if low.contains("restart gate") {
                    return "mysql_co restart gate".into();
                }
                if low.contains("refused: this xa branch ran at") {
                    return "mysql_co isolation".into();
                }
            }
            match n {
                Some(1213) => return "my deadlock".into(),
                Some(1205) => return "my lock wait timeout".into(),
                Some(1402) | Some(1613) | Some(1614) => return "my XA rollback".into(),
                Some(1317) => return "my interrupted".into(),
                _ => {}
            }
        }
        let m: String = self.message.chars().take(60).collect();
        format!("{} other: {}", self.db, m.replace([',', ';', '=', '\n'], " "))
    }

    /// Whether a new attempt may succeed (a conflict), as cotx.refusals says.
    pub fn retryable(&self) -> bool {
        let k = self.kind();
        !(k.contains("other")
            || k == "pg_co not serializable"
            || k == "pg_co read only"
            || k == "pg cancelled"
            || k == "mysql_co isolation"
            || k == "my interrupted")
    }
}

/// SQL written with `?` placeholders (MariaDB's), numbered `$n` for PostgreSQL.
pub fn pg_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for ch in sql.chars() {
        if ch == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(ch);
        }
    }
    out
}

pub struct PgSession {
    pub client: tokio_postgres::Client,
    stmts: HashMap<String, tokio_postgres::Statement>,
    /// Its backend pid: a branch's registration carries it, as the clients' do (the
    /// daemon's deadlock detection maps lock waits by it).
    pub id: i64,
}

impl PgSession {
    pub async fn connect(dsn: &str, lock_timeout_ms: u64) -> Result<PgSession, DbError> {
        let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await.map_err(DbError::from_pg)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut s = PgSession { client, stmts: HashMap::new(), id: 0 };
        s.simple(&format!("SET lock_timeout = '{lock_timeout_ms}ms'")).await?;
        s.id = s.first_value("SELECT pg_backend_pid()").await?.and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok(s)
    }

    pub async fn simple(&self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).await.map_err(DbError::from_pg)
    }

    /// The last column of the first row of a simple-protocol query, as text.
    pub async fn first_value(&self, sql: &str) -> Result<Option<String>, DbError> {
        let (first, r) = self.first_value_kept(sql).await;
        r.map(|()| first)
    }

    /// The last column of the first row of a simple query of several statements, kept
    /// when a later statement fails (the rows arrive before its error), with how the whole
    /// query ended.
    pub async fn first_value_kept(&self, sql: &str) -> (Option<String>, Result<(), DbError>) {
        use futures_util::StreamExt;
        let stream = match self.client.simple_query_raw(sql).await {
            Ok(s) => s,
            Err(e) => return (None, Err(DbError::from_pg(e))),
        };
        let mut stream = std::pin::pin!(stream);
        let mut first = None;
        while let Some(m) = stream.next().await {
            match m {
                Ok(tokio_postgres::SimpleQueryMessage::Row(r)) if first.is_none() && !r.is_empty() => {
                    first = r.get(r.len() - 1).map(str::to_string);
                }
                Ok(_) => {}
                Err(e) => return (first, Err(DbError::from_pg(e))),
            }
        }
        (first, Ok(()))
    }

    async fn stmt(&mut self, sql: &str) -> Result<tokio_postgres::Statement, DbError> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(&pg_sql(sql)).await.map_err(DbError::from_pg)?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    /// Runs a statement; returns the first column of the first row, if any.
    pub async fn exec(&mut self, sql: &str, params: &[i64]) -> Result<Option<i64>, DbError> {
        let st = self.stmt(sql).await?;
        let ps: Vec<Int> = params.iter().map(|&x| Int(x)).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = ps.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        if st.columns().is_empty() {
            self.client.execute(&st, &refs).await.map_err(DbError::from_pg)?;
            return Ok(None);
        }
        let rows = self.client.query(&st, &refs).await.map_err(DbError::from_pg)?;
        Ok(match rows.first() {
            Some(r) if !r.is_empty() => r.try_get::<_, Option<Int>>(r.len() - 1).ok().flatten().map(|i| i.0),
            _ => None,
        })
    }

    pub async fn exists_decide(&self) -> Result<bool, DbError> {
        let r = self
            .client
            .query_one("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'co' AND p.proname = 'decide'", &[])
            .await
            .map_err(DbError::from_pg)?;
        Ok(r.get::<_, i64>(0) > 0)
    }
}

pub struct MySession {
    pub conn: mysql_async::Conn,
    /// Its connection id (PgSession::id).
    pub id: i64,
    /// Client mode: the server's start this session's check read (`check_once`), None
    /// until it ran; the registrations send it and the slot write checks it.
    pub checked: Option<Option<i64>>,
}

impl MySession {
    pub async fn connect(url: &str, lock_timeout_ms: u64, isolation: &str) -> Result<MySession, DbError> {
        let opts = mysql_async::Opts::from_url(url).map_err(|e| DbError {
            db: "my",
            sqlstate: None,
            errno: None,
            message: e.to_string(),
            detail: None,
        })?;
        let mut conn = mysql_async::Conn::new(opts).await.map_err(DbError::from_my)?;
        let secs = lock_timeout_ms.div_ceil(1000).max(1);
        conn.query_drop(format!("SET SESSION innodb_lock_wait_timeout = {secs}")).await.map_err(DbError::from_my)?;
        conn.query_drop(format!("SET SESSION TRANSACTION ISOLATION LEVEL {isolation}"))
            .await
            .map_err(DbError::from_my)?;
        let id = i64::from(conn.id());
        Ok(MySession { conn, id, checked: None })
    }

    pub async fn simple(&mut self, sql: &str) -> Result<(), DbError> {
        self.conn.query_drop(sql).await.map_err(DbError::from_my)
    }

    /// Client mode, once per connection (the clients' MariaDB check, docs/client-mode.md):
    /// `SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE`, then the level read back (a
    /// proxy or an init_connect may have changed it; MariaDB 10.11 spells it tx_isolation)
    /// together with the server's start as the daemon's restart gate computes it, kept in
    /// @cotx_started. Returns that start, for the registrations.
    pub async fn check_once(&mut self) -> Result<Option<i64>, DbError> {
        if let Some(started) = self.checked {
            return Ok(started);
        }
        self.simple("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE").await?;
        let row: Option<(Option<String>, Option<i64>)> = self
            .conn
            .query_first(
                "SELECT @@session.tx_isolation, @cotx_started := UNIX_TIMESTAMP() - CAST(VARIABLE_VALUE AS SIGNED) \
                 FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'",
            )
            .await
            .map_err(DbError::from_my)?;
        let (level, started) = row.unwrap_or((None, None));
        if level.as_deref() != Some("SERIALIZABLE") {
            return Err(DbError {
                db: "my",
                sqlstate: None,
                errno: None,
                message: format!("client mode needs SERIALIZABLE branches; the session is {level:?} after SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
                detail: None,
            });
        }
        self.checked = Some(started);
        Ok(started)
    }

    /// Client mode: the branch's slot write, in the session the check was made in: it must
    /// change exactly row `k` (another session, a reset or a missing row: the branch fails
    /// before it prepares, and the connection is checked again).
    pub async fn shim_touch(&mut self, k: i64) -> Result<(), DbError> {
        let started = self.checked.flatten().map_or("NULL".to_string(), |t| t.to_string());
        self.simple(&format!("UPDATE cotx_shim SET v = v + 1 WHERE k = {k} AND @cotx_started <=> {started}")).await?;
        if self.conn.affected_rows() != 1 {
            self.checked = None;
            return Err(DbError {
                db: "my",
                sqlstate: None,
                errno: None,
                message: format!("client mode: slot {k} not written in the checked session; run again"),
                detail: None,
            });
        }
        Ok(())
    }

    /// Runs a statement; returns the last column of the first row, if any (the same
    /// convention as PgSession::exec, so a workload reads one value per query).
    pub async fn exec(&mut self, sql: &str, params: &[i64]) -> Result<Option<i64>, DbError> {
        let ps: Vec<mysql_async::Value> = params.iter().map(|&x| mysql_async::Value::Int(x)).collect();
        let rows: Vec<mysql_async::Row> = self.conn.exec(sql, ps).await.map_err(DbError::from_my)?;
        Ok(match rows.first() {
            Some(r) if !r.is_empty() => r.get_opt::<Option<i64>, usize>(r.len() - 1).and_then(|x| x.ok()).flatten(),
            _ => None,
        })
    }
}

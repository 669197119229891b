//! One client: its sessions, and one global transaction attempt in a mode, with the 2PC
//! protocol exactly as the Python client (clients/python/cotx/transaction.py and branch.py) runs it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::coord::Coord;
use crate::db::{DbError, MySession, PgSession};
use crate::http::{CoordError, Http};
use crate::workload::{Db, Op, Sub, P};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Local,
    TwoPc,
    Co,
    /// The product's client mode (the daemon in `enforcement = "client"`, pg_co and
    /// mysql_co off): the branch writes the shim slot the registration answer names.
    Client,
    Dip,
}

impl Mode {
    /// `shim` is the earlier name of `client` (Sonata's shims, now the product's).
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "local" => Mode::Local,
            "2pc" => Mode::TwoPc,
            "co" => Mode::Co,
            "client" | "shim" => Mode::Client,
            "dip" => Mode::Dip,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::TwoPc => "2pc",
            Mode::Co => "co",
            Mode::Client => "client",
            Mode::Dip => "dip",
        }
    }

    /// The enforcement the coordinator must answer with at every branch registration in
    /// this mode (the daemon's `[[resources]] enforcement`): a mode measured with another
    /// one would be measuring something else, so the driver stops on a mismatch.
    pub fn enforcement(self) -> Option<&'static str> {
        match self {
            Mode::Local => None,
            Mode::TwoPc => Some("none"),
            Mode::Co | Mode::Dip => Some("engine"),
            Mode::Client => Some("client"),
        }
    }
}

pub struct Cfg {
    pub mode: Mode,
    pub pg_dsn: String,
    pub my_url: String,
    /// One daemon URL, or several comma-separated (daemons sharing a PostgreSQL store):
    /// client `wid` talks to URL `wid mod n` for all its transactions, so each daemon
    /// owns (begins, decides, finishes) the transactions of its clients.
    pub coord_url: String,
    pub token: Option<String>,
    pub lock_timeout_ms: u64,
    pub parallel_prepare: bool,
    pub parallel_finish: bool,
    /// MariaDB XA branches' isolation: REPEATABLE READ in mode 2pc, SERIALIZABLE otherwise,
    /// unless --my-isolation says (a 2pc baseline at SERIALIZABLE).
    pub my_isolation: &'static str,
    /// Every branch registered with the begin, and "finished" acknowledgements carried by
    /// the next begin (two requests per transaction instead of S + 2); otherwise the
    /// per-step protocol that any daemon version understands.
    pub batched: bool,
    /// `--coord inproc:CONFIG`: the coordinator in this process, shared by every client.
    pub in_process: Option<coordinator_daemon::in_process::InProcess>,
    /// `--retry-backoff-ms B`: before retrying a refused attempt, wait the clients'
    /// documented jittered backoff (cotx/retry.py `backoff`: full jitter, a random time in
    /// [0, min(1 s, B · 2^n)) before retry n); 0 (the default): at once, as before.
    pub retry_backoff_ms: f64,
    /// `--one-request` (modes 2pc and co): each client leases a range of gtids and a
    /// transaction is one request, its commit listing every branch (the Python client's
    /// `one_request=True`; docs/coordinator.md, "One request per transaction").
    pub one_request: bool,
    /// `--handover-while-preparing` (dip with --one-request): the commit handing the
    /// decision over goes out while the other branches prepare, not after their PREPAREs
    /// answered (the default, as the clients do). Measured slower on this two-core machine
    /// (bench/RESULTS.md, "dip's hand-over beside the PREPAREs"): kept to run that again.
    pub handover_while_preparing: bool,
    /// `--prepare-pg-last`: the branches prepared one after the other with MariaDB's first
    /// and PostgreSQL's last (default: in the order the transaction opened them).
    pub prepare_pg_last: bool,
}

/// Gtids a client leases at a time on the one-request path.
const LEASE_COUNT: u64 = 1000;

/// A client's leased range of gtids (`POST /v1/gtid-leases`), drawn from during the first
/// half of its lease only (a transaction must be committed before the lease runs out).
struct Lease {
    prefix: String,
    next: u64,
    end: u64,
    stop_at: std::time::Instant,
    gid_prefix: String,
    xa_format_id: i64,
}

impl Lease {
    fn usable(&self) -> bool {
        self.next < self.end && std::time::Instant::now() < self.stop_at
    }

    /// A branch's names as a registration would answer them: gid `<gid_prefix>:<gtid>:<bid>`,
    /// XID (gtid, bid, format).
    fn names(&self, g: &str, bid: &str, db: Db, enforcement: &str) -> Value {
        match db {
            Db::Pg => json!({"gid": format!("{}:{g}:{bid}", self.gid_prefix), "enforcement": enforcement}),
            Db::My => {
                json!({"xid": {"gtrid": g, "bqual": bid, "format_id": self.xa_format_id}, "enforcement": enforcement})
            }
        }
    }
}

/// Acknowledgements held for the next begin at most (then sent on their own).
const MAX_HELD_ACKS: usize = 64;

pub enum Sess {
    Pg(PgSession),
    My(MySession),
}

impl Sess {
    fn id(&self) -> i64 {
        match self {
            Sess::Pg(s) => s.id,
            Sess::My(s) => s.id,
        }
    }

    async fn simple(&mut self, sql: &str) -> Result<(), DbError> {
        match self {
            Sess::Pg(s) => s.simple(sql).await,
            Sess::My(s) => s.simple(sql).await,
        }
    }

    /// The last column of the first row of a simple query (PostgreSQL; MariaDB: run, None).
    async fn first_value(&mut self, sql: &str) -> Result<Option<String>, DbError> {
        match self {
            Sess::Pg(s) => s.first_value(sql).await,
            Sess::My(s) => s.simple(sql).await.map(|()| None),
        }
    }

    async fn run_ops(&mut self, ops: &[Op]) -> Result<(), DbError> {
        let mut regs = [0i64; 4];
        for op in ops {
            let ps: Vec<i64> = op
                .params
                .iter()
                .map(|p| match *p {
                    P::I(x) => x,
                    P::Reg(r) => regs[r],
                    P::RegTimes(r, m) => regs[r] * m,
                })
                .collect();
            let v = match self {
                Sess::Pg(s) => s.exec(&op.sql, &ps).await?,
                Sess::My(s) => s.exec(&op.sql, &ps).await?,
            };
            if let Some(r) = op.store {
                regs[r] = v.unwrap_or(0);
            }
        }
        Ok(())
    }
}

/// Why an attempt failed: the refusal kind and the engine error, if one caused it.
pub struct Failure {
    pub kind: String,
    pub err: Option<DbError>,
}

impl From<DbError> for Failure {
    fn from(e: DbError) -> Failure {
        Failure { kind: e.kind(), err: Some(e) }
    }
}

impl From<CoordError> for Failure {
    fn from(e: CoordError) -> Failure {
        Failure { kind: format!("coordinator {}", e.code), err: None }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum BState {
    Active,
    Prepared,
    /// Voted read-only (plain 2PC): committed in one phase at its vote, listed as prepared
    /// in the commit; nothing is run for it after the decision, only its acknowledgement.
    Voted,
    Done,
}

struct Branch {
    bid: String,
    session: String,
    db: Db,
    gid: String, // PostgreSQL: the literal, quoted
    xid: String, // MariaDB: 'gtrid','bqual',format
    state: BState,
    /// Client mode: the shim slot the branch writes just before it prepares (PostgreSQL:
    /// the row the daemon's prepared helper read; MariaDB: a write that keeps the
    /// branch's SERIALIZABLE read locks until the decision).
    shim: Option<i64>,
    /// Declared read-only (Sub::read_only); `wrote_nothing`: what the check at its prepare
    /// found (`prepare_one`): such branches are listed with the commit (`read_only`).
    read_only: bool,
    wrote_nothing: bool,
    /// Client mode: the daemon lets this branch commit in one phase when it is its
    /// transaction's only one (after its slot write; docs/client-mode.md, "One phase").
    one_phase: bool,
    /// Plain 2PC (enforcement "none"): no commitment ordering is claimed at its resource,
    /// so a read-only branch may vote read-only there (`prepare_one`).
    plain: bool,
}

impl Branch {
    /// MariaDB outside client mode runs a read-only branch as a READ ONLY transaction (a
    /// write is refused there); in client mode the slot write must go through, and such a
    /// branch is never listed (docs/client-mode.md, "Read-only branches"). PostgreSQL's are
    /// looked at before PREPARE. As the clients (cotx.branch.Branch._engine_read_only).
    fn engine_read_only(&self) -> bool {
        self.read_only && self.db == Db::My && self.shim.is_none()
    }

    /// Its state after its prepare (`prepare_one`'s answer).
    fn voted(&mut self, vote: Vote) {
        (self.state, self.wrote_nothing) = match vote {
            Vote::Prepared { wrote_nothing } => (BState::Prepared, wrote_nothing),
            Vote::ReadOnly => (BState::Voted, true),
        };
    }
}

fn safe_id(s: &str) -> Result<&str, Failure> {
    if !s.is_empty() && s.len() <= 200 && s.chars().all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c)) {
        Ok(s)
    } else {
        Err(Failure { kind: "coordinator bad id".into(), err: None })
    }
}

pub struct Client {
    pub wid: usize,
    pub cfg: Arc<Cfg>,
    sess: HashMap<String, Sess>,
    http: Option<Coord>,
    /// Branch registrations by "resource:enforcement" as the coordinator answered them.
    pub enforcement: BTreeMap<String, u64>,
    /// Branches of committed transactions that could not be finished on their session.
    pub unfinished: u64,
    /// --handover-while-preparing: attempts whose PREPARE was refused after the
    /// daemon had taken the hand-over (the decision branch rolled back, then reported).
    pub refused_after_handover: u64,
    /// The last attempt's gtid and its branches' PostgreSQL gids / MariaDB xids (attempt log).
    pub last_gtid: Option<String>,
    pub last_ids: Vec<String>,
    /// dip: the decision branch's index and PostgreSQL xid (32 bits, as pg_co's refusals
    /// name a blocker that committed locally, without a gid).
    pub last_decider_xid: Option<(usize, u32)>,
    /// Finished branches not yet acknowledged (batched calls): gtid, outcome, branch ids.
    acks: Vec<Value>,
    /// --one-request: the current range (None: lease one at the next transaction).
    lease: Option<Lease>,
    /// --one-request: the resources' enforcement as GET /v1/resources said, checked once
    /// (no registration answers it on this path).
    modes_checked: bool,
    /// The attempt under way is on the one-request path: the daemon knows nothing of it
    /// before its commit, so nothing is reported or aborted there.
    leased_tx: bool,
    /// Where the last attempt's time went: the instant each step of it ended, in order
    /// (the driver's `phases_p50_ms`: what a mode saves, step by step).
    pub marks: Vec<(&'static str, std::time::Instant)>,
}

impl Client {
    pub async fn open(cfg: Arc<Cfg>, wid: usize, sessions: &[(String, Db)]) -> Result<Client, String> {
        let mut sess = HashMap::new();
        let my_iso = cfg.my_isolation;
        for (name, db) in sessions {
            let s = match db {
                Db::Pg => {
                    Sess::Pg(PgSession::connect(&cfg.pg_dsn, cfg.lock_timeout_ms).await.map_err(|e| e.to_string())?)
                }
                Db::My => Sess::My(
                    MySession::connect(&cfg.my_url, cfg.lock_timeout_ms, my_iso).await.map_err(|e| e.to_string())?,
                ),
            };
            sess.insert(name.clone(), s);
        }
        let http = match &cfg.in_process {
            _ if cfg.mode == Mode::Local => None,
            Some(c) => Some(Coord::InProcess(c.clone())),
            None => Some(Coord::Http(Http::new(coord_url(&cfg.coord_url, wid), cfg.token.clone())?)),
        };
        Ok(Client {
            wid,
            cfg,
            sess,
            http,
            enforcement: BTreeMap::new(),
            unfinished: 0,
            refused_after_handover: 0,
            last_gtid: None,
            last_ids: vec![],
            last_decider_xid: None,
            acks: vec![],
            lease: None,
            modes_checked: false,
            leased_tx: false,
            marks: Vec::new(),
        })
    }

    pub async fn has_decide(&self) -> Result<bool, String> {
        for s in self.sess.values() {
            if let Sess::Pg(p) = s {
                return p.exists_decide().await.map_err(|e| e.to_string());
            }
        }
        Ok(false)
    }

    // --- local mode ---------------------------------------------------------------------
    /// Runs subs[from..] as independent local transactions; on a failure returns how many
    /// of them committed before it (the caller retries the rest, as driver.py's LocalRetry).
    pub async fn run_local(&mut self, subs: &[Sub], from: usize) -> Result<(), (usize, Failure)> {
        for (i, s) in subs.iter().enumerate().skip(from) {
            let sess = self.sess.get_mut(&s.session).expect("session opened");
            let r = async {
                sess.simple(if s.db == Db::Pg { "BEGIN ISOLATION LEVEL SERIALIZABLE" } else { "START TRANSACTION" })
                    .await?;
                sess.run_ops(&s.ops).await?;
                sess.simple("COMMIT").await
            }
            .await;
            if let Err(e) = r {
                let _ = sess.simple("ROLLBACK").await;
                return Err((i, e.into()));
            }
        }
        Ok(())
    }

    /// Autocommit statements on their session (no transaction, no coordinator).
    pub async fn run_autocommit(&mut self, sub: &Sub) -> Result<(), Failure> {
        let sess = self.sess.get_mut(&sub.session).expect("session opened");
        sess.run_ops(&sub.ops).await.map_err(Failure::from)
    }

    pub async fn close(&mut self) {
        self.flush_acks().await;
        if let Some(h) = self.http.as_mut() {
            // Read the answers of pipelined acknowledgements before the process exits.
            let _ = h.request("GET", "/healthz", &Value::Null).await;
        }
    }

    /// Acknowledges finished branches: held for the next begin (batched calls), otherwise
    /// sent at once without waiting for the answer.
    async fn ack(&mut self, g: &str, outcome: &str, bids: Vec<String>) {
        if bids.is_empty() {
            return;
        }
        if self.cfg.batched || self.cfg.one_request {
            self.acks.push(json!({"gtid": g, "outcome": outcome, "branches": bids}));
            if self.acks.len() >= MAX_HELD_ACKS {
                self.flush_acks().await;
            }
            return;
        }
        let http = self.http.as_mut().unwrap();
        if let [bid] = &bids[..] {
            http.send_nowait(
                "POST",
                &format!("/v1/transactions/{g}/branches/{bid}/finished"),
                &json!({"outcome": outcome}),
            )
            .await;
        } else {
            http.send_nowait(
                "POST",
                &format!("/v1/transactions/{g}/finished"),
                &json!({"outcome": outcome, "branches": bids}),
            )
            .await;
        }
    }

    /// The held acknowledgements, each on its own request (at close, or too many held).
    async fn flush_acks(&mut self) {
        let Some(http) = self.http.as_mut() else { return };
        for a in std::mem::take(&mut self.acks) {
            let g = a["gtid"].as_str().unwrap_or_default().to_string();
            http.send_nowait(
                "POST",
                &format!("/v1/transactions/{g}/finished"),
                &json!({"outcome": a["outcome"], "branches": a["branches"]}),
            )
            .await;
        }
    }

    // --- one global transaction through the coordinator ------------------------------------
    pub async fn run_global(&mut self, subs: &[Sub]) -> Result<(), Failure> {
        self.global(subs).await
    }

    /// --one-request: a gtid of the client's range, leasing a new range first when the
    /// current one is used up or past half its lease; the resources' enforcement checked
    /// against the mode's once.
    async fn draw(&mut self) -> Result<String, Failure> {
        let http = self.http.as_mut().unwrap();
        if !self.modes_checked {
            let expected = self.cfg.mode.enforcement().unwrap_or("none");
            // A coordinator just started (in this process) has not probed its resources
            // yet: "unknown" is asked again, for up to 10 s.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut v = http.request("GET", "/v1/resources", &Value::Null).await?;
            while std::time::Instant::now() < deadline
                && v["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|r| r["enforcement"]["mode"].as_str().unwrap_or("unknown") == "unknown")
            {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                v = http.request("GET", "/v1/resources", &Value::Null).await?;
            }
            for r in v["resources"].as_array().into_iter().flatten() {
                let mode = r["enforcement"]["mode"].as_str().unwrap_or("unknown");
                if mode != expected {
                    let why = format!(
                        "other: mode {} needs enforcement {expected} but the coordinator says {mode} for resource {}",
                        self.cfg.mode.name(),
                        r["name"]
                    );
                    return Err(Failure { kind: why, err: None });
                }
            }
            self.modes_checked = true;
        }
        if !self.lease.as_ref().is_some_and(Lease::usable) {
            let t0 = std::time::Instant::now();
            let v = http.request("POST", "/v1/gtid-leases", &json!({"count": LEASE_COUNT})).await?;
            let first = v["first"].as_u64().unwrap_or(0);
            let ttl_ms = v["expires_in_ms"].as_u64().unwrap_or(0);
            self.lease = Some(Lease {
                prefix: v["prefix"].as_str().unwrap_or_default().to_string(),
                next: first,
                end: first + v["count"].as_u64().unwrap_or(0),
                stop_at: t0 + std::time::Duration::from_millis(ttl_ms / 2),
                gid_prefix: v["gid_prefix"].as_str().unwrap_or_default().to_string(),
                xa_format_id: v["xa_format_id"].as_i64().unwrap_or(0),
            });
        }
        let l = self.lease.as_mut().unwrap();
        let g = format!("{}{:x}", l.prefix, l.next);
        l.next += 1;
        Ok(g)
    }

    async fn global(&mut self, subs: &[Sub]) -> Result<(), Failure> {
        let mode = self.cfg.mode;
        let mut gtid: Option<String> = None;
        let mut br: Vec<Branch> = Vec::with_capacity(subs.len());
        self.last_gtid = None;
        self.last_ids.clear();
        self.last_decider_xid = None;
        // The first step: the attempts before this one and their backoff (0 on a first try);
        // the driver's loop clears the steps before every attempt.
        self.mark("earlier attempts");
        self.leased_tx = self.cfg.one_request;
        if self.leased_tx {
            gtid = Some(self.draw().await?);
        }
        // Batched calls: every branch registered by the begin, the held acknowledgements
        // along (a refused registration leaves nothing behind, or an aborted transaction).
        let mut batch: Vec<Value> = vec![];
        // Client mode on MariaDB: each session checked once, its server start sent with the
        // registrations (the daemon's restart gate then asks the server nothing).
        let mut started: HashMap<String, i64> = HashMap::new();
        if mode == Mode::Client {
            for sub in subs.iter().filter(|s| s.db == Db::My) {
                if let Some(Sess::My(m)) = self.sess.get_mut(&sub.session) {
                    if let Some(t) = m.check_once().await? {
                        started.insert(sub.session.clone(), t);
                    }
                }
            }
        }
        let registration = |sub: &Sub, bid: String, session: i64| {
            let mut r = json!({"resource": sub.db.name(), "branch_id": bid, "session": session});
            if let Some(t) = started.get(&sub.session) {
                r["server_started"] = json!(t);
            }
            r
        };
        if self.cfg.batched && !self.leased_tx {
            let regs: Vec<Value> = subs
                .iter()
                .enumerate()
                .map(|(i, sub)| registration(sub, format!("b{i}"), self.sess[&sub.session].id()))
                .collect();
            let mut body = json!({"branches": regs});
            if !self.acks.is_empty() {
                body["finished"] = Value::Array(std::mem::take(&mut self.acks));
            }
            let http = self.http.as_mut().unwrap();
            let v = http.request("POST", "/v1/transactions", &body).await?;
            gtid = v["gtid"].as_str().map(str::to_string);
            batch = v["branches"].as_array().cloned().unwrap_or_default();
            if batch.len() != subs.len() {
                let why = format!(
                    "other: the coordinator answered {} registrations for {} branches",
                    batch.len(),
                    subs.len()
                );
                self.abort(gtid.as_deref().unwrap_or_default(), &mut br, &why).await;
                return Err(Failure { kind: why, err: None });
            }
        }
        for (i, sub) in subs.iter().enumerate() {
            let bid = format!("b{i}");
            let reg = registration(sub, bid.clone(), self.sess[&sub.session].id());
            let http = self.http.as_mut().unwrap();
            let expected = mode.enforcement().unwrap_or("none");
            let r = match &gtid {
                Some(g) if self.leased_tx => Ok(self.lease.as_ref().unwrap().names(g, &bid, sub.db, expected)),
                _ if self.cfg.batched => Ok(batch[i].clone()),
                None => http.request("POST", "/v1/transactions", &json!({"branch": reg})).await.map(|v| {
                    gtid = v["gtid"].as_str().map(str::to_string);
                    v["branch"].clone()
                }),
                Some(g) => http.request("POST", &format!("/v1/transactions/{g}/branches"), &reg).await,
            };
            let r = match r {
                Ok(v) => v,
                Err(e) => {
                    if gtid.is_some() {
                        self.abort(gtid.as_deref().unwrap(), &mut br, &e.to_string()).await;
                    }
                    return Err(e.into());
                }
            };
            let g = gtid.clone().unwrap_or_default();
            self.last_gtid = gtid.clone();
            self.last_ids.push(match r["gid"].as_str() {
                Some(gid) => gid.to_string(),
                None => format!(
                    "{},{},{}",
                    r["xid"]["gtrid"].as_str().unwrap_or(""),
                    r["xid"]["bqual"].as_str().unwrap_or(""),
                    r["xid"]["format_id"]
                ),
            });
            let (gid, xid) = match sub.db {
                Db::Pg => (format!("'{}'", safe_id(r["gid"].as_str().unwrap_or(""))?), String::new()),
                Db::My => {
                    let x = &r["xid"];
                    let xid = format!(
                        "'{}','{}',{}",
                        safe_id(x["gtrid"].as_str().unwrap_or(""))?,
                        safe_id(x["bqual"].as_str().unwrap_or(""))?,
                        x["format_id"].as_i64().unwrap_or(0)
                    );
                    (String::new(), xid)
                }
            };
            // How commitment ordering is enforced at this resource, as the coordinator says
            // (the Python client's Branch.__enter__): client mode names the shim slot.
            let enforcement = r["enforcement"].as_str().unwrap_or("engine").to_string();
            *self.enforcement.entry(format!("{}:{enforcement}", sub.db.name())).or_default() += 1;
            let shim = if enforcement == "client" { r["shim"]["key"].as_i64() } else { None };
            if enforcement != expected || (enforcement == "client" && shim.is_none()) {
                // Not a conflict: the daemon is configured for another mode (the client
                // loop stops on a kind with "other" in it and reports the message).
                let why = format!("other: mode {} needs enforcement {expected} but the coordinator answered {enforcement} (shim {}) for resource {}",
                                  mode.name(), r["shim"], sub.db.name());
                self.abort(&g, &mut br, &why).await;
                return Err(Failure { kind: why, err: None });
            }
            let mut b = Branch {
                bid: bid.clone(),
                session: sub.session.clone(),
                db: sub.db,
                gid,
                xid,
                state: BState::Active,
                shim,
                read_only: sub.read_only,
                wrote_nothing: false,
                one_phase: shim.is_some() && r["shim"]["one_phase"].as_bool().unwrap_or(false),
                plain: enforcement == "none",
            };
            // Begin and the statements; client mode's slot is written at prepare (prepare_one).
            let my_iso = self.cfg.my_isolation;
            let sess = self.sess.get_mut(&sub.session).expect("session opened");
            let mut begun = None;
            let run = async {
                match sub.db {
                    Db::Pg => sess.simple("BEGIN ISOLATION LEVEL SERIALIZABLE").await?,
                    // Client mode: the session was checked (SERIALIZABLE read back, once per
                    // connection: MySession::check_once) before the registration.
                    Db::My => {
                        let ro = if b.engine_read_only() { ", READ ONLY" } else { "" };
                        sess.simple(&format!("SET TRANSACTION ISOLATION LEVEL {my_iso}{ro}")).await?;
                        sess.simple(&format!("XA START {}", b.xid)).await?;
                    }
                }
                begun = Some(std::time::Instant::now());
                sess.run_ops(&sub.ops).await?;
                Ok::<(), DbError>(())
            }
            .await;
            if let Err(e) = run {
                rollback_unprepared(sess, &b).await;
                b.state = BState::Done;
                if !self.leased_tx {
                    report_failed(self.http.as_mut().unwrap(), &g, &bid, "", &e).await;
                }
                self.abort(&g, &mut br, &e.to_string()).await;
                return Err(e.into());
            }
            br.push(b);
            // Each branch's start (its registration on the begin path, BEGIN / XA START),
            // then its statements.
            let (start, statements) = match sub.db {
                Db::Pg => ("begin postgresql", "statements postgresql"),
                Db::My => ("begin mariadb", "statements mariadb"),
            };
            if let Some(t) = begun {
                self.marks.push((start, t));
            }
            self.mark(statements);
        }
        let g = gtid.unwrap();
        if self.leased_tx {
            return self.commit_leased(&g, &mut br, subs).await;
        }
        // Client mode commits one branch in one phase where the daemon says it may, the slot
        // written before the request (as cotx.transaction.Transaction.commit).
        if br.len() == 1 && (br[0].shim.is_none() || br[0].one_phase) {
            return self.one_phase(&g, &mut br).await;
        }
        let decider = self.decider(&br);
        // Prepare every branch but the decider (in dip mode it commits in one phase).
        let to_prepare: Vec<usize> = (0..br.len()).filter(|&i| Some(i) != decider).collect();
        if let Err(f) = self.prepare(&g, &mut br, &to_prepare).await {
            self.abort(&g, &mut br, &f.kind).await;
            return Err(f);
        }
        self.mark("prepare");
        let prepared: Vec<String> = to_prepare.iter().map(|&i| br[i].bid.clone()).collect();
        let mut body = json!({"prepared": prepared});
        if let Some(d) = decider {
            body["decide_in"] = json!(br[d].bid);
        } else {
            // The branches that wrote nothing: every one listed, the daemon decides in
            // memory with no store sync (docs/coordinator.md, "All-read-only transactions").
            let ro: Vec<&str> = br.iter().filter(|b| b.wrote_nothing).map(|b| b.bid.as_str()).collect();
            if !ro.is_empty() {
                body["read_only"] = json!(ro);
            }
        }
        let http = self.http.as_mut().unwrap();
        let decision = match http.request("POST", &format!("/v1/transactions/{g}/commit"), &body).await {
            Ok(v) => v["decision"].as_str().unwrap_or("").to_string(),
            Err(e) => {
                self.abort(&g, &mut br, &e.to_string()).await;
                return Err(e.into());
            }
        };
        self.mark("request");
        if let Some(d) = decider {
            if decision != "in_participant" {
                self.abort(&g, &mut br, "no in_participant decision").await;
                return Err(Failure { kind: format!("coordinator decision {decision}"), err: None });
            }
            return self.decide_in_participant(&g, &mut br, d).await;
        }
        if decision != "commit" {
            self.abort(&g, &mut br, "decision").await;
            return Err(Failure { kind: format!("coordinator decision {decision}"), err: None });
        }
        let all: Vec<usize> = (0..br.len()).collect();
        let done = self.finish_commit(&g, &mut br, &all).await;
        self.mark("phase two");
        self.ack(&g, "commit", done).await;
        Ok(())
    }

    /// --one-request: every branch prepared, then the commit listing them, with the held
    /// acknowledgements: the transaction's only request. A refused or lost commit drops
    /// the range (the daemon may no longer know it) and rolls the branches back.
    async fn commit_leased(&mut self, g: &str, br: &mut [Branch], subs: &[Sub]) -> Result<(), Failure> {
        let all: Vec<usize> = (0..br.len()).collect();
        let decider = self.decider(br);
        let to_prepare: Vec<usize> = all.iter().copied().filter(|&i| Some(i) != decider).collect();
        if let (Some(d), true) = (decider, self.cfg.handover_while_preparing) {
            return self.hand_over_while_preparing(g, br, subs, d, &to_prepare).await;
        }
        if let Err(f) = self.prepare(g, br, &to_prepare).await {
            self.rollback_all(g, br).await;
            return Err(f);
        }
        self.mark("prepare");
        let body = self.leased_commit_body(br, subs, decider);
        let http = self.http.as_mut().unwrap();
        let decision = match http.request("POST", &format!("/v1/transactions/{g}/commit"), &body).await {
            Ok(v) => v["decision"].as_str().unwrap_or("").to_string(),
            Err(e) => {
                self.lease = None;
                self.rollback_all(g, br).await;
                return Err(e.into());
            }
        };
        self.mark("request");
        if let Some(d) = decider {
            if decision != "in_participant" {
                self.rollback_all(g, br).await;
                return Err(Failure { kind: format!("coordinator decision {decision}"), err: None });
            }
            return self.decide_in_participant(g, br, d).await;
        }
        if decision != "commit" {
            self.rollback_all(g, br).await;
            return Err(Failure { kind: format!("coordinator decision {decision}"), err: None });
        }
        let done = self.finish_commit(g, br, &all).await;
        self.mark("phase two");
        self.ack(g, "commit", done).await;
        Ok(())
    }

    /// The one-request commit's body: every branch with its session, dip's decision branch
    /// or the branches that wrote nothing, and the held acknowledgements (taken).
    fn leased_commit_body(&mut self, br: &[Branch], subs: &[Sub], decider: Option<usize>) -> Value {
        let branches: Vec<Value> = br
            .iter()
            .zip(subs)
            .map(|(b, sub)| json!({"resource": b.db.name(), "branch_id": b.bid, "session": self.sess[&sub.session].id()}))
            .collect();
        let mut body = json!({"branches": branches});
        let ro: Vec<&str> = br.iter().filter(|b| b.wrote_nothing).map(|b| b.bid.as_str()).collect();
        if let Some(d) = decider {
            body["decide_in"] = json!(br[d].bid);
        } else if !ro.is_empty() {
            body["read_only"] = json!(ro);
        }
        if !self.acks.is_empty() {
            body["finished"] = Value::Array(std::mem::take(&mut self.acks));
        }
        body
    }

    /// dip on the one-request path with --handover-while-preparing: the commit handing the
    /// decision over goes out while the other branches prepare, and the decision branch
    /// commits once both have answered
    /// (the model's "one request with the decision in a participant" sends either way: the
    /// decision waits for every PREPARE and for the hand-over). A refused PREPARE after the
    /// hand-over: the decision branch is rolled back first, then reported failed, so the
    /// daemon aborts what can no longer commit; without the daemon's answer the range is
    /// dropped and the daemon resolves the gtid in the participant (co.resolve), as on the
    /// serial path.
    async fn hand_over_while_preparing(
        &mut self,
        g: &str,
        br: &mut [Branch],
        subs: &[Sub],
        d: usize,
        to_prepare: &[usize],
    ) -> Result<(), Failure> {
        let body = self.leased_commit_body(br, subs, Some(d));
        let path = format!("/v1/transactions/{g}/commit");
        // The daemon's connection is taken out of `self` for the request, so that
        // `prepare` (which on this path never reports to the daemon) runs beside it.
        let mut http = self.http.take().expect("the daemon's connection");
        let (prepared, answer) =
            futures_util::future::join(self.prepare(g, br, to_prepare), http.request("POST", &path, &body)).await;
        self.http = Some(http);
        self.mark("prepare and request");
        let decision = match answer {
            Ok(v) => v["decision"].as_str().unwrap_or("").to_string(),
            Err(e) => {
                self.lease = None;
                self.rollback_all(g, br).await;
                return Err(prepared.err().unwrap_or_else(|| e.into()));
            }
        };
        if let Err(f) = prepared {
            if decision == "in_participant" {
                self.refused_after_handover += 1;
                let sess = self.sess.get_mut(&br[d].session).unwrap();
                let _ = sess.simple("ROLLBACK").await;
                br[d].state = BState::Done;
                let bid = br[d].bid.clone();
                if let Some(e) = &f.err {
                    report_failed(self.http.as_mut().unwrap(), g, &bid, "prepare refused", e).await;
                }
            }
            self.rollback_all(g, br).await;
            return Err(f);
        }
        if decision != "in_participant" {
            self.rollback_all(g, br).await;
            return Err(Failure { kind: format!("coordinator decision {decision}"), err: None });
        }
        self.decide_in_participant(g, br, d).await
    }

    /// dip: the branch whose one-phase commit carries the decision (co.decide needs pg_co
    /// there), the last PostgreSQL branch in engine mode; None in every other mode.
    fn decider(&self, br: &[Branch]) -> Option<usize> {
        if self.cfg.mode != Mode::Dip {
            return None;
        }
        br.iter().rposition(|b| b.db == Db::Pg && b.shim.is_none())
    }

    async fn one_phase(&mut self, g: &str, br: &mut [Branch]) -> Result<(), Failure> {
        let bid = br[0].bid.clone();
        if br[0].shim.is_some() {
            // Client mode: the slot write it would make before PREPARE, before the request.
            let sess = self.sess.get_mut(&br[0].session).unwrap();
            if let Err(e) = write_slot(sess, &br[0]).await {
                self.abort(g, br, &e.to_string()).await;
                return Err(e.into());
            }
        }
        let http = self.http.as_mut().unwrap();
        if let Err(e) =
            http.request("POST", &format!("/v1/transactions/{g}/commit"), &json!({"one_phase_branch": bid})).await
        {
            self.abort(g, br, &e.to_string()).await;
            return Err(e.into());
        }
        let b = &mut br[0];
        let sess = self.sess.get_mut(&b.session).unwrap();
        let r = match b.db {
            Db::Pg => sess.simple("COMMIT").await,
            Db::My => match sess.simple(&format!("XA END {}", b.xid)).await {
                Ok(()) => sess.simple(&format!("XA COMMIT {} ONE PHASE", b.xid)).await,
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(()) => {
                b.state = BState::Done;
                self.ack(g, "commit", vec![bid]).await;
                Ok(())
            }
            Err(e) => {
                rollback_unprepared(sess, b).await;
                b.state = BState::Done;
                self.ack(g, "abort", vec![bid]).await;
                Err(e.into())
            }
        }
    }

    /// PREPARE TRANSACTION / XA END + XA PREPARE of the given branches (or the read-only
    /// vote: `prepare_one`), one after the other or all at once (--parallel-prepare). A
    /// refused branch is rolled back and reported failed; the first failure is returned.
    /// Only the two-phase commits through the daemon call it (the single-branch one-phase
    /// commit and dip's decision branch are not prepared).
    async fn prepare(&mut self, g: &str, br: &mut [Branch], which: &[usize]) -> Result<(), Failure> {
        let mut first_err: Option<DbError> = None;
        let mut failed: Vec<usize> = vec![];
        if self.cfg.parallel_prepare && which.len() > 1 {
            let mut taken: Vec<(usize, Sess)> =
                which.iter().map(|&i| (i, self.sess.remove(&br[i].session).unwrap())).collect();
            let results = join_all(taken.iter_mut().map(|(i, s)| prepare_one(s, &br[*i]))).await;
            for ((i, mut s), r) in taken.into_iter().zip(results) {
                match r {
                    Ok(vote) => br[i].voted(vote),
                    Err(e) => {
                        rollback_unprepared(&mut s, &br[i]).await;
                        br[i].state = BState::Done;
                        failed.push(i);
                        first_err.get_or_insert(e);
                    }
                }
                self.sess.insert(br[i].session.clone(), s);
            }
        } else {
            // --prepare-pg-last: MariaDB's first, so that PostgreSQL's branches are in doubt
            // (prepared, not yet committed) for less time: a PostgreSQL branch that read a
            // row such a branch overwrote is refused by pg_co's rule A.
            let mut order = which.to_vec();
            if self.cfg.prepare_pg_last {
                order.sort_by_key(|&i| br[i].db == Db::Pg);
            }
            for i in order {
                let sess = self.sess.get_mut(&br[i].session).unwrap();
                match prepare_one(sess, &br[i]).await {
                    Ok(vote) => br[i].voted(vote),
                    Err(e) => {
                        rollback_unprepared(sess, &br[i]).await;
                        br[i].state = BState::Done;
                        failed.push(i);
                        first_err = Some(e);
                        break;
                    }
                }
            }
        }
        if let Some(e) = first_err {
            // On the one-request path the daemon knows nothing of the attempt yet (and its
            // connection may be out of `self.http`: hand_over_while_preparing).
            if !self.leased_tx {
                let http = self.http.as_mut().unwrap();
                for i in failed {
                    report_failed(http, g, &br[i].bid, "prepare refused", &e).await;
                }
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// COMMIT PREPARED / XA COMMIT of the given prepared branches on their owners' sessions
    /// (all at once with --parallel-finish); returns the ids finished.
    async fn finish_commit(&mut self, _g: &str, br: &mut [Branch], which: &[usize]) -> Vec<String> {
        // Branches that voted read-only are finished already: acknowledged, nothing run.
        let mut done = vec![];
        for &i in which {
            if br[i].state == BState::Voted {
                br[i].state = BState::Done;
                done.push(br[i].bid.clone());
            }
        }
        let which: Vec<usize> = which.iter().copied().filter(|&i| br[i].state == BState::Prepared).collect();
        if self.cfg.parallel_finish && which.len() > 1 {
            let mut taken: Vec<(usize, Sess)> =
                which.iter().map(|&i| (i, self.sess.remove(&br[i].session).unwrap())).collect();
            let results = join_all(taken.iter_mut().map(|(i, s)| finish_one(s, &br[*i], true))).await;
            for ((i, s), r) in taken.into_iter().zip(results) {
                self.sess.insert(br[i].session.clone(), s);
                if r.is_ok() {
                    done.push(br[i].bid.clone());
                } else {
                    self.unfinished += 1; // the daemon finishes it after its grace period
                }
                br[i].state = BState::Done;
            }
        } else {
            for i in which {
                let sess = self.sess.get_mut(&br[i].session).unwrap();
                if finish_one(sess, &br[i], true).await.is_ok() {
                    done.push(br[i].bid.clone());
                } else {
                    self.unfinished += 1;
                }
                br[i].state = BState::Done;
            }
        }
        done
    }

    /// Decision in a participant: the PostgreSQL branch's one-phase COMMIT, with
    /// co.decide(gtid) in it, is the global decision.
    async fn decide_in_participant(&mut self, g: &str, br: &mut [Branch], d: usize) -> Result<(), Failure> {
        let sess = self.sess.get_mut(&br[d].session).unwrap();
        // co.decide and the COMMIT in one round trip (one simple query: an error in the
        // first skips the second). The xid rides on it, kept when the COMMIT is refused:
        // the refusal breakdown joins a peer's rule-A refusal that names this branch by
        // xid only.
        let (xid, r) = match (safe_id(g), &mut *sess) {
            (Ok(g), Sess::Pg(pg)) => {
                pg.first_value_kept(&format!(
                    "SELECT co.decide('{g}'), (pg_current_xact_id()::text::bigint % 4294967296)::text; COMMIT"
                ))
                .await
            }
            _ => {
                let message = "a decision branch needs PostgreSQL and a safe gtid".into();
                (None, Err(DbError { db: "pg", sqlstate: None, errno: None, message, detail: None }))
            }
        };
        self.last_decider_xid = xid.and_then(|x| x.parse().ok()).map(|x| (d, x));
        let dbid = br[d].bid.clone();
        if let Err(e) = r {
            let _ = sess.simple("ROLLBACK").await;
            br[d].state = BState::Done;
            report_failed(self.http.as_mut().unwrap(), g, &dbid, "decision commit refused", &e).await;
            self.rollback_all(g, br).await;
            return Err(e.into());
        }
        br[d].state = BState::Done;
        self.mark("decision");
        let others: Vec<usize> = (0..br.len()).filter(|&i| i != d).collect();
        // The decision branch first: a daemon that checks the list in order (before this
        // one did not) refuses the others' commit while the transaction is still deciding.
        let mut done = vec![dbid];
        done.extend(self.finish_commit(g, br, &others).await);
        self.mark("phase two");
        self.ack(g, "commit", done).await;
        Ok(())
    }

    fn mark(&mut self, step: &'static str) {
        self.marks.push((step, std::time::Instant::now()));
    }

    /// The attempt failed: tell the coordinator, roll back every local branch, acknowledge.
    async fn abort(&mut self, g: &str, br: &mut [Branch], reason: &str) {
        if self.leased_tx {
            // The daemon hears of a one-request attempt only at its commit.
            self.rollback_all(g, br).await;
            return;
        }
        let http = self.http.as_mut().unwrap();
        let _ = http
            .request(
                "POST",
                &format!("/v1/transactions/{g}/abort"),
                &json!({"reason": reason.chars().take(900).collect::<String>()}),
            )
            .await;
        self.rollback_all(g, br).await;
    }

    async fn rollback_all(&mut self, g: &str, br: &mut [Branch]) {
        let mut done = vec![];
        for b in br.iter_mut() {
            let sess = self.sess.get_mut(&b.session).unwrap();
            match b.state {
                BState::Active => rollback_unprepared(sess, b).await,
                BState::Prepared => {
                    let _ = finish_one(sess, b, false).await;
                }
                // Committed at its vote having written nothing: an abort changes nothing there.
                BState::Voted => {}
                BState::Done => continue,
            }
            b.state = BState::Done;
            done.push(b.bid.clone());
        }
        self.ack(g, "abort", done).await;
    }
}

/// What a branch's prepare left: prepared (and whether it wrote nothing), or voted
/// read-only (committed in one phase).
#[derive(Clone, Copy)]
enum Vote {
    Prepared { wrote_nothing: bool },
    ReadOnly,
}

/// `POST …/branches/<bid>/failed`: the branch was refused (`what`, then the database's
/// error, at most 900 characters), so the daemon aborts the transaction at once instead of
/// waiting for its timeout. Best effort: without it the daemon still aborts in time.
async fn report_failed(http: &mut Coord, g: &str, bid: &str, what: &str, e: &DbError) {
    let reason = if what.is_empty() { e.to_string() } else { format!("{what}: {e}") };
    let body = json!({"reason": reason.chars().take(900).collect::<String>(), "retryable": e.retryable()});
    let _ = http.request("POST", &format!("/v1/transactions/{g}/branches/{bid}/failed"), &body).await;
}

/// PREPARE TRANSACTION / XA END + XA PREPARE; in client mode the branch's shim slot is
/// written just before (cotx.branch.Branch.prepare, cotx.dialect's shim_touch):
/// PostgreSQL `SELECT cotx.shim_touch(k)` (the edge helper -rw-> branch that lets SSI
/// refuse what would break commitment ordering), MariaDB a write of row k of cotx_shim
/// (InnoDB then prepares the branch read-write and keeps its read locks). A branch
/// declared read-only that wrote nothing is listed read-only with the commit, checked
/// before the slot write as the clients check it: PostgreSQL
/// `pg_current_xact_id_if_assigned() IS NULL`; MariaDB a READ ONLY transaction (outside
/// client mode), never in client mode.
///
/// The read-only vote (plain 2PC only, as the clients': docs/coordinator.md, "The
/// read-only vote in plain 2PC"): such a branch at a resource of enforcement "none" is
/// committed in one phase instead (PostgreSQL `COMMIT`, MariaDB `XA COMMIT … ONE PHASE`),
/// which spares PostgreSQL the WAL flush of PREPARE TRANSACTION and the COMMIT PREPARED
/// round trip. It wrote nothing, so its data is the same whatever the decision; where
/// commitment ordering is enforced its reads must stay prepared until the decision.
async fn prepare_one(sess: &mut Sess, b: &Branch) -> Result<Vote, DbError> {
    let nothing = match b.db {
        _ if !b.read_only => false,
        Db::Pg => sess.first_value("SELECT pg_current_xact_id_if_assigned() IS NULL").await?.as_deref() == Some("t"),
        Db::My => b.engine_read_only(),
    };
    if nothing && b.plain {
        match b.db {
            Db::Pg => sess.simple("COMMIT").await?,
            Db::My => {
                sess.simple(&format!("XA END {}", b.xid)).await?;
                sess.simple(&format!("XA COMMIT {} ONE PHASE", b.xid)).await?;
            }
        }
        return Ok(Vote::ReadOnly);
    }
    write_slot(sess, b).await?;
    match b.db {
        Db::Pg => sess.simple(&format!("PREPARE TRANSACTION {}", b.gid)).await?,
        Db::My => {
            sess.simple(&format!("XA END {}", b.xid)).await?;
            sess.simple(&format!("XA PREPARE {}", b.xid)).await?;
        }
    }
    Ok(Vote::Prepared { wrote_nothing: nothing })
}

/// Client mode's slot write (nothing in the other modes), before PREPARE or before a
/// one-phase commit is asked for.
async fn write_slot(sess: &mut Sess, b: &Branch) -> Result<(), DbError> {
    match (b.db, b.shim) {
        (Db::Pg, Some(k)) => sess.simple(&format!("SELECT cotx.shim_touch({k})")).await,
        (Db::My, Some(k)) => match sess {
            Sess::My(m) => m.shim_touch(k).await,
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

async fn finish_one(sess: &mut Sess, b: &Branch, commit: bool) -> Result<(), DbError> {
    let r = match (b.db, commit) {
        (Db::Pg, true) => sess.simple(&format!("COMMIT PREPARED {}", b.gid)).await,
        (Db::Pg, false) => sess.simple(&format!("ROLLBACK PREPARED {}", b.gid)).await,
        (Db::My, true) => sess.simple(&format!("XA COMMIT {}", b.xid)).await,
        (Db::My, false) => sess.simple(&format!("XA ROLLBACK {}", b.xid)).await,
    };
    match r {
        // Already finished by the coordinator (its owner grace period ran out).
        Err(e) if e.sqlstate.as_deref() == Some("42704") && b.db == Db::Pg => Ok(()),
        Err(e) if e.errno == Some(1397) => Ok(()),
        other => other,
    }
}

async fn rollback_unprepared(sess: &mut Sess, b: &Branch) {
    match b.db {
        Db::Pg => {
            let _ = sess.simple("ROLLBACK").await;
        }
        Db::My => {
            let _ = sess.simple(&format!("XA END {}", b.xid)).await;
            let _ = sess.simple(&format!("XA ROLLBACK {}", b.xid)).await;
        }
    }
}

/// The daemon URL of client `wid` in a comma-separated list (`Cfg::coord_url`); a single
/// URL is every client's.
pub fn coord_url(list: &str, wid: usize) -> &str {
    let urls: Vec<&str> = list.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    if urls.is_empty() {
        list
    } else {
        urls[wid % urls.len()]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn coord_url_round_robin() {
        assert_eq!(super::coord_url("http://a:1", 5), "http://a:1");
        let l = "http://a:1,http://b:2, http://c:3";
        assert_eq!(
            [0, 1, 2, 3].map(|w| super::coord_url(l, w)),
            ["http://a:1", "http://b:2", "http://c:3", "http://a:1"]
        );
    }
}

//! cotx-loadgen: the side-by-side benchmarks' load driver. One process, N client tasks on
//! one thread (so its CPU share stays small and is reported), one workload in one mode for
//! a warm-up then a measured window; one JSON result line on stdout (after two event lines,
//! `measure_start` and `measure_end`, at which the harness samples the servers' CPU).
//! Usage: see `--help`; bench/harness/loadgen.py runs it.

mod client;
mod coord;
mod db;
mod http;
mod pace;
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use client::{Cfg, Client, Failure, Mode};
use pace::Pace;
use workload::{Micro, Rng, Sub, Tpcc, Workload};

const HELP: &str = "cotx-loadgen --workload micro|tpcc --mode local|2pc|co|client|dip
  --pg DSN --my URL [--coord URL[,URL...] --token T] [--clients 8] [--warmup 1] [--seconds 5] [--seed 1]
  [--lock-timeout-ms 2000] [--parallel-prepare] [--parallel-finish] [--attempt-log FILE]
  [--prepare-pg-last: prepare MariaDB's branches first, PostgreSQL's last (default: in the
   order the transaction opened them)]
  [--my-isolation repeatable-read|serializable: MariaDB branches' level; default REPEATABLE READ
   in mode 2pc, SERIALIZABLE otherwise]
  [--sync-stdin: after measure_end, keep the sessions until a line arrives on stdin]
  [--rate R: open loop: R global transactions per second over all clients, at fixed times
   whatever the completions (the --clients sessions serve them; when all are busy an arrival
   waits, and its latency counts from its scheduled time); the result adds rate, arrivals
   (scheduled in the measured window), missed (of those, not started by its end: the mode
   did not keep up) and start_lag_p50_ms / start_lag_p99_ms. Without it: the closed loop,
   each client starting its next transaction when the last is done]
  [--calls batched|per-step: batched (default) registers every branch with the begin and
   carries the finished acknowledgements on the next begin; per-step is the earlier protocol
   (the first branch with the begin, a request per further branch, one acknowledgement per
   transaction), which any daemon version understands]
  [--retry-backoff-ms B: before retry n of a refused attempt, a random wait in
   [0, min(1000, B * 2^n)) ms, the clients' documented backoff (Python cotx.retry, base 20);
   default 0: at once]
  [--one-request: modes 2pc, co and dip: each client leases a range of gtids (POST /v1/gtid-leases)
   and a transaction is one request, its commit listing every branch (checked once against
   GET /v1/resources: the resources' enforcement must be the mode's; dip's with decide_in)]
  [--handover-while-preparing: dip with --one-request: send that commit while the other
   branches prepare (the decision branch commits once both answered), not after them]
  micro: [--S 2 --R 6 --W 6 --P 0.5 --N 100000 --K 0 --autocommit-reads 0 --ro-share 0]
   --ro-share F: that share of global transactions read-only (each branch its R reads, no updates)
  tpcc:  [--warehouses 2 --items 10000 --customers 300 --remote-item 0.1 --remote-customer 0.15 --ytd-split 0]
--coord with several URLs (daemons sharing a PostgreSQL store, one token): client i talks
to URL i mod n. --coord inproc:CONFIG: the coordinator in this process, started from a daemon
config of its own (node_id, store); its CPU is reported apart as cpu_tm_s.
Prints {\"event\":\"measure_start\"}, {\"event\":\"measure_end\"}, then one result line.
Every branch registration must be answered with the mode's enforcement (the daemon's
[[resources]] enforcement): 2pc none, co and dip engine, client client; otherwise the client
stops with an error. client (alias shim): the product's client mode, the slot the
coordinator names written before PREPARE / XA END, never one phase; MariaDB SERIALIZABLE.
Mode dip needs co.decide() in PostgreSQL: without it the result line says skipped.";

const DIP_UNSUPPORTED: &str = "the coordinator refused decide_in (no decision-in-participant support in this daemon)";

fn now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn cpu_self() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn emit(v: &Value) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

struct Args(HashMap<String, String>);

impl Args {
    fn parse() -> Result<Args, String> {
        let mut m = HashMap::new();
        let mut it = std::env::args().skip(1).peekable();
        while let Some(a) = it.next() {
            let k = a.strip_prefix("--").ok_or_else(|| format!("unexpected argument {a}"))?.to_string();
            if matches!(
                k.as_str(),
                "parallel-prepare"
                    | "parallel-finish"
                    | "sync-stdin"
                    | "one-request"
                    | "handover-while-preparing"
                    | "prepare-pg-last"
                    | "help"
            ) {
                m.insert(k, "1".into());
            } else {
                m.insert(k.clone(), it.next().ok_or_else(|| format!("--{k} needs a value"))?);
            }
        }
        Ok(Args(m))
    }
    fn s(&self, k: &str, d: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| d.to_string())
    }
    fn f(&self, k: &str, d: f64) -> f64 {
        self.0.get(k).map(|v| v.parse().unwrap_or_else(|_| panic!("--{k}: not a number: {v}"))).unwrap_or(d)
    }
    fn flag(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
}

#[derive(Default)]
struct Stats {
    commits: u64,
    attempts: u64,
    reasons: BTreeMap<String, u64>,
    lat_ms: Vec<f64>,
    /// Committed transactions' time per step (Client::marks), ms: "earlier attempts" from
    /// the start, each later step from the one before, "rest" to the end
    /// (acknowledgements; an attempt with no steps, local or autocommit, is all "rest").
    phases: BTreeMap<&'static str, Vec<f64>>,
    /// Committed global transactions' commit alone, ms: from the end of their last
    /// statement to the end (the PREPAREs, the daemon, the decision, phase two).
    commit_ms: Vec<f64>,
    log: Vec<String>,
    error: Option<String>,
    enforcement: BTreeMap<String, u64>,
    unfinished: u64,
    refused_after_handover: u64,
    /// Open loop: arrivals scheduled in the measured window that this client started, and
    /// how late each started (ms after its scheduled time).
    arrivals: u64,
    lag_ms: Vec<f64>,
    /// Seconds waited before retries (--retry-backoff-ms), in the measured window.
    backoff_s: f64,
}

#[allow(clippy::too_many_arguments)]
fn log_line(
    mode: &str,
    gtid: &str,
    ids: &[String],
    decider_xid: Option<(usize, u32)>,
    t: f64,
    measured: bool,
    subs: &[Sub],
    from: usize,
    f: Option<&Failure>,
) -> String {
    let branches: Vec<Value> = subs
        .iter()
        .enumerate()
        .skip(from)
        .map(|(i, s)| {
            let (table, read, written) = s.touched();
            let id = ids.get(i).cloned();
            let (gid, xid) = if s.db == workload::Db::Pg { (id, None) } else { (None, id) };
            let mut b = json!({"db": s.db.name(), "bid": format!("b{i}"), "gid": gid, "xid": xid, "table": table, "read": read, "written": written});
            if let Some((_, x)) = decider_xid.filter(|&(d, _)| d == i) {
                b["pg_xid"] = json!(x);
            }
            b
        })
        .collect();
    let v = json!({
        "gtid": gtid, "mode": mode, "t": t, "measured": measured,
        "outcome": if f.is_none() { "commit" } else { "abort" },
        "kind": f.map(|f| f.kind.clone()),
        "branches": branches,
        "error": f.and_then(|f| f.err.as_ref().map(|e| e.json())),
    });
    v.to_string()
}

/// The clients' full-jitter backoff before retry `n` (0-based), as cotx/retry.py's
/// `backoff` with max_delay 1 s: `rand` · min(1 s, base · 2^n).
fn backoff(n: u32, base_ms: f64, rand: f64) -> Duration {
    Duration::from_secs_f64(rand * (base_ms * 2f64.powi(n.min(20) as i32)).min(1000.0) / 1000.0)
}

#[allow(clippy::too_many_arguments)]
async fn client_loop(
    mut c: Client,
    wl: Arc<dyn Workload>,
    mode: Mode,
    mode_name: String,
    seed: u64,
    t_measure: Instant,
    t_end: Instant,
    want_log: bool,
    pace: Option<Arc<Pace>>,
) -> (Stats, Client) {
    let mut st = Stats::default();
    let mut rng = Rng::new(seed);
    // The backoff's own stream: the workload draws the same transactions with or without it.
    let mut jitter = Rng::new(seed ^ 0x6a09e667f3bcc908);
    let mut n_attempt = 0u64;
    'outer: while Instant::now() < t_end {
        // Closed loop: now. Open loop: the next arrival's time (latency counts from it).
        let t0 = match &pace {
            None => Instant::now(),
            Some(p) => {
                let at = p.claim();
                if at >= t_end {
                    break 'outer;
                }
                tokio::time::sleep_until(at.into()).await;
                if at >= t_measure {
                    st.arrivals += 1;
                    st.lag_ms.push(Instant::now().saturating_duration_since(at).as_secs_f64() * 1000.0);
                }
                at
            }
        };
        let subs = wl.txn(&mut rng, c.wid);
        let mut from = 0usize;
        let mut tries = 0u32;
        loop {
            tries += 1;
            n_attempt += 1;
            // Steps are marked by the global path only: the others' attempts have none.
            c.marks.clear();
            let r = if subs.len() == 1 && subs[0].autocommit {
                c.run_autocommit(&subs[0]).await.map_err(|f| (0, f))
            } else if mode == Mode::Local {
                c.run_local(&subs, from).await
            } else {
                c.run_global(&subs).await.map_err(|f| (0, f))
            };
            let t = Instant::now();
            let measured = t >= t_measure && t < t_end;
            // Local mode has no gtid: the client and attempt number name the attempt.
            let hint = c.last_gtid.clone().unwrap_or_else(|| format!("local-c{}-{}", c.wid, n_attempt));
            match r {
                Ok(()) => {
                    if want_log {
                        st.log.push(log_line(
                            &mode_name,
                            &hint,
                            &c.last_ids,
                            c.last_decider_xid,
                            now_s(),
                            measured,
                            &subs,
                            from,
                            None,
                        ));
                    }
                    if measured {
                        st.commits += 1;
                        st.attempts += 1;
                        st.lat_ms.push(t.duration_since(t0).as_secs_f64() * 1000.0);
                        if let Some(&(_, at)) = c.marks.iter().rev().find(|(k, _)| k.starts_with("statements")) {
                            st.commit_ms.push(t.duration_since(at).as_secs_f64() * 1000.0);
                        }
                        let mut prev = t0;
                        for &(step, at) in c.marks.iter().chain([("rest", t)].iter()) {
                            st.phases.entry(step).or_default().push(at.duration_since(prev).as_secs_f64() * 1000.0);
                            prev = at;
                        }
                    }
                    break;
                }
                Err((done, f)) => {
                    if want_log {
                        st.log.push(log_line(
                            &mode_name,
                            &hint,
                            &c.last_ids,
                            c.last_decider_xid,
                            now_s(),
                            measured,
                            &subs,
                            from,
                            Some(&f),
                        ));
                    }
                    if measured {
                        *st.reasons.entry(f.kind.clone()).or_default() += 1;
                        st.attempts += 1;
                    }
                    if mode == Mode::Dip && f.kind == "coordinator invalid_field" {
                        st.error = Some(DIP_UNSUPPORTED.into());
                        break 'outer;
                    }
                    if f.kind.contains("other") || f.kind.starts_with("coordinator") && f.kind.contains("unavailable") {
                        // Not a conflict: stop this client and report it (no busy loop on a broken setup).
                        st.error = Some(format!("{}: {}", f.kind, f.err.map(|e| e.to_string()).unwrap_or_default()));
                        break 'outer;
                    }
                    if mode == Mode::Local {
                        from = done; // local mode finishes what it started (no atomicity to fall back on)
                        if tries > 10000 {
                            st.error = Some("local sub-transaction never committed".into());
                            break 'outer;
                        }
                    }
                    // Local mode finishes a global transaction it has begun committing (TPC-C's
                    // checks across databases hold only for whole ones).
                    if t >= t_end && !(mode == Mode::Local && from > 0) {
                        break 'outer;
                    }
                    if c.cfg.retry_backoff_ms > 0.0 {
                        let wait = backoff(tries - 1, c.cfg.retry_backoff_ms, jitter.f64());
                        if measured {
                            st.backoff_s += wait.as_secs_f64();
                        }
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }
    c.close().await;
    st.enforcement = std::mem::take(&mut c.enforcement);
    st.unfinished = c.unfinished;
    st.refused_after_handover = c.refused_after_handover;
    (st, c)
}

fn percentile(xs: &mut [f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let k = (xs.len() - 1) as f64 * p;
    let lo = k as usize;
    let hi = (lo + 1).min(xs.len() - 1);
    Some(xs[lo] + (xs[hi] - xs[lo]) * (k - lo as f64))
}

fn main() {
    let a = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{HELP}");
            std::process::exit(2);
        }
    };
    if a.flag("help") {
        println!("{HELP}");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    std::process::exit(rt.block_on(run(a)));
}

async fn run(a: Args) -> i32 {
    let asked = a.s("mode", "co");
    let Some(mode) = Mode::parse(&asked) else {
        eprintln!("unknown mode {asked}\n{HELP}");
        return 2;
    };
    let mode_name = mode.name().to_string();
    let workload = a.s("workload", "micro");
    let wl: Arc<dyn Workload> = match workload.as_str() {
        "micro" => {
            let mut m = Micro::new(
                a.f("S", 2.0) as usize,
                a.f("R", 6.0) as usize,
                a.f("W", 6.0) as usize,
                a.f("P", 0.5),
                a.f("N", 100000.0) as i64,
                a.f("K", 0.0),
            );
            m.autocommit_reads = a.f("autocommit-reads", 0.0);
            m.ro_share = a.f("ro-share", 0.0);
            if !(0.0..=1.0).contains(&m.ro_share) {
                eprintln!("--ro-share {}: expected a share in [0, 1]\n{HELP}", m.ro_share);
                return 2;
            }
            Arc::new(m)
        }
        "tpcc" => {
            let w = a.f("warehouses", 2.0) as i64;
            Arc::new(Tpcc {
                w,
                items: a.f("items", 10000.0) as i64,
                customers: a.f("customers", 300.0) as i64,
                remote_item: a.f("remote-item", 0.1),
                remote_customer: a.f("remote-customer", 0.15),
                n_pg: (w / 2).max(1),
                ytd_split: a.f("ytd-split", 0.0) as i64,
            })
        }
        other => {
            eprintln!("unknown workload {other}\n{HELP}");
            return 2;
        }
    };
    let my_isolation = match a.0.get("my-isolation").map(String::as_str) {
        None if mode == Mode::TwoPc => "REPEATABLE READ",
        None | Some("serializable") => "SERIALIZABLE",
        Some("repeatable-read") => "REPEATABLE READ",
        Some(other) => {
            eprintln!("--my-isolation {other}: expected repeatable-read or serializable\n{HELP}");
            return 2;
        }
    };
    if mode == Mode::Client && my_isolation != "SERIALIZABLE" {
        eprintln!("mode client protects SERIALIZABLE branches only: --my-isolation {my_isolation} refused\n{HELP}");
        return 2;
    }
    let batched = match a.s("calls", "batched").as_str() {
        "batched" => true,
        "per-step" => false,
        other => {
            eprintln!("--calls {other}: expected batched or per-step\n{HELP}");
            return 2;
        }
    };
    let one_request = a.flag("one-request");
    if one_request && !matches!(mode, Mode::TwoPc | Mode::Co | Mode::Dip) {
        eprintln!("--one-request goes with modes 2pc, co and dip only (not {mode_name}): client mode's slots need a begun transaction\n{HELP}");
        return 2;
    }
    let coord_url = a.s("coord", "http://127.0.0.1:7420");
    let in_process = match coord_url.strip_prefix("inproc:") {
        Some(_) if mode == Mode::Local => None,
        Some(path) => match coordinator_daemon::in_process::InProcess::start(path).await {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("--coord {coord_url}: the coordinator in this process did not start: {e}");
                return 2;
            }
        },
        None => None,
    };
    let cfg = Arc::new(Cfg {
        mode,
        pg_dsn: a.s("pg", "host=127.0.0.1 user=postgres dbname=postgres"),
        my_url: a.s("my", "mysql://root@127.0.0.1:3306/test"),
        coord_url,
        token: a.0.get("token").cloned().or_else(|| std::env::var("COTX_TOKEN").ok()),
        lock_timeout_ms: a.f("lock-timeout-ms", 2000.0) as u64,
        parallel_prepare: a.flag("parallel-prepare"),
        parallel_finish: a.flag("parallel-finish"),
        my_isolation,
        batched,
        in_process,
        one_request,
        handover_while_preparing: a.flag("handover-while-preparing"),
        prepare_pg_last: a.flag("prepare-pg-last"),
        retry_backoff_ms: a.f("retry-backoff-ms", 0.0).max(0.0),
    });
    let clients = a.f("clients", 8.0) as usize;
    let warmup = a.f("warmup", 1.0);
    let seconds = a.f("seconds", 5.0);
    let seed = a.f("seed", 1.0) as u64;
    let rate = a.0.get("rate").map(|_| a.f("rate", 0.0));
    if let Some(r) = rate {
        if let Err(e) = Pace::new(Instant::now(), r) {
            eprintln!("{e}\n{HELP}");
            return 2;
        }
    }
    let base = json!({"rate": rate, "workload": workload, "mode": mode_name, "one_request": one_request, "handover_while_preparing": cfg.handover_while_preparing, "prepare_pg_last": cfg.prepare_pg_last, "clients": clients, "warmup_s": warmup, "seconds": seconds,
                      "parallel_prepare": cfg.parallel_prepare, "parallel_finish": cfg.parallel_finish,
                      "my_isolation": cfg.my_isolation, "calls": if cfg.batched { "batched" } else { "per-step" }});

    // Sessions first (not measured), then everybody starts together.
    let mut cs = Vec::with_capacity(clients);
    for wid in 0..clients {
        match Client::open(cfg.clone(), wid, &wl.sessions()).await {
            Ok(c) => cs.push(c),
            Err(e) => {
                let mut v = base.clone();
                v["error"] = json!(format!("client {wid} could not connect: {e}"));
                emit(&v);
                return 1;
            }
        }
    }
    if mode == Mode::Dip {
        match cs[0].has_decide().await {
            Ok(true) => {}
            Ok(false) => {
                let mut v = base.clone();
                v["skipped"] = json!(
                    "mode dip needs co.decide() in PostgreSQL (pg_co with decision-in-participant); not installed here"
                );
                emit(&v);
                return 0;
            }
            Err(e) => {
                let mut v = base.clone();
                v["error"] = json!(format!("capability check failed: {e}"));
                emit(&v);
                return 1;
            }
        }
    }
    let want_log = a.0.contains_key("attempt-log");
    let t_start = Instant::now();
    let t_measure = t_start + Duration::from_secs_f64(warmup);
    let t_end = t_measure + Duration::from_secs_f64(seconds);
    let pace = rate.map(|r| Arc::new(Pace::new(t_start, r).expect("checked above")));
    let mut handles = Vec::new();
    for c in cs {
        let s = seed * 1000 + c.wid as u64;
        let p = pace.clone();
        handles.push(tokio::spawn(client_loop(
            c,
            wl.clone(),
            mode,
            mode_name.clone(),
            s,
            t_measure,
            t_end,
            want_log,
            p,
        )));
    }
    tokio::time::sleep_until(t_measure.into()).await;
    let syncs = || cfg.in_process.as_ref().map(|c| c.store_syncs()).unwrap_or_default();
    let (cpu0, tm0, sy0) = (cpu_self(), coord::in_process_cpu_s(), syncs());
    emit(&json!({"event": "measure_start"}));
    tokio::time::sleep_until(t_end.into()).await;
    let (cpu1, tm1, sy1) = (cpu_self(), coord::in_process_cpu_s(), syncs());
    emit(&json!({"event": "measure_end"}));
    let mut all = Stats::default();
    let mut errors = vec![];
    let mut keep = Vec::new();
    for h in handles {
        match h.await {
            Ok((st, c)) => {
                keep.push(c);
                all.commits += st.commits;
                all.attempts += st.attempts;
                all.backoff_s += st.backoff_s;
                for (k, v) in st.reasons {
                    *all.reasons.entry(k).or_default() += v;
                }
                all.lat_ms.extend(st.lat_ms);
                all.commit_ms.extend(st.commit_ms);
                for (k, v) in st.phases {
                    all.phases.entry(k).or_default().extend(v);
                }
                all.log.extend(st.log);
                for (k, v) in st.enforcement {
                    *all.enforcement.entry(k).or_default() += v;
                }
                all.unfinished += st.unfinished;
                all.refused_after_handover += st.refused_after_handover;
                all.arrivals += st.arrivals;
                all.lag_ms.extend(st.lag_ms);
                if let Some(e) = st.error {
                    errors.push(e);
                }
            }
            Err(e) => errors.push(format!("client task failed: {e}")),
        }
    }
    if a.flag("sync-stdin") {
        // The sessions stay open until the harness has sampled the servers' CPU: a backend
        // exiting during that sample would be counted nowhere.
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        })
        .await;
    }
    drop(keep);
    if let Some(c) = &cfg.in_process {
        // The node's lease released: the next driver on this config owns it at once.
        c.stop().await;
    }
    if let Some(path) = a.0.get("attempt-log") {
        if let Ok(f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let mut w = std::io::BufWriter::new(f);
            for l in &all.log {
                let _ = writeln!(w, "{l}");
            }
        }
    }
    let aborts: u64 = all.reasons.values().sum();
    let mut v = base;
    if mode == Mode::Dip && !errors.is_empty() && errors.iter().all(|e| e == DIP_UNSUPPORTED) {
        v["skipped"] = json!(format!("mode dip: {DIP_UNSUPPORTED}"));
        emit(&v);
        return 0;
    }
    v["commits"] = json!(all.commits);
    v["attempts"] = json!(all.attempts);
    v["aborts"] = json!(aborts);
    v["reasons"] = json!(all.reasons);
    v["tps"] = json!(all.commits as f64 / seconds);
    v["retry_backoff_ms"] = json!(cfg.retry_backoff_ms);
    v["backoff_s"] = json!(all.backoff_s);
    v["p50_ms"] = json!(percentile(&mut all.lat_ms, 0.5));
    v["p99_ms"] = json!(percentile(&mut all.lat_ms, 0.99));
    // Each step's own median: they need not add up to p50_ms.
    let phases: BTreeMap<&str, Option<f64>> = all.phases.iter_mut().map(|(k, xs)| (*k, percentile(xs, 0.5))).collect();
    v["phases_p50_ms"] = json!(phases);
    v["commit_p50_ms"] = json!(percentile(&mut all.commit_ms, 0.5));
    v["commit_p99_ms"] = json!(percentile(&mut all.commit_ms, 0.99));
    if let Some(p) = &pace {
        let offered = p.scheduled_between(t_measure, t_end);
        v["arrivals"] = json!(offered);
        v["missed"] = json!(offered.saturating_sub(all.arrivals));
        v["start_lag_p50_ms"] = json!(percentile(&mut all.lag_ms, 0.5));
        v["start_lag_p99_ms"] = json!(percentile(&mut all.lag_ms, 0.99));
    }
    v["cpu_s"] = json!(cpu1 - cpu0);
    v["cpu_s_total"] = json!(cpu_self());
    if cfg.in_process.is_some() {
        // The in-process coordinator's share of cpu_s (the harness books it as the
        // coordinator's, as it does for Narayana in the Java driver).
        v["cpu_tm_s"] = json!((tm1.0 + tm1.1) - (tm0.0 + tm0.1));
        v["cpu_tm_calls_s"] = json!(tm1.0 - tm0.0);
        v["cpu_tm_store_s"] = json!(tm1.1 - tm0.1);
        // The store's syncs and the writes they carried in the window.
        v["store_syncs"] = json!(sy1.0 - sy0.0);
        v["store_writes"] = json!(sy1.1 - sy0.1);
        v["coordinator"] = json!("in-process");
    }
    // Branch registrations by "resource:enforcement" (warm-up included), and how many of
    // them ran in client mode (each wrote its shim slot; on PostgreSQL each had a helper).
    v["client_branches"] =
        json!(all.enforcement.iter().filter(|(k, _)| k.ends_with(":client")).map(|(_, n)| n).sum::<u64>());
    v["enforcement"] = json!(all.enforcement);
    v["unfinished"] = json!(all.unfinished);
    v["refused_after_handover"] = json!(all.refused_after_handover);
    v["errors"] = json!(errors);
    emit(&v);
    if errors.is_empty() {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clients' full jitter: below min(1 s, base · 2^n), and all of it at rand → 1.
    #[test]
    fn backoff_is_the_clients_full_jitter() {
        assert_eq!(backoff(0, 20.0, 0.0), Duration::ZERO);
        assert_eq!(backoff(0, 20.0, 0.5), Duration::from_millis(10));
        assert_eq!(backoff(3, 20.0, 0.5), Duration::from_millis(80));
        assert_eq!(backoff(10, 20.0, 0.5), Duration::from_millis(500), "capped at 1 s");
        assert_eq!(backoff(u32::MAX, 20.0, 0.25), Duration::from_millis(250));
    }
}

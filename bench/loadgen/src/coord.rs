//! The coordinator as a client task sees it: the daemon over HTTP (http.rs), or the
//! coordinator in this process (`--coord inproc:CONFIG`, coordinator_daemon::in_process),
//! answering the same calls with the same JSON.
//!
//! In-process, the client's calls of a transaction (begin, register, commit, abort, a
//! branch's failure, acknowledgements, gtid leases) go to the coordinator's typed methods,
//! with no JSON and no route table on its side (`Typed`); any other call (resources,
//! health) through `InProcess::call`. The tasks build each request once, as the JSON body
//! the HTTP path sends: here it is read into the request type on the driver's side, and
//! the typed answer written back as the JSON value the HTTP path would have parsed, so
//! client.rs runs the same code over both.
//!
//! The coordinator's CPU is counted apart so that it can be booked as the coordinator's
//! and not the driver's: the thread CPU time of every poll of an in-process call (the
//! typed call itself, not the driver's conversions around it), plus the decision store's
//! thread. Left in the driver's share: the coordinator's background tasks (the tick every
//! 50 ms, recovery passes, lease renewal), a few microseconds each, not per transaction.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};

use coordinator_daemon::in_process::{
    AbortRequest, BeginRequest, CommitRequest, FailedRequest, FinishedManyRequest, FinishedRequest, GtidLeaseRequest,
    InProcess, Refused, RegisterRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::http::{CoordError, Http};

pub enum Coord {
    Http(Http),
    InProcess(InProcess),
}

impl Coord {
    pub async fn request(&mut self, method: &str, path: &str, body: &Value) -> Result<Value, CoordError> {
        match self {
            Coord::Http(h) => h.request(method, path, body).await,
            Coord::InProcess(c) => match Typed::of(method, path, body) {
                Some(t) => t.run(c).await,
                None => Metered(Box::pin(c.call(method, path, body))).await,
            }
            .map_err(|r| CoordError {
                status: r.status,
                code: r.code().to_string(),
                message: r.message().to_string(),
            }),
        }
    }

    /// A request whose answer nobody waits for (acknowledgements): pipelined over HTTP;
    /// in-process it is simply made (it never waits for the store).
    pub async fn send_nowait(&mut self, method: &str, path: &str, body: &Value) {
        match self {
            Coord::Http(h) => h.send_nowait(method, path, body).await,
            Coord::InProcess(_) => {
                let _ = self.request(method, path, body).await;
            }
        }
    }
}

/// A client's call of a transaction, as the coordinator's typed method takes it.
enum Typed {
    Begin(BeginRequest),
    Lease(GtidLeaseRequest),
    Register(String, RegisterRequest),
    Commit(String, CommitRequest),
    Abort(String, AbortRequest),
    FinishedMany(String, FinishedManyRequest),
    Failed(String, String, FailedRequest),
    Finished(String, String, FinishedRequest),
}

/// The body as the request type. An absent body is the type's default where the route
/// takes none; a body the type does not read (None) goes through `call`, whose refusal
/// then names what is wrong with it as the daemon would.
fn body<T: DeserializeOwned + Default>(body: &Value) -> Option<T> {
    if body.is_null() {
        return Some(T::default());
    }
    required(body)
}

fn required<T: DeserializeOwned>(body: &Value) -> Option<T> {
    T::deserialize(body).ok()
}

impl Typed {
    /// The typed call of `method` `path` with `body`, or None: not one of these (or a body
    /// they do not read).
    fn of(method: &str, path: &str, b: &Value) -> Option<Typed> {
        if method != "POST" || path.contains('?') {
            return None;
        }
        if path == "/v1/gtid-leases" {
            return Some(Typed::Lease(body(b)?));
        }
        let rest = path.strip_prefix("/v1/transactions")?;
        if rest.is_empty() {
            return Some(Typed::Begin(body(b)?));
        }
        let seg: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
        let g = seg[0].to_string();
        Some(match seg[1..] {
            ["branches"] => Typed::Register(g, required(b)?),
            ["commit"] => Typed::Commit(g, body(b)?),
            ["abort"] => Typed::Abort(g, body(b)?),
            ["finished"] => Typed::FinishedMany(g, required(b)?),
            ["branches", bid, "failed"] => Typed::Failed(g, bid.to_string(), body(b)?),
            ["branches", bid, "finished"] => Typed::Finished(g, bid.to_string(), required(b)?),
            _ => return None,
        })
    }

    async fn run(self, c: &InProcess) -> Result<Value, Refused> {
        match self {
            Typed::Begin(b) => answer(c.begin(b)).await,
            Typed::Lease(b) => answer(async { c.lease_gtids(b) }).await,
            Typed::Register(g, b) => answer(c.register(&g, b)).await,
            Typed::Commit(g, b) => answer(c.commit(&g, b)).await,
            Typed::Abort(g, b) => answer(c.abort(&g, b)).await,
            Typed::FinishedMany(g, b) => answer(c.finished_many(&g, b)).await,
            Typed::Failed(g, bid, b) => answer(c.failed(&g, &bid, b)).await,
            Typed::Finished(g, bid, b) => answer(c.finished(&g, &bid, b)).await,
        }
    }
}

/// A typed call, metered, and its answer as the JSON the HTTP path would have parsed.
async fn answer<T: Serialize>(call: impl Future<Output = Result<T, Refused>>) -> Result<Value, Refused> {
    let a = Metered(Box::pin(call)).await?;
    Ok(serde_json::to_value(a).expect("an answer serializes"))
}

/// Nanoseconds of this process's threads spent polling in-process calls.
static CALLS_NS: AtomicU64 = AtomicU64::new(0);

fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A future whose polls are timed on the polling thread's CPU clock: the time spent
/// waiting (for the store's sync) is not counted, only the work done in each poll.
struct Metered<F>(Pin<Box<F>>);

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let t0 = thread_cpu_ns();
        let r = self.0.as_mut().poll(cx);
        CALLS_NS.fetch_add(thread_cpu_ns().saturating_sub(t0), Relaxed);
        r
    }
}

/// CPU seconds the in-process coordinator has used so far: its calls' polls, and its
/// decision store's thread.
pub fn in_process_cpu_s() -> (f64, f64) {
    (CALLS_NS.load(Relaxed) as f64 / 1e9, coordinator_daemon::store::store_thread_cpu_s())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The client's calls map to their typed methods; a body the type does not read, a
    /// query string or any other route is left to `call`.
    #[test]
    fn calls_are_typed_by_route() {
        let kind = |m, p, b: Value| match Typed::of(m, p, &b) {
            Some(Typed::Begin(_)) => "begin",
            Some(Typed::Lease(_)) => "lease",
            Some(Typed::Register(g, _)) if g == "n.1" => "register",
            Some(Typed::Commit(g, _)) if g == "n.1" => "commit",
            Some(Typed::Abort(..)) => "abort",
            Some(Typed::FinishedMany(..)) => "finished_many",
            Some(Typed::Failed(g, bid, _)) if (g.as_str(), bid.as_str()) == ("n.1", "b0") => "failed",
            Some(Typed::Finished(_, bid, _)) if bid == "b1" => "finished",
            Some(_) => "wrong ids",
            None => "call",
        };
        assert_eq!(kind("POST", "/v1/transactions", Value::Null), "begin");
        assert_eq!(
            kind("POST", "/v1/transactions", json!({"branches": [{"resource": "pg", "branch_id": "b0"}]})),
            "begin"
        );
        assert_eq!(kind("POST", "/v1/gtid-leases", json!({"count": 10})), "lease");
        assert_eq!(
            kind("POST", "/v1/transactions/n.1/branches", json!({"resource": "pg", "branch_id": "b0"})),
            "register"
        );
        assert_eq!(kind("POST", "/v1/transactions/n.1/commit", json!({"prepared": ["b0"]})), "commit");
        assert_eq!(kind("POST", "/v1/transactions/n.1/abort", json!({"reason": "x"})), "abort");
        assert_eq!(
            kind("POST", "/v1/transactions/n.1/finished", json!({"outcome": "commit", "branches": ["b0"]})),
            "finished_many"
        );
        assert_eq!(
            kind("POST", "/v1/transactions/n.1/branches/b0/failed", json!({"reason": "x", "retryable": true})),
            "failed"
        );
        assert_eq!(kind("POST", "/v1/transactions/n.1/branches/b1/finished", json!({"outcome": "abort"})), "finished");
        // Left to call(): its refusal says what is wrong, as the daemon's would.
        assert_eq!(kind("POST", "/v1/transactions/n.1/commit", json!({"prepared": ["b0"], "nope": 1})), "call");
        assert_eq!(kind("POST", "/v1/transactions/n.1/branches", Value::Null), "call");
        assert_eq!(kind("POST", "/v1/transactions/n.1/commit?x=1", Value::Null), "call");
        assert_eq!(kind("GET", "/v1/resources", Value::Null), "call");
        assert_eq!(kind("GET", "/v1/transactions/n.1", Value::Null), "call");
        assert_eq!(kind("POST", "/v1/transactions/n.1/branches/b0/prepared", Value::Null), "call");
    }
}

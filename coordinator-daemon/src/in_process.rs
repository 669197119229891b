//! The coordinator in the caller's process: the daemon without its listener, for Rust
//! programs (the load driver among them) that would rather not pay two HTTP round trips
//! and the daemon's wake-ups per transaction. One implementation of the protocol behind
//! both, and the daemon's own start-up (serve::start: store, witness, node lease,
//! resource locks, records, recovery and the tick).
//!
//! Two ways in. The client's calls are typed methods (`begin`, `register`, `commit`,
//! `abort`, `failed`, `finished`, `finished_many`, `prepared`, `lease_gtids`): the request
//! types of the HTTP API's bodies (api::dto, re-exported here) in, its answer types
//! (crate::wire) out, no JSON between. They run the very rules the HTTP handlers run
//! (api::client_calls), so their answers and refusals are the API's. Everything else goes
//! through `call`, with a JSON body, the same route table and handlers as an HTTP request
//! (api::router).
//!
//! What the caller takes on: it owns a node id and its decision store as a daemon does,
//! so it needs a config of its own (node_id, store) beside any daemon's. If the process
//! dies, its prepared branches wait for a coordinator on that node: the same program
//! restarted, or `cotx-coordinator serve` on the same config, which takes the node over
//! once the lease has run out and finishes them from the store (docs/coordinator.md,
//! "In the caller's process").

use crate::api::client_calls as calls;
use crate::api::dto::{error_body, Call};
use crate::api::router::{count, count_answer, find_route, unmatched};
use crate::config;
use crate::coordinator::{Coordinator, Res};
use crate::refusal::Refusal;
use crate::serve;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;

/// What the typed calls take and answer: the HTTP API's request and response bodies.
pub use crate::api::dto::{
    AbortRequest, BeginRequest, CommitRequest, FailedRequest, FinishedAck, FinishedManyRequest, FinishedRequest,
    GtidLeaseRequest, OutcomeArg, RegisterRequest,
};
pub use crate::wire::{Ack, Begun, Decided, Decision, EnforcementMode, GtidLease, Registered, Shim, Xid};

/// A refused call: the HTTP status the daemon would answer and its error body
/// (`{"error": {"code", "message"[, "owner_url"]}}`).
#[derive(Debug, Clone)]
pub struct Refused {
    pub status: u16,
    pub body: Value,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.body["error"];
        write!(
            f,
            "coordinator {} {}: {}",
            self.status,
            e["code"].as_str().unwrap_or("unknown"),
            e["message"].as_str().unwrap_or("")
        )
    }
}

/// So that `?` carries a refusal into a caller's `Box<dyn Error>`.
impl std::error::Error for Refused {}

impl Refused {
    /// The refusal's code (docs/coordinator.md, "Error codes"); "unknown" for an answer
    /// with no error body (`call` of a route that answers otherwise, e.g. readyz's 503).
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("unknown")
    }

    pub fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or("")
    }
}

/// A refusal as the HTTP API answers it: its code's status, its error body.
impl From<&Refusal> for Refused {
    fn from(r: &Refusal) -> Refused {
        Refused { status: r.code.http_status(), body: error_body(r) }
    }
}

#[derive(Clone)]
pub struct InProcess {
    c: Arc<Coordinator>,
}

impl InProcess {
    /// Starts the coordinator of the config at `path` in this process, on the caller's
    /// tokio runtime (its background tasks are spawned there).
    pub async fn start(path: &str) -> Result<InProcess, String> {
        let cfg = config::load(path).map_err(|e| e.to_string())?;
        Ok(InProcess { c: serve::start(cfg).await? })
    }

    /// One call of the HTTP API (`method`, a path with its query, a JSON body) answered as
    /// the daemon would answer it. The caller is the process that holds the config: it has
    /// every role, so no credential is checked.
    pub async fn call(&self, method: &str, path_and_query: &str, body: &Value) -> Result<Value, Refused> {
        let (path, q) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q.to_string())),
            None => (path_and_query, None),
        };
        let routed = match find_route(method, path) {
            Ok((m, p)) => {
                let body = if body.is_null() {
                    Bytes::new()
                } else {
                    Bytes::from(serde_json::to_vec(body).expect("a JSON value serializes"))
                };
                (m.route.handler)(self.c.clone(), Call { p: p.into_iter().map(str::to_string).collect(), q, body })
                    .await
            }
            Err(known_path) => Err(unmatched(known_path, path)),
        };
        count(&self.c, &routed);
        match routed {
            Ok((status, Err(v))) if status < 400 => Ok(v),
            Ok((status, Err(v))) => Err(Refused { status, body: v }),
            // A prebuilt response (the metrics text, the console's files): its body as a
            // JSON string, or the JSON it holds.
            Ok((status, Ok(resp))) => {
                let bytes = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let v = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
                if status < 400 {
                    Ok(v)
                } else {
                    Err(Refused { status, body: v })
                }
            }
            Err(r) => Err(Refused::from(&r)),
        }
    }

    /// A typed call's answer, counted as the daemon counts a request.
    fn answer<T>(&self, r: Res<T>) -> Result<T, Refused> {
        count_answer(&self.c, r.as_ref().err());
        r.map_err(|e| Refused::from(&e))
    }

    /// `POST /v1/transactions`: begin, with the first branch (`branch`) or all of them
    /// (`branches`), and acknowledgements of earlier transactions (`finished`).
    pub async fn begin(&self, b: BeginRequest) -> Result<Begun, Refused> {
        self.answer(calls::begin(&self.c, b).await)
    }

    /// `POST /v1/transactions/{gtid}/branches`.
    pub async fn register(&self, gtid: &str, b: RegisterRequest) -> Result<Registered, Refused> {
        self.answer(calls::register(&self.c, gtid, b).await)
    }

    /// `POST /v1/transactions/{gtid}/branches/{bid}/prepared`.
    pub async fn prepared(&self, gtid: &str, bid: &str) -> Result<Ack, Refused> {
        self.answer(calls::prepared(&self.c, gtid, bid).await)
    }

    /// `POST /v1/transactions/{gtid}/branches/{bid}/failed`.
    pub async fn failed(&self, gtid: &str, bid: &str, b: FailedRequest) -> Result<Ack, Refused> {
        self.answer(calls::failed(&self.c, gtid, bid, b).await)
    }

    /// `POST /v1/transactions/{gtid}/branches/{bid}/finished`.
    pub async fn finished(&self, gtid: &str, bid: &str, b: FinishedRequest) -> Result<Ack, Refused> {
        self.answer(calls::finished(&self.c, gtid, bid, b).await)
    }

    /// `POST /v1/transactions/{gtid}/finished`.
    pub async fn finished_many(&self, gtid: &str, b: FinishedManyRequest) -> Result<Ack, Refused> {
        self.answer(calls::finished_many(&self.c, gtid, b).await)
    }

    /// `POST /v1/gtid-leases`.
    pub fn lease_gtids(&self, b: GtidLeaseRequest) -> Result<GtidLease, Refused> {
        self.answer(calls::lease_gtids(&self.c, b))
    }

    /// `POST /v1/transactions/{gtid}/commit`: `prepared` (and `read_only`), or
    /// `one_phase_branch`, or `decide_in`, or the one-request commit (`branches`).
    pub async fn commit(&self, gtid: &str, b: CommitRequest) -> Result<Decision, Refused> {
        self.answer(calls::commit(&self.c, gtid, b).await)
    }

    /// `POST /v1/transactions/{gtid}/abort`.
    pub async fn abort(&self, gtid: &str, b: AbortRequest) -> Result<Decision, Refused> {
        self.answer(calls::abort(&self.c, gtid, b).await)
    }

    /// The decision store's syncs (batches written) so far, and the writes they carried.
    pub fn store_syncs(&self) -> (u64, u64) {
        let s = &self.c.store.stats;
        (s.batches.load(std::sync::atomic::Ordering::Relaxed), s.ops.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The daemon's orderly stop: the node's lease released, so that a daemon on the same
    /// config owns it at once.
    pub async fn stop(&self) {
        serve::stop(&self.c).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::Ordering::Relaxed;

    /// A call goes through the daemon's route table and handlers: the same answers, the
    /// same refusals with the same error body and status, for a route that does not exist
    /// or a method it does not take.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_answer_as_the_api_does() {
        let c = InProcess { c: crate::coordinator::tests::coord("in-process").await };
        let b = c
            .call("POST", "/v1/transactions", &json!({"branches": [{"resource": "pg", "branch_id": "b0"}]}))
            .await
            .unwrap();
        let gtid = b["gtid"].as_str().unwrap().to_string();
        assert_eq!(b["branches"][0]["branch_id"], "b0", "{b}");
        let got = c.call("GET", &format!("/v1/transactions/{gtid}"), &Value::Null).await.unwrap();
        assert_eq!(got["state"], "active", "{got}");
        let r = c
            .call("POST", "/v1/transactions", &json!({"branches": [{"resource": "nope", "branch_id": "b0"}]}))
            .await
            .unwrap_err();
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("unknown_resource")), "{:?}", r.body);
        let r = c.call("GET", "/v1/nothing", &Value::Null).await.unwrap_err();
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (404, Some("not_found")), "{:?}", r.body);
        let r = c.call("DELETE", &format!("/v1/transactions/{gtid}"), &Value::Null).await.unwrap_err();
        assert_eq!((r.status, r.body["error"]["code"].as_str()), (405, Some("method_not_allowed")), "{:?}", r.body);
        let r =
            c.call("POST", &format!("/v1/transactions/{gtid}/commit"), &json!({"prepared": ["b9"]})).await.unwrap_err();
        assert!(r.status >= 400 && r.body["error"]["message"].as_str().unwrap().contains("b9"), "{:?}", r.body);
        assert!(
            r.to_string().starts_with(&format!("coordinator {} ", r.status)) && r.to_string().contains("b9"),
            "{r}"
        );
    }

    /// Each typed call against `call` with the same request as JSON: the answer's JSON
    /// with `gtid` replaced by "G" (two transactions, one each way).
    fn same_answer<T: serde::Serialize>(typed: Result<T, Refused>, called: Result<Value, Refused>, gtids: [&str; 2]) {
        let typed = crate::wire::to_json(&typed.unwrap()).to_string().replace(gtids[0], "G");
        let called = called.unwrap().to_string().replace(gtids[1], "G");
        assert_eq!(typed, called);
    }

    async fn post(c: &InProcess, path: &str, body: Value) -> Result<Value, Refused> {
        c.call("POST", path, &body).await
    }

    /// The same refusal (status, code, message, body) both ways.
    fn same_refusal<T: std::fmt::Debug>(typed: Result<T, Refused>, called: Result<Value, Refused>, code: &str) {
        let (t, c) = (typed.unwrap_err(), called.unwrap_err());
        assert_eq!((t.status, &t.body), (c.status, &c.body));
        assert_eq!(t.code(), code, "{t}");
        assert!(!t.message().is_empty() && t.to_string() == c.to_string(), "{t}");
    }

    /// The typed calls run the handlers' rules: for the same input they answer as `call`
    /// does (a begin with its branches, an all-read-only commit, the one-request commit of
    /// a leased gtid, acknowledgements), refuse what it refuses with the same status, code
    /// and message (an unknown gtid, a bad branch id, the excluded combinations of a
    /// commit's fields, a reason too long), and are counted in the request metrics.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn typed_calls_answer_and_refuse_as_call_does() {
        let c = InProcess { c: crate::coordinator::tests::coord("in-process-typed").await };
        let reg = |bid: &str| RegisterRequest { resource: "pg".into(), branch_id: bid.into(), ..Default::default() };
        let two = json!({"branches": [{"resource": "pg", "branch_id": "b0"}, {"resource": "pg", "branch_id": "b1"}]});
        let begun = c.begin(BeginRequest { branches: Some(vec![reg("b0"), reg("b1")]), ..Default::default() }).await;
        let (g1, gtid) = (begun.as_ref().unwrap().gtid.clone(), |v: &Value| v["gtid"].as_str().unwrap().to_string());
        let called = c.call("POST", "/v1/transactions", &two).await;
        let g2 = gtid(called.as_ref().unwrap());
        same_answer(begun, called, [&g1, &g2]);

        // Every branch listed read-only: decided in memory, the same answer both ways.
        let both = || Some(vec!["b0".to_string(), "b1".to_string()]);
        let (ro0, requests0) = (c.c.metrics.read_only_commits.load(Relaxed), c.c.metrics.requests.load(Relaxed));
        let typed = c.commit(&g1, CommitRequest { prepared: both(), read_only: both(), ..Default::default() }).await;
        let body = json!({"prepared": ["b0", "b1"], "read_only": ["b0", "b1"]});
        let called = c.call("POST", &format!("/v1/transactions/{g2}/commit"), &body).await;
        assert_eq!(called.as_ref().unwrap()["decision"], "commit");
        same_answer(typed, called, [&g1, &g2]);
        assert_eq!(c.c.metrics.read_only_commits.load(Relaxed) - ro0, 2);
        assert_eq!(c.c.metrics.requests.load(Relaxed) - requests0, 2, "a typed call is counted as a request");
        let ack = |bids: &[&str]| FinishedManyRequest {
            outcome: OutcomeArg::Commit,
            branches: bids.iter().map(|b| b.to_string()).collect(),
        };
        let typed = c.finished_many(&g1, ack(&["b0", "b1"])).await;
        let body = json!({"outcome": "commit", "branches": ["b0", "b1"]});
        same_answer(typed, c.call("POST", &format!("/v1/transactions/{g2}/finished"), &body).await, [&g1, &g2]);

        // The one-request commit of a leased gtid, its branches listed.
        let lease = c.lease_gtids(GtidLeaseRequest { count: Some(2), ..Default::default() }).unwrap();
        let (l1, l2) = (format!("{}{:x}", lease.prefix, lease.first), format!("{}{:x}", lease.prefix, lease.first + 1));
        let typed = c.commit(&l1, CommitRequest { branches: Some(vec![reg("b0")]), ..Default::default() }).await;
        let body = json!({"branches": [{"resource": "pg", "branch_id": "b0"}]});
        same_answer(typed, c.call("POST", &format!("/v1/transactions/{l2}/commit"), &body).await, [&l1, &l2]);

        // Refusals.
        let refused0 = c.c.metrics.refused_requests.load(Relaxed);
        let unknown = "u1.ffff.1";
        let typed = c.commit(unknown, CommitRequest { prepared: both(), ..Default::default() }).await;
        let called = post(&c, &format!("/v1/transactions/{unknown}/commit"), json!({"prepared": ["b0", "b1"]})).await;
        same_refusal(typed, called, "unknown_transaction");
        let typed = c.abort(unknown, AbortRequest::default()).await;
        same_refusal(
            typed,
            c.call("POST", &format!("/v1/transactions/{unknown}/abort"), &Value::Null).await,
            "unknown_transaction",
        );
        let g = c.begin(BeginRequest::default()).await.unwrap().gtid;
        let typed = c.register(&g, reg("b 0")).await;
        let body = json!({"resource": "pg", "branch_id": "b 0"});
        same_refusal(typed, c.call("POST", &format!("/v1/transactions/{g}/branches"), &body).await, "invalid_id");
        let typed =
            c.begin(BeginRequest { branch: Some(reg("b0")), branches: Some(vec![reg("b1")]), ..Default::default() });
        let body = json!({"branch": {"resource": "pg", "branch_id": "b0"}, "branches": [{"resource": "pg", "branch_id": "b1"}]});
        same_refusal(typed.await, c.call("POST", "/v1/transactions", &body).await, "invalid_field");
        let req = CommitRequest { one_phase_branch: Some("b0".into()), prepared: both(), ..Default::default() };
        let body = json!({"one_phase_branch": "b0", "prepared": ["b0", "b1"]});
        same_refusal(
            c.commit(&g, req).await,
            c.call("POST", &format!("/v1/transactions/{g}/commit"), &body).await,
            "invalid_field",
        );
        let req = CommitRequest { one_phase_branch: Some("b0".into()), read_only: both(), ..Default::default() };
        let body = json!({"one_phase_branch": "b0", "read_only": ["b0", "b1"]});
        same_refusal(
            c.commit(&g, req).await,
            c.call("POST", &format!("/v1/transactions/{g}/commit"), &body).await,
            "invalid_field",
        );
        let long = "x".repeat(1001);
        let typed = c.failed(&g, "b0", FailedRequest { reason: Some(long.clone()), ..Default::default() }).await;
        let called = post(&c, &format!("/v1/transactions/{g}/branches/b0/failed"), json!({"reason": long})).await;
        same_refusal(typed, called, "invalid_field");
        let typed = c.lease_gtids(GtidLeaseRequest { count: Some(0), ..Default::default() });
        same_refusal(typed, c.call("POST", "/v1/gtid-leases", &json!({"count": 0})).await, "invalid_field");
        assert_eq!(c.c.metrics.refused_requests.load(Relaxed) - refused0, 16, "both ways counted as refused");
        // The transaction the refusals were made on is untouched.
        assert_eq!(c.call("GET", &format!("/v1/transactions/{g}"), &Value::Null).await.unwrap()["state"], "active");
    }
}

//! The coordinator in the caller's process: the daemon without its listener, for Rust
//! programs (the load driver among them) that would rather not pay two HTTP round trips
//! and the daemon's wake-ups per transaction. One implementation of the protocol behind
//! both: a call goes through the same route table and handlers as an HTTP request
//! (api::router), with the same JSON bodies and the same refusals, and the start-up is
//! the daemon's own (serve::start: store, witness, node lease, resource locks, records,
//! recovery and the tick).
//!
//! What the caller takes on: it owns a node id and its decision store as a daemon does,
//! so it needs a config of its own (node_id, store) beside any daemon's. If the process
//! dies, its prepared branches wait for a coordinator on that node: the same program
//! restarted, or `cotx-coordinator serve` on the same config, which takes the node over
//! once the lease has run out and finishes them from the store (docs/coordinator.md,
//! "In the caller's process").

use crate::api::dto::{error_body, Call};
use crate::api::router::{count, find_route, unmatched};
use crate::config;
use crate::coordinator::Coordinator;
use crate::serve;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;

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
            Err(r) => Err(Refused { status: r.code.http_status(), body: error_body(&r) }),
        }
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
}

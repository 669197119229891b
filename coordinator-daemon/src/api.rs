//! HTTP/JSON API. Every request is checked in full (auth, route, body, ids, state) before
//! anything changes; refusals are 4xx with `{"error": {"code", "message"}}`.

use crate::coordinator::Coordinator;
use crate::state::{refuse, Outcome, Refusal};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

const MAX_BODY: usize = 64 * 1024;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BeginBody {
    timeout_ms: Option<u64>,
    /// Register the first branch in the same request (saves the root a round trip).
    branch: Option<RegisterBody>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    resource: String,
    branch_id: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct EmptyBody {}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FailedBody {
    reason: Option<String>,
    retryable: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishedBody {
    outcome: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CommitBody {
    one_phase_branch: Option<String>,
    prepared: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishedManyBody {
    outcome: String,
    branches: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AbortBody {
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ForceBody {
    gtid: String,
    outcome: String,
    operator: String,
    reason: String,
    confirm: bool,
}

fn parse<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, Refusal> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    parse_required(body)
}

fn parse_required<T: DeserializeOwned>(body: &Bytes) -> Result<T, Refusal> {
    let v: Value = serde_json::from_slice(body).map_err(|e| Refusal::new(400, "invalid_json", format!("body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return refuse(400, "invalid_body", "body must be a JSON object");
    }
    serde_json::from_value(v).map_err(|e| Refusal::new(400, "invalid_field", format!("{e}")))
}

fn text_field(what: &str, s: &str, max: usize) -> Result<(), Refusal> {
    if s.len() > max {
        return refuse(400, "invalid_field", format!("{what} is longer than {max} bytes"));
    }
    Ok(())
}

fn query(req_query: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, Refusal> {
    let mut out = vec![];
    for kv in req_query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if !allowed.contains(&k) {
            return refuse(400, "invalid_field", format!("unknown query parameter {k:?}"));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

fn reply(status: u16, v: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

fn error_reply(r: &Refusal) -> Response<Full<Bytes>> {
    let mut err = json!({"code": r.code, "message": r.message});
    if let Some(u) = &r.owner_url {
        err["owner_url"] = json!(u);
    }
    let mut resp = reply(r.status, &json!({"error": err}));
    if r.status == 429 || r.status == 503 {
        resp.headers_mut().insert("retry-after", hyper::header::HeaderValue::from_static("1"));
    }
    resp
}

fn authorized(c: &Coordinator, req: &Request<Incoming>) -> bool {
    let Some(tok) = &c.cfg.token else { return true };
    let Some(h) = req.headers().get("authorization").and_then(|v| v.to_str().ok()) else { return false };
    let Some(given) = h.strip_prefix("Bearer ") else { return false };
    // Constant-time comparison: the token must not leak through timing.
    let (a, b) = (given.as_bytes(), tok.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn handle(c: Arc<Coordinator>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let r = route(&c, req).await;
    Ok(match r {
        Ok((status, resp)) => resp.unwrap_or_else(|v| reply(status, &v)),
        Err(e) => {
            if e.status < 500 {
                c.metrics.refused_requests.fetch_add(1, Relaxed);
            }
            error_reply(&e)
        }
    })
}

type Routed = Result<(u16, Result<Response<Full<Bytes>>, Value>), Refusal>;

fn ok(v: Value) -> Routed {
    Ok((200, Err(v)))
}

async fn route(c: &Arc<Coordinator>, req: Request<Incoming>) -> Routed {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let q = req.uri().query().map(|s| s.to_string());
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // Unauthenticated: liveness and the API description.
    match (&method, segs.as_slice()) {
        (&Method::GET, ["healthz"]) => {
            query(q.as_deref(), &[])?;
            let up = c.resource_up.lock().unwrap().clone();
            return ok(json!({"status": "ok", "node_id": c.cfg.node_id, "resources": up}));
        }
        (&Method::GET, ["openapi.json"]) => {
            query(q.as_deref(), &[])?;
            return ok(crate::openapi::document());
        }
        _ => {}
    }
    if !authorized(c, &req) {
        return refuse(401, "unauthorized", "missing or wrong bearer token");
    }
    let known = matches!(
        segs.as_slice(),
        ["metrics"] | ["v1", "transactions"] | ["v1", "transactions", _] | ["v1", "transactions", _, "branches"]
            | ["v1", "transactions", _, "branches", _, "prepared" | "failed" | "finished"]
            | ["v1", "transactions", _, "commit" | "abort" | "decision" | "finished"] | ["v1", "incidents"] | ["v1", "in-doubt"] | ["v1", "audit"] | ["v1", "admin", "force"]
    );
    if !known {
        return refuse(404, "not_found", format!("no route {path}"));
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return refuse(413, "payload_too_large", format!("body larger than {MAX_BODY} bytes")),
    };
    match (method, segs.as_slice()) {
        (Method::GET, ["metrics"]) => {
            query(q.as_deref(), &[])?;
            let g = c.gauges();
            let up: Vec<(String, bool)> = c.resource_up.lock().unwrap().iter().map(|(k, v)| (k.clone(), *v)).collect();
            let text = c.metrics.render(&g, c.store.stats.batches.load(Relaxed), c.store.stats.ops.load(Relaxed), &up);
            Ok((200, Ok(Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(text)))
                .unwrap())))
        }
        (Method::POST, ["v1", "transactions"]) => {
            query(q.as_deref(), &[])?;
            let b: BeginBody = parse(&body)?;
            match b.branch {
                None => Ok((201, Err(c.begin(b.timeout_ms)?))),
                Some(r) => Ok((201, Err(c.begin_with_branch(b.timeout_ms, &r.resource, &r.branch_id).await?))),
            }
        }
        (Method::GET, ["v1", "transactions"]) => {
            let qs = query(q.as_deref(), &["state"])?;
            let st = qs.iter().find(|(k, _)| k == "state").map(|(_, v)| v.as_str());
            ok(c.list(st)?)
        }
        (Method::GET, ["v1", "transactions", g]) => {
            query(q.as_deref(), &[])?;
            ok(c.get(g).await?)
        }
        (Method::POST, ["v1", "transactions", g, "branches"]) => {
            query(q.as_deref(), &[])?;
            let b: RegisterBody = parse_required(&body)?;
            Ok((201, Err(c.register(g, &b.resource, &b.branch_id).await?)))
        }
        (Method::POST, ["v1", "transactions", g, "branches", bid, "prepared"]) => {
            query(q.as_deref(), &[])?;
            let _: EmptyBody = parse(&body)?;
            ok(c.prepared(g, bid).await?)
        }
        (Method::POST, ["v1", "transactions", g, "branches", bid, "failed"]) => {
            query(q.as_deref(), &[])?;
            let b: FailedBody = parse(&body)?;
            let reason = b.reason.unwrap_or_else(|| "prepare failed".into());
            text_field("reason", &reason, 1000)?;
            ok(c.failed(g, bid, &reason, b.retryable.unwrap_or(false)).await?)
        }
        (Method::POST, ["v1", "transactions", g, "branches", bid, "finished"]) => {
            query(q.as_deref(), &[])?;
            let b: FinishedBody = parse_required(&body)?;
            let Some(o) = Outcome::parse(&b.outcome) else {
                return refuse(400, "invalid_field", "outcome must be \"commit\" or \"abort\"");
            };
            ok(c.finished(g, bid, o).await?)
        }
        (Method::POST, ["v1", "transactions", g, "commit"]) => {
            query(q.as_deref(), &[])?;
            let b: CommitBody = parse(&body)?;
            match (b.one_phase_branch, b.prepared) {
                (Some(_), Some(_)) => refuse(400, "invalid_field", "one_phase_branch and prepared exclude each other"),
                (Some(bid), None) => ok(c.one_phase(g, &bid).await?),
                (None, p) => {
                    let p = p.unwrap_or_default();
                    if p.len() > 1000 {
                        return refuse(400, "invalid_field", "prepared lists at most 1000 branch ids");
                    }
                    ok(c.commit_with(g, "coordinator", &p).await?)
                }
            }
        }
        (Method::POST, ["v1", "transactions", g, "finished"]) => {
            query(q.as_deref(), &[])?;
            let b: FinishedManyBody = parse_required(&body)?;
            let Some(o) = Outcome::parse(&b.outcome) else {
                return refuse(400, "invalid_field", "outcome must be \"commit\" or \"abort\"");
            };
            ok(c.finished_many(g, &b.branches, o).await?)
        }
        (Method::POST, ["v1", "transactions", g, "abort"]) => {
            query(q.as_deref(), &[])?;
            let b: AbortBody = parse(&body)?;
            let reason = b.reason.unwrap_or_else(|| "aborted by client".into());
            text_field("reason", &reason, 1000)?;
            ok(c.abort(g, &reason).await?)
        }
        (Method::GET, ["v1", "transactions", g, "decision"]) => {
            let qs = query(q.as_deref(), &["wait_ms"])?;
            let wait = match qs.iter().find(|(k, _)| k == "wait_ms") {
                None => 0,
                Some((_, v)) => v.parse::<u64>().map_err(|_| Refusal::new(400, "invalid_field", "wait_ms must be a non-negative integer"))?,
            };
            ok(c.wait_decision(g, wait).await?)
        }
        (Method::GET, ["v1", "in-doubt"]) => {
            query(q.as_deref(), &[])?;
            ok(c.in_doubt_report().await?)
        }
        (Method::GET, ["v1", "incidents"]) => {
            query(q.as_deref(), &[])?;
            let v = c.incidents.lock().unwrap().clone();
            ok(json!({"incidents": v}))
        }
        (Method::GET, ["v1", "audit"]) => {
            query(q.as_deref(), &[])?;
            let v = c.store.audit_log().await.map_err(|e| Refusal::new(503, "store_unavailable", e))?;
            ok(json!({"audit": v}))
        }
        (Method::POST, ["v1", "admin", "force"]) => {
            query(q.as_deref(), &[])?;
            let b: ForceBody = parse_required(&body)?;
            if !b.confirm {
                return refuse(400, "confirmation_required", "forcing an outcome requires \"confirm\": true");
            }
            let Some(o) = Outcome::parse(&b.outcome) else {
                return refuse(400, "invalid_field", "outcome must be \"commit\" or \"abort\"");
            };
            text_field("operator", &b.operator, 200)?;
            text_field("reason", &b.reason, 1000)?;
            if b.operator.trim().is_empty() || b.reason.trim().is_empty() {
                return refuse(400, "invalid_field", "operator and reason must not be empty");
            }
            ok(c.force(&b.gtid, o, &b.operator, &b.reason).await?)
        }
        _ => refuse(405, "method_not_allowed", format!("method not allowed on {path}")),
    }
}

/// Accepts connections up to limits.max_connections (more get a 503 and are closed); a
/// request's headers must arrive within limits.header_timeout_ms and a keep-alive
/// connection idle for limits.idle_timeout_ms is closed, so slow or half-open clients hold
/// nothing for long.
pub async fn serve(c: Arc<Coordinator>, listener: tokio::net::TcpListener) {
    use std::time::Duration;
    let slots = Arc::new(tokio::sync::Semaphore::new(c.cfg.limits.max_connections));
    let header_timeout = Duration::from_millis(c.cfg.limits.header_timeout_ms);
    let idle_timeout = Duration::from_millis(c.cfg.limits.idle_timeout_ms);
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            c.metrics.connections_refused.fetch_add(1, Relaxed);
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let body = r#"{"error":{"code":"too_many_connections","message":"limits.max_connections reached"}}"#;
                let msg = format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(msg.as_bytes())).await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let c = c.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let activity = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let seen = activity.clone();
            let svc = hyper::service::service_fn(move |req| {
                seen.fetch_add(1, Relaxed);
                handle(c.clone(), req)
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::pin!(conn);
            // Idle keep-alive: close when no request arrived for a whole idle period.
            let mut last = u64::MAX;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = tokio::time::sleep(idle_timeout) => {
                        let now = activity.load(Relaxed);
                        if now == last {
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(Duration::from_secs(5), conn.as_mut()).await;
                            break;
                        }
                        last = now;
                    }
                }
            }
        });
    }
}

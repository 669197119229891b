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
    /// The branch whose one-phase commit carries the global decision (co.decide).
    decide_in: Option<String>,
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
    let v: Value = serde_json::from_slice(body).map_err(|e| Refusal::new("invalid_json", format!("body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return refuse("invalid_body", "body must be a JSON object");
    }
    serde_json::from_value(v).map_err(|e| Refusal::new("invalid_field", format!("{e}")))
}

fn text_field(what: &str, s: &str, max: usize) -> Result<(), Refusal> {
    if s.len() > max {
        return refuse("invalid_field", format!("{what} is longer than {max} bytes"));
    }
    Ok(())
}

fn query(req_query: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, Refusal> {
    let mut out = vec![];
    for kv in req_query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if !allowed.contains(&k) {
            return refuse("invalid_field", format!("unknown query parameter {k:?}"));
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

/// The HTTP status of each refusal code (docs/coordinator.md, "Error codes").
pub fn http_status(code: &str) -> u16 {
    match code {
        "invalid_json" | "invalid_body" | "invalid_field" | "invalid_id" | "id_too_long" | "confirmation_required" => 400,
        "unauthorized" => 401,
        "not_found" | "not_in_memory" | "unknown_transaction" | "unknown_branch" | "unknown_resource" => 404,
        "method_not_allowed" => 405,
        "duplicate_branch" | "already_prepared" | "branch_not_prepared" | "no_branches" | "not_single_branch" | "not_decided"
        | "outcome_mismatch" | "transaction_aborted" | "transaction_committed" | "transaction_one_phase" | "wrong_state"
        | "transaction_deciding" | "not_a_decision_resource"
        | "contradicts_decision" => 409,
        "payload_too_large" => 413,
        "wrong_node" => 421,
        "too_many_transactions" => 429,
        "store_unavailable" | "owner_unavailable" | "quarantined" | "lease_unconfirmed" | "too_many_connections" => 503,
        _ => 500,
    }
}

fn error_reply(r: &Refusal) -> Response<Full<Bytes>> {
    let mut err = json!({"code": r.code, "message": r.message});
    if let Some(u) = &r.owner_url {
        err["owner_url"] = json!(u);
    }
    let status = http_status(r.code);
    let mut resp = reply(status, &json!({"error": err}));
    if status == 429 || status == 503 {
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

/// A W3C trace context header (`version-traceid-parentid-flags`, lowercase hex), if well formed.
pub fn traceparent(v: &str) -> Option<&str> {
    let p: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (p.len() == 4 && hex(p[0], 2) && p[0] != "ff" && hex(p[1], 32) && hex(p[2], 16) && hex(p[3], 2)
        && p[1].bytes().any(|b| b != b'0') && p[2].bytes().any(|b| b != b'0'))
    .then_some(v)
}

pub async fn handle(c: Arc<Coordinator>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    // A caller's trace context is logged with the gtid, so the coordinator's part of a
    // workflow can be found from the caller's trace (no log line without one: hot path).
    let trace = req.headers().get("traceparent").and_then(|v| v.to_str().ok()).and_then(traceparent).map(str::to_string);
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let r = route(&c, req).await;
    let (status, resp) = match r {
        Ok((status, resp)) => (status, resp.unwrap_or_else(|v| reply(status, &v))),
        Err(e) => {
            if http_status(e.code) < 500 {
                c.metrics.refused_requests.fetch_add(1, Relaxed);
            }
            (http_status(e.code), error_reply(&e))
        }
    };
    if let Some(t) = trace {
        let gtid = path.strip_prefix("/v1/transactions/").and_then(|r| r.split('/').next()).map(str::to_string);
        crate::log::log("info", "request", json!({"method": method, "path": path, "status": status, "gtid": gtid, "traceparent": t}));
    }
    Ok(resp)
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
        return refuse("unauthorized", "missing or wrong bearer token");
    }
    let known = matches!(
        segs.as_slice(),
        ["metrics"] | ["v1", "transactions"] | ["v1", "transactions", _] | ["v1", "transactions", _, "branches"]
            | ["v1", "transactions", _, "branches", _, "prepared" | "failed" | "finished"]
            | ["v1", "transactions", _, "commit" | "abort" | "decision" | "finished"] | ["v1", "incidents"] | ["v1", "in-doubt"] | ["v1", "audit"] | ["v1", "admin", "force"]
    );
    if !known {
        return refuse("not_found", format!("no route {path}"));
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return refuse("payload_too_large", format!("body larger than {MAX_BODY} bytes")),
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
                return refuse("invalid_field", "outcome must be \"commit\" or \"abort\"");
            };
            ok(c.finished(g, bid, o).await?)
        }
        (Method::POST, ["v1", "transactions", g, "commit"]) => {
            query(q.as_deref(), &[])?;
            let b: CommitBody = parse(&body)?;
            match (b.one_phase_branch, b.prepared) {
                (Some(_), _) if b.decide_in.is_some() => refuse("invalid_field", "one_phase_branch and decide_in exclude each other"),
                (None, p) if b.decide_in.is_some() => {
                    let p = p.unwrap_or_default();
                    if p.len() > 1000 {
                        return refuse("invalid_field", "prepared lists at most 1000 branch ids");
                    }
                    ok(c.commit_decide_in(g, &p, b.decide_in.as_deref().unwrap_or_default()).await?)
                }
                (Some(_), Some(_)) => refuse("invalid_field", "one_phase_branch and prepared exclude each other"),
                (Some(bid), None) => ok(c.one_phase(g, &bid).await?),
                (None, p) => {
                    let p = p.unwrap_or_default();
                    if p.len() > 1000 {
                        return refuse("invalid_field", "prepared lists at most 1000 branch ids");
                    }
                    ok(c.commit_with(g, "coordinator", &p).await?)
                }
            }
        }
        (Method::POST, ["v1", "transactions", g, "finished"]) => {
            query(q.as_deref(), &[])?;
            let b: FinishedManyBody = parse_required(&body)?;
            let Some(o) = Outcome::parse(&b.outcome) else {
                return refuse("invalid_field", "outcome must be \"commit\" or \"abort\"");
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
                Some((_, v)) => v.parse::<u64>().map_err(|_| Refusal::new("invalid_field", "wait_ms must be a non-negative integer"))?,
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
            let v = c.store.audit_log().await.map_err(|e| Refusal::new("store_unavailable", e))?;
            ok(json!({"audit": v}))
        }
        (Method::POST, ["v1", "admin", "force"]) => {
            query(q.as_deref(), &[])?;
            let b: ForceBody = parse_required(&body)?;
            if !b.confirm {
                return refuse("confirmation_required", "forcing an outcome requires \"confirm\": true");
            }
            let Some(o) = Outcome::parse(&b.outcome) else {
                return refuse("invalid_field", "outcome must be \"commit\" or \"abort\"");
            };
            text_field("operator", &b.operator, 200)?;
            text_field("reason", &b.reason, 1000)?;
            if b.operator.trim().is_empty() || b.reason.trim().is_empty() {
                return refuse("invalid_field", "operator and reason must not be empty");
            }
            ok(c.force(&b.gtid, o, &b.operator, &b.reason).await?)
        }
        _ => refuse("method_not_allowed", format!("method not allowed on {path}")),
    }
}

/// The TLS acceptor of `[tls]`: certificate chain and key from PEM files.
pub fn tls_acceptor(t: &crate::config::Tls) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(&t.cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("tls.cert_file {}: {e}", t.cert_file))?;
    if certs.is_empty() {
        return Err(format!("tls.cert_file {}: no certificate in it", t.cert_file));
    }
    let key = PrivateKeyDer::from_pem_file(&t.key_file).map_err(|e| format!("tls.key_file {}: {e}", t.key_file))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls: {e}"))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// Accepts connections up to limits.max_connections (more get a 503 and are closed); with
/// `[tls]` every connection is TLS (its handshake within limits.header_timeout_ms); a
/// request's headers must arrive within limits.header_timeout_ms and a keep-alive
/// connection idle for limits.idle_timeout_ms is closed, so slow or half-open clients hold
/// nothing for long.
pub async fn serve(c: Arc<Coordinator>, listener: tokio::net::TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) {
    use std::time::Duration;
    let slots = Arc::new(tokio::sync::Semaphore::new(c.cfg.limits.max_connections));
    let header_timeout = Duration::from_millis(c.cfg.limits.header_timeout_ms);
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
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_conn(c, hyper_util::rt::TokioIo::new(stream)).await,
                Some(acc) => {
                    if let Ok(Ok(s)) = tokio::time::timeout(header_timeout, acc.accept(stream)).await {
                        serve_conn(c, hyper_util::rt::TokioIo::new(s)).await
                    }
                }
            }
        });
    }
}

async fn serve_conn<I>(c: Arc<Coordinator>, io: I)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    use std::time::Duration;
    let header_timeout = Duration::from_millis(c.cfg.limits.header_timeout_ms);
    let idle_timeout = Duration::from_millis(c.cfg.limits.idle_timeout_ms);
    let activity = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = activity.clone();
    let svc = hyper::service::service_fn(move |req| {
        seen.fetch_add(1, Relaxed);
        handle(c.clone(), req)
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(io, svc);
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
}

#[cfg(test)]
mod tests {
    #[test]
    fn traceparent_is_checked() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(super::traceparent(ok), Some(ok));
        for bad in ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"] {
            assert_eq!(super::traceparent(bad), None, "{bad}");
        }
    }

    /// Every refusal code written anywhere in the daemon has its HTTP status here.
    #[test]
    fn every_refusal_code_has_a_status() {
        let sources = [
            include_str!("api.rs"),
            include_str!("coordinator.rs"),
            include_str!("operator.rs"),
            include_str!("state.rs"),
            include_str!("naming.rs"),
        ];
        let mut n = 0;
        for src in sources {
            for pat in ["refuse(\"", "Refusal::new(\"", "code: \""] {
                for part in src.split(pat).skip(1) {
                    let code = part.split('"').next().unwrap();
                    if code.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !code.is_empty() {
                        n += 1;
                        assert_ne!(super::http_status(code), 500, "refusal code {code:?} has no HTTP status");
                    }
                }
            }
        }
        assert!(n > 20, "found only {n} codes");
    }
}

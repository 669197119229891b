//! HTTP/JSON API. Every request is checked in full (auth, route, body, ids, state) before
//! anything changes; refusals are 4xx with `{"error": {"code", "message"}}`.

pub mod auth;
pub mod console;
pub mod openapi;

use self::auth::{Access, Role};
use crate::coordinator::Coordinator;
use crate::api::openapi::{Ack, Audit, Begun, Decision, DecisionState, Health, Id, Incidents, Nodes, Registered, Resources, Transaction, TransactionList};
use crate::state::{refuse, Outcome, Refusal, StateFilter};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use utoipa::ToSchema;
use crate::refusal::RefusalCode;

const MAX_BODY: usize = 64 * 1024;

/// Every route the daemon serves and the role it needs (crate::api::auth): the router matches
/// these (`{x}` is one path segment) and a unit test checks that the OpenAPI document lists
/// exactly these.
pub const ROUTES: &[(&str, &str, Role)] = &[
    ("GET", "/healthz", Role::Public),
    ("GET", "/openapi.json", Role::Public),
    ("GET", "/metrics", Role::Metrics),
    ("POST", "/v1/transactions", Role::Client),
    ("GET", "/v1/transactions", Role::Operator),
    ("GET", "/v1/transactions/{gtid}", Role::Read),
    ("POST", "/v1/transactions/{gtid}/branches", Role::Client),
    ("POST", "/v1/transactions/{gtid}/branches/{bid}/prepared", Role::Client),
    ("POST", "/v1/transactions/{gtid}/branches/{bid}/failed", Role::Client),
    ("POST", "/v1/transactions/{gtid}/branches/{bid}/finished", Role::Client),
    ("POST", "/v1/transactions/{gtid}/commit", Role::Client),
    ("POST", "/v1/transactions/{gtid}/finished", Role::Client),
    ("POST", "/v1/transactions/{gtid}/abort", Role::Client),
    ("GET", "/v1/transactions/{gtid}/decision", Role::Read),
    ("GET", "/v1/in-doubt", Role::Operator),
    ("GET", "/v1/incidents", Role::Operator),
    ("GET", "/v1/audit", Role::Operator),
    ("POST", "/v1/admin/force", Role::Operator),
    ("GET", "/v1/nodes", Role::Operator),
    ("GET", "/v1/resources", Role::Operator),
    // The web console's files hold no data (crate::api::console): its script calls the routes
    // above with the credential the user pastes.
    ("GET", "/console", Role::Public),
    ("GET", "/console/app.js", Role::Public),
    ("GET", "/console/app.css", Role::Public),
];

/// The outcome a client names in a request.
#[derive(Deserialize, Serialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeArg {
    Commit,
    Abort,
}

impl From<OutcomeArg> for Outcome {
    fn from(o: OutcomeArg) -> Outcome {
        match o {
            OutcomeArg::Commit => Outcome::Commit,
            OutcomeArg::Abort => Outcome::Abort,
        }
    }
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginRequest {
    #[schema(minimum = 10, maximum = 86400000)]
    timeout_ms: Option<u64>,
    /// Register the first branch in the same request (saves the root a round trip).
    branch: Option<RegisterRequest>,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    resource: String,
    #[schema(value_type = Id)]
    branch_id: String,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedRequest {
    #[schema(max_length = 1000)]
    reason: Option<String>,
    retryable: Option<bool>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishedRequest {
    outcome: OutcomeArg,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    /// Commit this single branch in one phase (excludes `prepared`).
    #[schema(value_type = Option<Id>)]
    one_phase_branch: Option<String>,
    /// Branches reported prepared with this request.
    #[schema(value_type = Option<Vec<Id>>, max_items = 1000)]
    prepared: Option<Vec<String>>,
    /// The branch whose one-phase commit carries the global decision (`co.decide`; excludes
    /// `one_phase_branch`): every other branch prepared, nothing written to the store.
    #[schema(value_type = Option<Id>)]
    decide_in: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishedManyRequest {
    outcome: OutcomeArg,
    #[schema(value_type = Vec<Id>, min_items = 1, max_items = 1000)]
    branches: Vec<String>,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbortRequest {
    #[schema(max_length = 1000)]
    reason: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceRequest {
    gtid: String,
    outcome: OutcomeArg,
    #[schema(max_length = 200)]
    operator: String,
    #[schema(max_length = 1000)]
    reason: String,
    confirm: bool,
}

/// The body of every refusal.
#[derive(Serialize, ToSchema)]
pub struct Error {
    error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable (docs/coordinator.md, "Error codes").
    code: RefusalCode,
    message: String,
    /// wrong_node: the daemon that owns the gtid.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner_url: Option<String>,
}

fn parse<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, Refusal> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    parse_required(body)
}

fn parse_required<T: DeserializeOwned>(body: &Bytes) -> Result<T, Refusal> {
    let v: Value = serde_json::from_slice(body).map_err(|e| Refusal::new(RefusalCode::InvalidJson, format!("body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return refuse(RefusalCode::InvalidBody, "body must be a JSON object");
    }
    serde_json::from_value(v).map_err(|e| Refusal::new(RefusalCode::InvalidField, format!("{e}")))
}

fn text_field(what: &str, s: &str, max: usize) -> Result<(), Refusal> {
    if s.len() > max {
        return refuse(RefusalCode::InvalidField, format!("{what} is longer than {max} bytes"));
    }
    Ok(())
}

pub(crate) fn query(req_query: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, Refusal> {
    let mut out = vec![];
    for kv in req_query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if !allowed.contains(&k) {
            return refuse(RefusalCode::InvalidField, format!("unknown query parameter {k:?}"));
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

fn error_reply(r: &Refusal) -> Response<Full<Bytes>> {
    let body = Error { error: ErrorDetail { code: r.code, message: r.message.clone(), owner_url: r.owner_url.clone() } };
    let status = r.code.http_status();
    let mut resp = reply(status, &json!(body));
    if status == 429 || status == 503 {
        resp.headers_mut().insert("retry-after", hyper::header::HeaderValue::from_static("1"));
    }
    resp
}

fn bearer(req: &Request<Incoming>) -> Option<&str> {
    req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "))
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
    // With a trace context, the request runs in a span that carries its trace id: any line
    // logged while serving it (a store retry, a completion) can be found from the trace.
    let span = trace.as_deref().map(|t| tracing::info_span!("request", trace_id = %&t[3..35]));
    let start = (trace.is_some() && crate::telemetry::otlp::enabled()).then(std::time::SystemTime::now);
    let r = match &span {
        None => route(&c, req).await,
        Some(sp) => tracing::Instrument::instrument(route(&c, req), sp.clone()).await,
    };
    let (status, resp) = match r {
        Ok((status, resp)) => (status, resp.unwrap_or_else(|v| reply(status, &v))),
        Err(e) => {
            if e.code.http_status() < 500 {
                c.metrics.refused_requests.fetch_add(1, Relaxed);
            }
            (e.code.http_status(), error_reply(&e))
        }
    };
    if let Some(t) = trace {
        let gtid = path.strip_prefix("/v1/transactions/").and_then(|r| r.split('/').next());
        tracing::info!(method = %method, path = %path, status, gtid, traceparent = %t, trace_id = %&t[3..35], parent_span_id = %&t[36..52], "request");
        if let Some(start) = start {
            // Span names have few values: the route's template, not the path.
            let name = match find_route(&method, &path) {
                Ok((m, tpl, _, _)) => format!("{m} {tpl}"),
                Err(_) => method.clone(),
            };
            crate::telemetry::otlp::record(crate::telemetry::otlp::Span { trace_id: t[3..35].into(), parent_span_id: t[36..52].into(), name, gtid: gtid.map(str::to_string),
                method, path: path.clone(), status, start, end: std::time::SystemTime::now() });
        }
    }
    Ok(resp)
}

pub(crate) type Routed = Result<(u16, Result<Response<Full<Bytes>>, Value>), Refusal>;

fn ok(v: Value) -> Routed {
    Ok((200, Err(v)))
}

fn created(v: Value) -> Routed {
    Ok((201, Err(v)))
}

/// The route of `path`: its template in ROUTES and the values of its `{x}` segments.
/// Err(true): the path is known but not with this method.
fn find_route<'a>(method: &str, path: &'a str) -> Result<(&'static str, &'static str, Role, Vec<&'a str>), bool> {
    // No allocation but the parameters': this runs for every request.
    let path = path.trim_matches('/');
    let n = path.split('/').count();
    let mut path_known = false;
    for (m, tpl, role) in ROUTES {
        let t = tpl.trim_matches('/');
        if t.split('/').count() != n || !t.split('/').zip(path.split('/')).all(|(t, s)| t.starts_with('{') || t == s) {
            continue;
        }
        if *m != method {
            path_known = true;
            continue;
        }
        let params = t.split('/').zip(path.split('/')).filter(|(t, _)| t.starts_with('{')).map(|(_, s)| s).collect();
        return Ok((m, tpl, *role, params));
    }
    Err(path_known)
}

/// What a handler gets: the path parameters, the query string and the body.
pub(crate) struct Call<'a> {
    pub(crate) p: Vec<&'a str>,
    pub(crate) q: Option<&'a str>,
    pub(crate) body: Bytes,
}

async fn route(c: &Arc<Coordinator>, req: Request<Incoming>) -> Routed {
    let path = req.uri().path().to_string();
    let q = req.uri().query().map(|s| s.to_string());
    let found = find_route(req.method().as_str(), &path);
    // Unauthenticated: liveness and the API description; everything else needs a known
    // credential before anything about it is said (not even whether the route exists),
    // then the role the route needs.
    let need = match &found {
        Ok((_, _, role, _)) => *role,
        Err(_) => Role::Read, // an unknown route: only a known credential hears so
    };
    match auth::check(&c.cfg, bearer(&req), need) {
        Access::Granted => {}
        Access::Unauthorized => return refuse(RefusalCode::Unauthorized, "missing or wrong bearer token"),
        Access::Forbidden(name) => {
            return refuse(RefusalCode::Forbidden, format!("the credential {name} may not call {} {path}: it needs the {need:?} role", req.method()))
        }
    }
    let public = need == Role::Public;
    let (m, tpl, _, p) = match found {
        Ok(f) => f,
        Err(false) => return refuse(RefusalCode::NotFound, format!("no route {path}")),
        Err(true) => return refuse(RefusalCode::MethodNotAllowed, format!("method not allowed on {path}")),
    };
    let body = if public {
        Bytes::new()
    } else {
        match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return refuse(RefusalCode::PayloadTooLarge, format!("body larger than {MAX_BODY} bytes")),
        }
    };
    let call = Call { p, q: q.as_deref(), body };
    // One arm per entry of ROUTES (a unit test checks that none is missing).
    match (m, tpl) {
        ("GET", "/healthz") => healthz(c, call),
        ("GET", "/openapi.json") => openapi(call),
        ("GET", "/metrics") => metrics(c, call),
        ("POST", "/v1/transactions") => begin(c, call).await,
        ("GET", "/v1/transactions") => list(c, call),
        ("GET", "/v1/transactions/{gtid}") => get(c, call).await,
        ("POST", "/v1/transactions/{gtid}/branches") => register(c, call).await,
        ("POST", "/v1/transactions/{gtid}/branches/{bid}/prepared") => prepared(c, call).await,
        ("POST", "/v1/transactions/{gtid}/branches/{bid}/failed") => failed(c, call).await,
        ("POST", "/v1/transactions/{gtid}/branches/{bid}/finished") => finished(c, call).await,
        ("POST", "/v1/transactions/{gtid}/commit") => commit(c, call).await,
        ("POST", "/v1/transactions/{gtid}/finished") => finished_many(c, call).await,
        ("POST", "/v1/transactions/{gtid}/abort") => abort(c, call).await,
        ("GET", "/v1/transactions/{gtid}/decision") => decision(c, call).await,
        ("GET", "/v1/in-doubt") => in_doubt(c, call).await,
        ("GET", "/v1/incidents") => incidents(c, call),
        ("GET", "/v1/audit") => audit(c, call).await,
        ("POST", "/v1/admin/force") => force(c, call).await,
        ("GET", "/v1/nodes") => nodes(c, call).await,
        ("GET", "/v1/resources") => resources(c, call),
        ("GET", "/console") => crate::api::console::page(call),
        ("GET", "/console/app.js") => crate::api::console::script(call),
        ("GET", "/console/app.css") => crate::api::console::style(call),
        _ => refuse(RefusalCode::MethodNotAllowed, format!("method not allowed on {path}")),
    }
}

// The handlers. Their `utoipa::path` attributes are the OpenAPI operations: request and
// response bodies are the types above and in openapi.rs; 421: another daemon owns the
// gtid (`error.owner_url`); 503 on gtid routes: its owner is unavailable, or its record is
// quarantined.

#[utoipa::path(get, path = "/healthz", security(()), summary = "liveness",
    responses((status = 200, body = Health), (status = 400, body = Error)))]
pub(crate) fn healthz(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let up = c.resource_up.lock().unwrap().clone();
    ok(json!({"status": "ok", "node_id": c.cfg.node_id, "resources": up}))
}

#[utoipa::path(get, path = "/openapi.json", security(()), summary = "this API description (OpenAPI)",
    responses((status = 200, body = Object), (status = 400, body = Error)))]
pub(crate) fn openapi(r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    ok(crate::api::openapi::document())
}

#[utoipa::path(get, path = "/metrics", summary = "Prometheus metrics",
    responses((status = 200, description = "text exposition format", body = String, content_type = "text/plain"),
              (status = 400, body = Error), (status = 401, body = Error)))]
pub(crate) fn metrics(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let g = c.gauges();
    let up: Vec<(String, bool)> = c.resource_up.lock().unwrap().iter().map(|(k, v)| (k.clone(), *v)).collect();
    let mut text = c.metrics.render(&g, c.store.stats.batches.load(Relaxed), c.store.stats.ops.load(Relaxed), &up);
    let modes: Vec<(String, serde_json::Value)> = c.cfg.resources.iter().map(|r| (r.name.clone(), c.enforcement.report(&r.name))).collect();
    text.push_str(&crate::telemetry::metrics::render_enforcement(&modes, c.enforcement.held_count()));
    Ok((200, Ok(Response::builder().header("content-type", "text/plain; version=0.0.4").body(Full::new(Bytes::from(text))).unwrap())))
}

#[utoipa::path(post, path = "/v1/transactions", summary = "begin a global transaction (optionally registering its first branch)",
    request_body(content = Option<BeginRequest>),
    responses((status = 201, body = Begun), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 413, body = Error), (status = 429, body = Error), (status = 503, body = Error)))]
pub(crate) async fn begin(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: BeginRequest = parse(&r.body)?;
    match b.branch {
        None => created(c.begin(b.timeout_ms)?),
        Some(br) => created(c.begin_with_branch(b.timeout_ms, &br.resource, &br.branch_id).await?),
    }
}

#[utoipa::path(get, path = "/v1/transactions", summary = "list transactions",
    params(("state" = Option<StateFilter>, Query)),
    responses((status = 200, body = TransactionList), (status = 400, body = Error), (status = 401, body = Error)))]
pub(crate) fn list(c: &Coordinator, r: Call<'_>) -> Routed {
    let qs = query(r.q, &["state"])?;
    let st = qs.iter().find(|(k, _)| k == "state").map(|(_, v)| v.as_str());
    ok(c.list(st)?)
}

#[utoipa::path(get, path = "/v1/transactions/{gtid}", summary = "get a transaction", params(("gtid" = Id, Path)),
    responses((status = 200, body = Transaction), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn get(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    ok(c.get(r.p[0]).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches", summary = "register a branch", params(("gtid" = Id, Path)),
    request_body = RegisterRequest,
    responses((status = 201, body = Registered), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 413, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn register(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: RegisterRequest = parse_required(&r.body)?;
    created(c.register(r.p[0], &b.resource, &b.branch_id).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches/{bid}/prepared", summary = "report a branch prepared",
    params(("gtid" = Id, Path), ("bid" = Id, Path)), request_body(content = Option<Empty>),
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn prepared(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let _: Empty = parse(&r.body)?;
    ok(c.prepared(r.p[0], r.p[1]).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches/{bid}/failed", summary = "report a failed (refused) prepare; aborts the transaction",
    params(("gtid" = Id, Path), ("bid" = Id, Path)), request_body(content = Option<FailedRequest>),
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn failed(c: &Arc<Coordinator>, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: FailedRequest = parse(&r.body)?;
    let reason = b.reason.unwrap_or_else(|| "prepare failed".into());
    text_field("reason", &reason, 1000)?;
    ok(c.failed(r.p[0], r.p[1], &reason, b.retryable.unwrap_or(false)).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches/{bid}/finished", summary = "acknowledge a finished branch",
    params(("gtid" = Id, Path), ("bid" = Id, Path)), request_body = FinishedRequest,
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn finished(c: &Arc<Coordinator>, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: FinishedRequest = parse_required(&r.body)?;
    ok(c.finished(r.p[0], r.p[1], b.outcome.into()).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/commit",
    summary = "decide commit (durable before the answer); or one-phase commit of a single branch; or hand the decision to a participant (decide_in)",
    params(("gtid" = Id, Path)), request_body(content = Option<CommitRequest>),
    responses((status = 200, body = Decision), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn commit(c: &Arc<Coordinator>, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: CommitRequest = parse(&r.body)?;
    match (b.one_phase_branch, b.prepared) {
        (Some(_), _) if b.decide_in.is_some() => refuse(RefusalCode::InvalidField, "one_phase_branch and decide_in exclude each other"),
        (None, p) if b.decide_in.is_some() => {
            let p = p.unwrap_or_default();
            if p.len() > 1000 {
                return refuse(RefusalCode::InvalidField, "prepared lists at most 1000 branch ids");
            }
            ok(c.commit_decide_in(r.p[0], &p, b.decide_in.as_deref().unwrap_or_default()).await?)
        }
        (Some(_), Some(_)) => refuse(RefusalCode::InvalidField, "one_phase_branch and prepared exclude each other"),
        (Some(bid), None) => ok(c.one_phase(r.p[0], &bid).await?),
        (None, p) => {
            let p = p.unwrap_or_default();
            if p.len() > 1000 {
                return refuse(RefusalCode::InvalidField, "prepared lists at most 1000 branch ids");
            }
            ok(c.commit_with(r.p[0], "coordinator", &p).await?)
        }
    }
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/finished", summary = "acknowledge several finished branches at once (all or nothing)",
    params(("gtid" = Id, Path)), request_body = FinishedManyRequest,
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn finished_many(c: &Arc<Coordinator>, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: FinishedManyRequest = parse_required(&r.body)?;
    ok(c.finished_many(r.p[0], &b.branches, b.outcome.into()).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/abort", summary = "decide abort",
    params(("gtid" = Id, Path)), request_body(content = Option<AbortRequest>),
    responses((status = 200, body = Decision), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn abort(c: &Arc<Coordinator>, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: AbortRequest = parse(&r.body)?;
    let reason = b.reason.unwrap_or_else(|| "aborted by client".into());
    text_field("reason", &reason, 1000)?;
    ok(c.abort(r.p[0], &reason).await?)
}

#[utoipa::path(get, path = "/v1/transactions/{gtid}/decision", summary = "the decision, waiting up to wait_ms for it (long poll)",
    params(("gtid" = Id, Path), ("wait_ms" = Option<u64>, Query, minimum = 0, maximum = 600000)),
    responses((status = 200, body = DecisionState), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn decision(c: &Coordinator, r: Call<'_>) -> Routed {
    let qs = query(r.q, &["wait_ms"])?;
    let wait = match qs.iter().find(|(k, _)| k == "wait_ms") {
        None => 0,
        Some((_, v)) => v.parse::<u64>().map_err(|_| Refusal::new(RefusalCode::InvalidField, "wait_ms must be a non-negative integer"))?,
    };
    ok(c.wait_decision(r.p[0], wait).await?)
}

#[utoipa::path(get, path = "/v1/in-doubt", summary = "in-doubt transactions, oldest first, with locks held and waiters per prepared branch",
    responses((status = 200, body = TransactionList), (status = 400, body = Error), (status = 401, body = Error)))]
pub(crate) async fn in_doubt(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    ok(c.in_doubt_report().await?)
}

#[utoipa::path(get, path = "/v1/incidents", summary = "branches that did not reach the decided outcome",
    responses((status = 200, body = Incidents), (status = 400, body = Error), (status = 401, body = Error)))]
pub(crate) fn incidents(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let v = c.incidents.lock().unwrap().clone();
    ok(json!({"incidents": v}))
}

#[utoipa::path(get, path = "/v1/audit", summary = "operator audit log",
    responses((status = 200, body = Audit), (status = 400, body = Error), (status = 401, body = Error), (status = 503, body = Error)))]
pub(crate) async fn audit(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let v = c.store.audit_log().await.map_err(|e| Refusal::new(RefusalCode::StoreUnavailable, e))?;
    ok(json!({"audit": v}))
}

#[utoipa::path(post, path = "/v1/admin/force", summary = "operator: force an outcome (never contradicts a recorded decision)",
    request_body = ForceRequest,
    responses((status = 200, body = Decision), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub(crate) async fn force(c: &Arc<Coordinator>, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    let b: ForceRequest = parse_required(&r.body)?;
    if !b.confirm {
        return refuse(RefusalCode::ConfirmationRequired, "forcing an outcome requires \"confirm\": true");
    }
    text_field("operator", &b.operator, 200)?;
    text_field("reason", &b.reason, 1000)?;
    if b.operator.trim().is_empty() || b.reason.trim().is_empty() {
        return refuse(RefusalCode::InvalidField, "operator and reason must not be empty");
    }
    ok(c.force(&b.gtid, b.outcome.into(), &b.operator, &b.reason).await?)
}

#[utoipa::path(get, path = "/v1/nodes", summary = "node leases in the store (every daemon of the deployment) and the nodes this daemon acts for",
    responses((status = 200, body = Nodes), (status = 400, body = Error), (status = 401, body = Error), (status = 503, body = Error)))]
pub(crate) async fn nodes(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    ok(c.nodes_report().await?)
}

#[utoipa::path(get, path = "/v1/resources", summary = "the configured resources: kind, reachable at the last contact, prepared branches held in memory",
    responses((status = 200, body = Resources), (status = 400, body = Error), (status = 401, body = Error)))]
pub(crate) fn resources(c: &Coordinator, r: Call<'_>) -> Routed {
    query(r.q, &[])?;
    ok(c.resources_report())
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

    #[test]
    fn routes_are_matched_by_template() {
        use super::find_route;
        assert_eq!(find_route("POST", "/v1/transactions/n.1/branches/b1/prepared"),
            Ok(("POST", "/v1/transactions/{gtid}/branches/{bid}/prepared", crate::api::auth::Role::Client, vec!["n.1", "b1"])));
        assert_eq!(find_route("GET", "/v1/transactions"), Ok(("GET", "/v1/transactions", crate::api::auth::Role::Operator, vec![])));
        assert_eq!(find_route("POST", "/v1/transactions"), Ok(("POST", "/v1/transactions", crate::api::auth::Role::Client, vec![])));
        assert_eq!(find_route("DELETE", "/v1/transactions/n.1"), Err(true), "known path, other method");
        assert_eq!(find_route("GET", "/v1/transactions/n.1/nope"), Err(false));
        assert_eq!(find_route("GET", "/"), Err(false));
    }
}

//! What goes over the wire besides the response bodies (crate::wire): the request bodies
//! and query strings the handlers parse (the very types the OpenAPI document shows), the
//! error body every refusal is written from, and the replies.

use crate::refusal::{refuse, Refusal, RefusalCode};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

/// What a handler gets: the values of the route's `{x}` segments (in template order), the
/// query string and the body (empty for public routes: they take none).
pub struct Call {
    pub p: Vec<String>,
    pub q: Option<String>,
    pub body: Bytes,
}

/// A handler's answer: a status and either a ready response (text, HTML) or a JSON value.
pub type Routed = Result<(u16, Result<Response<Full<Bytes>>, Value>), Refusal>;

/// 200 with a response body (crate::wire's types, or a JSON value).
pub fn ok<T: Serialize>(body: T) -> Routed {
    Ok((200, Err(crate::wire::to_json(&body))))
}

pub fn created<T: Serialize>(body: T) -> Routed {
    Ok((201, Err(crate::wire::to_json(&body))))
}

/// A gtid or branch id, in paths and bodies (the responses' type too: crate::wire).
pub use crate::wire::Id;

/// The outcome a client names in a request: the answers' type too (crate::wire).
pub use crate::wire::OutcomeArg;

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginRequest {
    #[schema(minimum = 10, maximum = 86400000)]
    pub timeout_ms: Option<u64>,
    /// Register the first branch in the same request (saves the root a round trip).
    pub branch: Option<RegisterRequest>,
    /// Register every branch in the same request, in order (excludes `branch`): a caller
    /// that knows its branches up front saves a round trip per branch. All or nothing: a
    /// refused first branch leaves no transaction, a later one aborts it.
    #[schema(max_items = 1000)]
    pub branches: Option<Vec<RegisterRequest>>,
    /// Acknowledgements of earlier transactions' finished branches, carried here instead of
    /// a request of their own (as `POST /v1/transactions/{gtid}/finished` each). Only an
    /// acknowledgement: one that no longer applies (forgotten, another daemon's) is skipped,
    /// and the daemon completes any branch never acknowledged after `owner_grace_ms`.
    #[schema(max_items = 1000)]
    pub finished: Option<Vec<FinishedAck>>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishedAck {
    #[schema(value_type = Id)]
    pub gtid: String,
    pub outcome: OutcomeArg,
    #[schema(value_type = Vec<Id>, min_items = 1, max_items = 1000)]
    pub branches: Vec<String>,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub resource: String,
    #[schema(value_type = Id)]
    pub branch_id: String,
    /// The branch's database session (PostgreSQL backend pid, MariaDB connection id): how
    /// the daemon maps a lock wait to this transaction to break a deadlock across
    /// databases, and whose waiting statement it cancels when it aborts the transaction.
    pub session: Option<i64>,
    /// MariaDB client mode: the server's start (unix seconds, `UNIX_TIMESTAMP()` minus the
    /// `Uptime` status) as the client read it on this branch's connection when it first
    /// used that connection for a branch. When it shows the run the restart gate knows,
    /// the daemon does not look at the server for this registration (a restart since the
    /// reading broke the connection); absent, or another start: it looks, as it always
    /// did. Ignored elsewhere.
    pub server_started: Option<i64>,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedRequest {
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
    pub retryable: Option<bool>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishedRequest {
    pub outcome: OutcomeArg,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    /// Commit this single branch in one phase (excludes `prepared`).
    #[schema(value_type = Option<Id>)]
    pub one_phase_branch: Option<String>,
    /// Branches reported prepared with this request.
    #[schema(value_type = Option<Vec<Id>>, max_items = 1000)]
    pub prepared: Option<Vec<String>>,
    /// Branches that wrote nothing (the client checked before PREPARE). When it lists
    /// every branch of the transaction, the commit is decided in memory with no store
    /// sync (presumed abort loses nothing: docs/coordinator.md, "All-read-only
    /// transactions"). Two-phase commit only (excludes `one_phase_branch`, `decide_in`).
    #[schema(value_type = Option<Vec<Id>>, max_items = 1000)]
    pub read_only: Option<Vec<String>>,
    /// The branch whose one-phase commit carries the global decision (`co.decide`; excludes
    /// `one_phase_branch`): every other branch prepared, nothing written to the store.
    #[schema(value_type = Option<Id>)]
    pub decide_in: Option<String>,
    /// The one-request commit: the gtid is of a range leased with `POST /v1/gtid-leases`
    /// (never begun), and these are all its branches, every one prepared but the one named
    /// by `decide_in`, if any (excludes `one_phase_branch`, `prepared`). Engine mode and plain 2PC only:
    /// client mode's helper and slot come with a registration before the branch works.
    #[schema(max_items = 1000)]
    pub branches: Option<Vec<RegisterRequest>>,
    /// Acknowledgements of earlier transactions' finished branches, as in the begin's
    /// `finished` (the one-request commit has no begin to carry them).
    #[schema(max_items = 1000)]
    pub finished: Option<Vec<FinishedAck>>,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GtidLeaseRequest {
    /// How many gtids (default 1000).
    #[schema(minimum = 1, maximum = 100000)]
    pub count: Option<u64>,
    /// How long the range may be used (default `timeouts.transaction_ms`; at most
    /// `limits.max_transaction_ms`).
    #[schema(minimum = 10, maximum = 86400000)]
    pub ttl_ms: Option<u64>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FinishedManyRequest {
    pub outcome: OutcomeArg,
    #[schema(value_type = Vec<Id>, min_items = 1, max_items = 1000)]
    pub branches: Vec<String>,
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AbortRequest {
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceRequest {
    pub gtid: String,
    pub outcome: OutcomeArg,
    #[schema(max_length = 200)]
    pub operator: String,
    #[schema(max_length = 1000)]
    pub reason: String,
    pub confirm: bool,
}

/// The query string of the routes that take none: any parameter is refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// `GET /v1/transactions`. The state stays text here: the coordinator checks it and names
/// the accepted values in its refusal.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    #[param(value_type = Option<crate::state::StateFilter>)]
    pub state: Option<String>,
}

/// `GET /v1/transactions/{gtid}/decision`.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DecisionQuery {
    /// How long to wait for the decision (long poll).
    #[param(minimum = 0, maximum = 600000)]
    #[serde(default, deserialize_with = "wait_ms")]
    pub wait_ms: Option<u64>,
}

// serde_urlencoded's own error for a bad number does not name the parameter.
fn wait_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(|_| serde::de::Error::custom("wait_ms must be a non-negative integer"))
}

/// The query string as `T`: unknown parameters are refused (`deny_unknown_fields`), so a
/// misspelt one is never silently ignored.
pub fn query<T: DeserializeOwned>(q: Option<&str>) -> Result<T, Refusal> {
    serde_urlencoded::from_str(q.unwrap_or(""))
        .map_err(|e| Refusal::new(RefusalCode::InvalidField, format!("query string: {e}")))
}

/// The body of every refusal.
#[derive(Serialize, ToSchema)]
pub struct Error {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable (docs/coordinator.md, "Error codes").
    pub code: RefusalCode,
    pub message: String,
    /// wrong_node: the daemon that owns the gtid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_url: Option<String>,
}

/// A body that may be empty (then `T::default()`).
pub fn parse<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, Refusal> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    parse_required(body)
}

pub fn parse_required<T: DeserializeOwned>(body: &Bytes) -> Result<T, Refusal> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| Refusal::new(RefusalCode::InvalidJson, format!("body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return refuse(RefusalCode::InvalidBody, "body must be a JSON object");
    }
    serde_json::from_value(v).map_err(|e| Refusal::new(RefusalCode::InvalidField, format!("{e}")))
}

pub fn text_field(what: &str, s: &str, max: usize) -> Result<(), Refusal> {
    if s.len() > max {
        return refuse(RefusalCode::InvalidField, format!("{what} is longer than {max} bytes"));
    }
    Ok(())
}

pub fn reply(status: u16, v: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

/// A refusal's body: `{"error": {"code", "message"[, "owner_url"]}}`.
pub fn error_body(r: &Refusal) -> Value {
    json!(Error { error: ErrorDetail { code: r.code, message: r.message.clone(), owner_url: r.owner_url.clone() } })
}

/// A refusal as its HTTP answer: the code's status, the error body, and Retry-After when
/// trying again later may work.
pub fn error_reply(r: &Refusal) -> Response<Full<Bytes>> {
    let status = r.code.http_status();
    let mut resp = reply(status, &error_body(r));
    if status == 429 || status == 503 {
        resp.headers_mut().insert("retry-after", hyper::header::HeaderValue::from_static("1"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Query strings: typed, unknown parameters refused, numbers checked with the
    /// parameter's name in the message.
    #[test]
    fn query_strings_are_typed() {
        let q: DecisionQuery = query(Some("wait_ms=250")).unwrap();
        assert_eq!(q.wait_ms, Some(250));
        assert_eq!(query::<DecisionQuery>(None).unwrap().wait_ms, None);
        let e = query::<DecisionQuery>(Some("wait_ms=-1")).err().unwrap();
        assert_eq!(e.code, RefusalCode::InvalidField);
        assert!(e.message.contains("wait_ms must be a non-negative integer"), "{}", e.message);
        let e = query::<NoQuery>(Some("x=1")).err().unwrap();
        assert!(e.code == RefusalCode::InvalidField && e.message.contains("`x`"), "{}", e.message);
        assert!(query::<NoQuery>(Some("")).is_ok());
        let l: ListQuery = query(Some("state=in_doubt")).unwrap();
        assert_eq!(l.state.as_deref(), Some("in_doubt"));
        assert!(query::<ListQuery>(Some("state=active&wait_ms=1")).is_err());
    }
}

//! Every route, declared once: an entry of ROUTES names the role it needs and its handler;
//! the handler's `utoipa::path` attribute (handlers.rs, console.rs, below) declares its
//! method and path template. From that one declaration come the matching (`find_route`),
//! the role check and the dispatch (`route`), the OpenAPI paths (`document`) and the span
//! names (server.rs).
//!
//! Why our own table on hyper and not axum (with utoipa-axum's router): the accept loop,
//! the connection limit answered with a 503 before reading, the TLS handshake under a
//! timeout, the header and idle timeouts, the one error shape for every refusal (axum's
//! extractor rejections answer in plain text) and the constant-time token check stay ours
//! either way; what axum would replace is this file's matching, about 30 lines, at the
//! cost of about ten more crates and a layer of boxed services per request.

use crate::api::auth::{self, Access, Role};
use crate::api::dto::{ok, query, Call, Error, NoQuery, Routed};
use crate::api::openapi::{self as doc, route_doc, RouteDoc};
use crate::api::{console, handlers as h};
use crate::coordinator::Coordinator;
use crate::refusal::{refuse, Refusal, RefusalCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::Request;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use utoipa::openapi::path::HttpMethod;

const MAX_BODY: usize = 64 * 1024;

/// A handler: a plain `async fn(Arc<Coordinator>, Call) -> Routed`, boxed so that one table
/// holds them all.
pub type Handler = fn(Arc<Coordinator>, Call) -> Pin<Box<dyn Future<Output = Routed> + Send>>;

pub struct Route {
    /// What the caller's credential must allow (crate::api::auth).
    pub role: Role,
    /// The handler's name, which is also its operationId in the document (a unit test
    /// checks that `doc` is the handler's own).
    pub name: &'static str,
    pub handler: Handler,
    /// The handler's `utoipa::path` attribute: method, path template, operation.
    pub doc: fn() -> RouteDoc,
}

/// `route!(Role, module::handler, __path_handler)`: the type utoipa generates for the
/// handler's attribute is named apart (macro_rules cannot paste identifiers).
macro_rules! route {
    ($role:ident, $m:ident :: $h:ident, $doc:ident) => {
        Route {
            role: Role::$role,
            name: stringify!($h),
            handler: |c, r| Box::pin($m::$h(c, r)),
            doc: route_doc::<$m::$doc>,
        }
    };
}

/// Every route the daemon serves.
pub const ROUTES: &[Route] = &[
    route!(Public, h::healthz, __path_healthz),
    route!(Public, h::readyz, __path_readyz),
    route!(Public, self::openapi, __path_openapi),
    route!(Metrics, h::metrics, __path_metrics),
    route!(Client, h::begin, __path_begin),
    route!(Client, h::lease_gtids, __path_lease_gtids),
    route!(Operator, h::list, __path_list),
    route!(Read, h::get, __path_get),
    route!(Client, h::register, __path_register),
    route!(Client, h::prepared, __path_prepared),
    route!(Client, h::failed, __path_failed),
    route!(Client, h::finished, __path_finished),
    route!(Client, h::commit, __path_commit),
    route!(Client, h::finished_many, __path_finished_many),
    route!(Client, h::abort, __path_abort),
    route!(Read, h::decision, __path_decision),
    route!(Operator, h::in_doubt, __path_in_doubt),
    route!(Operator, h::incidents, __path_incidents),
    route!(Operator, h::waits, __path_waits),
    route!(Operator, h::audit, __path_audit),
    route!(Operator, h::force, __path_force),
    route!(Operator, h::nodes, __path_nodes),
    route!(Operator, h::resources, __path_resources),
    // The web console's files hold no data (crate::api::console): its script calls the routes
    // above with the credential the user pastes.
    route!(Public, console::page, __path_page),
    route!(Public, console::script, __path_script),
    route!(Public, console::style, __path_style),
];

/// A route as the router matches it: its method and template, read once from its attribute.
pub struct Matched {
    pub method: &'static str,
    pub template: String,
    pub route: &'static Route,
}

fn method_name(m: &HttpMethod) -> &'static str {
    match m {
        HttpMethod::Get => "GET",
        HttpMethod::Post => "POST",
        HttpMethod::Put => "PUT",
        HttpMethod::Delete => "DELETE",
        HttpMethod::Options => "OPTIONS",
        HttpMethod::Head => "HEAD",
        HttpMethod::Patch => "PATCH",
        HttpMethod::Trace => "TRACE",
    }
}

/// ROUTES with their methods and templates (built at the first request).
pub fn table() -> &'static [Matched] {
    static TABLE: OnceLock<Vec<Matched>> = OnceLock::new();
    TABLE.get_or_init(|| {
        ROUTES
            .iter()
            .map(|route| {
                let d = (route.doc)();
                assert_eq!(d.methods.len(), 1, "{}: one method per route", route.name);
                Matched { method: method_name(&d.methods[0]), template: d.path, route }
            })
            .collect()
    })
}

/// The OpenAPI document of ROUTES, built once (it never changes while the daemon runs).
pub fn document() -> Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| doc::document(ROUTES.iter().map(|r| (r.doc)()))).clone()
}

#[utoipa::path(get, path = "/openapi.json", security(()), summary = "this API description (OpenAPI)",
    responses((status = 200, body = Object), (status = 400, body = Error)))]
pub async fn openapi(_c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(document())
}

/// The route of `path`: its entry and the values of its `{x}` segments.
/// Err(true): the path is known but not with this method.
pub fn find_route<'a>(method: &str, path: &'a str) -> Result<(&'static Matched, Vec<&'a str>), bool> {
    // No allocation but the parameters': this runs for every request.
    let path = path.trim_matches('/');
    let n = path.split('/').count();
    let mut path_known = false;
    for m in table() {
        let t = m.template.trim_matches('/');
        if t.split('/').count() != n || !t.split('/').zip(path.split('/')).all(|(t, s)| t.starts_with('{') || t == s) {
            continue;
        }
        if m.method != method {
            path_known = true;
            continue;
        }
        let params = t.split('/').zip(path.split('/')).filter(|(t, _)| t.starts_with('{')).map(|(_, s)| s).collect();
        return Ok((m, params));
    }
    Err(path_known)
}

fn bearer(req: &Request<Incoming>) -> Option<&str> {
    req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "))
}

/// The refusal of a request no route matches: an unknown path, or a known path asked with
/// another method (`find_route`'s `Err(true)`).
pub fn unmatched(known_path: bool, path: &str) -> Refusal {
    if known_path {
        Refusal::new(RefusalCode::MethodNotAllowed, format!("method not allowed on {path}"))
    } else {
        Refusal::new(RefusalCode::NotFound, format!("no route {path}"))
    }
}

/// Counts an answered request in `cotx_requests_total`, and a refusal below 500 in the
/// refused requests: the daemon's requests and in-process calls alike.
pub fn count(c: &Coordinator, r: &Routed) {
    count_answer(c, r.as_ref().err());
}

/// `count` of an answer that did not go through a handler (the typed in-process calls):
/// `refused` is its refusal, if it was refused.
pub fn count_answer(c: &Coordinator, refused: Option<&Refusal>) {
    c.metrics.requests.fetch_add(1, Relaxed);
    if refused.is_some_and(|e| e.code.http_status() < 500) {
        c.metrics.refused_requests.fetch_add(1, Relaxed);
    }
}

/// Match, check the credential against the route's role, read the body, call the handler.
pub async fn route(c: Arc<Coordinator>, req: Request<Incoming>) -> Routed {
    let path = req.uri().path().to_string();
    let q = req.uri().query().map(str::to_string);
    let found = find_route(req.method().as_str(), &path);
    // Unauthenticated: liveness and the API description; everything else needs a known
    // credential before anything about it is said (not even whether the route exists),
    // then the role the route needs.
    let need = match &found {
        Ok((m, _)) => m.route.role,
        Err(_) => Role::Read, // an unknown route: only a known credential hears so
    };
    match auth::check(&c.cfg, bearer(&req), need) {
        Access::Granted => {}
        Access::Unauthorized => return refuse(RefusalCode::Unauthorized, "missing or wrong bearer token"),
        Access::Forbidden(name) => {
            return refuse(
                RefusalCode::Forbidden,
                format!("the credential {name} may not call {} {path}: it needs the {need:?} role", req.method()),
            )
        }
    }
    let (m, p) = match found {
        Ok((m, p)) => (m, p.into_iter().map(str::to_string).collect()),
        Err(known_path) => return Err(unmatched(known_path, &path)),
    };
    let body = if need == Role::Public {
        Bytes::new()
    } else {
        match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return refuse(RefusalCode::PayloadTooLarge, format!("body larger than {MAX_BODY} bytes")),
        }
    };
    (m.route.handler)(c, Call { p, q, body }).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn routes_are_matched_by_template() {
        let found = |m, p| find_route(m, p).map(|(r, params)| (r.method, r.template.as_str(), r.route.role, params));
        assert_eq!(
            found("POST", "/v1/transactions/n.1/branches/b1/prepared"),
            Ok(("POST", "/v1/transactions/{gtid}/branches/{bid}/prepared", Role::Client, vec!["n.1", "b1"]))
        );
        assert_eq!(found("GET", "/v1/transactions"), Ok(("GET", "/v1/transactions", Role::Operator, vec![])));
        assert_eq!(found("POST", "/v1/transactions"), Ok(("POST", "/v1/transactions", Role::Client, vec![])));
        assert_eq!(found("GET", "/console/app.js").map(|f| f.2), Ok(Role::Public));
        assert_eq!(found("DELETE", "/v1/transactions/n.1"), Err(true), "known path, other method");
        assert_eq!(found("GET", "/v1/transactions/n.1/nope"), Err(false));
        assert_eq!(found("GET", "/"), Err(false));
    }

    /// Each entry's `doc` is its own handler's attribute (same name as operationId), no two
    /// entries share a method and path (one would shadow the other), and the document has
    /// exactly one operation per entry, at that method and path, with the template's
    /// `{x}` segments as its path parameters (the handler reads them by position).
    #[test]
    fn the_document_is_the_table() {
        let doc = document();
        let mut listed = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (m, op) in item.as_object().unwrap() {
                listed.insert((m.to_uppercase(), path.clone(), op["operationId"].as_str().unwrap().to_string()));
            }
        }
        let served: BTreeSet<_> =
            table().iter().map(|m| (m.method.to_string(), m.template.clone(), m.route.name.to_string())).collect();
        assert_eq!(served.len(), ROUTES.len(), "two routes with the same method and path");
        assert_eq!(listed, served);
        for m in table() {
            let op = &doc["paths"][&m.template][m.method.to_lowercase()];
            let documented: Vec<&str> = op["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "path")
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            let template: Vec<&str> =
                m.template.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')).collect();
            assert_eq!(documented, template, "{} {}", m.method, m.template);
        }
    }

    /// Only liveness, the document and the console's files are public; /metrics has its
    /// own role; the rest needs a client's or an operator's credential.
    #[test]
    fn roles_of_the_routes() {
        for m in table() {
            let public = ["/healthz", "/readyz", "/openapi.json"].contains(&m.template.as_str())
                || m.template.starts_with("/console");
            assert_eq!(m.route.role == Role::Public, public, "{} {}", m.method, m.template);
            assert_eq!(m.route.role == Role::Metrics, m.template == "/metrics", "{}", m.template);
        }
    }
}

//! The OpenAPI document served at /openapi.json, derived (utoipa) from the routes: each
//! route's handler's `utoipa::path` attribute (router.rs collects them from ROUTES), the
//! request and error types of dto.rs, and the response bodies of crate::wire (the very
//! types the coordinator answers with). The integration tests fuzz the daemon from it;
//! api/conformance.rs checks the shapes against real answers.

use crate::api::dto::Id;
use serde_json::Value;
use utoipa::openapi::path::{HttpMethod, Operation};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::{Modify, OpenApi};

// The response bodies are crate::wire's types: the handlers' `utoipa::path` attributes
// name them, and the coordinator builds its answers from them.

/// What the attributes leave implicit: the bearer scheme, and the meaning of each status.
struct Conventions;

impl Modify for Conventions {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post].into_iter().flatten() {
                for (status, r) in op.responses.responses.iter_mut() {
                    if let utoipa::openapi::RefOr::T(r) = r {
                        if r.description.is_empty() {
                            r.description = status_meaning(status).into();
                        }
                    }
                }
            }
        }
    }
}

fn status_meaning(status: &str) -> &'static str {
    match status {
        "200" | "201" => "success",
        "400" => "invalid request (JSON, field, id or query); nothing changed",
        "401" => "missing or wrong bearer token",
        "404" => "unknown route, transaction, branch or resource",
        "409" => "conflicts with the transaction's state; nothing changed",
        "413" => "body larger than 64 KiB",
        "421" => "another daemon owns this gtid: `error.owner_url`",
        "429" => "too many undecided transactions; Retry-After",
        "503" => "decision store or the gtid's owner unavailable, or its record quarantined; Retry-After",
        _ => "refused; nothing changed",
    }
}

/// The document's frame: everything but the paths, which come from the routes.
#[derive(OpenApi)]
#[openapi(
    info(title = "cotx coordinator",
         description = "Durable two-phase commit decisions across PostgreSQL and MariaDB. All endpoints but /healthz and /openapi.json need `Authorization: Bearer <token>`."),
    security(("bearer" = [])),
    components(schemas(Id, crate::state::StateFilter)),
)]
struct Doc;

/// What one handler's `utoipa::path` attribute declares: its method(s), path template,
/// OpenAPI operation, and the schemas the operation refers to.
pub struct RouteDoc {
    pub methods: Vec<HttpMethod>,
    pub path: String,
    pub operation: Operation,
    pub schemas: Vec<(String, RefOr<Schema>)>,
}

/// The declaration of the handler whose attribute generated `P` (`__path_<handler>`).
/// `SchemaReferences` is utoipa's hidden trait: it is what `#[derive(OpenApi)]`'s
/// `paths(...)` and utoipa-axum's `routes!` call to collect the operation's schemas.
pub fn route_doc<P: utoipa::Path + utoipa::__dev::SchemaReferences>() -> RouteDoc {
    let mut schemas = vec![];
    P::schemas(&mut schemas);
    RouteDoc { methods: P::methods(), path: P::path(), operation: P::operation(), schemas }
}

/// The document for these routes (router.rs builds it once from ROUTES).
pub fn document(routes: impl Iterator<Item = RouteDoc>) -> Value {
    let mut doc = Doc::openapi();
    let mut schemas = vec![];
    for r in routes {
        doc.paths.add_path_operation(&r.path, r.methods, r.operation);
        schemas.extend(r.schemas);
    }
    doc.components.get_or_insert_with(Default::default).schemas.extend(schemas);
    // After the paths are in: it describes their responses.
    Conventions.modify(&mut doc);
    serde_json::to_value(doc).expect("the OpenAPI document serializes")
}

#[cfg(test)]
mod tests {
    /// The error body's `code` lists every refusal code, by its wire name.
    #[test]
    fn document_lists_every_refusal_code() {
        let doc = crate::api::router::document();
        let listed = &doc["components"]["schemas"]["RefusalCode"]["enum"];
        let all: Vec<&str> = crate::refusal::RefusalCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(listed, &serde_json::json!(all));
        assert_eq!(
            doc["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["$ref"],
            "#/components/schemas/RefusalCode"
        );
    }

    /// Every `$ref` names a schema of the document (parameter types are not collected
    /// from the handlers by themselves: they are listed in `components`).
    #[test]
    fn every_reference_resolves() {
        fn walk(v: &serde_json::Value, doc: &serde_json::Value, n: &mut usize) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                        let name = r.strip_prefix("#/components/schemas/").expect(r);
                        assert!(doc["components"]["schemas"].get(name).is_some(), "{r} does not resolve");
                        *n += 1;
                    }
                    m.values().for_each(|x| walk(x, doc, n));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, doc, n)),
                _ => {}
            }
        }
        let doc = crate::api::router::document();
        let mut n = 0;
        walk(&doc, &doc, &mut n);
        assert!(n > 50, "only {n} references");
    }

    /// The document's title and version; the error body is one schema used by every refusal.
    #[test]
    fn document_has_the_error_schema_and_bearer_auth() {
        let doc = crate::api::router::document();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        let err = &doc["components"]["schemas"]["Error"];
        assert_eq!(err["required"], serde_json::json!(["error"]), "{err}");
        assert!(doc["paths"]["/healthz"]["get"]["security"].as_array().is_some());
        assert_eq!(
            doc["paths"]["/v1/transactions/{gtid}/commit"]["post"]["responses"]["409"]["description"],
            "conflicts with the transaction's state; nothing changed"
        );
        if let Ok(p) = std::env::var("COTX_WRITE_OPENAPI") {
            std::fs::write(p, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
        }
    }
}

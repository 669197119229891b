//! The OpenAPI 3.0 description served at /openapi.json. Hand-written next to the routes in
//! api.rs; the integration tests fuzz the daemon from it, so a drift shows up as failures.

use serde_json::{json, Value};

fn err_responses(codes: &[&str]) -> Value {
    let mut m = serde_json::Map::new();
    for c in codes {
        m.insert(c.to_string(), json!({"description": "refused; nothing changed", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}));
    }
    Value::Object(m)
}

fn op(summary: &str, params: Value, body: Option<(&str, bool)>, ok_code: &str, ok_schema: &str, errs: &[&str]) -> Value {
    let mut responses = err_responses(errs);
    responses.as_object_mut().unwrap().insert(
        ok_code.into(),
        json!({"description": "success", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{ok_schema}")}}}}),
    );
    let mut o = json!({"summary": summary, "parameters": params, "responses": responses});
    if let Some((schema, required)) = body {
        o.as_object_mut().unwrap().insert(
            "requestBody".into(),
            json!({"required": required, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}}),
        );
    }
    o
}

pub fn document() -> Value {
    let id = json!({"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$", "maxLength": 64});
    let gtid = json!({"name": "gtid", "in": "path", "required": true, "schema": id});
    let bid = json!({"name": "bid", "in": "path", "required": true, "schema": id});
    // 421: another daemon owns the gtid (`error.owner_url`); 503 on gtid routes: its owner
    // is unavailable, or its record is quarantined.
    let e4 = ["400", "401", "404", "409", "421"];
    json!({
        "openapi": "3.0.3",
        "info": {"title": "cotx coordinator", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Durable two-phase commit decisions across PostgreSQL and MariaDB. All endpoints but /healthz and /openapi.json need `Authorization: Bearer <token>`."},
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {"get": {"security": [], "summary": "liveness", "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}}, "400": {"description": "bad query", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}, "400": {"description": "bad query", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}, "401": {"description": "no token", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}}},
            "/v1/transactions": {
                "post": op("begin a global transaction (optionally registering its first branch)", json!([]), Some(("BeginRequest", false)), "201", "Begun", &["400", "401", "404", "413", "429", "503"]),
                "get": op("list transactions", json!([{"name": "state", "in": "query", "required": false,
                    "schema": {"type": "string", "enum": ["active", "committing", "committed", "aborted", "one_phase", "deciding", "in_doubt"]}}]), None, "200", "TransactionList", &["400", "401"])
            },
            "/v1/transactions/{gtid}": {"get": op("get a transaction", json!([gtid]), None, "200", "Transaction", &["400", "401", "404", "421", "503"])},
            "/v1/transactions/{gtid}/branches": {"post": op("register a branch", json!([gtid]), Some(("RegisterRequest", true)), "201", "Registered", &["400", "401", "404", "409", "413", "421"])},
            "/v1/transactions/{gtid}/branches/{bid}/prepared": {"post": op("report a branch prepared", json!([gtid, bid]), Some(("Empty", false)), "200", "Ack", &e4)},
            "/v1/transactions/{gtid}/branches/{bid}/failed": {"post": op("report a failed (refused) prepare; aborts the transaction", json!([gtid, bid]), Some(("FailedRequest", false)), "200", "Ack", &e4)},
            "/v1/transactions/{gtid}/branches/{bid}/finished": {"post": op("acknowledge a finished branch", json!([gtid, bid]), Some(("FinishedRequest", true)), "200", "Ack", &e4)},
            "/v1/transactions/{gtid}/commit": {"post": op("decide commit (durable before the answer); or one-phase commit of a single branch", json!([gtid]), Some(("CommitRequest", false)), "200", "Decision", &["400", "401", "404", "409", "421", "503"])},
            "/v1/transactions/{gtid}/finished": {"post": op("acknowledge several finished branches at once (all or nothing)", json!([gtid]), Some(("FinishedManyRequest", true)), "200", "Ack", &e4)},
            "/v1/transactions/{gtid}/abort": {"post": op("decide abort", json!([gtid]), Some(("AbortRequest", false)), "200", "Decision", &e4)},
            "/v1/transactions/{gtid}/decision": {"get": op("the decision, waiting up to wait_ms for it (long poll)", json!([gtid,
                {"name": "wait_ms", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0, "maximum": 600000}}]), None, "200", "DecisionState", &["400", "401", "404", "421", "503"])},
            "/v1/in-doubt": {"get": op("in-doubt transactions, oldest first, with locks held and waiters per prepared branch", json!([]), None, "200", "TransactionList", &["400", "401"])},
            "/v1/incidents": {"get": op("branches that did not reach the decided outcome", json!([]), None, "200", "Incidents", &["400", "401"])},
            "/v1/audit": {"get": op("operator audit log", json!([]), None, "200", "Audit", &["400", "401", "503"])},
            "/v1/admin/force": {"post": op("operator: force an outcome (never contradicts a recorded decision)", json!([]), Some(("ForceRequest", true)), "200", "Decision", &["400", "401", "404", "409", "421", "503"])}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
                "Empty": {"type": "object", "additionalProperties": false},
                "BeginRequest": {"type": "object", "additionalProperties": false, "properties": {"timeout_ms": {"type": "integer", "minimum": 10, "maximum": 86400000},
                    "branch": {"$ref": "#/components/schemas/RegisterRequest"}}},
                "Begun": {"type": "object", "required": ["gtid", "state", "timeout_ms"], "properties": {"gtid": {"type": "string"}, "state": {"type": "string"}, "timeout_ms": {"type": "integer"},
                    "branch": {"$ref": "#/components/schemas/Registered"}}},
                "RegisterRequest": {"type": "object", "additionalProperties": false, "required": ["resource", "branch_id"],
                    "properties": {"resource": {"type": "string"}, "branch_id": id}},
                "Registered": {"type": "object", "required": ["gtid", "branch_id", "resource", "kind"], "properties": {
                    "gtid": {"type": "string"}, "branch_id": {"type": "string"}, "resource": {"type": "string"},
                    "kind": {"type": "string", "enum": ["postgres", "mariadb"]},
                    "gid": {"type": "string", "description": "PostgreSQL: PREPARE TRANSACTION id"},
                    "xid": {"type": "object", "description": "MariaDB XID", "properties": {"format_id": {"type": "integer"}, "gtrid": {"type": "string"}, "bqual": {"type": "string"}}}}},
                "FailedRequest": {"type": "object", "additionalProperties": false, "properties": {"reason": {"type": "string", "maxLength": 1000}, "retryable": {"type": "boolean"}}},
                "FinishedRequest": {"type": "object", "additionalProperties": false, "required": ["outcome"], "properties": {"outcome": {"type": "string", "enum": ["commit", "abort"]}}},
                "CommitRequest": {"type": "object", "additionalProperties": false, "properties": {"one_phase_branch": id,
                    "prepared": {"type": "array", "maxItems": 1000, "items": id, "description": "branches reported prepared with this request"},
                    "decide_in": id}},
                "FinishedManyRequest": {"type": "object", "additionalProperties": false, "required": ["outcome", "branches"], "properties": {
                    "outcome": {"type": "string", "enum": ["commit", "abort"]}, "branches": {"type": "array", "minItems": 1, "maxItems": 1000, "items": id}}},
                "AbortRequest": {"type": "object", "additionalProperties": false, "properties": {"reason": {"type": "string", "maxLength": 1000}}},
                "ForceRequest": {"type": "object", "additionalProperties": false, "required": ["gtid", "outcome", "operator", "reason", "confirm"], "properties": {
                    "gtid": {"type": "string"}, "outcome": {"type": "string", "enum": ["commit", "abort"]}, "operator": {"type": "string", "maxLength": 200},
                    "reason": {"type": "string", "maxLength": 1000}, "confirm": {"type": "boolean"}}},
                "Ack": {"type": "object", "required": ["gtid"], "properties": {"gtid": {"type": "string"}}},
                "Decision": {"type": "object", "required": ["gtid", "decision"], "properties": {"gtid": {"type": "string"}, "decision": {"type": "string", "enum": ["commit", "abort", "one_phase", "in_participant"]}}},
                "DecisionState": {"type": "object", "required": ["gtid", "state"], "properties": {"gtid": {"type": "string"}, "state": {"type": "string"},
                    "decision": {"type": "string", "nullable": true, "enum": ["commit", "abort", null]}, "retryable": {"type": "boolean"}}},
                "Branch": {"type": "object", "required": ["branch_id", "resource", "kind", "state"], "properties": {
                    "branch_id": {"type": "string"}, "resource": {"type": "string"}, "kind": {"type": "string"},
                    "state": {"type": "string", "enum": ["registered", "prepared", "failed", "finished"]}}},
                "Transaction": {"type": "object", "required": ["gtid", "state", "branches", "in_doubt", "age_ms"], "properties": {
                    "gtid": {"type": "string"}, "state": {"type": "string", "enum": ["active", "committing", "committed", "aborted", "one_phase", "deciding"]},
                    "decision": {"type": "string", "nullable": true}, "in_doubt": {"type": "boolean"}, "age_ms": {"type": "integer"},
                    "branches": {"type": "array", "items": {"$ref": "#/components/schemas/Branch"}}}},
                "TransactionList": {"type": "object", "required": ["transactions"], "properties": {"transactions": {"type": "array", "items": {"$ref": "#/components/schemas/Transaction"}}}},
                "Incidents": {"type": "object", "required": ["incidents"], "properties": {"incidents": {"type": "array", "items": {"type": "object"}}}},
                "Audit": {"type": "object", "required": ["audit"], "properties": {"audit": {"type": "array", "items": {"type": "object"}}}}
            }
        }
    })
}

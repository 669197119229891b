//! The response shapes of the document checked against real answers. The bodies are the
//! types of crate::wire, so a field cannot be missing from the schema; this still catches
//! what the types alone do not (a field declared but never sent, a null where the schema
//! says absent): every route's handler is called
//! through the router's table on a coordinator over a temporary SQLite store whose
//! resources are never reached (`enforcement = "none"`), and each JSON answer is checked
//! against the schema the document gives for its status: no field outside the schema, no
//! required field missing, the same JSON types. Across all answers, every field of every
//! schema used must have been seen at least once (a field no answer carries any more
//! fails), but for the few listed in NOT_PRODUCED, with the reason.

use crate::api::dto::Call;
use crate::api::router::{document, find_route};
use crate::coordinator::Coordinator;
use crate::store::sqlite::SqliteLog;
use crate::store::Store;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Schema fields no answer here can carry: (schema, field, why).
const NOT_PRODUCED: &[(&str, &str, &str)] = &[
    ("Registered", "shim", "client mode only: needs a database with the client-mode objects"),
    ("ResourceEnforcement", "slots_in_use", "client mode only"),
    ("ResourceEnforcement", "restart_gate", "client mode on MariaDB only"),
    ("Transaction", "from_store", "a transaction read back from the store: forgotten from memory (retention) first"),
    ("Transaction", "node", "a transaction read back from the store"),
    ("DecisionState", "from_participant", "needs a decision resource (pg_co) that answers"),
    ("Decision", "from_store", "a commit whose earlier answer was lost"),
    ("Decision", "unfinished_branches", "force of an already decided transaction"),
    ("Decision", "branches", "force of a quarantined transaction"),
    ("Ack", "aborted_as", "a deadlock victim's branch failed: needs lock waits across two reachable databases"),
    (
        "Ack",
        "retryable",
        "a branch failed after its transaction timed out: needs a wait longer than a transaction's timeout",
    ),
    ("Blocking", "locks_held", "needs a reachable PostgreSQL resource"),
    ("Blocking", "sessions_waiting_on_prepared", "needs a reachable PostgreSQL resource"),
    ("Blocking", "lock_waits_on_resource", "needs a reachable MariaDB resource"),
    ("Quarantined", "gtid", "needs an unreadable decision record"),
    ("Quarantined", "problem", "needs an unreadable decision record"),
    (
        "Incident",
        "at_unix_ms",
        "no branch here fails to reach its outcome (the resources are never reached: completion only retries)",
    ),
    (
        "Incident",
        "gtid",
        "no branch here fails to reach its outcome (the resources are never reached: completion only retries)",
    ),
    (
        "Incident",
        "branch_id",
        "no branch here fails to reach its outcome (the resources are never reached: completion only retries)",
    ),
    (
        "Incident",
        "resource",
        "no branch here fails to reach its outcome (the resources are never reached: completion only retries)",
    ),
    (
        "Incident",
        "message",
        "no branch here fails to reach its outcome (the resources are never reached: completion only retries)",
    ),
];

async fn coordinator() -> Arc<Coordinator> {
    let d = std::env::temp_dir().join(format!("cotx-api-conformance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let db = d.join("s.db");
    let src = format!(
        "allow_no_auth = true\nnode_id = \"u1\"\n[store]\nkind = \"sqlite\"\npath = \"{}\"\n\
         [[resources]]\nname = \"pg\"\nkind = \"postgres\"\ndsn = \"host=127.0.0.1 port=1 user=x connect_timeout=1\"\nenforcement = \"none\"\n\
         [[resources]]\nname = \"my\"\nkind = \"mariadb\"\ndsn = \"mysql://x@127.0.0.1:1/test\"\nenforcement = \"none\"\n",
        db.display()
    );
    let cfg = crate::config::parse(&src, None).unwrap();
    let store = Store::start(Box::new(SqliteLog::open(db.to_str().unwrap()).unwrap()), 64);
    let c = Coordinator::new(cfg, store, None).unwrap();
    crate::ha::lease::claim_at_start(&c.parts().holding()).await.unwrap();
    c
}

struct Checker {
    doc: Value,
    /// (schema, field) of every field seen in an answer, and every field of every schema used.
    seen: BTreeSet<(String, String)>,
    fields: BTreeSet<(String, String)>,
    errors: Vec<String>,
}

impl Checker {
    /// Calls the route's handler as the router would and checks a JSON answer.
    async fn call(&mut self, c: &Arc<Coordinator>, method: &str, uri: &str, body: Value) -> Value {
        let (path, q) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q.to_string())));
        let (m, p) = find_route(method, path).unwrap_or_else(|_| panic!("no route {method} {path}"));
        let body = if body.is_null() { bytes::Bytes::new() } else { bytes::Bytes::from(body.to_string()) };
        let call = Call { p: p.into_iter().map(str::to_string).collect(), q, body };
        let (status, answer) =
            (m.route.handler)(c.clone(), call).await.unwrap_or_else(|e| panic!("{method} {uri}: {e:?}"));
        let Err(v) = answer else { return Value::Null }; // not JSON (text, HTML)
        let response = &self.doc["paths"][&m.template][method.to_lowercase()]["responses"][status.to_string()];
        let schema = response["content"]["application/json"]["schema"].clone();
        assert!(!schema.is_null(), "{method} {uri}: no schema for status {status}");
        self.check(&v, &schema, &format!("{method} {uri}"), "");
        v
    }

    fn check(&mut self, v: &Value, s: &Value, at: &str, name: &str) {
        if let Some(r) = s["$ref"].as_str() {
            let n = r.rsplit('/').next().unwrap().to_string();
            let s = self.doc["components"]["schemas"][&n].clone();
            return self.check(v, &s, at, &n);
        }
        if let Some(alts) = s["oneOf"].as_array().or(s["anyOf"].as_array()) {
            // The alternative that fits (a nullable field is "null or the schema").
            let fits = alts.iter().find(|a| {
                let mut probe =
                    Checker { doc: self.doc.clone(), seen: BTreeSet::new(), fields: BTreeSet::new(), errors: vec![] };
                probe.check(v, a, at, name);
                probe.errors.is_empty()
            });
            match fits {
                Some(a) => self.check(v, &a.clone(), at, name),
                None => self.errors.push(format!("{at}: {v} fits none of {s}")),
            }
            return;
        }
        if let Some(e) = s["enum"].as_array() {
            if !e.contains(v) {
                self.errors.push(format!("{at}: {v} is not one of {s}"));
            }
        }
        let types: Vec<&str> = match &s["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(a) => a.iter().filter_map(|t| t.as_str()).collect(),
            _ => vec![],
        };
        let fits = |t: &&str| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => false,
        };
        if !types.is_empty() && !types.iter().any(fits) {
            self.errors.push(format!("{at}: {name} {v} is not of type {types:?}"));
            return;
        }
        match v {
            Value::Object(o) => {
                if let Some(props) = s["properties"].as_object() {
                    for k in props.keys() {
                        self.fields.insert((name.to_string(), k.clone()));
                    }
                    for (k, x) in o {
                        match props.get(k) {
                            None => self.errors.push(format!("{at}: field {k} of {name} is not in the schema ({x})")),
                            Some(ps) => {
                                self.seen.insert((name.to_string(), k.clone()));
                                self.check(x, &ps.clone(), &format!("{at}.{k}"), &format!("{name}.{k}"));
                            }
                        }
                    }
                    for r in s["required"].as_array().into_iter().flatten() {
                        if !o.contains_key(r.as_str().unwrap()) {
                            self.errors.push(format!("{at}: {name} lacks the required field {r}"));
                        }
                    }
                } else if let Some(ap) = s["additionalProperties"].as_object() {
                    let ap = Value::Object(ap.clone());
                    for (k, x) in o {
                        self.check(x, &ap, &format!("{at}.{k}"), name);
                    }
                }
            }
            Value::Array(a) if s["items"].is_object() => {
                for (i, x) in a.iter().enumerate() {
                    self.check(x, &s["items"].clone(), &format!("{at}[{i}]"), name);
                }
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_fits_its_schema() {
    let c = coordinator().await;
    let mut k = Checker { doc: document(), seen: BTreeSet::new(), fields: BTreeSet::new(), errors: vec![] };
    let n = Value::Null;
    k.call(&c, "GET", "/healthz", n.clone()).await;
    k.call(&c, "GET", "/readyz", n.clone()).await;
    k.call(&c, "GET", "/openapi.json", n.clone()).await;
    // Two branches, one per kind of resource (a gid, an XA id), committed in two phases.
    let g = k.call(&c, "POST", "/v1/transactions", json!({"branch": {"resource": "pg", "branch_id": "b0"}})).await
        ["gtid"]
        .as_str()
        .unwrap()
        .to_string();
    k.call(&c, "POST", &format!("/v1/transactions/{g}/branches"), json!({"resource": "my", "branch_id": "b1"})).await;
    k.call(&c, "GET", "/v1/transactions", n.clone()).await;
    k.call(&c, "GET", &format!("/v1/transactions/{g}"), n.clone()).await;
    k.call(&c, "POST", &format!("/v1/transactions/{g}/branches/b0/prepared"), n.clone()).await;
    k.call(&c, "GET", &format!("/v1/transactions/{g}/decision"), n.clone()).await;
    k.call(&c, "POST", &format!("/v1/transactions/{g}/commit"), json!({"prepared": ["b1"]})).await;
    k.call(&c, "GET", &format!("/v1/transactions/{g}/decision?wait_ms=0"), n.clone()).await;
    // The daemon cannot reach the resources: the transaction stays in doubt.
    k.call(&c, "GET", "/v1/in-doubt", n.clone()).await;
    k.call(&c, "GET", &format!("/v1/transactions/{g}"), n.clone()).await;
    k.call(&c, "POST", &format!("/v1/transactions/{g}/branches/b0/finished"), json!({"outcome": "commit"})).await;
    k.call(&c, "POST", &format!("/v1/transactions/{g}/finished"), json!({"outcome": "commit", "branches": ["b1"]}))
        .await;
    k.call(&c, "GET", &format!("/v1/transactions/{g}"), n.clone()).await;
    // A refused prepare, an abort, a one-phase commit, a forced outcome.
    for (branch, end, body) in [
        (true, "branches/b1/failed", json!({"reason": "serialization failure", "retryable": true})),
        (false, "abort", json!({"reason": "changed my mind"})),
        (true, "commit", json!({"one_phase_branch": "b1"})),
    ] {
        let g = k.call(&c, "POST", "/v1/transactions", json!({"timeout_ms": 60000})).await["gtid"]
            .as_str()
            .unwrap()
            .to_string();
        if branch {
            k.call(&c, "POST", &format!("/v1/transactions/{g}/branches"), json!({"resource": "pg", "branch_id": "b1"}))
                .await;
        }
        k.call(&c, "POST", &format!("/v1/transactions/{g}/{end}"), body).await;
        k.call(&c, "GET", &format!("/v1/transactions/{g}"), n.clone()).await;
    }
    let g = k.call(&c, "POST", "/v1/transactions", n.clone()).await["gtid"].as_str().unwrap().to_string();
    k.call(&c, "POST", &format!("/v1/transactions/{g}/branches"), json!({"resource": "pg", "branch_id": "b1"})).await;
    k.call(&c, "POST", &format!("/v1/transactions/{g}/branches/b1/prepared"), n.clone()).await;
    k.call(
        &c,
        "POST",
        "/v1/admin/force",
        json!({"gtid": g, "outcome": "abort", "operator": "ann", "reason": "test", "confirm": true}),
    )
    .await;
    // Every branch at begin, with an earlier transaction's acknowledgement carried along.
    let acked = json!([{"gtid": g, "outcome": "abort", "branches": ["b1"]}]);
    k.call(&c, "POST", "/v1/transactions", json!({"branches": [{"resource": "pg", "branch_id": "b1"}, {"resource": "pg", "branch_id": "b2"}], "finished": acked})).await;
    // A gtid of this node that is neither in memory nor in the store: presumed abort.
    let unknown = format!("{}-999999", g.rsplit_once('-').unwrap().0);
    k.call(
        &c,
        "POST",
        "/v1/admin/force",
        json!({"gtid": unknown, "outcome": "abort", "operator": "ann", "reason": "test", "confirm": true}),
    )
    .await;
    for route in ["/v1/incidents", "/v1/audit", "/v1/nodes", "/v1/resources", "/v1/transactions?state=aborted"] {
        k.call(&c, "GET", route, n.clone()).await;
    }
    assert!(k.errors.is_empty(), "answers that do not fit their schema:\n{}", k.errors.join("\n"));
    let unseen: Vec<_> = k
        .fields
        .difference(&k.seen)
        .filter(|(s, f)| !NOT_PRODUCED.iter().any(|(ns, nf, _)| ns == s && nf == f))
        .collect();
    assert!(unseen.is_empty(), "schema fields no answer carried: {unseen:?}");
}

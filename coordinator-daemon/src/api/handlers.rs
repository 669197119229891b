//! One handler per route (the table is router.rs's ROUTES): each checks its query string
//! and body into the types of dto.rs, calls one coordinator operation and answers with
//! its body (a crate::wire type) serialized. The client's calls go through
//! client_calls.rs, whose rules the in-process API (crate::in_process) shares. The `utoipa::path` attribute above each handler is the route's method, path
//! template and OpenAPI operation: the router matches the path the attribute declares.
//! Request bodies are the types in dto.rs, response bodies those in crate::wire; 421: another daemon
//! owns the gtid (`error.owner_url`); 503 on gtid routes: its owner is unavailable, or its
//! record is quarantined.

use crate::api::client_calls as calls;
use crate::api::dto::{
    created, ok, parse, parse_required, query, text_field, AbortRequest, BeginRequest, Call, CommitRequest,
    DecisionQuery, Empty, Error, FailedRequest, FinishedManyRequest, FinishedRequest, ForceRequest, GtidLeaseRequest,
    Id, ListQuery, NoQuery, RegisterRequest, Routed,
};
use crate::coordinator::Coordinator;
use crate::participants::enforcement::Effective;
use crate::refusal::{refuse, Refusal, RefusalCode};
use crate::wire::{
    self, Ack, Audit, Begun, Decision, DecisionState, GtidLease, Health, Incidents, Nodes, Ready, Registered,
    Resources, Transaction, TransactionList, Waits,
};
use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

#[utoipa::path(get, path = "/healthz", security(()), summary = "liveness",
    responses((status = 200, body = Health), (status = 400, body = Error)))]
pub async fn healthz(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let resources = c.health.all().into_iter().collect();
    ok(Health { status: "ok".into(), node_id: c.cfg.node_id.clone(), resources })
}

#[utoipa::path(get, path = "/readyz", security(()), summary = "readiness: 503 while this daemon cannot take new transactions",
    responses((status = 200, body = Ready), (status = 503, body = Ready), (status = 400, body = Error)))]
pub async fn readyz(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let mut problems = Vec::new();
    if c.owner.lease.expired() {
        problems
            .push(format!("node {}'s lease is not confirmed: new work is refused (lease_unconfirmed)", c.cfg.node_id));
    }
    let stalled = c.store.stats.stalled_ms();
    if c.store_stalled.load(Relaxed) || stalled > crate::coordinator::housekeeping::store_stall_limit_ms(&c.cfg) {
        problems.push(format!("the decision store has not answered for {stalled} ms"));
    }
    for res in &c.cfg.resources {
        if let Some((_, Effective::Refused(why))) = c.enforcement.effective(&res.name) {
            problems.push(format!("resource {}: branches refused: {why}", res.name));
        }
    }
    let status = if problems.is_empty() { "ready" } else { "not_ready" };
    let body = wire::Ready { status: status.into(), node_id: c.cfg.node_id.clone(), problems };
    Ok((if status == "ready" { 200 } else { 503 }, Err(wire::to_json(&body))))
}

#[utoipa::path(get, path = "/metrics", summary = "Prometheus metrics",
    responses((status = 200, description = "text exposition format", body = String, content_type = "text/plain"),
              (status = 400, body = Error), (status = 401, body = Error)))]
pub async fn metrics(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let g = c.gauges();
    let up = c.health.all();
    let mut text = c.metrics.render(&g, c.store.stats.batches.load(Relaxed), c.store.stats.ops.load(Relaxed), &up);
    // As the resource listing shows it (null: no state yet).
    let modes: Vec<(String, serde_json::Value)> =
        c.cfg.resources.iter().map(|r| (r.name.clone(), wire::to_json(&c.enforcement.report(&r.name)))).collect();
    let e = &c.enforcement;
    let helpers = (e.shared.prepared.load(Relaxed), e.shared.rolled_back.load(Relaxed), e.shared.live());
    text.push_str(&crate::telemetry::metrics::render_enforcement(&modes, e.held_count(), helpers));
    Ok((
        200,
        Ok(Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(text)))
            .unwrap()),
    ))
}

#[utoipa::path(post, path = "/v1/transactions", summary = "begin a global transaction (optionally registering its first branch, or all of them)",
    request_body(content = Option<BeginRequest>),
    responses((status = 201, body = Begun), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 413, body = Error), (status = 429, body = Error), (status = 503, body = Error)))]
pub async fn begin(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    created(calls::begin(&c, parse(&r.body)?).await?)
}

#[utoipa::path(get, path = "/v1/transactions", summary = "list transactions",
    params(ListQuery),
    responses((status = 200, body = TransactionList), (status = 400, body = Error), (status = 401, body = Error)))]
pub async fn list(c: Arc<Coordinator>, r: Call) -> Routed {
    let q: ListQuery = query(r.q.as_deref())?;
    ok(c.list(q.state.as_deref())?)
}

#[utoipa::path(get, path = "/v1/transactions/{gtid}", summary = "get a transaction", params(("gtid" = Id, Path)),
    responses((status = 200, body = Transaction), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn get(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(c.get(&r.p[0]).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches", summary = "register a branch", params(("gtid" = Id, Path)),
    request_body = RegisterRequest,
    responses((status = 201, body = Registered), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 413, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn register(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    created(calls::register(&c, &r.p[0], parse_required(&r.body)?).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches/{bid}/prepared", summary = "report a branch prepared",
    params(("gtid" = Id, Path), ("bid" = Id, Path)), request_body(content = Option<Empty>),
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn prepared(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let _: Empty = parse(&r.body)?;
    ok(calls::prepared(&c, &r.p[0], &r.p[1]).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches/{bid}/failed", summary = "report a failed (refused) prepare; aborts the transaction",
    params(("gtid" = Id, Path), ("bid" = Id, Path)), request_body(content = Option<FailedRequest>),
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn failed(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(calls::failed(&c, &r.p[0], &r.p[1], parse(&r.body)?).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/branches/{bid}/finished", summary = "acknowledge a finished branch",
    params(("gtid" = Id, Path), ("bid" = Id, Path)), request_body = FinishedRequest,
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn finished(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(calls::finished(&c, &r.p[0], &r.p[1], parse_required(&r.body)?).await?)
}

#[utoipa::path(post, path = "/v1/gtid-leases", summary = "lease a range of gtids for the one-request commit (commit with branches)",
    request_body(content = Option<GtidLeaseRequest>),
    responses((status = 201, body = GtidLease), (status = 400, body = Error), (status = 401, body = Error), (status = 503, body = Error)))]
pub async fn lease_gtids(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    created(calls::lease_gtids(&c, parse(&r.body)?)?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/commit",
    summary = "decide commit (durable before the answer); or one-phase commit of a single branch; or hand the decision to a participant (decide_in)",
    params(("gtid" = Id, Path)), request_body(content = Option<CommitRequest>),
    responses((status = 200, body = Decision), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn commit(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(calls::commit(&c, &r.p[0], parse(&r.body)?).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/finished", summary = "acknowledge several finished branches at once (all or nothing)",
    params(("gtid" = Id, Path)), request_body = FinishedManyRequest,
    responses((status = 200, body = Ack), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn finished_many(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(calls::finished_many(&c, &r.p[0], parse_required(&r.body)?).await?)
}

#[utoipa::path(post, path = "/v1/transactions/{gtid}/abort", summary = "decide abort",
    params(("gtid" = Id, Path)), request_body(content = Option<AbortRequest>),
    responses((status = 200, body = Decision), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn abort(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(calls::abort(&c, &r.p[0], parse(&r.body)?).await?)
}

#[utoipa::path(get, path = "/v1/transactions/{gtid}/decision", summary = "the decision, waiting up to wait_ms for it (long poll)",
    params(("gtid" = Id, Path), DecisionQuery),
    responses((status = 200, body = DecisionState), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn decision(c: Arc<Coordinator>, r: Call) -> Routed {
    let q: DecisionQuery = query(r.q.as_deref())?;
    ok(c.wait_decision(&r.p[0], q.wait_ms.unwrap_or(0)).await?)
}

#[utoipa::path(get, path = "/v1/in-doubt", summary = "in-doubt transactions, oldest first, with locks held and waiters per prepared branch",
    responses((status = 200, body = TransactionList), (status = 400, body = Error), (status = 401, body = Error)))]
pub async fn in_doubt(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(c.in_doubt_report().await?)
}

#[utoipa::path(get, path = "/v1/incidents", summary = "branches that did not reach the decided outcome",
    responses((status = 200, body = Incidents), (status = 400, body = Error), (status = 401, body = Error)))]
pub async fn incidents(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let incidents = c.incidents.lock().unwrap().clone();
    ok(Incidents { incidents })
}

#[utoipa::path(get, path = "/v1/waits", summary = "lock waits of global transactions at the deadlock detector's last pass, and the cycles across databases it broke lately",
    responses((status = 200, body = Waits), (status = 400, body = Error), (status = 401, body = Error)))]
pub async fn waits(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let mut w = c.waits.lock().unwrap().clone();
    // Passes stop when no transaction waits any more: a wait of a transaction gone since
    // is over.
    w.waits.retain(|x| c.registry.contains(&x.waiter) || c.registry.contains(&x.blocker));
    ok(w)
}

#[utoipa::path(get, path = "/v1/audit", summary = "operator audit log",
    responses((status = 200, body = Audit), (status = 400, body = Error), (status = 401, body = Error), (status = 503, body = Error)))]
pub async fn audit(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let v = c.store.audit_log().await.map_err(|e| Refusal::new(RefusalCode::StoreUnavailable, e))?;
    ok(Audit { audit: v.into_iter().map(Into::into).collect() })
}

#[utoipa::path(post, path = "/v1/admin/force", summary = "operator: force an outcome (never contradicts a recorded decision)",
    request_body = ForceRequest,
    responses((status = 200, body = Decision), (status = 400, body = Error), (status = 401, body = Error), (status = 404, body = Error),
              (status = 409, body = Error), (status = 421, body = Error), (status = 503, body = Error)))]
pub async fn force(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
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
pub async fn nodes(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(c.nodes_report().await?)
}

#[utoipa::path(get, path = "/v1/resources", summary = "the configured resources: kind, reachable at the last contact, prepared branches held in memory",
    responses((status = 200, body = Resources), (status = 400, body = Error), (status = 401, body = Error)))]
pub async fn resources(c: Arc<Coordinator>, r: Call) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    ok(c.resources_report())
}

//! HTTP/JSON API. Every request is checked in full (auth, route, body, ids, state) before
//! anything changes; refusals are 4xx with `{"error": {"code", "message"}}`.
//!
//! One job per file, each importing only those below it: `server` (accept loop, limits,
//! TLS, per-request tracing) → `router` (ROUTES: each route declared once; matching, role
//! check, dispatch, the OpenAPI document) → `handlers`, `console` (one fn per route) →
//! `client_calls` (the client's calls, typed: their rules, shared with crate::in_process) →
//! `openapi` (the document's frame, response shapes), `dto` (request, query and error
//! types), `auth` (who may call what).

pub mod auth;
pub mod client_calls;
pub mod console;
pub mod dto;
pub mod handlers;
pub mod openapi;
pub mod router;
pub mod server;

#[cfg(test)]
mod conformance;

pub use server::{serve, tls_acceptor};

//! The web console (coordinator-daemon/console/): three static files compiled into the
//! binary and served without a credential. They hold no data: the page's script reads the
//! JSON API with the credential the user pastes into it, so the page shows exactly what
//! that credential may read, and the server checks every call as for any other client.

use crate::api::dto::{query, Call, Error, NoQuery, Routed};
use crate::coordinator::Coordinator;
use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use std::sync::Arc;

const INDEX: &str = include_str!("../../console/index.html");
const SCRIPT: &str = include_str!("../../console/app.js");
const STYLE: &str = include_str!("../../console/app.css");

/// Only our own script and style run, the page talks to this daemon only, and nothing may
/// frame it: an injected string can neither run nor send the pasted credential elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
                       base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(r: Call, content_type: &'static str, body: &'static str) -> Routed {
    let _: NoQuery = query(r.q.as_deref())?;
    let resp = Response::builder()
        .header("content-type", content_type)
        .header("content-security-policy", CSP)
        .header("x-content-type-options", "nosniff")
        .header("x-frame-options", "DENY")
        .header("referrer-policy", "no-referrer")
        // The files change with the binary only: revalidating costs little, a stale
        // script after an upgrade would call routes the daemon no longer has.
        .header("cache-control", "no-cache")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    Ok((200, Ok(resp)))
}

#[utoipa::path(get, path = "/console", security(()), summary = "the web console's page (no data in it: its script reads the API with a pasted credential)",
    responses((status = 200, description = "HTML", body = String, content_type = "text/html"), (status = 400, body = Error)))]
pub async fn page(_c: Arc<Coordinator>, r: Call) -> Routed {
    asset(r, "text/html; charset=utf-8", INDEX)
}

#[utoipa::path(get, path = "/console/app.js", security(()), summary = "the web console's script",
    responses((status = 200, description = "JavaScript", body = String, content_type = "text/javascript"), (status = 400, body = Error)))]
pub async fn script(_c: Arc<Coordinator>, r: Call) -> Routed {
    asset(r, "text/javascript; charset=utf-8", SCRIPT)
}

#[utoipa::path(get, path = "/console/app.css", security(()), summary = "the web console's style sheet",
    responses((status = 200, description = "CSS", body = String, content_type = "text/css"), (status = 400, body = Error)))]
pub async fn style(_c: Arc<Coordinator>, r: Call) -> Routed {
    asset(r, "text/css; charset=utf-8", STYLE)
}

#[cfg(test)]
mod tests {
    /// The page loads only our own files, by the paths the router serves them at, and has
    /// no inline script or style (the CSP would block them: the page would stay empty).
    #[test]
    fn page_names_its_files_and_has_nothing_inline() {
        let p = super::INDEX;
        assert!(p.contains(r#"<script src="/console/app.js"></script>"#), "{p}");
        assert!(p.contains(r#"<link rel="stylesheet" href="/console/app.css">"#), "{p}");
        assert_eq!(p.matches("<script").count(), 1, "one script, no inline one");
        assert!(!p.contains("<style") && !p.contains(" style="), "inline style");
        let handler = p.split(" on").skip(1).any(|rest| {
            let name = rest.trim_start_matches(|c: char| c.is_ascii_alphabetic());
            name.len() < rest.len() && name.starts_with('=')
        });
        assert!(!handler, "inline event handler attribute");
        assert!(!p.contains("http://") && !p.contains("https://"), "nothing from elsewhere");
        let served: Vec<&str> = crate::api::router::table()
            .iter()
            .map(|m| m.template.as_str())
            .filter(|p| p.starts_with("/console"))
            .collect();
        assert_eq!(served, ["/console", "/console/app.js", "/console/app.css"]);
    }

    /// Data goes into the page as text, never as markup.
    #[test]
    fn script_never_writes_markup() {
        let s = super::SCRIPT;
        for bad in
            ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage"]
        {
            assert!(!s.contains(bad), "app.js uses {bad}");
        }
    }
}

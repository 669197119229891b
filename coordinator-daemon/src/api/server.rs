//! The server: the accept loop with its limits (max connections, header and idle
//! timeouts), the TLS acceptor, and each request's way through the router with its trace
//! context, its span and the error body of a refusal.

use crate::api::dto::{error_reply, reply};
use crate::api::router::{count, find_route, route};
use crate::coordinator::Coordinator;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// A W3C trace context header (`version-traceid-parentid-flags`, lowercase hex), if well formed.
pub fn traceparent(v: &str) -> Option<&str> {
    let p: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (p.len() == 4
        && hex(p[0], 2)
        && p[0] != "ff"
        && hex(p[1], 32)
        && hex(p[2], 16)
        && hex(p[3], 2)
        && p[1].bytes().any(|b| b != b'0')
        && p[2].bytes().any(|b| b != b'0'))
    .then_some(v)
}

pub async fn handle(
    c: Arc<Coordinator>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    // A caller's trace context is logged with the gtid, so the coordinator's part of a
    // workflow can be found from the caller's trace (no log line without one: hot path).
    let trace =
        req.headers().get("traceparent").and_then(|v| v.to_str().ok()).and_then(traceparent).map(str::to_string);
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    // With a trace context, the request runs in a span that carries its trace id: any line
    // logged while serving it (a store retry, a completion) can be found from the trace.
    let span = trace.as_deref().map(|t| tracing::info_span!("request", trace_id = %&t[3..35]));
    let start = (trace.is_some() && crate::telemetry::otlp::enabled()).then(std::time::SystemTime::now);
    let r = match &span {
        None => route(c.clone(), req).await,
        Some(sp) => tracing::Instrument::instrument(route(c.clone(), req), sp.clone()).await,
    };
    count(&c, &r);
    let (status, resp) = match r {
        Ok((status, resp)) => (status, resp.unwrap_or_else(|v| reply(status, &v))),
        Err(e) => (e.code.http_status(), error_reply(&e)),
    };
    if let Some(t) = trace {
        let gtid = path.strip_prefix("/v1/transactions/").and_then(|r| r.split('/').next());
        tracing::info!(method = %method, path = %path, status, gtid, traceparent = %t, trace_id = %&t[3..35], parent_span_id = %&t[36..52], "request");
        if let Some(start) = start {
            // Span names have few values: the route's template, not the path.
            let name = match find_route(&method, &path) {
                Ok((m, _)) => format!("{} {}", m.method, m.template),
                Err(_) => method.clone(),
            };
            crate::telemetry::otlp::record(crate::telemetry::otlp::Span {
                trace_id: t[3..35].into(),
                parent_span_id: t[36..52].into(),
                name,
                gtid: gtid.map(str::to_string),
                method,
                path: path.clone(),
                status,
                start,
                end: std::time::SystemTime::now(),
            });
        }
    }
    Ok(resp)
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
        // A client that sends a request it does not wait for (a branch's "finished"
        // acknowledgement) and then closes its connection (its thread ended) has sent the
        // whole request: serve it. By default hyper drops the request at the EOF, and the
        // helpers of client mode stayed prepared until owner_grace_ms.
        .half_close(true)
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
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(super::traceparent(bad), None, "{bad}");
        }
    }
}

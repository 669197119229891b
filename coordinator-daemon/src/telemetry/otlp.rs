//! Optional export of request spans to OpenTelemetry: OTLP over HTTP with the JSON
//! encoding, POSTed to `[telemetry] otlp_endpoint` + `/v1/traces` (plain http: a collector
//! or agent on the host or its pod; it forwards with TLS where needed). A request that
//! carries a W3C `traceparent` becomes one SERVER span, child of the caller's span, with
//! the gtid as an attribute. Export never slows a request: spans go through a bounded
//! queue to one background task that sends a batch per second; when the queue is full or
//! the collector is down, spans are dropped (logged once per outage, with the count).

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const QUEUE: usize = 4096;
const BATCH: usize = 512;

pub struct Span {
    pub trace_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub method: String,
    pub path: String,
    pub gtid: Option<String>,
    pub status: u16,
    pub start: SystemTime,
    pub end: SystemTime,
}

struct Exporter {
    tx: std::sync::mpsc::SyncSender<Span>,
    dropped: AtomicU64,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// `http://host:port[/prefix]` -> (host:port, prefix).
pub fn parse_endpoint(s: &str) -> Result<(String, String), String> {
    let rest = s.strip_prefix("http://").ok_or("must start with http:// (export to a local collector or agent)")?;
    let (authority, prefix) = rest.split_once('/').map(|(a, p)| (a, format!("/{}", p.trim_end_matches('/')))).unwrap_or((rest, String::new()));
    let prefix = if prefix == "/" { String::new() } else { prefix };
    if authority.rsplit_once(':').and_then(|(h, p)| (!h.is_empty()).then_some(p)).and_then(|p| p.parse::<u16>().ok()).is_none() {
        return Err("must name host:port, e.g. http://127.0.0.1:4318".into());
    }
    Ok((authority.to_string(), prefix))
}

/// Starts the exporter (once, from `serve`): a thread, so no request task ever waits on it.
pub fn start(endpoint: &str, node_id: &str) {
    let Ok((authority, prefix)) = parse_endpoint(endpoint) else { return };
    let (tx, rx) = std::sync::mpsc::sync_channel::<Span>(QUEUE);
    if EXPORTER.set(Exporter { tx, dropped: AtomicU64::new(0) }).is_err() {
        return;
    }
    let node = node_id.to_string();
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || {
            let mut down = false;
            while let Ok(first) = rx.recv() {
                // Gather what else arrives within a second, up to a batch.
                let mut batch = vec![first];
                let until = std::time::Instant::now() + Duration::from_secs(1);
                while batch.len() < BATCH {
                    match rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now())) {
                        Ok(s) => batch.push(s),
                        Err(_) => break,
                    }
                }
                let n = batch.len();
                match post(&authority, &format!("{prefix}/v1/traces"), &encode(&batch, &node)) {
                    Ok(()) => {
                        if down {
                            let dropped = EXPORTER.get().map(|x| x.dropped.load(Relaxed)).unwrap_or(0);
                            tracing::info!(endpoint = %endpoint_text(&authority, &prefix), dropped, "telemetry: span export works again");
                            down = false;
                        }
                    }
                    Err(e) => {
                        EXPORTER.get().map(|x| x.dropped.fetch_add(n as u64, Relaxed));
                        if !down {
                            tracing::warn!(endpoint = %endpoint_text(&authority, &prefix), error = %e, "telemetry: span export failed; spans are dropped until it works");
                            down = true;
                        }
                    }
                }
            }
        })
        .expect("thread");
}

fn endpoint_text(authority: &str, prefix: &str) -> String {
    format!("http://{authority}{prefix}")
}

/// Whether spans are exported (checked before building one).
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

pub fn record(s: Span) {
    if let Some(x) = EXPORTER.get() {
        if x.tx.try_send(s).is_err() {
            x.dropped.fetch_add(1, Relaxed);
        }
    }
}

fn span_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Relaxed));
    format!("{:016x}", h.finish().max(1))
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0).to_string()
}

fn encode(spans: &[Span], node: &str) -> Vec<u8> {
    use serde_json::json;
    let s = |v: &str| json!({"stringValue": v});
    let spans: Vec<_> = spans
        .iter()
        .map(|x| {
            let mut attrs = vec![
                json!({"key": "http.request.method", "value": s(&x.method)}),
                json!({"key": "url.path", "value": s(&x.path)}),
                json!({"key": "http.response.status_code", "value": {"intValue": x.status.to_string()}}),
            ];
            if let Some(g) = &x.gtid {
                attrs.push(json!({"key": "cotx.gtid", "value": s(g)}));
            }
            json!({
                "traceId": x.trace_id, "spanId": span_id(), "parentSpanId": x.parent_span_id, "name": x.name,
                "kind": 2, "startTimeUnixNano": nanos(x.start), "endTimeUnixNano": nanos(x.end), "attributes": attrs,
                // OTLP status: 2 = error (a 5xx), 0 = unset.
                "status": {"code": if x.status >= 500 { 2 } else { 0 }},
            })
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": s("cotx-coordinator")}, {"key": "service.instance.id", "value": s(node)}]},
        "scopeSpans": [{"scope": {"name": "cotx-coordinator", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]})
    .to_string()
    .into_bytes()
}

/// One HTTP/1.1 POST; Ok on a 2xx answer.
fn post(authority: &str, path: &str, body: &[u8]) -> Result<(), String> {
    use std::net::ToSocketAddrs;
    let addr = authority.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
    let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    c.set_write_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).and_then(|_| c.write_all(body)).map_err(|e| e.to_string())?;
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match c.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(e.to_string()),
        }
    }
    let status = std::str::from_utf8(&buf[..got]).ok().and_then(|l| l.split(' ').nth(1)).unwrap_or("");
    if status.starts_with('2') {
        Ok(())
    } else {
        Err(format!("collector answered {:?}", String::from_utf8_lossy(&buf[..got]).lines().next().unwrap_or("")))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn endpoints_are_checked() {
        assert_eq!(super::parse_endpoint("http://127.0.0.1:4318").unwrap(), ("127.0.0.1:4318".into(), "".into()));
        assert_eq!(super::parse_endpoint("http://otel:4318/otlp/").unwrap(), ("otel:4318".into(), "/otlp".into()));
        for bad in ["https://x:4318", "127.0.0.1:4318", "http://x", "http://:4318", "http://x:port"] {
            assert!(super::parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spans_are_encoded_as_otlp_json() {
        let t = std::time::SystemTime::now();
        let sp = super::Span { trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(), parent_span_id: "00f067aa0ba902b7".into(),
            name: "POST /v1/transactions/{gtid}/abort".into(), method: "POST".into(), path: "/v1/transactions/n.1/abort".into(),
            gtid: Some("n.1".into()), status: 200, start: t, end: t };
        let v: serde_json::Value = serde_json::from_slice(&super::encode(&[sp], "n")).unwrap();
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(s["spanId"].as_str().unwrap().len(), 16);
        assert!(s["attributes"].as_array().unwrap().iter().any(|a| a["key"] == "cotx.gtid" && a["value"]["stringValue"] == "n.1"));
    }
}

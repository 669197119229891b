//! Optional export of request spans to OpenTelemetry through the OpenTelemetry SDK
//! (`opentelemetry_sdk`'s batch span processor, `opentelemetry-otlp`'s OTLP/HTTP exporter
//! with the JSON encoding and its blocking reqwest client), to `[telemetry] otlp_endpoint`
//! plus `/v1/traces` (plain http: a collector or agent on the host or its pod; it forwards
//! with TLS where needed). A request that carries a W3C `traceparent` becomes one SERVER
//! span, child of the caller's span, with the gtid as an attribute.
//!
//! Export never slows a request: `record` hands the finished span to the SDK's bounded
//! queue, drained by its own thread a batch per second; when the queue is full or the
//! collector is down, spans are dropped (logged once per outage, with the count).
//!
//! Why not `tracing-opentelemetry`: the API layer (api/) times each request itself and
//! calls `record` with the caller's ids, start and end; a tracing layer would need the
//! request handlers to open `tracing` spans, which they do not, and the log lines of
//! traced requests already carry the trace id (telemetry/log.rs). The SDK's tracer is
//! driven directly instead, with explicit parent, start and end.
//!
//! Cost, measured when the hand-written exporter (one JSON POST over a TcpStream) was
//! replaced: 31 more crates to compile (opentelemetry, _sdk, -otlp, -proto, -http, prost,
//! reqwest, tower, ...; no TLS stack, no tonic), the release binary 16.1 MB -> 17.6 MB.

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer, TracerProvider,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

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

/// The provider is kept so that its batch thread lives as long as the process.
static EXPORTER: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// `http://host:port[/prefix]` -> (host:port, prefix).
pub fn parse_endpoint(s: &str) -> Result<(String, String), String> {
    let rest = s.strip_prefix("http://").ok_or("must start with http:// (export to a local collector or agent)")?;
    let (authority, prefix) = rest
        .split_once('/')
        .map(|(a, p)| (a, format!("/{}", p.trim_end_matches('/'))))
        .unwrap_or((rest, String::new()));
    let prefix = if prefix == "/" { String::new() } else { prefix };
    if authority
        .rsplit_once(':')
        .and_then(|(h, p)| (!h.is_empty()).then_some(p))
        .and_then(|p| p.parse::<u16>().ok())
        .is_none()
    {
        return Err("must name host:port, e.g. http://127.0.0.1:4318".into());
    }
    Ok((authority.to_string(), prefix))
}

/// Starts the exporter (once, from `serve`). The SDK's batch processor runs on its own
/// thread, so no request task ever waits on the collector.
pub fn start(endpoint: &str, node_id: &str) {
    let Ok((authority, prefix)) = parse_endpoint(endpoint) else { return };
    let base = format!("http://{authority}{prefix}");
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(format!("{base}/v1/traces"))
        .with_timeout(Duration::from_secs(5))
        .build()
    {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(endpoint = %base, error = %e, "telemetry: span export cannot start");
            return;
        }
    };
    let exporter =
        Watched { inner: exporter, endpoint: base, down: AtomicBool::new(false), dropped: AtomicU64::new(0) };
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(QUEUE)
        .with_max_export_batch_size(BATCH)
        .with_scheduled_delay(Duration::from_secs(1))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
        // Every traced request is exported, whatever the caller's `sampled` flag says (as before).
        .with_sampler(Sampler::AlwaysOn)
        .with_resource(
            Resource::builder_empty()
                .with_attributes([
                    KeyValue::new("service.name", "cotx-coordinator"),
                    KeyValue::new("service.instance.id", node_id.to_string()),
                ])
                .build(),
        )
        .build();
    let tracer = provider.tracer_with_scope(
        InstrumentationScope::builder("cotx-coordinator").with_version(env!("CARGO_PKG_VERSION")).build(),
    );
    let _ = EXPORTER.set((provider, tracer));
}

/// Whether spans are exported (checked before building one).
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

pub fn record(s: Span) {
    let Some((_, tracer)) = EXPORTER.get() else { return };
    let (Ok(trace_id), Ok(parent)) = (TraceId::from_hex(&s.trace_id), SpanId::from_hex(&s.parent_span_id)) else {
        return;
    };
    let parent = SpanContext::new(trace_id, parent, TraceFlags::SAMPLED, true, TraceState::default());
    let cx = Context::new().with_remote_span_context(parent);
    let mut attrs = vec![
        KeyValue::new("http.request.method", s.method),
        KeyValue::new("url.path", s.path),
        KeyValue::new("http.response.status_code", s.status as i64),
    ];
    if let Some(g) = s.gtid {
        attrs.push(KeyValue::new("cotx.gtid", g));
    }
    let mut span = tracer
        .span_builder(s.name)
        .with_kind(SpanKind::Server)
        .with_start_time(s.start)
        .with_attributes(attrs)
        .start_with_context(tracer, &cx);
    if s.status >= 500 {
        // OTLP status error for a 5xx; unset otherwise.
        opentelemetry::trace::Span::set_status(&mut span, Status::error(""));
    }
    opentelemetry::trace::Span::end_with_timestamp(&mut span, s.end);
}

/// The OTLP exporter, with the outage logged once when it starts and once when it ends
/// (with the count of spans lost), as the daemon's logs have always said it.
#[derive(Debug)]
struct Watched {
    inner: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    down: AtomicBool,
    dropped: AtomicU64,
}

impl SpanExporter for Watched {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len() as u64;
        let r = self.inner.export(batch).await;
        match &r {
            Ok(()) if self.down.swap(false, Relaxed) => {
                let dropped = self.dropped.swap(0, Relaxed);
                tracing::info!(endpoint = %self.endpoint, dropped, "telemetry: span export works again");
            }
            Ok(()) => {}
            Err(e) => {
                self.dropped.fetch_add(n, Relaxed);
                if !self.down.swap(true, Relaxed) {
                    tracing::warn!(endpoint = %self.endpoint, error = %e, "telemetry: span export failed; spans are dropped until it works");
                }
            }
        }
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
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

    /// One span through the SDK to a stand-in collector: OTLP/HTTP JSON with the caller's
    /// trace id and parent, our attributes, and the resource (the only test that starts
    /// the process-wide exporter).
    #[test]
    fn spans_reach_a_collector_as_otlp_json() {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let collector = std::thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            let mut r = BufReader::new(c);
            let (mut head, mut len) = (Vec::new(), 0);
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
                head.push(line);
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            r.get_mut().write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").unwrap();
            (head, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
        });
        super::start(&format!("http://127.0.0.1:{port}/p"), "n");
        assert!(super::enabled());
        let t = std::time::SystemTime::now();
        super::record(super::Span {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            parent_span_id: "00f067aa0ba902b7".into(),
            name: "POST /v1/transactions/{gtid}/abort".into(),
            method: "POST".into(),
            path: "/v1/transactions/n.1/abort".into(),
            gtid: Some("n.1".into()),
            status: 200,
            start: t,
            end: t + std::time::Duration::from_millis(2),
        });
        let (head, v) = collector.join().unwrap();
        assert!(head[0].starts_with("POST /p/v1/traces "), "{head:?}");
        assert!(head.iter().any(|h| h.to_ascii_lowercase().trim() == "content-type: application/json"), "{head:?}");
        let rs = &v["resourceSpans"][0];
        assert!(
            rs["resource"]["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["key"] == "service.instance.id" && a["value"]["stringValue"] == "n"),
            "{v}"
        );
        let s = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(rs["scopeSpans"][0]["scope"]["name"], "cotx-coordinator");
        assert_eq!(s["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(s["parentSpanId"], "00f067aa0ba902b7");
        assert_eq!(s["spanId"].as_str().unwrap().len(), 16);
        assert_eq!(s["kind"], 2, "{s}");
        let attr =
            |k: &str| s["attributes"].as_array().unwrap().iter().find(|a| a["key"] == k).map(|a| a["value"].clone());
        assert_eq!(attr("cotx.gtid").unwrap()["stringValue"], "n.1");
        assert_eq!(attr("http.response.status_code").unwrap()["intValue"], "200");
    }
}

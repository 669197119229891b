//! Logs through `tracing` on stderr: human-readable lines by default, one JSON object per
//! line with `[log] format = "json"` (or `serve --log-format json`, `COTX_LOG_FORMAT`).
//! Fields (gtid, branch_id, resource, sqlstate, trace_id, ...) are structured fields of the
//! event in both formats, and a request that carries a W3C `traceparent` runs in a
//! `request` span with its `trace_id`, so every line logged while serving it carries it.

use serde_json::Value;
use tracing::Level;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// Installs the process's subscriber (once, at start).
pub fn init(format: Format, level: Level) {
    let _ = tracing::subscriber::set_global_default(subscriber(format, level, std::io::stderr));
}

fn subscriber<W>(format: Format, level: Level, writer: W) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    let b = tracing_subscriber::fmt().with_writer(writer).with_max_level(level).with_target(false).with_ansi(false);
    match format {
        Format::Text => Box::new(b.finish()),
        // Event fields at the top level beside `timestamp`, `level` and `message`; the
        // fields of the span around the event (`trace_id`) under `span`.
        Format::Json => Box::new(b.json().flatten_event(true).with_current_span(true).with_span_list(false).finish()),
    }
}

/// The SQLSTATE in a driver error text ("... (SQLSTATE 40001)"), as its own field.
fn sqlstate(err: &str) -> Option<&str> {
    let i = err.find("SQLSTATE ")? + 9;
    let s = err.get(i..i + 5)?;
    s.bytes().all(|b| b.is_ascii_alphanumeric()).then_some(s)
}

/// The log call of the modules that describe an event as a message and a JSON object of
/// fields: the fields every such call site uses become typed `tracing` fields; any other
/// goes, as JSON, into the field `extra` (nothing is dropped).
pub fn log(level: &str, msg: &str, fields: Value) {
    let empty = serde_json::Map::new();
    let f = fields.as_object().unwrap_or(&empty);
    let s = |k: &str| f.get(k).and_then(|v| v.as_str());
    let i = |k: &str| f.get(k).and_then(|v| v.as_i64());
    let b = |k: &str| f.get(k).and_then(|v| v.as_bool());
    const KNOWN: &[&str] = &[
        "gtid",
        "branch_id",
        "resource",
        "outcome",
        "by",
        "error",
        "node",
        "node_id",
        "holder",
        "previous_holder",
        "url",
        "why",
        "problem",
        "operator",
        "committed",
        "rolled_back",
        "confirmed",
        "unreachable",
        "expires_in_ms",
        "expired_ms_ago",
        "ok",
        "all_finished",
    ];
    let rest: serde_json::Map<String, Value> =
        f.iter().filter(|(k, _)| !KNOWN.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    let extra = (!rest.is_empty()).then(|| Value::Object(rest).to_string());
    // Errors given as JSON values that are not strings (rare) keep their text.
    let error_text = f.get("error").filter(|v| !v.is_string()).map(|v| v.to_string());
    let error = s("error").or(error_text.as_deref());
    macro_rules! emit {
        ($lvl:expr) => {
            tracing::event!(
                $lvl,
                gtid = s("gtid"),
                branch_id = s("branch_id"),
                resource = s("resource"),
                outcome = s("outcome"),
                by = s("by"),
                error = error,
                sqlstate = error.and_then(sqlstate),
                node = s("node"),
                node_id = s("node_id"),
                holder = s("holder"),
                previous_holder = s("previous_holder"),
                url = s("url"),
                why = s("why"),
                problem = s("problem"),
                operator = s("operator"),
                committed = i("committed"),
                rolled_back = i("rolled_back"),
                confirmed = i("confirmed"),
                unreachable = i("unreachable"),
                expires_in_ms = i("expires_in_ms"),
                expired_ms_ago = i("expired_ms_ago"),
                ok = b("ok"),
                all_finished = b("all_finished"),
                extra = extra.as_deref(),
                "{msg}"
            )
        };
    }
    match level {
        "error" => emit!(Level::ERROR),
        "warn" => emit!(Level::WARN),
        "debug" => emit!(Level::DEBUG),
        _ => emit!(Level::INFO),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines(format: super::Format, f: impl FnOnce()) -> Vec<String> {
        let buf = Buf::default();
        let w = buf.clone();
        tracing::subscriber::with_default(super::subscriber(format, tracing::Level::INFO, move || w.clone()), f);
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        out.lines().map(str::to_string).collect()
    }

    /// The fields of a log call are JSON fields (typed), the SQLSTATE of an error is its own
    /// field, an unlisted field is kept in `extra`, and a line inside a request span carries
    /// the span's trace id.
    #[test]
    fn log_fields_are_structured() {
        let got = lines(super::Format::Json, || {
            let sp = tracing::info_span!("request", trace_id = "4bf92f3577b34da6a3ce929d0e0e4736");
            let _e = sp.enter();
            super::log(
                "warn",
                "decision store write failed; retrying",
                serde_json::json!({"gtid": "n.1", "error": "db: deadlock (SQLSTATE 40P01)", "committed": 3, "ok": true, "novel": [1]}),
            );
            super::log("debug", "not written at level info", serde_json::json!({}));
        });
        assert_eq!(got.len(), 1, "{got:?}");
        let v: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["message"], "decision store write failed; retrying");
        assert_eq!(
            (&v["gtid"], &v["sqlstate"], &v["committed"], &v["ok"]),
            (&"n.1".into(), &"40P01".into(), &3.into(), &true.into())
        );
        assert_eq!(v["extra"], r#"{"novel":[1]}"#);
        assert_eq!(v["span"]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(v.get("branch_id").is_none(), "absent fields are left out: {v}");
    }

    #[test]
    fn text_lines_are_for_people() {
        let got = lines(super::Format::Text, || {
            super::log("info", "branch completed", serde_json::json!({"gtid": "n.1", "resource": "pg"}))
        });
        assert!(got[0].contains(" INFO branch completed gtid=\"n.1\" resource=\"pg\""), "{got:?}");
    }

    #[test]
    fn sqlstate_is_found_in_driver_errors() {
        assert_eq!(super::sqlstate("FATAL: database \"nope\" does not exist (SQLSTATE 3D000)"), Some("3D000"));
        assert_eq!(super::sqlstate("my: Deadlock found (error 1213, SQLSTATE 40001)"), Some("40001"));
        assert_eq!(super::sqlstate("connection refused"), None);
        assert_eq!(super::sqlstate("(SQLSTATE 12"), None);
    }
}

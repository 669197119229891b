//! Structured logs: one JSON object per line on stderr (`ts_ms`, `level`, `msg`, fields).

use serde_json::{json, Value};

pub fn log(level: &str, msg: &str, fields: Value) {
    let mut o = json!({"ts_ms": crate::state::unix_ms(), "level": level, "msg": msg});
    if let (Some(m), Value::Object(f)) = (o.as_object_mut(), fields) {
        m.extend(f);
    }
    eprintln!("{o}");
}

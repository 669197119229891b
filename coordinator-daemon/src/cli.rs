//! Operator commands. They talk to the running daemon over its API (the daemon owns the
//! store and the live state), authenticating with the token from the same config file.

use crate::config::Config;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Minimal blocking HTTP/1.1 client: one request per connection, for the CLI only.
pub fn http(cfg: &Config, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let mut addr = cfg.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("cannot reach the daemon at {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let b = body.map(|v| v.to_string()).unwrap_or_default();
    let auth = cfg.token.as_ref().map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
        b.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed response")?;
    let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("malformed status line")?;
    let v = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    Ok((status, v))
}

fn age(ms: u64) -> String {
    match ms {
        m if m < 1000 => format!("{m}ms"),
        m if m < 120_000 => format!("{:.1}s", m as f64 / 1000.0),
        m => format!("{}m{:02}s", m / 60_000, (m / 1000) % 60),
    }
}

fn print_tx(t: &Value) {
    println!(
        "{}  state={}  decision={}  age={}{}",
        t["gtid"].as_str().unwrap_or("?"),
        t["state"].as_str().unwrap_or("?"),
        t["decision"].as_str().unwrap_or("-"),
        age(t["age_ms"].as_u64().unwrap_or(0)),
        t["abort_reason"].as_str().map(|r| format!("  reason={r}")).unwrap_or_default()
    );
    for b in t["branches"].as_array().into_iter().flatten() {
        let blocking = match (&b["state"], b.get("blocking")) {
            (s, Some(info)) if s == "prepared" => format!("  (prepared, holds its locks until completed; blocking: {info})"),
            (s, None) if s == "prepared" => "  (prepared, holds its locks until completed)".to_string(),
            _ => String::new(),
        };
        println!(
            "    branch {} on {} ({}): {}{}{}",
            b["branch_id"].as_str().unwrap_or("?"),
            b["resource"].as_str().unwrap_or("?"),
            b["kind"].as_str().unwrap_or("?"),
            b["state"].as_str().unwrap_or("?"),
            b["note"].as_str().map(|n| format!("  note: {n}")).unwrap_or_default(),
            blocking
        );
    }
}

fn check(r: Result<(u16, Value), String>) -> Result<Value, String> {
    let (st, v) = r?;
    if st >= 300 {
        return Err(format!("{st}: {}", v.get("error").map(|e| e.to_string()).unwrap_or(v.to_string())));
    }
    Ok(v)
}

pub fn in_doubt(cfg: &Config, json: bool) -> Result<(), String> {
    let v = check(http(cfg, "GET", "/v1/in-doubt", None))?;
    if json {
        println!("{v}");
        return Ok(());
    }
    let list = v["transactions"].as_array().cloned().unwrap_or_default();
    println!("{} in-doubt transaction(s), oldest first", list.len());
    for t in &list {
        print_tx(t);
    }
    Ok(())
}

pub fn show(cfg: &Config, gtid: &str, json: bool) -> Result<(), String> {
    let v = check(http(cfg, "GET", &format!("/v1/transactions/{gtid}"), None))?;
    if json {
        println!("{v}");
    } else {
        print_tx(&v);
    }
    Ok(())
}

pub fn force(cfg: &Config, gtid: &str, outcome: &str, operator: &str, reason: &str) -> Result<(), String> {
    let body = serde_json::json!({"gtid": gtid, "outcome": outcome, "operator": operator, "reason": reason, "confirm": true});
    let v = check(http(cfg, "POST", "/v1/admin/force", Some(&body)))?;
    println!("{v}");
    Ok(())
}

pub fn audit(cfg: &Config) -> Result<(), String> {
    let v = check(http(cfg, "GET", "/v1/audit", None))?;
    for a in v["audit"].as_array().into_iter().flatten() {
        println!("{a}");
    }
    Ok(())
}

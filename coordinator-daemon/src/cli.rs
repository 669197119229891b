//! Operator commands. They talk to the running daemon over its API (the daemon owns the
//! store and the live state), authenticating with the token from the same config file.

use crate::config::Config;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Minimal blocking HTTP/1.1 client: one request per connection, for the CLI only; over
/// TLS (trusting `tls.ca_file`) when the daemon serves TLS.
pub fn http(cfg: &Config, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let mut addr = cfg.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("cannot reach the daemon at {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let b = body.map(|v| v.to_string()).unwrap_or_default();
    let auth = cfg.token.as_ref().map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
        b.len()
    );
    let mut resp = Vec::new();
    match &cfg.tls {
        None => exchange(s, req.as_bytes(), &mut resp)?,
        Some(t) => exchange(tls_client(t, addr, s)?, req.as_bytes(), &mut resp)?,
    }
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed response")?;
    let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or("malformed status line")?;
    let v = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    Ok((status, v))
}

fn exchange(mut s: impl Read + Write, req: &[u8], resp: &mut Vec<u8>) -> Result<(), String> {
    s.write_all(req).map_err(|e| e.to_string())?;
    match s.read_to_end(resp) {
        Ok(_) => Ok(()),
        // A TLS peer that closes without close_notify after a full answer is fine here.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !resp.is_empty() => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn tls_client(
    t: &crate::config::Tls,
    addr: std::net::SocketAddr,
    s: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&t.ca_file).map_err(|e| format!("tls.ca_file {}: {e}", t.ca_file))? {
        roots.add(c.map_err(|e| format!("tls.ca_file {}: {e}", t.ca_file))?).map_err(|e| format!("tls.ca_file {}: {e}", t.ca_file))?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), ServerName::IpAddress(addr.ip().into())).map_err(|e| e.to_string())?;
    Ok(rustls::StreamOwned::new(conn, s))
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

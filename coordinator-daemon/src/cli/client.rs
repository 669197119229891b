//! Operator commands. They talk to the running daemon over its API (the daemon owns the
//! store and the live state): by URL with their own credential (`--url`, `COTX_TOKEN`;
//! no database secrets needed), or through the daemon's config file as before.

use crate::config::Config;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Where the CLI sends its requests and with what credential.
pub struct Target {
    /// host:port to connect to.
    addr: std::net::SocketAddr,
    /// The name the TLS certificate must carry (and the Host header).
    host: String,
    /// Some: HTTPS, trusting this CA file.
    ca_file: Option<String>,
    token: Option<String>,
}

impl Target {
    /// `http://host:port` or `https://host:port` (then `ca_file` is required).
    pub fn from_url(url: &str, ca_file: Option<String>, token: Option<String>) -> Result<Target, String> {
        let (tls, rest) = match url.split_once("://") {
            Some(("http", r)) => (false, r),
            Some(("https", r)) => (true, r),
            _ => return Err(format!("--url {url}: must start with http:// or https://")),
        };
        let hostport = rest.trim_end_matches('/');
        if hostport.contains('/') {
            return Err(format!("--url {url}: give the daemon's base URL only (scheme, host, port)"));
        }
        let host = match hostport.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => h.trim_start_matches('[').trim_end_matches(']').to_string(),
            _ => return Err(format!("--url {url}: needs a port (e.g. https://coordinator.example:7420)")),
        };
        let addr = hostport.to_socket_addrs().map_err(|e| format!("--url {url}: {e}"))?.next().ok_or(format!("--url {url}: no address"))?;
        if tls && ca_file.is_none() {
            return Err(format!("--url {url}: https needs --ca-file (the CA that signed the daemon's certificate)"));
        }
        Ok(Target { addr, host, ca_file: if tls { ca_file } else { None }, token })
    }

    /// From the daemon's own config: its listen address (loopback for an unspecified one),
    /// its CA, and its token (or the operator credential of `[auth]`).
    pub fn from_config(cfg: &Config) -> Target {
        let mut addr = cfg.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        Target {
            addr,
            host: addr.ip().to_string(),
            ca_file: cfg.tls.as_ref().map(|t| t.ca_file.clone()),
            token: cfg.token.clone().or_else(|| cfg.auth.operator.clone()),
        }
    }
}

impl Target {
    /// The same target with another credential (COTX_TOKEN over the config's token).
    pub fn with_token(self, token: Option<String>) -> Target {
        Target { token, ..self }
    }
}

/// Minimal blocking HTTP/1.1 client: one request per connection, for the CLI only.
pub fn http(t: &Target, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let addr = t.addr;
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("cannot reach the daemon at {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let b = body.map(|v| v.to_string()).unwrap_or_default();
    let auth = t.token.as_ref().map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
        t.host,
        b.len()
    );
    let mut resp = Vec::new();
    match &t.ca_file {
        None => exchange(s, req.as_bytes(), &mut resp)?,
        Some(ca) => exchange(tls_client(ca, &t.host, s)?, req.as_bytes(), &mut resp)?,
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

fn tls_client(ca_file: &str, host: &str, s: TcpStream) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    use rustls::pki_types::ServerName;
    let roots = crate::dbtls::load_roots(ca_file)?;
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // The certificate is checked against the name the operator gave (--url), or the
    // listen address when the CLI read the daemon's config.
    let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: not a TLS server name: {e}"))?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).map_err(|e| e.to_string())?;
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

pub fn in_doubt(cfg: &Target, json: bool) -> Result<(), String> {
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

pub fn resources(cfg: &Target, json: bool) -> Result<(), String> {
    let v = check(http(cfg, "GET", "/v1/resources", None))?;
    if json {
        println!("{v}");
        return Ok(());
    }
    for r in v["resources"].as_array().into_iter().flatten() {
        let e = &r["enforcement"];
        let up = match r["up"].as_bool() {
            Some(true) => "up",
            Some(false) => "down",
            None => "not contacted yet",
        };
        let mut line = format!(
            "{} ({}): {up}, {} prepared branch(es); enforcement {} (configured {})",
            r["name"].as_str().unwrap_or("?"),
            r["kind"].as_str().unwrap_or("?"),
            r["prepared_branches"],
            e["mode"].as_str().unwrap_or("?"),
            e["configured"].as_str().unwrap_or("?")
        );
        if let Some(why) = e["reason"].as_str() {
            line += &format!(": {why}");
        }
        if let Some(n) = e["slots_in_use"].as_u64() {
            line += &format!("; {n} client-mode branch(es) live");
        }
        if let Some(g) = e["restart_gate"].as_str() {
            line += &format!("; restart gate closed: {g}");
        }
        println!("{line}");
    }
    Ok(())
}

pub fn show(cfg: &Target, gtid: &str, json: bool) -> Result<(), String> {
    let v = check(http(cfg, "GET", &format!("/v1/transactions/{gtid}"), None))?;
    if json {
        println!("{v}");
    } else {
        print_tx(&v);
    }
    Ok(())
}

pub fn force(cfg: &Target, gtid: &str, outcome: &str, operator: &str, reason: &str) -> Result<(), String> {
    let body = serde_json::json!({"gtid": gtid, "outcome": outcome, "operator": operator, "reason": reason, "confirm": true});
    let v = check(http(cfg, "POST", "/v1/admin/force", Some(&body)))?;
    println!("{v}");
    Ok(())
}

pub fn audit(cfg: &Target) -> Result<(), String> {
    let v = check(http(cfg, "GET", "/v1/audit", None))?;
    for a in v["audit"].as_array().into_iter().flatten() {
        println!("{a}");
    }
    Ok(())
}

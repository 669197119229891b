//! Operator commands. They talk to the running daemon over its API (the daemon owns the
//! store and the live state): by URL with their own credential (`--url`, `COTX_TOKEN`;
//! no database secrets needed), or through the daemon's config file as before.

use crate::config::Config;
use serde_json::Value;
use std::net::ToSocketAddrs;
use std::time::Duration;

/// Where the CLI sends its requests and with what credential.
pub struct Target {
    /// `http://host:port` or `https://host:port`: the host is the name the TLS
    /// certificate must carry.
    base: String,
    /// The address, for messages.
    addr: std::net::SocketAddr,
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
        match hostport.rsplit_once(':') {
            Some((_, p)) if p.parse::<u16>().is_ok() => {}
            _ => return Err(format!("--url {url}: needs a port (e.g. https://coordinator.example:7420)")),
        }
        // Resolved here so that a bad name is a usage error, as before.
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| format!("--url {url}: {e}"))?
            .next()
            .ok_or(format!("--url {url}: no address"))?;
        if tls && ca_file.is_none() {
            return Err(format!("--url {url}: https needs --ca-file (the CA that signed the daemon's certificate)"));
        }
        let scheme = if tls { "https" } else { "http" };
        Ok(Target { base: format!("{scheme}://{hostport}"), addr, ca_file: if tls { ca_file } else { None }, token })
    }

    /// From the daemon's own config: its listen address (loopback for an unspecified one),
    /// its CA, and its token (or the operator credential of `[auth]`).
    pub fn from_config(cfg: &Config) -> Target {
        let mut addr = cfg.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let ca_file = cfg.tls.as_ref().map(|t| t.ca_file.clone());
        // The certificate is then checked against the listen address (an IP SAN).
        let scheme = if ca_file.is_some() { "https" } else { "http" };
        Target {
            base: format!("{scheme}://{addr}"),
            addr,
            ca_file,
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

/// One request to the daemon through `ureq` (rustls with ring; only the CA of `--ca-file`
/// or `[tls] ca_file` is trusted). Any status is an answer: `check` turns >= 300 into an
/// error with the daemon's message.
pub fn http(t: &Target, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let mut cfg = ureq::Agent::config_builder()
        .http_status_as_error(false)
        // The CLI talks to the daemon directly: no proxy from the environment, no redirects.
        .proxy(None)
        .max_redirects(0)
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_global(Some(Duration::from_secs(60)));
    if let Some(ca) = &t.ca_file {
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(ca_certs(ca)?)))
            .unversioned_rustls_crypto_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        cfg = cfg.tls_config(tls);
    }
    let agent = ureq::Agent::new_with_config(cfg.build());
    let url = format!("{}{path}", t.base);
    let mut req = ureq::http::Request::builder().method(method).uri(&url).header("content-type", "application/json");
    if let Some(tok) = &t.token {
        req = req.header("authorization", format!("Bearer {tok}"));
    }
    let b = body.map(|v| v.to_string()).unwrap_or_default();
    let req = req.body(b).map_err(|e| e.to_string())?;
    let mut resp = agent.run(req).map_err(|e| match e {
        // The OS's words, as before ("Connection refused (os error 111)").
        ureq::Error::Io(e) => format!("cannot reach the daemon at {}: {e}", t.addr),
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound | ureq::Error::Timeout(_) => {
            format!("cannot reach the daemon at {}: {e}", t.addr)
        }
        e => e.to_string(),
    })?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().map_err(|e| e.to_string())?;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, v))
}

/// The CA file's certificates, checked as the daemon's own TLS code checks them (same
/// messages for a missing or empty file).
fn ca_certs(ca_file: &str) -> Result<Vec<ureq::tls::Certificate<'static>>, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    crate::dbtls::load_roots(ca_file)?;
    CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| format!("CA file {ca_file}: {e}"))?
        .map(|c| {
            c.map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
                .map_err(|e| format!("CA file {ca_file}: {e}"))
        })
        .collect()
}

pub(super) fn age(ms: u64) -> String {
    match ms {
        m if m < 1000 => format!("{m}ms"),
        m if m < 120_000 => format!("{:.1}s", m as f64 / 1000.0),
        m => format!("{}m{:02}s", m / 60_000, (m / 1000) % 60),
    }
}

pub(super) fn print_tx(t: &Value) {
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
            (s, Some(info)) if s == "prepared" => {
                format!("  (prepared, holds its locks until completed; blocking: {info})")
            }
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

pub(super) fn check(r: Result<(u16, Value), String>) -> Result<Value, String> {
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
    // Records the daemon cannot read: their branches wait for an operator's `force`.
    let quarantined = v["quarantined"].as_array().cloned().unwrap_or_default();
    if !quarantined.is_empty() {
        println!(
            "{} quarantined transaction(s): the decision record cannot be read; decide each with force",
            quarantined.len()
        );
        for q in &quarantined {
            println!("  {}  problem: {}", q["gtid"].as_str().unwrap_or("?"), q["problem"].as_str().unwrap_or("?"));
        }
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
    let body =
        serde_json::json!({"gtid": gtid, "outcome": outcome, "operator": operator, "reason": reason, "confirm": true});
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

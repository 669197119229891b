//! A small HTTP/1.1 JSON client for the coordinator's API: one keep-alive connection per
//! client task, bearer token, Content-Length bodies. Acknowledgements nobody waits for are
//! pipelined (their answers are read before the next request), as the Python client does.

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub struct Http {
    addr: String,
    host_header: String,
    token: Option<String>,
    conn: Option<BufReader<TcpStream>>,
    pending: usize,
}

/// A refusal of the coordinator (4xx/5xx) or a transport failure.
#[derive(Debug, Clone)]
pub struct CoordError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for CoordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "coordinator {} {}: {}", self.status, self.code, self.message)
    }
}

fn transport(e: impl std::fmt::Display) -> CoordError {
    CoordError { status: 0, code: "unavailable".into(), message: e.to_string() }
}

impl Http {
    pub fn new(url: &str, token: Option<String>) -> Result<Http, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("coordinator url must be http://host:port, got {url}"))?;
        let hostport = rest.trim_end_matches('/').to_string();
        Ok(Http { addr: hostport.clone(), host_header: hostport, token, conn: None, pending: 0 })
    }

    async fn connect(&mut self) -> Result<(), CoordError> {
        if self.conn.is_none() {
            let s = TcpStream::connect(&self.addr).await.map_err(transport)?;
            s.set_nodelay(true).map_err(transport)?;
            self.conn = Some(BufReader::new(s));
        }
        Ok(())
    }

    fn head(&self, method: &str, path: &str, len: usize) -> String {
        let auth = match &self.token {
            Some(t) => format!("Authorization: Bearer {t}\r\n"),
            None => String::new(),
        };
        format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n", self.host_header)
    }

    async fn read_response(&mut self) -> Result<(u16, Vec<u8>, bool), CoordError> {
        let c = self.conn.as_mut().ok_or_else(|| transport("not connected"))?;
        let mut line = String::new();
        if c.read_line(&mut line).await.map_err(transport)? == 0 {
            return Err(transport("connection closed by the coordinator"));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| transport(format!("bad status line {line:?}")))?;
        let (mut len, mut close) = (0usize, false);
        loop {
            line.clear();
            c.read_line(&mut line).await.map_err(transport)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                let k = k.trim().to_ascii_lowercase();
                if k == "content-length" {
                    len = v.trim().parse().map_err(transport)?;
                } else if k == "connection" && v.to_ascii_lowercase().contains("close") {
                    close = true;
                }
            }
        }
        let mut body = vec![0u8; len];
        c.read_exact(&mut body).await.map_err(transport)?;
        Ok((status, body, close))
    }

    async fn drain(&mut self) -> Result<(), CoordError> {
        while self.pending > 0 {
            self.pending -= 1;
            match self.read_response().await {
                Ok((_, _, close)) if close => {
                    self.conn = None;
                    self.pending = 0;
                }
                Ok(_) => {}
                Err(_) => {
                    self.conn = None;
                    self.pending = 0;
                }
            }
        }
        Ok(())
    }

    /// A request whose answer nobody waits for (acknowledgements).
    pub async fn send_nowait(&mut self, method: &str, path: &str, body: &Value) {
        let data = body.to_string();
        let _ = self.drain().await;
        let req = self.head(method, path, data.len()) + &data;
        if self.connect().await.is_err() {
            return;
        }
        let c = self.conn.as_mut().unwrap();
        if c.get_mut().write_all(req.as_bytes()).await.is_err() {
            self.conn = None;
            return;
        }
        self.pending += 1;
    }

    pub async fn request(&mut self, method: &str, path: &str, body: &Value) -> Result<Value, CoordError> {
        let data = body.to_string();
        self.drain().await?;
        let req = self.head(method, path, data.len()) + &data;
        let mut last = None;
        for _ in 0..2 {
            let fresh = self.conn.is_none();
            self.connect().await?;
            let c = self.conn.as_mut().unwrap();
            let sent = c.get_mut().write_all(req.as_bytes()).await.map_err(transport);
            let got = match sent {
                Ok(()) => self.read_response().await,
                Err(e) => Err(e),
            };
            match got {
                Ok((status, raw, close)) => {
                    if close {
                        self.conn = None;
                    }
                    let v: Value =
                        if raw.is_empty() { Value::Null } else { serde_json::from_slice(&raw).unwrap_or(Value::Null) };
                    if status >= 400 {
                        let e = &v["error"];
                        return Err(CoordError {
                            status,
                            code: e["code"].as_str().unwrap_or("unknown").to_string(),
                            message: e["message"].as_str().unwrap_or("").to_string(),
                        });
                    }
                    return Ok(v);
                }
                Err(e) => {
                    self.conn = None;
                    // Only a stale keep-alive connection is retried.
                    if fresh {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| transport("request failed")))
    }
}

//! TLS from the daemon to its databases: the decision store and the resources.
//!
//! One setting per database, named as libpq's `sslmode` (docs/coordinator.md, "TLS to the
//! databases"): `disable`, `prefer`, `require` (encrypted, the server's certificate is not
//! checked), `verify-ca` (the chain must lead to the CA file) and `verify-full` (and the
//! certificate must name the host the DSN connects to). The CA is an explicit PEM file:
//! no system or bundled roots are trusted for verification.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            _ => return None,
        })
    }

    pub fn verifies(self) -> bool {
        matches!(self, Mode::VerifyCa | Mode::VerifyFull)
    }
}

/// `tls` / `tls_ca_file` of a resource or of the store (paths already made absolute).
#[derive(Debug, Clone)]
pub struct DbTls {
    pub mode: Mode,
    pub ca_file: Option<String>,
}

/// The trust anchors in a PEM file; an error says which file and why.
pub fn load_roots(ca_file: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file).map_err(|e| format!("CA file {ca_file}: {e}"))?;
    for c in certs {
        roots.add(c.map_err(|e| format!("CA file {ca_file}: {e}"))?).map_err(|e| format!("CA file {ca_file}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("CA file {ca_file}: no certificate in it"));
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Checks the chain against the CA; with `check_name` false (verify-ca) a certificate
/// that does not name the host is accepted. Without a verifier (require, prefer) any
/// certificate is accepted: the connection is encrypted, not authenticated.
#[derive(Debug)]
struct Verifier {
    inner: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(v) = &self.inner else { return Ok(ServerCertVerified::assertion()) };
        match v.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The rustls client configuration for a PostgreSQL connection in `mode`.
pub fn client_config(mode: Mode, ca_file: Option<&str>) -> Result<rustls::ClientConfig, String> {
    let provider = provider();
    let inner = match (mode.verifies(), ca_file) {
        (true, Some(ca)) => Some(
            WebPkiServerVerifier::builder_with_provider(Arc::new(load_roots(ca)?), provider.clone())
                .build()
                .map_err(|e| format!("CA file {ca}: {e}"))?,
        ),
        (true, None) => return Err("verify-ca and verify-full need a CA file (tls_ca_file)".into()),
        (false, _) => None,
    };
    let verifier = Verifier { inner, check_name: mode == Mode::VerifyFull, provider: provider.clone() };
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth())
}

/// A PostgreSQL connection's settings and TLS connector: `tls` set overrides the DSN's
/// `sslmode`; unset, the DSN's sslmode (disable, prefer — the default — or require)
/// applies, encrypting without checking the certificate as libpq does without a root file.
pub fn pg(
    dsn: &str,
    tls: Option<&DbTls>,
) -> Result<(tokio_postgres::Config, tokio_postgres_rustls::MakeRustlsConnect), String> {
    use tokio_postgres::config::SslMode;
    let mut cfg: tokio_postgres::Config = dsn.parse().map_err(|e| format!("{e}"))?;
    let mode = match tls {
        Some(t) => t.mode,
        None => match cfg.get_ssl_mode() {
            SslMode::Disable => Mode::Disable,
            SslMode::Require => Mode::Require,
            _ => Mode::Prefer,
        },
    };
    cfg.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        _ => SslMode::Require,
    });
    let rc = client_config(mode, tls.and_then(|t| t.ca_file.as_deref()))?;
    Ok((cfg, tokio_postgres_rustls::MakeRustlsConnect::new(rc)))
}

/// MariaDB: `tls` set replaces the DSN's TLS parameters (require_ssl, verify_ca,
/// verify_identity); unset, they apply as mysql_async reads them.
pub fn maria(opts: mysql_async::OptsBuilder, tls: Option<&DbTls>) -> mysql_async::OptsBuilder {
    let Some(t) = tls else { return opts };
    let with_roots = |o: mysql_async::SslOpts| {
        o.with_root_certs(t.ca_file.iter().map(|p| std::path::PathBuf::from(p).into()).collect())
            .with_disable_built_in_roots(true)
    };
    let ssl = match t.mode {
        Mode::Disable | Mode::Prefer => None,
        Mode::Require => Some(mysql_async::SslOpts::default().with_danger_accept_invalid_certs(true)),
        Mode::VerifyCa => Some(with_roots(mysql_async::SslOpts::default()).with_danger_skip_domain_validation(true)),
        Mode::VerifyFull => Some(with_roots(mysql_async::SslOpts::default())),
    };
    opts.ssl_opts(ssl)
}

/// An error with its causes ("error performing TLS handshake: invalid peer certificate:
/// UnknownIssuer"): the driver's own message leaves the cause out.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s = format!("{s}: {m}");
        }
        cur = c.source();
    }
    s
}

//! The checks shared by the sections of `parse`: secrets (inline or in a file), the TLS
//! of a database connection, bounded durations, and errors that name line and field.

use super::types::{ConfigError, ResourceKind};
use crate::dbtls::{DbTls, Mode};
use toml::Spanned;

pub(super) fn line_of(src: &str, offset: usize) -> usize {
    src[..offset.min(src.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// A path from the config file: relative ones are relative to the file's directory.
pub(super) fn relative_to(base: Option<&std::path::Path>, p: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(p);
    match base {
        Some(b) if p.is_relative() => b.join(p),
        _ => p.to_path_buf(),
    }
}

pub(super) struct Ctx<'a> {
    pub(super) src: &'a str,
}

impl Ctx<'_> {
    /// A secret given inline (`name`) or in a file (`name_file`), at least 16 characters.
    pub(super) fn secret(
        &self,
        base: Option<&std::path::Path>,
        inline: &Option<Spanned<String>>,
        file: &Option<Spanned<String>>,
        name: &str,
    ) -> Result<Option<String>, ConfigError> {
        let file_field = format!("{name}_file");
        match (inline, file) {
            (Some(_), Some(f)) => {
                self.err(Some(f.span()), &file_field, format!("set {name} or {file_field}, not both"))
            }
            (Some(t), None) if t.get_ref().len() < 16 => {
                self.err(Some(t.span()), name, "must be at least 16 characters")
            }
            (Some(t), None) => Ok(Some(t.get_ref().clone())),
            (None, Some(f)) => {
                let p = relative_to(base, f.get_ref());
                match std::fs::read_to_string(&p) {
                    Ok(t) if t.trim().len() >= 16 => Ok(Some(t.trim().to_string())),
                    Ok(_) => self.err(Some(f.span()), &file_field, format!("{name} must be at least 16 characters")),
                    Err(e) => self.err(Some(f.span()), &file_field, format!("cannot read {}: {e}", p.display())),
                }
            }
            (None, None) => Ok(None),
        }
    }

    /// `tls` and `tls_ca_file` of the store or a resource (`prefix` names it in errors).
    pub(super) fn db_tls(
        &self,
        base: Option<&std::path::Path>,
        prefix: &str,
        kind: ResourceKind,
        dsn: &Spanned<String>,
        tls: &Option<Spanned<String>>,
        ca: &Option<Spanned<String>>,
    ) -> Result<Option<DbTls>, ConfigError> {
        let f = |x: &str| format!("{prefix}{x}");
        let mode = match tls {
            None => None,
            Some(t) => match Mode::parse(t.get_ref()) {
                Some(Mode::Prefer) if kind == ResourceKind::Mariadb => {
                    return self.err(Some(t.span()), &f("tls"), "\"prefer\" is not available for mariadb; use \"disable\", \"require\", \"verify-ca\" or \"verify-full\"")
                }
                Some(m) => Some((m, t.span())),
                None => {
                    return self.err(Some(t.span()), &f("tls"), format!(
                        "unknown mode {:?}; expected \"disable\", \"prefer\", \"require\", \"verify-ca\" or \"verify-full\"", t.get_ref()))
                }
            },
        };
        if let (Some((_, sp)), ResourceKind::Postgres) = (&mode, kind) {
            if dsn.get_ref().contains("sslmode") {
                return self.err(Some(sp.clone()), &f("tls"), "the dsn sets sslmode too: set one of them (tls overrides sslmode and adds verify-ca and verify-full)");
            }
        }
        let ca_file = match ca {
            None => None,
            Some(c) => {
                let p = relative_to(base, c.get_ref()).display().to_string();
                if let Err(e) = crate::dbtls::load_roots(&p) {
                    return self.err(Some(c.span()), &f("tls_ca_file"), e);
                }
                Some((p, c.span()))
            }
        };
        match (mode, ca_file) {
            (None, None) => Ok(None),
            // A CA file alone: verify-full, what a CA is given for.
            (None, Some((p, _))) => Ok(Some(DbTls { mode: Mode::VerifyFull, ca_file: Some(p) })),
            (Some((m, sp)), None) if m.verifies() => self.err(Some(sp), &f("tls_ca_file"), format!(
                "required for tls = {:?}: the server's certificate is checked against this CA (PEM); no system roots are used",
                tls.as_ref().unwrap().get_ref())),
            (Some((m, _)), Some((_, sp))) if !m.verifies() => self.err(Some(sp), &f("tls_ca_file"), format!(
                "only with tls = \"verify-ca\" or \"verify-full\" (with {:?} the certificate is not checked)", tls.as_ref().unwrap().get_ref())),
            (Some((mode, _)), ca) => Ok(Some(DbTls { mode, ca_file: ca.map(|c| c.0) })),
        }
    }

    pub(super) fn err<T>(
        &self,
        span: Option<std::ops::Range<usize>>,
        field: &str,
        msg: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError { line: span.map(|s| line_of(self.src, s.start)), field: field.into(), message: msg.into() })
    }
    pub(super) fn ms(
        &self,
        v: &Option<Spanned<u64>>,
        field: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) if *s.get_ref() < min || *s.get_ref() > max => {
                self.err(Some(s.span()), field, format!("must be between {min} and {max}"))
            }
            Some(s) => Ok(*s.get_ref()),
        }
    }
}

/// Why `dsn` is not a connection string `kind`'s driver takes (None: it is). The one place
/// the config reads a DSN, the store's and the resources' alike: the driver's own parser
/// says what is wrong, with the hint for the TLS settings that are keys of their own.
pub(super) fn dsn_error(kind: ResourceKind, dsn: &str) -> Option<String> {
    match kind {
        ResourceKind::Postgres => {
            dsn.parse::<tokio_postgres::Config>().err().map(|e| format!("{e}{}", pg_dsn_hint(dsn)))
        }
        ResourceKind::Mariadb => mysql_async::Opts::from_url(dsn).err().map(|e| e.to_string()),
    }
}

/// The driver knows sslmode disable, prefer and require only: the verifying modes and the
/// root file are config keys of their own.
fn pg_dsn_hint(dsn: &str) -> &'static str {
    if dsn.contains("verify-ca") || dsn.contains("verify-full") || dsn.contains("sslrootcert") {
        " (for sslmode=verify-ca/verify-full and sslrootcert use the keys tls = \"verify-full\" and tls_ca_file = \"<CA PEM file>\" next to the dsn)"
    } else {
        ""
    }
}

//! Who may call what: a credential per role, each with the least it needs
//! (docs/coordinator.md, "Credentials"). Pure: the API asks `check` for every request.

use crate::config::Config;
use subtle::ConstantTimeEq;

/// What a route needs (each entry of `api::router::ROUTES` names one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Liveness and the API description: no credential.
    Public,
    /// Run transactions: begin, branches, commit, abort, finished.
    Client,
    /// Read one transaction and its decision (clients poll it, operators inspect it).
    Read,
    /// Operate: list transactions, in-doubt, incidents, lock waits, audit, force an outcome.
    Operator,
    /// Scrape `/metrics`.
    Metrics,
}

/// The answer for one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    Granted,
    /// No credential, or one the daemon does not know (401).
    Unauthorized,
    /// A known credential without the role (403); names the credential.
    Forbidden(&'static str),
}

/// The roles of each kind of credential (`token` is the single all-roles credential of
/// older configs; `[auth]` gives one per role).
const ALL: &[Role] = &[Role::Client, Role::Read, Role::Operator, Role::Metrics];
const CLIENT: &[Role] = &[Role::Client, Role::Read];
const OPERATOR: &[Role] = &[Role::Operator, Role::Read, Role::Metrics];
const METRICS: &[Role] = &[Role::Metrics];

/// Every configured credential: (name in messages, secret, roles).
fn credentials(cfg: &Config) -> impl Iterator<Item = (&'static str, &str, &'static [Role])> {
    [
        ("token", cfg.token.as_deref(), ALL),
        ("auth.client_token", cfg.auth.client.as_deref(), CLIENT),
        ("auth.operator_token", cfg.auth.operator.as_deref(), OPERATOR),
        ("auth.metrics_token", cfg.auth.metrics.as_deref(), METRICS),
    ]
    .into_iter()
    .filter_map(|(n, s, r)| s.map(|s| (n, s, r)))
}

/// May a request presenting `bearer` call a route that needs `need`?
pub fn check(cfg: &Config, bearer: Option<&str>, need: Role) -> Access {
    if need == Role::Public || credentials(cfg).next().is_none() {
        return Access::Granted; // allow_no_auth: the config check made that explicit
    }
    let Some(given) = bearer else { return Access::Unauthorized };
    // Compared with every credential, without stopping at a match: neither a secret nor
    // which one matched leaks through timing.
    let mut found = None;
    for (name, secret, roles) in credentials(cfg) {
        if bool::from(given.as_bytes().ct_eq(secret.as_bytes())) {
            found = Some((name, roles));
        }
    }
    match found {
        None => Access::Unauthorized,
        Some((_, roles)) if roles.contains(&need) => Access::Granted,
        Some((name, _)) => Access::Forbidden(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> Config {
        let src = format!("node_id = \"n1\"\n{extra}\n[store]\nkind = \"sqlite\"\npath = \"/tmp/x.db\"\n");
        crate::config::parse(&src, None).unwrap()
    }

    const C: &str = "client-0123456789";
    const O: &str = "operator-0123456789";
    const M: &str = "metrics-0123456789";

    #[test]
    fn each_credential_has_the_least_it_needs() {
        let c = cfg(&format!("[auth]\nclient_token = \"{C}\"\noperator_token = \"{O}\"\nmetrics_token = \"{M}\""));
        assert_eq!(check(&c, Some(C), Role::Client), Access::Granted);
        assert_eq!(check(&c, Some(C), Role::Read), Access::Granted);
        assert_eq!(check(&c, Some(C), Role::Operator), Access::Forbidden("auth.client_token"));
        assert_eq!(check(&c, Some(C), Role::Metrics), Access::Forbidden("auth.client_token"));
        assert_eq!(check(&c, Some(O), Role::Operator), Access::Granted);
        assert_eq!(check(&c, Some(O), Role::Metrics), Access::Granted);
        assert_eq!(check(&c, Some(O), Role::Client), Access::Forbidden("auth.operator_token"));
        assert_eq!(check(&c, Some(M), Role::Metrics), Access::Granted);
        assert_eq!(check(&c, Some(M), Role::Read), Access::Forbidden("auth.metrics_token"));
        assert_eq!(check(&c, Some("nope-0123456789abc"), Role::Metrics), Access::Unauthorized);
        assert_eq!(check(&c, None, Role::Client), Access::Unauthorized);
        assert_eq!(check(&c, None, Role::Public), Access::Granted);
    }

    #[test]
    fn the_single_token_has_every_role_and_no_auth_is_explicit() {
        let c = cfg("token = \"0123456789abcdef\"");
        for r in [Role::Client, Role::Read, Role::Operator, Role::Metrics] {
            assert_eq!(check(&c, Some("0123456789abcdef"), r), Access::Granted);
        }
        let open = cfg("allow_no_auth = true");
        assert_eq!(check(&open, None, Role::Operator), Access::Granted);
    }
}

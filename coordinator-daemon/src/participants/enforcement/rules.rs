//! The enforcement modes and the rule that chooses one per resource (pure; the module
//! documentation of `enforcement` says what each mode means).

/// What the config asks for: declared with the config, below this folder (config/types.rs).
pub use crate::config::Configured;

/// The mode branches on a resource run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Engine,
    Client,
    None,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Engine => "engine",
            Mode::Client => "client",
            Mode::None => "none",
        }
    }
}

/// What a probe of the resource found: Ok, or why not, for each way of enforcing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub engine: Result<(), String>,
    pub client: Result<(), String>,
}

/// Where a resource stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effective {
    /// Not probed yet, or the last probe could not reach it (the error).
    Unknown(String),
    /// It can enforce neither way that the config allows: branches are refused.
    Refused(String),
    Mode(Mode),
}

impl Effective {
    pub fn label(&self) -> &'static str {
        match self {
            Effective::Unknown(_) => "unknown",
            Effective::Refused(_) => "refused",
            Effective::Mode(m) => m.as_str(),
        }
    }
}

/// Which probes a configuration needs (client mode's objects are created only when client
/// mode may be used; `none` needs no probe at all).
pub fn needs(cfg: Configured) -> (bool, bool) {
    match cfg {
        Configured::Auto => (true, true),
        Configured::Engine => (true, false),
        Configured::Client => (false, true),
        Configured::None => (false, false),
    }
}

/// The rule: the configured mode if the resource can do it; `auto` prefers the engine.
pub fn decide(cfg: Configured, p: &Probe) -> Effective {
    match cfg {
        Configured::None => Effective::Mode(Mode::None),
        Configured::Engine => match &p.engine {
            Ok(()) => Effective::Mode(Mode::Engine),
            Err(why) => Effective::Refused(format!("enforcement = \"engine\" but {why}")),
        },
        Configured::Client => match &p.client {
            Ok(()) => Effective::Mode(Mode::Client),
            Err(why) => Effective::Refused(format!("enforcement = \"client\" but {why}")),
        },
        Configured::Auto => match (&p.engine, &p.client) {
            (Ok(()), _) => Effective::Mode(Mode::Engine),
            (Err(_), Ok(())) => Effective::Mode(Mode::Client),
            (Err(e), Err(c)) => {
                Effective::Refused(format!("neither engine mode ({e}) nor client mode ({c}) is possible"))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(engine: bool, client: bool) -> Probe {
        Probe {
            engine: if engine { Ok(()) } else { Err("pg_co is not loaded".into()) },
            client: if client { Ok(()) } else { Err("max_prepared_transactions = 0".into()) },
        }
    }

    #[test]
    fn auto_prefers_the_engine_then_the_client_and_never_plain_2pc() {
        assert_eq!(decide(Configured::Auto, &probe(true, true)), Effective::Mode(Mode::Engine));
        assert_eq!(decide(Configured::Auto, &probe(false, true)), Effective::Mode(Mode::Client));
        let Effective::Refused(why) = decide(Configured::Auto, &probe(false, false)) else { panic!() };
        assert!(why.contains("pg_co is not loaded") && why.contains("max_prepared_transactions = 0"), "{why}");
    }

    #[test]
    fn an_explicit_mode_is_refused_when_the_resource_cannot_do_it() {
        assert_eq!(decide(Configured::Engine, &probe(true, false)), Effective::Mode(Mode::Engine));
        assert!(
            matches!(decide(Configured::Engine, &probe(false, true)), Effective::Refused(w) if w.contains("\"engine\" but pg_co"))
        );
        assert_eq!(decide(Configured::Client, &probe(true, true)), Effective::Mode(Mode::Client));
        assert!(matches!(decide(Configured::Client, &probe(true, false)), Effective::Refused(_)));
        assert_eq!(decide(Configured::None, &probe(false, false)), Effective::Mode(Mode::None));
    }

    #[test]
    fn only_the_probes_a_configuration_can_use_are_run() {
        assert_eq!(needs(Configured::Auto), (true, true));
        assert_eq!(needs(Configured::Engine), (true, false));
        assert_eq!(needs(Configured::Client), (false, true));
        assert_eq!(needs(Configured::None), (false, false));
    }
}

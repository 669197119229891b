//! The daemon's view of enforcement at each resource and the client-mode resources it
//! holds: which mode each resource is in (probed at start, on demand, and by every
//! recovery pass, so a resource whose extension was loaded, dropped or disabled is seen),
//! the shim slots of live branches, PostgreSQL's shared helper transactions (their I/O in
//! shared_helpers.rs, their rules in helpers.rs), and the MariaDB restart gate. It knows
//! nothing of transactions: the coordinator says which branches still need protection
//! (closures), this module does the I/O.

use super::gate::{Change, Gate};
use super::probe::{self, SHIM_SLOTS};
use super::rules::{decide, Configured, Effective, Mode};
pub use super::shared_helpers::KeepHelper;
use super::shared_helpers::SharedHelpers;
use super::slots::Slots;
use crate::config::{Resource, ResourceKind};
use crate::participants::resources::ResourceClient;
use crate::refusal::RefusalCode;
use crate::state::{refuse, Refusal};
use crate::telemetry::log::log;
use crate::wire::ResourceEnforcement;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct State {
    configured: Configured,
    effective: Effective,
    /// MariaDB: one slot per live branch (PostgreSQL: shared_helpers.rs's blocks).
    slots: Slots,
    gate: Gate,
    probed_at: Option<Instant>,
    /// Client mode may commit a single branch in one phase here (probe::Found).
    one_phase: bool,
}

/// A refused resource is asked again by a registration at most this often (an operator
/// who loads the extension or fixes the setting need not wait for a recovery pass).
const REPROBE_REFUSED: Duration = Duration::from_secs(1);

/// A live client-mode branch's hold on its resource.
#[derive(Debug, Clone)]
pub struct Held {
    pub resource: String,
    pub key: i32,
    /// PostgreSQL: the shared helper whose block holds `key` (its id in the pool).
    pub helper: Option<u64>,
    /// The daemon answered its one-phase commit: it commits on its client's session.
    pub one_phase: bool,
}

/// What a branch registration gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub mode: Mode,
    /// Client mode: the slot the branch writes before it prepares.
    pub key: Option<i32>,
    /// Client mode: the branch may commit in one phase when it is its transaction's only one.
    pub one_phase: bool,
}

pub struct Enforcement {
    states: Mutex<HashMap<String, State>>,
    /// One probe at a time per resource: two at once (the start's recovery pass and a
    /// first registration) would create and fill the shim table together, and InnoDB may
    /// pick one of the two fills as a deadlock victim.
    probing: HashMap<String, tokio::sync::Mutex<()>>,
    held: Mutex<HashMap<(String, String), Held>>,
    /// PostgreSQL client mode's helpers, shared by blocks of branches.
    pub shared: SharedHelpers,
}

fn random_start() -> i32 {
    let mut b = [0u8; 4];
    if getrandom_fill(&mut b) {
        (u32::from_le_bytes(b) % SHIM_SLOTS as u32) as i32 + 1
    } else {
        1 + (std::process::id() as i32 % SHIM_SLOTS)
    }
}

fn getrandom_fill(b: &mut [u8]) -> bool {
    use std::io::Read;
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(b)).is_ok()
}

impl Enforcement {
    pub fn new(resources: &[Resource], node: &str, nonce: u64) -> Enforcement {
        let states = resources
            .iter()
            .map(|r| {
                let effective = match r.enforcement {
                    Configured::None => {
                        log("warn", "enforcement = \"none\": plain 2PC at this resource, commitment ordering is not enforced there",
                            json!({"resource": r.name}));
                        Effective::Mode(Mode::None)
                    }
                    _ => Effective::Unknown("not probed yet".into()),
                };
                (r.name.clone(), State { configured: r.enforcement, effective, slots: Slots::default(), gate: Gate::default(), probed_at: None, one_phase: false })
            })
            .collect();
        let probing = resources.iter().map(|r| (r.name.clone(), tokio::sync::Mutex::new(()))).collect();
        Enforcement {
            states: Mutex::new(states),
            probing,
            held: Mutex::new(HashMap::new()),
            shared: SharedHelpers::new(resources, node, nonce),
        }
    }

    /// Asks the resource again; logs a change. Returns where it stands now.
    pub async fn refresh(&self, rc: &ResourceClient) -> Effective {
        let configured = match self.states.lock().unwrap().get(&rc.name) {
            Some(s) => s.configured,
            None => return Effective::Refused("not in the config".into()),
        };
        if configured == Configured::None {
            return Effective::Mode(Mode::None);
        }
        let _one = match self.probing.get(&rc.name) {
            Some(m) => m.lock().await,
            None => return Effective::Refused("not in the config".into()),
        };
        let (now, slots, one_phase) = match probe::probe(rc, configured).await {
            Ok(f) => (decide(configured, &f.probe), f.slots, Some(f.one_phase)),
            Err(e) => (Effective::Unknown(e), 0, None),
        };
        let mut st = self.states.lock().unwrap();
        let s = st.get_mut(&rc.name).expect("resource state");
        s.probed_at = Some(Instant::now());
        if let Some(p) = one_phase {
            s.one_phase = p;
        }
        // Unreachable keeps the last known mode: a database that is down refuses branches
        // by itself, and its mode is probed again when it is back.
        if matches!(now, Effective::Unknown(_)) && matches!(s.effective, Effective::Mode(_)) {
            return s.effective.clone();
        }
        if now != s.effective {
            let level = match &now {
                Effective::Mode(Mode::Engine | Mode::Client) => "info",
                _ => "warn",
            };
            let why = match &now {
                Effective::Unknown(w) | Effective::Refused(w) => Some(w.clone()),
                _ => None,
            };
            log(
                level,
                "enforcement at resource",
                json!({"resource": rc.name, "configured": configured.as_str(),
                "mode": now.label(), "was": s.effective.label(), "reason": why}),
            );
            if now == Effective::Mode(Mode::Client) {
                self.shared.unswept(&rc.name);
            }
        }
        if now == Effective::Mode(Mode::Client) && rc.kind == ResourceKind::Mariadb && s.slots.size() != slots {
            s.slots = Slots::new(slots, random_start());
            for h in self.held.lock().unwrap().values().filter(|h| h.resource == rc.name) {
                s.slots.reserve(h.key);
            }
        }
        if now == Effective::Mode(Mode::Client) && rc.kind == ResourceKind::Postgres {
            self.shared.resize(&rc.name, slots, random_start());
        }
        s.effective = now.clone();
        now
    }

    pub fn effective(&self, resource: &str) -> Option<(Configured, Effective)> {
        self.states.lock().unwrap().get(resource).map(|s| (s.configured, s.effective.clone()))
    }

    /// May a branch be registered at `rc`, and how is it protected? Client mode takes a
    /// slot and, on PostgreSQL, prepares the branch's helper before answering.
    pub async fn admit(
        &self,
        rc: &ResourceClient,
        gtid: &str,
        bid: &str,
        keep: KeepHelper<'_>,
        server_started: Option<i64>,
    ) -> Result<Admission, Refusal> {
        let name = &rc.name;
        match self.effective_now(rc).await {
            Effective::Unknown(why) => refuse(
                RefusalCode::ResourceUnavailable,
                format!("resource {name}: cannot tell how commitment ordering is enforced there ({why}); retry later"),
            ),
            Effective::Refused(why) => {
                refuse(RefusalCode::ResourceRefused, format!("resource {name} cannot be used: {why}"))
            }
            Effective::Mode(m @ (Mode::Engine | Mode::None)) => Ok(Admission { mode: m, key: None, one_phase: false }),
            Effective::Mode(Mode::Client) => self.admit_client(rc, gtid, bid, keep, server_started).await,
        }
    }

    /// The admission of a branch of the one-request commit (already prepared, reported
    /// with the commit): engine mode and plain 2PC only — client mode's helper and slot
    /// come with a registration made before the branch works.
    pub async fn admit_prepared(&self, rc: &ResourceClient) -> Result<Mode, Refusal> {
        let name = &rc.name;
        match self.effective_now(rc).await {
            Effective::Mode(m @ (Mode::Engine | Mode::None)) => Ok(m),
            Effective::Mode(Mode::Client) => refuse(
                RefusalCode::ResourceRefused,
                format!("resource {name} runs client mode: its branches register before they work (begin with branches), not with the commit"),
            ),
            Effective::Unknown(why) => refuse(
                RefusalCode::ResourceUnavailable,
                format!("resource {name}: cannot tell how commitment ordering is enforced there ({why}); retry later"),
            ),
            Effective::Refused(why) => {
                refuse(RefusalCode::ResourceRefused, format!("resource {name} cannot be used: {why}"))
            }
        }
    }

    /// The resource's mode as last probed, probed again when unknown or a stale refusal.
    async fn effective_now(&self, rc: &ResourceClient) -> Effective {
        let (eff, probed_at) = match self.states.lock().unwrap().get(&rc.name) {
            Some(s) => (s.effective.clone(), s.probed_at),
            None => (Effective::Unknown("not in the config".into()), None),
        };
        let stale_refusal =
            matches!(eff, Effective::Refused(_)) && probed_at.map(|t| t.elapsed() >= REPROBE_REFUSED).unwrap_or(true);
        if matches!(eff, Effective::Unknown(_)) || stale_refusal {
            return self.refresh(rc).await;
        }
        eff
    }

    async fn admit_client(
        &self,
        rc: &ResourceClient,
        gtid: &str,
        bid: &str,
        keep: KeepHelper<'_>,
        server_started: Option<i64>,
    ) -> Result<Admission, Refusal> {
        let name = &rc.name;
        let unavailable = |e: String| {
            Refusal::new(RefusalCode::ResourceUnavailable, format!("resource {name} (client mode): {e}; retry later"))
        };
        match rc.kind {
            ResourceKind::Postgres => {
                if !self.shared.swept(name) {
                    self.sweep_helpers(rc, keep)
                        .await
                        .map_err(|e| unavailable(format!("helpers of an earlier run not recovered yet: {e}")))?;
                }
                return self.admit_pg(rc, gtid, bid).await;
            }
            ResourceKind::Mariadb => {
                // Every registration is checked against the server's start time: a restart
                // between two recovery passes must not let a branch in before the gate
                // closes. A client that read the start on its own connection (once per
                // connection, `server_started`) and reads the run this open gate knows
                // needs no look: a restart since its reading broke that connection. Any
                // other registration (an old client, another start, a closed gate) asks
                // the server, as before.
                let vouched = server_started
                    .is_some_and(|t| self.states.lock().unwrap().get(name).is_some_and(|s| s.gate.vouches_for(t)));
                if !vouched {
                    let started = probe::maria_started(rc).await.map_err(unavailable)?;
                    let look = self
                        .states
                        .lock()
                        .unwrap()
                        .get(name)
                        .map(|s| s.gate.is_new_start(started) || s.gate.closed().is_some())
                        .unwrap_or(true);
                    if look {
                        let (started, prepared) = probe::maria_start_and_prepared(rc).await.map_err(unavailable)?;
                        self.observe_gate(name, started, &prepared);
                    }
                }
                if let Some(why) = self.states.lock().unwrap().get(name).and_then(|s| s.gate.closed()) {
                    return refuse(
                        RefusalCode::RestartGate,
                        format!("resource {name} (client mode): {why}; retry later"),
                    );
                }
            }
        }
        let key = self.states.lock().unwrap().get_mut(name).and_then(|s| s.slots.take());
        let Some(key) = key else {
            return refuse(
                RefusalCode::ResourceBusy,
                format!(
                    "resource {name} (client mode): all {SHIM_SLOTS} shim slots are held by live branches; retry later"
                ),
            );
        };
        let id = (gtid.to_string(), bid.to_string());
        if self
            .held
            .lock()
            .unwrap()
            .insert(id, Held { resource: name.clone(), key, helper: None, one_phase: false })
            .is_some()
        {
            return refuse(RefusalCode::DuplicateBranch, format!("branch {bid} of {gtid} is registered already"));
        }
        Ok(Admission { mode: Mode::Client, key: Some(key), one_phase: self.one_phase_at(name) })
    }

    fn give(&self, resource: &str, key: i32) {
        if let Some(s) = self.states.lock().unwrap().get_mut(resource) {
            s.slots.give(key);
        }
    }

    /// A key of a shared helper for a PostgreSQL branch (swept already).
    async fn admit_pg(&self, rc: &ResourceClient, gtid: &str, bid: &str) -> Result<Admission, Refusal> {
        let id = (gtid.to_string(), bid.to_string());
        if self.held.lock().unwrap().contains_key(&id) {
            return refuse(RefusalCode::DuplicateBranch, format!("branch {bid} of {gtid} is registered already"));
        }
        let taken = self.shared.take(rc).await?;
        let held = Held { resource: rc.name.clone(), key: taken.key, helper: Some(taken.helper), one_phase: false };
        if self.held.lock().unwrap().insert(id, held).is_some() {
            self.shared.settle(rc, taken.helper, false).await;
            return refuse(RefusalCode::DuplicateBranch, format!("branch {bid} of {gtid} is registered already"));
        }
        Ok(Admission { mode: Mode::Client, key: Some(taken.key), one_phase: self.one_phase_at(&rc.name) })
    }

    fn one_phase_at(&self, resource: &str) -> bool {
        self.states.lock().unwrap().get(resource).is_some_and(|s| s.one_phase)
    }

    /// The daemon is about to answer this client-mode branch's one-phase commit: from now
    /// on it commits on its client's session, and its helper (PostgreSQL) goes only once
    /// no slot of the helper's block is write-locked. Err: the branch holds nothing any
    /// more (settled meanwhile), or its resource cannot tell when that transaction ended.
    pub fn begin_one_phase(&self, gtid: &str, bid: &str) -> Result<(), String> {
        let id = (gtid.to_string(), bid.to_string());
        let gone = || format!("branch {bid:?} holds no client-mode slot any more");
        // Not both locks at once: refresh() takes `states`, then `held`.
        let resource = self.held.lock().unwrap().get(&id).map(|h| h.resource.clone()).ok_or_else(gone)?;
        if !self.one_phase_at(&resource) {
            return Err(format!(
                "resource {resource} lacks cotx.shim_locked (objects of an older sql/client_mode/postgres.sql that the daemon's role may not replace): client-mode branches there must be prepared"
            ));
        }
        self.held.lock().unwrap().get_mut(&id).map(|h| h.one_phase = true).ok_or_else(gone)
    }

    /// Should the pool of ready helpers at `resource` be topped up now (the caller spawns
    /// `refill`)? Only in client mode, once its helpers were looked at.
    pub fn begin_refill(&self, resource: &str) -> bool {
        matches!(self.effective(resource), Some((_, Effective::Mode(Mode::Client))))
            && self.shared.begin_refill(resource)
    }

    pub async fn refill(&self, rc: &ResourceClient) {
        self.shared.refill(rc).await
    }

    /// Lets go of the branches `done` says no longer need protection (decided and
    /// finished, aborted, failed, forgotten): MariaDB slots freed; PostgreSQL keys
    /// returned to their helper, which is rolled back once it may go.
    pub async fn release(
        &self,
        resources: &HashMap<String, std::sync::Arc<ResourceClient>>,
        done: impl Fn(&str, &str) -> bool,
    ) {
        let gone: Vec<Held> = {
            let mut held = self.held.lock().unwrap();
            let ids: Vec<(String, String)> = held.keys().filter(|(g, b)| done(g, b)).cloned().collect();
            ids.into_iter().filter_map(|id| held.remove(&id)).collect()
        };
        for h in gone {
            match (h.helper, resources.get(&h.resource)) {
                (Some(helper), Some(rc)) => self.shared.settle(rc, helper, h.one_phase).await,
                _ => self.give(&h.resource, h.key),
            }
        }
    }

    /// The housekeeping tick: PostgreSQL helpers idle, or whose rollback failed.
    pub async fn retire_idle(&self, resources: &HashMap<String, std::sync::Arc<ResourceClient>>) {
        for rc in resources.values().filter(|rc| rc.kind == ResourceKind::Postgres) {
            self.shared.retire_idle(rc).await;
        }
    }

    /// The daemon stops: PostgreSQL helpers no live branch holds are rolled back.
    pub async fn let_go_unused(&self, resources: &HashMap<String, std::sync::Arc<ResourceClient>>) {
        for rc in resources.values().filter(|rc| rc.kind == ResourceKind::Postgres) {
            self.shared.let_go_unused(rc).await;
        }
    }

    /// Anything for the tick to do: live holds or helpers in memory.
    pub fn busy(&self) -> bool {
        self.held_count() > 0 || self.shared.live() > 0
    }

    /// Helpers prepared at `rc` that no live state of this run knows, recovered
    /// (shared_helpers.rs has the rule). Run by every recovery pass, and before the
    /// first client-mode branch.
    pub async fn sweep_helpers(&self, rc: &ResourceClient, keep: KeepHelper<'_>) -> Result<usize, String> {
        self.shared.sweep(rc, keep).await
    }

    fn observe_gate(&self, name: &str, started: super::gate::Start, prepared: &HashSet<(String, String)>) {
        let mut st = self.states.lock().unwrap();
        let Some(s) = st.get_mut(name) else { return };
        match s.gate.observe(started, prepared) {
            Change::Closed { started, pending } => log(
                "warn",
                "restart gate closed: no new branch until the recovered ones are decided",
                json!({"resource": name, "server_started_unix": started, "recovered_branches": pending}),
            ),
            Change::Opened => log("info", "restart gate open", json!({"resource": name})),
            Change::Unchanged => {}
        }
    }

    /// Recovery pass: MariaDB client mode looks at the server's start time (the gate).
    pub async fn look_at_restarts(&self, rc: &ResourceClient) {
        let client = matches!(self.effective(&rc.name), Some((_, Effective::Mode(Mode::Client))));
        if !client || rc.kind != ResourceKind::Mariadb {
            return;
        }
        match probe::maria_start_and_prepared(rc).await {
            Ok((started, prepared)) => self.observe_gate(&rc.name, started, &prepared),
            Err(e) => log(
                "warn",
                "client mode: cannot read the server's start time",
                json!({"resource": rc.name, "error": e}),
            ),
        }
    }

    /// Is this branch in client mode (holding a slot)?
    pub fn holds(&self, gtid: &str, bid: &str) -> bool {
        self.held.lock().unwrap().contains_key(&(gtid.to_string(), bid.to_string()))
    }

    pub fn held_count(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// For the resource listing and /metrics (None: not a configured resource).
    pub fn report(&self, resource: &str) -> Option<ResourceEnforcement> {
        let st = self.states.lock().unwrap();
        let s = st.get(resource)?;
        let reason = match &s.effective {
            Effective::Unknown(w) | Effective::Refused(w) => Some(w.clone()),
            _ => None,
        };
        // Client mode only: its slots and its gate (null while open).
        let client = s.effective == Effective::Mode(Mode::Client);
        Some(ResourceEnforcement {
            configured: s.configured.as_str().into(),
            mode: s.effective.label().into(),
            reason,
            slots_in_use: client.then(|| self.shared.live_keys(resource).unwrap_or(s.slots.in_use()) as u64),
            restart_gate: client.then(|| s.gate.closed()),
        })
    }
}

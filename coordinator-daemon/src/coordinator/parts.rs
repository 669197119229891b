//! The parts a coordinator is made of, each owned by its own module: the config, the
//! decision store, the metrics, the resources' connections and what was last seen of
//! them, the live transactions (registry.rs), what this daemon owns (ha/ownership.rs) and
//! the enforcement runtime. An operation borrows only the parts it uses, or a small view
//! of them built from this bundle (`operating::Operating`, `answers::Answering`,
//! `completion::Finishing`, `holds::Holds`, `Parts::holding`), and leaves the work that
//! outlives it as effects (effects.rs); only what starts that work (`completion::start`
//! and its spawns) and the background loops' entries take the whole `Arc<Parts>` (a
//! ceiling on how many functions take it: regress/pytest/repository/test_structure.py).
//! The logic lives in the parts and in those modules, never here.

use crate::config::{Config, ResourceKind};
use crate::ha::holding::Holding;
use crate::ha::ownership::Ownership;
use crate::participants::enforcement::runtime::Enforcement;
use crate::participants::resources::ResourceClient;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::wire::Waits;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::health::ResourceHealth;
use super::leases::Leases;
use super::registry::{Incident, Registry};
use cotx_protocol::leased::Range;

pub struct Parts {
    pub cfg: Config,
    pub store: Store,
    pub metrics: Metrics,
    pub resources: HashMap<String, Arc<ResourceClient>>,
    /// Each resource's health at the last contact, and the wake-up of retries waiting on one.
    pub health: ResourceHealth,
    /// Branches that did not reach their decided outcome (completion.rs).
    pub incidents: Mutex<Vec<Incident>>,
    pub registry: Registry,
    pub owner: Ownership,
    /// How each resource enforces commitment ordering, and client mode's live holds.
    pub enforcement: Enforcement,
    /// The store has stopped answering (logged once per stall: housekeeping.rs).
    pub store_stalled: AtomicBool,
    /// The deadlock detector's last look at the lock waits (deadlocks.rs; /v1/waits).
    pub waits: Mutex<Waits>,
    /// The ranges of gtids this process leased for the one-request commit (leases.rs).
    pub leases: Leases,
}

impl Parts {
    pub fn new(cfg: Config, store: Store, nonce: u64) -> Result<Parts, String> {
        let mut resources = HashMap::new();
        for r in &cfg.resources {
            resources.insert(r.name.clone(), Arc::new(ResourceClient::new(r, &cfg.gid_prefix, &cfg.node_id)?));
        }
        Ok(Parts {
            owner: Ownership::new(&cfg.node_id, nonce),
            enforcement: Enforcement::new(&cfg.resources, &cfg.node_id, nonce),
            cfg,
            store,
            metrics: Metrics::default(),
            resources,
            health: ResourceHealth::default(),
            incidents: Mutex::new(Vec::new()),
            registry: Registry::default(),
            store_stalled: AtomicBool::new(false),
            waits: Mutex::new(Waits::default()),
            leases: Leases::default(),
        })
    }

    /// The parts the lease operations use (ha/lease.rs), lent.
    pub fn holding(&self) -> Holding<'_> {
        Holding {
            cfg: &self.cfg,
            store: &self.store,
            owner: &self.owner,
            metrics: &self.metrics,
            resources: &self.resources,
            memory: &self.registry,
        }
    }

    /// Where a gtid stands among the ranges this process leased (cotx_protocol::leased).
    pub fn range_of(&self, gtid: &str) -> Range {
        self.leases.range_of(gtid, &self.cfg.node_id, self.owner.nonce)
    }

    pub fn kind_of(&self, resource: &str) -> Option<ResourceKind> {
        self.cfg.kind_of(resource)
    }
}

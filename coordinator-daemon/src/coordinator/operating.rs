//! What the API's operations on a transaction borrow (begin, register, the commit paths,
//! the one-request commit): memory, the store, the config, whose nodes we act for, the
//! metrics, the enforcement runtime and the resources' connections it admits branches
//! at, the leased ranges. Not the resources' health, the incidents, the deadlock
//! detector's view: finishing branches is left to follow the operation (effects.rs).
//! Narrowed again to what answering (`Answering`) and client mode's holds (`Holds`) read.

use crate::config::Config;
use crate::ha::ownership::Ownership;
use crate::participants::enforcement::runtime::Enforcement;
use crate::participants::resources::Clients;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use std::sync::Arc;

use super::answers::Answering;
use super::holds::Holds;
use super::leases::Leases;
use super::parts::Parts;
use super::registry::Registry;

#[derive(Clone, Copy)]
pub struct Operating<'a> {
    pub cfg: &'a Config,
    pub store: &'a Store,
    pub owner: &'a Ownership,
    pub registry: &'a Registry,
    pub metrics: &'a Metrics,
    pub enforcement: &'a Enforcement,
    pub resources: &'a Clients,
    pub leases: &'a Leases,
}

impl<'a> From<&'a Parts> for Operating<'a> {
    fn from(p: &'a Parts) -> Self {
        Operating {
            cfg: &p.cfg,
            store: &p.store,
            owner: &p.owner,
            registry: &p.registry,
            metrics: &p.metrics,
            enforcement: &p.enforcement,
            resources: &p.resources,
            leases: &p.leases,
        }
    }
}

impl<'a> From<&'a Arc<Parts>> for Operating<'a> {
    fn from(p: &'a Arc<Parts>) -> Self {
        Operating::from(&**p)
    }
}

impl<'a> From<Operating<'a>> for Answering<'a> {
    fn from(c: Operating<'a>) -> Self {
        Answering {
            cfg: c.cfg,
            store: c.store,
            owner: c.owner,
            registry: c.registry,
            resources: c.resources,
            leases: c.leases,
        }
    }
}

impl<'a> From<Operating<'a>> for Holds<'a> {
    fn from(c: Operating<'a>) -> Self {
        Holds {
            enforcement: c.enforcement,
            resources: c.resources,
            registry: c.registry,
            owner: c.owner,
            timeouts: &c.cfg.timeouts,
        }
    }
}

impl Operating<'_> {
    /// Where a gtid stands among the ranges this process leased (cotx_protocol::leased).
    pub fn range_of(self, gtid: &str) -> cotx_protocol::leased::Range {
        self.leases.range_of(gtid, &self.cfg.node_id, self.owner.nonce)
    }
}

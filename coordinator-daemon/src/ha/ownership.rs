//! What this daemon owns, in memory: its node id and holder id, this start's epoch, the
//! lease clock (until when our own lease is known valid), the grants it acts under (its
//! own node's and those of nodes taken over), the nodes taken over, the epochs the store
//! knows, and whether it is regaining its own node after losing the grant. No I/O: the
//! store-facing side (claims, renewals, takeovers) is ha/lease.rs.

use crate::store::Token;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

pub fn mono_ms() -> u64 {
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Until when (monotonic ms) our lease is known valid, with a renewal period of margin.
pub struct LeaseClock(AtomicU64);

impl Default for LeaseClock {
    fn default() -> Self {
        LeaseClock::new()
    }
}

impl LeaseClock {
    /// Valid until told otherwise: a daemon claims its node before it acts (claim_at_start).
    pub fn new() -> LeaseClock {
        LeaseClock(AtomicU64::new(u64::MAX))
    }
    pub fn confirmed(&self, ttl_ms: u64, renew_ms: u64) {
        self.confirmed_at(mono_ms(), ttl_ms, renew_ms);
    }
    /// `confirmed` at a given monotonic time (the tests' clock).
    pub fn confirmed_at(&self, now_ms: u64, ttl_ms: u64, renew_ms: u64) {
        self.0.store(now_ms + ttl_ms.saturating_sub(renew_ms), Relaxed);
    }
    pub fn expired(&self) -> bool {
        self.expired_at(mono_ms())
    }
    pub fn expired_at(&self, now_ms: u64) -> bool {
        now_ms > self.0.load(Relaxed)
    }
    /// Known invalid until confirmed again.
    pub fn revoke(&self) {
        self.0.store(0, Relaxed);
    }
}

/// A per-start random value: the epoch of every gtid this start issues.
pub fn nonce() -> u64 {
    let mut b = [0u8; 8];
    // The OS's generator (getrandom); the clock only if it is unavailable.
    match getrandom::getrandom(&mut b) {
        Ok(()) => u64::from_le_bytes(b) & 0xffff_ffff_ffff,
        Err(_) => crate::state::unix_ms() & 0xffff_ffff_ffff,
    }
}

/// A lease holder id: host, process and epoch, so every start is a distinct holder.
pub fn holder_id(node: &str, nonce: u64) -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{node}@{}/{}/{nonce:012x}", host.trim(), std::process::id())
}

pub struct Ownership {
    pub node_id: String,
    /// Who holds our leases: unique per process start.
    pub holder: String,
    /// This start's epoch: part of every gtid issued, registered in the store first.
    pub nonce: u64,
    /// Until when our lease is known valid: past it, act on nothing until it is renewed.
    pub lease: LeaseClock,
    /// The lease grants we act under, by node: our own and the nodes taken over.
    grants: Mutex<HashMap<String, Token>>,
    /// Nodes whose lease we took over from a daemon that stopped renewing it.
    adopted: Mutex<HashSet<String>>,
    /// Epochs the store knows (refreshed by every recovery pass).
    pub epochs: Mutex<HashSet<(String, u64)>>,
    /// Our own grant was lost and memory is not yet reconciled with the store under a new
    /// one: nothing is answered from memory, nothing acted on (lease.rs, `regain`).
    regaining: AtomicBool,
}

impl Ownership {
    pub fn new(node_id: &str, nonce: u64) -> Ownership {
        Ownership {
            node_id: node_id.to_string(),
            holder: holder_id(node_id, nonce),
            nonce,
            lease: LeaseClock::new(),
            grants: Mutex::new(HashMap::new()),
            adopted: Mutex::new(HashSet::new()),
            epochs: Mutex::new(HashSet::new()),
            regaining: AtomicBool::new(false),
        }
    }

    /// Nodes this daemon acts for: its own and those it took over.
    pub fn acts_for(&self, node: &str) -> bool {
        node == self.node_id || self.adopted.lock().unwrap().contains(node)
    }

    /// Our current grant of `node`'s lease, if we hold one.
    pub fn grant(&self, node: &str) -> Option<Token> {
        self.grants.lock().unwrap().get(node).cloned()
    }

    /// The generation of our grant of `node` (-1: none): what a new entry is written under.
    pub fn generation_of(&self, node: &str) -> i64 {
        self.grant(node).map(|t| t.generation).unwrap_or(-1)
    }

    pub fn granted(&self, node: &str, generation: i64) {
        self.grants.lock().unwrap().insert(node.to_string(), Token { holder: self.holder.clone(), generation });
    }

    pub fn drop_grant(&self, node: &str) {
        self.grants.lock().unwrap().remove(node);
    }

    /// A node taken over (its grant is recorded with `granted`).
    pub fn adopt(&self, node: &str) {
        self.adopted.lock().unwrap().insert(node.to_string());
    }

    /// Stops acting for a taken-over node; false when it was not one.
    pub fn unadopt(&self, node: &str) -> bool {
        self.adopted.lock().unwrap().remove(node)
    }

    pub fn is_adopted(&self, node: &str) -> bool {
        self.adopted.lock().unwrap().contains(node)
    }

    /// The nodes taken over, sorted (reports and loops read a stable order).
    pub fn adopted(&self) -> Vec<String> {
        let mut v: Vec<String> = self.adopted.lock().unwrap().iter().cloned().collect();
        v.sort();
        v
    }

    /// Every taken-over node let go at once (our own grant was lost).
    pub fn drain_adopted(&self) -> Vec<String> {
        let mut v: Vec<String> = self.adopted.lock().unwrap().drain().collect();
        v.sort();
        v
    }

    /// Our own node first, then the nodes taken over.
    pub fn nodes(&self) -> Vec<String> {
        let mut v = vec![self.node_id.clone()];
        v.extend(self.adopted());
        v
    }

    pub fn regaining(&self) -> bool {
        self.regaining.load(Relaxed)
    }

    pub fn set_regaining(&self, on: bool) {
        self.regaining.store(on, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_clock_is_valid_until_its_ttl_less_a_renewal_and_revocable() {
        let c = LeaseClock::new();
        assert!(!c.expired_at(1_000_000), "valid until first confirmed");
        c.confirmed_at(1_000, 5_000, 1_000);
        assert!(!c.expired_at(1_000));
        assert!(!c.expired_at(5_000), "ttl - renew = 4000 ms of validity");
        assert!(c.expired_at(5_001));
        c.revoke();
        assert!(c.expired_at(1), "revoked: invalid at once");
        c.confirmed_at(10, 100, 500);
        assert!(c.expired_at(11), "a renewal period longer than the ttl leaves no validity");
        assert!(!c.expired_at(10));
    }

    #[test]
    fn grants_and_taken_over_nodes() {
        let o = Ownership::new("n1", 0xabc);
        assert!(o.holder.starts_with("n1@") && o.holder.ends_with("/000000000abc"), "{}", o.holder);
        assert!(o.acts_for("n1") && !o.acts_for("n2"));
        assert_eq!((o.grant("n1"), o.generation_of("n1")), (None, -1));
        o.granted("n1", 3);
        assert_eq!(o.grant("n1"), Some(Token { holder: o.holder.clone(), generation: 3 }));
        o.granted("n2", 7);
        o.adopt("n2");
        assert!(o.acts_for("n2") && o.is_adopted("n2"));
        assert_eq!(o.nodes(), vec!["n1".to_string(), "n2".to_string()]);
        assert_eq!(o.drain_adopted(), vec!["n2".to_string()]);
        assert!(!o.acts_for("n2") && !o.unadopt("n2"));
        o.drop_grant("n2");
        assert_eq!(o.generation_of("n2"), -1);
        assert_eq!(o.generation_of("n1"), 3);
        assert!(!o.regaining());
        o.set_regaining(true);
        assert!(o.regaining());
    }

    #[test]
    fn every_start_has_its_own_nonce_and_holder() {
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        assert!(a <= 0xffff_ffff_ffff && b <= 0xffff_ffff_ffff);
        assert_ne!(holder_id("n", a), holder_id("n", b));
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        assert!(holder_id("n", 1).starts_with(&format!("n@{}/", host.trim())));
    }
}

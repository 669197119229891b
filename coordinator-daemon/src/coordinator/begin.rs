//! Beginning a transaction and registering its branches: the cap on undecided
//! transactions, the ids each branch gets at its resource (PostgreSQL gid, MariaDB XID),
//! enforcement's admission (client mode's hold), and "prepared".

use crate::config::ResourceKind;
use crate::ha::ownership::Ownership;
use crate::naming;
use crate::participants::enforcement::Mode;
use crate::refusal::RefusalCode;
use crate::state::{refuse, Refusal, Tx, TxState};
use crate::telemetry::metrics::Metrics;
use crate::wire::{Ack, Begun, BranchState, EnforcementMode, Registered, Shim, Xid};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::answers::{self, Res};
use super::effects::Effects;
use super::holds;
use super::operating::Operating;
use super::registry::{Entry, Registry};

/// No new work while our lease (of node `node_id`) is unconfirmed.
pub fn refuse_new_work(owner: &Ownership, node_id: &str) -> Result<(), Refusal> {
    if owner.lease.expired() {
        return refuse(
            RefusalCode::LeaseUnconfirmed,
            format!("node {node_id}'s lease could not be renewed in time: no new work until it is"),
        );
    }
    Ok(())
}

/// A transaction's timeout, checked against limits.max_transaction_ms.
pub fn timeout_ms(asked: Option<u64>, default_ms: u64, max_ms: u64) -> Result<u64, Refusal> {
    let t = asked.unwrap_or(default_ms);
    if !(10..=max_ms).contains(&t) {
        return refuse(
            RefusalCode::InvalidField,
            format!("timeout_ms must be between 10 and {max_ms} (limits.max_transaction_ms)"),
        );
    }
    Ok(t)
}

/// Begins `gtid` (issued by the caller: the coordinator owns the sequence).
pub fn begin(c: Operating<'_>, gtid: String, asked_timeout_ms: Option<u64>) -> Res<Begun> {
    refuse_new_work(c.owner, &c.cfg.node_id)?;
    let t = timeout_ms(asked_timeout_ms, c.cfg.timeouts.transaction_ms, c.cfg.limits.max_transaction_ms)?;
    let max = c.cfg.limits.max_active;
    let grant = c.owner.generation_of(&c.cfg.node_id);
    if let Err(active) =
        c.registry.insert_capped(&gtid, Entry::new(Tx::new(gtid.clone(), Duration::from_millis(t)), false, grant), max)
    {
        c.metrics.overloaded.fetch_add(1, Relaxed);
        return refuse(
            RefusalCode::TooManyTransactions,
            format!("{active} transactions are undecided (limits.max_active = {max}); retry later"),
        );
    }
    c.metrics.begun.fetch_add(1, Relaxed);
    Ok(Begun { gtid, state: TxState::Active, timeout_ms: t, branch: None, branches: None })
}

/// Undoes a begin whose first branch was refused: nothing is left behind.
pub fn unbegin(registry: &Registry, metrics: &Metrics, gtid: &str) {
    registry.remove(gtid);
    metrics.begun.fetch_sub(1, Relaxed);
}

/// The ids a branch gets at a resource of `kind`: a PostgreSQL gid or a MariaDB XID.
pub fn branch_ids(
    kind: ResourceKind,
    gid_prefix: &str,
    gtid: &str,
    bid: &str,
) -> Result<(Option<String>, Option<Xid>), Refusal> {
    Ok(match kind {
        ResourceKind::Postgres => match naming::pg_gid(gid_prefix, gtid, bid) {
            Ok(g) => (Some(g), None),
            Err(e) => return refuse(e.code, e.message),
        },
        ResourceKind::Mariadb => {
            (None, Some(Xid { format_id: naming::XA_FORMAT_ID, gtrid: gtid.to_string(), bqual: bid.to_string() }))
        }
    })
}

/// `server_started`: a MariaDB client's reading of the server's start, taken once on its
/// connection (client mode's restart gate uses it instead of a look of its own when it
/// shows the run the gate knows; enforcement/gate.rs).
pub async fn register(
    c: Operating<'_>,
    fx: &mut Effects,
    gtid: &str,
    resource: &str,
    bid: &str,
    server_started: Option<i64>,
) -> Res<Registered> {
    if let Err(e) = naming::check_id("branch_id", bid) {
        return refuse(e.code, e.message);
    }
    let Some(kind) = c.cfg.kind_of(resource) else {
        return refuse(
            RefusalCode::UnknownResource,
            format!("no resource named {resource:?} in the coordinator's config"),
        );
    };
    let (gid, xid) = branch_ids(kind, &c.cfg.gid_prefix, gtid, bid)?;
    // Would the registration be taken? (Checked before client mode prepares a helper.)
    answers::on(c, gtid, |e| e.tx.check_register(bid)).await?;
    let rc = c.resources[resource].clone();
    let keep = |g: &str, b: &str, prepared: bool| holds::keep_helper(c, g, b, prepared);
    let adm = match c.enforcement.admit(&rc, gtid, bid, &keep, server_started).await {
        Ok(adm) => adm,
        Err(e) => {
            c.metrics.branch_refused(resource, e.code.as_str());
            return Err(e);
        }
    };
    if let Err(e) = answers::on(c, gtid, |e| e.tx.register(bid, resource, kind)).await {
        holds::release_hold(c, gtid, bid).await;
        return Err(e);
    }
    if adm.mode == Mode::Client && kind == ResourceKind::Postgres {
        fx.refill(resource);
    }
    Ok(Registered {
        gtid: gtid.to_string(),
        branch_id: bid.to_string(),
        resource: resource.to_string(),
        kind: kind.into(),
        gid,
        xid,
        enforcement: enforcement_mode(adm.mode),
        shim: adm.key.map(|key| Shim { key, one_phase: adm.one_phase }),
    })
}

/// The admission's mode as the API names it (wire/ stays below participants/).
fn enforcement_mode(m: Mode) -> EnforcementMode {
    match m {
        Mode::Engine => EnforcementMode::Engine,
        Mode::Client => EnforcementMode::Client,
        Mode::None => EnforcementMode::None,
    }
}

pub async fn prepared(c: Operating<'_>, gtid: &str, bid: &str) -> Res<Ack> {
    answers::on(c, gtid, |e| e.tx.prepared(bid)).await?;
    Ok(Ack::branch(gtid, bid, BranchState::Prepared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(timeout_ms(None, 5_000, 60_000), Ok(5_000));
        assert_eq!(timeout_ms(Some(10), 5_000, 60_000), Ok(10));
        assert_eq!(timeout_ms(Some(9), 5_000, 60_000).unwrap_err().code, RefusalCode::InvalidField);
        let e = timeout_ms(Some(60_001), 5_000, 60_000).unwrap_err();
        assert!(e.message.contains("60000"), "{}", e.message);
    }

    #[test]
    fn a_branch_gets_a_gid_or_an_xid() {
        let g = naming::new_gtid("n1", 1, 1);
        let (gid, xid) = branch_ids(ResourceKind::Postgres, "cotx", &g, "b1").unwrap();
        assert_eq!(naming::parse_pg_gid("cotx", gid.as_deref().unwrap()), Some((g.clone(), "b1".to_string())));
        assert!(xid.is_none());
        let (gid, xid) = branch_ids(ResourceKind::Mariadb, "cotx", &g, "b1").unwrap();
        assert!(gid.is_none());
        assert_eq!(
            crate::wire::to_json(&xid),
            serde_json::json!({"format_id": naming::XA_FORMAT_ID, "gtrid": g, "bqual": "b1"})
        );
    }
}

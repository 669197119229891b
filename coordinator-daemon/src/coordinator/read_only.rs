//! The commit of a global transaction whose every branch wrote nothing: decided
//! in memory, no store sync. The client lists its read-only branches with the commit
//! request (`read_only`: each checked before PREPARE, clients/python/cotx/dialect.py);
//! the rule is the protocol crate's (`cotx_protocol::read_only`, which the model checks):
//! every branch listed, else the durable path of commit.rs. Before answering, the store
//! is read once (no sync): a record there (a takeover's abort, written before it rolled
//! back any branch) wins; no record means no branch ended before the last PREPARE, which
//! is what keeps the transaction's reads serializable whatever each branch's ending
//! (the argument: protocol/src/read_only.rs; docs/coordinator.md, "All-read-only
//! transactions").
//!
//! Nothing is written, not even when the branches finish: the entry is not `recorded`,
//! so `Registry::maybe_forget` has no record to delete. After a restart the gtid reads as
//! aborted (presumed abort), the same data for a transaction that wrote nothing.

use crate::config::ResourceKind;
use crate::refusal::RefusalCode;
use crate::state::{refuse, Outcome};
use crate::wire::Decision;
use cotx_protocol::read_only::{self as protocol, CommitPath, Verdict};
use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;

use super::answers::{self, Res};
use super::completion;
use super::effects::Effects;
use super::operating::Operating;
use super::registry::Entry;

/// The branches a client listed read-only with its commit, and which of them hold a
/// client-mode slot (looked up before the registry's lock). An empty list (older
/// clients): the durable path.
pub struct Listed<'r> {
    listed: HashSet<&'r str>,
    in_client_mode: HashSet<&'r str>,
}

impl<'r> Listed<'r> {
    pub fn new(c: Operating<'_>, gtid: &str, read_only: &'r [String]) -> Self {
        let listed: HashSet<&str> = read_only.iter().map(String::as_str).collect();
        let in_client_mode = listed.iter().copied().filter(|b| c.enforcement.holds(gtid, b)).collect();
        Listed { listed, in_client_mode }
    }

    /// The path for this commit, checked against the transaction's branches under the
    /// lock that sees them (commit.rs enters the commit under the same lock).
    pub fn path(&self, e: &Entry, gtid: &str) -> Res<CommitPath> {
        let (listed, in_client_mode) = (&self.listed, &self.in_client_mode);
        if listed.is_empty() {
            return Ok(CommitPath::Durable);
        }
        if let Some(b) = listed.iter().find(|b| !e.tx.branches.iter().any(|x| x.branch_id == **b)) {
            return refuse(
                RefusalCode::UnknownBranch,
                format!("read_only names branch {b:?}, which is not a branch of {gtid}"),
            );
        }
        // A MariaDB branch in client mode is a read-write InnoDB transaction (its slot
        // write), and nothing its client can read in that session says for certain that
        // the application's own statements changed no row (no READ ONLY transaction, and
        // INNODB_TRX is a cache): its "wrote nothing" cannot be checked, so the decision
        // is synced (docs/client-mode.md, "Read-only branches").
        if let Some(b) =
            e.tx.branches
                .iter()
                .find(|x| x.kind == ResourceKind::Mariadb && in_client_mode.contains(x.branch_id.as_str()))
        {
            return refuse(
                RefusalCode::InvalidField,
                format!(
                    "read_only names branch {:?}, a MariaDB branch in client mode: its slot write makes it a \
                     read-write transaction and whether the application wrote cannot be checked, so it \
                     cannot be committed without a synced decision; commit it without read_only",
                    b.branch_id
                ),
            );
        }
        Ok(protocol::commit_path(e.tx.branches.iter().map(|b| listed.contains(b.branch_id.as_str()))))
    }
}

/// An all-read-only transaction, entered Committing by commit.rs: decided after one read
/// of the store (the protocol's `in_memory_commit`), nothing written.
pub async fn decide(c: Operating<'_>, fx: &mut Effects, gtid: &str) -> Res<Decision> {
    let stored = match answers::read_store(c, gtid).await {
        Ok(s) => s,
        Err(why) => {
            // Nothing written and nothing answered: abort in memory (a read-only
            // transaction loses nothing), so it does not wait for a write nobody makes.
            abort_in_memory(c, fx, gtid, "the decision store could not be read for an all-read-only commit");
            return Err(why);
        }
    };
    match protocol::in_memory_commit(stored.view()) {
        Verdict::Commit => {
            let settled = answers::peek(c, gtid, |e| {
                e.tx.settle(Outcome::Commit, String::new);
                e.publish();
            });
            if settled.is_some() {
                c.metrics.read_only_commits.fetch_add(1, Relaxed);
                completion::count_decision(c.metrics, Outcome::Commit);
                fx.complete(gtid);
            }
            Ok(Decision::new(gtid, Outcome::Commit.into()))
        }
        Verdict::Decided(o) => {
            completion::apply_decision(c.registry, c.metrics, fx, gtid, o);
            Ok(Decision::new(gtid, o.into()))
        }
        Verdict::Refuse => {
            abort_in_memory(c, fx, gtid, "its record is unreadable or below its epoch's purge watermark");
            refuse(RefusalCode::OutcomeForgotten, format!("{gtid}: the store cannot say that nobody decided it (unreadable, or below its epoch's purge watermark); aborted"))
        }
    }
}

fn abort_in_memory(c: Operating<'_>, fx: &mut Effects, gtid: &str, reason: &str) {
    let newly = answers::peek(c, gtid, |e| {
        e.tx.abort(reason.to_string(), false);
        e.publish();
    });
    if newly.is_some() {
        c.metrics.aborted.fetch_add(1, Relaxed);
        fx.complete(gtid);
    }
}

#[cfg(test)]
mod tests {
    use crate::refusal::RefusalCode;
    use crate::state::Outcome;
    use crate::store::DecisionRecord;
    use crate::wire::Decided;
    use std::sync::atomic::Ordering::Relaxed;

    async fn two_branches(c: &crate::coordinator::Coordinator) -> String {
        let g = c.begin(None).unwrap().gtid;
        for b in ["b1", "b2"] {
            c.register(&g, "pg", b).await.unwrap();
        }
        g
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_branch_listed_commits_in_memory_and_nothing_else_does() {
        let c = crate::coordinator::tests::coord("read-only").await;
        let both = ["b1".to_string(), "b2".to_string()];
        let g = two_branches(&c).await;
        let e = c.commit_read_only(&g, &both, &["zz".into()]).await.unwrap_err();
        assert_eq!(e.code, RefusalCode::UnknownBranch, "a listed branch that is not one of the transaction's");
        let r = c.commit_read_only(&g, &both, &both).await.unwrap();
        assert_eq!(r.decision, Decided::Commit);
        assert!(c.store.load().await.unwrap().records.is_empty(), "nothing written for an all-read-only commit");
        assert_eq!(c.parts().metrics.read_only_commits.load(Relaxed), 1);
        c.finished_many(&g, &both, Outcome::Commit).await.unwrap();
        assert!(c.store.load().await.unwrap().records.is_empty(), "nor when its branches finish");

        // One branch not listed (it wrote): the durable path.
        let g = two_branches(&c).await;
        let r = c.commit_read_only(&g, &both, &["b1".into()]).await.unwrap();
        assert_eq!(r.decision, Decided::Commit);
        assert_eq!(c.store.load().await.unwrap().records.len(), 1, "the decision is recorded");
        assert_eq!(c.parts().metrics.read_only_commits.load(Relaxed), 1);

        // A record already there (a takeover's abort, written before its rollbacks) wins.
        let g = two_branches(&c).await;
        let rec = DecisionRecord {
            gtid: g.clone(),
            outcome: Outcome::Abort,
            branches: vec![("pg".into(), "b1".into())],
            decided_unix_ms: 1,
            node: "u1".into(),
            source: "takeover".into(),
        };
        c.store.decide(rec, None).await.unwrap();
        let r = c.commit_read_only(&g, &both, &both).await.unwrap();
        assert_eq!(r.decision, Decided::Abort);
        assert_eq!(c.parts().metrics.read_only_commits.load(Relaxed), 1);
    }
}

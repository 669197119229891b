//! The daemon's statements on prepared branches, and what a database's answer to them
//! means (`Completion`): pure, so every case is tested without a database. The I/O is
//! resources.rs.

use crate::naming;
use crate::state::Outcome;

/// What happened when the daemon tried to finish a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// We committed / rolled it back.
    Done,
    /// Not prepared there (any more): somebody finished it before us.
    Gone,
    /// MariaDB: the owner's session still holds it; try again later.
    OwnerAttached,
    /// Finished, but not as decided (MariaDB 1402 on a read-only branch lost with its
    /// session). Recorded, never retried.
    Incident(String),
    /// Database unreachable or another error: retry with backoff.
    Retry(String),
}

/// The name of a node's lock at a resource (advisory lock, GET_LOCK).
pub fn lock_name(prefix: &str, node: &str) -> String {
    format!("cotx-node:{prefix}:{node}")
}

/// PostgreSQL: this database's prepared transactions of ours (pg_prepared_xacts lists
/// every database's; COMMIT PREPARED of another's fails with "belongs to another database").
pub fn pg_list_prepared(prefix: &str) -> String {
    format!(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE {}",
        naming::quote_pg(&format!("{prefix}:%"))
    )
}

/// PostgreSQL: COMMIT / ROLLBACK PREPARED of a branch. Err: its ids make no gid.
pub fn pg_finish(prefix: &str, gtid: &str, bid: &str, outcome: Outcome) -> Result<String, String> {
    let gid = naming::pg_gid(prefix, gtid, bid).map_err(|e| e.message)?;
    let verb = match outcome {
        Outcome::Commit => "COMMIT PREPARED",
        Outcome::Abort => "ROLLBACK PREPARED",
    };
    Ok(format!("{verb} {}", naming::quote_pg(&gid)))
}

/// PostgreSQL's refusal of a COMMIT / ROLLBACK PREPARED, by SQLSTATE.
pub fn pg_refused(sqlstate: Option<&str>, error: String) -> Completion {
    match sqlstate {
        // undefined_object: no such prepared transaction (finished already).
        Some("42704") => Completion::Gone,
        // object_in_use: its owner is finishing it right now.
        Some("55000") => Completion::OwnerAttached,
        _ => Completion::Retry(error),
    }
}

/// MariaDB: XA COMMIT / XA ROLLBACK of a branch. Err: its ids make no XID.
pub fn maria_finish(gtid: &str, bid: &str, outcome: Outcome) -> Result<String, String> {
    let xid = naming::xa_xid_sql(gtid, bid).map_err(|e| e.message)?;
    let verb = match outcome {
        Outcome::Commit => "XA COMMIT",
        Outcome::Abort => "XA ROLLBACK",
    };
    Ok(format!("{verb} {xid}"))
}

/// MariaDB's refusal of an XA COMMIT / XA ROLLBACK, by error code.
pub fn maria_refused(resource: &str, code: u16, message: &str, sqlstate: &str, outcome: Outcome) -> Completion {
    match (code, outcome) {
        (1397 | 1399 | 1440, _) => Completion::OwnerAttached,
        // XA_RBROLLBACK and friends (1402..=1404, 1614): the branch was rolled back behind
        // our back (read-only branch whose session closed).
        (1402..=1404 | 1614, Outcome::Commit) => {
            Completion::Incident(format!("{resource}: {message} ({code}): branch was rolled back, not committed"))
        }
        (1402..=1404 | 1614, Outcome::Abort) => Completion::Done,
        _ => Completion::Retry(format!("{resource}: {message} (error {code}, SQLSTATE {sqlstate})")),
    }
}

/// A MariaDB branch of a commit, gone unreported: lost in a restart unless the server has
/// certainly been up longer than the branch has been prepared (or, not known, the decision
/// is old), otherwise finished by its owner. A read-only branch is lost in any restart
/// after its PREPARE, before the decision too. `Uptime` counts whole seconds between two
/// truncated clock readings: it may read up to a second more than the server has been up,
/// so only an `Uptime` over that age by a whole second proves the server was up before (a
/// restart within a second of the decision read as "up before it" lost its incident: a
/// test flake).
pub fn maria_gone(resource: &str, uptime_s: Option<u64>, prepared_ms_ago: u64) -> Completion {
    match uptime_s {
        Some(secs) if secs * 1000 < prepared_ms_ago + 1000 => Completion::Incident(format!(
            "{resource}: branch is gone and MariaDB restarted ({secs} s ago, in whole seconds) after the branch was prepared ({prepared_ms_ago} ms ago) or about then, \
             without its owner reporting it finished: a read-only branch is lost in a restart (its reads were not protected until the decision)",
        )),
        _ => Completion::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_branch_and_refuse_ids_that_make_none() {
        let g = naming::new_gtid("n1", 1, 1);
        let gid = naming::pg_gid("cotx", &g, "b1").unwrap();
        assert_eq!(pg_finish("cotx", &g, "b1", Outcome::Commit).unwrap(), format!("COMMIT PREPARED '{gid}'"));
        assert_eq!(pg_finish("cotx", &g, "b1", Outcome::Abort).unwrap(), format!("ROLLBACK PREPARED '{gid}'"));
        assert!(pg_finish("cotx", &g, &"b".repeat(300), Outcome::Commit).is_err());
        let xid = naming::xa_xid_sql(&g, "b1").unwrap();
        assert_eq!(maria_finish(&g, "b1", Outcome::Commit).unwrap(), format!("XA COMMIT {xid}"));
        assert_eq!(maria_finish(&g, "b1", Outcome::Abort).unwrap(), format!("XA ROLLBACK {xid}"));
        assert!(pg_list_prepared("cotx").ends_with("gid LIKE 'cotx:%'"));
        assert_eq!(lock_name("cotx", "n1"), "cotx-node:cotx:n1");
    }

    #[test]
    fn postgres_answers() {
        assert_eq!(pg_refused(Some("42704"), "x".into()), Completion::Gone);
        assert_eq!(pg_refused(Some("55000"), "x".into()), Completion::OwnerAttached);
        assert_eq!(pg_refused(Some("08006"), "down".into()), Completion::Retry("down".into()));
        assert_eq!(pg_refused(None, "io".into()), Completion::Retry("io".into()));
    }

    #[test]
    fn mariadb_answers() {
        for code in [1397, 1399, 1440] {
            assert_eq!(maria_refused("m", code, "x", "XAE04", Outcome::Commit), Completion::OwnerAttached);
        }
        for code in [1402, 1403, 1404, 1614] {
            assert!(
                matches!(maria_refused("m", code, "rb", "XA100", Outcome::Commit), Completion::Incident(m) if m.contains("rolled back, not committed"))
            );
            assert_eq!(maria_refused("m", code, "rb", "XA100", Outcome::Abort), Completion::Done);
        }
        assert!(
            matches!(maria_refused("m", 2013, "lost", "HY000", Outcome::Commit), Completion::Retry(m) if m.contains("error 2013"))
        );
    }

    #[test]
    fn a_mariadb_branch_gone_after_a_restart_is_an_incident() {
        assert!(matches!(maria_gone("m", Some(5), 10_000), Completion::Incident(_)), "up 5 s, prepared 10 s ago");
        assert_eq!(maria_gone("m", Some(20), 10_000), Completion::Gone);
        assert_eq!(maria_gone("m", None, 10_000), Completion::Gone);
        // Uptime reads whole seconds: 2 s may be 1.01 s up, restarted after a branch prepared
        // 1.6 s ago. Read as "up before it" before (the branch "finished by its owner").
        assert!(
            matches!(maria_gone("m", Some(2), 1_600), Completion::Incident(_)),
            "up 2 s (whole), prepared 1.6 s ago"
        );
        assert!(matches!(maria_gone("m", Some(11), 10_001), Completion::Incident(_)), "not a whole second over");
        assert_eq!(maria_gone("m", Some(11), 10_000), Completion::Gone, "a whole second over: up before it");
    }
}

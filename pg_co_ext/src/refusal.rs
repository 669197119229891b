//! The errors pg_co raises. Rule refusals are SQLSTATE 40001 so that clients retry;
//! precondition errors are not retryable and say what to change.

use crate::gucs;
use crate::shmem::{self, Counter};
use pg_co_rules::{state_name, Peer, PeerState, Point, Verdict};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::spi::Spi;

pub enum Refusal {
    NotSerializable,
    ReadOnly,
    WaitTimeout,
    Rule(Point, Verdict),
    /// co.decide outside SERIALIZABLE / in a READ ONLY transaction, or followed by PREPARE.
    DecisionNotSerializable,
    DecisionReadOnly,
    DecisionPrepared,
    /// co.decide found the gtid already decided (recovery resolved it as abort).
    AlreadyDecided(String),
}

fn point_name(p: Point) -> &'static str {
    match p {
        Point::Prepare => "PREPARE TRANSACTION",
        Point::LocalCommit => "COMMIT",
        Point::Decision => "COMMIT of a global decision (co.decide)",
    }
}

/// "transaction 1234 (gid 'g1', prepared (in doubt))"
fn describe(peer: &Peer, st: PeerState) -> String {
    let gid = if matches!(st, PeerState::InDoubt) { gid_of(peer.xid) } else { None };
    match gid {
        Some(g) => format!("transaction {} (gid '{}', {})", peer.xid, g.replace('\'', "''"), state_name(st)),
        None if peer.xid == 0 => format!("a transaction without xid ({}, pid {})", state_name(st), peer.pid),
        None => format!("transaction {} ({})", peer.xid, state_name(st)),
    }
}

/// Only on the error path: the transaction is still open, so a catalog query is fine once
/// it has an active snapshot (commit callbacks run without one; pg_prepared_xacts reads
/// shared memory, so which snapshot does not matter).
fn gid_of(xid: u32) -> Option<String> {
    unsafe {
        let pushed = !pg_sys::ActiveSnapshotSet();
        if pushed {
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        let gid = Spi::get_one::<String>(&format!("SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE transaction = '{xid}'::xid"))
            .ok()
            .flatten();
        if pushed {
            pg_sys::PopActiveSnapshot();
        }
        gid
    }
}

pub fn raise(r: Refusal) -> ! {
    let serialization = PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE;
    let report = match r {
        Refusal::NotSerializable => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "pg_co refused PREPARE TRANSACTION: the transaction is not SERIALIZABLE",
            "pg_co",
        )
        .set_detail("Commitment ordering needs PostgreSQL's rw-conflict tracking, which only serializable transactions have.")
        .set_hint("Start 2PC branches with BEGIN ISOLATION LEVEL SERIALIZABLE (or set default_transaction_isolation), or set pg_co.require_serializable = off to accept unprotected branches."),
        Refusal::ReadOnly => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "pg_co refused PREPARE TRANSACTION: the transaction is READ ONLY",
            "pg_co",
        )
        .set_detail("PostgreSQL stops tracking the rw-conflicts of a READ ONLY serializable transaction (its edges go when writers commit, or its snapshot is declared safe), so commitment ordering cannot be checked.")
        .set_hint("Run the branch as READ WRITE (the default): it then reads under full tracking and costs the same."),
        Refusal::WaitTimeout => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
            "pg_co: lock_timeout expired while waiting for an in-doubt transaction (rule B)",
            "pg_co",
        ),
        Refusal::DecisionNotSerializable => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "pg_co refused co.decide: the transaction is not SERIALIZABLE",
            "pg_co",
        )
        .set_detail("The commit that carries a global decision is checked as this branch's prepare, which needs PostgreSQL's rw-conflict tracking.")
        .set_hint("Start the decision branch with BEGIN ISOLATION LEVEL SERIALIZABLE."),
        Refusal::DecisionReadOnly => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "pg_co refused co.decide: the transaction is READ ONLY",
            "pg_co",
        )
        .set_detail("The decision is a row written in this transaction, and a READ ONLY serializable transaction loses its rw-conflict tracking.")
        .set_hint("Run the decision branch as READ WRITE (the default)."),
        Refusal::DecisionPrepared => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "pg_co refused PREPARE TRANSACTION: the transaction called co.decide",
            "pg_co",
        )
        .set_detail("A transaction that carries the global decision commits in one phase; prepared, its decision would be undecided.")
        .set_hint("COMMIT the decision branch, or PREPARE it without calling co.decide."),
        Refusal::AlreadyDecided(gtid) => ErrorReport::new(
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            format!("pg_co refused co.decide: global transaction '{}' is already decided", gtid.replace('\'', "''")),
            "pg_co",
        )
        .set_detail("Recovery resolved it (co.resolve) before this decision, so it is aborted.")
        .set_hint("Roll back and retry the global transaction under a new id."),
        Refusal::Rule(point, v) => {
            let (counter, msg, detail) = match v {
                Verdict::RuleAOutEdge(p, st) => (
                    Counter::RefusedRuleA,
                    format!("pg_co refused {}: commitment ordering rule A", point_name(point)),
                    format!("This transaction read data that {} overwrote; it would have to commit before that transaction, which already reached its commit point.", describe(&p, st)),
                ),
                Verdict::RuleASummarized => (
                    Counter::RefusedSummarized,
                    format!("pg_co refused {}: commitment ordering rule A (summarized conflicts)", point_name(point)),
                    "PostgreSQL summarized this transaction's rw-conflicts under memory pressure; pg_co cannot prove the prepare safe.".to_string(),
                ),
                Verdict::RuleBInDoubtReader(p, st) => (
                    Counter::RefusedRuleB,
                    format!("pg_co refused {}: commitment ordering rule B", point_name(point)),
                    format!("{} read data that this transaction overwrote; this transaction may reach its commit point only after that one is decided.", capitalize(&describe(&p, st))),
                ),
                Verdict::RuleCStaleLocalRead(p, st) => (
                    Counter::RefusedRuleC,
                    // Only at a local COMMIT: at a decision commit rule A refuses first.
                    "pg_co refused COMMIT: commitment ordering rule C".to_string(),
                    format!("This local transaction missed a write of {}, which was prepared before this transaction's snapshot; other commits in that snapshot may depend on it.", describe(&p, st)),
                ),
                Verdict::Allow => unreachable!("an allowed transaction is not refused"),
            };
            shmem::bump(counter, 1);
            if gucs::LOG_VETOES.get() {
                pgrx::log!("{msg}: {detail}");
            }
            let hint = if matches!(v, Verdict::RuleBInDoubtReader(..)) {
                "Retry the transaction, or set pg_co.conflict_action = 'wait' to wait for the in-doubt transaction's outcome."
            } else {
                "Retry the transaction."
            };
            ErrorReport::new(serialization, msg, "pg_co").set_detail(detail).set_hint(hint)
        }
    };
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default()
}

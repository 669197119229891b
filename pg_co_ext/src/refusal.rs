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
    /// A rule refusal without a context (rule C for READ ONLY readers: no wait, no edge).
    Rule(Point, Verdict),
    /// co.decide outside SERIALIZABLE / in a READ ONLY transaction, or followed by PREPARE.
    DecisionNotSerializable,
    DecisionReadOnly,
    DecisionPrepared,
    /// co.decide found the gtid already decided (recovery resolved it as abort).
    AlreadyDecided(String),
    /// A rule refusal with what the check saw besides the blocker.
    RuleWith(Point, Verdict, Context),
}

/// What the refused check met besides its blocker (for the DETAIL's blocker line).
#[derive(Clone, Copy, Default)]
pub struct Context {
    /// This transaction's rw-conflicts were partly summarized by PostgreSQL.
    pub summarized: bool,
    /// How long rule B waited for the blocker before refusing (pg_co.max_wait).
    pub waited_ms: Option<u64>,
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
    match gid_for(peer, st) {
        Some(g) => format!("transaction {} (gid '{}', {})", peer.xid, g.replace('\'', "''"), state_name(st)),
        None if peer.xid == 0 => format!("a transaction without xid ({}, pid {})", state_name(st), peer.pid),
        None => format!("transaction {} ({})", peer.xid, state_name(st)),
    }
}

/// The gid of a peer that went through (or is in) PREPARE TRANSACTION: pg_co's own record
/// first (it also knows committed and still-preparing ones), pg_prepared_xacts for one
/// recovered after a restart.
fn gid_for(peer: &Peer, st: PeerState) -> Option<String> {
    if !matches!(st, PeerState::InDoubt | PeerState::Preparing | PeerState::Committed { two_phase: true }) {
        return None;
    }
    crate::gids::lookup(peer.xid).or_else(|| if st == PeerState::InDoubt { gid_of(peer.xid) } else { None })
}

/// State names of the blocker line (one word each).
fn state_word(st: PeerState) -> &'static str {
    match st {
        PeerState::Active => "active",
        PeerState::Preparing => "preparing",
        PeerState::Committing => "committing",
        PeerState::InDoubt => "in_doubt",
        PeerState::Committed { two_phase: true } => "committed_2pc",
        PeerState::Committed { two_phase: false } => "committed",
        PeerState::RolledBack => "rolled_back",
    }
}

/// The DETAIL's last line, for tools that classify refusals (bench/harness/refusal_breakdown.py):
/// "pg_co blocker: rule=B point=PREPARE xid=741 gid='p:1:0' pid=0 state=in_doubt summarized=no waited_ms=0";
/// absent values are "-", gid is quoted with '' doubling.
fn blocker_line(point: Point, v: &Verdict, ctx: &Context) -> String {
    let (rule, peer) = match v {
        Verdict::RuleAOutEdge(p, st) => ("A", Some((p, *st))),
        Verdict::RuleASummarized => ("A", None),
        Verdict::RuleBInDoubtReader(p, st) => ("B", Some((p, *st))),
        Verdict::RuleCStaleLocalRead(p, st) => ("C", Some((p, *st))),
        Verdict::RuleSSummarizedReader(out) => ("S", out.as_ref().map(|(p, st)| (p, *st))),
        Verdict::RuleCReadOnly(_) => ("C", None),
        Verdict::Allow => ("-", None),
    };
    let point = match point {
        Point::Prepare => "PREPARE",
        Point::LocalCommit => "COMMIT",
        Point::Decision => "DECISION",
    };
    let dash = || "-".to_string();
    let (xid, gid, pid, state) = match (peer, v) {
        // No SSI peer: what pg_co's commit records tell of the transaction it missed.
        (_, Verdict::RuleCReadOnly(m)) => (
            if m.xid != 0 { m.xid.to_string() } else { dash() },
            (if m.xid == 0 { None } else { crate::gids::lookup(m.xid) })
                .map_or_else(dash, |g| format!("'{}'", g.replace('\'', "''"))),
            "0".to_string(),
            (if m.in_flight { "committing" } else { "committed_2pc" }).to_string(),
        ),
        (Some((p, st)), _) => (
            if p.xid != 0 { p.xid.to_string() } else { dash() },
            gid_for(p, st).map_or_else(dash, |g| format!("'{}'", g.replace('\'', "''"))),
            p.pid.to_string(),
            state_word(st).to_string(),
        ),
        (None, _) => (dash(), dash(), dash(), dash()),
    };
    format!(
        "pg_co blocker: rule={rule} point={point} xid={xid} gid={gid} pid={pid} state={state} summarized={} waited_ms={}",
        if ctx.summarized || matches!(v, Verdict::RuleASummarized | Verdict::RuleSSummarizedReader(None)) { "yes" } else { "no" },
        ctx.waited_ms.unwrap_or(0)
    )
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
        let gid = Spi::get_one::<String>(&format!(
            "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE transaction = '{xid}'::xid"
        ))
        .ok()
        .flatten();
        if pushed {
            pg_sys::PopActiveSnapshot();
        }
        gid
    }
}

/// The counters of a refusal of a rule or a precondition: when raised, and when only
/// observed (pg_co.observe_only). None for the other errors (co.decide misuse, lock_timeout).
fn counters(r: &Refusal) -> Option<(Counter, Counter)> {
    Some(match r {
        Refusal::NotSerializable => (Counter::RefusedNotSerializable, Counter::ObservedNotSerializable),
        Refusal::ReadOnly => (Counter::RefusedReadOnly, Counter::ObservedReadOnly),
        Refusal::Rule(_, v) | Refusal::RuleWith(_, v, _) => match v {
            Verdict::RuleAOutEdge(..) => (Counter::RefusedRuleA, Counter::ObservedRuleA),
            Verdict::RuleASummarized => (Counter::RefusedSummarized, Counter::ObservedSummarized),
            Verdict::RuleBInDoubtReader(..) => (Counter::RefusedRuleB, Counter::ObservedRuleB),
            Verdict::RuleCStaleLocalRead(..) | Verdict::RuleCReadOnly(_) => {
                (Counter::RefusedRuleC, Counter::ObservedRuleC)
            }
            Verdict::RuleSSummarizedReader(..) => (Counter::RefusedRuleS, Counter::ObservedRuleS),
            Verdict::Allow => return None,
        },
        _ => return None,
    })
}

/// A rule's or precondition's refusal. Enforcing: raised (does not return). Observe-only
/// (pg_co.observe_only): counted as observed and logged with both transactions, and the
/// caller carries on as if the check had passed. Other errors are always raised.
pub fn refuse(r: Refusal) {
    if gucs::OBSERVE_ONLY.get() {
        if let Some((_, observed)) = counters(&r) {
            shmem::bump(observed, 1);
            let report = build(r);
            let me = match crate::gids::own() {
                Some(g) => format!("gid '{}'", g.replace('\'', "''")),
                None => "no gid".to_string(),
            };
            let xid = unsafe { pg_sys::GetTopTransactionIdIfAny() }.into_inner();
            pgrx::log!(
                "pg_co observe-only, not refused: {} (this transaction: xid {xid}, {me})\n{}",
                report.message(),
                report.detail().unwrap_or("")
            );
            return;
        }
    }
    raise(r)
}

/// Raises `r` as an ERROR: the transaction is rolled back.
pub fn raise(r: Refusal) -> ! {
    let counted = counters(&r);
    if let Some((refused, _)) = counted {
        shmem::bump(refused, 1);
    }
    let report = build(r);
    if counted.is_some() && gucs::LOG_VETOES.get() {
        pgrx::log!("{}: {}", report.message(), report.detail().unwrap_or(""));
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ERROR does not return")
}

/// The error a refusal raises (also what observe-only logs).
fn build(r: Refusal) -> ErrorReport {
    match r {
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
        Refusal::Rule(point, v) => rule_report(point, v, Context::default()),
        Refusal::RuleWith(point, v, ctx) => rule_report(point, v, ctx),
    }
}

fn rule_report(point: Point, v: Verdict, ctx: Context) -> ErrorReport {
    let serialization = PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE;
    let (msg, detail) = match v {
        Verdict::RuleAOutEdge(p, st) => (
            format!("pg_co refused {}: commitment ordering rule A", point_name(point)),
            format!("This transaction read data that {} overwrote; it would have to commit before that transaction, which already reached its commit point.", describe(&p, st)),
        ),
        Verdict::RuleASummarized => (
            format!("pg_co refused {}: commitment ordering rule A (summarized conflicts)", point_name(point)),
            "PostgreSQL summarized this transaction's rw-conflicts under memory pressure; pg_co cannot prove the prepare safe.".to_string(),
        ),
        Verdict::RuleBInDoubtReader(p, st) => (
            format!("pg_co refused {}: commitment ordering rule B", point_name(point)),
            format!("{} read data that this transaction overwrote; this transaction may reach its commit point only after that one is decided.", capitalize(&describe(&p, st))),
        ),
        Verdict::RuleCStaleLocalRead(p, st) => (
            // Only at a local COMMIT: at a decision commit rule A refuses first.
            "pg_co refused COMMIT: commitment ordering rule C".to_string(),
            format!("This local transaction missed a write of {}, which was prepared before this transaction's snapshot; other commits in that snapshot may depend on it.", describe(&p, st)),
        ),
        Verdict::RuleCReadOnly(m) => {
            let who = if m.xid == 0 {
                "a 2PC transaction pg_co no longer remembers individually".to_string()
            } else {
                match crate::gids::lookup(m.xid) {
                    Some(g) => format!("transaction {} (gid '{}')", m.xid, g.replace('\'', "''")),
                    None => format!("transaction {}", m.xid),
                }
            };
            (
                // Only at a local COMMIT (decide_read_only applies nowhere else).
                "pg_co refused COMMIT: commitment ordering rule C (READ ONLY reader)".to_string(),
                format!("This READ ONLY transaction's snapshot missed {who}, which was prepared before it and committed through COMMIT PREPARED since; other commits in that snapshot may depend on it, and PostgreSQL does not keep a READ ONLY transaction's rw-conflicts to tell whether it read that transaction's data."),
            )
        }
        Verdict::RuleSSummarizedReader(out) => (
            "pg_co refused COMMIT: rule S (a reader PostgreSQL summarized)".to_string(),
            format!(
                "PostgreSQL summarized a transaction that ran concurrently with this one (its pool of serializable transactions was full) and no longer checks that transaction's reads against this one's writes; this transaction also read data that {} overwrote, so committing it could complete a cycle PostgreSQL does not see.",
                match out {
                    Some((p, st)) => describe(&p, st),
                    None => "a transaction PostgreSQL summarized as well".to_string(),
                }
            ),
        ),
        Verdict::Allow => unreachable!("an allowed transaction is not refused"),
    };
    let waited = match ctx.waited_ms {
        Some(ms) => format!(" Waited {ms} ms for its decision (pg_co.max_wait)."),
        None => String::new(),
    };
    let detail = format!("{detail}{waited}\n{}", blocker_line(point, &v, &ctx));
    let hint = if matches!(v, Verdict::RuleBInDoubtReader(..)) {
        "Retry the transaction, or raise pg_co.max_wait (or set pg_co.conflict_action = 'wait') to wait for the in-doubt transaction's outcome."
    } else {
        "Retry the transaction."
    };
    ErrorReport::new(serialization, msg, "pg_co").set_detail(detail).set_hint(hint)
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default()
}

#![cfg(test)]
//! The log store against the SQLite store (the same answers, op by op), and its file:
//! replay, a torn last batch at every byte, damage in the middle, compaction and a crash
//! around its rename, a newer format, a second opener.

use super::*;
use crate::state::Outcome;
use crate::store::sqlite::SqliteLog;

use crate::store::testkit::{rec, tmpdir};

/// The default sync method (direct writes, where the file system takes them).
fn open_log(p: &str) -> Result<AppLog, StoreError> {
    AppLog::open(p, SyncMethod::Direct)
}

fn g(seq: u32) -> String {
    format!("n.00000000000a-{seq:x}")
}

/// Everything a store answers, except what differs by nature (the random store id, lease
/// times by the clock).
fn answers(l: &mut dyn DecisionLog) -> String {
    let gets: Vec<Stored> = (1..12).map(|i| l.get(&g(i)).unwrap()).collect();
    let other = l.get("n.00000000000b-1").unwrap();
    let ld = l.load().unwrap();
    let nodes: Vec<(String, String, String)> =
        l.nodes().unwrap().into_iter().map(|n| (n.node, n.holder, n.url)).collect();
    let id = l.identity().unwrap();
    format!(
        "gets {gets:?}\nother {other:?}\nload {:?} {:?} {:?}\nnodes {nodes:?}\nid {} {}\naudit {:?}",
        ld.records,
        ld.corrupt,
        ld.epochs,
        id.restores,
        id.tick,
        l.audit_log().unwrap()
    )
}

/// One script of every op, run on a store; every answer along the way, then the state.
fn script(l: &mut dyn DecisionLog) -> Vec<String> {
    let mut out = vec![];
    let mut w = |l: &mut dyn DecisionLog, ops: Vec<Op>| out.push(format!("{:?}", l.write_batch(&ops).unwrap()));
    w(l, vec![Op::RegisterEpoch { node: "n".into(), nonce: 10 }, Op::RegisterEpoch { node: "n".into(), nonce: 10 }]);
    let Claim::Granted(g1) = l.claim_node("n", "a", "http://a", 60_000, false).unwrap() else { panic!() };
    let old = Token { holder: "a".into(), generation: g1 };
    let Claim::Granted(g2) = l.claim_node("n", "a", "http://a", 60_000, false).unwrap() else { panic!() };
    let new = Token { holder: "a".into(), generation: g2 };
    let mut out2 = vec![format!("{g1} {g2} {:?} {:?}", l.renew_node("n", &old, 1000), l.renew_node("n", &new, 1000))];
    w(
        l,
        vec![
            Op::Decide(rec(&g(1), Outcome::Commit), Some(new.clone())),
            Op::Decide(rec(&g(1), Outcome::Abort), None),
            Op::Decide(rec(&g(2), Outcome::Commit), Some(old.clone())),
            Op::Decide(rec(&g(3), Outcome::Commit), None),
            Op::Decide(rec(&g(5), Outcome::Abort), None),
            Op::Decide(rec(&g(9), Outcome::Commit), None),
            Op::Forget(g(3)),
            Op::Forget(g(3)),
            Op::Forget(g(5)),
            Op::Forget("none".into()),
            Op::Audit(AuditEntry {
                at_unix_ms: 7,
                gtid: g(9),
                outcome: "commit".into(),
                operator: "op".into(),
                reason: "why".into(),
                result: "ok".into(),
            }),
        ],
    );
    // Not old enough: kept. Then old enough (finished before now - 0).
    w(l, vec![Op::Purge { older_than_ms: 60_000 }]);
    std::thread::sleep(std::time::Duration::from_millis(5));
    w(
        l,
        vec![
            Op::Purge { older_than_ms: 0 },
            Op::Decide(rec(&g(4), Outcome::Commit), None),
            Op::Decide(rec(&g(6), Outcome::Abort), None),
            Op::Overwrite(rec(&g(9), Outcome::Abort)),
            Op::Decide(rec(&g(7), Outcome::Commit), None),
            Op::Forget(g(7)),
        ],
    );
    out2.push(answers(l));
    l.release_node("n", "b", false).unwrap();
    out2.push(answers(l));
    let r = l.mark_restored().unwrap();
    out2.push(format!("{r:?}"));
    w(l, vec![Op::Decide(rec(&g(8), Outcome::Commit), None), Op::RegisterEpoch { node: "n".into(), nonce: 11 }]);
    let Claim::Granted(g3) = l.claim_node("n", "a", "http://a", 60_000, false).unwrap() else { panic!() };
    out2.push(format!("{}", g3 > g2 + RESTORE_GRANT_JUMP - 1));
    l.release_node("n", "a", false).unwrap();
    out2.push(answers(l));
    out.extend(out2);
    out
}

/// The log store answers every op exactly as the SQLite store does, and gives the same
/// state back after a reopen (replay).
#[test]
fn same_answers_as_the_sqlite_store() {
    let d = tmpdir("log-same");
    let mut s = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    let path = d.join("d.log");
    let mut l = open_log(path.to_str().unwrap()).unwrap();
    let want = script(&mut s);
    assert_eq!(script(&mut l), want);
    assert!(want.iter().any(|x| x.contains("Fenced")) && want.iter().any(|x| x.contains("Forgotten")), "{want:?}");
    let (a, id) = (answers(&mut l), l.identity().unwrap());
    assert_eq!(a, answers(&mut s));
    drop(l);
    let mut l = open_log(path.to_str().unwrap()).unwrap();
    assert_eq!(answers(&mut l), a, "replayed");
    assert_eq!(l.identity().unwrap(), id);
    assert_eq!(id.store_id.len(), 32);
}

/// A row that cannot be read (here written straight into the log) is never an abort.
#[test]
fn unreadable_rows_are_not_aborts() {
    let d = tmpdir("log-corruptrow");
    let mut l = open_log(d.join("d.log").to_str().unwrap()).unwrap();
    let bad = |outcome: &str, branches: &str| Rec::Decision {
        gtid: format!("bad-{outcome}"),
        outcome: outcome.into(),
        branches: branches.into(),
        decided_ms: 1,
        node: "n".into(),
        source: "coordinator".into(),
        finished_ms: None,
    };
    l.commit(&[bad("comit", "[]"), bad("commit", "garbage")]).unwrap();
    let got = l.load().unwrap();
    assert_eq!(got.corrupt.len(), 2, "{got:?}");
    let r = l.write_batch(&[Op::Decide(rec("bad-comit", Outcome::Abort), None)]).unwrap();
    assert!(matches!(&r[0], OpResult::Corrupt(m) if m.contains("comit")), "{r:?}");
    l.write_batch(&[Op::Overwrite(rec("bad-comit", Outcome::Commit))]).unwrap();
    assert_eq!(l.get("bad-comit").unwrap(), Stored::Record(rec("bad-comit", Outcome::Commit)));
}

fn batch(prefix: &str, n: usize) -> Vec<Op> {
    (0..n).map(|i| Op::Decide(rec(&format!("{prefix}{i}"), Outcome::Commit), None)).collect()
}

/// A crash in the middle of the last batch's write, cut at every byte: the log opens,
/// every acknowledged batch is there, the torn one is gone whole, and the log goes on.
#[test]
fn a_torn_last_batch_is_dropped_whole_at_every_byte() {
    let d = tmpdir("log-torn");
    let path = d.join("d.log");
    let mut l = open_log(path.to_str().unwrap()).unwrap();
    l.write_batch(&batch("a", 5)).unwrap();
    let before = l.end() as usize;
    l.write_batch(&batch("b", 5)).unwrap();
    let after = l.end() as usize;
    drop(l);
    let whole = std::fs::read(&path).unwrap();
    let crash = d.join("crash.log");
    for cut in before..after {
        // What was on disk: the torn batch's first bytes, zeros after (preallocated).
        let mut bytes = whole.clone();
        bytes[cut..after].iter_mut().for_each(|b| *b = 0);
        std::fs::write(&crash, &bytes).unwrap();
        let mut l = open_log(crash.to_str().unwrap()).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let got: Vec<String> = l.load().unwrap().records.into_iter().map(|r| r.gtid).collect();
        assert_eq!(got.len(), 5, "cut at {cut}: {got:?}");
        assert!(got.iter().all(|g| g.starts_with('a')));
        l.write_batch(&batch("c", 1)).unwrap();
        drop(l);
        let mut l = open_log(crash.to_str().unwrap()).unwrap();
        assert_eq!(l.load().unwrap().records.len(), 6, "cut at {cut}: the batch after the cut reads back");
    }
    // Sectors written out of order: the batch's end on disk, its start not.
    let mut bytes = whole.clone();
    bytes[before..before + 4].iter_mut().for_each(|b| *b = 0);
    std::fs::write(&crash, &bytes).unwrap();
    assert_eq!(open_log(crash.to_str().unwrap()).unwrap().load().unwrap().records.len(), 5);
}

/// Damage followed by whole batches is no crash's doing: refused by name and offset,
/// and the file is left as it was.
#[test]
fn damage_in_the_middle_is_refused_untouched() {
    let d = tmpdir("log-middle");
    let path = d.join("d.log");
    let mut l = open_log(path.to_str().unwrap()).unwrap();
    l.write_batch(&batch("a", 5)).unwrap();
    let at = l.end() as usize;
    l.write_batch(&batch("b", 5)).unwrap();
    l.write_batch(&batch("c", 5)).unwrap();
    drop(l);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[at + 20] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let err = open_log(path.to_str().unwrap()).err().expect("must refuse").to_string();
    assert!(err.contains(&format!("byte offset {at}")) && err.contains("nothing was changed"), "{err}");
    assert!(err.contains(path.to_str().unwrap()), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

/// A log that considers compaction from 64 KiB on (not 8 MiB).
fn compacting_log(p: &str) -> AppLog {
    let mut l = open_log(p).unwrap();
    l.compact_min = 64 << 10;
    l.next_check = l.compact_min;
    l
}

/// 50 decisions, finished and purged: the file grows, the live state does not.
fn churn(l: &mut AppLog, round: usize) {
    l.write_batch(&batch(&format!("x{round}-"), 50)).unwrap();
    let fin: Vec<Op> = (0..50).map(|i| Op::Forget(format!("x{round}-{i}"))).collect();
    l.write_batch(&fin).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    l.write_batch(&[Op::Purge { older_than_ms: 0 }]).unwrap();
}

/// Compaction rewrites the file as the live state: every answer stays, and a crash on
/// either side of its rename leaves a log that opens with the same answers.
#[test]
fn compaction_keeps_every_answer() {
    let d = tmpdir("log-compact");
    let path = d.join("d.log");
    let p = path.to_str().unwrap();
    let mut l = compacting_log(p);
    script(&mut l);
    let want = answers(&mut l);
    let id = l.identity().unwrap();
    // Decided and finished over and over: the file grows, the live state does not.
    let mut peak = 0;
    for round in 0..40 {
        churn(&mut l, round);
        peak = peak.max(l.end());
    }
    assert!(l.end() < peak, "compacted: {} < {peak}", l.end());
    let want2 = answers(&mut l);
    assert_eq!(l.identity().unwrap(), id);
    assert_eq!(
        want.lines().filter(|x| !x.starts_with("gets")).count(),
        want2.lines().filter(|x| !x.starts_with("gets")).count()
    );
    drop(l);
    // A crash before the rename: a whole or half .tmp next to the old file.
    std::fs::write(format!("{p}.tmp"), b"COTXLOG\nhalf").unwrap();
    let mut l = open_log(p).unwrap();
    assert_eq!(answers(&mut l), want2);
    assert!(!std::path::Path::new(&format!("{p}.tmp")).exists());
    // A crash right after the rename: the new file alone (written as compaction does).
    LogFile::write_fresh(&format!("{p}.copy"), &l.state, SyncMethod::Direct).unwrap();
    drop(l);
    std::fs::rename(format!("{p}.copy"), p).unwrap();
    let mut l = open_log(p).unwrap();
    assert_eq!(answers(&mut l), want2);
    assert_eq!(l.identity().unwrap(), id);
}

/// A rewrite that fails (a full disk while it writes, here a rename refused) takes its
/// `.tmp` away: left there it would hold the space the running log needs to grow, on the
/// disk it has just filled, until the next open.
#[test]
fn a_failed_rewrite_leaves_no_tmp_behind() {
    let d = tmpdir("log-rewrite-fails");
    let path = d.join("d.log");
    // A non-empty directory where the file goes: the rename over it fails.
    std::fs::create_dir_all(path.join("x")).unwrap();
    let s = file::fresh_state().unwrap();
    let err = LogFile::write_fresh(path.to_str().unwrap(), &s, SyncMethod::Direct).err().unwrap();
    assert!(err.to_string().contains("renaming the new file over it"), "{err}");
    assert!(!d.join("d.log.tmp").exists(), "the failed rewrite's .tmp is still there");
}

/// A compaction whose rename is done but whose directory sync fails: the file at the path
/// is the new one, so the log goes on in it (in the old, unlinked one, a restart would not
/// find what was decided after), and nothing is acknowledged before the rename is durable.
#[test]
fn a_compaction_whose_rename_is_not_synced_loses_nothing() {
    let d = tmpdir("log-compact-dirsync");
    let path = d.join("d.log");
    let p = path.to_str().unwrap();
    let mut l = compacting_log(p);
    file::FAIL_RENAME_SYNC.set(true);
    for round in 0.. {
        assert!(round < 200, "no compaction happened");
        churn(&mut l, round);
        if !file::FAIL_RENAME_SYNC.get() {
            break; // a compaction ran into the failed sync
        }
    }
    l.write_batch(&batch("after-", 5)).unwrap();
    drop(l);
    let mut l = open_log(p).unwrap();
    for i in 0..5 {
        assert!(matches!(l.get(&format!("after-{i}")).unwrap(), Stored::Record(_)), "after-{i}: decided, then lost");
    }
}

/// A log written by a newer daemon is refused before anything is changed in it.
#[test]
fn a_newer_format_is_refused_untouched() {
    let d = tmpdir("log-newer");
    let path = d.join("d.log");
    let mut s = file::fresh_state().unwrap();
    s.version = crate::store::log::SCHEMA_VERSION + 1;
    drop(LogFile::write_fresh(path.to_str().unwrap(), &s, SyncMethod::Direct).unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    // Followed by something this version cannot read.
    let end = format::scan(&bytes).unwrap().end;
    bytes[end..end + 9].copy_from_slice(b"\x01\0\0\0\0\0\0\0\x63");
    std::fs::write(&path, &bytes).unwrap();
    let err = open_log(path.to_str().unwrap()).err().unwrap();
    assert!(matches!(err, StoreError::NewerSchema(_)), "{err}");
    assert!(err.to_string().contains("newer cotx-coordinator"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

/// A second process (here: a second open) on the same file is refused by name; a file
/// that is no log is refused, not overwritten.
#[test]
fn one_process_per_log_and_only_logs() {
    let d = tmpdir("log-lock");
    let p = d.join("d.log");
    let l = open_log(p.to_str().unwrap()).unwrap();
    let err = open_log(p.to_str().unwrap()).err().expect("second open must be refused");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert!(err.to_string().contains("in use by another process"), "{err}");
    drop(l);
    open_log(p.to_str().unwrap()).unwrap();
    let other = d.join("other.db");
    std::fs::write(&other, b"SQLite format 3\0").unwrap();
    let err = open_log(other.to_str().unwrap()).err().unwrap().to_string();
    assert!(err.contains("not a cotx decision log"), "{err}");
}

/// Whether the file system under `dir` takes O_DIRECT (tmpfs did not before Linux 6.6).
fn takes_direct(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let p = dir.join("direct-probe");
    let ok = std::fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&p).is_ok();
    let _ = std::fs::remove_file(p);
    ok
}

/// Both sync methods, and direct writes refused by the kernel in the middle of a log,
/// give the SQLite store's answers and the same state after a reopen; frames of many
/// blocks and frames ending anywhere in a block read back whole.
#[test]
fn every_sync_method_gives_the_same_answers() {
    let d = tmpdir("log-sync");
    let mut s = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    let want = script(&mut s);
    let want_answers = answers(&mut s);
    let direct = takes_direct(&d);
    for (name, m, refused) in [
        ("direct", SyncMethod::Direct, false),
        ("fdatasync", SyncMethod::Fdatasync, false),
        ("refused", SyncMethod::Direct, true),
    ] {
        let p = d.join(format!("{name}.log"));
        let p = p.to_str().unwrap();
        let mut l = AppLog::open(p, m).unwrap();
        let used = if m == SyncMethod::Direct && direct { SyncMethod::Direct } else { SyncMethod::Fdatasync };
        assert_eq!(l.file.sync_method(), used, "{p}");
        assert_eq!(script(&mut l), want, "{p}");
        assert_eq!(answers(&mut l), want_answers, "{p}");
        if refused && direct {
            // The kernel refuses the next direct write (EINVAL): the batch is written
            // buffered and synced, and so is every one after it.
            l.file.direct.as_mut().unwrap().misalign = true;
        }
        // Batches of 1 to 60 decisions: frames ending at every kind of offset.
        for n in 1..60 {
            l.write_batch(&batch(&format!("m{n}-"), n)).unwrap();
        }
        let now = if refused { SyncMethod::Fdatasync } else { used };
        assert_eq!(l.file.sync_method(), now, "{p}");
        let all = answers(&mut l);
        let decided = l.load().unwrap().records.len();
        assert!(decided >= (1..60).sum::<usize>(), "{decided}");
        drop(l);
        let mut l = AppLog::open(p, m).unwrap();
        assert_eq!(answers(&mut l), all, "{p} replayed");
        assert_eq!(l.load().unwrap().records.len(), decided);
    }
}

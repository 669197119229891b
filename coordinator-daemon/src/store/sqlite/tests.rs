#![cfg(test)]
use super::*;
use crate::state::Outcome;
use crate::store::Store;

pub(super) use crate::store::testkit::{rec, tmpdir};

#[test]
fn conditional_insert_keeps_first_decision() {
    let d = tmpdir("cond");
    let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    let r = l
        .write_batch(&[Op::Decide(rec("g1", Outcome::Commit), None), Op::Decide(rec("g1", Outcome::Abort), None)])
        .unwrap();
    assert_eq!(r, vec![OpResult::Decided(Outcome::Commit), OpResult::Decided(Outcome::Commit)]);
    let all = l.load().unwrap().records;
    assert_eq!(all, vec![rec("g1", Outcome::Commit)]);
    l.write_batch(&[Op::Forget("g1".into())]).unwrap();
    assert!(l.load().unwrap().records.is_empty());
    drop(l);
    // Survives reopen; a finished record is no longer recovery's, but still answers.
    let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    assert!(l.load().unwrap().records.is_empty());
    assert_eq!(l.get("g1").unwrap(), Stored::Record(rec("g1", Outcome::Commit)));
}

/// After a restore, a missing record of an epoch the copy held is "forgotten" (it may be
/// a commit made after the copy), never absent = abort; no decision is written for it
/// any more; a new epoch is unaffected; lease generations jump; the tick grows.
#[test]
fn mark_restored_seals_the_copys_epochs() {
    let d = tmpdir("restored");
    let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    l.write_batch(&[
        Op::RegisterEpoch { node: "n".into(), nonce: 10 },
        Op::Decide(rec("n.00000000000a-1", Outcome::Commit), None),
    ])
    .unwrap();
    let Claim::Granted(g1) = l.claim_node("n", "h", "u", 1000, false).unwrap() else { panic!() };
    let before = l.identity().unwrap();
    assert_eq!(l.get("n.00000000000a-2").unwrap(), Stored::Absent { forgotten: false });
    let r = l.mark_restored().unwrap();
    assert_eq!(r, Restored { sealed: 1, restores: 1 });
    assert_eq!(l.get("n.00000000000a-2").unwrap(), Stored::Absent { forgotten: true });
    assert!(matches!(l.get("n.00000000000a-1").unwrap(), Stored::Record(_)), "records of the copy still answer");
    let w = l.write_batch(&[Op::Decide(rec("n.00000000000a-2", Outcome::Abort), None)]).unwrap();
    assert_eq!(w, vec![OpResult::Forgotten]);
    l.write_batch(&[Op::RegisterEpoch { node: "n".into(), nonce: 11 }]).unwrap();
    assert_eq!(l.get("n.00000000000b-1").unwrap(), Stored::Absent { forgotten: false });
    let Claim::Granted(g2) = l.claim_node("n", "h", "u", 1000, false).unwrap() else { panic!() };
    assert!(g2 > g1 + RESTORE_GRANT_JUMP - 1);
    let after = l.identity().unwrap();
    assert_eq!((after.store_id, after.restores), (before.store_id, 1));
    assert!(after.tick > before.tick);
    assert_eq!(l.mark_restored().unwrap().sealed, 1, "only the epoch registered since is sealed again");
}

/// A finished commit stays answerable for the retention; once
/// purged, it reads as "forgotten" (the epoch's watermark), never as absent = abort.
#[test]
fn purged_records_read_as_forgotten_not_absent() {
    let d = tmpdir("purge");
    let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    let (g3, g5, g9) = ("n.00000000000a-3", "n.00000000000a-5", "n.00000000000a-9");
    l.write_batch(&[
        Op::Decide(rec(g3, Outcome::Commit), None),
        Op::Decide(rec(g5, Outcome::Commit), None),
        Op::Decide(rec(g9, Outcome::Commit), None),
    ])
    .unwrap();
    l.write_batch(&[Op::Forget(g3.into()), Op::Forget(g5.into())]).unwrap();
    // Not old enough yet: kept.
    l.write_batch(&[Op::Purge { older_than_ms: 60_000 }]).unwrap();
    assert!(matches!(l.get(g5).unwrap(), Stored::Record(_)));
    l.conn
        .execute_batch("UPDATE decisions SET finished_ms = finished_ms - 120000 WHERE finished_ms IS NOT NULL")
        .unwrap();
    l.write_batch(&[Op::Purge { older_than_ms: 60_000 }]).unwrap();
    assert_eq!(l.get(g5).unwrap(), Stored::Absent { forgotten: true });
    assert_eq!(l.get("n.00000000000a-4").unwrap(), Stored::Absent { forgotten: true });
    // Above the watermark: never recorded, presumed abort stays sound.
    assert_eq!(l.get("n.00000000000a-6").unwrap(), Stored::Absent { forgotten: false });
    // A decision stalled past the retention is not written under the watermark.
    let r = l
        .write_batch(&[
            Op::Decide(rec("n.00000000000a-4", Outcome::Commit), None),
            Op::Decide(rec("n.00000000000a-6", Outcome::Abort), None),
        ])
        .unwrap();
    assert_eq!(r, vec![OpResult::Forgotten, OpResult::Decided(Outcome::Abort)]);
    assert!(matches!(l.get(g9).unwrap(), Stored::Record(_)), "unfinished records are never purged");
}

/// A decision made under a lease grant that is no longer in force writes nothing.
#[test]
fn decisions_are_fenced_by_the_grant() {
    let d = tmpdir("fence");
    let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    let Claim::Granted(g1) = l.claim_node("n", "a", "", 60_000, false).unwrap() else { panic!() };
    let old = Token { holder: "a".into(), generation: g1 };
    let Claim::Granted(g2) = l.claim_node("n", "a", "", 60_000, false).unwrap() else { panic!() };
    assert!(g2 > g1, "every grant draws a new generation");
    let r = l.write_batch(&[Op::Decide(rec("n.1-1", Outcome::Commit), Some(old.clone()))]).unwrap();
    assert!(matches!(&r[0], OpResult::Fenced(_)), "{r:?}");
    assert_eq!(
        l.renew_node("n", &old, 1000).unwrap(),
        Renewal::Lost(lease::Lost::Regranted { holder: "a".into(), generation: g2 })
    );
    let new = Token { holder: "a".into(), generation: g2 };
    assert_eq!(l.renew_node("n", &new, 1000).unwrap(), Renewal::Renewed);
    let r = l.write_batch(&[Op::Decide(rec("n.1-1", Outcome::Commit), Some(new))]).unwrap();
    assert_eq!(r[0], OpResult::Decided(Outcome::Commit));
}

/// A row that exists but cannot be read is never taken for an abort: load reports it
/// as corrupt, and a conditional insert for its gtid answers Corrupt (writes nothing).
#[test]
fn corrupt_rows_are_not_aborts() {
    let d = tmpdir("corrupt");
    let mut l = SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap();
    l.write_batch(&[Op::Decide(rec("ok", Outcome::Commit), None)]).unwrap();
    l.conn
        .execute_batch(
            "INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES ('bad-outcome', 'comit', '[[\"pg\",\"b1\"]]', 1, 'n', 'coordinator');
             INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES ('bad-branches', 'commit', 'garbage', 1, 'n', 'coordinator');",
        )
        .unwrap();
    let got = l.load().unwrap();
    assert_eq!(got.records, vec![rec("ok", Outcome::Commit)]);
    let mut bad: Vec<&str> = got.corrupt.iter().map(|c| c.gtid.as_str()).collect();
    bad.sort();
    assert_eq!(bad, vec!["bad-branches", "bad-outcome"]);
    let r = l.write_batch(&[Op::Decide(rec("bad-outcome", Outcome::Abort), None)]).unwrap();
    assert!(matches!(&r[0], OpResult::Corrupt(m) if m.contains("comit")), "{r:?}");
    assert!(matches!(l.get("bad-branches").unwrap(), Stored::Corrupt(_)));
    // The operator's overwrite replaces it.
    l.write_batch(&[Op::Overwrite(rec("bad-outcome", Outcome::Commit))]).unwrap();
    assert_eq!(l.get("bad-outcome").unwrap(), Stored::Record(rec("bad-outcome", Outcome::Commit)));
}

/// A crash in the middle of writing the last batch tears the WAL's tail. The store
/// must open, keep every acknowledged batch, and drop the torn one.
#[test]
fn torn_final_write() {
    let d = tmpdir("torn");
    let db = d.join("s.db");
    let wal = d.join("s.db-wal");
    let mut l = SqliteLog::open(db.to_str().unwrap()).unwrap();
    l.conn.execute_batch("PRAGMA wal_autocheckpoint=0").unwrap();
    let batch_a: Vec<Op> = (0..20).map(|i| Op::Decide(rec(&format!("a{i}"), Outcome::Commit), None)).collect();
    l.write_batch(&batch_a).unwrap();
    let len_a = std::fs::metadata(&wal).unwrap().len();
    let batch_b: Vec<Op> = (0..20).map(|i| Op::Decide(rec(&format!("b{i}"), Outcome::Commit), None)).collect();
    l.write_batch(&batch_b).unwrap();
    let len_b = std::fs::metadata(&wal).unwrap().len();
    assert!(len_b > len_a);
    // "Crash": copy the files as they are on disk while the store is open, with the
    // last batch's WAL frames cut in the middle.
    let crash = d.join("crash");
    std::fs::create_dir_all(&crash).unwrap();
    std::fs::copy(&db, crash.join("s.db")).unwrap();
    let mut bytes = std::fs::read(&wal).unwrap();
    bytes.truncate((len_a + (len_b - len_a) / 2) as usize);
    std::fs::write(crash.join("s.db-wal"), &bytes).unwrap();
    drop(l);
    let mut l = SqliteLog::open(crash.join("s.db").to_str().unwrap()).unwrap();
    let got: Vec<String> = l.load().unwrap().records.into_iter().map(|r| r.gtid).collect();
    assert_eq!(got.len(), 20, "{got:?}");
    assert!(got.iter().all(|g| g.starts_with('a')));
    // And the store keeps working after the torn tail.
    l.write_batch(&[Op::Decide(rec("c1", Outcome::Commit), None)]).unwrap();
    assert_eq!(l.load().unwrap().records.len(), 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_on_sqlite() {
    let d = tmpdir("gc");
    let store = Store::start(Box::new(SqliteLog::open(d.join("s.db").to_str().unwrap()).unwrap()), 1024);
    let mut hs = vec![];
    for i in 0..400 {
        let s = store.clone();
        hs.push(tokio::spawn(async move { s.decide(rec(&format!("g{i}"), Outcome::Commit), None).await }));
    }
    for h in hs {
        assert_eq!(h.await.unwrap().unwrap(), crate::store::Decided::Outcome(Outcome::Commit));
    }
    let batches = store.stats.batches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(batches < 400, "expected fewer syncs than decisions, got {batches}");
    assert_eq!(store.load().await.unwrap().records.len(), 400);
}

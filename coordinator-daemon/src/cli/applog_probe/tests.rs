#![cfg(test)]
use super::*;

fn rec(gtid: &str) -> DecisionRecord {
    DecisionRecord {
        gtid: gtid.into(),
        outcome: Outcome::Commit,
        branches: vec![("pg".into(), "b1".into()), ("m".into(), "b2".into())],
        decided_unix_ms: 1_700_000_000_000,
        node: "n1".into(),
        source: "bench".into(),
    }
}

fn gtid(i: u64) -> String {
    crate::naming::new_gtid("n1", 7, i)
}

/// A log with a lease on node n1, its epoch registered, and `k` decisions, every even one
/// marked finished, written in batches of three; the token of the lease.
fn written(path: &str, k: u64) -> (AppLog, Token) {
    let mut log = AppLog::create(path, 1 << 16).unwrap();
    let Claim::Granted(g) = log.claim_node("n1", "h", "http://x", 60_000, true).unwrap() else { panic!() };
    let t = Token { holder: "h".into(), generation: g };
    log.write_batch(&[Op::RegisterEpoch { node: "n1".into(), nonce: 7 }]).unwrap();
    let ops: Vec<Op> = (0..k)
        .flat_map(|i| {
            let mut v = vec![Op::Decide(rec(&gtid(i)), Some(t.clone()))];
            if i % 2 == 0 {
                v.push(Op::Forget(gtid(i)));
            }
            v
        })
        .collect();
    for b in ops.chunks(3) {
        log.write_batch(b).unwrap();
    }
    (log, t)
}

fn path(name: &str) -> (tempdir::Dir, String) {
    let d = tempdir::Dir::new(name);
    let p = d.0.join("log").to_string_lossy().into_owned();
    (d, p)
}

mod tempdir {
    /// A scratch directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(name: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("cotx-applog-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Every write the probe acknowledges is in its file, record by record, as a log's
/// recovery would read it back: the lease, the epoch, each decision whole and each
/// finished mark, then the clean end.
#[test]
fn what_it_writes_reads_back() {
    let (_d, p) = path("readback");
    let (log, _) = written(&p, 5);
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(bytes.len(), 1 << 16, "preallocated");
    let (recs, tail) = read_log(&bytes);
    assert_eq!(tail, Tail::End(log.end));
    assert!(matches!(&recs[0], Rec::Lease { node, holder, generation: 1, .. } if node == "n1" && holder == "h"));
    assert_eq!(recs[1], Rec::Epoch { node: "n1".into(), nonce: 7 });
    let decisions: Vec<_> =
        recs.iter().filter_map(|r| if let Rec::Decision(d) = r { Some(d.clone()) } else { None }).collect();
    assert_eq!(decisions, (0..5).map(|i| rec(&gtid(i))).collect::<Vec<_>>());
    let finished: Vec<_> = recs
        .iter()
        .filter_map(|r| if let Rec::Finished { gtid, .. } = r { Some(gtid.clone()) } else { None })
        .collect();
    assert_eq!(finished, vec![gtid(0), gtid(2), gtid(4)]);
    assert_eq!(recs.len(), 2 + 5 + 3);
}

/// A batch cut by a crash is found by its checksum, not read as records: a flipped byte
/// in the last record, a record whose end is missing, a length with nothing behind it.
/// Everything before it reads back.
#[test]
fn a_torn_tail_is_detected() {
    let (_d, p) = path("torn");
    let (log, _) = written(&p, 4);
    let bytes = std::fs::read(&p).unwrap();
    let (whole, _) = read_log(&bytes);
    // Where the last record starts: the end of all records but the last.
    let mut b = vec![];
    for r in &whole[..whole.len() - 1] {
        encode(&mut b, r);
    }
    let last = b.len();
    assert!(last < log.end as usize);
    // Damage that still parses, so that only the checksum can tell: a bit of the last
    // decision's time, and its last two bytes never written (zeros, a valid string).
    assert!(matches!(whole.last(), Some(Rec::Decision(_))));
    let mut flipped = bytes.clone();
    flipped[last + HEADER + 4] ^= 0x10;
    let mut cut = bytes.clone();
    cut[log.end as usize - 2..log.end as usize].fill(0);
    let mut len_only = bytes[..last + 4].to_vec();
    len_only.extend_from_slice(&[0u8; 64]);
    for (what, b) in [("flipped", flipped), ("cut", cut), ("length only", len_only)] {
        let (recs, tail) = read_log(&b);
        assert_eq!(tail, Tail::Torn(last as u64), "{what}");
        assert_eq!(recs, whole[..whole.len() - 1], "{what}");
    }
    // A file that ends inside a header is torn there too.
    let (_, tail) = read_log(&bytes[..last + 3]);
    assert_eq!(tail, Tail::Torn(last as u64));
}

/// The probe does the SQLite store's checks before it appends: a decision already
/// recorded answers its outcome and writes nothing; a stale grant is fenced; ops it does
/// not implement are refused, never half done.
#[test]
fn checks_as_the_store_does_and_refuses_the_rest() {
    let (_d, p) = path("checks");
    let (mut log, t) = written(&p, 2);
    let end = log.end;
    let mut again = rec(&gtid(1));
    again.outcome = Outcome::Abort;
    assert_eq!(
        log.write_batch(&[Op::Decide(again, Some(t.clone()))]).unwrap(),
        vec![OpResult::Decided(Outcome::Commit)]
    );
    let stale = Token { holder: "h".into(), generation: t.generation - 1 };
    assert!(matches!(log.write_batch(&[Op::Decide(rec(&gtid(9)), Some(stale))]).unwrap()[0], OpResult::Fenced(_)));
    // A second finished mark of the same decision writes nothing.
    log.write_batch(&[Op::Forget(gtid(0))]).unwrap();
    assert_eq!(log.end, end);
    let e = log.write_batch(&[Op::Decide(rec(&gtid(10)), Some(t)), Op::Purge { older_than_ms: 0 }]).unwrap_err();
    assert!(e.to_string().contains("not implemented (a measurement probe"), "{e}");
    assert_eq!(log.end, end);
    assert!(!log.index.contains_key(&gtid(10)));
    assert!(log.load().is_err() && log.mark_restored().is_err());
}

/// A batch that does not fit the preallocated file is refused whole, its decisions not
/// left in the index (all or nothing, as a store's transaction).
#[test]
fn a_full_log_refuses_the_batch_whole() {
    let (_d, p) = path("full");
    let mut log = AppLog::create(&p, 300).unwrap();
    let ops: Vec<Op> = (0..5).map(|i| Op::Decide(rec(&gtid(i)), None)).collect();
    let e = log.write_batch(&ops).unwrap_err();
    assert!(e.to_string().contains("log full"), "{e}");
    assert!(log.index.is_empty() && log.end == 0);
    assert_eq!(log.write_batch(&ops[..1]).unwrap(), vec![OpResult::Decided(Outcome::Commit)]);
}

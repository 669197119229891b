#![cfg(test)]
//! The daemon's answers are the protocol's rule: for every input the model's rule takes
//! (quarantined, in memory or not, what the store holds, whether the node is ours), set up
//! for real over a SQLite store, the daemon's reply is the one `cotx_protocol::answer::answer`
//! gives. A hand-written rule in answers.rs that drifts from the protocol fails here.

use super::*;
use crate::coordinator::tests::coord;
use crate::store::CorruptRecord;
use cotx_protocol::answer::Stored as P;
use rusqlite::{params, Connection};

/// The reply a read (`get`) must give for each of the rule's answers.
fn read_reply(a: Answer) -> Result<Outcome, Vec<RefusalCode>> {
    match a {
        Answer::Decided(o) => Ok(o),
        Answer::Quarantined => Err(vec![RefusalCode::Quarantined]),
        Answer::Forgotten => Err(vec![RefusalCode::OutcomeForgotten]),
        Answer::PresumedAbort => Err(vec![RefusalCode::UnknownTransaction]),
        // Its owner answers: where it is served, or that nobody serves it now.
        Answer::AskOwner => Err(vec![RefusalCode::OwnerUnavailable, RefusalCode::WrongNode]),
        Answer::Pending => Err(vec![]),
    }
}

/// The refusal an operation on the transaction (`abort`) must give: a decided one says
/// its recorded outcome (never "presumed abort" for a committed one).
fn operation_reply(a: Answer) -> Vec<RefusalCode> {
    match a {
        Answer::Decided(Outcome::Commit) => vec![RefusalCode::TransactionCommitted],
        Answer::Decided(Outcome::Abort) => vec![RefusalCode::TransactionAborted],
        a => read_reply(a).unwrap_err(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_the_protocols() {
    let c = coord("answers").await;
    let path = std::env::temp_dir().join(format!("cotx-coord-answers-{}", std::process::id())).join("s.db");
    let db = Connection::open(&path).unwrap();
    let stores = [
        P::Record(Outcome::Commit),
        P::Record(Outcome::Abort),
        P::Corrupt,
        P::Absent { forgotten: true },
        P::Absent { forgotten: false },
    ];
    let mut seq = 0;
    let mut cases = 0;
    // u1: this daemon's own node, under its grant; u2: another daemon's.
    for (node, ours) in [("u1", true), ("u2", false)] {
        for stored in stores {
            for quarantined in [false, true] {
                seq += 1;
                let nonce = 7;
                let g = naming::new_gtid(node, nonce, seq);
                match stored {
                    P::Record(o) => {
                        let rec = DecisionRecord {
                            gtid: g.clone(),
                            outcome: o,
                            branches: vec![("pg".into(), "b1".into())],
                            decided_unix_ms: 1,
                            node: node.into(),
                            source: "coordinator".into(),
                        };
                        c.store.decide(rec, None).await.unwrap();
                    }
                    P::Corrupt => {
                        db.execute(
                            "INSERT INTO decisions(gtid, outcome, branches, decided_ms, node, source) VALUES (?1, 'maybe', '[]', 1, ?2, 'coordinator')",
                            params![g, node],
                        )
                        .unwrap();
                    }
                    P::Absent { forgotten: true } => {
                        db.execute(
                            "INSERT INTO epochs(node, nonce, started_ms, purged_seq) VALUES (?1, ?2, 1, ?3)
                             ON CONFLICT(node, nonce) DO UPDATE SET purged_seq = excluded.purged_seq",
                            params![node, nonce as i64, seq as i64],
                        )
                        .unwrap();
                    }
                    P::Absent { forgotten: false } => {}
                }
                if quarantined {
                    c.registry.quarantine(&CorruptRecord { gtid: g.clone(), problem: "test".into() });
                }
                assert_eq!(c.store.get(&g).await.unwrap().view(), stored, "{g}: the case is set up as meant");
                let want = protocol::answer(quarantined, None, Some(stored), ours);
                let case = format!("{g} quarantined={quarantined} stored={stored:?} ours={ours}: rule says {want:?}");
                match (read_reply(want), c.get(&g).await) {
                    (Ok(o), Ok(t)) => assert_eq!(t.decision.as_deref(), Some(o.as_str()), "{case}"),
                    (Err(codes), Err(e)) => assert!(codes.contains(&e.code), "{case}: got {e:?}"),
                    (w, got) => panic!("{case}: want {w:?}, got {:?}", got.map(|t| t.state)),
                }
                let e = c.abort(&g, "test").await.unwrap_err();
                assert!(operation_reply(want).contains(&e.code), "{case}: abort got {e:?}");
                cases += 1;
            }
        }
    }
    assert_eq!(cases, 20);
    // In memory: the quarantine alone overrides it.
    let g = c.begin(None).unwrap().gtid;
    assert_eq!(protocol::answer(false, Some(None), None, true), Answer::Pending);
    assert!(c.get(&g).await.is_ok());
    c.registry.quarantine(&CorruptRecord { gtid: g.clone(), problem: "test".into() });
    assert_eq!(protocol::answer(true, Some(None), None, true), Answer::Quarantined);
    assert_eq!(c.get(&g).await.unwrap_err().code, RefusalCode::Quarantined);
}

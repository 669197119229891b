#![cfg(test)]
use super::*;
use crate::state::Outcome;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// A log that records batch sizes and takes `sync` to "sync" (a slow one lets requests
/// pile up).
#[derive(Default)]
struct TestLog {
    sizes: Arc<Mutex<Vec<usize>>>,
    sync: Duration,
    /// While set, writes (batches, renewals) fail as a store that is away; reads answer.
    down: Arc<AtomicBool>,
}

fn away() -> StoreError {
    StoreError::Unavailable("test: the store is away".into())
}

/// A log whose syncs take 20 ms.
fn slow_log(sizes: Arc<Mutex<Vec<usize>>>) -> TestLog {
    TestLog { sizes, sync: Duration::from_millis(20), ..Default::default() }
}

impl DecisionLog for TestLog {
    fn write_batch(&mut self, ops: &[Op]) -> Result<Vec<OpResult>, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(away());
        }
        std::thread::sleep(self.sync);
        self.sizes.lock().unwrap().push(ops.len());
        Ok(ops.iter().map(|_| OpResult::Decided(Outcome::Commit)).collect())
    }
    fn load(&mut self) -> Result<Loaded, StoreError> {
        Ok(Loaded::default())
    }
    fn get(&mut self, _: &str) -> Result<Stored, StoreError> {
        Ok(Stored::Absent { forgotten: false })
    }
    fn audit_log(&mut self) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(vec![])
    }
    fn claim_node(&mut self, _: &str, _: &str, _: &str, _: u64, _: bool) -> Result<Claim, StoreError> {
        Ok(Claim::Granted(1))
    }
    fn renew_node(&mut self, _: &str, _: &Token, _: u64) -> Result<Renewal, StoreError> {
        if self.down.load(Ordering::Relaxed) {
            return Err(away());
        }
        Ok(Renewal::Renewed)
    }
    fn release_node(&mut self, _: &str, _: &str, _: bool) -> Result<(), StoreError> {
        Ok(())
    }
    fn nodes(&mut self) -> Result<Vec<NodeLease>, StoreError> {
        Ok(vec![])
    }
    fn identity(&mut self) -> Result<Identity, StoreError> {
        Ok(Identity { store_id: "test".into(), restores: 0, tick: 0 })
    }
    fn mark_restored(&mut self) -> Result<Restored, StoreError> {
        Ok(Restored { sealed: 0, restores: 1 })
    }
}

fn rec(i: usize) -> DecisionRecord {
    DecisionRecord {
        gtid: format!("n.g-{i}"),
        outcome: Outcome::Commit,
        branches: vec![],
        decided_unix_ms: 0,
        node: "n".into(),
        source: "coordinator".into(),
    }
}

async fn run(max_batch: usize) -> Vec<usize> {
    let sizes = Arc::new(Mutex::new(vec![]));
    let store = Store::start(Box::new(slow_log(sizes.clone())), max_batch);
    let mut hs = vec![];
    for i in 0..50 {
        let s = store.clone();
        hs.push(tokio::spawn(async move { s.decide(rec(i), None).await }));
    }
    for h in hs {
        assert_eq!(h.await.unwrap().unwrap(), Decided::Outcome(Outcome::Commit));
    }
    let v = sizes.lock().unwrap().clone();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_batches_concurrent_decisions() {
    let sizes = run(1024).await;
    assert_eq!(sizes.iter().sum::<usize>(), 50);
    assert!(sizes.len() < 50, "no batching happened: {sizes:?}");
    let sizes = run(1).await;
    assert_eq!(sizes.len(), 50, "group commit off must write one op per batch");
}

/// 12 decisions 5 ms apart, each from its own caller: batches and waits.
async fn spaced(delay_ms: u64) -> (Vec<usize>, u64) {
    let sizes = Arc::new(Mutex::new(vec![]));
    let store = Store::open_in_thread(
        {
            let s = sizes.clone();
            move || Ok(Box::new(TestLog { sizes: s, ..Default::default() }) as Box<dyn DecisionLog>)
        },
        1024,
        Duration::from_millis(delay_ms),
    )
    .unwrap();
    let mut hs = vec![];
    for i in 0..12 {
        let s = store.clone();
        hs.push(tokio::spawn(async move { s.decide(rec(i), None).await }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for h in hs {
        h.await.unwrap().unwrap();
    }
    let v = sizes.lock().unwrap().clone();
    (v, store.stats.delayed.load(Ordering::Relaxed))
}

/// commit_delay: decisions that come within the delay share a sync; without it, a
/// fast log syncs each alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_delay_gathers_decisions_that_come_meanwhile() {
    let (sizes, delayed) = spaced(0).await;
    assert!(sizes.len() >= 10 && delayed == 0, "no delay: one sync per decision: {sizes:?}");
    let (sizes, delayed) = spaced(30).await;
    assert_eq!(sizes.iter().sum::<usize>(), 12);
    assert!(sizes.len() <= 4, "a 30 ms delay gathers decisions 5 ms apart: {sizes:?}");
    assert_eq!(delayed as usize, sizes.len(), "each batch waited (each wait paid)");
}

/// A lone caller (each decision awaited before the next) finds nobody joining its
/// waits: after three, only one decision in nine waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_caller_waits_only_when_waits_might_pay() {
    let sizes = Arc::new(Mutex::new(vec![]));
    let store = Store::open_in_thread(
        {
            let s = sizes.clone();
            move || Ok(Box::new(TestLog { sizes: s, ..Default::default() }) as Box<dyn DecisionLog>)
        },
        1024,
        Duration::from_millis(5),
    )
    .unwrap();
    for i in 0..18 {
        store.decide(rec(i), None).await.unwrap();
    }
    assert_eq!(
        store.stats.delayed.load(Ordering::Relaxed),
        4,
        "the first three decisions waited, then the 12th, no other"
    );
    assert_eq!(sizes.lock().unwrap().len(), 18);
}

/// A store on a slow log with `n` writes nobody waits for handed to it.
fn with_held_writes(n: usize) -> (Arc<Mutex<Vec<usize>>>, Store) {
    let sizes = Arc::new(Mutex::new(vec![]));
    let store = Store::start(Box::new(slow_log(sizes.clone())), 1024);
    for i in 0..n {
        store.write_later(Op::Forget(format!("n.g-{i}")));
    }
    (sizes, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_nobody_waits_for_ride_with_the_next_batch_or_go_alone_when_due() {
    let (sizes, store) = with_held_writes(3);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    store.decide(rec(9), None).await.unwrap();
    assert_eq!(*sizes.lock().unwrap(), vec![4], "three held writes and the decision: one sync");
    store.write_later(Op::Forget("n.g-5".into()));
    tokio::time::sleep(std::time::Duration::from_millis(LATER_MS * 3)).await;
    assert_eq!(*sizes.lock().unwrap(), vec![4, 1], "a held write goes alone once due");
    // A read sees every write queued before it.
    store.write_later(Op::Forget("n.g-6".into()));
    store.get("n.g-6").await.unwrap();
    assert_eq!(*sizes.lock().unwrap(), vec![4, 1, 1]);
}

/// A write nobody waits for (a finished transaction's mark) must not wake the writer's
/// thread: it waits for the next batch anyway, and that wake per transaction was about a
/// fifth of the store thread's CPU in the driver's process (bench/RESULTS.md, "Writes
/// nobody waits for"). Only what is sent on the writer's channel wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_nobody_waits_for_do_not_wake_the_writer() {
    let (sizes, store) = with_held_writes(5);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(store.stats.received.load(Ordering::Relaxed), 0, "the writer was sent the held writes");
    store.decide(rec(9), None).await.unwrap();
    assert_eq!(store.stats.received.load(Ordering::Relaxed), 1);
    assert_eq!(*sizes.lock().unwrap(), vec![6], "five held writes and the decision: one sync");
}

/// A store that stops answering while the writer holds only writes nobody waits for
/// (finished marks, forgets): the writer is stuck in that batch, and the stall must show
/// (the daemon logs "decision store is not answering" from it). It did not: the held
/// batch was written with the writer marked idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_batch_of_held_writes_shows_as_a_stall() {
    let sizes = Arc::new(Mutex::new(vec![]));
    let store = Store::start(
        Box::new(TestLog { sizes: sizes.clone(), sync: Duration::from_millis(600), ..Default::default() }),
        1024,
    );
    store.write_later(Op::Forget("n.g-1".into()));
    // Due after LATER_MS, then 600 ms in its "sync": look in the middle of it.
    tokio::time::sleep(Duration::from_millis(LATER_MS + 300)).await;
    assert!(sizes.lock().unwrap().is_empty(), "still in the held batch's sync");
    assert!(store.stats.stalled_ms() >= 100, "stalled {} ms", store.stats.stalled_ms());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(*sizes.lock().unwrap(), vec![1]);
    assert_eq!(store.stats.stalled_ms(), 0, "idle again");
}

/// `back` wakes the decision writes waiting to be retried when the store answers a write
/// again after failing: not while it fails, not for a read it answers meanwhile (a store
/// that reads but cannot write), and once per failure, not at every answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_write_answered_after_a_failure_wakes_the_retries() {
    let down = Arc::new(AtomicBool::new(false));
    let log = TestLog { down: down.clone(), ..Default::default() };
    let store = Store::start(Box::new(log), 1024);
    let tok = Token { holder: "h".into(), generation: 1 };
    let woken = |store: &Store| {
        let stats = store.stats.clone();
        tokio::spawn(
            async move { tokio::time::timeout(Duration::from_millis(300), stats.back.notified()).await.is_ok() },
        )
    };
    // Answered writes with no failure before them wake nobody.
    let w = woken(&store);
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.decide(rec(1), None).await.unwrap();
    assert!(!w.await.unwrap(), "woken with no failure");
    // The store goes away: the failed writes wake nobody, nor does a read it answers.
    down.store(true, Ordering::Relaxed);
    assert!(store.decide(rec(2), None).await.is_err());
    let w = woken(&store);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(store.renew_node("n", &tok, 1000).await.is_err());
    store.get("n.g-1").await.unwrap();
    assert!(!w.await.unwrap(), "woken while the store fails writes");
    // It is back: its first answered write (a renewal) wakes the waiters; the next does not.
    down.store(false, Ordering::Relaxed);
    let w = woken(&store);
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.renew_node("n", &tok, 1000).await.unwrap();
    assert!(w.await.unwrap(), "not woken when the store answered again");
    let w = woken(&store);
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.decide(rec(3), None).await.unwrap();
    assert!(!w.await.unwrap(), "woken again with no failure between");
}

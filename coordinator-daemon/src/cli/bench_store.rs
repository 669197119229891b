//! `cotx-coordinator bench-store`: decisions per second of the store alone.

use crate::config;
use crate::serve::open_store;
use crate::state;
use crate::store;

/// Decisions/s of the store alone: `clients` concurrent writers, `n` decisions in total.
pub fn bench_store(path: &str, n: usize, clients: usize, group: bool) -> Result<(), String> {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(format!("{path}-wal"));
    let _ = std::fs::remove_file(format!("{path}-shm"));
    let cfg = config::StoreConfig::Sqlite { path: path.to_string(), group_commit: group, max_batch: 1024 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let s = open_store(&cfg)?;
        let t0 = std::time::Instant::now();
        let mut hs = vec![];
        for c in 0..clients {
            let s = s.clone();
            let per = n / clients + usize::from(c < n % clients);
            hs.push(tokio::spawn(async move {
                for i in 0..per {
                    let rec = store::DecisionRecord {
                        gtid: format!("b.{c}-{i}"),
                        outcome: state::Outcome::Commit,
                        branches: vec![("pg".into(), "b1".into()), ("m".into(), "b2".into())],
                        decided_unix_ms: state::unix_ms(),
                        node: "b".into(),
                        source: "bench".into(),
                    };
                    s.decide(rec, None).await?;
                }
                Ok::<(), String>(())
            }));
        }
        for h in hs {
            h.await.map_err(|e| e.to_string())??;
        }
        let secs = t0.elapsed().as_secs_f64();
        let batches = s.stats.batches.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "{{\"store\": \"sqlite\", \"group_commit\": {group}, \"decisions\": {n}, \"clients\": {clients}, \"seconds\": {secs:.3}, \"decisions_per_s\": {:.0}, \"syncs\": {batches}, \"decisions_per_sync\": {:.1}}}",
            n as f64 / secs,
            n as f64 / batches.max(1) as f64
        );
        Ok(())
    })
}


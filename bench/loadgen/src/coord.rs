//! The coordinator as a client task sees it: the daemon over HTTP (http.rs), or the
//! coordinator in this process (`--coord inproc:CONFIG`, coordinator_daemon::in_process),
//! answering the same calls with the same JSON. In-process, the coordinator's CPU is
//! counted apart so that it can be booked as the coordinator's and not the driver's: the
//! thread CPU time of every poll of an in-process call, plus the decision store's thread.
//! Left in the driver's share: the coordinator's background tasks (the tick every 50 ms,
//! recovery passes, lease renewal), a few microseconds each, not per transaction.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};

use coordinator_daemon::in_process::InProcess;
use serde_json::Value;

use crate::http::{CoordError, Http};

pub enum Coord {
    Http(Http),
    InProcess(InProcess),
}

impl Coord {
    pub async fn request(&mut self, method: &str, path: &str, body: &Value) -> Result<Value, CoordError> {
        match self {
            Coord::Http(h) => h.request(method, path, body).await,
            Coord::InProcess(c) => Metered(Box::pin(c.call(method, path, body))).await.map_err(|r| CoordError {
                status: r.status,
                code: r.body["error"]["code"].as_str().unwrap_or("unknown").to_string(),
                message: r.body["error"]["message"].as_str().unwrap_or("").to_string(),
            }),
        }
    }

    /// A request whose answer nobody waits for (acknowledgements): pipelined over HTTP;
    /// in-process it is simply made (it never waits for the store).
    pub async fn send_nowait(&mut self, method: &str, path: &str, body: &Value) {
        match self {
            Coord::Http(h) => h.send_nowait(method, path, body).await,
            Coord::InProcess(_) => {
                let _ = self.request(method, path, body).await;
            }
        }
    }
}

/// Nanoseconds of this process's threads spent polling in-process calls.
static CALLS_NS: AtomicU64 = AtomicU64::new(0);

fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A future whose polls are timed on the polling thread's CPU clock: the time spent
/// waiting (for the store's sync) is not counted, only the work done in each poll.
struct Metered<F>(Pin<Box<F>>);

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let t0 = thread_cpu_ns();
        let r = self.0.as_mut().poll(cx);
        CALLS_NS.fetch_add(thread_cpu_ns().saturating_sub(t0), Relaxed);
        r
    }
}

/// CPU seconds the in-process coordinator has used so far: its calls' polls, and its
/// decision store's thread.
pub fn in_process_cpu_s() -> (f64, f64) {
    (CALLS_NS.load(Relaxed) as f64 / 1e9, coordinator_daemon::store::store_thread_cpu_s())
}

//! Each resource's health at the last contact (a completion, a recovery pass, a
//! resolution), shown by /healthz, /metrics and the resource listing; and the wake-up of
//! the retries that wait on a resource while it is away.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
pub struct ResourceHealth {
    up: Mutex<HashMap<String, bool>>,
    /// Notified when a contact with a resource works after one that did not. A retry
    /// whose delay doubled while its resource was away (up to `timeouts.retry_max_ms`)
    /// takes `back.notified()` before its attempt and waits on it beside its delay, so it
    /// goes on once anything reaches the resource again (a recovery pass, another retry)
    /// instead of waiting out a delay grown during the outage.
    pub back: Notify,
}

impl ResourceHealth {
    /// The last contact with `resource` worked, or did not.
    pub fn note(&self, resource: &str, up: bool) {
        let was = self.up.lock().unwrap().insert(resource.to_string(), up);
        if up && was == Some(false) {
            self.back.notify_waiters();
        }
    }

    /// None: not contacted yet.
    pub fn get(&self, resource: &str) -> Option<bool> {
        self.up.lock().unwrap().get(resource).copied()
    }

    pub fn all(&self) -> Vec<(String, bool)> {
        self.up.lock().unwrap().iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn woken(n: &mut std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>) -> bool {
        n.as_mut().poll(&mut Context::from_waker(Waker::noop())) == Poll::Ready(())
    }

    #[test]
    fn only_a_contact_that_works_after_one_that_failed_wakes_the_retries() {
        let h = ResourceHealth::default();
        let mut n = pin!(h.back.notified());
        h.note("pg", true); // the first contact: nothing was away
        h.note("pg", true);
        assert!(!woken(&mut n));
        h.note("pg", false);
        assert!(!woken(&mut n));
        assert_eq!(h.get("pg"), Some(false));
        h.note("pg", true); // back
        assert!(woken(&mut n));
        assert_eq!(h.get("pg"), Some(true));
        assert_eq!(h.get("my"), None);
    }
}

//! The restart gate of a client-mode MariaDB/MySQL resource (pure).
//!
//! InnoDB recovers a prepared XA branch after a server restart with its exclusive locks
//! only: the shared locks its SERIALIZABLE reads held are gone, so a new transaction could
//! now overwrite what it read and commit before it, breaking commitment ordering. In
//! engine mode mysql_co's own gate refuses such work; in client mode the daemon does:
//! when the server's start time changes, every one of our XIDs prepared there is
//! "recovered", and no new branch is admitted until all of them are decided (gone from
//! XA RECOVER).
//!
//! The first time a daemon sees a server it cannot know whether it restarted while the
//! daemon was away, so it closes the gate the same way (conservative: prepared branches of
//! live transactions are decided within their timeout).

use std::collections::HashSet;

/// Start times are computed as now - Uptime, each to the second: a jitter of a second or
/// two is the same start.
const SAME_START_S: i64 = 2;

/// A client's start time (read once on its connection) stands for a look only once the
/// gate has seen this run up for this long: a later run then starts at least this much
/// later, beyond SAME_START_S and the rounding of both values, so a restart the gate has
/// not seen cannot pass for the run it knows. (A quick restart within SAME_START_S of the
/// start is what the uptime and connection counts catch in a look; a client's old value
/// cannot show them.)
const VOUCH_AFTER_UPTIME_S: i64 = 10;

/// What the server says of its start: `started` = now - Uptime (unix seconds, to the
/// second), `uptime` itself and `connections` (connection attempts since the start). A
/// restart shows as the start moving by more than the rounding, or as an uptime or a
/// connection count smaller than the last one seen: both only grow while the server runs,
/// and a quick restart (within the rounding of the start time) sets both back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    pub started: i64,
    pub uptime: i64,
    pub connections: i64,
}

#[derive(Debug, Default, Clone)]
pub struct Gate {
    started: Option<i64>,
    uptime: i64,
    connections: i64,
    /// The recovered XIDs not decided yet: Some(non-empty) = closed.
    pending: Option<HashSet<(String, String)>>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    Unchanged,
    /// The server (re)started at `started` with `pending` of our branches prepared.
    Closed {
        started: i64,
        pending: usize,
    },
    Opened,
}

impl Gate {
    /// A fresh look at the server: its start time (unix seconds) and our XIDs prepared
    /// there now.
    pub fn observe(&mut self, now: Start, prepared: &HashSet<(String, String)>) -> Change {
        let restarted = self.is_new_start(now);
        self.uptime = self.uptime.max(now.uptime);
        self.connections = self.connections.max(now.connections);
        if restarted {
            let started = now.started;
            self.started = Some(started);
            self.uptime = now.uptime;
            self.connections = now.connections;
            if prepared.is_empty() {
                let was_closed = self.pending.take().is_some();
                return if was_closed { Change::Opened } else { Change::Unchanged };
            }
            self.pending = Some(prepared.clone());
            return Change::Closed { started, pending: prepared.len() };
        }
        if let Some(p) = &mut self.pending {
            p.retain(|x| prepared.contains(x));
            if p.is_empty() {
                self.pending = None;
                return Change::Opened;
            }
        }
        Change::Unchanged
    }

    /// Would this start time be a restart (or the first look)?
    pub fn is_new_start(&self, now: Start) -> bool {
        match self.started {
            None => true,
            Some(s) => {
                (now.started - s).abs() > SAME_START_S || now.uptime < self.uptime || now.connections < self.connections
            }
        }
    }

    /// Does a client's reading of the server's start (now - Uptime, taken on its own
    /// connection when that connection was first used for a branch) show the run this
    /// gate knows, open? Then a registration needs no look of its own: a restart after
    /// the client's reading broke that connection, so its branch cannot prepare; a
    /// connection opened after a restart reads a start that differs, and the daemon looks.
    pub fn vouches_for(&self, client_started: i64) -> bool {
        match self.started {
            Some(s) => {
                self.pending.is_none()
                    && self.uptime >= VOUCH_AFTER_UPTIME_S
                    && (client_started - s).abs() <= SAME_START_S
            }
            None => false,
        }
    }

    /// Why new branches are not admitted, or None when they are.
    pub fn closed(&self) -> Option<String> {
        self.pending.as_ref().map(|p| {
            format!(
                "the server restarted (at unix time {}) with {} of our branches prepared; recovered branches keep no read locks, \
                 so no new branch is admitted until they are decided",
                self.started.unwrap_or(0),
                p.len()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server started at `started` and looked at `uptime` seconds later.
    fn at(started: i64, uptime: i64) -> Start {
        Start { started, uptime, connections: uptime * 10 }
    }

    fn set(xs: &[&str]) -> HashSet<(String, String)> {
        xs.iter().map(|x| (x.to_string(), "b".to_string())).collect()
    }

    #[test]
    fn a_restart_with_prepared_branches_closes_until_each_is_decided() {
        let mut g = Gate::default();
        assert_eq!(g.observe(at(1000, 5), &set(&[])), Change::Unchanged);
        assert!(g.closed().is_none());
        // Same start (jitter of a second): nothing changes even with branches prepared.
        assert_eq!(g.observe(at(1001, 9), &set(&["a", "b"])), Change::Unchanged);
        assert!(g.closed().is_none());
        // Restarted: the two prepared ones are recovered.
        assert_eq!(g.observe(at(2000, 1), &set(&["a", "b"])), Change::Closed { started: 2000, pending: 2 });
        assert!(g.closed().unwrap().contains("2 of our branches"));
        // A new branch prepared after the restart does not hold the gate; "a" decided.
        assert_eq!(g.observe(at(2000, 3), &set(&["b", "new"])), Change::Unchanged);
        assert!(g.closed().is_some());
        assert_eq!(g.observe(at(2001, 4), &set(&["new"])), Change::Opened);
        assert!(g.closed().is_none());
    }

    #[test]
    fn a_clients_start_time_stands_for_a_look_only_for_a_known_open_gate_of_a_settled_run() {
        let mut g = Gate::default();
        // Never looked: nothing to compare with.
        assert!(!g.vouches_for(1000));
        // Looked 3 s after the start: a restart 3 s later would read within the rounding.
        g.observe(at(1000, 3), &set(&[]));
        assert!(!g.vouches_for(1000));
        g.observe(at(1000, 30), &set(&[]));
        assert!(g.vouches_for(1000) && g.vouches_for(1001) && g.vouches_for(998));
        // Another start (a restart the gate has not seen, or an older run): look.
        assert!(!g.vouches_for(1003) && !g.vouches_for(1030) && !g.vouches_for(900));
        // Closed: every registration looks (that is what opens it).
        g.observe(at(2000, 40), &set(&["a"]));
        assert!(g.closed().is_some() && !g.vouches_for(2000));
        g.observe(at(2000, 41), &set(&[]));
        assert!(g.closed().is_none() && g.vouches_for(2000));
    }

    #[test]
    fn the_first_look_is_treated_as_a_restart() {
        let mut g = Gate::default();
        assert_eq!(g.observe(at(5, 1), &set(&["x"])), Change::Closed { started: 5, pending: 1 });
        assert_eq!(g.observe(at(5, 2), &set(&[])), Change::Opened);
    }

    #[test]
    fn a_restart_with_nothing_prepared_reopens_a_closed_gate() {
        let mut g = Gate::default();
        g.observe(at(5, 1), &set(&["x"]));
        assert_eq!(g.observe(at(100, 1), &set(&[])), Change::Opened);
        assert!(g.closed().is_none());
    }

    #[test]
    fn a_restart_within_the_rounding_of_the_start_time_is_seen_by_the_uptime() {
        let mut g = Gate::default();
        g.observe(at(1000, 1), &set(&[]));
        assert_eq!(g.observe(at(1001, 2), &set(&["a"])), Change::Unchanged);
        // Restarted a second later: the start time barely moves, the uptime falls.
        assert_eq!(g.observe(at(1001, 0), &set(&["a"])), Change::Closed { started: 1001, pending: 1 });
        assert_eq!(g.observe(at(1001, 1), &set(&["a"])), Change::Unchanged);
        // Restarted again within the same second of uptime: fewer connections than seen.
        let quick = Start { started: 1001, uptime: 1, connections: 2 };
        assert_eq!(g.observe(quick, &set(&["a"])), Change::Closed { started: 1001, pending: 1 });
    }
}

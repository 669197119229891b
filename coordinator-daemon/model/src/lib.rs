//! A model of the coordinator's commit protocol, checked exhaustively with `stateright`.
//!
//! Every decision the model's daemons and store take is made by the daemon's own code, the
//! `cotx-protocol` crate: lease renewal and claims (`lease::renewal`, `lease::claim`), the
//! store's fencing check (`lease::admits`), what recovery does with a prepared branch
//! (`recovery::decide`), what a daemon answers (`answer::answer`) and what it keeps of its
//! memory under a new grant (`answer::after_regrant`), and, for the one-request commit of
//! a gtid from a leased range, recovery, commit and answers (`leased::{recovery, commit,
//! presumes_abort}`). The model adds only what the I/O
//! shells do around them: one global transaction X of node N (owned by daemon 0) with two
//! branches — branch 0 on PostgreSQL, branch 1 on MariaDB — plus a foreign prepared branch
//! that carries our gid prefix but belongs to another deployment.
//!
//! Actors and their actions (each a step the checker interleaves in every order):
//! - daemons: commit (client request), decision writes (retries), renewals, regaining a
//!   lost grant, takeover, recovery passes, branch completion, release, timeouts, and, as
//!   faults, crash (memory lost) and restart;
//! - the store: decision writes in two steps (the fence check, then the conditional
//!   insert — a claim may come in between: the model does not rely on the PostgreSQL
//!   store's row lock), lease rows with generations, purge after the retention; faults:
//!   a lease running out (a holder paused or cut off past its ttl, or its clock skewed),
//!   a write lost (message loss, or a failover to a synchronous standby losing an
//!   uncommitted transaction), a reply lost;
//! - participants: prepared branches survive restarts; MariaDB's unflushed XA ROLLBACK
//!   can bring a branch back as prepared after a crash (fault);
//! - the client/application: asks any daemon for the decision (retries on another), and
//!   finishes its own branches once told the outcome; in `dip` mode it commits the
//!   decision branch with `co.decide` (the participant's unique decision row); in
//!   `leased` mode X's gtid comes from a range daemon 0 leased to the client, no daemon
//!   knows X until the client's one commit request (carrying X's branches) reaches
//!   daemon 0 — sent after the client prepared its last branch, possibly twice (a retry),
//!   delivered at any later time, to whichever process of daemon 0 is up — the range's
//!   lease may run out at any time, the database may refuse the last PREPARE (the client
//!   then sends nothing and rolls back), and a daemon forgets X once it is decided and none
//!   of its branches is prepared (recovery keeps nothing of a gtid it rolled back); with
//!   `dip` and `leased` together, that one request hands the decision to branch 0 (the
//!   one-request commit with `decide_in`), and the client may send it while its last
//!   PREPARE is still in flight: branch 0 commits only once both have answered.
//!
//! Properties: no split; a decision never changes; no client told an outcome other than
//! the one in force (never "commit" without a durable commit record or, in dip, the
//! deciding branch's commit); a fenced write never lands; and, once faults stop, every
//! prepared branch is finished (checked on every terminal state).
//!
//! `Bug` switches one piece of the protocol for a deliberately broken one: each must
//! produce a counterexample, so the model's silence on the real protocol means something.

pub mod bug;
pub mod model;
pub mod proto;
pub mod state;

pub use bug::Bug;
pub use proto::Proto;
pub use state::{Act, State};

use stateright::Model;

/// The modes checked, as (dip, ro, leased), each with what it is: the test command and
/// the model's test run every one.
pub const MODES: [((bool, bool, bool), &str); 6] = [
    ((false, false, false), "decision in the store"),
    ((true, false, false), "decision in a participant"),
    ((false, true, false), "all branches read-only: decision in memory"),
    ((false, false, true), "one request: gtid from a leased range, branches sent with the commit"),
    ((false, true, true), "one request, all branches read-only: decision in memory"),
    ((true, false, true), "one request with the decision in a participant"),
];

/// What one check found: states, depth, time, and the properties it broke (with a trace).
pub struct Outcomes {
    pub unique_states: usize,
    pub max_depth: usize,
    pub seconds: f64,
    pub violations: Vec<(&'static str, String)>,
}

/// Checks `p` exhaustively up to `depth` steps (BFS).
pub fn check(p: Proto, depth: usize, threads: usize) -> Outcomes {
    use stateright::Checker;
    let t0 = std::time::Instant::now();
    let names: Vec<&'static str> = p.properties().iter().map(|x| x.name).collect();
    let c = p.clone().checker().threads(threads).target_max_depth(depth).spawn_bfs().join();
    let mut violations = vec![];
    for name in names {
        if let Some(path) = c.discovery(name) {
            let steps: Vec<String> = path.into_actions().iter().map(|a| format!("{a:?}")).collect();
            violations.push((name, steps.join(" → ")));
        }
    }
    Outcomes {
        unique_states: c.unique_state_count(),
        max_depth: c.max_depth(),
        seconds: t0.elapsed().as_secs_f64(),
        violations,
    }
}

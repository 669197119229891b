//! What a rule decides: allow, or which rule refuses and why (with the peer that made it).

use crate::view::{Peer, PeerState};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Rule A: T -rw-> X and X already committed or is prepared/committing: X's commit
    /// came (or will come) before T's prepare although CO needs T's commit first.
    RuleAOutEdge(Peer, PeerState),
    /// Rule A, conservative: PostgreSQL folded some of T's out-edges into a summary.
    RuleASummarized,
    /// Rule B: X -rw-> T and X is in doubt: T must not reach its commit point before X is
    /// decided. The caller refuses or waits for X and asks again.
    RuleBInDoubtReader(Peer, PeerState),
    /// Rule C: local reader L -rw-> Y where Y was prepared before L's snapshot.
    RuleCStaleLocalRead(Peer, PeerState),
    /// Rule S: a local writer T with an out-edge T -rw-> X to a transaction X that already
    /// reached its commit point (None: PostgreSQL summarized that edge), while a reader
    /// R concurrent with T was summarized: R -rw-> T may exist unrecorded, closing the
    /// cycle T -> X -> ... -> R -> T that PostgreSQL's own check cannot see.
    RuleSSummarizedReader(Option<(Peer, PeerState)>),
    /// Rule C for a READ ONLY reader L (only from [`decide_read_only`]): L's snapshot may
    /// have missed this 2PC transaction, prepared before that snapshot and committed since.
    RuleCReadOnly(MissedCommit),
}

/// The 2PC transaction a READ ONLY reader may have missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissedCommit {
    /// 0 when unknown (an overwritten or unreadable record, or an unknown xid).
    pub xid: u32,
    /// Its COMMIT PREPARED was still running.
    pub in_flight: bool,
}

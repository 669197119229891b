//! Node leases as grants. A daemon acts for a node only under a grant: the store's lease
//! row names its holder (unique per process start) and a generation that the store draws
//! from a counter that never goes back (not even when a row is deleted). Every grant —
//! a start, a takeover, a daemon taking its own node back after losing it — gets a new
//! generation; a renewal keeps it.
//!
//! Why a generation and not only the holder: a daemon paused past its lease may find, when
//! it wakes, its node taken over, finished and handed back (the row deleted). Claiming it
//! again under the same holder name would look like a renewal, and the daemon would go on
//! acting on what it held in memory from before — the takeover's aborts unseen (defect 1
//! of regress/pytest/coordinator/test_coordinator_stale.py). With generations, a renewal succeeds only when the row is still *the* grant
//! the daemon holds; anything else is [`Renewal::Lost`], and the daemon must drop its
//! memory before acting again under a new grant. Decision writes carry the grant they were
//! made under ([`Token`]); the store admits them only while that grant is in force
//! ([`admits`]), so a write issued before the loss cannot land after it.

/// One grant of a node's lease: who, and which grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token {
    pub holder: String,
    pub generation: i64,
}

/// A node's lease row as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    pub holder: String,
    pub generation: i64,
    /// By the store's clock; negative or zero: expired.
    pub expires_in_ms: i64,
}

/// Why a renewal failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// No row: a daemon that took the node over finished it and gave it back.
    Released,
    /// The row names another holder (a takeover), or another grant of ours.
    Regranted { holder: String, generation: i64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// Still our grant: extend its expiry.
    Renewed,
    /// Our grant is gone (even if we could claim the node again at once): whatever we
    /// held in memory may have been decided by another daemon meanwhile.
    Lost(Lost),
}

/// The renewal verdict on the row the store holds now.
pub fn renewal(row: Option<&Row>, mine: &Token) -> Renewal {
    match row {
        None => Renewal::Lost(Lost::Released),
        Some(r) if r.holder == mine.holder && r.generation == mine.generation => Renewal::Renewed,
        Some(r) => Renewal::Lost(Lost::Regranted { holder: r.holder.clone(), generation: r.generation }),
    }
}

/// The fencing check: a write made under grant `t` takes effect only while the row is
/// still that grant. An expired but untaken grant still admits: nobody else acts for a
/// node before its own claim has replaced the row (the claim is the store's serialization
/// point; the PostgreSQL store locks the row for the write's transaction).
pub fn admits(row: Option<&Row>, t: &Token) -> bool {
    matches!(renewal(row, t), Renewal::Renewed)
}

/// What a claim may do with the row it finds (`lock_free`: no live store session holds the
/// node). A claim always draws a new generation when granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimVerdict {
    Grant,
    /// Held by a live holder: refused.
    Held,
    /// Held by a holder whose lease ran out: end its store session first, then grant.
    FenceThenGrant,
}

pub fn claim(row: Option<&Row>, lock_free: bool, fence_expired: bool) -> ClaimVerdict {
    if lock_free {
        return ClaimVerdict::Grant;
    }
    match row {
        Some(r) if fence_expired && r.expires_in_ms <= 0 => ClaimVerdict::FenceThenGrant,
        // A session holds the lock but the row is gone or live: not ours to take.
        _ => ClaimVerdict::Held,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(h: &str, g: i64) -> Token {
        Token { holder: h.into(), generation: g }
    }
    fn row(h: &str, g: i64, exp: i64) -> Row {
        Row { holder: h.into(), generation: g, expires_in_ms: exp }
    }

    #[test]
    fn renewal_keeps_only_the_same_grant() {
        assert_eq!(renewal(Some(&row("a", 7, 100)), &t("a", 7)), Renewal::Renewed);
        // Expired but untouched: nobody acted meanwhile, still ours.
        assert_eq!(renewal(Some(&row("a", 7, -5000)), &t("a", 7)), Renewal::Renewed);
        // Defect 1: the row went (taken over, finished, given back).
        assert_eq!(renewal(None, &t("a", 7)), Renewal::Lost(Lost::Released));
        // Taken over.
        assert!(matches!(renewal(Some(&row("b", 8, 100)), &t("a", 7)), Renewal::Lost(Lost::Regranted { .. })));
        // Same holder name, another grant (we claimed it again after losing it).
        assert!(matches!(renewal(Some(&row("a", 9, 100)), &t("a", 7)), Renewal::Lost(_)));
    }

    #[test]
    fn writes_are_fenced_by_grant() {
        assert!(admits(Some(&row("a", 7, 100)), &t("a", 7)));
        assert!(!admits(Some(&row("a", 9, 100)), &t("a", 7)));
        assert!(!admits(None, &t("a", 7)));
    }

    #[test]
    fn claims() {
        assert_eq!(claim(None, true, false), ClaimVerdict::Grant);
        assert_eq!(claim(Some(&row("b", 1, 100)), false, true), ClaimVerdict::Held);
        assert_eq!(claim(Some(&row("b", 1, -1)), false, true), ClaimVerdict::FenceThenGrant);
        assert_eq!(claim(Some(&row("b", 1, -1)), false, false), ClaimVerdict::Held);
    }
}

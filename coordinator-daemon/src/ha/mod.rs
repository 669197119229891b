//! High availability: what this daemon owns in memory (`ownership`: node and holder ids,
//! the lease clock, grants, nodes taken over), owning a node id in the store and at each
//! resource (`lease`: claims, renewals, takeovers, the reaction to a lost grant; the
//! grants themselves decided by `cotx_protocol::lease`) and the witness file that refuses
//! a store gone back to an older copy.

pub mod lease;
pub mod ownership;
pub mod witness;

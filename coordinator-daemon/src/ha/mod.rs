//! High availability: what this daemon owns in memory (`ownership`: node and holder ids,
//! the lease clock, grants, nodes taken over), owning a node id in the store and at each
//! resource (`lease`: claims, renewals, the reaction to a lost grant; the grants
//! themselves decided by `cotx_protocol::lease`), taking over nodes whose lease ran out
//! (`takeover`), what these borrow of the daemon (`holding`: narrow parts, the memory of
//! transactions as a trait the coordinator implements, so ha/ sits below coordinator/), this daemon's clock against the
//! store's (`clock`, pure) and the witness file that refuses a store gone back to an
//! older copy.

pub mod clock;
pub mod holding;
pub mod lease;
pub mod ownership;
pub mod takeover;
pub mod witness;

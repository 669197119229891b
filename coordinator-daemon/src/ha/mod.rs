//! High availability: owning a node id (leases in the store, locks at each resource, the
//! grants themselves decided by `cotx_protocol::lease`) and the witness file that refuses a
//! store gone back to an older copy.

pub mod lease;
pub mod witness;

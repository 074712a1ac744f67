//! Layer 3 of docs/design.md ("Module graph"): what speaks the state's vocabulary without
//! running a node. This build's release and the kept releases, the leader's lease clock, the
//! Prometheus registry every layer records into, token hashing, and the state's invariants
//! checked after every entry.

pub mod clock;
pub(crate) mod metrics;
pub mod release;
pub(crate) mod secret;
pub mod self_check;

//! Layer 1 of docs/design.md ("Module graph"), the leaves: what every layer above uses and
//! which imports no other layer. The error of a write or read through the node, the stages of
//! a write and Raft's stamps of each entry, the node's tasks and how they stop, rate-limited log
//! lines, readiness for service managers, and refusing secret files others may read.

pub(crate) mod error;
pub(crate) mod log_limit;
pub mod notify;
pub mod private_file;
pub(crate) mod tasks;
pub(crate) mod write_trace;

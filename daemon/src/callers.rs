//! Layer 3 of docs/design.md ("Module graph"): the registries of callers waiting on this node,
//! all kept by key in one map (`watches::Keyed`): the queued acquires' tickets (`waiters`), and
//! the watches for holder changes, wait groups and barriers, and lease losses (`watches`). The
//! apply path (layer 5) feeds them; the waiting calls (layers 7 and 8) register in them.

pub(crate) mod waiters;
pub(crate) mod watches;

//! Layer 7 of docs/design.md ("Module graph"): what runs beside the node, through its paths. A
//! removed node retiring (`retire`), the leader's expiry ticker (`expiry`), and the request-side
//! wait of a queued acquire (`wait`), which registers with `callers::waiters` and proposes
//! through the node.

pub(crate) mod expiry;
pub mod retire;
pub(crate) mod wait;

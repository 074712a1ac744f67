//! Layer 9 of docs/design.md ("Module graph"): the HTTP/1.1 listeners. The status page (`ui`:
//! views read through the node's linearizable read, checked with the API's `Caller`), and
//! `/metrics` with its health (`metrics`).

pub(crate) mod metrics;
pub(crate) mod ui;

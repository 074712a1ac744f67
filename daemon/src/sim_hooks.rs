//! Layer 1 of docs/design.md ("Module graph"), the leaves: what a simulator fixes or injects,
//! importing no other layer. Random draws (seeded for one replayable run), blocking calls (run
//! inline), bugs put back, and failing or slow syncs and the writes a crash loses. Each acts
//! only on a thread that asked, and only in builds with the hooks (`SIM_HOOKS` in `lib.rs`).

pub mod blocking;
pub mod disk_faults;
pub mod entropy;
pub mod regressions;

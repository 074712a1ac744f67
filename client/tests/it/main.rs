//! The client crate's integration tests, one binary (`it`): each former test file is a module
//! here, so a test is named `<module>::<test>` (e.g. `cargo nextest run -p conch-client
//! -E 'test(/^locks::/)'`).

#[cfg(feature = "cli")]
mod cli;
mod client;
mod common;
mod holder_watch;
mod locks;

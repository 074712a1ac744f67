//! The wire: conch's messages against Grackle's field numbers.
//!
//! One test binary (`it`) per crate: each module was a test file of its own, so a test is named
//! `<module>::<test>`, e.g. `cargo nextest run -p conch-proto -E 'test(/^grackle_wire::/)'`.

mod build_watch;
mod grackle_lock_wire;
mod grackle_wire;

//! The simulator: replaying a seed, version skew, and the bugs it finds (`bugs`, in
//! `make test-all`).
//!
//! One test binary (`it`) per crate: each module was a test file of its own, so a test is named
//! `<module>::<test>`, e.g. `cargo nextest run -p conch-sim -E 'test(/^replay::/)'`.

mod bugs;
mod replay;
mod skew;

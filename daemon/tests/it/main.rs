//! conchd as a library: the embedding API, the module layers, a node's lifecycle.
//!
//! One test binary (`it`) per crate: each module was a test file of its own, so a test is named
//! `<module>::<test>`, e.g. `cargo nextest run -p conchd --test it -E 'test(/^layers::/)'`.

mod embedded;
mod layers;
mod lifecycle;
mod public_api;
mod shape;

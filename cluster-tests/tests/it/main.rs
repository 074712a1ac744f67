//! Process-level tests of conch: real conchd clusters on loopback ports chosen at run time.
//!
//! One test binary (`it`) per crate: each module was a test file of its own, so a test is named
//! `<module>::<test>`, e.g. `cargo nextest run -p cluster-tests -E 'test(/^locks::/)'`.

mod acquire_set;
mod auth;
mod backup;
mod bad_input;
mod bench;
mod cli;
mod cli_promises;
mod clock;
mod cluster;
mod daemon;
mod data_dir;
mod disk_full;
mod elect;
mod flood;
mod front_door;
mod health;
mod hold_limit;
mod jepsen;
mod lock_cli;
mod locks;
mod loss_pushed;
mod membership;
mod metrics;
mod misrouted;
mod once;
mod ops;
mod peer_identity;
mod revoke;
mod scripts;
mod service;
mod status_page;
mod sync;
mod tls;
mod upgrade;

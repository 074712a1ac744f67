//! conchd: the conch daemon. See the module docs for who owns what, and docs/design.md
//! ("Module graph") for which way the modules import each other.
//!
//! The crate is also a library for running a node inside another program: [`NodeConfig`]
//! describes the node, [`ConchNode::start`] runs it (exactly as the `conchd` binary does),
//! [`ConchNode::client`] is an in-process client of it, and [`ConchNode::shutdown`] stops it.
//! See [`embed`] for the guarantees and [`ConchNode`] for an example. The protocol messages and
//! generated clients are re-exported as [`proto`].

/// Whether this build has the simulator's hooks: bugs put back (`regressions`), invariants checked
/// after every entry (`self_check`), injected disk faults and the crash journal (`disk_faults`),
/// blocking work run inline (`blocking`), seeded randomness (`entropy`) and a replaced wall
/// clock (`clock::set_wall_clock`). They are compiled in, with this crate's unit tests, in the
/// builds the simulator runs in: those with `--cfg tokio_unstable`, which .cargo/config.toml sets
/// for workspace builds because the simulator's seeded runtime needs it (and conch-sim refuses
/// to run without it). One flag is the one switch between a test build and a release: `make
/// dist` builds with no rustflags, and there each hook is a test of this constant `false` that
/// the compiler removes with the code behind it, so the node's hot path carries none. In a
/// workspace build each hook costs a thread-local read and acts only on a thread that asked.
pub(crate) const SIM_HOOKS: bool = cfg!(any(test, tokio_unstable));

// The embedding API and what its signatures name.
pub mod config;
pub mod embed;
pub mod server;

pub use conch_proto as proto;
pub use embed::{ConchNode, EmbedError, LocalClient, NodeConfig};

// What the `conchd` binary and the workspace's tests use besides; not part of the embedding
// API.
#[doc(hidden)]
pub mod blocking;
#[doc(hidden)]
pub mod clock;
#[doc(hidden)]
pub mod disk_faults;
#[doc(hidden)]
pub mod entropy;
#[doc(hidden)]
pub mod listen_fds;
#[doc(hidden)]
pub mod node;
#[doc(hidden)]
pub mod notify;
#[doc(hidden)]
pub mod private_file;
#[doc(hidden)]
pub mod regressions;
#[doc(hidden)]
pub mod removal;
#[doc(hidden)]
pub mod restore;
#[doc(hidden)]
pub mod retire;
#[doc(hidden)]
pub mod self_check;
#[doc(hidden)]
pub mod storage_fault;
#[doc(hidden)]
pub mod transport;

mod api;
mod applied;
mod connections;
mod data_dir;
mod error;
mod expiry;
mod identity;
mod log_limit;
mod metrics;
mod metrics_http;
mod raft;
pub mod release;
mod secret;
mod state;
mod tasks;
mod tls;
mod ui;
mod upgrade;
mod wait;
mod waiters;
mod watches;
mod write_trace;

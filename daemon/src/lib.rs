//! conchd: the conch daemon. See the module docs for who owns what, and docs/design.md
//! ("Module graph") for which way the modules import each other.
//!
//! The crate is also a library for running a node inside another program: [`NodeConfig`]
//! describes the node, [`ConchNode::start`] runs it (exactly as the `conchd` binary does),
//! [`ConchNode::client`] is an in-process client of it, and [`ConchNode::shutdown`] stops it.
//! See [`embed`] for the guarantees and [`ConchNode`] for an example. The protocol messages and
//! generated clients are re-exported as [`proto`].

/// Whether this build has the simulator's hooks: bugs put back (`sim_hooks::regressions`),
/// invariants checked after every entry (`support::self_check`), injected disk faults and the
/// crash journal (`sim_hooks::disk_faults`), blocking work run inline (`sim_hooks::blocking`),
/// seeded randomness (`sim_hooks::entropy`) and a replaced wall clock
/// (`support::clock::set_wall_clock`). They are compiled in, with this crate's unit tests, in the
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

pub use conch_proto as proto;
pub use embed::server;
pub use embed::{ConchNode, EmbedError, LocalClient, NodeConfig};
pub use support::release;

// The layers of docs/design.md ("Module graph"), bottom first, one folder each; a module imports
// only from its own layer and those below. Those marked `#[doc(hidden)]` are what the `conchd`
// binary and the workspace's tests use besides; not part of the embedding API.

// 1. The leaves.
#[doc(hidden)]
pub mod base;
#[doc(hidden)]
pub mod net;
#[doc(hidden)]
pub mod sim_hooks;

// 2. The state machine.
mod state;

// 3. What speaks the state's vocabulary without running a node.
mod callers;
#[doc(hidden)]
pub mod support;

// 4. Configuration and what lies on disk (`config`, above, is one of them).
mod data_dir;
mod tls;

// 5. Raft and the applied state.
#[doc(hidden)]
pub mod raft;

// 6. The paths every request takes.
#[doc(hidden)]
pub mod node;

// 7. What runs beside the node.
#[doc(hidden)]
pub mod jobs;

// 8. The gRPC services.
mod api;

// 9. The HTTP listeners.
mod http;

// 10. Running a node: `embed`, above.

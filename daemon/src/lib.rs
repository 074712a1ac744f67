//! conchd: the conch daemon. See the module docs for who owns what.
//!
//! The crate is also a library for running a node inside another program: [`NodeConfig`]
//! describes the node, [`ConchNode::start`] runs it (exactly as the `conchd` binary does),
//! [`ConchNode::client`] is an in-process client of it, and [`ConchNode::shutdown`] stops it.
//! See [`embed`] for the guarantees and [`ConchNode`] for an example. The protocol messages and
//! generated clients are re-exported as [`proto`].

pub mod api;
pub mod applied;
pub mod clock;
pub mod config;
pub mod data_dir;
pub mod embed;
pub mod expiry;
pub mod identity;
pub mod listen_fds;
pub mod log_limit;
pub mod metrics;
pub mod node;
pub mod notify;
pub mod private_file;
pub mod raft;
pub mod removal;
pub mod restore;
pub mod server;
pub mod state;
pub mod storage_fault;
pub mod tasks;
pub mod tls;
pub mod wait;

pub use conch_proto as proto;
pub use embed::{ConchNode, EmbedError, LocalClient, NodeConfig};

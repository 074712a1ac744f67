//! conchd: the conch daemon. See the module docs for who owns what.

pub mod api;
pub mod applied;
pub mod clock;
pub mod config;
pub mod expiry;
pub mod identity;
pub mod metrics;
pub mod node;
pub mod notify;
pub mod raft;
pub mod restore;
pub mod server;
pub mod state;
pub mod tls;
pub mod wait;

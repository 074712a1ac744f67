//! Layer 1 of docs/design.md ("Module graph"), the leaves: how a node's connections come and
//! go, importing no other layer. Connections a program carries itself (the simulator's network),
//! the connection slots of every listener, and sockets passed by a service manager.

pub(crate) mod connections;
pub mod listen_fds;
pub mod transport;

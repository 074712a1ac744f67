//! openraft glue: type configuration, the log store (segment files and sled), the state-machine adapter and the
//! peer transport.

use std::io::Cursor;

use crate::state::{Batch, Reply};

mod codec;
pub mod early;
pub mod log_store;
pub mod network;
pub mod peer_target;
pub mod runtime;
pub mod state_machine;
pub mod wal;

openraft::declare_raft_types!(
    /// conch's Raft types: an entry carries a [`Batch`] of commands and answers one reply per
    /// command.
    pub TypeConfig:
        D = Batch,
        R = Vec<Reply>,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = runtime::ConchRuntime,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;

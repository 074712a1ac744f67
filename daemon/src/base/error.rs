//! The error of a write or read through the node, shared by every layer that passes it on
//! (the node, the waits, the API's one map to a status). A leaf: it imports no other module of
//! the daemon (a node id is Raft's `NodeId`, spelled out as the `u64` it is).

use serde::{Deserialize, Serialize};

/// How the status of a [`NodeError::NotLeader`] ends (see `api/status.rs`): a node that
/// forwarded a write reads it as "this node did not take it" (see `Node::commit_through`).
pub(crate) const NOT_LEADER_SUFFIX: &str = "is not the leader; retry";

/// Why a write or read could not be served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    Unavailable(String),
    /// A forwarded proposal reached a node that is not the leader.
    #[error("node {node} is not the leader")]
    NotLeader { node: u64 },
    #[error("{0}")]
    Internal(String),
    /// This node's storage failed (e.g. its disk is full); it is about to exit.
    #[error("{0}")]
    StorageFailed(String),
}

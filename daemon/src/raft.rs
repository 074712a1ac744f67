//! Layer 5 of docs/design.md ("Module graph"): openraft glue and what the node keeps of Raft.
//! Type configuration, the log store (segment files and sled), the state-machine adapter and
//! the peer transport; the applied state (`applied`); seeding a data directory from a backup
//! (`restore`); what a node's removal from the Raft membership is (`removal`); and stopping the
//! node when Raft's storage fails (`storage_fault`).

use std::io::Cursor;

use crate::state::{Batch, Cmd, Reply};

pub(crate) mod applied;
mod codec;
pub(crate) mod early;
pub(crate) mod log_store;
pub(crate) mod network;
pub(crate) mod peer_target;
pub mod removal;
pub mod restore;
pub(crate) mod runtime;
pub(crate) mod state_machine;
pub mod storage_fault;
pub(crate) mod wal;

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

pub(crate) type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub(crate) type LogId = openraft::LogId<NodeId>;
pub(crate) type StorageError = openraft::StorageError<NodeId>;

/// Whether a node that speaks cluster versions up to `cluster_version_max` can take `entries`
/// into its log: not one that raises the cluster version past it (a node of a release that
/// does not speak the new version could not even decode it). The refusal names the entry.
pub(crate) fn followable(
    entries: &[openraft::Entry<TypeConfig>],
    cluster_version_max: u32,
) -> Result<(), String> {
    for entry in entries {
        let openraft::EntryPayload::Normal(batch) = &entry.payload else {
            continue;
        };
        for cmd in &batch.cmds {
            if let Cmd::SetClusterVersion { version } = cmd.unwrapped()
                && *version > cluster_version_max
            {
                return Err(format!(
                    "log entry {} raises the cluster version to {version}, and this node speaks \
                     cluster version {cluster_version_max} at most: it cannot follow the log \
                     past it (run a release that speaks cluster version {version} on it)",
                    entry.log_id.index
                ));
            }
        }
    }
    Ok(())
}

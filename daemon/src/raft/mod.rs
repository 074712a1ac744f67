//! openraft glue: type configuration, the log store (segment files and sled), the state-machine adapter and the
//! peer transport.

use std::io::Cursor;

use crate::state::{Batch, Cmd, Reply};

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

/// Whether a node that speaks cluster versions up to `cluster_version_max` can take `entries`
/// into its log: not one that raises the cluster version past it (a node of a release that
/// does not speak the new version could not even decode it). The refusal names the entry.
pub fn followable(
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

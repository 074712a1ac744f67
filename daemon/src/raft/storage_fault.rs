//! A write to the data directory that fails while serving (the disk is full, an I/O error)
//! stops the node: it exits with [`EXIT_STORAGE`] and one line naming the cause, and a
//! supervisor restarts it once the disk has space again.
//!
//! Why not carry on in the same process: openraft stops its core for good on any storage
//! error, and sled refuses every later write once a flush has failed. Nothing acknowledged is
//! lost: an append is acknowledged only after its flush succeeded, and a restart reads the log
//! the way it does after a crash (see "Storage durability order" in docs/design.md).
//!
//! A Raft core that stops on a panic is treated the same way: the node cannot serve without
//! it, so it exits with the same status and a line saying so, rather than answering errors
//! forever.
//!
//! Between the failure and the exit (milliseconds), requests to the node are answered
//! UNAVAILABLE with [`NodeError::StorageFailed`], which names the full disk; clients retry on
//! another node.

use openraft::error::{Fatal, RaftError};

use crate::base::error::NodeError;
use crate::raft::{NodeId, Raft};

/// Exit status after a storage failure while serving (sysexits' `EX_IOERR`): distinct from a
/// startup or usage failure, so a supervisor can restart the node on it.
pub const EXIT_STORAGE: u8 = 74;

/// The node stopped because its storage failed; the message names the cause.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StorageFailed(pub String);

/// Whether an error text says the disk is full (`ENOSPC`).
pub(crate) fn is_disk_full(text: &str) -> bool {
    text.contains("No space left on device")
        || text.contains("os error 28")
        || text.contains("code: 28")
        || text.contains("StorageFull")
}

/// What a fatal Raft error means for this node, or `None` for a normal stop.
pub fn describe(node: NodeId, fatal: &Fatal<NodeId>) -> Option<String> {
    match fatal {
        Fatal::Stopped => None,
        Fatal::Panicked => Some(format!("node {node} stopped: its raft core panicked")),
        Fatal::StorageError(e) => {
            let text = e.to_string();
            Some(if is_disk_full(&format!("{text} {e:?}")) {
                format!(
                    "node {node} stopped: the disk holding its data directory is full (no space \
                     left on device); start it again once there is space"
                )
            } else {
                format!("node {node} stopped: its data directory could not be written: {text}")
            })
        }
    }
}

/// The error for a request that failed in Raft: [`NodeError::StorageFailed`] when the core
/// stopped on a storage failure, else UNAVAILABLE with `what` and the error.
pub(crate) fn node_error<E: std::error::Error>(
    node: NodeId,
    what: &str,
    e: &RaftError<NodeId, E>,
) -> NodeError {
    if let RaftError::Fatal(fatal) = e
        && let Some(message) = describe(node, fatal)
    {
        return NodeError::StorageFailed(format!("{message}; retry on another node"));
    }
    NodeError::Unavailable(format!("{what}: {e}"))
}

/// Resolves when the Raft core has stopped on a storage failure (or a panic), with the line to
/// exit with; never resolves for a node that keeps running or stops normally.
pub async fn failed(node: NodeId, raft: Raft) -> StorageFailed {
    // openraft's core records why it stopped in its metrics, then drops its senders: wait for
    // the server metrics (which change only with the role, vote or membership, not at every
    // write as the full metrics do) to close, then read the reason.
    let mut server = raft.server_metrics();
    while server.changed().await.is_ok() {}
    if let Err(fatal) = &raft.metrics().borrow().running_state
        && let Some(message) = describe(node, fatal)
    {
        return StorageFailed(message);
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

    fn storage_error(io: std::io::Error) -> Fatal<NodeId> {
        let e: openraft::StorageError<NodeId> =
            StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Write, AnyError::new(&io)).into();
        Fatal::StorageError(e)
    }

    #[test]
    fn a_full_disk_is_named_and_a_normal_stop_is_not_a_failure() {
        let full = storage_error(std::io::Error::from_raw_os_error(28));
        let message = describe(3, &full).unwrap_or_default();
        assert!(message.contains("node 3"), "{message}");
        assert!(message.contains("disk holding its data directory is full"));

        let eio = storage_error(std::io::Error::from_raw_os_error(5));
        let message = describe(3, &eio).unwrap_or_default();
        assert!(message.contains("could not be written"), "{message}");
        assert!(!message.contains("full"), "{message}");

        assert_eq!(describe(3, &Fatal::Stopped), None);
    }

    #[test]
    fn a_request_failing_on_a_stopped_core_names_the_full_disk() {
        let e: RaftError<NodeId, openraft::error::ClientWriteError<NodeId, openraft::BasicNode>> =
            RaftError::Fatal(storage_error(std::io::Error::from_raw_os_error(28)));
        match node_error(2, "raft write failed", &e) {
            NodeError::StorageFailed(m) => {
                assert!(
                    m.contains("is full") && m.contains("retry on another node"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

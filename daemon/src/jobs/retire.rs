//! Removal at work on a running node (see `removal.rs` for the protocol): following the
//! applied membership, taking a notice from the leader, retiring, and telling a removed node.

use std::sync::atomic::Ordering;

use conch_proto::conch::PeerMessage;
use openraft::{BasicNode, Membership};

use crate::base::error::NodeError;
use crate::node::Node;
use crate::raft::NodeId;
use crate::raft::network::{decode, encode};
use crate::raft::removal::{
    RETIRE_QUIET, Removed, RemovedNotice, TELL_EVERY, TELL_FOR, describe, names,
};

/// Follows the membership this node has applied until Raft stops, and retires the node when
/// that membership leaves it out after it had been a member.
pub async fn watch(node: std::sync::Arc<Node>) {
    // Woken by the server metrics (which change only with the role, vote or membership; the
    // full metrics change at every step of every write), and by the full metrics only while a
    // membership that leaves this node out waits to be applied.
    let mut server = node.raft.server_metrics();
    let mut metrics = node.raft.metrics();
    loop {
        // The membership from the server metrics: openraft sends them before the full metrics
        // in each report, so the full metrics read right after a wake-up may still hold the
        // membership before the change.
        let stored = server.borrow_and_update().membership_config.clone();
        let mut awaiting_apply = false;
        let left_out = {
            let m = metrics.borrow_and_update();
            if names(stored.membership(), node.id) {
                node.removal.seen_member.store(true, Ordering::Release);
                None
            } else if node.removal.seen_member.load(Ordering::Acquire) {
                awaiting_apply = *stored.log_id() > m.last_applied;
                (!awaiting_apply).then(|| stored.membership().clone())
            } else {
                None
            }
        };
        if let Some(membership) = left_out {
            // A node wiped and added back replays the log, its own earlier removal included,
            // and its log can end in that removal until the entry that added it back arrives.
            // A removed node receives no entries; a node catching up receives them at once.
            let last = metrics.borrow().last_log_index;
            match tokio::time::timeout(RETIRE_QUIET, next_entry(&mut metrics, last)).await {
                Err(_quiet) => {
                    retire(&node, &membership);
                    return;
                }
                Ok(true) => continue,
                Ok(false) => return,
            }
        }
        let closed = if awaiting_apply {
            metrics.changed().await.is_err()
        } else {
            server.changed().await.is_err()
        };
        if closed {
            return;
        }
    }
}

/// Waits until the log holds an entry past `last`: `false` once Raft has stopped.
async fn next_entry(
    metrics: &mut tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>>,
    last: Option<u64>,
) -> bool {
    loop {
        if metrics.changed().await.is_err() {
            return false;
        }
        if metrics.borrow_and_update().last_log_index != last {
            return true;
        }
    }
}

/// Takes a leader's notice (`ConchPeer.Removed`): retires this node if the notice holds.
pub(crate) fn notice(node: &Node, notice: RemovedNotice) -> Result<(), NodeError> {
    if names(&notice.membership, node.id) {
        return Err(NodeError::Internal(format!(
            "a removal notice whose membership names node {}",
            node.id
        )));
    }
    let (own_log_id, named) = {
        let metrics = node.raft.metrics();
        let m = metrics.borrow();
        let stored = &m.membership_config;
        (*stored.log_id(), names(stored.membership(), node.id))
    };
    if named {
        node.removal.seen_member.store(true, Ordering::Release);
    }
    if !node.removal.seen_member.load(Ordering::Acquire) {
        tracing::info!("told of a removal before being added: ignored");
        return Ok(());
    }
    if named && own_log_id > Some(notice.log_id) {
        tracing::info!(
            notice_index = notice.log_id.index,
            "told of a removal older than this node's membership: ignored"
        );
        return Ok(());
    }
    retire(node, &notice.membership);
    Ok(())
}

/// Once only: logs the removal, records it in the data directory and stops Raft.
fn retire(node: &Node, membership: &Membership<NodeId, BasicNode>) {
    let text = describe(membership);
    let first = node.removal.removed.send_if_modified(|removed| {
        if removed.is_some() {
            return false;
        }
        *removed = Some(text.clone());
        true
    });
    if !first {
        return;
    }
    tracing::warn!(
        "this node was removed from the cluster (membership now {text}); it stops taking part: \
         stop it, or wipe its data directory and add it again"
    );
    if let Err(e) = crate::data_dir::record_removed(&node.config.data_dir, &text) {
        tracing::warn!(error = %e, "could not record the removal in the data directory");
    }
    let raft = node.raft.clone();
    node.tasks.spawn(async move {
        if let Err(e) = raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    });
}

/// Resolves once this node was removed from the cluster; never while it is a member.
pub async fn removed(node: std::sync::Arc<Node>) -> Removed {
    let mut removal = node.removal.removed.subscribe();
    loop {
        if let Some(membership) = removal.borrow_and_update().clone() {
            return Removed {
                node: node.id,
                membership,
            };
        }
        if removal.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Tells node `id` (advertised at `addr`) that it was removed, in the background: retries for
/// [`TELL_FOR`], then logs that the node must be stopped by hand.
pub fn tell(node: std::sync::Arc<Node>, id: NodeId, addr: String, notice: RemovedNotice) {
    let tasks = node.tasks.clone();
    tasks.spawn(async move {
        let payload = match encode(&notice) {
            Ok(payload) => payload,
            Err(e) => {
                tracing::error!(node_id = id, error = %e, "encode a removal notice");
                return;
            }
        };
        let deadline = tokio::time::Instant::now() + TELL_FOR;
        loop {
            let added_back = {
                let metrics = node.raft.metrics();
                let m = metrics.borrow();
                names(m.membership_config.membership(), id)
            };
            if added_back {
                // Wiped and added back meanwhile: the notice is about a node that is gone.
                tracing::info!(node_id = id, "node {id} is a member again: not told");
                return;
            }
            let answer = async {
                let mut peer = node.peer_of(id, &addr).map_err(|e| e.to_string())?;
                let mut request = tonic::Request::new(PeerMessage {
                    payload: payload.clone(),
                });
                request.set_timeout(TELL_EVERY * 4);
                crate::raft::peer_target::name_target(&mut request, id);
                let reply = peer.removed(request).await.map_err(|status| {
                    if status.code() == tonic::Code::Unimplemented {
                        "it runs a conchd that cannot be told".to_string()
                    } else {
                        status.message().to_string()
                    }
                })?;
                decode::<Result<(), NodeError>>(&reply.into_inner().payload)
                    .map_err(|e| format!("undecodable reply: {e}"))?
                    .map_err(|e| e.to_string())
            }
            .await;
            match answer {
                Ok(()) => {
                    tracing::info!(node_id = id, "told node {id} it was removed");
                    return;
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(
                        node_id = id,
                        error = %e,
                        "could not tell node {id} it was removed: stop it"
                    );
                    return;
                }
                Err(_) => tokio::time::sleep(TELL_EVERY).await,
            }
        }
    });
}

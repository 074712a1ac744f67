//! A node removed from its cluster stops taking part.
//!
//! openraft's leader stops replicating to a node as soon as it appends the membership that
//! leaves the node out, so Raft never shows a removed node its removal: left alone, it would
//! keep its last membership, miss the leader's heartbeats and campaign in ever higher terms.
//! Hence:
//! - `conch cluster remove` (see `api/conch.rs`) first turns a removed voter into a learner (a
//!   learner never campaigns and still receives the log), then takes it out, then tells every
//!   node it took out over `ConchPeer.Removed`, with the committed membership (retrying for
//!   [`TELL_FOR`]). A leader that removes itself needs no message: it applies that membership.
//! - A node takes itself as removed when told so, or when the membership it has applied leaves
//!   it out, but only once it has seen itself in a membership (voter or learner): a `--join`
//!   node waiting to be added, whose membership does not name it yet, never trips.
//! - Removed, it logs one line at warn, records `removed` in its data directory (a later start
//!   is refused, see `data_dir.rs`), stops its Raft core (no more elections) and answers every
//!   client call UNAVAILABLE saying it was removed. `conchd` then exits with [`EXIT_REMOVED`];
//!   an embedded node stays up, refusing calls, until it is shut down.
//!
//! Invariants:
//! - a node is removed at most once, and only after it has seen itself a member
//! - a notice naming this node, or older than a membership that names it, changes nothing

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use conch_proto::conch::PeerMessage;
use openraft::{BasicNode, Membership};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::node::{Node, NodeError};
use crate::raft::network::{decode, encode};
use crate::raft::{LogId, NodeId};

/// Exit status of `conchd` once its node was removed from the cluster, and of a start on the
/// data directory of a removed node (sysexits' `EX_CONFIG`: the cluster's configuration no
/// longer has this node). Restarting does not help, so a supervisor should not.
pub const EXIT_REMOVED: u8 = 78;

/// How long a leader keeps trying to tell a node it removed.
pub const TELL_FOR: Duration = Duration::from_secs(10);
/// Pause between two tries.
const TELL_EVERY: Duration = Duration::from_millis(500);

/// What a leader sends a node it removed: the committed membership that leaves it out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RemovedNotice {
    pub log_id: LogId,
    pub membership: Membership<NodeId, BasicNode>,
}

/// This node's own view of its removal.
pub struct Removal {
    /// This node has been in a membership (voter or learner).
    seen_member: AtomicBool,
    /// The membership that left it out, once it is removed.
    removed: watch::Sender<Option<String>>,
}

impl Default for Removal {
    fn default() -> Self {
        Removal {
            seen_member: AtomicBool::new(false),
            removed: watch::channel(None).0,
        }
    }
}

impl Removal {
    /// The membership that left this node out, once it was removed.
    pub fn removed(&self) -> Option<String> {
        self.removed.borrow().clone()
    }

    /// The error every client call gets once node `id` was removed.
    pub fn error(&self, id: NodeId) -> Option<NodeError> {
        self.removed().map(|membership| {
            NodeError::Unavailable(format!(
                "node {id} was removed from the cluster (membership now {membership}); it no \
                 longer serves: use another node"
            ))
        })
    }
}

/// The node stopped because it was removed from the cluster.
#[derive(Debug, thiserror::Error)]
#[error("node {node} was removed from the cluster (membership now {membership}); stopped")]
pub struct Removed {
    pub node: NodeId,
    pub membership: String,
}

/// A membership in one short form: `{voters: [1, 2], learners: [4]}`.
pub fn describe(membership: &Membership<NodeId, BasicNode>) -> String {
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let learners: Vec<NodeId> = membership.learner_ids().collect();
    format!("{{voters: {voters:?}, learners: {learners:?}}}")
}

fn names(membership: &Membership<NodeId, BasicNode>, id: NodeId) -> bool {
    membership.get_node(&id).is_some()
}

/// Follows the membership this node has applied until Raft stops, and retires the node when
/// that membership leaves it out after it had been a member.
pub async fn watch(node: std::sync::Arc<Node>) {
    let mut metrics = node.raft.metrics();
    loop {
        let left_out = {
            let m = metrics.borrow_and_update();
            let stored = &m.membership_config;
            if names(stored.membership(), node.id) {
                node.removal.seen_member.store(true, Ordering::Release);
                None
            } else if node.removal.seen_member.load(Ordering::Acquire)
                && *stored.log_id() <= m.last_applied
            {
                Some(stored.membership().clone())
            } else {
                None
            }
        };
        if let Some(membership) = left_out {
            retire(&node, &membership);
            return;
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Takes a leader's notice (`ConchPeer.Removed`): retires this node if the notice holds.
pub fn notice(node: &Node, notice: RemovedNotice) -> Result<(), NodeError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn membership(voters: &[u64], learners: &[u64]) -> Membership<NodeId, BasicNode> {
        let nodes: BTreeMap<u64, BasicNode> = voters
            .iter()
            .chain(learners)
            .map(|id| (*id, BasicNode::new(format!("127.0.0.1:{id}"))))
            .collect();
        let voters: BTreeSet<u64> = voters.iter().copied().collect();
        Membership::new(vec![voters], nodes)
    }

    #[test]
    fn memberships_are_described_and_name_voters_and_learners() {
        let m = membership(&[1, 2], &[4]);
        assert_eq!(describe(&m), "{voters: [1, 2], learners: [4]}");
        assert!(names(&m, 1) && names(&m, 4));
        assert!(!names(&m, 3));
        assert!(
            !names(&Membership::default(), 1),
            "a new node is named nowhere"
        );
    }

    #[test]
    fn a_removed_node_says_so_to_its_callers() {
        let removal = Removal::default();
        assert!(removal.error(3).is_none());
        let _ = removal
            .removed
            .send_replace(Some("{voters: [1, 2], learners: []}".into()));
        match removal.error(3) {
            Some(NodeError::Unavailable(message)) => {
                assert!(message.contains("node 3 was removed"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}

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
//!   node waiting to be added, whose membership does not name it yet, never trips. A
//!   membership that leaves it out counts only after [`RETIRE_QUIET`] without a new log entry:
//!   a node wiped and added back replays the log, its own earlier removal included, and while
//!   its log ends in that removal more entries keep coming; a removed node gets none.
//! - A leader stops telling a node it removed once its membership names that node again (it
//!   was wiped and added back meanwhile).
//! - Removed, it logs one line at warn, records `removed` in its data directory (a later start
//!   is refused, see `data_dir.rs`), stops its Raft core (no more elections) and answers every
//!   client call UNAVAILABLE saying it was removed. `conchd` then exits with [`EXIT_REMOVED`];
//!   an embedded node stays up, refusing calls, until it is shut down.
//!
//! This file holds what removal is (the notice, the node's own record of it, the exit status);
//! `retire.rs` runs it on a node.
//!
//! Invariants:
//! - a node is removed at most once, and only after it has seen itself a member
//! - a notice naming this node, or older than a membership that names it, changes nothing

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use openraft::{BasicNode, Membership};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::base::error::NodeError;
use crate::raft::{LogId, NodeId};

/// Exit status of `conchd` once its node was removed from the cluster, and of a start on the
/// data directory of a removed node (sysexits' `EX_CONFIG`: the cluster's configuration no
/// longer has this node). Restarting does not help, so a supervisor should not.
pub const EXIT_REMOVED: u8 = 78;

/// How long a leader keeps trying to tell a node it removed.
pub(crate) const TELL_FOR: Duration = Duration::from_secs(10);
/// Pause between two tries.
pub(crate) const TELL_EVERY: Duration = Duration::from_millis(500);
/// How long a node whose applied membership leaves it out waits for a further log entry
/// before it takes itself as removed.
pub(crate) const RETIRE_QUIET: Duration = Duration::from_secs(5);

/// What a leader sends a node it removed: the committed membership that leaves it out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RemovedNotice {
    pub log_id: LogId,
    pub membership: Membership<NodeId, BasicNode>,
}

/// This node's own view of its removal.
pub struct Removal {
    /// This node has been in a membership (voter or learner).
    pub(crate) seen_member: AtomicBool,
    /// The membership that left it out, once it is removed.
    pub(crate) removed: watch::Sender<Option<String>>,
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

pub(crate) fn names(membership: &Membership<NodeId, BasicNode>, id: NodeId) -> bool {
    membership.get_node(&id).is_some()
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

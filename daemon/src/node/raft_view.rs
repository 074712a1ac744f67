//! What the API layer sees of Raft and asks of it, in conch's terms: the members, one status
//! record, a watch of its changes, membership changes, campaigning, snapshots, and the peer
//! RPCs handed in. The API names no openraft type but the peer RPCs' own messages; openraft's
//! errors come back as their message, for `api/status.rs` to map.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState};
use tokio::sync::watch;

use super::{Node, known_leader};
use crate::raft::removal::RemovedNotice;
use crate::raft::{NodeId, TypeConfig};

/// One member of the membership this node knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
}

/// A change of the membership, made on the leader.
#[derive(Clone, Debug)]
pub enum MembershipChange {
    /// These voters become learners.
    RemoveVoters(BTreeSet<NodeId>),
    /// These members (voters or learners) leave the cluster.
    RemoveNodes(BTreeSet<NodeId>),
    /// The voters become exactly these (members already).
    Voters(BTreeSet<NodeId>),
}

/// A committed membership change.
#[derive(Clone, Debug)]
pub struct MembershipChanged {
    pub log_index: u64,
    /// What to tell the nodes it took out (see `removal.rs`).
    pub notice: Option<RemovedNotice>,
}

/// Raft as this node sees it at one moment.
#[derive(Clone, Debug)]
pub(crate) struct RaftStatus {
    pub term: u64,
    /// `Leader`, `Follower`, `Candidate`, `Learner` or `Shutdown`.
    pub state: String,
    /// This node's state is `Leader`.
    pub leading: bool,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    /// The leader Raft names (possibly this node, unconfirmed).
    pub current_leader: Option<NodeId>,
    /// The leader as far as this node knows (see [`known_leader`]).
    pub known_leader: Option<NodeId>,
    /// Since a quorum last acknowledged this node as leader.
    pub millis_since_quorum_ack: Option<u64>,
}

impl RaftStatus {
    fn of(metrics: &RaftMetrics<NodeId, BasicNode>, own_id: NodeId) -> RaftStatus {
        RaftStatus {
            term: metrics.current_term,
            state: format!("{:?}", metrics.state),
            leading: metrics.state == ServerState::Leader,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            applied_index: metrics.last_applied.map(|l| l.index).unwrap_or(0),
            snapshot_index: metrics.snapshot.map(|l| l.index).unwrap_or(0),
            current_leader: metrics.current_leader,
            known_leader: known_leader(metrics, own_id),
            millis_since_quorum_ack: metrics.millis_since_quorum_ack,
        }
    }
}

/// Raft's status as it changes.
pub(crate) struct RaftWatch {
    metrics: watch::Receiver<RaftMetrics<NodeId, BasicNode>>,
    own_id: NodeId,
}

impl RaftWatch {
    /// The status now; [`RaftWatch::changed`] then reports only later changes.
    pub(crate) fn status(&mut self) -> RaftStatus {
        RaftStatus::of(&self.metrics.borrow_and_update(), self.own_id)
    }

    /// Waits for the next change; `Err` once Raft has stopped.
    pub(crate) async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.metrics.changed().await
    }
}

impl Node {
    /// The members of the membership this node knows, in id order.
    pub fn members(&self) -> Vec<Member> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect()
    }

    /// While this node leads: the last log index each member is known to hold (0 when none
    /// yet), for the members' replication lag. `None` on any other node.
    pub fn replication(&self) -> Option<BTreeMap<NodeId, u64>> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let replication = metrics.replication.as_ref()?;
        Some(
            replication
                .iter()
                .map(|(id, matched)| (*id, matched.map_or(0, |l| l.index)))
                .collect(),
        )
    }

    pub(crate) fn raft_status(&self) -> RaftStatus {
        RaftStatus::of(&self.raft.metrics().borrow(), self.id)
    }

    pub(crate) fn watch_raft(&self) -> RaftWatch {
        RaftWatch {
            metrics: self.raft.metrics(),
            own_id: self.id,
        }
    }

    /// Adds node `id` at `addr` as a learner (on the leader), once it has caught up; returns
    /// the log index of the change.
    pub async fn add_learner(&self, id: NodeId, addr: String) -> Result<u64, String> {
        self.raft
            .add_learner(id, BasicNode { addr }, true)
            .await
            .map(|response| response.log_id.index)
            .map_err(|e| e.to_string())
    }

    /// Changes the membership (on the leader); `retain`: removed voters stay as learners.
    pub async fn change_membership(
        &self,
        change: MembershipChange,
        retain: bool,
    ) -> Result<MembershipChanged, String> {
        let result = match change {
            MembershipChange::RemoveVoters(ids) => {
                self.raft
                    .change_membership(ChangeMembers::RemoveVoters(ids), retain)
                    .await
            }
            MembershipChange::RemoveNodes(ids) => {
                self.raft
                    .change_membership(ChangeMembers::RemoveNodes(ids), retain)
                    .await
            }
            MembershipChange::Voters(ids) => self.raft.change_membership(ids, retain).await,
        };
        result
            .map(|response| MembershipChanged {
                log_index: response.log_id.index,
                notice: response.membership.map(|membership| RemovedNotice {
                    log_id: response.log_id,
                    membership,
                }),
            })
            .map_err(|e| e.to_string())
    }

    /// Starts an election with this node as the candidate.
    pub async fn campaign(&self) -> Result<(), String> {
        self.raft.trigger().elect().await.map_err(|e| e.to_string())
    }

    /// Asks Raft to build a snapshot now (it completes in the background).
    pub async fn trigger_snapshot(&self) -> Result<(), String> {
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| e.to_string())
    }

    /// A peer's `AppendEntries`, handed to Raft.
    pub async fn append_entries(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.raft.append_entries(rpc).await
    }

    /// A peer's `Vote`, handed to Raft.
    pub async fn vote(
        &self,
        rpc: VoteRequest<NodeId>,
    ) -> Result<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.raft.vote(rpc).await
    }

    /// A peer's `InstallSnapshot` chunk, handed to Raft.
    pub(crate) async fn install_snapshot(
        &self,
        rpc: InstallSnapshotRequest<TypeConfig>,
    ) -> Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.raft.install_snapshot(rpc).await
    }
}

//! The read path: a linearizable read waits for a read index (leadership confirmed by a quorum,
//! on this node as leader or through the leader), gathered once for every read that arrived
//! meanwhile, then for this node to apply up to it.

use std::sync::Arc;

use conch_proto::conch::PeerMessage;
use tokio::sync::{mpsc, oneshot};

use super::call_failure::peer_failure;
use super::leader_wait::{LeaderWait, Woken};
use super::{LeaderInfo, Node, shutting_down};
use crate::base::error::NodeError;
use crate::raft::network::decode;
use crate::raft::storage_fault;

impl Node {
    /// Waits until a read on this node is linearizable: leadership confirmed by a quorum after
    /// the call began, and this node applied everything committed before it.
    pub async fn linearizable(&self) -> Result<(), NodeError> {
        let (reply, rx) = oneshot::channel();
        self.reads.send(reply).await.map_err(|_| shutting_down())?;
        rx.await.map_err(|_| shutting_down())?.map(|_| ())
    }

    /// Read index for a linearizable read (also the leader side of `ConchPeer.ReadIndex`):
    /// leadership confirmed by a quorum, then the larger of Raft's read index and the last log
    /// entry this process started with.
    ///
    /// Raft's read index is its commit index, or the first entry of the leader's term if that
    /// is later. A leader that restarts wins a new term (see
    /// `raft::early::EarlyReplication::vote_at_start`) but does not keep its commit index
    /// (saved lazily), and a lone node's new term may start before its old entries are applied:
    /// so right after a restart (every node killed at once, say) that index can be
    /// below writes acknowledged before it, and a read would miss them. Every acknowledged
    /// write is in the log this process started with, so a read waits for that much to apply.
    pub(crate) async fn read_index_as_leader(&self) -> Result<u64, NodeError> {
        match self.raft.get_read_log_id().await {
            Ok((read_log_id, _)) => {
                let index = read_log_id.map(|l| l.index).unwrap_or(0);
                if crate::sim_hooks::regressions::active(
                    crate::sim_hooks::regressions::Bug::StaleReadAfterRestart,
                ) {
                    return Ok(index);
                }
                Ok(index.max(self.log_at_start))
            }
            Err(e) => match e.forward_to_leader() {
                Some(_) => Err(NodeError::NotLeader { node: self.id }),
                None => Err(storage_fault::node_error(self.id, "confirm leadership", &e)),
            },
        }
    }

    pub(super) async fn run_read_index(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<oneshot::Sender<Result<u64, NodeError>>>,
    ) {
        loop {
            let Some(first) = rx.recv().await else { return };
            let mut waiting = vec![first];
            while let Ok(next) = rx.try_recv() {
                waiting.push(next);
            }
            let mut result = self.read_index().await;
            if let Ok(index) = result {
                // Bounded: an index that this node's log will not reach (its entries were
                // replaced after a leader change) must not hold the reads forever.
                let applied =
                    tokio::time::timeout(self.config.leader_wait, self.applied.wait_applied(index))
                        .await;
                if applied.is_err() {
                    result = Err(NodeError::Unavailable(format!(
                        "this node did not apply up to the read index {index} within {} ms; retry",
                        self.config.leader_wait.as_millis()
                    )));
                }
            }
            for reply in waiting {
                let _ = reply.send(result.clone());
            }
        }
    }

    async fn read_index(&self) -> Result<u64, NodeError> {
        let deadline = tokio::time::Instant::now() + self.config.leader_wait;
        let mut pause = LeaderWait::new(self.raft.server_metrics());
        loop {
            let leader = self.await_leader(deadline).await?;
            let result = if leader.id == self.id {
                self.read_index_as_leader().await
            } else {
                self.read_index_through(&leader).await
            };
            match result {
                Err(NodeError::NotLeader { .. }) if tokio::time::Instant::now() < deadline => {
                    if pause.after_refusal(&leader, deadline).await == Woken::Closed {
                        return Err(shutting_down());
                    }
                }
                Err(NodeError::NotLeader { .. }) => return Err(self.no_leader_error()),
                other => return other,
            }
        }
    }

    async fn read_index_through(&self, leader: &LeaderInfo) -> Result<u64, NodeError> {
        let mut client = self.peer(leader)?;
        self.metrics.forwarded.with_label_values(&["read"]).inc();
        let mut request = tonic::Request::new(PeerMessage {
            payload: Vec::new(),
        });
        request.set_timeout(self.config.leader_wait);
        let response = client.read_index(request).await.map_err(|status| {
            peer_failure(
                &status,
                leader,
                format!("read index from leader {}", leader.id),
                "",
            )
        })?;
        let result: Result<u64, NodeError> = decode(&response.into_inner().payload)
            .map_err(|e| NodeError::Internal(format!("decode leader reply: {e}")))?;
        result
    }
}

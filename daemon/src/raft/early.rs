//! Early replication: the leader hands each append to its followers before its own `fdatasync`.
//!
//! openraft 0.9 runs the leader's log append to the end (its `fdatasync` included) before it
//! starts replicating the entries, so a write pays two syncs one after the other: the leader's,
//! then a follower's. Here the log store, as it appends on the leader, also sends the same
//! entries to every other member as an ordinary AppendEntries (the leader's vote, the entry
//! before them as `prev_log_id`, no commit index), on a connection of its own. The follower
//! appends and syncs them while the leader syncs; when openraft's own AppendEntries arrives with
//! the same entries, the follower finds them in its log and answers at once.
//!
//! Why this keeps Raft's guarantees: an early AppendEntries is a message the leader could have
//! sent at any time (its entries are the leader's log, under the leader's vote), so to a
//! follower it is a duplicated or reordered message, which Raft tolerates. Its reply is thrown
//! away: openraft counts a follower's copy, and the leader's own, only from its own messages and
//! only once synced, so an entry is still committed, and a write acknowledged, only once it is
//! on disk on a majority. A follower whose log does not end at `prev_log_id` refuses it (or drops
//! a conflicting tail the leader's own replication would drop too), and carries on.
//!
//! Early sends never wait: each member has a queue of one; when a send to a member is still on
//! its way, the next append is not sent early to it (openraft's replication sends it anyway).
//! Only a node whose saved vote is its own committed vote (the leader) sends.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::AppendEntriesRequest;
use openraft::{BasicNode, Entry, Vote};
use tokio::sync::{mpsc, watch};

use super::network::PeerNetwork;
use super::{LogId, NodeId, TypeConfig};

/// How long an early AppendEntries may take before it is given up.
const SEND_TTL: Duration = Duration::from_secs(1);

/// The leader's early sends (see the module docs). One per node, shared by its log store and
/// the task that keeps the members' connections ([`EarlyReplication::run`]).
pub(crate) struct EarlyReplication {
    id: NodeId,
    enabled: bool,
    /// Whether this is a node's log store (not a tool's), whose vote at start is checked.
    node: bool,
    /// The vote read at start named this node as the leader of its term: see
    /// [`EarlyReplication::vote_at_start`].
    restarted_leader: std::sync::atomic::AtomicBool,
    /// The vote as the log store last saved (or read) it.
    vote: Mutex<Option<Vote<NodeId>>>,
    /// A queue of one per other member, by node id.
    members: Mutex<BTreeMap<NodeId, Member>>,
}

struct Member {
    addr: String,
    queue: mpsc::Sender<AppendEntriesRequest<TypeConfig>>,
}

impl EarlyReplication {
    /// Early sends for node `id`; `enabled: false` never sends.
    ///
    /// With the stale read after restart put back (`crate::sim_hooks::regressions`), the node is
    /// as it was when it had that bug: a restarted leader leads its old term again, which is safe
    /// only without early sends, so there are none.
    pub(crate) fn new(id: NodeId, enabled: bool) -> Arc<EarlyReplication> {
        let old_restart = crate::sim_hooks::regressions::active(
            crate::sim_hooks::regressions::Bug::StaleReadAfterRestart,
        );
        Arc::new(EarlyReplication {
            id,
            enabled: enabled && !old_restart,
            node: !old_restart,
            restarted_leader: std::sync::atomic::AtomicBool::new(false),
            vote: Mutex::new(None),
            members: Mutex::new(BTreeMap::new()),
        })
    }

    /// Does nothing: for log stores outside a node (tools, tests).
    pub(crate) fn off() -> Arc<EarlyReplication> {
        Arc::new(EarlyReplication {
            id: 0,
            enabled: false,
            node: false,
            restarted_leader: std::sync::atomic::AtomicBool::new(false),
            vote: Mutex::new(None),
            members: Mutex::new(BTreeMap::new()),
        })
    }

    /// The vote the log store read at start, as openraft is to see it.
    ///
    /// openraft restores a node whose committed vote names itself as leader at once, in the
    /// same term. Entries it had sent early but not synced before it stopped may be gone from
    /// its log (a crash before the write, a power loss before the sync) while a follower keeps
    /// them; leading the same term again, it would append other entries under the same log ids,
    /// and the follower would take them for the ones it has. So a node's own committed vote is
    /// handed to openraft as not committed: the node starts as a follower that has voted for
    /// itself in that term (it votes for no one else in it), and leads again only after winning
    /// a new term, which it wins only if its log is as complete as a majority's. Whatever the
    /// setting: the previous run may have sent early.
    pub(super) fn vote_at_start(&self, vote: Vote<NodeId>) -> Vote<NodeId> {
        if !self.node || !vote.is_committed() || vote.leader_id().voted_for() != Some(self.id) {
            return vote;
        }
        self.restarted_leader
            .store(true, std::sync::atomic::Ordering::Release);
        Vote::new(vote.leader_id().term, self.id)
    }

    /// The log store saved (or read) `vote`.
    pub(super) fn vote_saved(&self, vote: Vote<NodeId>) {
        *lock(&self.vote) = Some(vote);
    }

    /// The log store is about to sync `entries`, which follow `prev`: on the leader, hand them
    /// to every member whose queue has room.
    pub(super) fn appending(&self, prev: Option<LogId>, entries: &[Entry<TypeConfig>]) {
        if !self.enabled || entries.is_empty() {
            return;
        }
        let Some(vote) = *lock(&self.vote) else {
            return;
        };
        if !vote.is_committed() || vote.leader_id().voted_for() != Some(self.id) {
            return;
        }
        let members = lock(&self.members);
        let mut slots = members
            .values()
            .filter_map(|member| member.queue.try_reserve().ok());
        let Some(first) = slots.next() else {
            return;
        };
        // One copy of the entries per member sent to, the first taking the original.
        let request = AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries: entries.to_vec(),
            leader_commit: None,
        };
        for slot in slots {
            slot.send(request.clone());
        }
        first.send(request);
    }

    /// Keeps one sending task per other member of the cluster, following the membership in
    /// `metrics` (openraft's server metrics, which change only with the vote, the role or the
    /// membership), until `metrics` closes. Each task owns its own connection from `network`.
    pub(crate) async fn run(
        self: Arc<Self>,
        network: PeerNetwork,
        mut metrics: watch::Receiver<openraft::metrics::RaftServerMetrics<NodeId, BasicNode>>,
    ) {
        if !self.enabled {
            return;
        }
        // However this ends (the node stops and drops it, or the membership closes), the
        // sending tasks end with it.
        let _members = ClearOnDrop(&self.members);
        loop {
            let wanted: BTreeMap<NodeId, String> = {
                let metrics = metrics.borrow_and_update();
                metrics
                    .membership_config
                    .membership()
                    .nodes()
                    .filter(|(id, _)| **id != self.id)
                    .map(|(id, node)| (*id, node.addr.clone()))
                    .collect()
            };
            self.follow(&network, wanted);
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Makes the members `wanted` (id -> address) the ones sent to: a task for each new one (or
    /// one whose address changed); a dropped queue ends the task of a member that left.
    fn follow(&self, network: &PeerNetwork, wanted: BTreeMap<NodeId, String>) {
        let mut members = lock(&self.members);
        members.retain(|id, member| wanted.get(id) == Some(&member.addr));
        for (id, addr) in wanted {
            if members.contains_key(&id) {
                continue;
            }
            let (queue, requests) = mpsc::channel(1);
            let node = BasicNode { addr: addr.clone() };
            tokio::spawn(send(network.clone(), id, node, requests));
            members.insert(id, Member { addr, queue });
        }
    }
}

/// How long a restarted leader waits for Raft to start before it campaigns.
const RESTART_WAIT: Duration = Duration::from_secs(5);

/// A node that led its term when it stopped (see [`EarlyReplication::vote_at_start`])
/// campaigns for a new term as soon as Raft has started, instead of after an election timeout.
pub(crate) async fn campaign_after_restart(raft: &super::Raft, early: &EarlyReplication) {
    if !early
        .restarted_leader
        .load(std::sync::atomic::Ordering::Acquire)
    {
        return;
    }
    let id = early.id;
    let started = raft
        .wait(Some(RESTART_WAIT))
        .metrics(
            |m| m.vote.leader_id().term > 0 && m.vote.leader_id().voted_for() == Some(id),
            "Raft started with its stored vote",
        )
        .await;
    let voter = match started {
        Ok(m) => m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == id),
        Err(e) => {
            tracing::warn!(error = %e, "restarted leader: Raft did not start in time");
            return;
        }
    };
    if !voter {
        return;
    }
    tracing::info!("this node led its term when it stopped: campaigning for a new term");
    if let Err(e) = raft.trigger().elect().await {
        tracing::warn!(error = %e, "restarted leader: could not campaign");
    }
}

/// Sends every request that reaches `requests` to node `id`, one at a time, ignoring the replies.
async fn send(
    mut network: PeerNetwork,
    id: NodeId,
    node: BasicNode,
    mut requests: mpsc::Receiver<AppendEntriesRequest<TypeConfig>>,
) {
    let mut connection = network.new_client(id, &node).await;
    while let Some(request) = requests.recv().await {
        // The reply (or failure) is openraft's own replication's business, not this one's.
        let _ = connection
            .append_entries(request, RPCOption::new(SEND_TTL))
            .await;
    }
}

/// Drops every member's queue, which ends its sending task.
struct ClearOnDrop<'a>(&'a Mutex<BTreeMap<NodeId, Member>>);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        lock(self.0).clear();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    /// Node 1 with members 2 and 3, each queue of one: their receivers.
    fn leader_of_three(
        enabled: bool,
    ) -> (
        Arc<EarlyReplication>,
        Vec<mpsc::Receiver<AppendEntriesRequest<TypeConfig>>>,
    ) {
        let early = EarlyReplication::new(1, enabled);
        let mut receivers = Vec::new();
        for id in [2, 3] {
            let (queue, requests) = mpsc::channel(1);
            receivers.push(requests);
            lock(&early.members).insert(
                id,
                Member {
                    addr: format!("127.0.0.1:700{id}"),
                    queue,
                },
            );
        }
        (early, receivers)
    }

    fn committed_vote(term: u64, node: NodeId) -> Vote<NodeId> {
        let mut vote = Vote::new(term, node);
        vote.commit();
        vote
    }

    #[test]
    fn the_leader_sends_each_append_to_every_member_with_its_vote_and_prev() {
        let (early, mut receivers) = leader_of_three(true);
        early.vote_saved(committed_vote(4, 1));
        let prev = Some(entry(4, 9).log_id);
        early.appending(prev, &[entry(4, 10), entry(4, 11)]);
        for requests in &mut receivers {
            let request = requests.try_recv().expect("an early AppendEntries");
            assert_eq!(request.vote, committed_vote(4, 1));
            assert_eq!(request.prev_log_id, prev);
            let indexes: Vec<u64> = request.entries.iter().map(|e| e.log_id.index).collect();
            assert_eq!(indexes, vec![10, 11]);
            assert_eq!(
                request.leader_commit, None,
                "early sends never move a commit"
            );
        }
    }

    #[test]
    fn nothing_is_sent_unless_this_node_leads_with_a_committed_vote() {
        let cases = [
            (true, None),
            (true, Some(Vote::new(4, 1))),       // a candidate's vote
            (true, Some(committed_vote(4, 2))),  // a follower of node 2
            (false, Some(committed_vote(4, 1))), // turned off
        ];
        for (enabled, vote) in cases {
            let (early, mut receivers) = leader_of_three(enabled);
            if let Some(vote) = vote {
                early.vote_saved(vote);
            }
            early.appending(None, &[entry(4, 0)]);
            for requests in &mut receivers {
                assert!(
                    requests.try_recv().is_err(),
                    "sent with enabled={enabled} vote={vote:?}"
                );
            }
        }
    }

    #[test]
    fn a_node_that_led_its_term_starts_with_that_vote_not_committed() {
        let early = EarlyReplication::new(1, true);
        assert_eq!(early.vote_at_start(Vote::new(5, 2)), Vote::new(5, 2));
        assert_eq!(
            early.vote_at_start(committed_vote(5, 2)),
            committed_vote(5, 2),
            "another node's leadership is kept"
        );
        assert_eq!(early.vote_at_start(Vote::new(5, 1)), Vote::new(5, 1));
        assert!(
            !early
                .restarted_leader
                .load(std::sync::atomic::Ordering::Acquire)
        );
        let at_start = early.vote_at_start(committed_vote(5, 1));
        assert_eq!(at_start, Vote::new(5, 1));
        assert!(!at_start.is_committed());
        assert!(
            early
                .restarted_leader
                .load(std::sync::atomic::Ordering::Acquire)
        );
        // A tool's log store (no node) reads the vote as it is.
        assert_eq!(
            EarlyReplication::off().vote_at_start(committed_vote(5, 0)),
            committed_vote(5, 0)
        );
    }

    #[test]
    fn a_member_whose_send_is_still_queued_is_skipped_not_waited_for() {
        let (early, mut receivers) = leader_of_three(true);
        early.vote_saved(committed_vote(2, 1));
        early.appending(Some(entry(2, 1).log_id), &[entry(2, 2)]);
        // Member 3's queue empties (its send went out); member 2's does not.
        assert!(receivers[1].try_recv().is_ok());
        early.appending(Some(entry(2, 2).log_id), &[entry(2, 3)]);
        let first = receivers[0].try_recv().expect("member 2's first send");
        assert_eq!(first.entries[0].log_id.index, 2);
        assert!(
            receivers[0].try_recv().is_err(),
            "member 2's queue was full: the second append is left to openraft"
        );
        let second = receivers[1].try_recv().expect("member 3's second send");
        assert_eq!(second.entries[0].log_id.index, 3);
    }
}

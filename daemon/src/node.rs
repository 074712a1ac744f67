//! A running conch node: Raft, the applied state, and the paths every request takes.
//!
//! Writes: a handler calls [`Node::write`]; the proposer task collects every command that
//! arrived meanwhile into one [`Batch`] (one Raft entry, one fsync: group commit;
//! `node/batches.rs`). On the leader the batch goes to Raft; on a follower it is forwarded to
//! the leader's proposer on the follower's `ConchPeer.ProposeStream` call to it
//! (`node/forward_stream.rs`; a unary `ConchPeer.Propose` to a leader that does not serve the
//! stream), and the follower answers with the leader's replies. A failed call to the leader is
//! retried or reported as `node/call_failure.rs` decides.
//!
//! Reads: [`Node::linearizable`] confirms leadership (read-index) once for every read that
//! arrived meanwhile, then waits until this node applied up to that index
//! (`node/read_index.rs`).
//!
//! A new leader's first batch starts with `ExtendLeases`, so a failover never expires a live
//! client's lease early. Batches are stamped with the lease clock (`clock.rs`) for everything
//! that expires and with the wall clock only for display times.
//!
//! Every call to another node (forwarded writes and reads, forwarded admin calls) goes over one
//! cached, route-aware channel per peer. A forwarded write or read that the leader it tried did
//! not take (it stepped down, or cannot be reached) is tried again after news of a leader or a
//! short back-off, whichever comes first (`node/leader_wait.rs`), never in a spin. See
//! `docs/design.md` (The write path, Time).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_peer_client::ConchPeerClient;
use openraft::ServerState;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use crate::base::error::NodeError;
use crate::base::log_limit::LogLimit;
use crate::base::tasks::Tasks;
use crate::base::write_trace::{Stage, note_proposed, note_resumed};
use crate::config::Config;
use crate::data_dir::identity::ClusterId;
use crate::raft::applied::AppliedState;
use crate::raft::network::{PeerChannel, PeerDialer, decode, encode, identity, peer_client};
use crate::raft::storage_fault;
use crate::raft::{NodeId, Raft};
use crate::state::{Batch, Cmd, Nanos, Reply};
use crate::support::clock::{LeaseClock, wall_ns};
use crate::support::metrics::Metrics;

mod batches;
mod call_failure;
pub mod forward_stream;
mod leader_wait;
mod raft_view;
mod read_index;

use batches::{all_cmds, answer, run_batches};
use call_failure::{forward_failure, stream_failure};
use forward_stream::{ForwardFailure, Forwarder, Proposed, Target};
use leader_wait::{LeaderWait, Woken};
pub use raft_view::Member;
pub(crate) use raft_view::{MembershipChange, RaftStatus};

/// Most commands put into one Raft entry.
const BATCH_MAX_CMDS: usize = 4096;
/// Batches in flight to Raft at once (lets the next batch form while one commits).
const BATCHES_IN_FLIGHT: usize = 3;
/// Batches a follower has in flight to the leader at once: while they travel, its callers' next
/// proposals gather into one batch, one call to the leader, instead of a call each.
const FORWARDS_IN_FLIGHT: usize = 3;
/// Bound on connecting to another node for a forwarded call.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The leader as this node currently sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    pub id: NodeId,
    pub addr: String,
    pub term: u64,
}

struct Proposal {
    cmds: Vec<Cmd>,
    /// Came from another node: never forward it again.
    forwarded: bool,
    /// When it entered its current queue (the proposer's, then the forwarder's), for the
    /// write's stage times.
    queued_at: Instant,
    reply: oneshot::Sender<Answer>,
}

/// A proposal's result, and when it was answered (for the write's stage times).
type Answer = (Result<(Vec<Reply>, u64), NodeError>, Instant);

pub struct Node {
    pub id: NodeId,
    pub config: Arc<Config>,
    pub raft: Raft,
    pub applied: Arc<AppliedState>,
    proposals: mpsc::Sender<Proposal>,
    /// This node's callers' proposals on their way to another leader (see `run_forwarder`).
    to_forward: mpsc::Sender<Proposal>,
    /// The stream those proposals go to the leader on (see `node/forward_stream.rs`).
    forwarder: Forwarder,
    reads: mpsc::Sender<oneshot::Sender<Result<u64, NodeError>>>,
    /// Channels to other nodes, by node and address dialed (a channel checks that the peer's
    /// certificate names its node, so one address never serves two ids).
    peers: Mutex<HashMap<(NodeId, String), PeerChannel>>,
    extension: TermExtension,
    /// This node's cluster id (see `identity.rs`).
    pub cluster_id: Arc<ClusterId>,
    dialer: PeerDialer,
    /// The lease clock this node stamps batches with while it leads.
    lease_clock: LeaseClock,
    pub metrics: Arc<Metrics>,
    /// Other nodes' client addresses, as their peer calls state them (see
    /// [`Node::leader_client_addr`]).
    client_addrs: Mutex<BTreeMap<NodeId, String>>,
    /// Refused peer calls are logged at most this often.
    pub peer_refusals: LogLimit,
    /// Every task this node runs; stopped with it (see `tasks.rs`).
    pub tasks: Tasks,
    /// The peer secret as peer calls carry it (`--peer-secret-file`), made once.
    pub peer_secret_header: Option<String>,
    /// Whether this node was removed from the cluster (see `removal.rs`).
    pub removal: crate::raft::removal::Removal,
    /// The index of the last log entry when this process started (see
    /// [`Node::read_index_as_leader`]).
    log_at_start: u64,
}

/// The one record of "a new term's first batch extends every lease": the term in which this
/// node, as leader, has committed `ExtendLeases`. [`Node::commit_as_leader`] prepends the command
/// while the current term has none; the lease clock (`expiry.rs`) asks [`Node::extension_due`]
/// to propose that first batch at once when no client writes. See `docs/design.md` (Time).
#[derive(Default)]
struct TermExtension {
    extended_term: AtomicU64,
}

impl TermExtension {
    fn due(&self, term: u64) -> bool {
        self.extended_term.load(Ordering::Acquire) != term
    }

    fn committed(&self, term: u64) {
        self.extended_term.fetch_max(term, Ordering::AcqRel);
    }
}

impl Node {
    /// Starts the proposer and read-index tasks for `raft`.
    pub fn start(
        config: Arc<Config>,
        raft: Raft,
        applied: Arc<AppliedState>,
        cluster_id: Arc<ClusterId>,
        metrics: Arc<Metrics>,
        log_at_start: u64,
    ) -> Arc<Node> {
        let dialer = PeerDialer::of(&config, Arc::clone(&cluster_id));
        let peer_secret_header = config
            .peer_secret
            .as_ref()
            .map(crate::data_dir::identity::secret_header);
        let (proposals, proposal_rx) = mpsc::channel(BATCH_MAX_CMDS);
        let (to_forward, forward_rx) = mpsc::channel(BATCH_MAX_CMDS);
        let (reads, read_rx) = mpsc::channel(BATCH_MAX_CMDS);
        let tasks = Tasks::new();
        let node = Arc::new(Node {
            id: config.id,
            config,
            raft,
            applied,
            proposals,
            to_forward,
            forwarder: Forwarder::new(tasks.clone()),
            reads,
            peers: Mutex::new(HashMap::new()),
            extension: TermExtension::default(),
            cluster_id,
            dialer,
            lease_clock: LeaseClock::default(),
            metrics,
            client_addrs: Mutex::new(BTreeMap::new()),
            peer_refusals: LogLimit::new(Duration::from_secs(10)),
            tasks,
            peer_secret_header,
            removal: crate::raft::removal::Removal::default(),
            log_at_start,
        });
        node.tasks
            .spawn(Arc::clone(&node).run_proposer(proposal_rx));
        node.tasks
            .spawn(Arc::clone(&node).run_forwarder(forward_rx));
        node.tasks.spawn(Arc::clone(&node).run_read_index(read_rx));
        node
    }

    /// The connection slots of this node's listener `listener` (client, peer, metrics, ui),
    /// closing idle connections until the node stops (see `connections.rs`).
    pub(crate) fn connection_gate(
        &self,
        listener: &'static str,
    ) -> Arc<crate::net::connections::Gate> {
        let gate = crate::net::connections::Gate::new(
            listener,
            crate::net::connections::Limits::with_per_address(
                self.config.max_connections_per_address,
            ),
            self.metrics.connections_refused.clone(),
        );
        gate.reap_on(&self.tasks);
        gate
    }

    /// Proposes `cmds` (in order, in one entry) and returns their replies once the entry is
    /// committed (on the leader: applied; through a follower: the leader's replies, which this
    /// node may not have applied yet, see [`Node::write_one_at`]).
    pub async fn write(&self, cmds: Vec<Cmd>) -> Result<Vec<Reply>, NodeError> {
        self.propose(cmds, false).await.map(|(replies, _)| replies)
    }

    pub(crate) async fn write_one(&self, cmd: Cmd) -> Result<Reply, NodeError> {
        self.write_one_at(cmd).await.map(|(reply, _)| reply)
    }

    /// Like [`Node::write_one`], also returning the log index of the entry. The reply is the
    /// leader's; a follower answers without waiting to apply the entry itself, so a caller
    /// that then reads this node's local (not linearizable) state about it waits for the
    /// index first ([`AppliedState::wait_applied`]).
    pub(crate) async fn write_one_at(&self, cmd: Cmd) -> Result<(Reply, u64), NodeError> {
        let (mut replies, index) = self.propose(vec![cmd], false).await?;
        let reply = replies
            .pop()
            .ok_or_else(|| NodeError::Internal("state machine returned no reply".into()))?;
        Ok((reply, index))
    }

    /// Entry point for proposals forwarded by followers.
    pub(crate) async fn propose_forwarded(
        &self,
        cmds: Vec<Cmd>,
    ) -> Result<(Vec<Reply>, u64), NodeError> {
        self.propose(cmds, true).await
    }

    async fn propose(
        &self,
        cmds: Vec<Cmd>,
        forwarded: bool,
    ) -> Result<(Vec<Reply>, u64), NodeError> {
        let (reply, rx) = oneshot::channel();
        let queued_at = Instant::now();
        note_proposed(queued_at, forwarded);
        self.proposals
            .send(Proposal {
                cmds,
                forwarded,
                queued_at,
                reply,
            })
            .await
            .map_err(|_| shutting_down())?;
        let (result, answered_at) = rx.await.map_err(|_| shutting_down())?;
        let resumed = Instant::now();
        self.metrics
            .stages
            .between(Stage::Wake, answered_at, resumed);
        note_resumed(resumed);
        result
    }

    /// The current leader, if one is known.
    pub fn leader(&self) -> Option<LeaderInfo> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let id = metrics.current_leader?;
        let addr = metrics
            .membership_config
            .membership()
            .get_node(&id)?
            .addr
            .clone();
        Some(LeaderInfo {
            id,
            addr,
            term: metrics.current_term,
        })
    }

    /// Where clients reach the leader: its client address, which differs from its address in
    /// the membership when peers have a port of their own (`--peer-listen`). `None` when no
    /// leader is known, or its client address is not known yet.
    pub(crate) fn leader_client_addr(&self) -> Option<String> {
        let leader = self.leader()?;
        if leader.id == self.id {
            return Some(self.config.advertise.clone());
        }
        let learned = self
            .client_addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&leader.id)
            .cloned();
        learned.or_else(|| self.config.peer_listen.is_none().then_some(leader.addr))
    }

    /// Records the client address an admitted peer call from node `from` states.
    pub(crate) fn note_client_addr(
        &self,
        from: Option<NodeId>,
        metadata: &tonic::metadata::MetadataMap,
    ) {
        let Some(from) = from else { return };
        let Some(addr) = metadata
            .get(crate::data_dir::identity::CLIENT_ADDR_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return;
        };
        let mut addrs = self.client_addrs.lock().unwrap_or_else(|p| p.into_inner());
        if addrs.get(&from).map(String::as_str) != Some(addr) {
            addrs.insert(from, addr.to_string());
        }
    }

    /// Whether node `id` is a voter or learner of the membership this node knows; `None` while
    /// this node knows none (an empty node: the cluster's first members vote it in, a new learner
    /// learns the membership from its leader).
    pub(crate) fn is_member(&self, id: NodeId) -> Option<bool> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.nodes().next()?;
        Some(membership.get_node(&id).is_some())
    }

    /// True while this node leads a term whose `ExtendLeases` is not committed yet: its next
    /// batch will carry it.
    pub(crate) fn extension_due(&self) -> bool {
        let term = self.raft.metrics().borrow().current_term;
        self.is_leader() && self.extension.due(term)
    }

    /// The lease clock as this node, leading `term`, reads it now (see `clock.rs`).
    fn lease_clock_at(&self, term: u64) -> Nanos {
        let applied_ns = self.applied.read(|state| state.clock_ns());
        self.lease_clock.now(term, applied_ns)
    }

    /// The lease clock now, for the leader's expiry checks.
    pub(crate) fn lease_clock_ns(&self) -> Nanos {
        let term = self.raft.metrics().borrow().current_term;
        self.lease_clock_at(term)
    }

    /// Whether this node leads, by openraft's server metrics: each report sends them before the
    /// full metrics, so a task woken by a change of the server metrics (as the expiry ticker is)
    /// sees the new role here, where the full metrics may not carry it yet.
    pub fn is_leader(&self) -> bool {
        let server = self.raft.server_metrics();
        let server = server.borrow();
        server.state == ServerState::Leader && server.current_leader == Some(self.id)
    }

    /// Waits (bounded by `leader_wait`) until some leader is known.
    async fn await_leader(&self, deadline: tokio::time::Instant) -> Result<LeaderInfo, NodeError> {
        let mut metrics = self.raft.metrics();
        // Seen now: `changed()` then reports only what changes after the check below.
        metrics.borrow_and_update();
        loop {
            if let Some(leader) = self.leader() {
                return Ok(leader);
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Err(shutting_down()),
                Err(_) => return Err(self.no_leader_error()),
            }
        }
    }

    fn no_leader_error(&self) -> NodeError {
        NodeError::Unavailable(format!(
            "no leader elected within {} ms: the cluster may have lost its majority (node {} sees no leader)",
            self.config.leader_wait.as_millis(),
            self.id
        ))
    }

    /// The channel to node `id` (advertised at `addr`), dialed at its `--peer-routes` address
    /// if it has one. Channels are cached per node and address and shared by every call to that
    /// node: forwarded writes and reads, forwarded admin calls, and the check of a new learner
    /// (whose certificate must then name the id it is added as). Every dial knows its target's
    /// id, so every peer's certificate is checked for that node.
    fn channel_to(&self, id: NodeId, addr: &str) -> Result<PeerChannel, NodeError> {
        let addr = self
            .config
            .peer_routes
            .get(&id)
            .map_or(addr, String::as_str);
        let mut channels = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let key = (id, addr.to_string());
        if let Some(channel) = channels.get(&key) {
            return Ok(channel.clone());
        }
        let channel = self
            .dialer
            .channel(id, addr, PEER_CONNECT_TIMEOUT)
            .map_err(|e| NodeError::Unavailable(format!("connect to node {id} at {addr}: {e}")))?;
        channels.insert(key, channel.clone());
        Ok(channel)
    }

    fn peer(&self, leader: &LeaderInfo) -> Result<ConchPeerClient<PeerChannel>, NodeError> {
        self.channel_to(leader.id, &leader.addr).map(peer_client)
    }

    /// The peer service of node `id` (advertised at `addr`), over the shared peer channel.
    pub(crate) fn peer_of(
        &self,
        id: NodeId,
        addr: &str,
    ) -> Result<ConchPeerClient<PeerChannel>, NodeError> {
        self.channel_to(id, addr).map(peer_client)
    }

    /// The admin service of node `id` (advertised at `addr`), over the shared peer channel.
    pub(crate) fn admin_of(
        &self,
        id: NodeId,
        addr: &str,
    ) -> Result<ConchAdminClient<PeerChannel>, NodeError> {
        self.channel_to(id, addr).map(ConchAdminClient::new)
    }

    /// The leader's admin service when another node leads (membership changes must be made
    /// there), or `None` when this node does. Waits for a leader like a write does.
    pub(crate) async fn leader_admin(
        &self,
    ) -> Result<Option<ConchAdminClient<PeerChannel>>, NodeError> {
        if self.is_leader() {
            return Ok(None);
        }
        let deadline = tokio::time::Instant::now() + self.config.leader_wait;
        let leader = self.await_leader(deadline).await?;
        if leader.id == self.id {
            // Taking over right now: Raft itself answers whether it leads.
            return Ok(None);
        }
        self.admin_of(leader.id, &leader.addr).map(Some)
    }

    async fn run_proposer(self: Arc<Self>, rx: mpsc::Receiver<Proposal>) {
        run_batches(
            self.tasks.clone(),
            rx,
            BATCHES_IN_FLIGHT,
            move |batch, permit| {
                let node = Arc::clone(&self);
                async move { node.submit(batch, permit).await }
            },
        )
        .await;
    }

    /// Sends this node's callers' proposals to the leader in batches, at most
    /// [`FORWARDS_IN_FLIGHT`] at once. Only proposals made on this node come here (never ones
    /// other nodes forwarded, which are answered where they arrive), and the proposer never
    /// waits for this task: so two nodes that each believe the other leads cannot hold each
    /// other's batches.
    async fn run_forwarder(self: Arc<Self>, rx: mpsc::Receiver<Proposal>) {
        run_batches(
            self.tasks.clone(),
            rx,
            FORWARDS_IN_FLIGHT,
            move |batch, permit| {
                let node = Arc::clone(&self);
                async move {
                    let started = Instant::now();
                    for proposal in &batch {
                        let stages = &node.metrics.stages;
                        stages.between(Stage::ToForwarder, proposal.queued_at, started);
                    }
                    let result = node.commit_anywhere(all_cmds(&batch)).await;
                    node.metrics
                        .stages
                        .between(Stage::Forward, started, Instant::now());
                    drop(permit);
                    answer(batch, result);
                }
            },
        )
        .await;
    }

    /// Commits one batch of proposals (locally as leader, or through the leader) and answers
    /// each proposal with its own replies.
    ///
    /// The in-flight permit bounds only local Raft writes. It is released before anything
    /// waits on another node: two nodes that each believe the other leads (a paused leader
    /// resuming) would otherwise hold all their permits forwarding to each other, and neither
    /// proposer would ever run the other's forwarded batch.
    async fn submit(&self, proposals: Vec<Proposal>, permit: OwnedSemaphorePermit) {
        let started = Instant::now();
        for proposal in &proposals {
            let stages = &self.metrics.stages;
            stages.between(Stage::Queue, proposal.queued_at, started);
        }
        if self.is_leader() {
            match self.commit_as_leader(all_cmds(&proposals), started).await {
                Ok(committed) => return answer(proposals, Ok(committed)),
                Err(NodeError::NotLeader { .. }) => {} // nothing was proposed; route below
                Err(e) => return answer(proposals, Err(e)),
            }
        }
        drop(permit);
        // Forwarded proposals may only be committed here, as leader: never forward them again.
        let (local, forwarded): (Vec<_>, Vec<_>) =
            proposals.into_iter().partition(|p| !p.forwarded);
        answer(forwarded, Err(NodeError::NotLeader { node: self.id }));
        if local.is_empty() {
            return;
        }
        for mut proposal in local {
            proposal.queued_at = started;
            if let Err(unsent) = self.to_forward.send(proposal).await {
                let _ = unsent.0.reply.send((Err(shutting_down()), Instant::now()));
            }
        }
    }

    async fn commit_anywhere(&self, cmds: Vec<Cmd>) -> Result<(Vec<Reply>, u64), NodeError> {
        let deadline = tokio::time::Instant::now() + self.config.leader_wait;
        let mut pause = LeaderWait::new(self.raft.server_metrics());
        loop {
            let leader = self.await_leader(deadline).await?;
            let result = if leader.id == self.id {
                self.commit_as_leader(cmds.clone(), Instant::now()).await
            } else {
                self.commit_through(&leader, cmds.clone()).await
            };
            match result {
                Err(NodeError::NotLeader { .. }) if tokio::time::Instant::now() < deadline => {
                    // The leader changed under us, or cannot be reached; nothing was proposed.
                    // Wait for news of a leader (or a back-off) and retry.
                    if pause.after_refusal(&leader, deadline).await == Woken::Closed {
                        return Err(shutting_down());
                    }
                }
                Err(NodeError::NotLeader { .. }) => return Err(self.no_leader_error()),
                other => return other,
            }
        }
    }

    /// Proposes `cmds` to Raft as leader; `since` is when the batch task began (for the write's
    /// stage times).
    async fn commit_as_leader(
        &self,
        mut cmds: Vec<Cmd>,
        since: Instant,
    ) -> Result<(Vec<Reply>, u64), NodeError> {
        let term = self.raft.metrics().borrow().current_term;
        let extend = self.extension.due(term);
        if extend {
            cmds.insert(0, Cmd::ExtendLeases);
        }
        let batch = Batch {
            now_ns: self.lease_clock_at(term),
            cmds,
            wall_ns: wall_ns(),
        };
        self.metrics.proposed(batch.cmds.len());
        let called = Instant::now();
        let written = self.raft.client_write(batch).await;
        let returned = Instant::now();
        match written {
            Ok(response) => {
                let stages = &self.metrics.stages;
                stages.between(Stage::Batch, since, called);
                stages.between(Stage::Raft, called, returned);
                let trace = &self.metrics.trace;
                trace.record_raft(response.log_id.index, called, returned, stages);
                if extend {
                    self.extension.committed(term);
                }
                let mut replies = response.data;
                if extend && !replies.is_empty() {
                    let _extend_reply = replies.remove(0);
                }
                Ok((replies, response.log_id.index))
            }
            Err(e) => match e.forward_to_leader() {
                Some(_) => Err(NodeError::NotLeader { node: self.id }),
                None => Err(storage_fault::node_error(self.id, "raft write failed", &e)),
            },
        }
    }

    /// Forwards `cmds` to `leader` and returns its answer: over the forward stream, or as a
    /// unary `Propose` call to a leader that does not serve the stream.
    async fn commit_through(
        &self,
        leader: &LeaderInfo,
        cmds: Vec<Cmd>,
    ) -> Result<(Vec<Reply>, u64), NodeError> {
        let channel = self.channel_to(leader.id, &leader.addr)?;
        self.metrics.forwarded.with_label_values(&["write"]).inc();
        let target = Target {
            id: leader.id,
            addr: leader.addr.clone(),
            identity: identity(&self.cluster_id),
        };
        // Bounded: a leader that stopped answering (paused, partitioned) must not hold this
        // proposal, and the caller, longer than a leader change takes.
        let deadline = tokio::time::Instant::now() + self.config.leader_wait;
        let sent = Instant::now();
        let proposed = if self.forwarder.unary(&target, leader.term) {
            self.propose_unary(leader, channel, &cmds).await
        } else {
            match self
                .forwarder
                .forward(&target, channel.clone(), &cmds, deadline)
                .await
            {
                Ok(proposed) => Ok(proposed),
                Err(ForwardFailure::Unsupported) => {
                    tracing::info!(
                        node = leader.id,
                        "the leader does not serve ProposeStream; forwarding to it with Propose"
                    );
                    self.forwarder.use_unary(&target, leader.term);
                    self.propose_unary(leader, channel, &cmds).await
                }
                Err(failure) => Err(stream_failure(failure, leader)),
            }
        };
        let stages = &self.metrics.stages;
        stages.between(Stage::ForwardRpc, sent, Instant::now());
        // The leader's reply is the answer: it is committed, and every read (linearizable,
        // through the read index) sees it from now on, on any node. Waiting here until this
        // node applied it too would cost the time until the leader's next message says the
        // entry is committed. A caller that goes on to wait on this node's applied state (a
        // queued acquire waiting for its grant) waits for the index itself. Changes to access
        // control are the exception: this node checks the caller's next call against its own
        // applied copy of the rules, so it answers once it has them.
        let (replies, index) = proposed??;
        if cmds.iter().any(Cmd::changes_access)
            && tokio::time::timeout(self.config.leader_wait, self.applied.wait_applied(index))
                .await
                .is_err()
        {
            tracing::warn!(
                index,
                "follower slow to apply a forwarded access-control change"
            );
        }
        Ok((replies, index))
    }

    /// Forwards `cmds` to `leader` as one unary `Propose` call, within `leader_wait`.
    async fn propose_unary(
        &self,
        leader: &LeaderInfo,
        channel: PeerChannel,
        cmds: &[Cmd],
    ) -> Result<Proposed, NodeError> {
        let payload =
            encode(&cmds).map_err(|e| NodeError::Internal(format!("encode proposal: {e}")))?;
        let mut request = tonic::Request::new(PeerMessage { payload });
        request.set_timeout(self.config.leader_wait);
        let response = peer_client(channel)
            .propose(request)
            .await
            .map_err(|status| forward_failure(&status, leader))?;
        decode(&response.into_inner().payload)
            .map_err(|e| NodeError::Internal(format!("decode leader reply: {e}")))
    }
}

fn shutting_down() -> NodeError {
    NodeError::Unavailable("node is shutting down".into())
}

/// The leader as far as this node knows, for what it logs and reports: openraft's
/// `current_leader`, except a claim of this node itself that a quorum has not confirmed.
/// openraft derives the leader from the stored vote: a restarted former leader resumes leading
/// its old term until it hears of a newer one, and a node removed from the cluster keeps naming
/// itself. Neither is reported. (Routing still follows openraft: a write sent to a stale leader
/// is refused by Raft and retried.)
pub(crate) fn known_leader(
    metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    own_id: NodeId,
) -> Option<NodeId> {
    match metrics.current_leader {
        Some(id)
            if id == own_id
                && (metrics.state != ServerState::Leader
                    || metrics.millis_since_quorum_ack.is_none()) =>
        {
            None
        }
        other => other,
    }
}

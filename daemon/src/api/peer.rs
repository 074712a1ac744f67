//! `ConchPeer`: the node-to-node service. Raft RPCs are handed to openraft; proposals and read
//! index requests from followers go to this node's proposer and read path.
//!
//! What always holds: no call is answered for a caller that has not proved it is a member (see
//! [`admit`]) whenever access control is on; a vote, proposal or read-index request from a node
//! that is not in this node's membership is refused; a Raft message naming a candidate or leader
//! other than its authenticated sender is refused; no refusal names the cluster id or members.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_peer_server::ConchPeer;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

use super::status::ApiError;
use crate::base::error::NodeError;
use crate::base::write_trace::{CALL, CallStamps, Stage, record_call};
use crate::data_dir::identity::{PEER_ID_HEADER, PEER_SECRET_HEADER};
use crate::node::Node;
use crate::node::forward_stream::{ForwardReply, ForwardRequest};
use crate::raft::network::{decode, encode};
use crate::raft::{NodeId, TypeConfig, peer_target};
use crate::state::{Cmd, Reply};

pub(crate) struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        PeerService { node }
    }
}

/// Who a peer call comes from, as [`admit`] established it: the sender's node id (`None` only
/// from a sender that names none, accepted only while peers need not authenticate).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerSender(pub Option<NodeId>);

/// What every refusal of an unauthenticated or foreign peer call says: nothing about this
/// cluster (not its id, not its members). The reason is logged here instead.
const NOT_A_MEMBER: &str = "the peer service answers only members of this cluster";

/// Admits a call to the peer service, or refuses it; see `docs/design.md` (Peer identity).
///
/// 1. With peer mutual TLS (`--peer-ca`) the connection must have presented a node
///    certificate (see `tls.rs`), and the call may name no other sender than the node that
///    certificate names.
/// 2. With a peer secret (`--peer-secret-file`) the call must carry it.
/// 3. With neither, the call is refused whenever access control is on: a peer call can change
///    anything, so access control without peer authentication would be for show.
/// 4. An authenticated call must name its sender; the cluster id it carries must be ours.
pub(crate) fn admit(node: &Node, request: &Request<()>) -> Result<PeerSender, ApiError> {
    admit_parts(
        node,
        request.metadata(),
        request.peer_certs().as_deref().map(Vec::as_slice),
    )
}

/// [`admit`] from a call's metadata and the certificate chain its connection presented.
fn admit_parts(
    node: &Node,
    metadata: &MetadataMap,
    peer_certs: Option<&[CertificateDer<'static>]>,
) -> Result<PeerSender, ApiError> {
    let mut sender = metadata
        .get(PEER_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<NodeId>().ok())
        .filter(|id| *id > 0);
    let mut authenticated = false;
    if let Some(tls) = &node.config.tls
        && tls.peer_mtls()
    {
        let Some(chain) = peer_certs else {
            return Err(refuse(node, "a peer call without a certificate"));
        };
        let Some(certified) = tls.node_id_of(chain) else {
            return Err(refuse(
                node,
                "a peer call with a certificate that is not a node's",
            ));
        };
        if sender.is_some_and(|id| id != certified) {
            return Err(refuse(
                node,
                "a peer call naming another sender than the node its certificate names",
            ));
        }
        sender = Some(certified);
        authenticated = true;
    }
    if let Some(secret) = &node.peer_secret_header {
        let given = metadata
            .get(PEER_SECRET_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !constant_time_eq(given, secret.as_bytes()) {
            return Err(refuse(node, "a peer call without the peer secret"));
        }
        authenticated = true;
    }
    if !authenticated && access_control_on(node) {
        return Err(refuse(
            node,
            "a peer call, because access control is on and this node has no peer \
             authentication (start it with --peer-secret-file or --peer-ca)",
        ));
    }
    if authenticated && sender.is_none() {
        return Err(refuse(node, "a peer call naming no sender node"));
    }
    if let Err(mismatch) = node.cluster_id.check(metadata) {
        tracing::debug!(%mismatch, "peer call from another cluster");
        return Err(ApiError::ClusterMismatch(NOT_A_MEMBER.into()));
    }
    Ok(PeerSender(sender))
}

fn access_control_on(node: &Node) -> bool {
    node.config.bootstrap_admin_token.is_some() || node.applied.read(|s| s.auth().enabled())
}

/// Logs why (at most every few seconds) and refuses without saying.
fn refuse(node: &Node, what: &str) -> ApiError {
    if node.peer_refusals.due() {
        tracing::warn!("refused {what}");
    }
    ApiError::PeerRefused(NOT_A_MEMBER.into())
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The sender recorded by [`admit`].
fn sender<T>(request: &Request<T>) -> Option<NodeId> {
    request.extensions().get::<PeerSender>().and_then(|s| s.0)
}

/// Refuses a call from a node that is not a member (a removed node campaigning, or one never
/// added), as this node knows the membership.
fn from_member<T>(node: &Node, request: &Request<T>) -> Result<(), ApiError> {
    from_member_id(node, sender(request))
}

/// Refuses a call from `sender` when it is not a member (see [`from_member`]).
fn from_member_id(node: &Node, sender: Option<NodeId>) -> Result<(), ApiError> {
    match sender {
        Some(id) if node.is_member(id) == Some(false) => {
            if node.peer_refusals.due() {
                tracing::warn!(
                    node = id,
                    "refused a peer call from a node that is not a member"
                );
            }
            Err(ApiError::PeerRefused(format!(
                "node {id} is not a member of this cluster"
            )))
        }
        _ => Ok(()),
    }
}

/// Refuses a Raft RPC whose own sender (the candidate or leader it names) is not the node that
/// sent it.
fn sent_by<T>(request: &Request<T>, named: Option<NodeId>) -> Result<(), ApiError> {
    sender_is(sender(request), named)
}

/// Refuses a Raft RPC from `sender` naming another node `named` as its own sender.
fn sender_is(sender: Option<NodeId>, named: Option<NodeId>) -> Result<(), ApiError> {
    match (sender, named) {
        (Some(sender), Some(named)) if sender != named => Err(ApiError::PeerRefused(format!(
            "node {sender} sent a message in the name of node {named}"
        ))),
        _ => Ok(()),
    }
}

/// Refuses a Raft RPC meant for another node (see `raft/peer_target.rs`).
fn for_this_node<T>(node: &Node, request: &Request<T>) -> Result<(), ApiError> {
    peer_target::check(node.id, request.metadata()).map_err(ApiError::ClusterMismatch)
}

fn decode_request<T: DeserializeOwned>(request: &Request<PeerMessage>) -> Result<T, ApiError> {
    decode(&request.get_ref().payload).map_err(|e| ApiError::MalformedPeerMessage(e.to_string()))
}

/// Refuses entries that raise the cluster version past what this node speaks, as a node of a
/// release that does not speak the new version refuses them (it cannot decode them): the
/// leader retries, and this node falls behind until it runs a release that speaks it.
fn followable(node: &Node, rpc: &AppendEntriesRequest<TypeConfig>) -> Result<(), ApiError> {
    crate::raft::followable(&rpc.entries, node.config.cluster_version_max)
        .map_err(|why| ApiError::State(crate::state::Error::failed_precondition(why)))
}

fn encode_reply<T: Serialize>(value: &T) -> Result<Response<PeerMessage>, ApiError> {
    let payload =
        encode(value).map_err(|e| ApiError::Internal(format!("encode peer reply: {e}")))?;
    Ok(Response::new(PeerMessage { payload }))
}

/// The replies of a streaming peer call ([`ConchPeer::append_entries_stream`],
/// [`ConchPeer::propose_stream`]).
pub(crate) type PeerReplies =
    Pin<Box<dyn futures::Stream<Item = Result<PeerMessage, Status>> + Send + 'static>>;

/// Who opened a streaming peer call, as its opening said: every message on it is admitted
/// again from these, as a unary call is, so a stream opened before access control was turned
/// on (or by a node whose certificate was revoked since) carries nothing after.
struct StreamCaller {
    node: Arc<Node>,
    metadata: MetadataMap,
    peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

impl StreamCaller {
    fn of<T>(node: &Arc<Node>, request: &Request<T>) -> StreamCaller {
        StreamCaller {
            node: Arc::clone(node),
            metadata: request.metadata().clone(),
            peer_certs: request.peer_certs(),
        }
    }

    /// Admits one message of the call (see [`admit`]).
    fn admit(&self) -> Result<PeerSender, ApiError> {
        admit_parts(
            &self.node,
            &self.metadata,
            self.peer_certs.as_deref().map(Vec::as_slice),
        )
    }
}

/// One open `AppendEntriesStream` call: its caller, and its incoming messages.
struct AppendStream {
    caller: StreamCaller,
    inbound: Streaming<PeerMessage>,
    failed: bool,
}

impl AppendStream {
    /// One AppendEntries off the stream, checked as a unary call is.
    async fn append(&self, message: PeerMessage) -> Result<PeerMessage, Status> {
        let started = Instant::now();
        let node = &self.caller.node;
        let metadata = &self.caller.metadata;
        let PeerSender(from) = self.caller.admit()?;
        let rpc: AppendEntriesRequest<TypeConfig> =
            decode(&message.payload).map_err(|e| ApiError::MalformedPeerMessage(e.to_string()))?;
        sender_is(from, rpc.vote.leader_id().voted_for())?;
        followable(node, &rpc)?;
        node.cluster_id.adopt_from(metadata);
        node.note_client_addr(from, metadata);
        let carries_entries = !rpc.entries.is_empty();
        let payload = encode(&node.append_entries(rpc).await)
            .map_err(|e| ApiError::Internal(format!("encode peer reply: {e}")))?;
        if carries_entries {
            let stages = &node.metrics.stages;
            stages.between(Stage::FollowerAppend, started, Instant::now());
        }
        Ok(PeerMessage { payload })
    }
}

/// Batches one `ProposeStream` call may have in flight on this node: the next message is read
/// once one of them is answered (a follower keeps a few in flight; this only bounds a stray
/// sender).
const PROPOSALS_IN_FLIGHT_PER_STREAM: usize = 64;

/// One batch off a `ProposeStream` call, checked as a unary `Propose` is: the caller admitted,
/// a member, the message readable.
fn forwarded_batch(
    caller: &StreamCaller,
    message: &PeerMessage,
) -> Result<ForwardRequest<Vec<Cmd>>, ApiError> {
    let PeerSender(from) = caller.admit()?;
    from_member_id(&caller.node, from)?;
    decode(&message.payload).map_err(|e| ApiError::MalformedPeerMessage(e.to_string()))
}

/// A follower's forwarded batch, proposed here as leader; refused as not-leader otherwise (a
/// forwarded batch is never forwarded again).
async fn propose_here(node: &Node, cmds: Vec<Cmd>) -> Result<(Vec<Reply>, u64), NodeError> {
    if node.is_leader() {
        node.propose_forwarded(cmds).await
    } else {
        Err(NodeError::NotLeader { node: node.id })
    }
}

/// A batch of a `ProposeStream` call proposed here, and what its reply and timing need.
type Proposing = Pin<Box<dyn Future<Output = Answered> + Send>>;

/// A streamed batch's answer, encoded, with the stamps its proposal left (see [`CALL`]) and
/// when its message was read.
struct Answered {
    reply: Result<PeerMessage, Status>,
    stamps: CallStamps,
    read_at: Instant,
}

/// One open `ProposeStream` call on the leader. Its reply stream does all of the call's work:
/// polling it reads the next messages, proposes their batches, and yields each answer as it
/// comes, so a batch costs no task of its own and an answer no channel between tasks.
struct ForwardsServed {
    caller: StreamCaller,
    inbound: Streaming<PeerMessage>,
    /// The batches read and not answered yet, at most [`PROPOSALS_IN_FLIGHT_PER_STREAM`].
    proposing: FuturesUnordered<Proposing>,
    /// Whether messages are still read: not once the caller ended its requests or the node
    /// began to stop (the batches read so far are still answered).
    reading: bool,
    /// The error that ends the call was yielded: nothing follows it.
    failed: bool,
}

impl ForwardsServed {
    /// The next reply of the call, or `None` once it ends: after the answers to every batch
    /// read, once nothing more is read; or right after an error.
    async fn next_reply(mut self) -> Option<(Result<PeerMessage, Status>, ForwardsServed)> {
        loop {
            if self.failed || (!self.reading && self.proposing.is_empty()) {
                return None;
            }
            let room = self.proposing.len() < PROPOSALS_IN_FLIGHT_PER_STREAM;
            let node = &self.caller.node;
            tokio::select! {
                biased;
                Some(answered) = self.proposing.next(), if !self.proposing.is_empty() => {
                    let Answered { reply, stamps, read_at } = answered;
                    record_call(stamps, read_at, Instant::now(), &node.metrics.stages);
                    self.failed = reply.is_err();
                    return Some((reply, self));
                }
                () = node.tasks.stopping(), if self.reading => self.reading = false,
                message = self.inbound.message(), if self.reading && room => {
                    let message = match message {
                        Ok(Some(message)) => message,
                        Ok(None) => {
                            self.reading = false;
                            continue;
                        }
                        Err(status) => {
                            self.failed = true;
                            return Some((Err(status), self));
                        }
                    };
                    let read_at = Instant::now();
                    match forwarded_batch(&self.caller, &message) {
                        Ok(ForwardRequest { id, cmds }) => {
                            let node = Arc::clone(node);
                            self.proposing.push(propose_streamed(node, id, cmds, read_at));
                        }
                        Err(e) => {
                            self.failed = true;
                            return Some((Err(e.into()), self));
                        }
                    }
                }
                else => return None,
            }
        }
    }
}

/// Proposes one streamed batch as [`ConchPeer::propose`] does, timed as a unary `Propose` call
/// is (`peer_call` and its parts), from its message read to its answer yielded.
fn propose_streamed(node: Arc<Node>, id: u64, cmds: Vec<Cmd>, read_at: Instant) -> Proposing {
    Box::pin(CALL.scope(Cell::new(CallStamps::default()), async move {
        let result = propose_here(&node, cmds).await;
        let stamps = CALL.with(Cell::get);
        let reply = encode(&ForwardReply { id, result })
            .map(|payload| PeerMessage { payload })
            .map_err(|e| ApiError::Internal(format!("encode peer reply: {e}")).into());
        Answered {
            reply,
            stamps,
            read_at,
        }
    }))
}

#[tonic::async_trait]
impl ConchPeer for PeerService {
    async fn append_entries(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let started = Instant::now();
        for_this_node(&self.node, &request)?;
        let from = sender(&request);
        let rpc: AppendEntriesRequest<TypeConfig> = decode_request(&request)?;
        sent_by(&request, rpc.vote.leader_id().voted_for())?;
        followable(&self.node, &rpc)?;
        self.node.cluster_id.adopt_from(request.metadata());
        self.node.note_client_addr(from, request.metadata());
        let carries_entries = !rpc.entries.is_empty();
        let reply = encode_reply(&self.node.append_entries(rpc).await)?;
        if carries_entries {
            let stages = &self.node.metrics.stages;
            stages.between(Stage::FollowerAppend, started, Instant::now());
        }
        Ok(reply)
    }

    type AppendEntriesStreamStream = PeerReplies;

    /// The same handling as [`ConchPeer::append_entries`], one request message after the other
    /// on one stream: each gets exactly one reply, in order. The call was admitted when it
    /// opened; every message is admitted again, so a stream opened before access control was
    /// turned on carries nothing after. The stream ends when the node begins to stop (the
    /// sender opens another, to whichever node then serves) or at the first refused or
    /// malformed message, with that message's error.
    async fn append_entries_stream(
        &self,
        request: Request<Streaming<PeerMessage>>,
    ) -> Result<Response<PeerReplies>, Status> {
        for_this_node(&self.node, &request)?;
        let stream = AppendStream {
            caller: StreamCaller::of(&self.node, &request),
            inbound: request.into_inner(),
            failed: false,
        };
        let replies = futures::stream::unfold(stream, |mut stream| async move {
            if stream.failed {
                return None;
            }
            let message = tokio::select! {
                biased;
                () = stream.caller.node.tasks.stopping() => return None,
                message = stream.inbound.message() => message,
            };
            let reply = match message {
                Ok(Some(message)) => stream.append(message).await,
                Ok(None) => return None,
                Err(status) => Err(status),
            };
            stream.failed = reply.is_err();
            Some((reply, stream))
        });
        Ok(Response::new(Box::pin(replies)))
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        for_this_node(&self.node, &request)?;
        from_member(&self.node, &request)?;
        let rpc: VoteRequest<NodeId> = decode_request(&request)?;
        sent_by(&request, rpc.vote.leader_id().voted_for())?;
        Ok(encode_reply(&self.node.vote(rpc).await)?)
    }

    async fn install_snapshot(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        for_this_node(&self.node, &request)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode_request(&request)?;
        sent_by(&request, rpc.vote.leader_id().voted_for())?;
        self.node.cluster_id.adopt_from(request.metadata());
        Ok(encode_reply(&self.node.install_snapshot(rpc).await)?)
    }

    async fn propose(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        from_member(&self.node, &request)?;
        let cmds: Vec<Cmd> = decode_request(&request)?;
        Ok(encode_reply(&propose_here(&self.node, cmds).await)?)
    }

    type ProposeStreamStream = PeerReplies;

    /// The same handling as [`ConchPeer::propose`] for every batch on one stream, several at
    /// once: each request message (`ForwardRequest`) gets exactly one reply (`ForwardReply`,
    /// naming the request's id), in the order the batches are answered. Every message is
    /// admitted again, as on `AppendEntriesStream`. The stream ends after the answers to the
    /// batches read so far once the sender ends its requests or the node begins to stop, and at
    /// the first refused or malformed message, with that message's error. The reply stream
    /// itself reads and proposes (see [`ForwardsServed`]): while the sender takes no replies,
    /// nothing more is read from it.
    async fn propose_stream(
        &self,
        request: Request<Streaming<PeerMessage>>,
    ) -> Result<Response<PeerReplies>, Status> {
        from_member(&self.node, &request)?;
        let served = ForwardsServed {
            caller: StreamCaller::of(&self.node, &request),
            inbound: request.into_inner(),
            proposing: FuturesUnordered::new(),
            reading: true,
            failed: false,
        };
        let replies = futures::stream::unfold(served, ForwardsServed::next_reply);
        Ok(Response::new(Box::pin(replies)))
    }

    async fn read_index(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        from_member(&self.node, &request)?;
        Ok(encode_reply(&self.node.read_index_as_leader().await)?)
    }

    async fn removed(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        for_this_node(&self.node, &request)?;
        from_member(&self.node, &request)?;
        let notice = decode_request(&request)?;
        Ok(encode_reply(&crate::jobs::retire::notice(
            &self.node, notice,
        ))?)
    }

    async fn node_info(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        from_member(&self.node, &request)?;
        Ok(encode_reply(&crate::api::upgrade::NodeInfo::this_node(
            &self.node,
        ))?)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use conch_proto::conch::conch_peer_client::ConchPeerClient;

    use super::*;
    use crate::data_dir::identity::{PeerStamp, WithClusterId};
    use crate::embed::{ConchNode, NodeConfig};
    use crate::node::forward_stream::ForwardReply;
    use crate::raft::network::request_stream;

    const WITHIN: Duration = Duration::from_secs(30);

    /// A single node on loopback, leading.
    async fn leader(dir: &tempfile::TempDir) -> anyhow::Result<ConchNode> {
        let node = ConchNode::start(NodeConfig::single("127.0.0.1:0", dir.path())).await?;
        let mut metrics = node.node().raft.metrics();
        let id = node.id();
        tokio::time::timeout(
            WITHIN,
            metrics.wait_for(|m| m.current_leader == Some(id) && m.state.is_leader()),
        )
        .await??;
        Ok(node)
    }

    /// A `ProposeStream` call to `node`: the sender of its requests, and its replies.
    async fn open(
        node: &ConchNode,
    ) -> anyhow::Result<(
        tokio::sync::mpsc::UnboundedSender<PeerMessage>,
        Streaming<PeerMessage>,
    )> {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", node.local_addr()))?
                .connect()
                .await?;
        // As a member calls: stamped with the cluster's id, as node 1 itself.
        let stamp = PeerStamp::new(node.id(), None, "127.0.0.1:1");
        let channel = WithClusterId::new(
            channel,
            Arc::clone(&node.node().cluster_id),
            Arc::new(stamp),
        );
        let (requests, outgoing) = request_stream();
        let replies = ConchPeerClient::new(channel)
            .propose_stream(Request::new(outgoing))
            .await?
            .into_inner();
        Ok((requests, replies))
    }

    fn batch(id: u64, n: usize) -> anyhow::Result<PeerMessage> {
        let cmds = vec![Cmd::ExtendLeases; n];
        let payload = encode(&ForwardRequest {
            id,
            cmds: cmds.as_slice(),
        })?;
        Ok(PeerMessage { payload })
    }

    /// The next reply, within [`WITHIN`].
    async fn next(
        replies: &mut Streaming<PeerMessage>,
    ) -> anyhow::Result<Result<Option<ForwardReply>, Status>> {
        let message = tokio::time::timeout(WITHIN, replies.message()).await?;
        Ok(match message {
            Ok(Some(message)) => Ok(Some(decode(&message.payload)?)),
            Ok(None) => Ok(None),
            Err(status) => Err(status),
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_batch_read_is_answered_and_timed_before_the_call_ends() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let node = leader(&dir).await?;
        let stages = node.node().metrics.stages.clone();
        let timed = stages.count(Stage::PeerCall);
        let (requests, mut replies) = open(&node).await?;
        for (id, n) in [(7, 1), (8, 2), (9, 3)] {
            requests.send(batch(id, n)?)?;
        }
        // The sender ends its requests with every batch possibly still in flight.
        drop(requests);
        let mut answered = Vec::new();
        while let Some(reply) = next(&mut replies).await?? {
            let (replies, index) = reply.result?;
            answered.push((reply.id, replies.len(), index));
        }
        answered.sort_unstable();
        let ids: Vec<_> = answered.iter().map(|(id, n, _)| (*id, *n)).collect();
        assert_eq!(ids, [(7, 1), (8, 2), (9, 3)], "{answered:?}");
        assert!(answered.iter().all(|(_, _, index)| *index > 0));
        // Each batch wrote once and is timed as a unary `Propose` call is.
        assert_eq!(stages.count(Stage::PeerCall), timed + 3);
        node.shutdown().await?;
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_malformed_message_ends_the_call_with_its_error_and_nothing_after_it()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let node = leader(&dir).await?;
        let (requests, mut replies) = open(&node).await?;
        requests.send(batch(1, 1)?)?;
        let first = next(&mut replies).await??.map(|reply| reply.id);
        assert_eq!(first, Some(1));
        requests.send(PeerMessage {
            payload: vec![0xde, 0xad, 0xbe, 0xef],
        })?;
        let _ = requests.send(batch(2, 1)?);
        match next(&mut replies).await? {
            Err(status) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}"),
            Ok(reply) => anyhow::bail!("not the error: {reply:?}"),
        }
        assert!(
            !matches!(next(&mut replies).await?, Ok(Some(_))),
            "nothing follows the error"
        );
        node.shutdown().await?;
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_that_begins_to_stop_ends_the_call_after_answering_what_it_read()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let node = leader(&dir).await?;
        let (requests, mut replies) = open(&node).await?;
        requests.send(batch(1, 1)?)?;
        let first = next(&mut replies).await??.map(|reply| reply.id);
        assert_eq!(first, Some(1));
        node.node().tasks.drain();
        // The requests stay open: the node ends the call.
        assert!(next(&mut replies).await??.is_none());
        drop(requests);
        node.shutdown().await?;
        Ok(())
    }
}

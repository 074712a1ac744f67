//! `ConchPeer`: the node-to-node service. Raft RPCs are handed to openraft; proposals and read
//! index requests from followers go to this node's proposer and read path.
//!
//! What always holds: no call is answered for a caller that has not proved it is a member (see
//! [`admit`]) whenever access control is on; a vote, proposal or read-index request from a node
//! that is not in this node's membership is refused; a Raft message naming a candidate or leader
//! other than its authenticated sender is refused; no refusal names the cluster id or members.

use std::cell::Cell;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_peer_server::ConchPeer;
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, mpsc};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

use super::status::ApiError;
use crate::error::NodeError;
use crate::identity::{PEER_ID_HEADER, PEER_SECRET_HEADER};
use crate::node::Node;
use crate::node::forward_stream::{ForwardReply, ForwardRequest};
use crate::raft::network::{decode, encode};
use crate::raft::{NodeId, TypeConfig, peer_target};
use crate::state::{Cmd, Reply};
use crate::write_trace::{CALL, CallStamps, Stage, record_call};

pub struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    pub fn new(node: Arc<Node>) -> Self {
        PeerService { node }
    }
}

/// Who a peer call comes from, as [`admit`] established it: the sender's node id (`None` only
/// from a sender that names none, accepted only while peers need not authenticate).
#[derive(Clone, Copy, Debug)]
pub struct PeerSender(pub Option<NodeId>);

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
pub fn admit(node: &Node, request: &Request<()>) -> Result<PeerSender, ApiError> {
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
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

fn encode_reply<T: Serialize>(value: &T) -> Result<Response<PeerMessage>, ApiError> {
    let payload =
        encode(value).map_err(|e| ApiError::Internal(format!("encode peer reply: {e}")))?;
    Ok(Response::new(PeerMessage { payload }))
}

/// The replies of a streaming peer call ([`ConchPeer::append_entries_stream`],
/// [`ConchPeer::propose_stream`]).
pub type PeerReplies =
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

/// Reads the batches of a `ProposeStream` call and runs each through this node's proposer as
/// [`ConchPeer::propose`] does, concurrently, each answer sent into `replies` with its batch's
/// id as it comes. Stops reading when the node begins to stop, the caller ends its requests, or
/// at the first refused or malformed message (whose error, sent last, ends the call).
async fn serve_forwards(
    caller: StreamCaller,
    mut inbound: Streaming<PeerMessage>,
    replies: mpsc::UnboundedSender<Result<PeerMessage, Status>>,
) {
    let node = Arc::clone(&caller.node);
    let in_flight = Arc::new(Semaphore::new(PROPOSALS_IN_FLIGHT_PER_STREAM));
    loop {
        let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
            return;
        };
        let message = tokio::select! {
            biased;
            () = node.tasks.stopping() => return,
            message = inbound.message() => message,
        };
        let message = match message {
            Ok(Some(message)) => message,
            Ok(None) => return,
            Err(status) => {
                let _ = replies.send(Err(status));
                return;
            }
        };
        let read_at = Instant::now();
        let ForwardRequest { id, cmds } = match forwarded_batch(&caller, &message) {
            Ok(batch) => batch,
            Err(e) => {
                let _ = replies.send(Err(e.into()));
                return;
            }
        };
        let node = Arc::clone(&node);
        let replies = replies.clone();
        node.tasks.clone().spawn(async move {
            // Timed as a unary `Propose` call is (`peer_call` and its parts), from the message
            // read to its answer sent.
            let (result, stamps) = CALL
                .scope(Cell::new(CallStamps::default()), async {
                    let result = propose_here(&node, cmds).await;
                    (result, CALL.with(Cell::get))
                })
                .await;
            let reply = encode(&ForwardReply { id, result })
                .map(|payload| PeerMessage { payload })
                .map_err(|e| ApiError::Internal(format!("encode peer reply: {e}")).into());
            let _ = replies.send(reply);
            record_call(stamps, read_at, Instant::now(), &node.metrics.stages);
            drop(permit);
        });
    }
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
    /// the first refused or malformed message, with that message's error.
    async fn propose_stream(
        &self,
        request: Request<Streaming<PeerMessage>>,
    ) -> Result<Response<PeerReplies>, Status> {
        from_member(&self.node, &request)?;
        let caller = StreamCaller::of(&self.node, &request);
        let (replies, outgoing) = mpsc::unbounded_channel();
        self.node
            .tasks
            .spawn(serve_forwards(caller, request.into_inner(), replies));
        let outgoing =
            futures::stream::unfold((outgoing, false), |(mut outgoing, failed)| async move {
                if failed {
                    return None;
                }
                let reply = outgoing.recv().await?;
                let failed = reply.is_err();
                Some((reply, (outgoing, failed)))
            });
        Ok(Response::new(Box::pin(outgoing)))
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
        Ok(encode_reply(&crate::retire::notice(&self.node, notice))?)
    }
}

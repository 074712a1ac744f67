//! Peer transport: openraft's RPCs carried over the `ConchPeer` gRPC service.
//!
//! Requests and replies travel as bincode in a `bytes` field. A reply payload is the
//! bincode of `Result<Response, RaftError>`, so the remote node's Raft errors come back intact.
//! Peers share the client port: every node serves `ConchPeer` next to the Grackle API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_peer_client::ConchPeerClient;
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use super::{NodeId, TypeConfig};
use crate::base::log_limit::LogLimits;
use crate::base::write_trace::{Mark, WriteTrace};
use crate::config::Config;
use crate::data_dir::identity::{ClusterId, PeerStamp, WithClusterId};
use crate::tls::Tls;

/// Largest peer message accepted or sent (snapshot chunks and entry batches stay below it).
pub(crate) const PEER_MESSAGE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// A channel to a peer: every request carries this node's cluster id.
pub(crate) type PeerChannel = WithClusterId<Channel>;

/// How this node dials its peers: in plaintext, or with mutual TLS when the node serves TLS, and
/// always stamping its cluster id.
#[derive(Clone)]
pub(crate) struct PeerDialer {
    tls: Option<Arc<Tls>>,
    dial: Option<crate::net::transport::Dial>,
    cluster_id: Arc<ClusterId>,
    stamp: Arc<PeerStamp>,
}

impl PeerDialer {
    /// How the node `config` describes dials its peers.
    pub(crate) fn of(config: &Config, cluster_id: Arc<ClusterId>) -> Self {
        let stamp = PeerStamp::new(config.id, config.peer_secret.as_ref(), &config.advertise);
        PeerDialer {
            tls: config.tls.clone(),
            dial: config.dial.clone(),
            cluster_id,
            stamp: Arc::new(stamp),
        }
    }

    /// Builds a lazily connecting gRPC channel to node `node` at `addr` (`host:port`). With
    /// TLS, the peer must present a node certificate naming `node` (see `tls.rs`).
    pub(crate) fn channel(
        &self,
        node: NodeId,
        addr: &str,
        connect_timeout: Duration,
    ) -> Result<PeerChannel, tonic::transport::Error> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = match (&self.dial, &self.tls) {
            (Some(dial), _) => endpoint.connect_with_connector_lazy(dialer(dial.clone())),
            (None, Some(tls)) => {
                endpoint.connect_with_connector_lazy(tls.peer_connector(Some(node)))
            }
            (None, None) => endpoint.connect_lazy(),
        };
        Ok(WithClusterId::new(
            channel,
            Arc::clone(&self.cluster_id),
            Arc::clone(&self.stamp),
        ))
    }
}

/// A connector for tonic that opens each connection through `dial`.
fn dialer(
    dial: crate::net::transport::Dial,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<Box<dyn crate::net::transport::Conn>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: tonic::transport::Uri| {
        let dial = dial.clone();
        async move {
            let addr = uri.authority().map(|a| a.to_string()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "no host:port to dial")
            })?;
            dial.connect(addr).await.map(hyper_util::rt::TokioIo::new)
        }
    })
}

pub(crate) fn peer_client(channel: PeerChannel) -> ConchPeerClient<PeerChannel> {
    ConchPeerClient::new(channel)
        .max_decoding_message_size(PEER_MESSAGE_MAX_BYTES)
        .max_encoding_message_size(PEER_MESSAGE_MAX_BYTES)
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(value)
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    bincode::deserialize(bytes)
}

/// Creates one [`PeerConnection`] per target node.
#[derive(Clone)]
pub(crate) struct PeerNetwork {
    connect_timeout: Duration,
    routes: Arc<BTreeMap<NodeId, String>>,
    dialer: PeerDialer,
    /// An unreachable peer is said once per interval, not at every retry.
    unreachable: Arc<LogLimits<NodeId>>,
    /// Where replication stamps when an entry is first sent and first acknowledged.
    trace: Arc<WriteTrace>,
}

/// How often an unreachable peer is logged while it stays unreachable.
const UNREACHABLE_LOG_EVERY: Duration = Duration::from_secs(30);

impl PeerNetwork {
    /// `routes` overrides the advertised address of some peers (see `--peer-routes`).
    pub(crate) fn new(
        connect_timeout: Duration,
        routes: Arc<BTreeMap<NodeId, String>>,
        dialer: PeerDialer,
        trace: Arc<WriteTrace>,
    ) -> Self {
        PeerNetwork {
            connect_timeout,
            routes,
            dialer,
            unreachable: Arc::new(LogLimits::new(UNREACHABLE_LOG_EVERY)),
            trace,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        let addr = self.routes.get(&target).unwrap_or(&node.addr);
        let client = self
            .dialer
            .channel(target, addr, self.connect_timeout)
            .map(peer_client);
        PeerConnection {
            target,
            node: node.clone(),
            client,
            appends: None,
            unary_appends: false,
            cluster_id: Arc::clone(&self.dialer.cluster_id),
            unreachable: Arc::clone(&self.unreachable),
            trace: Arc::clone(&self.trace),
        }
    }
}

/// The connection to one peer.
pub(crate) struct PeerConnection {
    target: NodeId,
    node: BasicNode,
    client: Result<ConchPeerClient<PeerChannel>, tonic::transport::Error>,
    /// The open `AppendEntriesStream` call, taken out while an AppendEntries is on it: a call
    /// openraft drops before its reply came (its timeout) drops the stream with it, so no
    /// reply is ever taken for a later request's.
    appends: Option<AppendStream>,
    /// The peer does not serve `AppendEntriesStream` (a conchd from before it): AppendEntries
    /// go as unary calls to this peer from then on.
    unary_appends: bool,
    /// This node's cluster id and name, which every peer call's headers carry.
    cluster_id: Arc<ClusterId>,
    unreachable: Arc<LogLimits<NodeId>>,
    trace: Arc<WriteTrace>,
}

/// An open `AppendEntriesStream` call: every request sent gets one reply, in order.
struct AppendStream {
    requests: tokio::sync::mpsc::UnboundedSender<PeerMessage>,
    replies: tonic::Streaming<PeerMessage>,
    /// The cluster id and name its headers carried: a node that learns its cluster's id or
    /// name after opening the stream opens another, so the peer sees them as on unary calls.
    identity: Identity,
}

/// A cluster id and name, as a node knows them. A long-lived call's headers carry them as they
/// were when it opened: a node that learns its cluster's id or name opens its streams again.
pub(crate) type Identity = (Option<String>, Option<String>);

pub(crate) fn identity(cluster_id: &ClusterId) -> Identity {
    (cluster_id.get(), cluster_id.name())
}

/// The request side of a long-lived streaming peer call: every message put into the sender goes
/// out on the call, in order, until the sender is dropped (which ends the call's requests).
pub(crate) fn request_stream() -> (
    tokio::sync::mpsc::UnboundedSender<PeerMessage>,
    impl futures::Stream<Item = PeerMessage> + Send + 'static,
) {
    let (requests, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let outgoing = futures::stream::unfold(outgoing, |mut outgoing| async move {
        outgoing.recv().await.map(|message| (message, outgoing))
    });
    (requests, outgoing)
}

/// Why an AppendEntries did not go over the stream.
enum StreamFailure {
    /// The peer does not serve `AppendEntriesStream`.
    Unsupported,
    /// The call failed as a unary call would have.
    Status(tonic::Status),
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

#[derive(Clone, Copy)]
enum PeerCall {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl PeerConnection {
    /// One AppendEntries over the stream to the peer, opening one when none is open, within
    /// `ttl`. Replies as [`PeerConnection::call`] would: a reply's payload, or the status it
    /// would have failed with (a timeout is CANCELLED, as tonic's own is).
    async fn append_streamed(
        &mut self,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<PeerMessage, StreamFailure> {
        let client = match &mut self.client {
            Ok(client) => client,
            Err(e) => {
                return Err(StreamFailure::Status(tonic::Status::unavailable(
                    e.to_string(),
                )));
            }
        };
        let target = self.target;
        let known = identity(&self.cluster_id);
        let held = self.appends.take().filter(|s| s.identity == known);
        let exchange = async move {
            let message = PeerMessage { payload };
            let mut stream = match held {
                Some(stream) => {
                    stream
                        .requests
                        .send(message)
                        .map_err(|_| closed("the AppendEntries stream to the peer closed"))?;
                    stream
                }
                None => open_append_stream(client, target, known, message).await?,
            };
            match stream.replies.message().await {
                Ok(Some(reply)) => Ok((reply, stream)),
                Ok(None) => Err(closed("the peer ended the AppendEntries stream")),
                Err(status) => Err(StreamFailure::Status(status)),
            }
        };
        match tokio::time::timeout(ttl, exchange).await {
            Ok(Ok((reply, stream))) => {
                self.appends = Some(stream);
                Ok(reply)
            }
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(StreamFailure::Status(tonic::Status::cancelled(
                "Timeout expired",
            ))),
        }
    }

    /// The error openraft is given for a failed call: UNAVAILABLE, CANCELLED (a timeout) and
    /// UNKNOWN say the peer could not be reached (logged once per interval), anything else is a
    /// network error.
    fn failed<E: std::error::Error>(
        &self,
        status: tonic::Status,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => {
                // Expected while a peer restarts: one line per interval, not openraft's
                // line per retry (which the default log filter leaves out).
                if let Some(held_back) = self.unreachable.due_counting(self.target) {
                    tracing::warn!(
                        node = self.target,
                        addr = %self.node.addr,
                        error = status.message(),
                        failed_calls_since_last_said = held_back,
                        "peer unreachable; retrying (said again every {} s while it lasts)",
                        UNREACHABLE_LOG_EVERY.as_secs()
                    );
                }
                RPCError::Unreachable(Unreachable::new(&status))
            }
            _ => RPCError::Network(NetworkError::new(&status)),
        }
    }

    /// Decodes a reply payload: the remote node's result.
    #[allow(clippy::result_large_err)] // openraft's own error type, as its network trait returns it
    fn reply<Resp, E>(&self, payload: &[u8]) -> RpcResult<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result: Result<Resp, RaftError<NodeId, E>> =
            decode(payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            ))
        })
    }

    /// An AppendEntries: over the stream to the peer, or as a unary call to a peer that does
    /// not serve the stream.
    async fn append(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if self.unary_appends {
            return self.call(PeerCall::AppendEntries, rpc, option).await;
        }
        let payload = encode(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        match self.append_streamed(payload, option.hard_ttl()).await {
            Ok(reply) => self.reply(&reply.payload),
            Err(StreamFailure::Status(status)) => Err(self.failed(status)),
            Err(StreamFailure::Unsupported) => {
                tracing::info!(
                    node = self.target,
                    "peer does not serve AppendEntriesStream; sending it unary AppendEntries"
                );
                self.unary_appends = true;
                self.call(PeerCall::AppendEntries, rpc, option).await
            }
        }
    }

    async fn call<Req, Resp, E>(
        &mut self,
        call: PeerCall,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(client) => client,
            Err(e) => return Err(RPCError::Unreachable(Unreachable::new(e))),
        };
        let payload = encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(PeerMessage { payload });
        request.set_timeout(option.hard_ttl());
        super::peer_target::name_target(&mut request, self.target);
        let reply = match call {
            PeerCall::AppendEntries => client.append_entries(request).await,
            PeerCall::Vote => client.vote(request).await,
            PeerCall::InstallSnapshot => client.install_snapshot(request).await,
        };
        match reply {
            Ok(reply) => self.reply(&reply.into_inner().payload),
            Err(status) => Err(self.failed(status)),
        }
    }
}

fn closed(why: &'static str) -> StreamFailure {
    StreamFailure::Status(tonic::Status::unavailable(why))
}

/// Opens an `AppendEntriesStream` call to node `target` (the call's headers name it, as every
/// Raft RPC's do) with `first` as its first request. Resolves once the peer answered the
/// call's opening. The first request goes out with the opening rather than a round trip after
/// it, so a new stream costs one round trip, as a unary call does: a stream opened again after
/// a timeout gets its reply within the same timeout a unary call would.
async fn open_append_stream(
    client: &mut ConchPeerClient<PeerChannel>,
    target: NodeId,
    identity: Identity,
    first: PeerMessage,
) -> Result<AppendStream, StreamFailure> {
    let (requests, outgoing) = request_stream();
    requests
        .send(first)
        .map_err(|_| closed("the AppendEntries stream to the peer closed"))?;
    let mut request = tonic::Request::new(outgoing);
    super::peer_target::name_target(&mut request, target);
    match client.append_entries_stream(request).await {
        Ok(replies) => Ok(AppendStream {
            requests,
            replies: replies.into_inner(),
            identity,
        }),
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            Err(StreamFailure::Unsupported)
        }
        Err(status) => Err(StreamFailure::Status(status)),
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        let entries = rpc
            .entries
            .first()
            .zip(rpc.entries.last())
            .map(|(first, last)| (first.log_id.index, last.log_id.index));
        if let Some((first, last)) = entries {
            self.trace.stamp_range(first, last, Mark::Sent);
        }
        let reply = self.append(&rpc, &option).await;
        if let (Some((first, last)), Ok(AppendEntriesResponse::Success)) = (entries, &reply) {
            self.trace.stamp_range(first, last, Mark::Acked);
        }
        reply
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(PeerCall::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(PeerCall::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use conch_proto::conch::conch_peer_server::{ConchPeer, ConchPeerServer};
    use openraft::Vote;
    use tonic::{Request, Response, Status, Streaming};

    use super::*;
    use crate::data_dir::identity::PeerStamp;

    /// A peer that answers every AppendEntries with `HigherVote` of the request's own vote, so
    /// each reply names the request it answers. On the first stream opened it holds the reply
    /// to the first message back until the next message arrives, as a slow follower would.
    struct EchoPeer {
        streams: bool,
        opened: Arc<AtomicUsize>,
        unary: Arc<AtomicUsize>,
    }

    type Reply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;

    fn echo(message: &PeerMessage) -> Result<PeerMessage, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> =
            decode(&message.payload).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let reply: Reply = Ok(AppendEntriesResponse::HigherVote(rpc.vote));
        let payload = encode(&reply).map_err(|e| Status::internal(e.to_string()))?;
        Ok(PeerMessage { payload })
    }

    type Replies =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<PeerMessage, Status>> + Send>>;

    #[tonic::async_trait]
    impl ConchPeer for EchoPeer {
        async fn append_entries(
            &self,
            request: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            self.unary.fetch_add(1, Ordering::SeqCst);
            echo(request.get_ref()).map(Response::new)
        }

        type AppendEntriesStreamStream = Replies;

        async fn append_entries_stream(
            &self,
            request: Request<Streaming<PeerMessage>>,
        ) -> Result<Response<Replies>, Status> {
            let first_stream = self.opened.fetch_add(1, Ordering::SeqCst) == 0;
            if !self.streams {
                return Err(Status::unimplemented("no AppendEntriesStream here"));
            }
            let mut inbound = request.into_inner();
            // The opening is answered only once the first request arrived: a sender that
            // waited for the answer before sending would wait forever.
            let opening = inbound.message().await?;
            let (replies, outgoing) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(async move {
                let mut held = None;
                let mut first = first_stream;
                let mut next = opening;
                while let Some(message) = next {
                    let reply = echo(&message);
                    if std::mem::take(&mut first) {
                        held = Some(reply);
                    } else {
                        for reply in held.take().into_iter().chain([reply]) {
                            let _ = replies.send(reply);
                        }
                    }
                    next = inbound.message().await.ok().flatten();
                }
            });
            let outgoing = futures::stream::unfold(outgoing, |mut outgoing| async move {
                outgoing.recv().await.map(|reply| (reply, outgoing))
            });
            Ok(Response::new(Box::pin(outgoing)))
        }

        async fn vote(&self, _: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("vote"))
        }

        async fn install_snapshot(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("install_snapshot"))
        }

        async fn propose(&self, _: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("propose"))
        }

        type ProposeStreamStream = Replies;

        async fn propose_stream(
            &self,
            _: Request<Streaming<PeerMessage>>,
        ) -> Result<Response<Replies>, Status> {
            Err(Status::unimplemented("propose_stream"))
        }

        async fn read_index(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("read_index"))
        }

        async fn removed(&self, _: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("removed"))
        }

        async fn node_info(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("node_info"))
        }
    }

    struct Served {
        connection: PeerConnection,
        opened: Arc<AtomicUsize>,
        unary: Arc<AtomicUsize>,
        _dir: tempfile::TempDir,
    }

    /// A connection to an [`EchoPeer`] serving on loopback (node 2), from node 1.
    async fn connect(streams: bool) -> anyhow::Result<Served> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let opened = Arc::new(AtomicUsize::new(0));
        let unary = Arc::new(AtomicUsize::new(0));
        let peer = EchoPeer {
            streams,
            opened: Arc::clone(&opened),
            unary: Arc::clone(&unary),
        };
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ConchPeerServer::new(peer))
                .serve_with_incoming(incoming),
        );
        let dir = tempfile::tempdir()?;
        let dialer = PeerDialer {
            tls: None,
            dial: None,
            cluster_id: Arc::new(ClusterId::open(dir.path())?),
            stamp: Arc::new(PeerStamp::new(1, None, "127.0.0.1:1")),
        };
        let mut network = PeerNetwork::new(
            Duration::from_secs(5),
            Arc::new(BTreeMap::new()),
            dialer,
            Arc::new(WriteTrace::default()),
        );
        let connection = network.new_client(2, &BasicNode { addr }).await;
        Ok(Served {
            connection,
            opened,
            unary,
            _dir: dir,
        })
    }

    fn request(term: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: None,
            leader_commit: None,
            entries: Vec::new(),
        }
    }

    fn answered_term(
        reply: RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible>,
    ) -> anyhow::Result<u64> {
        match reply {
            Ok(AppendEntriesResponse::HigherVote(vote)) => Ok(vote.leader_id().term),
            other => anyhow::bail!("not an echoed vote: {other:?}"),
        }
    }

    const PATIENT: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn appends_share_one_stream_and_each_gets_its_own_reply() -> anyhow::Result<()> {
        let mut served = connect(true).await?;
        let c = &mut served.connection;
        // The first AppendEntries is dropped before its reply comes, as openraft's timeout
        // drops it: its stream goes with it, so its reply cannot answer the next request.
        let dropped = tokio::time::timeout(
            Duration::from_millis(300),
            c.append_entries(request(1), RPCOption::new(PATIENT)),
        )
        .await;
        assert!(dropped.is_err(), "the held reply came: {dropped:?}");
        for term in 2..=4 {
            let reply = c
                .append_entries(request(term), RPCOption::new(PATIENT))
                .await;
            assert_eq!(answered_term(reply)?, term);
        }
        assert_eq!(served.opened.load(Ordering::SeqCst), 2);
        assert_eq!(served.unary.load(Ordering::SeqCst), 0);
        Ok(())
    }

    #[tokio::test]
    async fn a_peer_without_the_stream_gets_unary_appends() -> anyhow::Result<()> {
        let mut served = connect(false).await?;
        let c = &mut served.connection;
        for term in 1..=3 {
            let reply = c
                .append_entries(request(term), RPCOption::new(PATIENT))
                .await;
            assert_eq!(answered_term(reply)?, term);
        }
        assert_eq!(served.opened.load(Ordering::SeqCst), 1, "asked once");
        assert_eq!(served.unary.load(Ordering::SeqCst), 3);
        Ok(())
    }
}

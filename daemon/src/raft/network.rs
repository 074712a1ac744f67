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
use crate::config::Config;
use crate::identity::{ClusterId, PeerStamp, WithClusterId};
use crate::log_limit::LogLimits;
use crate::tls::Tls;
use crate::write_trace::{Mark, WriteTrace};

/// Largest peer message accepted or sent (snapshot chunks and entry batches stay below it).
pub const PEER_MESSAGE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// A channel to a peer: every request carries this node's cluster id.
pub type PeerChannel = WithClusterId<Channel>;

/// How this node dials its peers: in plaintext, or with mutual TLS when the node serves TLS, and
/// always stamping its cluster id.
#[derive(Clone)]
pub struct PeerDialer {
    tls: Option<Arc<Tls>>,
    dial: Option<crate::transport::Dial>,
    cluster_id: Arc<ClusterId>,
    stamp: Arc<PeerStamp>,
}

impl PeerDialer {
    /// How the node `config` describes dials its peers.
    pub fn of(config: &Config, cluster_id: Arc<ClusterId>) -> Self {
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
    pub fn channel(
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
    dial: crate::transport::Dial,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<Box<dyn crate::transport::Conn>>,
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

pub fn peer_client(channel: PeerChannel) -> ConchPeerClient<PeerChannel> {
    ConchPeerClient::new(channel)
        .max_decoding_message_size(PEER_MESSAGE_MAX_BYTES)
        .max_encoding_message_size(PEER_MESSAGE_MAX_BYTES)
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(value)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    bincode::deserialize(bytes)
}

/// Creates one [`PeerConnection`] per target node.
#[derive(Clone)]
pub struct PeerNetwork {
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
    pub fn new(
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
            unreachable: Arc::clone(&self.unreachable),
            trace: Arc::clone(&self.trace),
        }
    }
}

/// The connection to one peer.
pub struct PeerConnection {
    target: NodeId,
    node: BasicNode,
    client: Result<ConchPeerClient<PeerChannel>, tonic::transport::Error>,
    unreachable: Arc<LogLimits<NodeId>>,
    trace: Arc<WriteTrace>,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

#[derive(Clone, Copy)]
enum PeerCall {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl PeerConnection {
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
        let reply = match reply {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                return Err(match status.code() {
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
                });
            }
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            decode(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            ))
        })
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
        let reply = self.call(PeerCall::AppendEntries, &rpc, &option).await;
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

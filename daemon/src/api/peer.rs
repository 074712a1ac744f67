//! `ConchPeer`: the node-to-node service. Raft RPCs are handed to openraft; proposals and read
//! index requests from followers go to this node's proposer and read path.

use std::sync::Arc;

use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_peer_server::ConchPeer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use super::status::ApiError;
use crate::node::{Node, NodeError};
use crate::raft::network::{decode, encode};
use crate::raft::peer_target;
use crate::state::Cmd;

pub struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    pub fn new(node: Arc<Node>) -> Self {
        PeerService { node }
    }
}

/// Admits a call to the peer service: with peer mutual TLS the connection must have presented a
/// node certificate (see `tls.rs`), and the call must come from this node's cluster (see
/// `identity.rs`).
pub fn admit(node: &Node, request: &Request<()>) -> Result<(), ApiError> {
    if let Some(tls) = &node.config.tls
        && tls.peer_mtls()
    {
        let Some(chain) = request.peer_certs() else {
            return Err(ApiError::PeerRefused(
                "the peer service needs a node certificate; this connection presented none".into(),
            ));
        };
        if tls.node_id_of(&chain).is_none() {
            return Err(ApiError::PeerRefused(
                "the peer service needs a node certificate; this connection presented another"
                    .into(),
            ));
        }
    }
    node.cluster_id
        .check(request.metadata())
        .map_err(|e| ApiError::ClusterMismatch(e.to_string()))
}

/// Refuses a Raft RPC meant for another node (see `raft/peer_target.rs`).
fn for_this_node<T>(node: &Node, request: &Request<T>) -> Result<(), ApiError> {
    peer_target::check(node.id, request.metadata()).map_err(ApiError::ClusterMismatch)
}

fn decode_request<T: DeserializeOwned>(request: Request<PeerMessage>) -> Result<T, ApiError> {
    decode(&request.into_inner().payload).map_err(|e| ApiError::MalformedPeerMessage(e.to_string()))
}

fn encode_reply<T: Serialize>(value: &T) -> Result<Response<PeerMessage>, ApiError> {
    let payload =
        encode(value).map_err(|e| ApiError::Internal(format!("encode peer reply: {e}")))?;
    Ok(Response::new(PeerMessage { payload }))
}

#[tonic::async_trait]
impl ConchPeer for PeerService {
    async fn append_entries(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        for_this_node(&self.node, &request)?;
        self.node.cluster_id.adopt_from(request.metadata());
        let rpc = decode_request(request)?;
        Ok(encode_reply(&self.node.raft.append_entries(rpc).await)?)
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        for_this_node(&self.node, &request)?;
        let rpc = decode_request(request)?;
        Ok(encode_reply(&self.node.raft.vote(rpc).await)?)
    }

    async fn install_snapshot(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        for_this_node(&self.node, &request)?;
        self.node.cluster_id.adopt_from(request.metadata());
        let rpc = decode_request(request)?;
        Ok(encode_reply(&self.node.raft.install_snapshot(rpc).await)?)
    }

    async fn propose(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let cmds: Vec<Cmd> = decode_request(request)?;
        let result = if self.node.is_leader() {
            self.node.propose_forwarded(cmds).await
        } else {
            Err(NodeError::NotLeader { node: self.node.id })
        };
        Ok(encode_reply(&result)?)
    }

    async fn read_index(
        &self,
        _request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        Ok(encode_reply(&self.node.read_index_as_leader().await)?)
    }
}

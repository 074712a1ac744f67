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
use crate::state::Cmd;

pub struct PeerService {
    node: Arc<Node>,
}

impl PeerService {
    pub fn new(node: Arc<Node>) -> Self {
        PeerService { node }
    }
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
        let rpc = decode_request(request)?;
        Ok(encode_reply(&self.node.raft.append_entries(rpc).await)?)
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        let rpc = decode_request(request)?;
        Ok(encode_reply(&self.node.raft.vote(rpc).await)?)
    }

    async fn install_snapshot(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
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

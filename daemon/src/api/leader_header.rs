//! Adds the `conch-leader` header (the leader's address, when this node knows it) to every
//! response of the client-facing services, errors included: a client that got NOT_FOUND or
//! INVALID_ARGUMENT from a follower still learns where the leader is. The value is read when the
//! response leaves, so a leader learned during the call is the one named. Peer traffic is left
//! alone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http;

use super::LEADER_HEADER;
use crate::node::Node;

/// Path prefix of the node-to-node service, whose responses carry no leader hint.
const PEER_PATH: &str = "/conch.v1.ConchPeer/";

/// The layer, given to the server once.
#[derive(Clone)]
pub struct LeaderHeaderLayer {
    node: Arc<Node>,
}

impl LeaderHeaderLayer {
    pub fn new(node: Arc<Node>) -> Self {
        LeaderHeaderLayer { node }
    }
}

impl<S> tower::Layer<S> for LeaderHeaderLayer {
    type Service = LeaderHeader<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaderHeader {
            inner,
            node: Arc::clone(&self.node),
        }
    }
}

/// The service the layer wraps around the server's routes.
#[derive(Clone)]
pub struct LeaderHeader<S> {
    inner: S,
    node: Arc<Node>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower::Service<http::Request<B>> for LeaderHeader<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let peer = request.uri().path().starts_with(PEER_PATH);
        let node = Arc::clone(&self.node);
        let fut = self.inner.call(request);
        Box::pin(async move {
            let mut response = fut.await?;
            if !peer {
                add_leader(&node, response.headers_mut());
            }
            Ok(response)
        })
    }
}

fn add_leader(node: &Node, headers: &mut http::HeaderMap) {
    if let Some(leader) = node.leader()
        && let Ok(value) = http::HeaderValue::from_str(&leader.addr)
    {
        headers.insert(LEADER_HEADER, value);
    }
}

//! The gRPC side of a listener's [`Gate`]: every call counts as open on its connection until
//! its response ends, and the first call that shows who is calling makes the connection known
//! (see `connections.rs` for what that buys).
//!
//! A call shows who is calling with a token this node knows (any call while access control is
//! off), with the peer secret on a peer call, or by arriving on a TLS connection whose handshake
//! verified a client or node certificate. Health and reflection calls without a token show
//! nothing while access control is on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::net::connections::{CallGuard, Conn, Gate};
use crate::node::Node;

/// Path prefix of the node-to-node service.
const PEER_PATH: &str = "/conch.v1.ConchPeer/";

#[derive(Clone)]
pub(crate) struct SlotLayer {
    node: Arc<Node>,
    gate: Arc<Gate>,
}

impl SlotLayer {
    pub(crate) fn new(node: Arc<Node>, gate: Arc<Gate>) -> SlotLayer {
        SlotLayer { node, gate }
    }
}

impl<S> tower::Layer<S> for SlotLayer {
    type Service = Slots<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Slots {
            inner,
            node: Arc::clone(&self.node),
            gate: Arc::clone(&self.gate),
        }
    }
}

#[derive(Clone)]
pub(crate) struct Slots<S> {
    inner: S,
    node: Arc<Node>,
    gate: Arc<Gate>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Slots<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Unpin,
{
    type Response = http::Response<CallBody<RB>>;
    type Error = S::Error;
    type Future = SlotFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let guard = self.conn_of(&request).map(|conn| {
            if !conn.is_known() && shows_who(&self.node, &request) {
                self.gate.know(&conn);
            }
            conn.call()
        });
        SlotFuture {
            inner: self.inner.call(request),
            guard,
        }
    }
}

impl<S> Slots<S> {
    fn conn_of<B>(&self, request: &http::Request<B>) -> Option<Arc<Conn>> {
        let extensions = request.extensions();
        let remote = extensions
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .or_else(|| {
                extensions
                    .get::<TlsConnectInfo<TcpConnectInfo>>()
                    .and_then(|info| info.get_ref().remote_addr())
            })?;
        self.gate.conn_from(remote)
    }
}

/// Whether `request` shows who is calling (see the module's documentation).
fn shows_who<B>(node: &Node, request: &http::Request<B>) -> bool {
    let verified_certificate = request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(TlsConnectInfo::peer_certs)
        .is_some_and(|certs| !certs.is_empty());
    if verified_certificate {
        return true;
    }
    let headers = request.headers();
    if request.uri().path().starts_with(PEER_PATH)
        && let Some(secret) = &node.peer_secret_header
        && let Some(given) = headers.get(crate::data_dir::identity::PEER_SECRET_HEADER)
    {
        return super::peer::constant_time_eq(given.as_bytes(), secret.as_bytes());
    }
    if super::auth::bootstrap_pending(node) {
        return false;
    }
    let token = headers
        .get(super::auth::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(super::auth::bearer_hash);
    node.applied
        .read(|s| s.auth().authenticate(token.as_ref()))
        .is_ok()
}

/// A call's response on its way; the call counts as open until its body ends.
pub(crate) struct SlotFuture<F> {
    inner: F,
    guard: Option<CallGuard>,
}

impl<F, RB, E> Future for SlotFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>> + Unpin,
{
    type Output = Result<http::Response<CallBody<RB>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match Pin::new(&mut self.inner).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(response) => response?,
        };
        let guard = self.guard.take();
        Poll::Ready(Ok(response.map(|inner| CallBody {
            inner,
            _guard: guard,
        })))
    }
}

/// A response body holding its call open.
pub(crate) struct CallBody<B> {
    inner: B,
    _guard: Option<CallGuard>,
}

impl<B> http_body::Body for CallBody<B>
where
    B: http_body::Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

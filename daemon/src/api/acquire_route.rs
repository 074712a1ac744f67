//! The route of `GrackleApi/AcquireSemaphore`, the call that may wait for minutes, served here
//! rather than by the generated server. Both decode the request, run the same acquire
//! ([`GrackleService`]'s start and wait, as its `acquire_semaphore` does) and encode its answer
//! the same way; what differs is what a waiting call keeps. The generated route's future keeps
//! room for its decoder (about 1.8 kB) and the handler's boxed future keeps room for the request
//! for as long as the call runs; here the decoding runs in a future of its own, freed before the
//! acquire starts, and the acquire's future is kept inline and holds no request, so a call that
//! waits keeps a few pointers besides the wait's own state (see the book, Memory and disk).
//!
//! Everything else a call meets is unchanged: the server's layers (timeouts, the response layer)
//! wrap this route like any other, and a node removed from the cluster refuses it as it refuses
//! every client call.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use conch_proto::grackle as pb;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, EncodeBody, SingleMessageCompressionOverride, Streaming};
use tonic::codegen::{Bytes, StdError, http};
use tonic::metadata::MetadataMap;
use tonic_prost::ProstCodec;

use super::CLIENT_MESSAGE_MAX_BYTES;
use super::grackle::GrackleService;
use super::status::ApiError;
use crate::node::Node;

/// The path this route serves.
pub(crate) const PATH: &str = "/com.evrblk.grackle.v1beta.GrackleApi/AcquireSemaphore";

type AcquireCodec = ProstCodec<pb::AcquireSemaphoreResponse, pb::AcquireSemaphoreRequest>;

/// The route: the Grackle service whose handler it calls and the node whose removal refuses it.
#[derive(Clone)]
pub(crate) struct AcquireRoute {
    service: Arc<GrackleService>,
    node: Arc<Node>,
}

impl AcquireRoute {
    pub(crate) fn new(service: Arc<GrackleService>, node: Arc<Node>) -> Self {
        AcquireRoute { service, node }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> tower::Service<http::Request<B>> for AcquireRoute
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The request moves into the decoder's own boxed future, freed before the handler runs:
        // what an `async` block captures keeps its room for as long as the block lives, so the
        // call's future, which lives as long as the call waits, captures only two pointers.
        let AcquireRoute { service, node } = self.clone();
        let decoded = Box::pin(async move { decode(&node, request).await });
        Box::pin(async move {
            let request = match decoded.await {
                Ok(request) => request,
                Err(status) => return Ok(status.into_http()),
            };
            Ok(encode(service.acquire_semaphore_owned(request).await))
        })
    }
}

/// The port's shortcut to the route: a call of [`PATH`] goes straight to the [`AcquireRoute`],
/// any other to the services behind it. The node's port layers this innermost, so a waiting
/// call keeps neither the router's room for a request it dispatches (axum keeps a whole
/// `http::Request` of room in every routed call's future) nor its boxed copy of the route; every
/// call's future is then one pointer wide in the layers above. The routes keep the same route
/// for the in-process client (`embed::LocalClient`), which has no port.
#[derive(Clone)]
pub(crate) struct ShortcutLayer {
    route: Option<AcquireRoute>,
}

impl ShortcutLayer {
    /// Serves [`PATH`] by `route`; with `None` (the peer port, which serves no client call)
    /// every call goes to the services behind.
    pub(crate) fn new(route: Option<AcquireRoute>) -> Self {
        ShortcutLayer { route }
    }
}

impl<S> tower::Layer<S> for ShortcutLayer {
    type Service = Shortcut<S>;

    fn layer(&self, inner: S) -> Shortcut<S> {
        Shortcut {
            route: self.route.clone(),
            inner,
        }
    }
}

/// See [`ShortcutLayer`].
#[derive(Clone)]
pub(crate) struct Shortcut<S> {
    route: Option<AcquireRoute>,
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Shortcut<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match &mut self.route {
            Some(route) if request.uri().path() == PATH => route.call(request),
            _ => Box::pin(self.inner.call(request)),
        }
    }
}

/// The call's message and metadata, as the generated server reads them: one message, no
/// compression (this server accepts none), at most [`CLIENT_MESSAGE_MAX_BYTES`].
async fn decode<B>(
    node: &Node,
    request: http::Request<B>,
) -> Result<tonic::Request<pb::AcquireSemaphoreRequest>, Status>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send,
{
    if let Some(error) = node.removal.error(node.id) {
        return Err(ApiError::Node(error).into());
    }
    if let Some(encoding) = request.headers().get("grpc-encoding")
        && encoding != "identity"
    {
        return Err(ApiError::Unsupported(format!(
            "Content is compressed with `{}` which isn't supported",
            encoding.to_str().unwrap_or("an unreadable encoding")
        ))
        .into());
    }
    let (parts, body) = request.into_parts();
    let mut stream = Box::pin(Streaming::new_request(
        AcquireCodec::default().decoder(),
        body,
        None,
        Some(CLIENT_MESSAGE_MAX_BYTES),
    ));
    let message = stream
        .message()
        .await?
        .ok_or_else(|| Status::from(ApiError::MissingMessage))?;
    let mut request = tonic::Request::from_http(http::Request::from_parts(parts, message));
    if let Some(trailers) = stream.trailers().await? {
        let mut headers = std::mem::take(request.metadata_mut()).into_headers();
        headers.extend(trailers.into_headers());
        *request.metadata_mut() = MetadataMap::from_headers(headers);
    }
    Ok(request)
}

/// The handler's answer as the generated server sends it: the message with `grpc-status` in
/// the trailers, or an error status alone.
fn encode(
    response: Result<tonic::Response<pb::AcquireSemaphoreResponse>, Status>,
) -> http::Response<Body> {
    let response = match response {
        Ok(response) => response,
        Err(status) => return status.into_http(),
    };
    let (metadata, message, extensions) = response.into_parts();
    let body = EncodeBody::new_server(
        AcquireCodec::default().encoder(),
        futures::stream::iter([Ok(message)]),
        None,
        SingleMessageCompressionOverride::default(),
        None,
    );
    let mut http = http::Response::new(Body::new(body));
    *http.headers_mut() = metadata.into_headers();
    http.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    *http.extensions_mut() = extensions;
    http
}

#[cfg(test)]
mod tests {
    use tower::Service as _;

    use super::*;

    /// A node of one, and the route serving its blocking acquires.
    async fn route() -> anyhow::Result<(crate::ConchNode, AcquireRoute, tempfile::TempDir)> {
        let dir = tempfile::tempdir()?;
        let running =
            crate::ConchNode::start(crate::NodeConfig::single("127.0.0.1:0", dir.path())).await?;
        let node = Arc::clone(running.node());
        let waiting = Arc::new(crate::api::admission::Waiting::new(
            node.metrics.waiting_calls.clone(),
        ));
        let service = Arc::new(GrackleService::new(Arc::clone(&node), waiting));
        Ok((running, AcquireRoute::new(service, node), dir))
    }

    fn call_of(path: &str) -> http::Request<Body> {
        let mut request = http::Request::new(Body::empty());
        *request.uri_mut() = http::Uri::try_from(path).expect("a path");
        request
    }

    /// What a blocking acquire keeps while it waits is this future (its decoding and its
    /// start run in boxes of their own, freed before the wait), one per waiting call: ten
    /// thousand waiting calls keep it ten thousand times. It held room for the whole HTTP
    /// request (240 bytes) and copies of the parked call's ticket and permit: 960 bytes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_acquire_keeps_no_room_for_its_request() -> anyhow::Result<()> {
        let (running, mut route, _dir) = route().await?;
        let future = route.call(call_of(PATH));
        let size = std::mem::size_of_val(&*future);
        assert!(size <= 640, "a blocking acquire's future is {size} bytes");
        drop(future);
        running.shutdown().await?;
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shortcut_serves_the_acquire_path_only_and_only_on_the_client_port()
    -> anyhow::Result<()> {
        let (running, route, _dir) = route().await?;
        let behind = tower::service_fn(|_: http::Request<Body>| async {
            let mut answer = http::Response::new(Body::empty());
            answer
                .headers_mut()
                .insert("served-by", http::HeaderValue::from_static("behind"));
            Ok::<_, Infallible>(answer)
        });
        let served_by = |answer: &http::Response<Body>| {
            answer
                .headers()
                .get("served-by")
                .map(|v| v.to_str().unwrap_or_default().to_string())
        };
        let mut clients = tower::Layer::layer(&ShortcutLayer::new(Some(route)), behind);
        let mut peers = tower::Layer::layer(&ShortcutLayer::new(None), behind);

        // The acquire path is the route's: a call without its message is refused by the
        // route's decoder, not answered by the services behind.
        let answer = clients.call(call_of(PATH)).await?;
        assert_eq!(served_by(&answer), None);
        let status = tonic::Status::from_header_map(answer.headers()).expect("a gRPC status");
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
        // Every other path, and every path on the peer port, goes to the services behind.
        let other = "/com.evrblk.grackle.v1beta.GrackleApi/ReleaseSemaphore";
        let answer = clients.call(call_of(other)).await?;
        assert_eq!(served_by(&answer).as_deref(), Some("behind"));
        let answer = peers.call(call_of(PATH)).await?;
        assert_eq!(served_by(&answer).as_deref(), Some("behind"));
        running.shutdown().await?;
        Ok(())
    }
}

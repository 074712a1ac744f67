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
        let AcquireRoute { service, node } = self.clone();
        Box::pin(async move {
            // Boxed: the decoder's state is freed before the handler runs. The request is
            // scoped to the block, so no room for it is kept across the handler's await.
            let answer = {
                let request = match Box::pin(decode(&node, request)).await {
                    Ok(request) => request,
                    Err(status) => return Ok(status.into_http()),
                };
                service.acquire_semaphore_owned(request)
            };
            Ok(encode(answer.await))
        })
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

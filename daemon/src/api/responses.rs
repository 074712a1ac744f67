//! The one layer around every gRPC response, so a call pays for one wrapper:
//! - it adds the `conch-leader` header (the leader's address, when this node knows it) to every
//!   response of the client-facing services, errors included: a client that got NOT_FOUND or
//!   INVALID_ARGUMENT from a follower still learns where the leader is. The value is read when
//!   the response leaves, so a leader learned during the call is the one named. Peer traffic
//!   gets no header;
//! - it counts every call by method and status code, and times it to the response headers. The
//!   status is read from the response headers: a unary call that fails answers with its status
//!   there ("trailers-only"), and one that succeeds carries OK in the trailers. A streaming call
//!   is counted when its headers leave, as OK unless it failed at once. Paths of methods this
//!   server does not have are counted as `unknown`, so a client cannot grow the number of
//!   series;
//! - it times the outer stages of a call that wrote once (see `write_trace.rs`).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::time::Instant;

use tokio::task::futures::TaskLocalFuture;
use tonic::codegen::http;

use super::LEADER_HEADER;
use crate::base::write_trace::{CALL, CallStamps, record_call};
use crate::node::Node;
use crate::support::metrics::Metrics;

/// Path prefix of the node-to-node service, whose responses carry no leader hint.
const PEER_PATH: &str = "/conch.v1.ConchPeer/";

/// The layer, given to the server once.
#[derive(Clone)]
pub(crate) struct ResponseLayer {
    node: Arc<Node>,
}

impl ResponseLayer {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        ResponseLayer { node }
    }
}

impl<S> tower::Layer<S> for ResponseLayer {
    type Service = Responses<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Responses {
            inner,
            node: Arc::clone(&self.node),
        }
    }
}

/// The service the layer wraps around the server's routes.
#[derive(Clone)]
pub(crate) struct Responses<S> {
    inner: S,
    node: Arc<Node>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Responses<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The request's own path, shared rather than copied: no allocation per call.
        let path = request.uri().clone();
        let started = Instant::now();
        // The handler notes its write's moments in the task-local (see `write_trace.rs`).
        let inner = CALL.scope(Cell::new(CallStamps::default()), self.inner.call(request));
        ResponseFuture {
            inner: Box::pin(inner),
            path,
            node: Arc::clone(&self.node),
            started,
        }
    }
}

/// A call's response on its way out. A plain struct rather than an `async` block: a call that
/// waits keeps the inner future and these few fields, nothing more (an `async` block around the
/// task-local scope kept room for the inner future twice).
pub(crate) struct ResponseFuture<F> {
    inner: Pin<Box<TaskLocalFuture<Cell<CallStamps>, F>>>,
    /// The call's URI; its path names the method in the metrics.
    path: http::Uri,
    node: Arc<Node>,
    started: Instant,
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Poll::Ready(response) = this.inner.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        let stamps = this
            .inner
            .as_mut()
            .take_value()
            .map(Cell::into_inner)
            .unwrap_or_default();
        let mut response = response?;
        let node = &this.node;
        record_call(stamps, this.started, Instant::now(), &node.metrics.stages);
        let path = this.path.path();
        count(&node.metrics, path, response.headers(), this.started);
        if !path.starts_with(PEER_PATH) {
            add_leader(node, response.headers_mut());
        }
        Poll::Ready(Ok(response))
    }
}

fn add_leader(node: &Node, headers: &mut http::HeaderMap) {
    if let Some(addr) = node.leader_client_addr()
        && let Ok(value) = http::HeaderValue::from_str(&addr)
    {
        headers.insert(LEADER_HEADER, value);
    }
}

/// Counts one answered call of `path` and its time since `started`.
fn count(metrics: &Metrics, path: &str, headers: &http::HeaderMap, started: Instant) {
    let code = status_code(headers);
    let method = if code == tonic::Code::Unimplemented {
        "unknown"
    } else {
        path
    };
    metrics
        .grpc
        .requests
        .with_label_values(&[method, code_name(code)])
        .inc();
    metrics
        .grpc
        .seconds
        .with_label_values(&[method])
        .observe(started.elapsed().as_secs_f64());
}

/// The status a response's headers carry; OK when they carry none (it comes in the trailers).
fn status_code(headers: &http::HeaderMap) -> tonic::Code {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32)
}

/// gRPC's own names for the codes, as other gRPC servers label them.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_comes_from_the_headers_or_is_ok() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(status_code(&headers), tonic::Code::Ok);
        headers.insert("grpc-status", http::HeaderValue::from_static("5"));
        assert_eq!(status_code(&headers), tonic::Code::NotFound);
        assert_eq!(code_name(status_code(&headers)), "NOT_FOUND");
        headers.insert("grpc-status", http::HeaderValue::from_static("junk"));
        assert_eq!(status_code(&headers), tonic::Code::Ok);
    }
}

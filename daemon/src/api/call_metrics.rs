//! Counts every gRPC call by method and status code, and times it to the response headers.
//!
//! The status is read from the response headers: a unary call that fails answers with its
//! status there ("trailers-only"), and one that succeeds carries OK in the trailers. A streaming
//! call is counted when its headers leave, as OK unless it failed at once. Paths of methods
//! this server does not have are counted as `unknown`, so a client cannot grow the number of
//! series.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;

use crate::metrics::Metrics;

/// The layer, given to the server once.
#[derive(Clone)]
pub struct CallMetricsLayer {
    metrics: Arc<Metrics>,
}

impl CallMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        CallMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for CallMetricsLayer {
    type Service = CallMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallMetrics {
            inner,
            metrics: Arc::clone(&self.metrics),
        }
    }
}

/// The service the layer wraps around the server's routes.
#[derive(Clone)]
pub struct CallMetrics<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower::Service<http::Request<B>> for CallMetrics<S>
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
        let path = request.uri().path().to_string();
        let metrics = Arc::clone(&self.metrics);
        let started = Instant::now();
        let fut = self.inner.call(request);
        Box::pin(async move {
            let response = fut.await?;
            let code = status_code(response.headers());
            let method = if code == tonic::Code::Unimplemented {
                "unknown"
            } else {
                path.as_str()
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
            Ok(response)
        })
    }
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

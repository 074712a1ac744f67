//! The metrics listener, over HTTP/1.1 (GET, and HEAD for the probes):
//! - `/metrics`: the node's registry (`support/metrics.rs`) as Prometheus text, its gauges read
//!   from Raft and the applied state at scrape time;
//! - `/healthz` (liveness): 200 `ok` whenever the process answers at all, so a probe that
//!   restarts processes restarts only a hung one, never a node that merely waits for a leader;
//! - `/readyz` (readiness): 200 `ready` while the node should take client traffic, else 503 with
//!   the reason on one line: the rule of the gRPC health check (`api/health.rs`): a leader known
//!   (a leader no majority answers counts as none), the log applied to within 1000 entries of
//!   its end, the node not removed from the cluster.

use std::sync::Arc;
use std::time::Duration;

use crate::node::Node;
use crate::support::metrics::RaftGauges;

/// Serves `/metrics` on `listener` until the node stops: HTTP/1.1, GET only.
pub(crate) async fn serve(node: Arc<Node>, listener: tokio::net::TcpListener) {
    use hyper::server::conn::http1;
    use hyper_util::rt::TokioIo;
    let gate = node.connection_gate("metrics");
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = gate.admit(Some(remote)) else {
            continue;
        };
        let conn = Arc::clone(slot.conn());
        let stream = slot.wrap(stream);
        let tasks = node.tasks.clone();
        let node = Arc::clone(&node);
        tasks.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let node = Arc::clone(&node);
                let call = conn.call();
                async move {
                    let response = respond(&node, &request);
                    drop(call);
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let connection = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "metrics connection");
            }
        });
    }
}

type Body = http_body_util::Full<hyper::body::Bytes>;

fn respond<B>(node: &Node, request: &hyper::Request<B>) -> hyper::Response<Body> {
    use hyper::{Method, StatusCode};
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut response = hyper::Response::new(Body::from(body));
        *response.status_mut() = status;
        if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    let text = "text/plain; charset=utf-8";
    let probe = matches!(*request.method(), Method::GET | Method::HEAD);
    match (request.method(), request.uri().path()) {
        (_, "/healthz") if probe => reply(StatusCode::OK, text, "ok\n".into()),
        (_, "/readyz") if probe => {
            match crate::api::health::readiness(node, &node.watch_raft().status()) {
                Ok(()) => reply(StatusCode::OK, text, "ready\n".into()),
                Err(why) => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    text,
                    format!("not ready: {why}\n"),
                ),
            }
        }
        (_, "/healthz" | "/readyz") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "use GET or HEAD\n".into(),
        ),
        (&Method::GET, "/metrics") => match render(node) {
            Ok(text) => reply(StatusCode::OK, prometheus::TEXT_FORMAT, text),
            Err(e) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                format!("metrics: {e}\n"),
            ),
        },
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "use GET\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "conchd serves /metrics, /healthz and /readyz here\n".into(),
        ),
    }
}

/// Every metric of `node`, the gauges read now.
fn render(node: &Node) -> Result<String, prometheus::Error> {
    let raft = {
        let m = node.raft.metrics();
        let m = m.borrow();
        let leader = crate::node::known_leader(&m, node.id);
        RaftGauges {
            term: m.current_term,
            leader,
            is_leader: leader == Some(node.id),
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            members: m.membership_config.membership().voter_ids().count() as u64,
            cluster_version: node.applied.read(|s| s.cluster_version().0),
        }
    };
    let (stats, quotas) = node.applied.read(|state| {
        let (budget, bytes) = state.budget();
        let quotas = crate::support::metrics::QuotaGauges::new(budget, bytes, &state.all_quotas());
        (state.stats(), quotas)
    });
    let tls_expiry = node.config.tls.as_ref().and_then(|t| t.earliest_expiry());
    node.metrics.tls_expiry.set(tls_expiry.unwrap_or(0));
    node.metrics.render(&raft, &stats, &quotas)
}

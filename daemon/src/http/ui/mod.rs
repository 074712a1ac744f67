//! The read-only status page (`--ui-listen`): who holds what, who waits, which leases run out,
//! and how the cluster is, in a browser and as JSON, served over HTTP/1.1 on a port of its own
//! (HTTPS with the node's certificate when the node serves TLS).
//!
//! Paths (GET only):
//! - `/ui/` the overview (cluster, namespaces, leases expiring soonest), `/ui/ns/NAME` one
//!   namespace (semaphores with holders and wait queues, locks, wait groups, barriers, leases);
//! - `/ui/part/…` the same views' main part alone, which the page's script fetches every two
//!   seconds to stay live; `/ui/api/…` the same views as JSON;
//! - `/ui/assets/page.js` and `page.css`, compiled into the binary.
//!
//! Every view is one linearizable read ([`Node::linearizable`], as every API read), then one
//! look at the applied state, so any node shows what the leader would. A request is the
//! caller its `authorization: Bearer` header names ([`Caller`]), checked as a gRPC call is: the
//! cluster view needs a known token, a namespace read permission on it; the overview lists only
//! the namespaces the token may read. The token never travels in a URL: the script keeps it in
//! the tab's sessionStorage and sends it as that header.

mod html;
mod view;

use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, StatusCode};
use serde::Serialize;
use tonic::Code;

use crate::api::auth::{AUTHORIZATION, Caller};
use crate::api::status::ApiError;
use crate::node::Node;
use crate::state::Nanos;
use crate::state::auth::{Access, Permission};

const PAGE_JS: &str = include_str!("page.js");
const PAGE_CSS: &str = include_str!("page.css");

/// The browser may run only the page's own script and style, and send nowhere else.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// Serves the status page on `listener` until the node stops.
pub(crate) async fn serve(node: Arc<Node>, listener: tokio::net::TcpListener) {
    let gate = node.connection_gate("ui");
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "status page listener: accept failed");
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
        let gate = Arc::clone(&gate);
        tasks.spawn(async move {
            match node.config.tls.as_ref().map(|tls| tls.page_acceptor()) {
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => connection(node, conn, stream).await,
                        Ok(Err(e)) => {
                            gate.count(crate::net::connections::Reason::Handshake, Some(remote));
                            tracing::debug!(error = %e, "status page: TLS handshake")
                        }
                        Err(_) => {
                            gate.count(crate::net::connections::Reason::Handshake, Some(remote));
                            tracing::debug!("status page: TLS handshake timed out")
                        }
                    }
                }
                None => connection(node, conn, stream).await,
            }
        });
    }
}

async fn connection<S>(node: Arc<Node>, conn: Arc<crate::net::connections::Conn>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper::server::conn::http1;
    use hyper_util::rt::TokioIo;
    let service = hyper::service::service_fn(move |request| {
        let node = Arc::clone(&node);
        let call = conn.call();
        async move {
            let response = respond(&node, &request).await;
            drop(call);
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let connection = http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = connection.await {
        tracing::debug!(error = %e, "status page connection");
    }
}

type Body = Full<Bytes>;

/// One of the views the paths name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View<'a> {
    Overview,
    Namespace(&'a str),
}

/// How a view is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Page,
    Part,
    Json,
}

/// What a path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Home,
    Asset(&'static str, &'static str),
    View(Form, View<'a>),
    NotFound,
}

fn route(path: &str) -> Route<'_> {
    let (form, rest) = if let Some(rest) = path.strip_prefix("/ui/part/") {
        (Form::Part, rest)
    } else if let Some(rest) = path.strip_prefix("/ui/api/") {
        (Form::Json, rest)
    } else if let Some(rest) = path.strip_prefix("/ui/") {
        match rest {
            "assets/page.js" => return Route::Asset("text/javascript; charset=utf-8", PAGE_JS),
            "assets/page.css" => return Route::Asset("text/css; charset=utf-8", PAGE_CSS),
            _ => (Form::Page, rest),
        }
    } else {
        return match path {
            "/" | "/ui" => Route::Home,
            _ => Route::NotFound,
        };
    };
    match rest {
        "" => Route::View(form, View::Overview),
        rest => match rest.strip_prefix("ns/") {
            Some(name) if !name.is_empty() && !name.contains('/') => {
                Route::View(form, View::Namespace(name))
            }
            _ => Route::NotFound,
        },
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> hyper::Response<Body> {
    let mut response = hyper::Response::new(Body::from(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    response
}

const HTML: &str = "text/html; charset=utf-8";
const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

async fn respond<B>(node: &Node, request: &hyper::Request<B>) -> hyper::Response<Body> {
    let path = request.uri().path();
    let route = route(path);
    if request.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "use GET\n".into());
    }
    match route {
        Route::Home => {
            let mut response = reply(StatusCode::SEE_OTHER, TEXT, "see /ui/\n".into());
            response
                .headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/ui/"));
            response
        }
        Route::NotFound => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "conchd serves its status page at /ui/\n".into(),
        ),
        Route::Asset(content_type, body) => reply(StatusCode::OK, content_type, body.into()),
        Route::View(form, view) => {
            let token = request
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    let (scheme, token) = v.trim().split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then_some(token)
                });
            let shown = show(node, view, Caller::bearing(token), token.is_some()).await;
            render(node, path, form, view, shown)
        }
    }
}

/// A view read, or why not.
enum Shown {
    Overview(Box<view::Overview>),
    Namespace(Box<view::NamespacePage>),
    Refused(Refusal),
}

struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// A token would help: the page asks for one.
    ask_token: bool,
}

impl Refusal {
    fn of(error: ApiError) -> Refusal {
        let status = tonic::Status::from(error);
        let (http, code) = match status.code() {
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
            Code::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            Code::InvalidArgument => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
            Code::Unavailable | Code::DeadlineExceeded => {
                (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE")
            }
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
        };
        Refusal {
            status: http,
            code,
            ask_token: matches!(
                status.code(),
                Code::Unauthenticated | Code::PermissionDenied
            ),
            message: status.message().to_string(),
        }
    }
}

fn now_ns() -> Nanos {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX))
}

/// Reads `view` for `caller`: permission first (as the API checks it), then a linearizable
/// read, then one look at the applied state.
async fn show(node: &Node, view: View<'_>, caller: Caller, has_token: bool) -> Shown {
    let access_control = node.applied.read(|s| s.auth().enabled());
    let checked = match view {
        View::Overview => caller.authenticated(node),
        View::Namespace(ns) => caller.allow(node, Access::Namespace(ns, Permission::Read)),
    };
    if let Err(e) = checked {
        let mut refusal = Refusal::of(e);
        if access_control && !has_token && refusal.status == StatusCode::UNAUTHORIZED {
            refusal.message = "Access control is on: this page needs a token.".into();
        }
        return Shown::Refused(refusal);
    }
    if let Err(e) = node.linearizable().await {
        return Shown::Refused(Refusal::of(ApiError::from(e)));
    }
    let now = now_ns();
    match view {
        View::Overview => {
            let cluster = cluster(node);
            let read = node.applied.read(|s| view::overview_of(s, &caller, now));
            match read {
                Ok((namespaces, expiring_leases)) => Shown::Overview(Box::new(view::Overview {
                    cluster,
                    access_control,
                    namespaces,
                    expiring_leases,
                    read_at: view::utc(now),
                })),
                Err(e) => Shown::Refused(Refusal::of(ApiError::from(e))),
            }
        }
        View::Namespace(ns) => {
            match node
                .applied
                .read(|s| view::namespace_of(s, &caller, ns, now))
            {
                Ok(page) => Shown::Namespace(Box::new(page)),
                Err(e) => Shown::Refused(Refusal::of(ApiError::from(e))),
            }
        }
    }
}

/// The cluster as this node sees it now.
fn cluster(node: &Node) -> view::Cluster {
    let status = node.raft_status();
    let members: Vec<(u64, String, bool)> = node
        .members()
        .into_iter()
        .map(|m| (m.id, m.addr, m.voter))
        .collect();
    let matched = node.replication();
    let leader = node.leader().filter(|l| Some(l.id) == status.known_leader);
    let tls = node.config.tls.as_ref();
    let not_after_ns = tls
        .and_then(|t| t.not_after())
        .map(|s| s.saturating_mul(1_000_000_000));
    view::Cluster {
        node_id: node.id,
        node_addr: node.config.advertise.clone(),
        role: status.state.clone(),
        term: status.term,
        leader_id: status.known_leader,
        // Where a client reaches the leader (not its peer address, which may be a port only
        // peers may reach), as the `conch-leader` header says.
        leader_addr: leader.and_then(|_| node.leader_client_addr()),
        last_log_index: status.last_log_index,
        applied_index: node.applied.applied_index().max(status.applied_index),
        snapshot_index: status.snapshot_index,
        leader_changes: node.metrics.leader_changes.get(),
        members: view::member_rows(
            &members,
            node.id,
            status.known_leader,
            matched.as_ref(),
            status.last_log_index,
        ),
        lag_known: matched.is_some(),
        tls: tls.is_some(),
        certificate_expires_at: not_after_ns.map(view::utc),
        certificate_expires_in_ms: not_after_ns.map(|at| at.saturating_sub(now_ns()) / 1_000_000),
        problems: crate::api::auth::setup_problem(node).into_iter().collect(),
        release: crate::support::release::RELEASE.to_string(),
        cluster_version: node.applied.read(|s| s.cluster_version().0),
        cluster_version_max: node.config.cluster_version_max,
    }
}

#[derive(Serialize)]
struct JsonError<'a> {
    error: JsonErrorBody<'a>,
}

#[derive(Serialize)]
struct JsonErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> hyper::Response<Body> {
    match serde_json::to_string_pretty(value) {
        Ok(mut text) => {
            text.push('\n');
            reply(status, JSON, text)
        }
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            TEXT,
            format!("status page: {e}\n"),
        ),
    }
}

/// `shown` in the form asked for.
fn render(
    node: &Node,
    path: &str,
    form: Form,
    view: View<'_>,
    shown: Shown,
) -> hyper::Response<Body> {
    if form == Form::Json {
        return match &shown {
            Shown::Overview(o) => json(StatusCode::OK, o),
            Shown::Namespace(n) => json(StatusCode::OK, n),
            Shown::Refused(r) => json(
                r.status,
                &JsonError {
                    error: JsonErrorBody {
                        code: r.code,
                        message: &r.message,
                    },
                },
            ),
        };
    }
    let (status, main) = match &shown {
        Shown::Overview(o) => (StatusCode::OK, html::overview(o)),
        Shown::Namespace(n) => (StatusCode::OK, html::namespace(n)),
        Shown::Refused(r) if r.ask_token => (r.status, html::token_form(&r.message)),
        Shown::Refused(r) => (r.status, html::problem(&r.message)),
    };
    if form == Form::Part {
        return reply(status, HTML, main);
    }
    let title = match view {
        View::Overview => "Overview".to_string(),
        View::Namespace(ns) => format!("Namespace {ns}"),
    };
    let part = path.replacen("/ui/", "/ui/part/", 1);
    let frame = html::Frame {
        node_id: node.id,
        plaintext: node.config.tls.is_none(),
        part: &part,
        title: &title,
    };
    // A page asking for a token answers 200: the browser shows it, and the script fills it in
    // once a token is entered.
    let status = match &shown {
        Shown::Refused(r) if r.ask_token => StatusCode::OK,
        _ => status,
    };
    reply(status, HTML, html::page(&frame, &main))
}

#[cfg(test)]
mod tests;

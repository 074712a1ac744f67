//! [`Client`]: endpoints, failover, leader hints, deadlines, and typed wrappers of the RPCs.
//!
//! How a call is routed:
//! 1. the node named by the last `conch-leader` hint (every conchd response carries one), so a
//!    write does not take the follower → leader hop;
//! 2. otherwise the endpoint that answered last, then the others in order;
//! 3. an endpoint with a transport failure is avoided for a couple of seconds;
//! 4. with no leader known, or once the leader failed, the call goes to the endpoints not tried
//!    yet in this round with overlap: the next one is started when the previous failed or has
//!    not answered within 250 ms, and the first answer wins (the others are abandoned; every
//!    call is safe to send again, see below);
//! 5. a node answering `Unavailable` (no leader yet, shutting down) or a transport failure moves
//!    the call on; after a full round it sleeps (exponential backoff) and starts over, until
//!    [`CallOptions::retry_for`] is spent. If no node answered at all in a round that waited out
//!    a deadline (stopped or hung nodes), or in two rounds of refused connections, it gives up
//!    early: a dead cluster is reported within about one request timeout, a stopped one in well
//!    under a second.
//!
//! Every RPC wrapped here is safe to send again. Every write but refresh carries one request id
//! (`conch-request-id`, see [`crate::request_id`]) for all its attempts, so a retry after a lost
//! reply gets the first attempt's reply instead of running again: a retried create answers what
//! the first one did (not `AlreadyExists`), a retried [`Client::create_lease`] returns the same
//! lease (no second lease left to expire), a retried acquire the same grant and fencing token.
//! Reads and refresh are safe to repeat as they are.
//!
//! This file holds the client, its configuration and its channels; `routing.rs` routes a call
//! (the steps above); `calls.rs` holds the typed wrappers of the namespace, semaphore, lease and
//! cluster calls (the other services' wrappers live in their own modules: `sema`, `lock`, …).

use std::sync::{Arc, Mutex};
use std::time::Duration;

// Tokio's clock (the system's unless a test pauses it), so tests of routing, hedging and
// retries run in virtual time.
use tokio::time::Instant;

use tonic::transport::{Channel, Endpoint};

use tonic::Status;

use crate::endpoint::{EndpointAddr, parse_endpoint};
use crate::error::{Error, Result};

pub use crate::request_id::request;

use crate::tls::ClientTls;

mod calls;
mod routing;

pub use calls::Waiters;
pub(crate) use calls::{all_pages, missing};
pub(crate) use routing::Attempt;

/// The response metadata key in which conchd names the leader's client address.
pub use conch_proto::wire::LEADER_HEADER as LEADER_METADATA_KEY;

/// Page size used when listing holders and waiters.
pub(crate) const PAGE_LIMIT: i32 = 250;
/// Most nodes a client remembers (configured endpoints plus leader hints).
const MAX_NODES: usize = 64;
/// How long an endpoint with a transport failure is tried last.
const DOWN_FOR: Duration = Duration::from_secs(2);
/// Without a leader, how long an attempt may go unanswered before the next endpoint is tried
/// alongside it.
const HEDGE_AFTER: Duration = Duration::from_millis(250);

/// Tunables of a [`Client`]. The defaults suit the CLI.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Deadline of one attempt of a unary RPC (sent as `grpc-timeout` and enforced locally).
    pub request_timeout: Duration,
    /// How long a call keeps trying other endpoints before answering [`Error::Unavailable`].
    pub retry_for: Duration,
    /// TCP connect timeout per endpoint.
    pub connect_timeout: Duration,
    /// HTTP/2 ping interval; a node that stops answering pings (crashed, paused, partitioned)
    /// fails its in-flight calls, blocked acquires included, after about interval + timeout.
    pub keepalive_interval: Duration,
    /// How long to wait for a ping's answer.
    pub keepalive_timeout: Duration,
    /// Longest server-side wait of one `AcquireSemaphore` RPC; longer waits are chained.
    pub acquire_rpc_wait: Duration,
    /// How long before an acquire RPC's wait ends the overlapping re-attach is sent.
    pub reattach_margin: Duration,
    /// Extra time an acquire RPC may take beyond its server-side wait before the client gives
    /// up on it (forwarding, commit).
    pub acquire_slack: Duration,
    /// TLS to every endpoint; `None` dials in plaintext.
    pub tls: Option<ClientTls>,
    /// Sent as `authorization: Bearer <token>` on every call (needed when the cluster has
    /// access control on).
    pub token: Option<crate::BearerToken>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(2),
            keepalive_interval: Duration::from_secs(3),
            keepalive_timeout: Duration::from_secs(3),
            acquire_rpc_wait: Duration::from_secs(30),
            reattach_margin: Duration::from_secs(5),
            acquire_slack: Duration::from_secs(10),
            tls: None,
            token: None,
        }
    }
}

/// Deadline and retry budget of one call made through [`Client::call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// Deadline of each attempt.
    pub timeout: Duration,
    /// How long to keep trying other endpoints (0: one round over the endpoints).
    pub retry_for: Duration,
}

/// A client of a conch cluster. Cheap to clone; clones share channels and the leader hint.
///
/// ```no_run
/// # async fn demo() -> Result<(), conch_client::Error> {
/// use conch_client::Client;
///
/// let client = Client::connect(["node1:7001", "node2:7001", "node3:7001"]).await?;
/// let sem = client.ensure_semaphore("jobs", "nightly", 2).await?;
/// println!("{} holds {}/{}", sem.name, sem.active_holds, sem.permits);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.endpoints())
            .field("leader_hint", &self.leader_hint())
            .finish()
    }
}

struct Inner {
    config: ClientConfig,
    nodes: Mutex<Nodes>,
    /// Makes the channel to an endpoint (configured or learned from a hint).
    dial: Dial,
}

/// How channels to endpoints are made: [`make_channel`], or a fake transport in tests.
pub(crate) type Dial = Arc<dyn Fn(&EndpointAddr, &ClientConfig) -> Result<Channel> + Send + Sync>;

struct Node {
    addr: String,
    channel: Channel,
    /// Given by the user (as opposed to learned from a leader hint).
    configured: bool,
    down_until: Option<Instant>,
}

struct Nodes {
    list: Vec<Node>,
    leader: Option<usize>,
    preferred: usize,
}

impl Client {
    /// A client of the cluster reachable at `endpoints` (`host:port`, see
    /// [`crate::parse_endpoint`]), with the default [`ClientConfig`].
    ///
    /// Connections are made lazily, on first use; this fails only on malformed endpoints.
    pub async fn connect<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::connect_with(endpoints, ClientConfig::default()).await
    }

    /// Like [`Client::connect`] with a custom configuration.
    pub async fn connect_with<I, S>(endpoints: I, config: ClientConfig) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::connect_dialing(endpoints, config, Arc::new(make_channel))
    }

    /// [`Client::connect_with`], its channels made by `dial`.
    pub(crate) fn connect_dialing<I, S>(
        endpoints: I,
        config: ClientConfig,
        dial: Dial,
    ) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut parsed: Vec<EndpointAddr> = Vec::new();
        for e in endpoints {
            let ep = parse_endpoint(e.as_ref())?;
            if !parsed.contains(&ep) {
                parsed.push(ep);
            }
        }
        if parsed.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoints given".to_string(),
            });
        }
        let mut list = Vec::with_capacity(parsed.len());
        for ep in parsed {
            list.push(Node {
                channel: dial(&ep, &config)?,
                addr: ep.addr,
                configured: true,
                down_until: None,
            });
        }
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                nodes: Mutex::new(Nodes {
                    list,
                    leader: None,
                    preferred: 0,
                }),
                dial,
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The endpoints given to [`Client::connect`], as `host:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes()
            .list
            .iter()
            .filter(|n| n.configured)
            .map(|n| n.addr.clone())
            .collect()
    }

    /// The leader's address as last reported by a node, if any.
    pub fn leader_hint(&self) -> Option<String> {
        let nodes = self.nodes();
        nodes.leader.map(|i| nodes.list[i].addr.clone())
    }

    /// Default options for unary calls: [`ClientConfig::request_timeout`] per attempt,
    /// [`ClientConfig::retry_for`] in all.
    pub fn default_options(&self) -> CallOptions {
        CallOptions {
            timeout: self.inner.config.request_timeout,
            retry_for: self.inner.config.retry_for,
        }
    }
}

fn make_channel(ep: &EndpointAddr, config: &ClientConfig) -> Result<Channel> {
    let bad = |e: tonic::transport::Error| Error::InvalidEndpoint {
        endpoint: ep.addr.clone(),
        reason: e.to_string(),
    };
    let endpoint = match &config.tls {
        Some(tls) => Endpoint::from_shared(format!("https://{}", ep.addr))
            .map_err(bad)?
            .tls_config(tls.tonic_config())
            .map_err(bad)?,
        None => Endpoint::from_shared(ep.uri.clone()).map_err(bad)?,
    };
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(config.keepalive_interval)
        .keep_alive_timeout(config.keepalive_timeout)
        .keep_alive_while_idle(true)
        .connect_lazy())
}

/// A channel to nowhere, for the impossible case of a client without nodes.
fn unreachable_channel() -> Channel {
    Endpoint::from_static("http://127.0.0.1:1").connect_lazy()
}

/// A transport failure as one line, with a hint when it looks like a TLS/plaintext mismatch or
/// a certificate problem.
fn transport_error(status: &Status, tls: bool) -> String {
    let text = describe_status(status);
    match crate::tls::mismatch_hint(&text, tls) {
        Some(hint) => format!("{text} ({hint})"),
        None => text,
    }
}

/// A status as one line, with the transport cause that tonic keeps in `source` (e.g.
/// "transport error: tcp connect error: Connection refused (os error 111)").
pub(crate) fn describe_status(status: &Status) -> String {
    let mut out = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        let text = err.to_string();
        if !text.is_empty() && !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        source = err.source();
    }
    if out.is_empty() {
        format!("{:?}", status.code())
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;
    use tonic::metadata::MetadataValue;

    fn hint(addr: &str) -> MetadataMap {
        let mut md = MetadataMap::new();
        md.insert(
            LEADER_METADATA_KEY,
            MetadataValue::try_from(addr).expect("ascii"),
        );
        md
    }

    #[tokio::test]
    async fn endpoints_are_tried_in_order_and_failed_ones_last() {
        let c = Client::connect(["a:1", "b:2", "c:3"]).await.unwrap();
        let order = |c: &Client| {
            let mut tried = vec![];
            while let Some((i, addr, _)) = c.pick(&tried) {
                tried.push(i);
                let _ = addr;
            }
            tried
        };
        assert_eq!(order(&c), [0, 1, 2]);
        c.mark_down(0);
        assert_eq!(order(&c), [1, 2, 0]);
        c.observe_answer(2, &MetadataMap::new());
        assert_eq!(order(&c), [2, 1, 0]);
    }

    #[tokio::test]
    async fn leader_hint_goes_first_and_unknown_leaders_are_learned() {
        let c = Client::connect(["a:1", "b:2"]).await.unwrap();
        c.observe_answer(0, &hint("b:2"));
        assert_eq!(c.leader_hint().as_deref(), Some("b:2"));
        assert_eq!(c.pick(&[]).unwrap().1, "b:2");

        c.observe_answer(0, &hint("http://c:3"));
        assert_eq!(c.leader_hint().as_deref(), Some("c:3"));
        assert_eq!(c.pick(&[]).unwrap().1, "c:3");
        // Learned nodes are not listed as configured endpoints.
        assert_eq!(c.endpoints(), ["a:1", "b:2"]);

        // A leader that cannot serve or is unreachable loses the hint.
        c.observe_cannot_serve(2, &MetadataMap::new());
        assert_eq!(c.leader_hint(), None);
        c.observe_answer(1, &hint("c:3"));
        c.mark_down(2);
        assert_eq!(c.leader_hint(), None);

        // Garbage hints are ignored.
        c.observe_answer(0, &hint("not a host:port:x"));
        assert_eq!(c.leader_hint(), None);
    }

    #[tokio::test]
    async fn malformed_endpoints_are_refused_up_front() {
        let err = Client::connect(["a:1", "b:x"]).await.unwrap_err();
        assert!(matches!(err, Error::InvalidEndpoint { .. }), "{err}");
        let none: [&str; 0] = [];
        assert!(Client::connect(none).await.is_err());
    }

    #[test]
    fn describe_status_keeps_the_transport_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let mut s = Status::unavailable("tcp connect error");
        s.set_source(Arc::new(io));
        assert_eq!(describe_status(&s), "tcp connect error: connection refused");
        assert_eq!(describe_status(&Status::unavailable("")), "Unavailable");
    }
}

//! Every channel to a node is built here: connected ([`connect`], [`channel`]), lazily
//! connecting ([`lazy_channel`]), and the failover client [`Failover`] that talks to one node
//! of a list and moves on.
//!
//! [`Failover`]:
//! - every call has a client-side deadline; a call past it is dropped (the server sees the
//!   stream reset) and answered `DeadlineExceeded`;
//! - a response whose `conch-leader` metadata names another node moves the next calls there;
//! - on `Unavailable`, a transport error or a deadline, the next call goes to the next endpoint.

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;
use conch_client::BearerToken;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{ClusterStatusRequest, ClusterStatusResponse};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Response, Status};

/// Response metadata naming the leader's address.
pub const LEADER_HEADER: &str = "conch-leader";

pub type Grackle = GrackleApiClient<NodeChannel>;

/// A channel to one node that sends the process's token ([`use_token`]), if any, on every call.
pub type NodeChannel = InterceptedService<Channel, ProcessToken>;

/// The token every channel made here sends (for runs against a cluster with access control on:
/// `conch-bench --auth`, `conch-jepsen --auth`). Set at most once per process; tests never set
/// it.
static TOKEN: OnceLock<String> = OnceLock::new();

/// Makes every channel made here, also those made before, send `token` from now on; fails if a
/// token was set already.
pub fn use_token(token: &str) -> anyhow::Result<()> {
    BearerToken::new(token)?;
    TOKEN
        .set(format!("Bearer {}", token.trim()))
        .map_err(|_| anyhow::anyhow!("a token is already in use"))
}

/// Adds the process's token, read at each call, to every request.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessToken;

impl Interceptor for ProcessToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = TOKEN.get().and_then(|t| t.parse().ok()) {
            request
                .metadata_mut()
                .insert(conch_client::AUTHORIZATION, value);
        }
        Ok(request)
    }
}

fn with_token(channel: Channel) -> NodeChannel {
    NodeChannel::new(channel, ProcessToken)
}

/// The one endpoint builder: `addr` (host:port) over plain HTTP/2 (or TLS, for a node of a TLS
/// cluster: see [`crate::pki`]), no Nagle delay, connecting within `connect_timeout`.
fn endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, Status> {
    let bad =
        |e: tonic::transport::Error| Status::invalid_argument(format!("bad endpoint {addr}: {e}"));
    let endpoint = match crate::pki::lookup(addr) {
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))
            .map_err(bad)?
            .tls_config(tls)
            .map_err(bad)?,
        None => Endpoint::from_shared(format!("http://{addr}")).map_err(bad)?,
    };
    Ok(endpoint.connect_timeout(connect_timeout).tcp_nodelay(true))
}

/// Opens a channel to `addr`, failing within `connect_timeout` when nothing listens there.
pub async fn connect(addr: &str, connect_timeout: Duration) -> Result<NodeChannel, Status> {
    endpoint(addr, connect_timeout)?
        .connect()
        .await
        .map(with_token)
        .map_err(|e| Status::unavailable(format!("connect to {addr}: {e}")))
}

/// Like [`connect`], with the client's end of the connection bound to the local address `from`
/// (e.g. 127.0.0.2 on loopback): a node counts connections per source address, so many
/// connections from one process are dealt over several.
pub async fn connect_from(
    addr: &str,
    from: std::net::IpAddr,
    connect_timeout: Duration,
) -> Result<NodeChannel, Status> {
    endpoint(addr, connect_timeout)?
        .local_address(Some(from))
        .connect()
        .await
        .map(with_token)
        .map_err(|e| Status::unavailable(format!("connect to {addr} from {from}: {e}")))
}

/// A channel to `addr` that is connected (fails fast if the node is down); every call on it
/// has a 10 s deadline.
pub async fn channel(addr: &str) -> anyhow::Result<NodeChannel> {
    endpoint(addr, Duration::from_secs(1))?
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map(with_token)
        .with_context(|| format!("connect to {addr}"))
}

/// A lazily connecting channel to `addr`: a down node fails calls quickly, a restarted one is
/// reconnected to.
pub fn lazy_channel(addr: &str) -> anyhow::Result<NodeChannel> {
    Ok(with_token(
        endpoint(addr, Duration::from_millis(500))?.connect_lazy(),
    ))
}

/// A lazily connecting channel to `addr` over TLS with `tls` (whatever the harness registered
/// for that address).
pub fn lazy_channel_with(addr: &str, tls: ClientTlsConfig) -> anyhow::Result<NodeChannel> {
    let endpoint = Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true);
    Ok(with_token(endpoint.connect_lazy()))
}

/// `ClusterStatus` of the node at `addr`.
pub async fn status(addr: &str) -> Result<ClusterStatusResponse, Status> {
    let channel = connect(addr, Duration::from_millis(500)).await?;
    let mut admin = ConchAdminClient::new(channel);
    let call = admin.cluster_status(ClusterStatusRequest {});
    match tokio::time::timeout(Duration::from_secs(2), call).await {
        Ok(r) => Ok(r?.into_inner()),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "cluster status of {addr}"
        ))),
    }
}

/// Whether an error means "try another node".
pub fn is_failover(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

/// A client of one node at a time among `endpoints`, failing over between them.
pub struct Failover {
    endpoints: Vec<String>,
    addr: String,
    client: Option<Grackle>,
    deadline: Duration,
    /// Go where the `conch-leader` hint points (else stay, as a plain Grackle client does).
    follow_hint: bool,
    /// Leader moves seen through the `conch-leader` hint.
    pub redirects: u64,
}

impl Failover {
    /// A connection that starts at `start` (usually the leader) and fails over among `endpoints`.
    pub fn new(endpoints: &[String], start: &str, deadline: Duration) -> Failover {
        Failover {
            endpoints: endpoints.to_vec(),
            addr: start.to_string(),
            client: None,
            deadline,
            follow_hint: true,
            redirects: 0,
        }
    }

    /// Like [`Failover::new`], but staying on `start` whatever the leader hint says (it still
    /// moves on when `start` fails): a plain Grackle client.
    pub fn pinned(endpoints: &[String], start: &str, deadline: Duration) -> Failover {
        Failover {
            follow_hint: false,
            ..Failover::new(endpoints, start, deadline)
        }
    }

    async fn client(&mut self) -> Result<Grackle, Status> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let channel = connect(&self.addr, Duration::from_millis(300)).await?;
        let client = GrackleApiClient::new(channel).max_decoding_message_size(16 * 1024 * 1024);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Moves to the endpoint after the current one.
    fn rotate(&mut self) {
        let n = self.endpoints.len();
        if n == 0 {
            return;
        }
        let next = match self.endpoints.iter().position(|e| *e == self.addr) {
            Some(i) => (i + 1) % n,
            None => 0,
        };
        self.addr = self.endpoints[next].clone();
        self.client = None;
    }

    /// Runs one RPC built by `f` against the current node.
    pub async fn call<T, F, Fut>(&mut self, f: F) -> Result<T, Status>
    where
        F: FnOnce(Grackle) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let client = match self.client().await {
            Ok(c) => c,
            Err(status) => {
                self.rotate();
                return Err(status);
            }
        };
        let result = match tokio::time::timeout(self.deadline, f(client)).await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer from {} within {:?}",
                self.addr, self.deadline
            ))),
        };
        match result {
            Ok(response) => {
                let hint = response
                    .metadata()
                    .get(LEADER_HEADER)
                    .and_then(|v| v.to_str().ok());
                if let Some(hint) = hint
                    && self.follow_hint
                    && hint != self.addr
                    && !hint.is_empty()
                {
                    self.addr = hint.to_string();
                    self.client = None;
                    self.redirects += 1;
                }
                Ok(response.into_inner())
            }
            Err(status) => {
                if is_failover(status.code()) {
                    self.rotate();
                }
                Err(status)
            }
        }
    }
}

/// Status of the current leader among `endpoints`, as the leader reports it; waits up to
/// `timeout` for one.
pub async fn find_leader(
    endpoints: &[String],
    timeout: Duration,
) -> anyhow::Result<ClusterStatusResponse> {
    let deadline = Instant::now() + timeout;
    loop {
        for addr in endpoints {
            let Ok(s) = status(addr).await else { continue };
            if s.leader_addr.is_empty() {
                continue;
            }
            if let Ok(l) = status(&s.leader_addr).await
                && l.leader_id == l.node_id
            {
                return Ok(l);
            }
        }
        if Instant::now() >= deadline {
            anyhow::bail!("no leader found among {endpoints:?} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

// Tokio's clock (the system's unless a test pauses it), so tests of routing, hedging and
// retries run in virtual time.
use tokio::time::Instant;

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::conch_quota_client::ConchQuotaClient;
use conch_proto::conch::{
    ClusterStatusRequest, ClusterStatusResponse, GetNamespaceQuotasRequest,
    ListSemaphoreWaitersRequest, NamespaceQuotas, NamespaceQuotasResponse,
    SetNamespaceQuotasRequest, SetStateBudgetRequest, StateBudgetResponse,
};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::{
    CreateNamespaceRequest, CreateSemaphoreRequest, DeleteNamespaceRequest, DeleteSemaphoreRequest,
    GetLockLeaseRequest, GetNamespaceRequest, GetSemaphoreLeaseRequest, GetSemaphoreRequest,
    ListLockLeasesRequest, ListNamespacesRequest, ListSemaphoreHoldersRequest,
    ListSemaphoreLeasesRequest, ListSemaphoresRequest, Namespace, RefreshLockLeaseRequest,
    RefreshSemaphoreLeaseRequest, ReleaseSemaphoreRequest, RevokeLockLeaseRequest,
    RevokeSemaphoreLeaseRequest, Semaphore, SemaphoreHolder,
};
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};

use crate::token::{NodeChannel, TokenInterceptor};
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::backoff::Backoff;
use crate::duration::format_duration;
use crate::endpoint::{EndpointAddr, parse_endpoint};
use crate::error::{Class, Error, Result, classify};
use crate::lease_kind::LeaseKind;
pub use crate::request_id::request;
use crate::request_id::{new_request_id, request_with_id};
use crate::tls::ClientTls;

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

/// The outcome of one attempt.
pub(crate) enum Attempt<T> {
    Ok(T),
    /// Worth trying elsewhere. `reached` tells whether a server (probably) saw the request.
    Retry {
        error: String,
        reached: bool,
        /// The node answered (as opposed to a transport failure or no answer in time).
        answered: bool,
    },
    Fail(Error),
}

/// Waits for the first of `racing` to finish, removes it and returns its output. The others keep
/// their progress for the next call; dropping them abandons them.
async fn first_done<F: Future + Unpin>(racing: &mut Vec<F>) -> F::Output {
    std::future::poll_fn(|cx| {
        for i in 0..racing.len() {
            if let std::task::Poll::Ready(out) = std::pin::Pin::new(&mut racing[i]).poll(cx) {
                racing.swap_remove(i);
                return std::task::Poll::Ready(out);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Whether `status` is the channel's own report that the request's deadline passed.
fn deadline_passed(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
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

    fn nodes(&self) -> MutexGuard<'_, Nodes> {
        // A panic while holding this lock cannot leave `Nodes` inconsistent (every update is a
        // single assignment), so a poisoned lock is still good to use.
        self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node to try next, skipping `tried`: leader hint, then the last good endpoint, then
    /// the rest; endpoints that failed a moment ago come last.
    pub(crate) fn pick(&self, tried: &[usize]) -> Option<(usize, String, NodeChannel)> {
        let nodes = self.nodes();
        let n = nodes.list.len();
        let now = Instant::now();
        let mut order: Vec<usize> = Vec::with_capacity(n);
        if let Some(l) = nodes.leader {
            order.push(l);
        }
        for k in 0..n {
            let i = (nodes.preferred + k) % n;
            if nodes.list[i].configured && !order.contains(&i) {
                order.push(i);
            }
        }
        order.retain(|i| !tried.contains(i));
        let is_down = |i: &usize| nodes.list[*i].down_until.is_some_and(|t| t > now);
        let pick = order
            .iter()
            .find(|i| !is_down(i))
            .or_else(|| order.first())
            .copied()?;
        let node = &nodes.list[pick];
        Some((
            pick,
            node.addr.clone(),
            self.intercepted(node.channel.clone()),
        ))
    }

    /// The known leader, when it was not tried yet this round and did not fail a moment ago.
    fn leader_to_try(&self, tried: &[usize]) -> Option<(usize, String, NodeChannel)> {
        let nodes = self.nodes();
        let l = nodes.leader?;
        let node = nodes.list.get(l)?;
        if tried.contains(&l) || node.down_until.is_some_and(|t| t > Instant::now()) {
            return None;
        }
        Some((l, node.addr.clone(), self.intercepted(node.channel.clone())))
    }

    /// Every node [`Client::pick`] would offer, in its order.
    fn pick_all(&self, tried: &[usize]) -> Vec<(usize, String, NodeChannel)> {
        let mut tried = tried.to_vec();
        let mut all = Vec::new();
        while let Some(next) = self.pick(&tried) {
            tried.push(next.0);
            all.push(next);
        }
        all
    }

    /// Records a leader hint from response (or status) metadata.
    fn observe_hint(&self, metadata: &MetadataMap) {
        let Some(hint) = metadata
            .get(LEADER_METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty())
        else {
            return;
        };
        let Ok(ep) = parse_endpoint(hint) else {
            debug!(hint, "ignoring malformed leader hint");
            return;
        };
        let mut nodes = self.nodes();
        if let Some(i) = nodes.list.iter().position(|n| n.addr == ep.addr) {
            nodes.leader = Some(i);
            return;
        }
        if nodes.list.len() >= MAX_NODES {
            return;
        }
        match (self.inner.dial)(&ep, &self.inner.config) {
            Ok(channel) => {
                debug!(leader = %ep.addr, "learned leader address");
                nodes.list.push(Node {
                    addr: ep.addr,
                    channel,
                    configured: false,
                    down_until: None,
                });
                nodes.leader = Some(nodes.list.len() - 1);
            }
            Err(e) => debug!(hint, error = %e, "ignoring unusable leader hint"),
        }
    }

    fn observe_answer(&self, idx: usize, metadata: &MetadataMap) {
        {
            let mut nodes = self.nodes();
            if let Some(node) = nodes.list.get_mut(idx) {
                node.down_until = None;
                if node.configured {
                    nodes.preferred = idx;
                }
            }
        }
        self.observe_hint(metadata);
    }

    fn observe_cannot_serve(&self, idx: usize, metadata: &MetadataMap) {
        {
            let mut nodes = self.nodes();
            if nodes.leader == Some(idx) {
                nodes.leader = None;
            }
        }
        self.observe_hint(metadata);
    }

    fn mark_down(&self, idx: usize) {
        let mut nodes = self.nodes();
        if nodes.leader == Some(idx) {
            nodes.leader = None;
        }
        if let Some(node) = nodes.list.get_mut(idx) {
            node.down_until = Some(Instant::now() + DOWN_FOR);
        }
    }

    /// Runs one attempt on node `idx`, with a local deadline, and learns from the answer.
    pub(crate) async fn attempt<T, Fut>(
        &self,
        idx: usize,
        addr: &str,
        op: &'static str,
        timeout: Duration,
        fut: Fut,
    ) -> Attempt<T>
    where
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(resp)) => {
                self.observe_answer(idx, resp.metadata());
                Attempt::Ok(resp.into_inner())
            }
            // The channel enforces the request's deadline itself: the same as no answer.
            Ok(Err(status)) if deadline_passed(&status) => self.no_answer(idx, addr, op, timeout),
            Ok(Err(status)) => match classify(&status) {
                Class::Transport => {
                    debug!(op, addr, error = %describe_status(&status), "transport failure");
                    self.mark_down(idx);
                    Attempt::Retry {
                        error: transport_error(&status, self.inner.config.tls.is_some()),
                        reached: false,
                        answered: false,
                    }
                }
                Class::NodeUnavailable => {
                    debug!(op, addr, error = %status.message(), "node cannot serve now");
                    self.observe_cannot_serve(idx, status.metadata());
                    Attempt::Retry {
                        error: status.message().to_string(),
                        reached: true,
                        answered: true,
                    }
                }
                Class::Final => {
                    self.observe_answer(idx, status.metadata());
                    Attempt::Fail(Error::from_status(op, status))
                }
            },
            Err(_) => self.no_answer(idx, addr, op, timeout),
        }
    }

    /// An attempt that got no answer within its deadline.
    fn no_answer<T>(
        &self,
        idx: usize,
        addr: &str,
        op: &'static str,
        timeout: Duration,
    ) -> Attempt<T> {
        debug!(op, addr, ?timeout, "attempt timed out");
        self.mark_down(idx);
        Attempt::Retry {
            error: format!("no answer within {}", format_duration(timeout)),
            reached: true,
            answered: false,
        }
    }

    /// Sends an RPC with failover: `f` gets a channel and the attempt's deadline and makes the
    /// call; it may be invoked several times (once per attempt), so it must be safe to repeat.
    ///
    /// Use it for RPCs this crate does not wrap:
    ///
    /// ```no_run
    /// # async fn demo(client: conch_client::Client) -> Result<(), conch_client::Error> {
    /// use conch_client::request;
    /// use conch_proto::grackle::{grackle_api_client::GrackleApiClient, ListNamespacesRequest};
    ///
    /// let resp = client
    ///     .call("list namespaces", client.default_options(), |channel, timeout| async move {
    ///         GrackleApiClient::new(channel)
    ///             .list_namespaces(request(ListNamespacesRequest::default(), timeout))
    ///             .await
    ///     })
    ///     .await?;
    /// for ns in resp.namespaces {
    ///     println!("{}", ns.name);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn call<T, F, Fut>(&self, op: &'static str, opts: CallOptions, f: F) -> Result<T>
    where
        F: Fn(NodeChannel, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let start = Instant::now();
        let mut tried: Vec<usize> = Vec::new();
        let mut tried_addrs: Vec<String> = Vec::new();
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let mut rounds = 0u32;
        let mut reached = false;
        // Some node gave an answer (even "cannot serve now") this round.
        let mut answered = false;
        // Some attempt this round waited out its whole deadline.
        let mut timed_out = false;
        let mut last = (String::new(), String::from("no attempt made"));
        loop {
            // The known leader alone; without one (or once it failed), every endpoint not
            // tried this round, overlapping, the first answer winning.
            let targets = match self.leader_to_try(&tried) {
                Some(leader) => vec![leader],
                None => self.pick_all(&tried),
            };
            if targets.is_empty() {
                rounds += 1;
                let spent = start.elapsed();
                // Nobody answered in a round that waited out a deadline: the nodes are stopped
                // or hung, reported now instead of after the retry budget.
                let silent = !answered && timed_out;
                if spent >= opts.retry_for || (!reached && rounds >= 2) || silent {
                    // Name the endpoint of the last error only when there were several.
                    let last = if tried_addrs.len() > 1 {
                        format!("{}: {}", last.0, last.1)
                    } else {
                        last.1
                    };
                    return Err(Error::Unavailable {
                        op,
                        endpoints: tried_addrs,
                        last,
                    });
                }
                let pause = backoff.next_delay().min(opts.retry_for - spent);
                tokio::time::sleep(pause).await;
                tried.clear();
                answered = false;
                timed_out = false;
                continue;
            }
            for (idx, addr, _) in &targets {
                tried.push(*idx);
                if !tried_addrs.contains(addr) {
                    tried_addrs.push(addr.clone());
                }
            }
            let launch = |(idx, addr, channel): (usize, String, NodeChannel)| {
                let fut = f(channel, opts.timeout);
                Box::pin(async move {
                    let result = self.attempt(idx, &addr, op, opts.timeout, fut).await;
                    (addr, result)
                })
            };
            // One endpoint after the other, the next one started when the previous failed or
            // did not answer within HEDGE_AFTER: a healthy node answers alone, and stopped
            // ones cost about one timeout together.
            let mut waiting = targets.into_iter();
            let mut racing = Vec::new();
            loop {
                if racing.is_empty() {
                    match waiting.next() {
                        Some(target) => racing.push(launch(target)),
                        None => break,
                    }
                }
                let done = if waiting.len() > 0 {
                    tokio::select! {
                        done = first_done(&mut racing) => Some(done),
                        () = tokio::time::sleep(HEDGE_AFTER.min(opts.timeout)) => None,
                    }
                } else {
                    Some(first_done(&mut racing).await)
                };
                let Some((addr, result)) = done else {
                    racing.extend(waiting.next().map(launch));
                    continue;
                };
                match result {
                    Attempt::Ok(v) => return Ok(v),
                    Attempt::Fail(e) => return Err(e),
                    Attempt::Retry {
                        error,
                        reached: r,
                        answered: a,
                    } => {
                        reached |= r;
                        answered |= a;
                        timed_out |= r && !a;
                        last = (addr, error);
                    }
                }
            }
        }
    }

    /// [`Client::call`] for a unary RPC: `rpc` gets a channel and a copy of `req` with the
    /// attempt's deadline, once per attempt.
    pub(crate) async fn unary<Req, T, F, Fut>(
        &self,
        op: &'static str,
        opts: CallOptions,
        req: Req,
        rpc: F,
    ) -> Result<T>
    where
        Req: Clone,
        F: Fn(NodeChannel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.call(op, opts, |ch, t| rpc(ch, request(req.clone(), t)))
            .await
    }

    /// [`Client::unary`] for a write that must take effect once: every attempt carries the same
    /// new request id, so the cluster answers a retry with the first reply.
    pub(crate) async fn unary_once<Req, T, F, Fut>(
        &self,
        op: &'static str,
        opts: CallOptions,
        req: Req,
        rpc: F,
    ) -> Result<T>
    where
        Req: Clone,
        F: Fn(NodeChannel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let id = new_request_id();
        self.call(op, opts, |ch, t| {
            rpc(ch, request_with_id(req.clone(), t, &id))
        })
        .await
    }

    /// A Grackle API client on the node calls would go to now (leader hint first). No failover:
    /// for anything not wrapped here, prefer [`Client::call`].
    pub fn grackle(&self) -> GrackleApiClient<NodeChannel> {
        GrackleApiClient::new(self.channel())
    }

    /// A `ConchApi` client (waiter listing) on the node calls would go to now.
    pub fn conch_api(&self) -> ConchApiClient<NodeChannel> {
        ConchApiClient::new(self.channel())
    }

    /// A `ConchAdmin` client (cluster status, membership) on the node calls would go to now.
    pub fn admin(&self) -> ConchAdminClient<NodeChannel> {
        ConchAdminClient::new(self.channel())
    }

    /// The channel of the node calls would go to now.
    pub fn channel(&self) -> NodeChannel {
        match self.pick(&[]) {
            Some((_, _, channel)) => channel,
            // `connect` refuses an empty endpoint list, so there is always a node.
            None => self.intercepted(unreachable_channel()),
        }
    }

    /// `channel` sending this client's token on every call.
    fn intercepted(&self, channel: Channel) -> NodeChannel {
        NodeChannel::new(
            channel,
            TokenInterceptor::new(self.inner.config.token.clone()),
        )
    }

    // ----- namespaces -------------------------------------------------------------------------

    /// Creates a namespace. Its retries carry one request id, so a retry after a lost reply
    /// answers the namespace created; a namespace created by someone else is
    /// [`Error::AlreadyExists`] ([`Client::ensure_namespace`] accepts that).
    pub async fn create_namespace(&self, name: &str, description: &str) -> Result<Namespace> {
        const OP: &str = "create namespace";
        let req = CreateNamespaceRequest {
            name: name.to_string(),
            description: description.to_string(),
            metadata: HashMap::new(),
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).create_namespace(r).await
            })
            .await?;
        resp.namespace.ok_or_else(|| missing(OP, "namespace"))
    }

    /// Reads a namespace.
    pub async fn get_namespace(&self, name: &str) -> Result<Namespace> {
        const OP: &str = "get namespace";
        let req = GetNamespaceRequest {
            namespace_name: name.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_namespace(r).await
            })
            .await?;
        resp.namespace.ok_or_else(|| missing(OP, "namespace"))
    }

    /// A namespace's quotas and what it uses of them, with the state's budget.
    pub async fn namespace_quotas(&self, name: &str) -> Result<NamespaceQuotasResponse> {
        const OP: &str = "get namespace quotas";
        let req = GetNamespaceQuotasRequest {
            namespace_name: name.to_string(),
        };
        self.unary(OP, self.default_options(), req, |ch, r| async move {
            ConchQuotaClient::new(ch).get_namespace_quotas(r).await
        })
        .await
    }

    /// Sets all four quotas of a namespace (cluster-admin).
    pub async fn set_namespace_quotas(
        &self,
        name: &str,
        quotas: NamespaceQuotas,
    ) -> Result<NamespaceQuotasResponse> {
        const OP: &str = "set namespace quotas";
        let req = SetNamespaceQuotasRequest {
            namespace_name: name.to_string(),
            quotas: Some(quotas),
        };
        self.unary(OP, self.default_options(), req, |ch, r| async move {
            ConchQuotaClient::new(ch).set_namespace_quotas(r).await
        })
        .await
    }

    /// Sets the budget on the stored bytes of every namespace together (cluster-admin).
    pub async fn set_state_budget(&self, budget_bytes: u64) -> Result<StateBudgetResponse> {
        const OP: &str = "set state budget";
        let req = SetStateBudgetRequest { budget_bytes };
        self.unary(OP, self.default_options(), req, |ch, r| async move {
            ConchQuotaClient::new(ch).set_state_budget(r).await
        })
        .await
    }

    /// Every namespace the caller may read, in name order (all pages).
    pub async fn list_namespaces(&self) -> Result<Vec<Namespace>> {
        const OP: &str = "list namespaces";
        all_pages(async |pagination_token| {
            let req = ListNamespacesRequest {
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_namespaces(r).await
                })
                .await?;
            Ok((resp.namespaces, resp.next_pagination_token))
        })
        .await
    }

    /// Makes sure a namespace exists (reads first; creates it if absent; a concurrent create
    /// by someone else is fine).
    pub async fn ensure_namespace(&self, name: &str) -> Result<()> {
        match self.get_namespace(name).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => match self.create_namespace(name, "").await {
                Ok(_) => Ok(()),
                Err(e) if e.is_already_exists() => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    // ----- semaphores -------------------------------------------------------------------------

    /// Creates a semaphore with `permits`.
    pub async fn create_semaphore(
        &self,
        namespace: &str,
        name: &str,
        permits: u64,
        description: &str,
    ) -> Result<Semaphore> {
        const OP: &str = "create semaphore";
        let req = CreateSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
            description: description.to_string(),
            permits,
            metadata: HashMap::new(),
            max_hold_ms: 0,
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).create_semaphore(r).await
            })
            .await?;
        resp.semaphore.ok_or_else(|| missing(OP, "semaphore"))
    }

    /// Reads a semaphore (permits, active holds, waiter count).
    pub async fn get_semaphore(&self, namespace: &str, name: &str) -> Result<Semaphore> {
        const OP: &str = "get semaphore";
        let req = GetSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_semaphore(r).await
            })
            .await?;
        resp.semaphore.ok_or_else(|| missing(OP, "semaphore"))
    }

    /// Returns the semaphore, creating it (and its namespace) with `permits` if it does not
    /// exist. An existing semaphore is returned as it is, whatever its permits; concurrent
    /// creators are fine. The common path is one read.
    pub async fn ensure_semaphore(
        &self,
        namespace: &str,
        name: &str,
        permits: u64,
    ) -> Result<Semaphore> {
        match self.get_semaphore(namespace, name).await {
            Ok(s) => return Ok(s),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
        self.ensure_namespace(namespace).await?;
        match self.create_semaphore(namespace, name, permits, "").await {
            Ok(s) => Ok(s),
            Err(e) if e.is_already_exists() => self.get_semaphore(namespace, name).await,
            Err(e) => Err(e),
        }
    }

    /// Deletes a namespace and everything in it: its semaphores, locks, leases, wait groups
    /// and barriers (their holders learn it as a loss).
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        const OP: &str = "delete namespace";
        let req = DeleteNamespaceRequest {
            namespace_name: name.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_namespace(r).await
        })
        .await?;
        Ok(())
    }

    /// Deletes a semaphore (absent: nothing happens); its holders and waiters lose it.
    pub async fn delete_semaphore(&self, namespace: &str, name: &str) -> Result<()> {
        const OP: &str = "delete semaphore";
        let req = DeleteSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_semaphore(r).await
        })
        .await?;
        Ok(())
    }

    /// Every semaphore of a namespace, in name order (all pages).
    pub async fn list_semaphores(&self, namespace: &str) -> Result<Vec<Semaphore>> {
        const OP: &str = "list semaphores";
        all_pages(async |pagination_token| {
            let req = ListSemaphoresRequest {
                namespace_name: namespace.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_semaphores(r).await
                })
                .await?;
            Ok((resp.semaphores, resp.next_pagination_token))
        })
        .await
    }

    /// The holders of a semaphore in grant order (all pages).
    pub async fn list_holders(&self, namespace: &str, name: &str) -> Result<Vec<SemaphoreHolder>> {
        const OP: &str = "list semaphore holders";
        all_pages(async |pagination_token| {
            let req = ListSemaphoreHoldersRequest {
                namespace_name: namespace.to_string(),
                semaphore_name: name.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_semaphore_holders(r).await
                })
                .await?;
            Ok((resp.holders, resp.next_pagination_token))
        })
        .await
    }

    /// The waiters of a semaphore in queue order (all pages), with the semaphore itself.
    pub async fn list_waiters(&self, namespace: &str, name: &str) -> Result<Waiters> {
        const OP: &str = "list semaphore waiters";
        let mut semaphore = None;
        let waiters = all_pages(async |pagination_token| {
            let req = ListSemaphoreWaitersRequest {
                namespace_name: namespace.to_string(),
                semaphore_name: name.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    ConchApiClient::new(ch).list_semaphore_waiters(r).await
                })
                .await?;
            if semaphore.is_none() {
                semaphore = resp.semaphore;
            }
            Ok((resp.waiters, resp.next_pagination_token))
        })
        .await?;
        Ok(Waiters { semaphore, waiters })
    }

    /// Releases whatever `lease_id` holds of a semaphore (a no-op if it holds nothing).
    pub async fn release(&self, namespace: &str, name: &str, lease_id: &str) -> Result<()> {
        const OP: &str = "release semaphore";
        let req = ReleaseSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
            lease_id: lease_id.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).release_semaphore(r).await
        })
        .await?;
        Ok(())
    }

    // ----- leases -----------------------------------------------------------------------------

    /// Refreshes a semaphore lease once (`ttl_seconds` 0 keeps the lease's TTL).
    /// [`Lease`](crate::Lease) does this by itself.
    pub async fn refresh_lease(
        &self,
        namespace: &str,
        lease_id: &str,
        ttl_seconds: u64,
        opts: CallOptions,
    ) -> Result<conch_proto::grackle::Lease> {
        self.refresh_lease_of(LeaseKind::Semaphore, namespace, lease_id, ttl_seconds, opts)
            .await
    }

    /// Refreshes a lease of `kind` once (`ttl_seconds` 0 keeps the lease's TTL).
    pub async fn refresh_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        lease_id: &str,
        ttl_seconds: u64,
        opts: CallOptions,
    ) -> Result<conch_proto::grackle::Lease> {
        let (namespace_name, lease_id) = (namespace.to_string(), lease_id.to_string());
        match kind {
            LeaseKind::Semaphore => {
                const OP: &str = "refresh lease";
                let req = RefreshSemaphoreLeaseRequest {
                    namespace_name,
                    lease_id,
                    ttl_seconds,
                };
                self.unary(OP, opts, req, |ch, r| async move {
                    GrackleApiClient::new(ch).refresh_semaphore_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
            LeaseKind::Lock => {
                const OP: &str = "refresh lock lease";
                let req = RefreshLockLeaseRequest {
                    namespace_name,
                    lease_id,
                    ttl_seconds,
                };
                self.unary(OP, opts, req, |ch, r| async move {
                    GrackleApiClient::new(ch).refresh_lock_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
        }
    }

    /// Revokes a semaphore lease: everything it holds or waits for is released at once.
    pub async fn revoke_lease(&self, namespace: &str, lease_id: &str) -> Result<()> {
        self.revoke_lease_of(LeaseKind::Semaphore, namespace, lease_id)
            .await
    }

    /// Revokes a lease of `kind`: everything it holds or waits for is released at once.
    pub async fn revoke_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        lease_id: &str,
    ) -> Result<()> {
        let (namespace_name, lease_id) = (namespace.to_string(), lease_id.to_string());
        match kind {
            LeaseKind::Semaphore => {
                let req = RevokeSemaphoreLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary_once(
                    "revoke lease",
                    self.default_options(),
                    req,
                    |ch, r| async move { GrackleApiClient::new(ch).revoke_semaphore_lease(r).await },
                )
                .await?;
            }
            LeaseKind::Lock => {
                let req = RevokeLockLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary_once(
                    "revoke lock lease",
                    self.default_options(),
                    req,
                    |ch, r| async move { GrackleApiClient::new(ch).revoke_lock_lease(r).await },
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Reads a semaphore lease.
    pub async fn get_lease(
        &self,
        namespace: &str,
        lease_id: &str,
    ) -> Result<conch_proto::grackle::Lease> {
        self.get_lease_of(LeaseKind::Semaphore, namespace, lease_id)
            .await
    }

    /// Reads a lease of `kind`.
    pub async fn get_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        lease_id: &str,
    ) -> Result<conch_proto::grackle::Lease> {
        let (namespace_name, lease_id) = (namespace.to_string(), lease_id.to_string());
        match kind {
            LeaseKind::Semaphore => {
                const OP: &str = "get lease";
                let req = GetSemaphoreLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).get_semaphore_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
            LeaseKind::Lock => {
                const OP: &str = "get lock lease";
                let req = GetLockLeaseRequest {
                    namespace_name,
                    lease_id,
                };
                self.unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).get_lock_lease(r).await
                })
                .await?
                .lease
                .ok_or_else(|| missing(OP, "lease"))
            }
        }
    }

    /// The leases of `kind` in a namespace (all pages); with a non-empty `process_id`, only
    /// that owner's.
    pub async fn list_leases_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        process_id: &str,
    ) -> Result<Vec<conch_proto::grackle::Lease>> {
        all_pages(async |pagination_token| {
            let (namespace_name, process_id) = (namespace.to_string(), process_id.to_string());
            let (leases, next) = match kind {
                LeaseKind::Semaphore => {
                    let req = ListSemaphoreLeasesRequest {
                        namespace_name,
                        pagination_token,
                        limit: PAGE_LIMIT,
                        process_id,
                    };
                    let r = self
                        .unary(
                            "list leases",
                            self.default_options(),
                            req,
                            |ch, r| async move {
                                GrackleApiClient::new(ch).list_semaphore_leases(r).await
                            },
                        )
                        .await?;
                    (r.leases, r.next_pagination_token)
                }
                LeaseKind::Lock => {
                    let req = ListLockLeasesRequest {
                        namespace_name,
                        pagination_token,
                        limit: PAGE_LIMIT,
                        process_id,
                    };
                    let r = self
                        .unary(
                            "list lock leases",
                            self.default_options(),
                            req,
                            |ch, r| async move { GrackleApiClient::new(ch).list_lock_leases(r).await },
                        )
                        .await?;
                    (r.leases, r.next_pagination_token)
                }
            };
            Ok((leases, next))
        })
        .await
    }

    // ----- cluster ----------------------------------------------------------------------------

    /// Cluster status as seen by whichever node answers.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse> {
        let req = ClusterStatusRequest {};
        self.unary(
            "cluster status",
            self.default_options(),
            req,
            |ch, r| async move { ConchAdminClient::new(ch).cluster_status(r).await },
        )
        .await
    }

    /// Cluster status as seen by the node at `endpoint` (no failover: this asks that node).
    pub async fn cluster_status_of(&self, endpoint: &str) -> Result<ClusterStatusResponse> {
        const OP: &str = "cluster status";
        let ep = parse_endpoint(endpoint)?;
        let existing = {
            let nodes = self.nodes();
            nodes
                .list
                .iter()
                .position(|n| n.addr == ep.addr)
                .map(|i| (i, nodes.list[i].channel.clone()))
        };
        let channel = match &existing {
            Some((_, ch)) => ch.clone(),
            None => (self.inner.dial)(&ep, &self.inner.config)?,
        };
        let timeout = self.inner.config.request_timeout;
        let mut admin = ConchAdminClient::new(self.intercepted(channel));
        let fut = admin.cluster_status(request(ClusterStatusRequest {}, timeout));
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(resp)) => {
                if existing.is_some() {
                    self.observe_hint(resp.metadata());
                }
                Ok(resp.into_inner())
            }
            Ok(Err(status)) => match classify(&status) {
                Class::Transport | Class::NodeUnavailable => Err(Error::Unavailable {
                    op: OP,
                    endpoints: vec![ep.addr.clone()],
                    last: transport_error(&status, self.inner.config.tls.is_some()),
                }),
                Class::Final => Err(Error::from_status(OP, status)),
            },
            Err(_) => Err(Error::Timeout { op: OP, timeout }),
        }
    }
}

/// The waiters of a semaphore, as returned by [`Client::list_waiters`].
#[derive(Debug, Clone, Default)]
pub struct Waiters {
    /// The semaphore (permits, active holds), when the server sent it.
    pub semaphore: Option<Semaphore>,
    /// Waiters in queue order; the head is granted first.
    pub waiters: Vec<conch_proto::conch::SemaphoreWaiter>,
}

/// Reads every page of a listing: `page(token)` fetches the page at `token` (empty: the first)
/// and returns its items and the next page's token. Stops at an empty page, an empty or
/// repeated token, or after 10 000 pages.
pub(crate) async fn all_pages<T>(
    mut page: impl AsyncFnMut(String) -> Result<(Vec<T>, String)>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..10_000 {
        let (items, next) = page(token.clone()).await?;
        let empty = items.is_empty();
        out.extend(items);
        if empty || next.is_empty() || next == token {
            break;
        }
        token = next;
    }
    Ok(out)
}

pub(crate) fn missing(op: &'static str, field: &str) -> Error {
    Error::Protocol {
        op,
        message: format!("the response has no {field}"),
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

//! How a call is routed to a node: picking the node (leader hint, last good endpoint, the
//! rest), failing over, hedging when no leader is known, and retrying within the call's budget
//! (the steps of the module above).

use std::future::Future;
use std::sync::MutexGuard;
use std::time::Duration;

// Tokio's clock (the system's unless a test pauses it), so tests of routing, hedging and
// retries run in virtual time.
use tokio::time::Instant;

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_api_client::ConchApiClient;

use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;

use crate::token::{NodeChannel, TokenInterceptor};
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::backoff::Backoff;
use crate::duration::format_duration;
use crate::endpoint::parse_endpoint;
use crate::error::{Class, Error, Result, classify};

pub(super) use crate::request_id::request;
use crate::request_id::{new_request_id, request_with_id};

use super::{
    CallOptions, Client, DOWN_FOR, HEDGE_AFTER, LEADER_METADATA_KEY, MAX_NODES, Node, Nodes,
    describe_status, transport_error, unreachable_channel,
};

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
    pub(super) fn nodes(&self) -> MutexGuard<'_, Nodes> {
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
    pub(super) fn observe_hint(&self, metadata: &MetadataMap) {
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

    pub(super) fn observe_answer(&self, idx: usize, metadata: &MetadataMap) {
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

    pub(super) fn observe_cannot_serve(&self, idx: usize, metadata: &MetadataMap) {
        {
            let mut nodes = self.nodes();
            if nodes.leader == Some(idx) {
                nodes.leader = None;
            }
        }
        self.observe_hint(metadata);
    }

    pub(super) fn mark_down(&self, idx: usize) {
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
    pub(super) fn intercepted(&self, channel: Channel) -> NodeChannel {
        NodeChannel::new(
            channel,
            TokenInterceptor::new(self.inner.config.token.clone()),
        )
    }
}

//! [`Client::acquire`] (semaphores), [`Client::acquire_lock`] (locks) and their [`Guard`].
//!
//! Both waits are one loop (`Client::wait_grant`) over the two acquire calls. A wait longer
//! than one RPC keeps its place in the server's FIFO queue: the server identifies a waiter by
//! (semaphore or lock path, lease), and a second acquire from the same lease while it is
//! queued *re-attaches* — same position, deadline `max(old, now + timeout)`. So:
//!
//! 1. send an acquire whose server-side wait is at most [`ClientConfig::acquire_rpc_wait`]
//!    (or the remaining wait, if shorter);
//! 2. [`ClientConfig::reattach_margin`] before that wait ends, send an overlapping re-attach,
//!    extending the waiter before the first call's deadline can remove it;
//! 3. a `TIMED_OUT` from an older call while a newer one is in flight is ignored (the server
//!    keeps the waiter for the newer deadline);
//! 4. if the newest call fails (transport error, node down, no leader), re-attach at once
//!    through another endpoint (with backoff once every endpoint failed);
//! 5. the call sent with the last part of a bounded wait is final: its `TIMED_OUT` ends the
//!    wait, and the server has removed the waiter by then.
//!
//! Dropping the future cancels the in-flight RPCs, and the server gives up the wait (unless a
//! later re-attach extended it, which cannot happen once the future is gone).
//!
//! [`ClientConfig::acquire_rpc_wait`]: crate::ClientConfig::acquire_rpc_wait
//! [`ClientConfig::reattach_margin`]: crate::ClientConfig::reattach_margin

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::{AcquireSemaphoresRequest, AcquireSemaphoresResponse, SetMember};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::{
    AcquireLockRequest, AcquireLockResponse, AcquireOutcome, AcquireSemaphoreRequest,
    AcquireSemaphoreResponse,
};
use tokio::task::JoinSet;
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::backoff::Backoff;
use crate::client::{Attempt, Client};
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::request_id::{new_request_id, request_with_id};
use crate::token::NodeChannel;

/// What a [`Guard`] holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// `weight` permits of a semaphore.
    Semaphore {
        /// The semaphore.
        name: String,
        /// The permits held.
        weight: u64,
    },
    /// A lock path, shared or exclusive.
    Lock {
        /// The lock's path.
        path: String,
        /// Whether the hold is exclusive.
        exclusive: bool,
    },
}

/// Permits or a lock held through a lease, released by [`Guard::release`] or, best effort, on
/// drop.
#[derive(Debug)]
#[must_use = "dropping a Guard releases what it holds"]
pub struct Guard {
    client: Client,
    namespace: String,
    held: Held,
    lease_id: String,
    fencing_token: u64,
    /// The instant by which the hold ends on the server (its hold limit), if it has one.
    hold_until: Option<Instant>,
    released: bool,
}

impl Guard {
    /// When the server ends this hold whatever the lease does (the semaphore's or the
    /// acquire's hold limit, the smaller), on this process's monotonic clock; `None` without a
    /// hold limit. Counted from when the granting request was sent, so it is never later than
    /// the server's end: whatever the guard protects must be finished by then.
    pub fn hold_until(&self) -> Option<Instant> {
        self.hold_until
    }

    /// The weight held (1 for a lock).
    pub fn weight(&self) -> u64 {
        match &self.held {
            Held::Semaphore { weight, .. } => *weight,
            Held::Lock { .. } => 1,
        }
    }

    /// The grant's fencing token: strictly increasing cluster-wide (so also per semaphore and
    /// per lock path). Pass it to whatever the guard protects so it can refuse stale holders
    /// (0 if the server sent none).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The semaphore held; for a lock guard, the lock's path.
    pub fn semaphore(&self) -> &str {
        match &self.held {
            Held::Semaphore { name, .. } => name,
            Held::Lock { path, .. } => path,
        }
    }

    /// What is held.
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// The namespace of the semaphore or lock.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The lease holding it.
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }

    /// Gives up the handle without releasing: what it holds stays held until the lease is
    /// revoked (which releases everything it holds) or expires.
    pub fn forget(mut self) {
        self.released = true;
    }

    /// Releases the permits or the lock. If the lease (or semaphore) is already gone, nothing
    /// is held and this succeeds.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        match release_held(&self.client, &self.namespace, &self.held, &self.lease_id).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }
}

async fn release_held(client: &Client, namespace: &str, held: &Held, lease_id: &str) -> Result<()> {
    match held {
        Held::Semaphore { name, .. } => client.release(namespace, name, lease_id).await,
        Held::Lock { path, .. } => client
            .release_lock(namespace, path, lease_id)
            .await
            .map(|_| ()),
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let (ns, held, lease) = (
                self.namespace.clone(),
                self.held.clone(),
                self.lease_id.clone(),
            );
            rt.spawn(async move {
                if let Err(e) = release_held(&client, &ns, &held, &lease).await {
                    debug!(?held, error = %e, "release on drop failed");
                }
            });
        }
    }
}

/// An acquire request the wait loop can send: `AcquireSemaphore` or `AcquireLock`.
pub(crate) trait AcquireCall: Clone + Send + Sync + 'static {
    /// The answer.
    type Reply: Send + 'static;
    /// The operation, in errors.
    const OP: &'static str;
    /// This request asking the server to wait up to `wait`.
    fn waiting(&self, wait: Duration) -> Self;
    /// What the answer says.
    fn outcome(reply: &Self::Reply) -> AcquireOutcome;
    /// Sends it.
    fn send(
        channel: NodeChannel,
        request: Request<Self>,
    ) -> impl Future<Output = std::result::Result<Response<Self::Reply>, Status>> + Send;
}

/// `timeout_ms` and `timeout_seconds` for a server-side wait of `wait`.
fn wait_fields(wait: Duration) -> (u64, i32) {
    (
        u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        wait.as_secs_f64().ceil().min(300.0) as i32,
    )
}

/// An answer's outcome; one this client does not know counts as not acquired.
fn known_outcome(outcome: i32) -> AcquireOutcome {
    AcquireOutcome::try_from(outcome).unwrap_or(AcquireOutcome::Invalid)
}

impl AcquireCall for AcquireSemaphoreRequest {
    type Reply = AcquireSemaphoreResponse;
    const OP: &'static str = "acquire semaphore";
    fn waiting(&self, wait: Duration) -> Self {
        let (timeout_ms, timeout_seconds) = wait_fields(wait);
        AcquireSemaphoreRequest {
            timeout_ms,
            timeout_seconds,
            ..self.clone()
        }
    }
    fn outcome(reply: &Self::Reply) -> AcquireOutcome {
        known_outcome(reply.outcome)
    }
    async fn send(
        channel: NodeChannel,
        request: Request<Self>,
    ) -> std::result::Result<Response<Self::Reply>, Status> {
        GrackleApiClient::new(channel)
            .acquire_semaphore(request)
            .await
    }
}

impl AcquireCall for AcquireLockRequest {
    type Reply = AcquireLockResponse;
    const OP: &'static str = "acquire lock";
    fn waiting(&self, wait: Duration) -> Self {
        let (timeout_ms, timeout_seconds) = wait_fields(wait);
        AcquireLockRequest {
            timeout_ms,
            timeout_seconds,
            ..self.clone()
        }
    }
    fn outcome(reply: &Self::Reply) -> AcquireOutcome {
        known_outcome(reply.outcome)
    }
    async fn send(
        channel: NodeChannel,
        request: Request<Self>,
    ) -> std::result::Result<Response<Self::Reply>, Status> {
        GrackleApiClient::new(channel).acquire_lock(request).await
    }
}

impl AcquireCall for AcquireSemaphoresRequest {
    type Reply = AcquireSemaphoresResponse;
    const OP: &'static str = "acquire semaphores";
    fn waiting(&self, wait: Duration) -> Self {
        AcquireSemaphoresRequest {
            timeout_ms: wait_fields(wait).0,
            ..self.clone()
        }
    }
    fn outcome(reply: &Self::Reply) -> AcquireOutcome {
        known_outcome(reply.outcome)
    }
    async fn send(
        channel: NodeChannel,
        request: Request<Self>,
    ) -> std::result::Result<Response<Self::Reply>, Status> {
        ConchApiClient::new(channel)
            .acquire_semaphores(request)
            .await
    }
}

/// How a wait ended: granted, or not (the last answer, which says why for a lock).
pub(crate) enum Waited<T> {
    /// The answer, and the instant the request that got it was sent.
    Granted(T, Instant),
    NotGranted(T),
}

/// Why an acquire RPC did not produce an answer.
enum RpcFailure {
    /// Worth re-attaching elsewhere.
    Retry(String),
    /// A definite error (lease or semaphore gone, invalid argument, ...).
    Fatal(Error),
}

/// One issued acquire RPC: the newest decides.
#[derive(Debug, Clone, Copy)]
struct Issued {
    seq: u64,
    /// Sent with the last part of a bounded wait: its TIMED_OUT ends the wait.
    last: bool,
}

/// The plan for the next RPC of a wait: its server-side wait, whether it is the last one,
/// and when the one after it must be sent (`None`: no further call needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RpcPlan {
    pub wait: Duration,
    pub last: bool,
    pub reattach_after: Option<Duration>,
}

/// Plans an acquire RPC sent when `remaining` of the total wait is left (`None`: forever).
pub(crate) fn plan_rpc(
    remaining: Option<Duration>,
    rpc_wait: Duration,
    margin: Duration,
) -> RpcPlan {
    let wait = remaining
        .map_or(rpc_wait, |r| r.min(rpc_wait))
        .max(Duration::from_millis(1));
    let last = remaining.is_some_and(|r| r <= rpc_wait);
    let margin = margin.min(wait / 2);
    RpcPlan {
        wait,
        last,
        reattach_after: (!last).then(|| wait - margin),
    }
}

impl Client {
    /// Acquires `weight` permits of `semaphore` for `lease`, waiting up to `wait`
    /// (`None`: until granted; `Some(Duration::ZERO)`: only if free now, flock -n style).
    ///
    /// Returns `Ok(None)` when no permits came in time (the server has removed the waiter by
    /// then). Waits of any length keep their place in the FIFO queue across RPC timeouts and
    /// node failover (see the [module docs](crate::acquire)). Fails with
    /// [`Error::LeaseLost`] if the lease is lost while waiting, and with [`Error::NotFound`]
    /// if the lease, semaphore or namespace disappears.
    ///
    /// `metadata` is attached to the waiter and then to the holder (shown by
    /// `ListSemaphoreHolders` / `ListSemaphoreWaiters`).
    ///
    /// ```no_run
    /// # async fn demo(client: conch_client::Client, lease: conch_client::Lease)
    /// # -> Result<(), conch_client::Error> {
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    ///
    /// let wait = Some(Duration::from_secs(60));
    /// match client.acquire(&lease, "jobs", "nightly", 1, wait, HashMap::new()).await? {
    ///     Some(guard) => {
    ///         println!("got it, fencing token {}", guard.fencing_token());
    ///         guard.release().await?;
    ///     }
    ///     None => println!("no permit within a minute"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire(
        &self,
        lease: &Lease,
        namespace: &str,
        semaphore: &str,
        weight: u64,
        wait: Option<Duration>,
        metadata: HashMap<String, String>,
    ) -> Result<Option<Guard>> {
        self.acquire_limited(lease, namespace, semaphore, weight, wait, metadata, None)
            .await
    }

    /// [`Client::acquire`] with a hold limit: the server ends the hold `max_hold` after the
    /// grant (or at the semaphore's own limit, if smaller) even while the lease is refreshed,
    /// and grants the next waiter. `None` leaves only the semaphore's limit. Limits are whole
    /// milliseconds from 1 s to 30 days. [`Guard::hold_until`] says when the hold ends.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_limited(
        &self,
        lease: &Lease,
        namespace: &str,
        semaphore: &str,
        weight: u64,
        wait: Option<Duration>,
        metadata: HashMap<String, String>,
        max_hold: Option<Duration>,
    ) -> Result<Option<Guard>> {
        let base = AcquireSemaphoreRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: semaphore.to_string(),
            lease_id: lease.id().to_string(),
            weight,
            timeout_seconds: 0,
            metadata,
            timeout_ms: 0,
            max_hold_ms: max_hold.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        Ok(match self.wait_grant(lease, base, wait).await? {
            Waited::Granted(reply, sent) => {
                let mut guard = self.guard(
                    lease,
                    namespace,
                    Held::Semaphore {
                        name: semaphore.to_string(),
                        weight: weight.max(1),
                    },
                    reply.fencing_token,
                );
                guard.hold_until =
                    (reply.hold_ms > 0).then(|| sent + Duration::from_millis(reply.hold_ms));
                Some(guard)
            }
            Waited::NotGranted(_) => None,
        })
    }

    /// All or none: acquires every `(semaphore, weight)` of `members` (2 to 16 distinct
    /// semaphores) for `lease` in one grant, or none of them, waiting up to `wait` as
    /// [`Client::acquire`] does (`None`: until granted; `Some(Duration::ZERO)`: only if all are
    /// free now). A waiting set is one entry in every member's FIFO queue, so two callers taking
    /// `{a, b}` and `{b, a}` never deadlock. Returns one [`Guard`] per member, in the order of
    /// `members` (each with the member's fencing token), or `Ok(None)` when the set was not
    /// granted in time. Releasing (or dropping) one guard releases only that member.
    ///
    /// ```no_run
    /// # async fn demo(client: conch_client::Client, lease: conch_client::Lease)
    /// # -> Result<(), conch_client::Error> {
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    ///
    /// let members = [("gpu", 1), ("licence", 2)];
    /// let wait = Some(Duration::from_secs(60));
    /// if let Some(guards) = client.acquire_all(&lease, "jobs", &members, wait, HashMap::new()).await? {
    ///     for guard in &guards {
    ///         println!("{}: fencing token {}", guard.semaphore(), guard.fencing_token());
    ///     }
    ///     for guard in guards {
    ///         guard.release().await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire_all(
        &self,
        lease: &Lease,
        namespace: &str,
        members: &[(&str, u64)],
        wait: Option<Duration>,
        metadata: HashMap<String, String>,
    ) -> Result<Option<Vec<Guard>>> {
        self.acquire_all_limited(lease, namespace, members, wait, metadata, None)
            .await
    }

    /// [`Client::acquire_all`] with a hold limit for every member, as
    /// [`Client::acquire_limited`]'s.
    pub async fn acquire_all_limited(
        &self,
        lease: &Lease,
        namespace: &str,
        members: &[(&str, u64)],
        wait: Option<Duration>,
        metadata: HashMap<String, String>,
        max_hold: Option<Duration>,
    ) -> Result<Option<Vec<Guard>>> {
        let base = AcquireSemaphoresRequest {
            namespace_name: namespace.to_string(),
            lease_id: lease.id().to_string(),
            semaphores: members
                .iter()
                .map(|(name, weight)| SetMember {
                    semaphore_name: name.to_string(),
                    weight: *weight,
                })
                .collect(),
            timeout_ms: 0,
            metadata,
            max_hold_ms: max_hold.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let (reply, sent) = match self.wait_grant(lease, base, wait).await? {
            Waited::Granted(reply, sent) => (reply, sent),
            Waited::NotGranted(_) => return Ok(None),
        };
        if reply.grants.len() != members.len() {
            return Err(Error::Protocol {
                op: "acquire semaphores",
                message: format!(
                    "{} grants for {} members",
                    reply.grants.len(),
                    members.len()
                ),
            });
        }
        let guards = members
            .iter()
            .zip(reply.grants)
            .map(|((name, weight), grant)| {
                let mut guard = self.guard(
                    lease,
                    namespace,
                    Held::Semaphore {
                        name: name.to_string(),
                        weight: (*weight).max(1),
                    },
                    grant.fencing_token,
                );
                guard.hold_until =
                    (grant.hold_ms > 0).then(|| sent + Duration::from_millis(grant.hold_ms));
                guard
            })
            .collect();
        Ok(Some(guards))
    }

    /// The guard of a grant.
    pub(crate) fn guard(
        &self,
        lease: &Lease,
        namespace: &str,
        held: Held,
        fencing_token: u64,
    ) -> Guard {
        Guard {
            client: self.clone(),
            namespace: namespace.to_string(),
            held,
            lease_id: lease.id().to_string(),
            fencing_token,
            hold_until: None,
            released: false,
        }
    }

    /// The wait of an acquire (see the [module docs](crate::acquire)): `base` (its wait fields
    /// unset) sent once for `Some(Duration::ZERO)`, else as a chain of overlapping RPCs for up
    /// to `wait` (`None`: until granted), all with one request id.
    pub(crate) async fn wait_grant<R: AcquireCall>(
        &self,
        lease: &Lease,
        base: R,
        wait: Option<Duration>,
    ) -> Result<Waited<R::Reply>> {
        let op = R::OP;
        let lease_lost = |loss| Error::LeaseLost {
            op,
            lease_id: lease.id().to_string(),
            reason: loss,
        };
        if let crate::LeaseState::Lost(loss) = lease.state() {
            return Err(lease_lost(loss));
        }
        // One id for the whole acquire: every attempt and re-attach is the same operation, so a
        // grant whose reply was lost is answered again (same token), never granted twice.
        let id = new_request_id();

        if wait == Some(Duration::ZERO) {
            let sent = Instant::now();
            let call = self.call(op, self.default_options(), |ch, t| {
                let (req, id) = (base.clone(), id.clone());
                async move { R::send(ch, request_with_id(req, t, &id)).await }
            });
            let resp = tokio::select! {
                r = call => r?,
                loss = lease.lost() => return Err(lease_lost(loss)),
            };
            return Ok(match R::outcome(&resp) {
                AcquireOutcome::Acquired => Waited::Granted(resp, sent),
                _ => Waited::NotGranted(resp),
            });
        }

        let config = self.config();
        let deadline = wait.map(|w| Instant::now() + w);
        let mut inflight: JoinSet<(u64, Instant, std::result::Result<R::Reply, RpcFailure>)> =
            JoinSet::new();
        let mut seq = 0u64;
        let mut newest: Option<Issued> = None;
        let mut next_at: Option<Instant> = Some(Instant::now());
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let mut failures = 0u32;
        let mut last_error = String::new();
        loop {
            if inflight.is_empty() && next_at.is_none() {
                // Nothing covers the waiter (a task died): re-attach now.
                next_at = Some(Instant::now());
            }
            if let Some(at) = next_at
                && Instant::now() >= at
            {
                let now = Instant::now();
                let remaining = deadline.map(|d| d.saturating_duration_since(now));
                if remaining == Some(Duration::ZERO) {
                    // The wait ran out while no call was covering it (failures only).
                    return Err(Error::Unavailable {
                        op,
                        endpoints: self.endpoints(),
                        last: last_error,
                    });
                }
                let plan = plan_rpc(remaining, config.acquire_rpc_wait, config.reattach_margin);
                seq += 1;
                let req = base.waiting(plan.wait);
                debug!(op, seq, wait = ?plan.wait, last = plan.last, "acquire rpc");
                inflight.spawn(rpc(
                    self.clone(),
                    seq,
                    req,
                    id.clone(),
                    plan.wait + config.acquire_slack,
                ));
                newest = Some(Issued {
                    seq,
                    last: plan.last,
                });
                next_at = plan.reattach_after.map(|d| now + d);
            }

            let sleep_until = next_at.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                joined = inflight.join_next(), if !inflight.is_empty() => {
                    let (done, sent, result) = match joined {
                        Some(Ok(v)) => v,
                        Some(Err(e)) => (0, Instant::now(), Err(RpcFailure::Retry(format!("acquire task failed: {e}")))),
                        None => continue,
                    };
                    let is_newest = newest.is_some_and(|n| n.seq == done);
                    match result {
                        Ok(resp) => {
                            failures = 0;
                            backoff.reset();
                            match R::outcome(&resp) {
                                AcquireOutcome::Acquired => return Ok(Waited::Granted(resp, sent)),
                                _ if !is_newest => {
                                    debug!(op, seq = done, "older acquire rpc ended; a newer one holds the place");
                                }
                                _ if newest.is_some_and(|n| n.last) => return Ok(Waited::NotGranted(resp)),
                                _ => {
                                    // Our waiter's deadline passed before the re-attach reached
                                    // the server: queue again, now.
                                    debug!(op, seq = done, "waiter expired early; re-queueing");
                                    next_at = Some(Instant::now());
                                }
                            }
                        }
                        Err(RpcFailure::Fatal(e)) => return Err(e),
                        Err(RpcFailure::Retry(e)) => {
                            last_error = e;
                            if is_newest {
                                failures += 1;
                                // The first re-attach goes out at once (to another node); after
                                // that, back off.
                                let pause = if failures == 1 {
                                    Duration::ZERO
                                } else {
                                    backoff.next_delay()
                                };
                                debug!(op, seq = done, error = %last_error, ?pause, "acquire rpc failed; re-attaching");
                                next_at = Some(Instant::now() + pause);
                                if let Some(d) = deadline {
                                    next_at = next_at.map(|t| t.min(d));
                                }
                            }
                        }
                    }
                }
                _ = tokio::time::sleep_until(sleep_until.into()), if next_at.is_some() => {}
                loss = lease.lost() => return Err(lease_lost(loss)),
            }
        }
    }
}

/// One acquire RPC on the best node, as a task of its own; answers with the instant it was
/// sent (a grant's hold limit counts from there).
async fn rpc<R: AcquireCall>(
    client: Client,
    seq: u64,
    req: R,
    id: String,
    timeout: Duration,
) -> (u64, Instant, std::result::Result<R::Reply, RpcFailure>) {
    let sent = Instant::now();
    let Some((idx, addr, channel)) = client.pick(&[]) else {
        return (
            seq,
            sent,
            Err(RpcFailure::Retry("no endpoints".to_string())),
        );
    };
    let fut = R::send(channel, request_with_id(req, timeout, &id));
    let result = match client.attempt(idx, &addr, R::OP, timeout, fut).await {
        Attempt::Ok(resp) => Ok(resp),
        Attempt::Retry { error, .. } => Err(RpcFailure::Retry(format!("{addr}: {error}"))),
        Attempt::Fail(e) => Err(RpcFailure::Fatal(e)),
    };
    (seq, sent, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn forever_waits_chain_overlapping_rpcs() {
        // t=0 send wait=30s; t=25s re-attach (5s before the first call's deadline)
        let p = plan_rpc(None, S(30), S(5));
        assert_eq!(
            p,
            RpcPlan {
                wait: S(30),
                last: false,
                reattach_after: Some(S(25)),
            }
        );
    }

    #[test]
    fn bounded_waits_end_with_a_last_rpc_covering_the_rest() {
        // --wait 40s: t=0 wait 30s (not last), t=25s wait 15s (last, ends at t=40s)
        let first = plan_rpc(Some(S(40)), S(30), S(5));
        assert_eq!(
            (first.wait, first.last, first.reattach_after),
            (S(30), false, Some(S(25)))
        );
        let second = plan_rpc(Some(S(15)), S(30), S(5));
        assert_eq!(
            (second.wait, second.last, second.reattach_after),
            (S(15), true, None)
        );
        // --wait 1s: a single last call
        let short = plan_rpc(Some(S(1)), S(30), S(5));
        assert_eq!(
            (short.wait, short.last, short.reattach_after),
            (S(1), true, None)
        );
        // exactly one RPC's worth is still a single last call
        assert!(plan_rpc(Some(S(30)), S(30), S(5)).last);
    }

    #[test]
    fn short_rpc_waits_reattach_halfway() {
        let p = plan_rpc(None, S(4), S(5));
        assert_eq!(p.reattach_after, Some(S(2)));
    }

    #[test]
    fn a_blocking_wait_is_never_sent_as_zero() {
        // timeout 0 would mean "non-blocking" to the server.
        let p = plan_rpc(Some(Duration::from_nanos(10)), S(30), S(5));
        assert_eq!(p.wait, Duration::from_millis(1));
        assert!(p.last);
    }

    #[test]
    fn only_an_acquired_outcome_is_a_grant() {
        let mut r = AcquireSemaphoreResponse {
            outcome: AcquireOutcome::TimedOut as i32,
            ..Default::default()
        };
        let outcome = <AcquireSemaphoreRequest as AcquireCall>::outcome;
        assert_eq!(outcome(&r), AcquireOutcome::TimedOut);
        r.outcome = AcquireOutcome::Unavailable as i32;
        assert_eq!(outcome(&r), AcquireOutcome::Unavailable);
        r.outcome = AcquireOutcome::Acquired as i32;
        assert_eq!(outcome(&r), AcquireOutcome::Acquired);
        // Unset, or a value from a newer server: never read as a grant.
        r.outcome = AcquireOutcome::Invalid as i32;
        assert_eq!(outcome(&r), AcquireOutcome::Invalid);
        r.outcome = 42;
        assert_eq!(outcome(&r), AcquireOutcome::Invalid);
        let lock = AcquireLockResponse {
            outcome: 42,
            fencing_token: 7,
            ..Default::default()
        };
        assert_eq!(
            <AcquireLockRequest as AcquireCall>::outcome(&lock),
            AcquireOutcome::Invalid
        );
    }
}

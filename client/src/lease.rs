//! [`Lease`]: a semaphore or lock lease that keeps itself alive and says at once when it is
//! lost.
//!
//! Semaphore leases and lock leases are separate kinds on the server (a lock lease cannot hold
//! permits, nor a semaphore lease locks); [`LeaseKind`] says which calls a lease is kept alive,
//! read and revoked with. Everything else below holds for both.
//!
//! Timeline for a lease with TTL `T` (all times measured from when a request was *sent*, which
//! is never later than when the server applied it):
//!
//! - about every `T/3` after the last successful refresh, refresh again (through any endpoint;
//!   see [`refresh_interval`]);
//! - a failed refresh is retried with backoff, on other endpoints first;
//! - a refresh answered `NotFound` loses the lease at once ([`LeaseLoss::NotFound`]);
//! - when no refresh has succeeded for `T − margin`, with `margin = max(1s, T/5)` (at most
//!   `T/2`), the lease is declared lost ([`LeaseLoss::NoRefresh`]). The server cannot expire it
//!   before `T` after the last refresh it applied, so the owner learns of the loss at least
//!   `margin` before anyone else can be granted its permits.
//!
//! A lost lease stays lost: the handle never "recovers", even if a later refresh would have
//! worked, so its owner can act on the loss without second-guessing it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::{CreateLockLeaseRequest, CreateSemaphoreLeaseRequest};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::backoff::Backoff;
use crate::client::{CallOptions, Client, missing};
use crate::error::{Error, LeaseLoss, Result};

/// Longest TTL the server accepts.
pub const MAX_TTL: Duration = Duration::from_secs(300);

pub use crate::lease_kind::LeaseKind;

/// State of a [`Lease`] as seen by its keep-alive task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Refreshed in time.
    Alive,
    /// Lost; final.
    Lost(LeaseLoss),
    /// Revoked by its owner; final.
    Revoked,
}

/// How often a lease with `ttl` is refreshed: `ttl / 3`, or more often when the TTL is so short
/// that fewer than two refreshes would fit before [`loss_after`].
///
/// ```
/// use std::time::Duration;
/// use conch_client::refresh_interval;
///
/// assert_eq!(refresh_interval(Duration::from_secs(30)), Duration::from_secs(10));
/// assert!(refresh_interval(Duration::from_secs(3)) < Duration::from_secs(1));
/// ```
pub fn refresh_interval(ttl: Duration) -> Duration {
    (ttl / 3).min(loss_after(ttl) * 5 / 12)
}

/// How long after the last successful refresh a lease with `ttl` is given up:
/// `ttl − min(max(1s, ttl/5), ttl/2)`.
///
/// ```
/// use std::time::Duration;
/// use conch_client::loss_after;
///
/// assert_eq!(loss_after(Duration::from_secs(10)), Duration::from_secs(8));
/// assert_eq!(loss_after(Duration::from_secs(3)), Duration::from_secs(2));
/// ```
pub fn loss_after(ttl: Duration) -> Duration {
    let margin = (ttl / 5).max(Duration::from_secs(1)).min(ttl / 2);
    ttl - margin
}

/// Deadline of one refresh attempt: a quarter of the TTL (at least 500 ms), so a stuck node
/// leaves time to try the others before the lease is given up.
fn refresh_attempt_timeout(ttl: Duration, request_timeout: Duration) -> Duration {
    (ttl / 4)
        .max(Duration::from_millis(500))
        .min(request_timeout)
}

/// Checks a TTL the server will accept: whole seconds from 1 to 300.
pub fn validate_ttl(ttl: Duration) -> std::result::Result<u64, String> {
    if ttl.subsec_nanos() != 0 || ttl < Duration::from_secs(1) || ttl > MAX_TTL {
        return Err(format!(
            "the lease ttl must be whole seconds from 1s to 300s, got {}",
            crate::duration::format_duration(ttl)
        ));
    }
    Ok(ttl.as_secs())
}

/// A semaphore or lock lease kept alive in the background.
///
/// Created by [`Client::create_lease`] (semaphores) or [`Client::create_lock_lease`] (locks).
/// Permits or locks acquired with it are held as long as it lives;
/// [`Lease::revoke`] releases all of them at once. Dropping the handle stops the keep-alive
/// and revokes the lease in the background (best effort; the server expires it after its TTL
/// anyway).
///
/// ```no_run
/// # async fn demo() -> Result<(), conch_client::Error> {
/// use std::collections::HashMap;
/// use std::time::Duration;
/// use conch_client::Client;
///
/// let client = Client::connect(["127.0.0.1:7001"]).await?;
/// client.ensure_semaphore("jobs", "nightly", 1).await?;
/// let lease = client
///     .create_lease("jobs", "worker-1", Duration::from_secs(10), HashMap::new())
///     .await?;
/// if let Some(guard) = client
///     .acquire(&lease, "jobs", "nightly", 1, Some(Duration::from_secs(30)), HashMap::new())
///     .await?
/// {
///     tokio::select! {
///         _ = do_the_work(guard.fencing_token()) => {}
///         loss = lease.lost() => eprintln!("lost the slot: {loss}"),
///     }
///     guard.release().await?;
/// }
/// lease.revoke().await?;
/// # Ok(()) }
/// # async fn do_the_work(_token: u64) {}
/// ```
pub struct Lease {
    client: Client,
    kind: LeaseKind,
    namespace: String,
    id: String,
    ttl: Duration,
    info: conch_proto::grackle::Lease,
    state: Arc<watch::Sender<LeaseState>>,
    keepalive: Option<JoinHandle<()>>,
    revoked: bool,
    refreshed: Arc<watch::Sender<Instant>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("kind", &self.kind)
            .field("namespace", &self.namespace)
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Client {
    /// Creates a semaphore lease with `ttl` (whole seconds, 1–300) and starts keeping it alive.
    ///
    /// `process_id` (≤ 128 bytes) identifies the owner in `ListSemaphoreLeases`; `metadata` is
    /// stored with the lease. The create is retried on failover like every other call, with one
    /// request id: a retry after a lost reply returns the lease the first attempt created.
    pub async fn create_lease(
        &self,
        namespace: &str,
        process_id: &str,
        ttl: Duration,
        metadata: HashMap<String, String>,
    ) -> Result<Lease> {
        self.create_lease_of(LeaseKind::Semaphore, namespace, process_id, ttl, metadata)
            .await
    }

    /// Creates a lock lease (for [`Client::acquire_lock`]) with `ttl` and starts keeping it
    /// alive; otherwise as [`Client::create_lease`].
    pub async fn create_lock_lease(
        &self,
        namespace: &str,
        process_id: &str,
        ttl: Duration,
        metadata: HashMap<String, String>,
    ) -> Result<Lease> {
        self.create_lease_of(LeaseKind::Lock, namespace, process_id, ttl, metadata)
            .await
    }

    /// Creates a lease of `kind`: [`Client::create_lease`] or [`Client::create_lock_lease`].
    pub async fn create_lease_of(
        &self,
        kind: LeaseKind,
        namespace: &str,
        process_id: &str,
        ttl: Duration,
        metadata: HashMap<String, String>,
    ) -> Result<Lease> {
        let op = match kind {
            LeaseKind::Semaphore => "create lease",
            LeaseKind::Lock => "create lock lease",
        };
        let ttl_seconds =
            validate_ttl(ttl).map_err(|message| Error::InvalidArgument { op, message })?;
        // The lease cannot expire earlier than `ttl` after this instant.
        let sent = Instant::now();
        let (namespace_name, process_id) = (namespace.to_string(), process_id.to_string());
        let lease = match kind {
            LeaseKind::Semaphore => {
                let req = CreateSemaphoreLeaseRequest {
                    namespace_name,
                    process_id,
                    ttl_seconds,
                    metadata,
                };
                self.unary_once(op, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).create_semaphore_lease(r).await
                })
                .await?
                .lease
            }
            LeaseKind::Lock => {
                let req = CreateLockLeaseRequest {
                    namespace_name,
                    process_id,
                    ttl_seconds,
                    metadata,
                };
                self.unary_once(op, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).create_lock_lease(r).await
                })
                .await?
                .lease
            }
        };
        let info = lease.ok_or_else(|| missing(op, "lease"))?;
        if info.lease_id.is_empty() {
            return Err(missing(op, "lease_id"));
        }
        let state = Arc::new(watch::Sender::new(LeaseState::Alive));
        let refreshed = Arc::new(watch::Sender::new(sent));
        let keepalive = tokio::spawn(keep_alive(
            self.clone(),
            kind,
            namespace.to_string(),
            info.lease_id.clone(),
            ttl,
            state.clone(),
            sent,
            refreshed.clone(),
        ));
        debug!(lease = %info.lease_id, ?kind, ttl_s = ttl_seconds, "lease created");
        Ok(Lease {
            client: self.clone(),
            kind,
            namespace: namespace.to_string(),
            id: info.lease_id.clone(),
            ttl,
            info,
            state,
            keepalive: Some(keepalive),
            revoked: false,
            refreshed,
        })
    }
}

impl Lease {
    /// The lease id (e.g. `ls_…`), as exported by the CLI in `CONCH_LEASE`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Semaphore lease or lock lease.
    pub fn kind(&self) -> LeaseKind {
        self.kind
    }

    /// The namespace the lease lives in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The lease's time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The lease as the server created it.
    pub fn info(&self) -> &conch_proto::grackle::Lease {
        &self.info
    }

    /// The client the lease was created with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The current state.
    pub fn state(&self) -> LeaseState {
        self.state.borrow().clone()
    }

    /// `true` once the lease is lost.
    pub fn is_lost(&self) -> bool {
        matches!(*self.state.borrow(), LeaseState::Lost(_))
    }

    /// A receiver that sees every state change (e.g. to watch the lease from another task).
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.subscribe()
    }

    /// A receiver of when the last successful refresh was sent (at first, when the create was
    /// sent): the server keeps the lease for at least its TTL after that instant.
    pub fn refreshed(&self) -> watch::Receiver<Instant> {
        self.refreshed.subscribe()
    }

    /// Resolves when the lease is lost (at once if it already is); never resolves otherwise.
    /// Cancel-safe: use it in `tokio::select!` next to the work the lease protects.
    pub async fn lost(&self) -> LeaseLoss {
        let mut rx = self.state.subscribe();
        loop {
            if let LeaseState::Lost(loss) = &*rx.borrow_and_update() {
                return loss.clone();
            }
            if rx.changed().await.is_err() {
                // Cannot happen while `self` holds the sender; wait forever rather than spin.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops the keep-alive and revokes the lease, releasing everything it holds or waits
    /// for. A lease the server no longer knows counts as revoked.
    pub async fn revoke(mut self) -> Result<()> {
        self.revoked = true;
        if let Some(task) = self.keepalive.take() {
            task.abort();
        }
        self.state.send_if_modified(|s| {
            let alive = *s == LeaseState::Alive;
            if alive {
                *s = LeaseState::Revoked;
            }
            alive
        });
        match self
            .client
            .revoke_lease_of(self.kind, &self.namespace, &self.id)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(task) = self.keepalive.take() {
            task.abort();
        }
        if self.revoked {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let (kind, ns, id) = (self.kind, self.namespace.clone(), self.id.clone());
            rt.spawn(async move {
                if let Err(e) = client.revoke_lease_of(kind, &ns, &id).await {
                    debug!(lease = %id, error = %e, "revoke on drop failed");
                }
            });
        }
    }
}

fn lose(state: &watch::Sender<LeaseState>, loss: LeaseLoss) {
    state.send_if_modified(|s| {
        let alive = *s == LeaseState::Alive;
        if alive {
            *s = LeaseState::Lost(loss);
        }
        alive
    });
}

/// The keep-alive loop (see the module docs for the timeline).
#[allow(clippy::too_many_arguments)]
async fn keep_alive(
    client: Client,
    kind: LeaseKind,
    namespace: String,
    id: String,
    ttl: Duration,
    state: Arc<watch::Sender<LeaseState>>,
    mut last_ok: Instant,
    refreshed: Arc<watch::Sender<Instant>>,
) {
    let interval = refresh_interval(ttl);
    let give_up = loss_after(ttl);
    let attempt_timeout = refresh_attempt_timeout(ttl, client.config().request_timeout);
    let mut backoff = Backoff::new(
        Duration::from_millis(100),
        interval.max(Duration::from_millis(100)),
    );
    let mut next = last_ok + interval;
    let mut last_error: Option<String> = None;
    loop {
        let loss_at = last_ok + give_up;
        tokio::time::sleep_until(next.min(loss_at).into()).await;
        let sent = Instant::now();
        if sent >= loss_at {
            let since = sent - last_ok;
            warn!(lease = %id, ?since, "lease lost: no refresh succeeded in time");
            lose(&state, LeaseLoss::NoRefresh { since, last_error });
            return;
        }
        let budget = loss_at - sent;
        let opts = CallOptions {
            timeout: attempt_timeout.min(budget),
            retry_for: budget,
        };
        let refresh = client.refresh_lease_of(kind, &namespace, &id, ttl.as_secs(), opts);
        match tokio::time::timeout(budget, refresh).await {
            Ok(Ok(_)) => {
                last_ok = sent;
                refreshed.send_replace(sent);
                last_error = None;
                backoff.reset();
                next = sent + interval;
            }
            Ok(Err(e)) if e.is_not_found() => {
                warn!(lease = %id, error = %e, "lease lost: the server no longer knows it");
                let message = match e {
                    Error::NotFound { message, .. } => message,
                    other => other.to_string(),
                };
                lose(&state, LeaseLoss::NotFound { message });
                return;
            }
            Ok(Err(e)) => {
                warn!(lease = %id, error = %e, "lease refresh failed; retrying");
                last_error = Some(e.to_string());
                next = Instant::now() + backoff.next_delay();
            }
            // The loop notices that `loss_at` has passed.
            Err(_) => next = Instant::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_comes_a_safety_margin_before_the_ttl() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // ttl -> give up after
        assert_eq!(loss_after(s(1)), ms(500));
        assert_eq!(loss_after(s(2)), s(1));
        assert_eq!(loss_after(s(5)), s(4));
        assert_eq!(loss_after(s(10)), s(8));
        assert_eq!(loss_after(s(60)), s(48));
        assert_eq!(loss_after(s(300)), s(240));
        for ttl in 1..=300 {
            let ttl = s(ttl);
            let give_up = loss_after(ttl);
            assert!(give_up < ttl);
            assert!(ttl - give_up >= s(1).min(ttl / 2));
            // At least two refreshes are due before the lease is given up.
            assert!(refresh_interval(ttl) * 2 < give_up);
        }
    }

    #[test]
    fn refresh_attempts_are_short_enough_to_try_another_node() {
        let s = Duration::from_secs;
        assert_eq!(
            refresh_attempt_timeout(s(10), s(5)),
            Duration::from_millis(2500)
        );
        assert_eq!(
            refresh_attempt_timeout(s(1), s(5)),
            Duration::from_millis(500)
        );
        assert_eq!(refresh_attempt_timeout(s(300), s(5)), s(5));
    }

    #[test]
    fn ttl_must_be_whole_seconds_in_range() {
        assert_eq!(validate_ttl(Duration::from_secs(10)), Ok(10));
        assert_eq!(validate_ttl(Duration::from_secs(300)), Ok(300));
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_millis(1500)).is_err());
        assert!(
            validate_ttl(Duration::from_secs(301))
                .unwrap_err()
                .contains("5m1s")
        );
    }

    #[test]
    fn a_lost_lease_stays_lost() {
        let state = watch::Sender::new(LeaseState::Alive);
        lose(
            &state,
            LeaseLoss::NotFound {
                message: "gone".into(),
            },
        );
        lose(
            &state,
            LeaseLoss::NoRefresh {
                since: Duration::from_secs(8),
                last_error: None,
            },
        );
        assert_eq!(
            *state.borrow(),
            LeaseState::Lost(LeaseLoss::NotFound {
                message: "gone".into()
            })
        );
    }
}

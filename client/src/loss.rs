//! Losses pushed to the holder: [`Client::lease_lost`] completes as soon as the cluster ends a
//! lease, or a hold of it, without its holder releasing it (expired, revoked, hold limit,
//! semaphore, lock or namespace deleted), instead of at the next refresh.
//!
//! It keeps one `conch.v1` `WatchLoss` stream open on some node. The node answers first with
//! what the lease holds (or `NOT_FOUND` when it is gone), then with the loss. A stream that
//! ends or breaks (the node stops, a connection fails) is opened again on another node, as
//! every call fails over; the new node's first answer tells whether the loss happened while
//! no stream was open: the lease is gone, or a hold the caller named is missing. The caller's
//! refresh-based fencing ([`Lease`](crate::Lease)) stays in place beside it: this only makes
//! the loss known sooner.

use std::time::Duration;

use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::watch_loss_response::Message;
use conch_proto::conch::{LeaseWatching, LossCause, LossEvent, WatchLossRequest, WatchedLeaseKind};
use tonic::Request;
use tracing::debug;

use crate::acquire::Held;
use crate::backoff::Backoff;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::lease_kind::LeaseKind;

/// A loss the cluster pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Why. `LossCause::Gone`: the lease or hold was found gone on (re)connecting, or in a
    /// snapshot a node installed; how it went is not known.
    pub cause: LossCause,
    /// A sentence for people: what was lost and why.
    pub reason: String,
    /// The semaphore whose hold ended (`None` with `lock` also `None`: the whole lease).
    pub semaphore: Option<String>,
    /// The lock whose hold ended.
    pub lock: Option<String>,
}

impl Lost {
    /// The cause as a short name (`revoked`, `hold limit`, ...).
    pub fn cause_name(&self) -> &'static str {
        match self.cause {
            LossCause::Unspecified => "unspecified",
            LossCause::Expired => "expired",
            LossCause::Revoked => "revoked",
            LossCause::HoldLimit => "hold limit",
            LossCause::SemaphoreDeleted => "semaphore deleted",
            LossCause::LockDeleted => "lock deleted",
            LossCause::NamespaceDeleted => "namespace deleted",
            LossCause::Gone => "gone",
        }
    }

    fn of(event: LossEvent) -> Lost {
        let cause = event.cause();
        Lost {
            cause,
            reason: event.reason,
            semaphore: Some(event.semaphore_name).filter(|s| !s.is_empty()),
            lock: Some(event.lock_name).filter(|s| !s.is_empty()),
        }
    }

    fn gone(reason: String, held: Option<&Held>) -> Lost {
        let (semaphore, lock) = match held {
            Some(Held::Semaphore { name, .. }) => (Some(name.clone()), None),
            Some(Held::Lock { path, .. }) => (None, Some(path.clone())),
            None => (None, None),
        };
        Lost {
            cause: LossCause::Gone,
            reason,
            semaphore,
            lock,
        }
    }
}

/// The first of `held` that `watching` does not list.
fn missing<'a>(held: &'a [Held], watching: &LeaseWatching) -> Option<&'a Held> {
    held.iter().find(|h| {
        !watching.holds.iter().any(|w| match h {
            Held::Semaphore { name, .. } => w.semaphore_name == *name,
            Held::Lock { path, .. } => w.lock_name == *path,
        })
    })
}

fn describe(namespace: &str, held: &Held) -> String {
    match held {
        Held::Semaphore { name, .. } => format!("the hold of semaphore {namespace}/{name}"),
        Held::Lock { path, .. } => format!("the hold of lock {namespace}/{path}"),
    }
}

/// What one stream ended with.
enum Ended {
    Lost(Lost),
    /// The stream ended or broke without a loss: watch again elsewhere.
    Again(String),
}

impl Client {
    /// Completes when lease `lease_id` (of `kind`, in `namespace`) is lost, or one of the
    /// holds in `held` (what the caller took with it) ends without the caller releasing it.
    /// Stop waiting on it (drop the future) before releasing or revoking yourself.
    ///
    /// Fails over between endpoints and keeps trying while no node can serve; on every
    /// (re)connection it checks that the lease and `held` are still there, so a loss while no
    /// stream was open is reported too ([`LossCause::Gone`]). Errors only with what trying
    /// again cannot fix: no permission, a node without the call, bad arguments, a node's limit
    /// of watches reached. Then rely on the lease's refresh alone.
    pub async fn lease_lost(
        &self,
        namespace: &str,
        lease_id: &str,
        kind: LeaseKind,
        held: &[Held],
    ) -> Result<Lost> {
        let req = WatchLossRequest {
            namespace_name: namespace.to_string(),
            lease_id: lease_id.to_string(),
            kind: match kind {
                LeaseKind::Semaphore => WatchedLeaseKind::Semaphore,
                LeaseKind::Lock => WatchedLeaseKind::Lock,
            }
            .into(),
        };
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match self.watch_once(&req, held).await {
                Ok(Ended::Lost(lost)) => return Ok(lost),
                Ok(Ended::Again(why)) => debug!(lease_id, why, "loss watch ended; watching again"),
                Err(Error::NotFound { message, .. }) => {
                    return Ok(Lost::gone(
                        format!(
                            "lease {lease_id} is gone (the cluster no longer knows it: {message})"
                        ),
                        None,
                    ));
                }
                Err(e @ Error::Unavailable { .. }) => {
                    debug!(lease_id, error = %e, "no node serves the loss watch now; trying again")
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// One stream: opened with failover, then read until the loss or its end.
    async fn watch_once(&self, req: &WatchLossRequest, held: &[Held]) -> Result<Ended> {
        let opts = self.default_options();
        let mut stream = self
            .call("watch loss", opts, |channel, _| {
                // No deadline: the stream lives as long as the lease. Getting its headers has
                // the attempt's deadline.
                let request = Request::new(req.clone());
                async move { ConchApiClient::new(channel).watch_loss(request).await }
            })
            .await?;
        let first = tokio::time::timeout(opts.timeout, stream.message()).await;
        let watching = match first {
            Ok(Ok(Some(m))) => match m.message {
                Some(Message::Watching(w)) => w,
                Some(Message::Lost(l)) => return Ok(Ended::Lost(Lost::of(l))),
                None => return Ok(Ended::Again("an empty first message".into())),
            },
            Ok(Ok(None)) => return Ok(Ended::Again("the stream ended at once".into())),
            Ok(Err(status)) => return Ok(Ended::Again(status.message().to_string())),
            Err(_) => return Ok(Ended::Again("no first message in time".into())),
        };
        if let Some(h) = missing(held, &watching) {
            return Ok(Ended::Lost(Lost::gone(
                format!(
                    "{} is gone (found so on watching lease {} again)",
                    describe(&req.namespace_name, h),
                    req.lease_id
                ),
                Some(h),
            )));
        }
        debug!(
            lease_id = req.lease_id,
            node = watching.node_id,
            "watching the lease for a loss"
        );
        loop {
            match stream.message().await {
                Ok(Some(m)) => {
                    if let Some(Message::Lost(l)) = m.message {
                        return Ok(Ended::Lost(Lost::of(l)));
                    }
                }
                Ok(None) => return Ok(Ended::Again("the node ended the stream".into())),
                Err(status) => return Ok(Ended::Again(status.message().to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use conch_proto::conch::LeaseHold;

    use super::*;

    #[test]
    fn a_hold_missing_on_reconnect_is_named() {
        let held = vec![
            Held::Semaphore {
                name: "a".into(),
                weight: 1,
            },
            Held::Lock {
                path: "x/y".into(),
                exclusive: true,
            },
        ];
        let mut watching = LeaseWatching {
            holds: vec![
                LeaseHold {
                    semaphore_name: "a".into(),
                    ..Default::default()
                },
                LeaseHold {
                    lock_name: "x/y".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(missing(&held, &watching), None);
        watching.holds.remove(1);
        assert_eq!(missing(&held, &watching), Some(&held[1]));
        let lost = Lost::gone(describe("n", &held[1]), Some(&held[1]));
        assert_eq!(lost.reason, "the hold of lock n/x/y");
        assert_eq!(lost.lock.as_deref(), Some("x/y"));
        assert_eq!(lost.cause_name(), "gone");
    }
}

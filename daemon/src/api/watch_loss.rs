//! `WatchLoss`: the holder of a lease learns at once that it lost the lease or a hold of it, so
//! `conch sema`, `conch elect` and `conch lock` stop their command without waiting for the next
//! refresh.
//!
//! The call starts with a read-index barrier ([`Node::linearizable`]): this node then holds
//! every entry committed before the call, so the `watching` message (or `NOT_FOUND`) is never
//! older than the call. It registers the watch before it reads the lease, so no loss applied
//! in between is missed. From there it serves from this node's applied state: the apply path
//! hands each entry's [`Event::Lost`](crate::state::Event::Lost) to the watches of that lease
//! (`loss_watch.rs`), and the stream sends it as one `lost` message and ends. A follower
//! applies an entry a heartbeat after the leader at most. A snapshot install makes the watch
//! read its lease again; a lease or hold gone there is reported as `LOSS_CAUSE_GONE`. When the
//! node shuts down the stream ends without a `lost` message: the client watches again
//! elsewhere and compares the new `watching` message with what it held.

use std::pin::Pin;
use std::sync::Arc;

use conch_proto::conch as cpb;
use futures::{Stream, StreamExt};
use tonic::Status;

use super::status::ApiError;
use crate::callers::watches::LossWatch;
use crate::node::Node;
use crate::state::{Error, LeaseHold, LeaseKind, LossCause, lock_path};

pub(crate) type WatchLossStream =
    Pin<Box<dyn Stream<Item = Result<cpb::WatchLossResponse, Status>> + Send>>;

/// The lease kind a request names.
pub(crate) fn kind(kind: i32) -> Result<LeaseKind, ApiError> {
    match cpb::WatchedLeaseKind::try_from(kind) {
        Ok(cpb::WatchedLeaseKind::Semaphore) => Ok(LeaseKind::Semaphore),
        Ok(cpb::WatchedLeaseKind::Lock) => Ok(LeaseKind::Lock),
        Err(_) => Err(Error::invalid(format!(
            "kind: {kind} is not a lease kind (0: semaphore lease, 1: lock lease)"
        ))
        .into()),
    }
}

/// Starts the watch of `lease` (the caller was allowed to refresh it): the `watching` message,
/// then at most one `lost` message. `permit` is held as long as the stream lives.
pub(crate) async fn start<P: Send + 'static>(
    node: Arc<Node>,
    ns: String,
    kind: LeaseKind,
    lease: String,
    permit: P,
) -> Result<WatchLossStream, ApiError> {
    node.linearizable().await?;
    let watch = node.applied.watch_loss(&ns, &lease).map_err(|full| {
        Error::exhausted(format!(
            "this node already keeps its limit of {} loss watches: watch on another node, \
             or rely on refreshing the lease",
            full.limit
        ))
    })?;
    let (holds, index, _) = node.applied.read_at(|s| s.lease_holds(&ns, kind, &lease));
    let holds = holds?;
    let watching = cpb::WatchLossResponse {
        message: Some(cpb::watch_loss_response::Message::Watching(
            cpb::LeaseWatching {
                holds: holds.iter().map(hold).collect(),
                node_id: node.id,
                applied_index: index,
            },
        )),
    };
    let watcher = Watcher {
        node,
        ns,
        kind,
        lease,
        holds,
        watch,
        _permit: permit,
    };
    let rest = futures::stream::once(async move { watcher.wait().await })
        .filter_map(|lost| async move { lost.map(Ok) });
    Ok(Box::pin(
        futures::stream::once(async move { Ok(watching) }).chain(rest),
    ))
}

struct Watcher<P> {
    node: Arc<Node>,
    ns: String,
    kind: LeaseKind,
    lease: String,
    /// What the lease held when the watch began.
    holds: Vec<LeaseHold>,
    watch: LossWatch,
    _permit: P,
}

impl<P> Watcher<P> {
    /// The `lost` message, or `None` when the node stops first.
    async fn wait(mut self) -> Option<cpb::WatchLossResponse> {
        let mut rechecks = 0;
        loop {
            let seen = tokio::select! {
                seen = self.watch.changed() => seen,
                () = self.node.tasks.stopping() => return None,
            };
            if let Some(loss) = seen.loss {
                return Some(lost(&self.ns, &loss.object, loss.cause, &self.lease));
            }
            if seen.rechecks != rechecks {
                rechecks = seen.rechecks;
                if let Some(gone) = self.recheck() {
                    return Some(gone);
                }
            }
        }
    }

    /// After a snapshot install: the lease or a hold it had that is gone now.
    fn recheck(&mut self) -> Option<cpb::WatchLossResponse> {
        let now = self
            .node
            .applied
            .read(|s| s.lease_holds(&self.ns, self.kind, &self.lease));
        let Ok(now) = now else {
            return Some(lost_gone(&self.ns, "", &self.lease));
        };
        self.holds
            .iter()
            .find(|h| !now.iter().any(|n| n.object == h.object))
            .map(|h| lost_gone(&self.ns, &h.object, &self.lease))
    }
}

fn hold(h: &LeaseHold) -> cpb::LeaseHold {
    let (semaphore_name, lock_name) = names(&h.object);
    cpb::LeaseHold {
        semaphore_name,
        lock_name,
        fencing_token: h.token,
        weight: h.weight,
        exclusive: h.exclusive,
    }
}

/// (semaphore name, lock path) of a hold's object; both empty for the whole lease.
fn names(object: &str) -> (String, String) {
    match lock_path(object) {
        Some(path) => (String::new(), path.to_string()),
        None => (object.to_string(), String::new()),
    }
}

fn lost_gone(ns: &str, object: &str, lease: &str) -> cpb::WatchLossResponse {
    let (semaphore_name, lock_name) = names(object);
    let what = if !semaphore_name.is_empty() {
        format!("the hold of semaphore {ns}/{semaphore_name}")
    } else if !lock_name.is_empty() {
        format!("the hold of lock {ns}/{lock_name}")
    } else {
        format!("lease {lease}")
    };
    message(cpb::LossEvent {
        cause: cpb::LossCause::Gone.into(),
        reason: format!("{what} is gone (seen in a snapshot this node installed)"),
        semaphore_name,
        lock_name,
    })
}

/// The `lost` message of a loss of `object` (empty: the whole lease) of lease `lease` in `ns`.
fn lost(ns: &str, object: &str, cause: LossCause, lease: &str) -> cpb::WatchLossResponse {
    let (semaphore_name, lock_name) = names(object);
    let (cause, reason) = match cause {
        LossCause::Expired => (
            cpb::LossCause::Expired,
            format!("lease {lease} expired (not refreshed within its TTL)"),
        ),
        LossCause::Revoked => (
            cpb::LossCause::Revoked,
            format!("lease {lease} was revoked"),
        ),
        LossCause::HoldLimit => (
            cpb::LossCause::HoldLimit,
            format!("the hold of semaphore {ns}/{semaphore_name} reached its hold limit"),
        ),
        LossCause::SemaphoreDeleted => (
            cpb::LossCause::SemaphoreDeleted,
            format!("semaphore {ns}/{semaphore_name} was deleted while held"),
        ),
        LossCause::LockDeleted => (
            cpb::LossCause::LockDeleted,
            format!("lock {ns}/{lock_name} was deleted: its holds were dropped"),
        ),
        LossCause::NamespaceDeleted => (
            cpb::LossCause::NamespaceDeleted,
            format!("namespace {ns} was deleted with lease {lease}"),
        ),
    };
    message(cpb::LossEvent {
        cause: cause.into(),
        reason,
        semaphore_name,
        lock_name,
    })
}

fn message(loss: cpb::LossEvent) -> cpb::WatchLossResponse {
    cpb::WatchLossResponse {
        message: Some(cpb::watch_loss_response::Message::Lost(loss)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_message_names_the_hold_and_the_cause() {
        let m = lost("jobs", "db", LossCause::HoldLimit, "L");
        let Some(cpb::watch_loss_response::Message::Lost(e)) = m.message else {
            panic!("{m:?}")
        };
        assert_eq!(e.cause(), cpb::LossCause::HoldLimit);
        assert_eq!(e.semaphore_name, "db");
        assert_eq!(
            e.reason,
            "the hold of semaphore jobs/db reached its hold limit"
        );
        let m = lost("jobs", "lock:a/b", LossCause::LockDeleted, "L");
        let Some(cpb::watch_loss_response::Message::Lost(e)) = m.message else {
            panic!("{m:?}")
        };
        assert_eq!(
            (e.semaphore_name.as_str(), e.lock_name.as_str()),
            ("", "a/b")
        );
        let m = lost("jobs", "", LossCause::Revoked, "L");
        let Some(cpb::watch_loss_response::Message::Lost(e)) = m.message else {
            panic!("{m:?}")
        };
        assert_eq!(e.reason, "lease L was revoked");
    }

    #[test]
    fn an_unknown_kind_is_refused_by_name() {
        assert!(kind(0).is_ok() && kind(1).is_ok());
        let Err(e) = kind(7) else { panic!("kind 7") };
        assert!(e.to_string().contains("kind: 7"), "{e}");
    }
}

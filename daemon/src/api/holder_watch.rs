//! `WaitHolderChange`: a caller that knows a semaphore's holder (by its fencing token) waits
//! until that holder is gone or replaced, and gets the holders then. `conch elect --observe`
//! follows an election with it, without polling.
//!
//! The wait starts with a linearizable read (so an answer is never older than the call), then
//! watches the one semaphore on this node's applied state: only an applied entry that changed
//! its holders wakes the wait, which reads them again, so a watcher costs work per change of its
//! semaphore, not per entry. Nothing is proposed and no timer fires besides the call's own
//! deadline. See `docs/design.md` (Holder-change waits).

use std::time::Duration;

use crate::callers::watches::{LossWatch, Seen};
use crate::node::Node;
use crate::state::audit::{AuditAction, AuditFilter};
use crate::state::{Error, ErrorKind, HolderView, LossCause, PageRequest, State};

use super::status::ApiError;

/// The longest a single call waits; the caller asks again.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);

/// What a wait ends with: the holders in grant order, whether the semaphore exists, and how
/// the holder the caller knew of went.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Holders {
    pub holders: Vec<HolderView>,
    pub exists: bool,
    pub known_ended: Ended,
}

/// How the holder a wait knew of stopped holding, as this node saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Not seen: it went before the wait began, it still holds, or the state was replaced.
    #[default]
    Unknown,
    /// Its lease lost nothing: the holder let go.
    Released,
    Expired,
    LeaseRevoked,
    HoldLimit,
    /// The semaphore or its namespace was deleted.
    Deleted,
    /// An administrator's `RevokeHolder` (with the reason given), or the lease revoked by
    /// another token than its creator's (no reason).
    RevokedByAdmin {
        reason: String,
    },
}

impl Ended {
    /// How a holder of `sem` whose lease saw `seen` went: the loss of its lease or of this
    /// hold, or, without one, a release. A revoked lease is told apart as an administrator's
    /// revoke by the audit trail's latest record for the lease in `state`.
    fn of(state: &State, ns: &str, sem: &str, lease: &str, seen: &Seen) -> Ended {
        let loss = match &seen.loss {
            Some(loss) if loss.object.is_empty() || loss.object == sem => loss,
            // Another hold of the lease was lost; this one was let go.
            Some(_) => return Ended::Released,
            None if seen.rechecks > 0 => return Ended::Unknown,
            None => return Ended::Released,
        };
        match loss.cause {
            LossCause::Expired => Ended::Expired,
            LossCause::HoldLimit => Ended::HoldLimit,
            LossCause::SemaphoreDeleted | LossCause::LockDeleted | LossCause::NamespaceDeleted => {
                Ended::Deleted
            }
            LossCause::Revoked => {
                let filter = AuditFilter {
                    namespace: ns.to_string(),
                    lease: lease.to_string(),
                };
                let page = PageRequest {
                    token: String::new(),
                    limit: 1,
                };
                match state.list_audit(&filter, &page, |_| true) {
                    Ok(found) => match found.items.into_iter().next() {
                        // An administrator's revoke of the holder, or of its lease with
                        // another token than the one that created it.
                        Some(r)
                            if matches!(
                                r.action,
                                AuditAction::RevokeHolder | AuditAction::RevokeLease
                            ) =>
                        {
                            Ended::RevokedByAdmin { reason: r.reason }
                        }
                        _ => Ended::LeaseRevoked,
                    },
                    Err(_) => Ended::LeaseRevoked,
                }
            }
        }
    }
}

impl Holders {
    /// The fencing token of the first holder; 0 when nobody holds.
    pub(crate) fn token(&self) -> u64 {
        self.holders.first().map_or(0, |h| h.token)
    }
}

/// The holders of `ns/sem` in `state` (a missing namespace or semaphore: nobody, not an error).
pub(crate) fn holders(state: &State, ns: &str, sem: &str) -> Result<Holders, Error> {
    match state.list_holders(ns, sem, &PageRequest::default()) {
        Ok(page) => Ok(Holders {
            holders: page.items,
            exists: true,
            known_ended: Ended::Unknown,
        }),
        Err(e) if e.kind == ErrorKind::NotFound => Ok(Holders::default()),
        Err(e) => Err(e),
    }
}

/// Waits until the first holder of `ns/sem` is not the grant `known_token` (0: nobody), or
/// `timeout` (at most [`MAX_WAIT`]) passes, and answers with the holders at that point.
pub(crate) async fn wait(
    node: &Node,
    ns: &str,
    sem: &str,
    known_token: u64,
    timeout: Duration,
) -> Result<Holders, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
    node.linearizable().await?;
    // Watch before reading, so no change applied between the read and the wait is missed.
    let mut watch = node.applied.watch_holders(ns, sem);
    // The known holder's lease, watched for a loss from the first read on, so that its going
    // can be told apart from a release (none when the node keeps its limit of such watches).
    let mut known: Option<(String, Option<LossWatch>)> = None;
    // Set for the read right after the lease watch began: a change seen then may have come
    // before the watch, so how the holder went is not known.
    let mut just_watched = false;
    loop {
        let mut now = node.applied.read(|s| holders(s, ns, sem))?;
        if now.token() != known_token {
            if let (false, Some((lease, Some(loss)))) = (just_watched, known.as_mut()) {
                let seen = loss.seen();
                now.known_ended = node.applied.read(|s| Ended::of(s, ns, sem, lease, &seen));
            }
            return Ok(now);
        }
        just_watched = false;
        if known.is_none()
            && let Some(first) = now.holders.first()
        {
            let lease = first.lease_id.clone();
            let loss = node.applied.watch_loss(ns, &lease).ok();
            known = Some((lease, loss));
            just_watched = true;
            continue;
        }
        // A test sees the wait parked by this event (`parked`), before it changes the holder.
        tracing::debug!(
            parked = true,
            ns,
            sem,
            known_token,
            "holder-change wait parked"
        );
        tokio::select! {
            _ = watch.changed() => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(now),
            // The node stops: answer with what is known, the caller watches on elsewhere.
            () = node.tasks.stopping() => return Ok(now),
        }
    }
}

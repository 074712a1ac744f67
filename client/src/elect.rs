//! How `conch elect` lays an election out in the Grackle data model, and the wait that follows
//! one.
//!
//! - An election is a 1-permit semaphore `<name>.elect` in namespace [`NAMESPACE`] (`conch`), or
//!   the one `conch elect --namespace` names.
//!   `conch sema` names end in `.<max>` (digits) or `.host-<host>` (no dots in the host), so an
//!   election never shares a semaphore with `conch sema`.
//! - Candidates queue for the permit in FIFO order with one lease each; the holder is the
//!   leader, its grant's fencing token the leader's term (`CONCH_REV`).
//! - The candidate's `--value` travels as metadata [`META_VALUE`] of the lease and the acquire,
//!   beside `conch sema`'s host, pid, since and cmd, so the leader and the candidates show it.
//! - [`Client::wait_holder_change`] waits on the server until the leader changes.
//! - A candidate's `--priority` travels as metadata [`META_PRIORITY`] (absent: 0). A leader, or
//!   a candidate just granted leadership, that sees a candidate of higher priority waiting hands
//!   leadership over ([`preferred`]); equal priorities never hand over, so leadership cannot
//!   bounce between two candidates.

use std::time::Duration;

use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::{SemaphoreWaiter, WaitHolderChangeRequest};

pub use conch_proto::conch::HolderEnd;
use conch_proto::grackle::SemaphoreHolder;

use crate::sema::{MAX_NAME_LEN, validate_name};
use crate::{CallOptions, Client, Result};

pub use crate::sema::{ELECTION_SUFFIX as SUFFIX, NAMESPACE, election_name};

/// Holder/waiter metadata key: the candidate's `--value`.
pub const META_VALUE: &str = "value";

/// Holder/waiter metadata key: the candidate's `--priority` (absent: 0).
pub const META_PRIORITY: &str = "priority";

/// The highest `--priority` a candidate may give.
pub const MAX_PRIORITY: u32 = 1_000_000;

/// The priority a candidate announced in its metadata (absent or unreadable: 0).
pub fn priority_of(metadata: &std::collections::HashMap<String, String>) -> u32 {
    metadata
        .get(META_PRIORITY)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The waiting candidate a leader of priority `mine` hands over to: the first in queue order
/// among those of the highest priority, if that is above `mine`.
///
/// ```
/// use conch_client::elect::{META_PRIORITY, preferred};
/// use conch_client::proto::conch::SemaphoreWaiter;
///
/// let waiter = |id: &str, p: &str| SemaphoreWaiter {
///     lease_id: id.into(),
///     metadata: [(META_PRIORITY.to_string(), p.to_string())].into(),
///     ..Default::default()
/// };
/// let queue = [waiter("a", "1"), waiter("b", "5"), waiter("c", "5")];
/// assert_eq!(preferred(&queue, 0).map(|w| w.lease_id.as_str()), Some("b"));
/// assert!(preferred(&queue, 5).is_none());
/// ```
pub fn preferred(waiters: &[SemaphoreWaiter], mine: u32) -> Option<&SemaphoreWaiter> {
    let mut best: Option<(&SemaphoreWaiter, u32)> = None;
    for w in waiters {
        let p = priority_of(&w.metadata);
        if p > mine && best.is_none_or(|(_, b)| p > b) {
            best = Some((w, p));
        }
    }
    best.map(|(w, _)| w)
}

/// The semaphore of election `name`: `<name>.elect`.
///
/// ```
/// use conch_client::elect::semaphore_name;
///
/// assert_eq!(semaphore_name("billing-cron").unwrap(), "billing-cron.elect");
/// assert!(semaphore_name("bad name").is_err());
/// ```
pub fn semaphore_name(name: &str) -> std::result::Result<String, String> {
    validate_name("election name", name)?;
    let full = format!("{name}{SUFFIX}");
    if full.len() > MAX_NAME_LEN {
        return Err(format!(
            "election name {name:?} is too long: the semaphore name {full:?} must fit in {MAX_NAME_LEN} characters"
        ));
    }
    Ok(full)
}

/// The holders of a semaphore after a [`Client::wait_holder_change`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HolderChange {
    /// In grant order; empty when nobody holds.
    pub holders: Vec<SemaphoreHolder>,
    /// Whether the semaphore exists.
    pub exists: bool,
    /// How the holder the call knew of went, when the answering node saw it go during the
    /// call ([`HolderEnd::Unknown`] otherwise).
    pub known_ended: HolderEnd,
    /// With [`HolderEnd::RevokedByAdmin`]: the administrator's reason (may be empty).
    pub known_ended_reason: String,
}

impl HolderChange {
    /// The fencing token of the first holder (the leader of an election); 0: nobody.
    pub fn token(&self) -> u64 {
        self.holders.first().map_or(0, |h| h.fencing_token)
    }
}

impl Client {
    /// Waits on the server until the first holder of `namespace/name` is no longer the grant
    /// `known_token` (0: nobody), or `wait` passes (the server cuts it to 60 s), and returns the
    /// holders then. `wait` zero answers at once. Fails over between endpoints like every call;
    /// the answer is never older than the call.
    pub async fn wait_holder_change(
        &self,
        namespace: &str,
        name: &str,
        known_token: u64,
        wait: Duration,
    ) -> Result<HolderChange> {
        const OP: &str = "wait for a holder change";
        let req = WaitHolderChangeRequest {
            namespace_name: namespace.to_string(),
            semaphore_name: name.to_string(),
            known_token,
            timeout_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        };
        let defaults = self.default_options();
        // Each attempt may take the whole wait, plus the usual deadline for the answer.
        let opts = CallOptions {
            timeout: defaults.timeout + wait,
            retry_for: defaults.retry_for,
        };
        let resp = self
            .unary(OP, opts, req, |ch, r| async move {
                ConchApiClient::new(ch).wait_holder_change(r).await
            })
            .await?;
        Ok(HolderChange {
            known_ended: HolderEnd::try_from(resp.known_holder_end).unwrap_or(HolderEnd::Unknown),
            known_ended_reason: resp.known_holder_end_reason,
            holders: resp.holders,
            exists: resp.exists,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sema::semaphore_kind;

    fn waiter(id: &str, priority: Option<&str>) -> SemaphoreWaiter {
        SemaphoreWaiter {
            lease_id: id.into(),
            metadata: priority
                .map(|p| (META_PRIORITY.to_string(), p.to_string()))
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_strictly_higher_priority_is_preferred_first_come_among_equals() {
        let id = |w: Option<&SemaphoreWaiter>| w.map(|w| w.lease_id.clone());
        let queue = [
            waiter("none", None),
            waiter("bad", Some("high")),
            waiter("two", Some("2")),
            waiter("seven", Some("7")),
            waiter("seven-later", Some("7")),
        ];
        assert_eq!(id(preferred(&queue, 0)), Some("seven".into()));
        assert_eq!(id(preferred(&queue, 6)), Some("seven".into()));
        assert_eq!(id(preferred(&queue, 7)), None, "equals never hand over");
        assert_eq!(id(preferred(&queue[..3], 1)), Some("two".into()));
        assert_eq!(id(preferred(&queue[..2], 0)), None, "no number counts as 0");
        assert_eq!(id(preferred(&[], 0)), None);
    }

    #[test]
    fn election_names_never_look_like_sema_ones() {
        for name in ["5", "x.2", "a.1.host-b", "elect"] {
            let sem = semaphore_name(name).unwrap();
            assert_eq!(semaphore_kind(&sem), None, "{sem}");
            assert_eq!(election_name(&sem), Some(name));
        }
        assert_eq!(election_name("x.2"), None);
        assert_eq!(election_name(".elect"), None);
        assert!(semaphore_name(&"n".repeat(122)).is_ok());
        assert!(
            semaphore_name(&"n".repeat(124))
                .unwrap_err()
                .contains("too long")
        );
        assert!(semaphore_name("").is_err());
    }
}

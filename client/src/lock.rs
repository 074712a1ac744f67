//! Hierarchical read/write locks: [`Client::acquire_lock`] and the other lock calls, and how
//! `conch lock` reads what it sees.
//!
//! A lock is a `/`-separated path (`db/orders/2026`) in a namespace, held shared or exclusive
//! through a *lock lease* ([`Client::create_lock_lease`]; a semaphore lease cannot hold locks).
//! An exclusive hold conflicts with every hold of another lease on the same path, its
//! ancestors (`db`, `db/orders`) and its descendants (`db/orders/2026/01`); a shared hold only
//! with exclusive ones there. Blocked acquires wait in one FIFO queue per namespace, and every
//! grant carries a fencing token, strictly increasing per path.
//!
//! The wait is the semaphores' ([`crate::acquire`]): chained overlapping RPCs with one request
//! id, so it keeps its place across RPC timeouts and node failover. A wait that ends without
//! the lock says why ([`Blocked`]): the contention reason and the paths that block it.
//!
//! A hold can also end without the lease ending: `DeleteLock` drops every hold on a path.
//! [`holds`] tells whether a lock as read still has a given grant.

use std::collections::HashMap;
use std::time::Duration;

use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::{ListLockWaitersRequest, LockWaiter};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::{
    AcquireLockRequest, ContentionReason, DeleteLockRequest, GetLockRequest, ListLocksRequest,
    Lock, LockHolder, LockState, ReleaseLockRequest,
};

use crate::acquire::{Guard, Held, Waited};
use crate::client::{Client, PAGE_LIMIT, all_pages, missing};
use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseKind};

/// Longest lock path the server accepts.
pub const MAX_PATH_LEN: usize = 256;

/// Checks a lock path: 1–256 characters of `[-_.0-9a-zA-Z/]`, no empty segment (no leading,
/// trailing or doubled `/`).
///
/// ```
/// use conch_client::lock::validate_path;
///
/// assert!(validate_path("db/orders/2026").is_ok());
/// assert!(validate_path("db//orders").is_err());
/// assert!(validate_path("db orders").is_err());
/// ```
pub fn validate_path(path: &str) -> std::result::Result<(), String> {
    if path.is_empty() {
        return Err("lock path must not be empty".to_string());
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
    {
        return Err(format!(
            "lock path {path:?} contains {c:?}; use only letters, digits, '-', '_', '.' and '/'"
        ));
    }
    if path.split('/').any(str::is_empty) {
        return Err(format!(
            "lock path {path:?} has an empty segment: no leading, trailing or doubled '/'"
        ));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(format!(
            "lock path {path:?} is {} characters long; at most {MAX_PATH_LEN} are allowed",
            path.len()
        ));
    }
    Ok(())
}

/// How `other` relates to `path`: the same lock, an ancestor, a descendant, or unrelated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// The same path.
    Same,
    /// `other` is an ancestor of `path` (`a` of `a/b`).
    Ancestor,
    /// `other` is a descendant of `path` (`a/b` of `a`).
    Descendant,
    /// Siblings or unrelated paths: never in conflict.
    Unrelated,
}

/// How `other` relates to `path` (see [`Relation`]).
///
/// ```
/// use conch_client::lock::{Relation, relation};
///
/// assert_eq!(relation("a/b", "a"), Relation::Ancestor);
/// assert_eq!(relation("a", "a/b"), Relation::Descendant);
/// assert_eq!(relation("a/b", "a/bc"), Relation::Unrelated);
/// ```
pub fn relation(path: &str, other: &str) -> Relation {
    let under = |long: &str, short: &str| {
        long.len() > short.len() && long.starts_with(short) && long.as_bytes()[short.len()] == b'/'
    };
    if path == other {
        Relation::Same
    } else if under(path, other) {
        Relation::Ancestor
    } else if under(other, path) {
        Relation::Descendant
    } else {
        Relation::Unrelated
    }
}

/// Why a lock acquire did not get the lock, as the server said in its last answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    /// Where the conflict is: a hold (or an earlier queued acquire) on the path itself
    /// ([`ContentionReason::Peer`]), on an ancestor, or on a descendant.
    pub reason: ContentionReason,
    /// The held locks on other paths that conflict (ancestors, then descendants; at most 50).
    pub blocking: Vec<Lock>,
    /// The lock itself, as the answer showed it.
    pub lock: Option<Lock>,
}

impl Blocked {
    /// One line on what blocks: `held exclusive by node2 pid 4242 rev 17`,
    /// `a descendant a/b (held exclusive by …)`, `an acquire queued before it on an ancestor`.
    pub fn describe(&self) -> String {
        let holders = |lock: &Lock| {
            let hs: Vec<String> = lock.lock_holders.iter().map(describe_holder).collect();
            if hs.is_empty() {
                String::new()
            } else {
                format!(" by {}", hs.join(", "))
            }
        };
        let mode = |lock: &Lock| match LockState::try_from(lock.state) {
            Ok(LockState::ExclusiveLocked) => "exclusive",
            Ok(LockState::SharedLocked) => "shared",
            _ => "",
        };
        let held_on_paths = |kind: &str| {
            let parts: Vec<String> = self
                .blocking
                .iter()
                .map(|l| format!("{} (held {}{})", l.name, mode(l), holders(l)))
                .collect();
            if parts.is_empty() {
                // No hold on another path: an acquire queued before this one is in the way.
                format!("an acquire queued before it on {kind}")
            } else {
                format!("{kind} {}", parts.join(", "))
            }
        };
        match self.reason {
            ContentionReason::Peer => match &self.lock {
                Some(l) if !l.lock_holders.is_empty() => {
                    format!("held {}{}", mode(l), holders(l))
                }
                _ => "an acquire queued before it on the same path".to_string(),
            },
            ContentionReason::Ancestor => held_on_paths("an ancestor"),
            ContentionReason::Descendant => held_on_paths("a descendant"),
            ContentionReason::Unspecified => "not granted".to_string(),
        }
    }

    /// The reason in one word: `peer`, `ancestor`, `descendant` (`unspecified` otherwise).
    pub fn reason_word(&self) -> &'static str {
        reason_word(self.reason)
    }
}

/// `peer`, `ancestor`, `descendant` or `unspecified`.
pub fn reason_word(reason: ContentionReason) -> &'static str {
    match reason {
        ContentionReason::Peer => "peer",
        ContentionReason::Ancestor => "ancestor",
        ContentionReason::Descendant => "descendant",
        ContentionReason::Unspecified => "unspecified",
    }
}

/// `node2 pid 4242 rev 17` from a holder's metadata (as `conch lock` sets it), or its lease.
pub fn describe_holder(h: &LockHolder) -> String {
    use crate::sema::{META_HOST, META_PID};
    let who = match (h.metadata.get(META_HOST), h.metadata.get(META_PID)) {
        (Some(host), Some(pid)) => format!("{host} pid {pid}"),
        (Some(host), None) => host.clone(),
        _ if !h.lease_id.is_empty() => format!("lease {}", h.lease_id),
        _ => "another lease".to_string(),
    };
    format!("{who} rev {}", h.fencing_token)
}

/// What an acquire of a lock came to.
#[derive(Debug)]
pub enum LockOutcome {
    /// Held; the guard has the fencing token.
    Acquired(Guard),
    /// Not held: the wait ran out (or, without a wait, the lock was busy).
    Blocked(Blocked),
}

/// Whether `lock` (as read) still has the grant with `fencing_token`: the hold is gone once the
/// lease lost it, released it, or `DeleteLock` dropped it.
pub fn holds(lock: &Lock, fencing_token: u64) -> bool {
    lock.lock_holders
        .iter()
        .any(|h| h.fencing_token == fencing_token)
}

/// The held locks among `locks` that an acquire of `path` (`exclusive` or shared) by
/// `lease_id` conflicts with, and the first reason: the path itself, then ancestors, then
/// descendants. Holds of `lease_id` itself never conflict.
pub fn conflicts<'a>(
    path: &str,
    exclusive: bool,
    lease_id: &str,
    locks: &'a [Lock],
) -> (ContentionReason, Vec<&'a Lock>) {
    let conflicting = |l: &Lock| {
        l.lock_holders
            .iter()
            .any(|h| (lease_id.is_empty() || h.lease_id != lease_id) && (exclusive || h.exclusive))
    };
    let mut found: Vec<(Relation, &Lock)> = locks
        .iter()
        .map(|l| (relation(path, &l.name), l))
        .filter(|(r, l)| *r != Relation::Unrelated && conflicting(l))
        .collect();
    let rank = |r: Relation| match r {
        Relation::Same => 0,
        Relation::Ancestor => 1,
        _ => 2,
    };
    found.sort_by(|a, b| rank(a.0).cmp(&rank(b.0)).then(a.1.name.cmp(&b.1.name)));
    let reason = match found.first().map(|(r, _)| *r) {
        Some(Relation::Same) => ContentionReason::Peer,
        Some(Relation::Ancestor) => ContentionReason::Ancestor,
        Some(Relation::Descendant) => ContentionReason::Descendant,
        _ => ContentionReason::Unspecified,
    };
    (reason, found.into_iter().map(|(_, l)| l).collect())
}

impl Client {
    /// Acquires lock `path` for `lease` (a lock lease), shared or `exclusive`, waiting up to
    /// `wait` (`None`: until granted; `Some(Duration::ZERO)`: only if free now).
    ///
    /// The wait keeps its place in the namespace's FIFO queue across RPC timeouts and node
    /// failover, like [`Client::acquire`]. A lease that already holds `path` gets it again at
    /// once in the same or a weaker mode (a new fencing token); shared to exclusive is an
    /// upgrade that queues. Fails with [`Error::LeaseLost`] if the lease is lost while waiting,
    /// [`Error::NotFound`] if the lease or namespace is gone, and [`Error::InvalidArgument`]
    /// for a semaphore lease or a bad path.
    ///
    /// ```no_run
    /// # async fn demo(client: conch_client::Client) -> Result<(), conch_client::Error> {
    /// use std::collections::HashMap;
    /// use std::time::Duration;
    /// use conch_client::lock::LockOutcome;
    ///
    /// let lease = client
    ///     .create_lock_lease("jobs", "worker-1", Duration::from_secs(10), HashMap::new())
    ///     .await?;
    /// let wait = Some(Duration::from_secs(30));
    /// match client.acquire_lock(&lease, "jobs", "db/orders", true, wait, HashMap::new()).await? {
    ///     LockOutcome::Acquired(guard) => {
    ///         println!("fencing token {}", guard.fencing_token());
    ///         guard.release().await?;
    ///     }
    ///     LockOutcome::Blocked(why) => println!("busy: {}", why.describe()),
    /// }
    /// lease.revoke().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_lock(
        &self,
        lease: &Lease,
        namespace: &str,
        path: &str,
        exclusive: bool,
        wait: Option<Duration>,
        metadata: HashMap<String, String>,
    ) -> Result<LockOutcome> {
        const OP: &str = "acquire lock";
        if lease.kind() != LeaseKind::Lock {
            return Err(Error::InvalidArgument {
                op: OP,
                message: format!(
                    "lease {} is a {}; locks are held with a lock lease (create_lock_lease)",
                    lease.id(),
                    lease.kind().describe()
                ),
            });
        }
        validate_path(path).map_err(|message| Error::InvalidArgument { op: OP, message })?;
        let base = AcquireLockRequest {
            namespace_name: namespace.to_string(),
            lock_name: path.to_string(),
            exclusive,
            lease_id: lease.id().to_string(),
            timeout_seconds: 0,
            metadata,
            timeout_ms: 0,
        };
        Ok(match self.wait_grant(lease, base, wait).await? {
            Waited::Granted(reply, _) => LockOutcome::Acquired(self.guard(
                lease,
                namespace,
                Held::Lock {
                    path: path.to_string(),
                    exclusive,
                },
                reply.fencing_token,
            )),
            Waited::NotGranted(reply) => LockOutcome::Blocked(Blocked {
                reason: ContentionReason::try_from(reply.reason)
                    .unwrap_or(ContentionReason::Unspecified),
                blocking: reply.blocking_locks,
                lock: reply.lock,
            }),
        })
    }

    /// Releases what `lease_id` holds of lock `path` (and a queued acquire of it); returns the
    /// lock as it is after.
    pub async fn release_lock(&self, namespace: &str, path: &str, lease_id: &str) -> Result<Lock> {
        const OP: &str = "release lock";
        let req = ReleaseLockRequest {
            namespace_name: namespace.to_string(),
            lock_name: path.to_string(),
            lease_id: lease_id.to_string(),
        };
        let resp = self
            .unary_once(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).release_lock(r).await
            })
            .await?;
        resp.lock.ok_or_else(|| missing(OP, "lock"))
    }

    /// Reads lock `path`: its state and holders (unlocked, with no holders, if nobody holds
    /// it).
    pub async fn get_lock(&self, namespace: &str, path: &str) -> Result<Lock> {
        const OP: &str = "get lock";
        let req = GetLockRequest {
            namespace_name: namespace.to_string(),
            lock_name: path.to_string(),
        };
        let resp = self
            .unary(OP, self.default_options(), req, |ch, r| async move {
                GrackleApiClient::new(ch).get_lock(r).await
            })
            .await?;
        resp.lock.ok_or_else(|| missing(OP, "lock"))
    }

    /// Drops every hold on lock `path` (needs write permission); acquires queued for it stay
    /// queued and are granted in turn. Holders are not told: they find out by reading the lock.
    pub async fn delete_lock(&self, namespace: &str, path: &str) -> Result<()> {
        const OP: &str = "delete lock";
        let req = DeleteLockRequest {
            namespace_name: namespace.to_string(),
            lock_name: path.to_string(),
        };
        self.unary_once(OP, self.default_options(), req, |ch, r| async move {
            GrackleApiClient::new(ch).delete_lock(r).await
        })
        .await?;
        Ok(())
    }

    /// Every held lock of a namespace, in path order (all pages).
    pub async fn list_locks(&self, namespace: &str) -> Result<Vec<Lock>> {
        const OP: &str = "list locks";
        all_pages(async |pagination_token| {
            let req = ListLocksRequest {
                namespace_name: namespace.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    GrackleApiClient::new(ch).list_locks(r).await
                })
                .await?;
            Ok((resp.locks, resp.next_pagination_token))
        })
        .await
    }

    /// The queued acquires of `path`, its ancestors and its descendants (empty `path`: of the
    /// whole namespace), in queue order (all pages). Each has its place in the namespace's one
    /// queue (`position`, 0 = oldest).
    pub async fn list_lock_waiters(&self, namespace: &str, path: &str) -> Result<Vec<LockWaiter>> {
        const OP: &str = "list lock waiters";
        all_pages(async |pagination_token| {
            let req = ListLockWaitersRequest {
                namespace_name: namespace.to_string(),
                lock_name: path.to_string(),
                pagination_token,
                limit: PAGE_LIMIT,
            };
            let resp = self
                .unary(OP, self.default_options(), req, |ch, r| async move {
                    ConchApiClient::new(ch).list_lock_waiters(r).await
                })
                .await?;
            Ok((resp.waiters, resp.next_pagination_token))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(lease: &str, exclusive: bool, token: u64) -> LockHolder {
        LockHolder {
            lease_id: lease.into(),
            exclusive,
            fencing_token: token,
            ..Default::default()
        }
    }

    fn lock(name: &str, holders: Vec<LockHolder>) -> Lock {
        let state = if holders.iter().any(|h| h.exclusive) {
            LockState::ExclusiveLocked
        } else if holders.is_empty() {
            LockState::Unlocked
        } else {
            LockState::SharedLocked
        };
        Lock {
            name: name.into(),
            state: state as i32,
            lock_holders: holders,
            ..Default::default()
        }
    }

    #[test]
    fn paths_are_checked_with_a_reason() {
        assert!(validate_path("a").is_ok());
        assert!(validate_path("a-b_c.d/e/F9").is_ok());
        assert!(validate_path("").unwrap_err().contains("empty"));
        assert!(validate_path("a b").unwrap_err().contains("' '"));
        for bad in ["/a", "a/", "a//b"] {
            assert!(
                validate_path(bad).unwrap_err().contains("empty segment"),
                "{bad}"
            );
        }
        assert!(validate_path(&"x".repeat(256)).is_ok());
        assert!(
            validate_path(&"x".repeat(257))
                .unwrap_err()
                .contains("at most 256")
        );
    }

    #[test]
    fn relations_follow_path_segments_not_prefixes() {
        assert_eq!(relation("a/b", "a/b"), Relation::Same);
        assert_eq!(relation("a/b/c", "a"), Relation::Ancestor);
        assert_eq!(relation("a/b/c", "a/b"), Relation::Ancestor);
        assert_eq!(relation("a", "a/b/c"), Relation::Descendant);
        assert_eq!(relation("a/b", "a/c"), Relation::Unrelated);
        assert_eq!(relation("a", "ab"), Relation::Unrelated);
        assert_eq!(relation("ab/c", "a"), Relation::Unrelated);
    }

    #[test]
    fn conflicts_name_the_reason_and_the_paths_in_order() {
        let locks = vec![
            lock("a", vec![holder("ls_1", false, 3)]),
            lock("a/b/c", vec![holder("ls_2", true, 5)]),
            lock("a/b/d", vec![holder("ls_3", false, 6)]),
            lock("x", vec![holder("ls_4", true, 7)]),
        ];
        // Exclusive on a/b: the shared ancestor and both descendants are in the way.
        let (reason, paths) = conflicts("a/b", true, "ls_9", &locks);
        assert_eq!(reason, ContentionReason::Ancestor);
        let names: Vec<&str> = paths.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["a", "a/b/c", "a/b/d"]);
        // Shared on a/b: only the exclusive descendant.
        let (reason, paths) = conflicts("a/b", false, "ls_9", &locks);
        assert_eq!(reason, ContentionReason::Descendant);
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].name, "a/b/c");
        // The lease's own holds never conflict; unrelated paths never do.
        let (reason, paths) = conflicts("x", true, "ls_4", &locks);
        assert_eq!((reason, paths.len()), (ContentionReason::Unspecified, 0));
        let (reason, _) = conflicts("x", false, "ls_9", &locks);
        assert_eq!(reason, ContentionReason::Peer);
        let (reason, paths) = conflicts("y", true, "", &locks);
        assert_eq!((reason, paths.len()), (ContentionReason::Unspecified, 0));
    }

    #[test]
    fn a_hold_is_known_by_its_fencing_token() {
        let l = lock("a", vec![holder("ls_1", true, 17)]);
        assert!(holds(&l, 17));
        assert!(!holds(&l, 18));
        assert!(!holds(&lock("a", vec![]), 17));
    }

    #[test]
    fn blocked_reads_as_one_line() {
        let mut meta = HashMap::new();
        meta.insert("host".to_string(), "node2".to_string());
        meta.insert("pid".to_string(), "4242".to_string());
        let h = LockHolder {
            metadata: meta,
            ..holder("ls_2", true, 17)
        };
        let peer = Blocked {
            reason: ContentionReason::Peer,
            blocking: vec![],
            lock: Some(lock("a", vec![h.clone()])),
        };
        assert_eq!(peer.describe(), "held exclusive by node2 pid 4242 rev 17");
        assert_eq!(peer.reason_word(), "peer");
        let below = Blocked {
            reason: ContentionReason::Descendant,
            blocking: vec![lock("a/b", vec![h])],
            lock: Some(lock("a", vec![])),
        };
        assert_eq!(
            below.describe(),
            "a descendant a/b (held exclusive by node2 pid 4242 rev 17)"
        );
        let queued = Blocked {
            reason: ContentionReason::Ancestor,
            blocking: vec![],
            lock: None,
        };
        assert_eq!(
            queued.describe(),
            "an acquire queued before it on an ancestor"
        );
    }
}

//! What comes out of a command: its reply (an outcome or an error that changed nothing), and
//! the events that tell waiting callers their wait ended.

use serde::{Deserialize, Serialize};

use super::*;

/// What a command answers: a value, or an error that changed nothing.
pub(crate) type Reply = Result<Outcome, Error>;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Namespace(NamespaceView),
    Semaphore(SemaphoreView),
    Lease(LeaseView),
    Acquire(AcquireReply),
    GiveUp(GiveUpReply),
    Lock(LockView),
    AcquireLock(AcquireLockReply),
    /// Deletes, revokes, expiry and lease extension.
    Done,
    Role(RoleView),
    Token(TokenView),
    AuthStatus(AuthStatusView),
    Quotas(QuotaView),
    /// The state's budget and its stored bytes, after `SetBudget`.
    Budget {
        budget_bytes: u64,
        state_bytes: u64,
    },
    WaitGroup(WaitGroupView),
    Barrier(BarrierReply),
    /// The record `RevokeHolder` made.
    Audit(super::super::audit_types::AuditRecord),
    /// After `AcquireSet`.
    AcquireSet(AcquireSetReply),
}

/// What a [`Cmd::AcquireSet`] answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireSetReply {
    pub status: AcquireSetStatus,
    /// The members' semaphore names, in the order of the command.
    pub members: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireSetStatus {
    /// The lease holds every member: one grant per member, in the order of the command.
    Acquired { grants: Vec<SetGrant> },
    /// The set waits, as one entry in every member's queue, until `deadline_ns` on the lease
    /// clock.
    Queued { deadline_ns: Nanos },
    /// Non-blocking and not grantable now: the lease holds none of the members.
    Unavailable,
}

/// One member's grant: as [`AcquireStatus::Acquired`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetGrant {
    pub token: u64,
    pub hold_ns: Nanos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireReply {
    pub status: AcquireStatus,
    /// The semaphore after the command.
    pub semaphore: SemaphoreView,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireStatus {
    /// The lease holds the permits; `token` is the grant's fencing token. `hold_ns` is how
    /// long the hold may still last on the lease clock when this reply was made, at most (0: no
    /// hold limit); a caller that sent the command at `t` on its own monotonic clock must be
    /// done by `t + hold_ns`.
    Acquired { token: u64, hold_ns: Nanos },
    /// The lease waits in the queue until `deadline_ns` on the lease clock (possibly extended
    /// by a re-attach).
    Queued { deadline_ns: Nanos },
    /// Non-blocking and not grantable now.
    Unavailable,
}

/// Which calls a lease serves: Grackle keeps semaphore leases and lock leases apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LeaseKind {
    #[default]
    Semaphore,
    Lock,
}

impl LeaseKind {
    /// How messages name a lease of this kind.
    pub fn noun(self) -> &'static str {
        match self {
            LeaseKind::Semaphore => "lease",
            LeaseKind::Lock => "lock lease",
        }
    }
}

/// What a queued acquire waits for, as [`Event`]s, [`Cmd::GiveUp`] and the waiting callers name
/// it: a semaphore's name, or [`LOCK_OBJECT_PREFIX`] and a lock's path. The prefix holds a
/// character no semaphore name may contain, so the two never meet.
pub(crate) const LOCK_OBJECT_PREFIX: &str = "lock:";

/// The wait object of lock `path`.
pub(crate) fn lock_object(path: &str) -> String {
    format!("{LOCK_OBJECT_PREFIX}{path}")
}

/// The lock path of a wait object, if it names a lock.
pub(crate) fn lock_path(object: &str) -> Option<&str> {
    object.strip_prefix(LOCK_OBJECT_PREFIX)
}

/// Why an acquire of a lock could not be granted now, by where the conflict is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Contention {
    /// Granted: nothing stood in the way.
    #[default]
    None,
    /// The path itself is held (or queued for) in a conflicting mode.
    Peer,
    /// An ancestor path is.
    Ancestor,
    /// A descendant path is.
    Descendant,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolderView {
    pub lease_id: String,
    pub exclusive: bool,
    pub locked_at: Nanos,
    pub metadata: Metadata,
    /// The grant's fencing token: strictly increasing per path (they come from the state's one
    /// token counter).
    pub token: u64,
    /// As [`HolderView::owner`].
    pub owner: Option<u64>,
}

/// A lock: held (shared by one or more leases, or exclusive by one) or, with no holders,
/// unlocked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockView {
    pub name: String,
    /// `None`: unlocked; `Some(true)`: held exclusive; `Some(false)`: held shared.
    pub exclusive: Option<bool>,
    /// When the current holders' earliest grant was made (0 when unlocked).
    pub locked_at: Nanos,
    /// In grant order.
    pub holders: Vec<LockHolderView>,
    /// The latest acquire attempt while the lock was held (0 when unlocked).
    pub last_activity_at: Nanos,
    /// Acquires queued for exactly this path.
    pub waiters: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireLockReply {
    pub status: AcquireStatus,
    /// The lock after the command.
    pub lock: LockView,
    /// When not acquired: where the first conflict is.
    pub reason: Contention,
    /// When not acquired: the held locks on other paths (ancestors or descendants) that
    /// conflict, at most [`BLOCKING_LOCKS_MAX`](super::limits::BLOCKING_LOCKS_MAX).
    pub blocking: Vec<LockView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockWaiterView {
    pub lease_id: String,
    pub path: String,
    pub exclusive: bool,
    pub queued_at: Nanos,
    /// On the lease clock.
    pub deadline_ns: Nanos,
    pub metadata: Metadata,
    /// 0 = the oldest queued lock acquire of the namespace.
    pub position: u64,
    pub owner: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GiveUpReply {
    /// The grant committed before the give-up: the lease holds the permits, for at most
    /// `hold_ns` more (0: no hold limit; as [`AcquireStatus::Acquired`]'s).
    Granted { token: u64, hold_ns: Nanos },
    /// The waiter left the queue.
    Removed,
    /// The waiter stays: a later acquire re-attached with a later deadline.
    StillQueued { deadline_ns: Nanos },
    /// Neither holding nor queued (lease or semaphore gone, or already timed out).
    NotQueued,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    ResourceExhausted,
    /// The state does not allow it now (e.g. enabling access control without an admin token).
    FailedPrecondition,
    /// Access control is on and the command came without a token, or with an unknown or
    /// revoked one.
    Unauthenticated,
    /// Access control is on and the token's role lacks the permission the command needs.
    PermissionDenied,
}

/// A refused command or read. Messages are lowercase and name the field or thing at fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::InvalidArgument,
            message: message.into(),
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::NotFound,
            message: message.into(),
        }
    }
    pub fn already_exists(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::AlreadyExists,
            message: message.into(),
        }
    }
    pub fn exhausted(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::ResourceExhausted,
            message: message.into(),
        }
    }
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::FailedPrecondition,
            message: message.into(),
        }
    }
}

/// Tells a waiting caller what happened to its place in a queue. Emitted by apply, in log order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Granted {
        ns: String,
        sem: String,
        lease: String,
        token: u64,
        weight: u64,
        /// The hold limit from the grant on (0: none), as [`AcquireStatus::Acquired`]'s.
        hold_ns: Nanos,
    },
    WaitEnded {
        ns: String,
        sem: String,
        lease: String,
        reason: WaitEnd,
    },
    /// A wait group finished or went away, or a barrier tripped or went away: the callers
    /// waiting on it look at it again.
    Synced {
        ns: String,
        kind: SyncKind,
        name: String,
    },
    /// A lease, or one hold of it, ended without its holder releasing it: the holder's
    /// command runs without the slot from here on. Emitted once per lease or hold lost, in the
    /// entry that ended it; a release or give-up by the holder emits none.
    Lost {
        ns: String,
        lease: String,
        /// The semaphore, or the lock object ([`lock_object`]), whose hold ended; empty when
        /// the whole lease ended.
        object: String,
        cause: LossCause,
    },
}

/// One hold of a lease, as a loss watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseHold {
    /// The semaphore's name, or the lock object ([`lock_object`]).
    pub object: String,
    /// The grant's fencing token.
    pub token: u64,
    /// Permits held (semaphores); 1 for a lock.
    pub weight: u64,
    /// Exclusive (locks); false for a semaphore.
    pub exclusive: bool,
}

/// Why a lease or a hold was lost ([`Event::Lost`]). Each maps to a `conch.v1.LossCause` and
/// a reason in `api/watch_loss.rs`; a new way to lose (an administrator's revoke) is a new
/// variant there and here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// The lease's TTL passed without a refresh.
    Expired,
    /// The lease was revoked (`RevokeLease`).
    Revoked,
    /// The hold reached its hold limit.
    HoldLimit,
    /// The semaphore was deleted.
    SemaphoreDeleted,
    /// The lock was deleted (an administrator's forced unlock).
    LockDeleted,
    /// The lease's namespace was deleted.
    NamespaceDeleted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitEnd {
    /// The waiter's deadline passed.
    TimedOut,
    /// The waiting caller gave up (GiveUp) or released.
    GaveUp,
    /// The lease expired or was revoked.
    LeaseGone,
    /// The semaphore or its namespace was deleted.
    SemaphoreGone,
}

/// Why a snapshot could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("encode state snapshot: {0}")]
    Encode(String),
    #[error("decode state snapshot: {0}")]
    Decode(String),
    #[error("state snapshot is inconsistent: {0}")]
    Inconsistent(String),
}

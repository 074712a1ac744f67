//! Commands, replies, events and read views of the semaphore state machine.
//!
//! These are the state machine's whole vocabulary: a [`Batch`] of [`Cmd`]s goes in (one Raft
//! entry), one [`Reply`] per command comes out, and [`Event`]s tell waiting callers that their
//! wait ended. Everything here is plain data: serde for the Raft log and snapshots, no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sync_types::{BarrierCmd, BarrierReply, SyncKind, WaitGroupCmd, WaitGroupView};

/// Free-form string map carried by namespaces, semaphores, leases, holders and waiters.
pub type Metadata = BTreeMap<String, String>;

/// Nanoseconds: on the lease clock (expiry, deadlines) or since the Unix epoch (display times).
pub type Nanos = i64;

pub const NANOS_PER_SEC: i64 = 1_000_000_000;
pub const NANOS_PER_MS: i64 = 1_000_000;

/// One Raft entry: the commands a leader proposed together, with the leader's two stamps.
///
/// `now_ns` is the lease clock: it advances by the leaders' monotonic elapsed time and is what
/// lease expiry, wait deadlines and lingers are measured on. The state machine's clock is
/// `max(previous clock, now_ns)`, so it never runs backwards. `wall_ns` is the leader's wall
/// clock, used only for the times users read (`created_at`, `locked_at`, the displayed
/// `expires_at`); it may jump either way and no decision depends on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Batch {
    pub now_ns: Nanos,
    pub cmds: Vec<Cmd>,
    /// Nanoseconds since the Unix epoch on the leader's wall clock.
    pub wall_ns: Nanos,
}

/// A state-changing command. Reads never go through the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cmd {
    CreateNamespace {
        name: String,
        description: String,
        metadata: Metadata,
    },
    UpdateNamespace {
        name: String,
        description: String,
        metadata: Metadata,
        expected_version: u64,
    },
    /// Deletes the namespace and everything in it; a no-op when absent.
    DeleteNamespace {
        name: String,
    },
    CreateSemaphore {
        ns: String,
        name: String,
        description: String,
        permits: u64,
        metadata: Metadata,
        /// The longest a grant may hold it (0: no limit).
        max_hold_ns: Nanos,
    },
    UpdateSemaphore {
        ns: String,
        name: String,
        description: String,
        permits: u64,
        metadata: Metadata,
        expected_version: u64,
        /// A new hold limit for later grants (0: none); `None` keeps the current one.
        max_hold_ns: Option<Nanos>,
    },
    /// Deletes the semaphore with its holders and waiters.
    DeleteSemaphore {
        ns: String,
        name: String,
    },
    CreateLease {
        ns: String,
        /// Semaphore leases hold semaphores, lock leases hold locks; each kind's calls see only
        /// leases of that kind.
        kind: LeaseKind,
        process_id: String,
        ttl_s: u64,
        metadata: Metadata,
        /// 64 random bits drawn by the node that took the request: the lease id's secret part,
        /// so that ids cannot be guessed. The state draws no randomness itself.
        secret: u64,
    },
    /// Extends the lease to `now + ttl` (`ttl_s` 0 means the lease's own TTL).
    RefreshLease {
        ns: String,
        kind: LeaseKind,
        lease: String,
        ttl_s: u64,
    },
    RevokeLease {
        ns: String,
        kind: LeaseKind,
        lease: String,
    },
    /// `wait_ns` 0 is a non-blocking acquire; otherwise the lease queues for up to `wait_ns`.
    Acquire {
        ns: String,
        sem: String,
        lease: String,
        weight: u64,
        wait_ns: Nanos,
        metadata: Metadata,
        /// The longest this grant may hold (0: the semaphore's limit alone); the smaller of
        /// this and the semaphore's wins.
        max_hold_ns: Nanos,
    },
    /// Releases the lease's hold (and its place in the queue, if any).
    Release {
        ns: String,
        sem: String,
        lease: String,
    },
    /// The caller waiting with `deadline_ns` gives up. Nothing happens if a later acquire
    /// re-attached with a later deadline. Otherwise, with `linger_ns` 0 the waiter leaves the
    /// queue now; with `linger_ns` > 0 (the caller went away without saying so, e.g. its
    /// connection broke) the waiter keeps its place for at most `linger_ns` more, so a caller
    /// that re-attaches through another connection soon keeps its position.
    GiveUp {
        ns: String,
        sem: String,
        lease: String,
        deadline_ns: Nanos,
        linger_ns: Nanos,
    },
    /// A lock lease takes lock `path` shared or exclusive. `wait_ns` 0 is non-blocking;
    /// otherwise a conflicting acquire queues for up to `wait_ns` (see `locks.rs` for the
    /// order in which queued acquires are granted).
    AcquireLock {
        ns: String,
        path: String,
        lease: String,
        exclusive: bool,
        wait_ns: Nanos,
        metadata: Metadata,
    },
    /// Releases the lease's hold on `path` (and its queued acquire of it, if any).
    ReleaseLock {
        ns: String,
        path: String,
        lease: String,
    },
    /// Drops every hold on `path` (an administrator's forced unlock); queued acquires stay.
    DeleteLock {
        ns: String,
        path: String,
    },
    /// Reaps leases and waiters that are due at the batch's time.
    Expire,
    /// Proposed first by a new leader: every lease lives at least its TTL from now.
    ExtendLeases,
    /// A client write carrying the caller's request id: the first time, `cmd` runs and its
    /// reply is remembered under the id; a repeat of the id (a retry) gets that reply back and
    /// changes nothing. See `state/once.rs`.
    Once {
        request_id: String,
        cmd: Box<Cmd>,
    },
    /// Access control (see `auth`): turn checks on (needs a cluster-admin token) or off.
    AuthEnable,
    AuthDisable,
    RoleCreate {
        name: String,
        cluster_admin: bool,
    },
    /// Sets the role's permission on a namespace (`*`: every namespace).
    RoleGrant {
        role: String,
        ns: String,
        perm: Permission,
    },
    /// Removes the role's permission on a namespace (a no-op when it has none).
    RoleRevoke {
        role: String,
        ns: String,
    },
    RoleDelete {
        name: String,
    },
    /// A token for `role`; only its SHA-256 is replicated.
    TokenCreate {
        name: String,
        role: String,
        hash: TokenHash,
    },
    TokenRevoke {
        id: String,
    },
    /// Installs the bootstrap admin token and turns access control on, at most once.
    AuthBootstrap {
        hash: TokenHash,
    },
    /// A client's command with the token it was sent with (its SHA-256). While access control
    /// is on, the state checks the token's rights against `cmd` before running it, so what
    /// decides is the auth store at this point of the log, not the one a node had applied when
    /// it received the call. A client command without this wrapper runs with no token. Inside
    /// `Once` (never around it), around client commands only.
    As {
        token: TokenHash,
        cmd: Box<Cmd>,
    },
    /// Sets a namespace's quotas (cluster admin). Lower than what is in use refuses only
    /// growth.
    SetQuotas {
        ns: String,
        quotas: Quotas,
    },
    /// Sets the budget on the stored bytes of all namespaces together (cluster admin).
    SetBudget {
        bytes: u64,
    },
    /// Wait groups (`waitgroup.rs`).
    WaitGroup(WaitGroupCmd),
    /// Barriers (`barrier.rs`).
    Barrier(BarrierCmd),
    /// An administrator takes a holder's slot and says why: revokes the whole lease `lease` of
    /// `kind` (every hold and wait of it, as `RevokeLease`), which must hold or wait for
    /// `object` (a semaphore's name, or a lock's path), grants the next waiters in the same
    /// entry, and records it in the audit trail (`audit.rs`). Needs admin on the namespace.
    RevokeHolder {
        ns: String,
        kind: LeaseKind,
        object: String,
        lease: String,
        reason: String,
    },
    /// All or none: the lease takes every member of `members` (2 to
    /// [`SET_MEMBERS_MAX`](super::limits::SET_MEMBERS_MAX) distinct semaphores, each with its
    /// weight) in one grant, or none of them. `wait_ns` 0 is non-blocking; otherwise the set
    /// queues as one entry in every member's queue for up to `wait_ns` (see `set.rs`). The
    /// first member is the set's primary: waits, give-ups and request ids name the set by it.
    AcquireSet {
        ns: String,
        lease: String,
        members: Vec<SetMember>,
        wait_ns: Nanos,
        metadata: Metadata,
        /// As [`Cmd::Acquire`]'s, for every member.
        max_hold_ns: Nanos,
    },
    /// Raises the cluster version to `version` (see `version.rs`); a version at or below the
    /// current one changes nothing. Proposed only once every member speaks `version`: a node
    /// of 0.1.0 cannot decode this command. New commands go after this one, each behind a gate.
    SetClusterVersion {
        version: u32,
    },
}

/// One member of a [`Cmd::AcquireSet`]: a semaphore and the weight taken of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetMember {
    pub sem: String,
    pub weight: u64,
}

impl Cmd {
    /// The namespace and lease a command uses an existing lease of (refresh, revoke, acquire,
    /// release): the commands only the lease's owner may make.
    pub fn lease_used(&self) -> Option<(&str, &str)> {
        match self {
            Cmd::RefreshLease { ns, lease, .. }
            | Cmd::RevokeLease { ns, lease, .. }
            | Cmd::Acquire { ns, lease, .. }
            | Cmd::Release { ns, lease, .. }
            | Cmd::AcquireLock { ns, lease, .. }
            | Cmd::ReleaseLock { ns, lease, .. }
            | Cmd::AcquireSet { ns, lease, .. } => Some((ns, lease)),
            _ => None,
        }
    }

    /// The namespace a command is about, if it is about one (the remembered request ids of its
    /// writes count against that namespace's quota).
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Cmd::CreateNamespace { name, .. }
            | Cmd::UpdateNamespace { name, .. }
            | Cmd::DeleteNamespace { name } => Some(name),
            Cmd::CreateSemaphore { ns, .. }
            | Cmd::UpdateSemaphore { ns, .. }
            | Cmd::DeleteSemaphore { ns, .. }
            | Cmd::CreateLease { ns, .. }
            | Cmd::RefreshLease { ns, .. }
            | Cmd::RevokeLease { ns, .. }
            | Cmd::Acquire { ns, .. }
            | Cmd::Release { ns, .. }
            | Cmd::GiveUp { ns, .. }
            | Cmd::AcquireLock { ns, .. }
            | Cmd::ReleaseLock { ns, .. }
            | Cmd::DeleteLock { ns, .. }
            | Cmd::AcquireSet { ns, .. }
            | Cmd::RevokeHolder { ns, .. }
            | Cmd::SetQuotas { ns, .. } => Some(ns),
            Cmd::WaitGroup(cmd) => Some(cmd.ns()),
            Cmd::Barrier(cmd) => Some(cmd.ns()),
            Cmd::As { cmd, .. } | Cmd::Once { cmd, .. } => cmd.namespace(),
            _ => None,
        }
    }

    /// Whether the command changes who may do what (access control on or off, roles,
    /// tokens): a node checks calls against its own applied copy of these before proposing, so
    /// a node that forwards one answers only once it has applied it itself, and the caller's
    /// next call there is checked against the new rules.
    pub fn changes_access(&self) -> bool {
        match self {
            Cmd::AuthEnable
            | Cmd::AuthDisable
            | Cmd::RoleCreate { .. }
            | Cmd::RoleGrant { .. }
            | Cmd::RoleRevoke { .. }
            | Cmd::RoleDelete { .. }
            | Cmd::TokenCreate { .. }
            | Cmd::TokenRevoke { .. }
            | Cmd::AuthBootstrap { .. } => true,
            Cmd::As { cmd, .. } | Cmd::Once { cmd, .. } => cmd.changes_access(),
            _ => false,
        }
    }

    /// The command inside an [`Cmd::As`], or this one.
    pub fn unwrapped(&self) -> &Cmd {
        match self {
            Cmd::As { cmd, .. } => cmd,
            cmd => cmd,
        }
    }

    /// `self` sent with `token` (no token: unchanged, it runs as an anonymous caller).
    pub fn with_token(self, token: Option<TokenHash>) -> Cmd {
        match token {
            Some(token) => Cmd::As {
                token,
                cmd: Box::new(self),
            },
            None => self,
        }
    }
}

/// What a command answers: a value, or an error that changed nothing.
pub type Reply = Result<Outcome, Error>;

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
    Audit(super::audit_types::AuditRecord),
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
pub const LOCK_OBJECT_PREFIX: &str = "lock:";

/// The wait object of lock `path`.
pub fn lock_object(path: &str) -> String {
    format!("{LOCK_OBJECT_PREFIX}{path}")
}

/// The lock path of a wait object, if it names a lock.
pub fn lock_path(object: &str) -> Option<&str> {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceView {
    pub name: String,
    pub description: String,
    pub metadata: Metadata,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    pub version: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreView {
    pub name: String,
    pub description: String,
    pub metadata: Metadata,
    pub permits: u64,
    pub active_holds: u64,
    pub active_holders_count: u64,
    pub waiters_count: u64,
    pub version: u64,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    pub last_activity_at: Nanos,
    /// The longest a grant may hold it (0: no limit).
    pub max_hold_ns: Nanos,
}

/// A namespace's quotas (see `quota.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    pub semaphores: u64,
    pub leases: u64,
    /// Holders plus waiters over all semaphores and locks of the namespace.
    pub entries: u64,
    /// Stored bytes, by the size model above.
    pub bytes: u64,
    /// Request ids remembered for its writes (`conch-request-id`); past it the namespace's
    /// oldest is forgotten first (a repeat of it then runs again), nothing is refused.
    pub request_ids: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            semaphores: super::limits::DEFAULT_SEMAPHORES,
            leases: super::limits::DEFAULT_LEASES,
            entries: super::limits::DEFAULT_ENTRIES,
            bytes: super::limits::DEFAULT_NAMESPACE_BYTES,
            request_ids: super::limits::DEFAULT_REQUEST_IDS,
        }
    }
}

/// A namespace's quotas and what it uses of them, with the state's budget and stored bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaView {
    pub namespace: String,
    pub quotas: Quotas,
    pub semaphores: u64,
    pub leases: u64,
    pub entries: u64,
    pub bytes: u64,
    pub request_ids: u64,
    pub budget_bytes: u64,
    pub state_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    pub lease_id: String,
    pub process_id: String,
    pub metadata: Metadata,
    pub created_at: Nanos,
    /// For display, on the wall clock: the newest batch's wall stamp plus the time the lease
    /// has left on the lease clock.
    pub expires_at: Nanos,
    pub ttl_s: u64,
    /// The id of the token that created it, if any (see [`Cmd::CreateLease`]).
    pub owner: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderView {
    pub lease_id: String,
    pub weight: u64,
    pub locked_at: Nanos,
    pub metadata: Metadata,
    pub token: u64,
    /// When the hold ends whatever the lease does, on the wall clock (0: no hold limit).
    pub ends_at: Nanos,
    /// How long the hold may still last on the lease clock of the state read (0: no hold
    /// limit; set by [`State::holder`](super::State::holder) only).
    pub hold_left_ns: Nanos,
    /// The token that created the holder's lease (see [`LeaseView::owner`]); the API shows the
    /// lease id only to callers that may see that lease.
    pub owner: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaiterView {
    pub lease_id: String,
    pub weight: u64,
    pub queued_at: Nanos,
    /// On the lease clock (compare with [`State::clock_ns`](super::State::clock_ns)).
    pub deadline_ns: Nanos,
    pub metadata: Metadata,
    /// 0 = head of the queue.
    pub position: u64,
    /// The token that created the waiter's lease, as for [`HolderView::owner`].
    pub owner: Option<u64>,
}

/// A page request: an opaque cursor from a previous page (empty = first page) and a limit
/// (0 means 100; at most 250).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageRequest {
    pub token: String,
    pub limit: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Cursor to the page after this one; empty when this is the last.
    pub next_token: String,
    /// Cursor to the page before this one; empty when this is the first.
    pub previous_token: String,
}

/// Counts over the whole state, for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub namespaces: u64,
    pub semaphores: u64,
    pub leases: u64,
    pub holders: u64,
    pub waiters: u64,
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

/// SHA-256 of a token.
pub type TokenHash = [u8; 32];

/// A permission on a namespace; each includes the ones below it: read < acquire < write <
/// admin. (Declared in the order they were added, which the encoding keeps; [`Ord`] follows
/// [`Permission::rank`].)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Permission {
    /// Get and list.
    Read,
    /// Also: create, update and delete semaphores.
    Write,
    /// Also: create, update and delete the namespace itself.
    Admin,
    /// Also (over read): leases, acquire and release, and creating a semaphore that does not
    /// exist yet; what `conch sema` and `conch elect` need, and nothing that changes what
    /// others hold.
    Acquire,
}

impl Permission {
    /// Its place in the order of inclusion.
    pub fn rank(self) -> u8 {
        match self {
            Permission::Read => 0,
            Permission::Acquire => 1,
            Permission::Write => 2,
            Permission::Admin => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Acquire => "acquire",
            Permission::Write => "write",
            Permission::Admin => "admin",
        }
    }

    pub fn parse(value: &str) -> Result<Permission, Error> {
        match value {
            "read" => Ok(Permission::Read),
            "acquire" => Ok(Permission::Acquire),
            "write" => Ok(Permission::Write),
            "admin" => Ok(Permission::Admin),
            _ => Err(Error::invalid(
                "permission must be one of read, acquire, write, admin",
            )),
        }
    }
}

impl PartialOrd for Permission {
    fn partial_cmp(&self, other: &Permission) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Permission {
    fn cmp(&self, other: &Permission) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleView {
    pub name: String,
    pub cluster_admin: bool,
    /// Namespace (or `*`) -> permission.
    pub grants: BTreeMap<String, Permission>,
    pub created_at: Nanos,
    pub updated_at: Nanos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub role: String,
    pub created_at: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthStatusView {
    pub enabled: bool,
    pub roles: u64,
    pub tokens: u64,
}

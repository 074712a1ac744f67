//! Commands, replies, events and read views of the semaphore state machine.
//!
//! These are the state machine's whole vocabulary: a [`Batch`] of [`Cmd`]s goes in (one Raft
//! entry), one [`Reply`] per command comes out, and [`Event`]s tell waiting callers that their
//! wait ended. Everything here is plain data: serde for the Raft log and snapshots, no I/O.
//!
//! This file holds what goes in (the batch and its commands); `replies.rs` what comes out
//! (replies, errors, events), `views.rs` the read views, `access.rs` access control's
//! vocabulary. All of it is one vocabulary, re-exported here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sync_types::{BarrierCmd, BarrierReply, SyncKind, WaitGroupCmd, WaitGroupView};

mod access;
mod replies;
mod views;

pub(crate) use access::*;
pub(crate) use replies::*;
pub(crate) use views::*;

/// Free-form string map carried by namespaces, semaphores, leases, holders and waiters.
pub(crate) type Metadata = BTreeMap<String, String>;

/// Nanoseconds: on the lease clock (expiry, deadlines) or since the Unix epoch (display times).
pub(crate) type Nanos = i64;

pub(crate) const NANOS_PER_SEC: i64 = 1_000_000_000;
pub(crate) const NANOS_PER_MS: i64 = 1_000_000;

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

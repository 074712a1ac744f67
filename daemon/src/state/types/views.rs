//! The read views of the state: namespaces, semaphores, quotas, leases, holders, waiters, pages
//! and the node's counts.

use serde::{Deserialize, Serialize};

use super::*;

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
            semaphores: super::super::limits::DEFAULT_SEMAPHORES,
            leases: super::super::limits::DEFAULT_LEASES,
            entries: super::super::limits::DEFAULT_ENTRIES,
            bytes: super::super::limits::DEFAULT_NAMESPACE_BYTES,
            request_ids: super::super::limits::DEFAULT_REQUEST_IDS,
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

//! The semaphore state machine: Grackle semantics as a pure, deterministic function of the
//! Raft log.
//!
//! No clock reads, no I/O, no randomness: ids and tokens derive from counters in the state,
//! and time comes from the leader's two stamps on each [`Batch`]: the lease clock (`now_ns`),
//! on which every expiry and deadline is measured, and the wall clock (`wall_ns`), which only
//! the times users read take.
//!
//! The modules, by concept:
//! - `data`: the canonical data and its derived indexes, changed only through methods that keep
//!   every index consistent
//! - `lease_id`: lease ids and the sequence numbers behind them
//! - `queue`: acquire, release, give up, and the one grant path
//! - `set`: all-or-none acquires of several semaphores, one queue entry in every member's queue
//! - `locks` (with `lock_data`, the lock table): hierarchical read/write locks, their queue
//!   and their grants
//! - `apply`: command dispatch, reaping, extending leases, the other commands
//! - `read`: lookups, views and the reads served from the state
//! - `snapshot`: the canonical encoding, the state hash, snapshots
//! - `hash`: FNV-1a 64, the function of the state hash and of the storage checksums
//! - `invariants`: the check of every rule the state keeps (see there for the list)
//! - `requests`: the remembered request ids and their replies, with their own indexes
//! - `once`: running a write with a request id at most once, and settling queued acquires
//! - `audit`: the audit trail of revokes, forced releases, capacity and quota changes
//! - `auth`: access control: roles, token hashes, the enabled flag, and the permission check
//! - `quota`: the namespaces' quotas, the state's byte budget and the size model they count by
//! - `validate`: the checks of single fields; `validate_cmd`: [`Cmd::validate`], of a whole command
//! - `version`: cluster versions, the gates they open and the data format of each
//! - `waitgroup`, `barrier`: wait groups and barriers (their vocabulary in `sync_types`, their
//!   storage in `data/sync.rs`); `sync`: their dispatch, reaping and events
//!
//! # Cost
//!
//! Every command costs O(log n) in the things it touches, plus one step per waiter it grants
//! or removes and per holder it drops. `ExtendLeases` touches every lease, and `DeleteNamespace`
//! everything in the namespace. `hash`, `encode_snapshot` and `check_invariants` are O(state):
//! call them at snapshot points or in tests, not per entry.
//!
//! # Decisions the API layer relies on
//!
//! - Due leases and waiters are reaped before every command (except `ExtendLeases`), even one
//!   that is then refused by validation; a refused command changes nothing else.
//! - `Acquire` answers `Acquired { token }`, `Queued { deadline_ns }` (wait for an [`Event`]
//!   about this (namespace, semaphore, lease)) or `Unavailable`. A re-attach with wait 0 that is
//!   still queued answers `Unavailable` and stays queued.
//! - Re-acquire at most the held weight: granted at once with a new token (the holder moves to
//!   the end of the grant order). More than held: an upgrade that queues like any acquire while
//!   the old hold stays; `Release` drops both the hold and the queued upgrade; `GiveUp` on an
//!   upgrade removes only the upgrade (so it checks "queued" before "holds").
//! - [`Event::Granted`] is emitted for every grant that leaves a queue, including an upgrade
//!   settled by a re-acquire at a lower weight; immediate grants of a non-queued lease emit no
//!   event (the reply carries the token). [`Event::WaitEnded`] is emitted for every other exit
//!   from a queue.
//! - The 1001st holder of a semaphore is `ResourceExhausted` when it would be granted at once
//!   (blocking or not); a queued head that fits but finds no holder slot stays at the head.
//! - `DeleteSemaphore` of an absent semaphore is `Done`; of an absent namespace `NotFound`.
//! - `expected_version` must equal the version; there is no "0 = unconditional".
//! - `RefreshLease` sets `expires_at = clock + ttl` (it may shorten a lease if given a shorter
//!   TTL); `ttl_s` 0 keeps the lease's TTL, any other value becomes the lease's TTL.
//! - A lease id this state could not have made is `NotFound` (not `InvalidArgument`).
//! - Reads decide by the state's own lease clock (never the reading node's clock) and hide
//!   leases with `expires_at <= clock`, their holders and waiters, and waiters whose deadline
//!   has passed; counts in semaphore views match. A lease view's `expires_at` is for display,
//!   on the wall clock.

mod apply;
pub(crate) mod audit;
#[cfg(test)]
mod audit_tests;
mod audit_types;
pub(crate) mod auth;
#[cfg(test)]
mod auth_tests;
mod barrier;
mod data;
mod hash;
#[cfg(test)]
mod hold_tests;
mod invariants;
mod lease_id;
pub(crate) mod limits;
mod lock_data;
#[cfg(test)]
mod lock_proptests;
#[cfg(test)]
mod lock_tests;
mod locks;
mod once;
mod paging;
#[cfg(test)]
mod proptests;
mod queue;
pub(crate) mod quota;
mod read;
mod requests;
mod set;
#[cfg(test)]
mod set_tests;
mod small_map;
mod snapshot;
mod sync;
#[cfg(test)]
mod sync_proptests;
#[cfg(test)]
mod sync_tests;
mod sync_types;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_once;
#[cfg(test)]
mod timeline;
mod types;
pub(crate) mod validate;
mod validate_cmd;
mod validate_sync;
pub(crate) mod version;
#[cfg(test)]
mod version_tests;
mod waitgroup;

pub(crate) use data::{State, Tally};
pub(crate) use hash::fnv1a64;
pub(crate) use sync_types::*;
pub(crate) use types::*;

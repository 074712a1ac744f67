//! Conversions between the state machine's views and the wire messages.

use std::collections::{BTreeMap, HashMap};

use conch_proto::conch as cpb;
use conch_proto::grackle as pb;

use crate::state::{
    AcquireLockReply, AcquireStatus, Contention, HolderView, LeaseView, LockView, LockWaiterView,
    Metadata, NamespaceView, Nanos, PageRequest, SemaphoreView, WaiterView,
};

pub(crate) fn metadata(map: HashMap<String, String>) -> Metadata {
    map.into_iter().collect::<BTreeMap<_, _>>()
}

fn wire_metadata(map: Metadata) -> HashMap<String, String> {
    map.into_iter().collect()
}

pub(crate) fn page(token: String, limit: i32) -> PageRequest {
    PageRequest { token, limit }
}

pub(crate) fn namespace(v: NamespaceView) -> pb::Namespace {
    pb::Namespace {
        name: v.name,
        description: v.description,
        created_at: v.created_at,
        updated_at: v.updated_at,
        version: v.version,
        metadata: wire_metadata(v.metadata),
    }
}

pub(crate) fn semaphore(v: SemaphoreView) -> pb::Semaphore {
    pb::Semaphore {
        name: v.name,
        description: v.description,
        created_at: v.created_at,
        updated_at: v.updated_at,
        version: v.version,
        permits: v.permits,
        active_holds: v.active_holds,
        active_holders_count: v.active_holders_count,
        metadata: wire_metadata(v.metadata),
        last_activity_at: v.last_activity_at,
        waiters_count: v.waiters_count,
        max_hold_ms: ms(v.max_hold_ns),
    }
}

pub(crate) fn lease(v: LeaseView) -> pb::Lease {
    pb::Lease {
        lease_id: v.lease_id,
        process_id: v.process_id,
        created_at: v.created_at,
        expires_at: v.expires_at,
        metadata: wire_metadata(v.metadata),
        ttl_seconds: v.ttl_s,
    }
}

pub(crate) fn holder(v: HolderView) -> pb::SemaphoreHolder {
    pb::SemaphoreHolder {
        lease_id: v.lease_id,
        locked_at: v.locked_at,
        weight: v.weight,
        metadata: wire_metadata(v.metadata),
        fencing_token: v.token,
        hold_ends_at: v.ends_at,
    }
}

/// Nanoseconds as whole milliseconds, rounded down (a negative value is 0).
pub(crate) fn ms(ns: Nanos) -> u64 {
    u64::try_from(ns / 1_000_000).unwrap_or(0)
}

/// Milliseconds from the wire as nanoseconds; a value past the range becomes `Nanos::MAX`,
/// which the command's own check refuses with the field's limits.
pub(crate) fn ms_to_ns(ms: u64) -> Nanos {
    i64::try_from(ms)
        .ok()
        .and_then(|v| v.checked_mul(1_000_000))
        .unwrap_or(Nanos::MAX)
}

pub(crate) fn waiter(v: WaiterView) -> cpb::SemaphoreWaiter {
    cpb::SemaphoreWaiter {
        lease_id: v.lease_id,
        weight: v.weight,
        queued_at: v.queued_at,
        metadata: wire_metadata(v.metadata),
        position: v.position,
    }
}

pub(crate) fn lock(v: LockView) -> pb::Lock {
    let state = match v.exclusive {
        None => pb::LockState::Unlocked,
        Some(false) => pb::LockState::SharedLocked,
        Some(true) => pb::LockState::ExclusiveLocked,
    };
    pb::Lock {
        name: v.name,
        state: state as i32,
        locked_at: v.locked_at,
        lock_holders: v
            .holders
            .into_iter()
            .map(|h| pb::LockHolder {
                lease_id: h.lease_id,
                locked_at: h.locked_at,
                metadata: wire_metadata(h.metadata),
                fencing_token: h.token,
                exclusive: h.exclusive,
            })
            .collect(),
        last_activity_at: v.last_activity_at,
        waiters_count: v.waiters,
    }
}

pub(crate) fn contention(reason: Contention) -> pb::ContentionReason {
    match reason {
        Contention::None => pb::ContentionReason::Unspecified,
        Contention::Peer => pb::ContentionReason::Peer,
        Contention::Ancestor => pb::ContentionReason::Ancestor,
        Contention::Descendant => pb::ContentionReason::Descendant,
    }
}

pub(crate) fn lock_waiter(v: LockWaiterView) -> cpb::LockWaiter {
    cpb::LockWaiter {
        lease_id: v.lease_id,
        lock_name: v.path,
        exclusive: v.exclusive,
        queued_at: v.queued_at,
        metadata: wire_metadata(v.metadata),
        position: v.position,
    }
}

/// An acquire's answer: a queued status here means the wait ran out (`TIMED_OUT`).
pub(crate) fn acquire_lock(reply: AcquireLockReply) -> pb::AcquireLockResponse {
    let (outcome, token) = match reply.status {
        AcquireStatus::Acquired { token, .. } => (pb::AcquireOutcome::Acquired, token),
        AcquireStatus::Unavailable => (pb::AcquireOutcome::Unavailable, 0),
        AcquireStatus::Queued { .. } => (pb::AcquireOutcome::TimedOut, 0),
    };
    let acquired = token != 0;
    pb::AcquireLockResponse {
        lock: Some(lock(reply.lock)),
        outcome: outcome as i32,
        reason: match acquired {
            true => pb::ContentionReason::Unspecified,
            false => contention(reply.reason),
        } as i32,
        blocking_locks: match acquired {
            true => Vec::new(),
            false => reply.blocking.into_iter().map(lock).collect(),
        },
        fencing_token: token,
    }
}

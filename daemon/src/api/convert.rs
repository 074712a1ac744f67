//! Conversions between the state machine's views and the wire messages.

use std::collections::{BTreeMap, HashMap};

use conch_proto::conch as cpb;
use conch_proto::grackle as pb;

use crate::state::{
    HolderView, LeaseView, Metadata, NamespaceView, PageRequest, SemaphoreView, WaiterView,
};

pub fn metadata(map: HashMap<String, String>) -> Metadata {
    map.into_iter().collect::<BTreeMap<_, _>>()
}

fn wire_metadata(map: Metadata) -> HashMap<String, String> {
    map.into_iter().collect()
}

pub fn page(token: String, limit: i32) -> PageRequest {
    PageRequest { token, limit }
}

pub fn namespace(v: NamespaceView) -> pb::Namespace {
    pb::Namespace {
        name: v.name,
        description: v.description,
        created_at: v.created_at,
        updated_at: v.updated_at,
        version: v.version,
        metadata: wire_metadata(v.metadata),
    }
}

pub fn semaphore(v: SemaphoreView) -> pb::Semaphore {
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
    }
}

pub fn lease(v: LeaseView) -> pb::Lease {
    pb::Lease {
        lease_id: v.lease_id,
        process_id: v.process_id,
        created_at: v.created_at,
        expires_at: v.expires_at,
        metadata: wire_metadata(v.metadata),
        ttl_seconds: v.ttl_s,
    }
}

pub fn holder(v: HolderView) -> pb::SemaphoreHolder {
    pb::SemaphoreHolder {
        lease_id: v.lease_id,
        locked_at: v.locked_at,
        weight: v.weight,
        metadata: wire_metadata(v.metadata),
        fencing_token: v.token,
    }
}

pub fn waiter(v: WaiterView) -> cpb::SemaphoreWaiter {
    cpb::SemaphoreWaiter {
        lease_id: v.lease_id,
        weight: v.weight,
        queued_at: v.queued_at,
        metadata: wire_metadata(v.metadata),
        position: v.position,
    }
}

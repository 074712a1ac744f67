//! A semaphore's and a lease's constructors, sizes and read accessors.

use super::super::quota;
use super::super::small_map::{SmallMap, SmallSet};
use super::super::types::*;
use super::{Holder, Lease, Semaphore, Waiter};

impl Semaphore {
    pub(in crate::state) fn new(
        description: &str,
        permits: u64,
        metadata: &Metadata,
        wall_ns: Nanos,
    ) -> Self {
        Semaphore {
            description: description.to_string(),
            metadata: metadata.clone(),
            permits,
            version: 1,
            created_at: wall_ns,
            updated_at: wall_ns,
            last_activity_at: wall_ns,
            max_hold_ns: 0,
            holders: SmallMap::new(),
            waiters: SmallMap::new(),
            last_ticket: 0,
            held: 0,
            holders_by_token: SmallMap::new(),
            queue: SmallMap::new(),
        }
    }

    /// This semaphore's stored bytes under `name`, with its holders and waiters.
    pub(in crate::state) fn bytes(&self, name: &str) -> u64 {
        let own = quota::object_bytes(&[name, &self.description], &self.metadata);
        let entries = self
            .holders
            .values()
            .map(|h| quota::entry_bytes(&h.metadata))
            .chain(
                self.waiters
                    .values()
                    .map(|w| quota::entry_bytes(&w.metadata)),
            )
            .fold(0u64, u64::saturating_add);
        own.saturating_add(entries)
    }

    pub(in crate::state) fn holders(&self) -> &SmallMap<u64, Holder> {
        &self.holders
    }

    pub(in crate::state) fn waiters(&self) -> &SmallMap<u64, Waiter> {
        &self.waiters
    }

    pub(in crate::state) fn last_ticket(&self) -> u64 {
        self.last_ticket
    }

    /// The sum of holder weights.
    pub(in crate::state) fn held(&self) -> u64 {
        self.held
    }

    /// Fencing token -> lease seq: the holders in grant order.
    pub(in crate::state) fn holders_by_token(&self) -> &SmallMap<u64, u64> {
        &self.holders_by_token
    }

    /// Ticket -> lease seq: the waiters in queue order.
    pub(in crate::state) fn queue(&self) -> &SmallMap<u64, u64> {
        &self.queue
    }

    pub(super) fn take_holder(&mut self, seq: u64) -> Option<Holder> {
        let old = self.holders.remove(&seq)?;
        self.held = self.held.saturating_sub(old.weight);
        self.holders_by_token.remove(&old.token);
        Some(old)
    }

    pub(super) fn take_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&seq)?;
        self.queue.remove(&waiter.ticket);
        Some(waiter)
    }
}

impl Lease {
    /// This lease's stored bytes.
    pub(in crate::state) fn bytes(&self) -> u64 {
        quota::object_bytes(&[&self.process_id], &self.metadata)
    }

    pub(in crate::state) fn new(
        process_id: &str,
        ttl_s: u64,
        metadata: &Metadata,
        wall_ns: Nanos,
        expires_at: Nanos,
        owner: Option<u64>,
        secret: u64,
    ) -> Self {
        Lease {
            process_id: process_id.to_string(),
            metadata: metadata.clone(),
            created_at: wall_ns,
            expires_at,
            ttl_s,
            owner,
            secret,
            kind: LeaseKind::Semaphore,
            holds: SmallSet::new(),
            waits: SmallSet::new(),
        }
    }
}

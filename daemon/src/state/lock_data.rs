//! The locks of one namespace: who holds which path, and the queue of acquires waiting.
//!
//! Canonical: the held locks by path (each with its holders by lease number) and the queue by
//! ticket (FIFO over the whole namespace, across paths and modes). Derived: `waiting`, (path,
//! lease number) -> ticket, so that a path's waiters and a lease's waiter are found without a
//! scan. A lock is present exactly while it has a holder.
//!
//! The table changes only through the methods below, which keep `waiting` equal to what the
//! queue implies. The namespace's methods in `data.rs` wrap them to keep the leases' `holds` and
//! `waits`, the usage and the global indexes too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::types::*;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct LockTable {
    held: BTreeMap<String, Lock>,
    /// Ticket -> waiter: the namespace's lock queue in arrival order.
    queue: BTreeMap<u64, LockWaiter>,
    last_ticket: u64,
    #[serde(skip)]
    waiting: BTreeMap<(String, u64), u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Lock {
    /// The latest acquire attempt on this path while it was held (wall clock, for display).
    pub(super) last_activity_at: Nanos,
    /// By lease number.
    holders: BTreeMap<u64, LockHolder>,
}

/// Reached only through `&` outside this module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LockHolder {
    pub(super) exclusive: bool,
    pub(super) locked_at: Nanos,
    pub(super) metadata: Metadata,
    pub(super) token: u64,
}

/// Reached only through `&` outside this module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LockWaiter {
    pub(super) seq: u64,
    pub(super) path: String,
    pub(super) exclusive: bool,
    pub(super) queued_at: Nanos,
    pub(super) deadline_ns: Nanos,
    pub(super) metadata: Metadata,
}

impl Lock {
    pub(super) fn holders(&self) -> &BTreeMap<u64, LockHolder> {
        &self.holders
    }

    /// Whether the lock is held exclusive (then by exactly one lease).
    pub(super) fn exclusive(&self) -> bool {
        self.holders.values().any(|h| h.exclusive)
    }
}

impl LockTable {
    pub(super) fn held(&self) -> &BTreeMap<String, Lock> {
        &self.held
    }

    pub(super) fn queue(&self) -> &BTreeMap<u64, LockWaiter> {
        &self.queue
    }

    pub(super) fn last_ticket(&self) -> u64 {
        self.last_ticket
    }

    pub(super) fn waiting(&self) -> &BTreeMap<(String, u64), u64> {
        &self.waiting
    }

    pub(super) fn holder(&self, path: &str, seq: u64) -> Option<&LockHolder> {
        self.held.get(path)?.holders.get(&seq)
    }

    pub(super) fn waiter(&self, path: &str, seq: u64) -> Option<&LockWaiter> {
        let ticket = self.waiting.get(&(path.to_string(), seq))?;
        self.queue.get(ticket)
    }

    /// The queued acquires of exactly `path`.
    pub(super) fn waiters_of(&self, path: &str) -> usize {
        self.waiting
            .range((path.to_string(), 0)..=(path.to_string(), u64::MAX))
            .count()
    }

    pub(super) fn set_last_activity(&mut self, path: &str, wall_ns: Nanos) {
        if let Some(lock) = self.held.get_mut(path) {
            lock.last_activity_at = wall_ns;
        }
    }

    /// Makes `seq` a holder of `path`, replacing its hold there; returns the hold replaced.
    pub(super) fn put_holder(
        &mut self,
        path: &str,
        seq: u64,
        holder: LockHolder,
    ) -> Option<LockHolder> {
        let lock = self.held.entry(path.to_string()).or_insert_with(|| Lock {
            last_activity_at: holder.locked_at,
            holders: BTreeMap::new(),
        });
        lock.holders.insert(seq, holder)
    }

    /// Drops the hold of `seq` on `path`; the lock goes with its last holder.
    pub(super) fn take_holder(&mut self, path: &str, seq: u64) -> Option<LockHolder> {
        let lock = self.held.get_mut(path)?;
        let old = lock.holders.remove(&seq)?;
        if lock.holders.is_empty() {
            self.held.remove(path);
        }
        Some(old)
    }

    /// Queues `waiter` at the end (the caller checked its lease does not wait for this path).
    pub(super) fn push_waiter(&mut self, waiter: LockWaiter) {
        self.last_ticket = self.last_ticket.saturating_add(1);
        self.waiting
            .insert((waiter.path.clone(), waiter.seq), self.last_ticket);
        self.queue.insert(self.last_ticket, waiter);
    }

    pub(super) fn take_waiter(&mut self, path: &str, seq: u64) -> Option<LockWaiter> {
        let ticket = self.waiting.remove(&(path.to_string(), seq))?;
        self.queue.remove(&ticket)
    }

    /// The queued acquire of `seq` for `path`, to change its mode, deadline or metadata (its
    /// path, lease and place stay).
    pub(super) fn waiter_mut(&mut self, path: &str, seq: u64) -> Option<&mut LockWaiter> {
        let ticket = self.waiting.get(&(path.to_string(), seq))?;
        self.queue.get_mut(ticket)
    }

    /// Rebuilds `waiting` from the queue; fails on a lease waiting twice for one path.
    pub(super) fn rebuild(&mut self) -> Result<(), String> {
        self.waiting.clear();
        for (ticket, waiter) in &self.queue {
            if self
                .waiting
                .insert((waiter.path.clone(), waiter.seq), *ticket)
                .is_some()
            {
                return Err(format!(
                    "lease number {} waits twice for lock {}",
                    waiter.seq, waiter.path
                ));
            }
        }
        if self.held.values().any(|lock| lock.holders.is_empty()) {
            return Err("a lock without holders".into());
        }
        Ok(())
    }
}

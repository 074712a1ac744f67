//! A namespace's hierarchical locks: the only methods that change its lock table, each keeping
//! the namespace's usage; and the size model of a lock entry.

use super::super::lock_data::{LockHolder, LockTable, LockWaiter};
use super::super::quota;
use super::super::types::*;
use super::{Ctx, Namespace};

impl Namespace {
    pub(in crate::state) fn locks(&self) -> &LockTable {
        &self.locks
    }

    /// Makes `seq` a holder of lock `path` (replacing its hold there, if any); returns the hold
    /// replaced.
    pub(in crate::state) fn add_lock_holder(
        &mut self,
        path: &str,
        seq: u64,
        holder: LockHolder,
        ctx: &mut Ctx,
    ) -> Option<LockHolder> {
        let added = lock_entry_bytes(path, &holder.metadata);
        let old = self.locks.put_holder(path, seq, holder);
        match &old {
            Some(old) => {
                self.remove_usage(0, lock_entry_bytes(path, &old.metadata), ctx);
                self.add_usage(0, added, ctx);
            }
            None => {
                self.add_usage(1, added, ctx);
                ctx.index.add_holders(1);
                if let Some(lease) = self.leases.get_mut(&seq) {
                    lease.holds.insert(lock_object(path));
                }
            }
        }
        old
    }

    /// Drops the hold of `seq` on lock `path`, if it has one.
    pub(in crate::state) fn remove_lock_holder(
        &mut self,
        path: &str,
        seq: u64,
        ctx: &mut Ctx,
    ) -> Option<LockHolder> {
        let old = self.locks.take_holder(path, seq)?;
        ctx.index.remove_holders(1);
        self.remove_usage(1, lock_entry_bytes(path, &old.metadata), ctx);
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.holds.remove(&lock_object(path));
        }
        Some(old)
    }

    /// Drops every hold on lock `path`; returns the leases that held it.
    pub(in crate::state) fn remove_lock(&mut self, path: &str, ctx: &mut Ctx) -> Vec<u64> {
        let holders: Vec<u64> = self
            .locks
            .held()
            .get(path)
            .map(|lock| lock.holders().keys().copied().collect())
            .unwrap_or_default();
        for seq in &holders {
            self.remove_lock_holder(path, *seq, ctx);
        }
        holders
    }

    /// Queues `waiter` at the end of the lock queue (the caller checked its lease does not wait
    /// for that path yet).
    pub(in crate::state) fn add_lock_waiter(&mut self, waiter: LockWaiter, ctx: &mut Ctx) {
        let object = lock_object(&waiter.path);
        ctx.index
            .add_waiter_deadline(self.id, &object, waiter.seq, waiter.deadline_ns);
        self.add_usage(1, lock_entry_bytes(&waiter.path, &waiter.metadata), ctx);
        if let Some(lease) = self.leases.get_mut(&waiter.seq) {
            lease.waits.insert(object);
        }
        self.locks.push_waiter(waiter);
    }

    /// Takes the queued acquire of `seq` for lock `path` out of the queue, if there is one.
    pub(in crate::state) fn remove_lock_waiter(
        &mut self,
        path: &str,
        seq: u64,
        ctx: &mut Ctx,
    ) -> Option<LockWaiter> {
        let waiter = self.locks.take_waiter(path, seq)?;
        let object = lock_object(path);
        ctx.index
            .remove_waiter_deadline(self.id, &object, seq, waiter.deadline_ns);
        self.remove_usage(1, lock_entry_bytes(path, &waiter.metadata), ctx);
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.waits.remove(&object);
        }
        Some(waiter)
    }

    /// Changes what the queued acquire of `seq` for `path` asks for and until when (its place
    /// stays).
    pub(in crate::state) fn set_lock_waiter(
        &mut self,
        path: &str,
        seq: u64,
        exclusive: bool,
        deadline_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) {
        let ns_id = self.id;
        let Some(waiter) = self.locks.waiter_mut(path, seq) else {
            return;
        };
        let object = lock_object(path);
        ctx.index
            .remove_waiter_deadline(ns_id, &object, seq, waiter.deadline_ns);
        ctx.index
            .add_waiter_deadline(ns_id, &object, seq, deadline_ns);
        let before = lock_entry_bytes(path, &waiter.metadata);
        waiter.exclusive = exclusive;
        waiter.deadline_ns = deadline_ns;
        waiter.metadata = metadata.clone();
        let after = lock_entry_bytes(path, &waiter.metadata);
        self.remove_usage(0, before, ctx);
        self.add_usage(0, after, ctx);
    }

    /// Records an acquire attempt on a held lock (a display time).
    pub(in crate::state) fn touch_lock(&mut self, path: &str, wall_ns: Nanos) {
        self.locks.set_last_activity(path, wall_ns);
    }
}

/// The stored bytes of a lock holder or queued acquire on `path` (it keeps the path).
pub(in crate::state) fn lock_entry_bytes(path: &str, metadata: &Metadata) -> u64 {
    quota::entry_bytes(metadata).saturating_add(path.len() as u64)
}

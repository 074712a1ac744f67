//! The only methods that change a namespace's semaphores, holders, waiters and leases (and the
//! namespace set itself), each keeping every index it touches and the namespace's usage.

use std::collections::{BTreeMap, BTreeSet};

use super::super::lock_data::LockTable;
use super::super::quota::{self, Quotas, Usage};
use super::super::types::*;
use super::{
    Ctx, Holder, Index, Lease, Namespace, Namespaces, Semaphore, Waiter, lock_entry_bytes,
    process_key, sync,
};

impl Namespaces {
    pub(in crate::state) fn get(&self, name: &str) -> Option<&Namespace> {
        self.0.get(name)
    }

    pub(in crate::state) fn get_mut(&mut self, name: &str) -> Option<&mut Namespace> {
        self.0.get_mut(name)
    }

    pub(in crate::state) fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub(in crate::state) fn len(&self) -> usize {
        self.0.len()
    }

    pub(in crate::state) fn map(&self) -> &BTreeMap<String, Namespace> {
        &self.0
    }

    pub(in crate::state) fn values_mut(&mut self) -> impl Iterator<Item = &mut Namespace> {
        self.0.values_mut()
    }

    /// Adds a new, empty namespace (replacing none: the caller checked the name is free).
    pub(in crate::state) fn add(&mut self, ns: Namespace, ctx: &mut Ctx) {
        ctx.index.add_namespace(ns.id, &ns.name);
        ctx.index.add_bytes(ns.usage.bytes);
        self.0.insert(ns.name.clone(), ns);
    }

    /// Removes a namespace and everything in it from the indexes; returns it so the caller can
    /// tell its waiters.
    pub(in crate::state) fn remove(&mut self, name: &str, ctx: &mut Ctx) -> Option<Namespace> {
        let ns = self.0.remove(name)?;
        ctx.index.namespace_names.remove(&ns.id);
        ctx.tally.holders_changed.extend(
            ns.semaphores
                .keys()
                .map(|sem| (ns.name.clone(), sem.clone())),
        );
        ctx.index.remove_bytes(ns.usage.bytes);
        for (sem_name, sem) in &ns.semaphores {
            ctx.index.remove_holders(sem.holders.len() as u64);
            for (seq, holder) in &sem.holders {
                ctx.index
                    .remove_hold_end(ns.id, sem_name, *seq, holder.ends_at);
            }
            for (seq, waiter) in &sem.waiters {
                ctx.index
                    .remove_waiter_deadline(ns.id, sem_name, *seq, waiter.deadline_ns);
            }
        }
        for lock in ns.locks.held().values() {
            ctx.index.remove_holders(lock.holders().len() as u64);
        }
        for waiter in ns.locks.queue().values() {
            ctx.index.remove_waiter_deadline(
                ns.id,
                &lock_object(&waiter.path),
                waiter.seq,
                waiter.deadline_ns,
            );
        }
        for (seq, lease) in &ns.leases {
            ctx.index.remove_lease_expiry(ns.id, *seq, lease.expires_at);
        }
        ns.sync.unindex(ns.id, ctx.index);
        Some(ns)
    }
}

impl Namespace {
    pub(in crate::state) fn new(
        id: u64,
        name: &str,
        description: &str,
        metadata: &Metadata,
        wall_ns: Nanos,
    ) -> Self {
        Namespace {
            id,
            name: name.to_string(),
            description: description.to_string(),
            metadata: metadata.clone(),
            created_at: wall_ns,
            updated_at: wall_ns,
            version: 1,
            semaphores: BTreeMap::new(),
            leases: BTreeMap::new(),
            quotas: Quotas::default(),
            locks: LockTable::default(),
            sync: sync::SyncObjects::default(),
            leases_by_process: BTreeSet::new(),
            usage: Usage {
                entries: 0,
                bytes: quota::object_bytes(&[name, description], metadata),
            },
        }
    }

    /// What this namespace uses of its quotas, from its data (O(namespace)).
    pub(in crate::state) fn computed_usage(&self) -> Usage {
        let mut usage = Usage {
            entries: 0,
            bytes: quota::object_bytes(&[&self.name, &self.description], &self.metadata),
        };
        for (name, sem) in &self.semaphores {
            usage.bytes = usage.bytes.saturating_add(sem.bytes(name));
            usage.entries = usage
                .entries
                .saturating_add((sem.holders.len() + sem.waiters.len()) as u64);
        }
        for lease in self.leases.values() {
            usage.bytes = usage.bytes.saturating_add(lease.bytes());
        }
        for (path, lock) in self.locks.held() {
            for holder in lock.holders().values() {
                usage.entries = usage.entries.saturating_add(1);
                usage.bytes = usage
                    .bytes
                    .saturating_add(lock_entry_bytes(path, &holder.metadata));
            }
        }
        for waiter in self.locks.queue().values() {
            usage.entries = usage.entries.saturating_add(1);
            usage.bytes = usage
                .bytes
                .saturating_add(lock_entry_bytes(&waiter.path, &waiter.metadata));
        }
        self.sync.add_computed_usage(&mut usage);
        usage
    }

    pub(in crate::state) fn usage(&self) -> Usage {
        self.usage
    }

    pub(in crate::state) fn quotas(&self) -> Quotas {
        self.quotas
    }

    pub(in crate::state) fn set_quotas(&mut self, quotas: Quotas) {
        self.quotas = quotas;
    }

    pub(super) fn add_usage(&mut self, entries: u64, bytes: u64, ctx: &mut Ctx) {
        self.usage.entries = self.usage.entries.saturating_add(entries);
        self.usage.bytes = self.usage.bytes.saturating_add(bytes);
        ctx.index.add_bytes(bytes);
    }

    pub(super) fn remove_usage(&mut self, entries: u64, bytes: u64, ctx: &mut Ctx) {
        self.usage.entries = self.usage.entries.saturating_sub(entries);
        self.usage.bytes = self.usage.bytes.saturating_sub(bytes);
        ctx.index.remove_bytes(bytes);
    }

    /// Refuses (`ResourceExhausted`, naming the quota) growth by `semaphores`, `leases`,
    /// `entries` and `bytes` past this namespace's quotas or the state's budget.
    pub(in crate::state) fn room_for(
        &self,
        semaphores: u64,
        leases: u64,
        entries: u64,
        bytes: u64,
        ctx: &Ctx,
    ) -> Result<(), Error> {
        let q = self.quotas;
        let name = &self.name;
        quota::check(
            format_args!("semaphore quota of namespace {name}"),
            self.semaphores.len() as u64,
            semaphores,
            q.semaphores,
        )?;
        quota::check(
            format_args!("lease quota of namespace {name}"),
            self.leases.len() as u64,
            leases,
            q.leases,
        )?;
        quota::check(
            format_args!("holder and waiter quota of namespace {name}"),
            self.usage.entries,
            entries,
            q.entries,
        )?;
        quota::check(
            format_args!("byte quota of namespace {name}"),
            self.usage.bytes,
            bytes,
            q.bytes,
        )?;
        quota::check(
            "the state's byte budget",
            ctx.stored_bytes(),
            bytes,
            ctx.budget_bytes,
        )
    }

    /// Sets the namespace's description and metadata.
    pub(in crate::state) fn set_attributes(
        &mut self,
        description: &str,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) {
        let before = quota::object_bytes(&[&self.name, &self.description], &self.metadata);
        self.description = description.to_string();
        self.metadata = metadata.clone();
        let after = quota::object_bytes(&[&self.name, &self.description], &self.metadata);
        self.remove_usage(0, before, ctx);
        self.add_usage(0, after, ctx);
    }

    /// Sets the description and metadata of semaphore `name`.
    pub(in crate::state) fn set_semaphore_attributes(
        &mut self,
        name: &str,
        description: &str,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) {
        let Some(sem) = self.semaphores.get_mut(name) else {
            return;
        };
        let before = sem.bytes(name);
        sem.description = description.to_string();
        sem.metadata = metadata.clone();
        let after = sem.bytes(name);
        self.remove_usage(0, before, ctx);
        self.add_usage(0, after, ctx);
    }

    pub(in crate::state) fn id(&self) -> u64 {
        self.id
    }

    pub(in crate::state) fn name(&self) -> &str {
        &self.name
    }

    pub(in crate::state) fn semaphores(&self) -> &BTreeMap<String, Semaphore> {
        &self.semaphores
    }

    /// A semaphore, to change its attributes (its holders and waiters change through the
    /// namespace's methods).
    pub(in crate::state) fn semaphore_mut(&mut self, name: &str) -> Option<&mut Semaphore> {
        self.semaphores.get_mut(name)
    }

    pub(in crate::state) fn leases(&self) -> &BTreeMap<u64, Box<Lease>> {
        &self.leases
    }

    pub(in crate::state) fn leases_by_process(&self) -> &BTreeSet<(u64, u64)> {
        &self.leases_by_process
    }

    /// Test hook: the raw lease map, to build inconsistent data on purpose.
    #[cfg(test)]
    pub(in crate::state) fn leases_raw_mut(&mut self) -> &mut BTreeMap<u64, Box<Lease>> {
        &mut self.leases
    }

    /// Adds a new semaphore with no holders or waiters (the caller checked the name is free).
    pub(in crate::state) fn add_semaphore(&mut self, name: &str, sem: Semaphore, ctx: &mut Ctx) {
        self.add_usage(0, sem.bytes(name), ctx);
        self.semaphores.insert(name.to_string(), sem);
    }

    /// Removes a semaphore, dropping its holders and waiters from every index; returns it so
    /// the caller can tell its waiters.
    pub(in crate::state) fn remove_semaphore(
        &mut self,
        name: &str,
        ctx: &mut Ctx,
    ) -> Option<Semaphore> {
        let sem = self.semaphores.remove(name)?;
        ctx.tally
            .holders_changed
            .insert((self.name.clone(), name.to_string()));
        let entries = (sem.holders.len() + sem.waiters.len()) as u64;
        self.remove_usage(entries, sem.bytes(name), ctx);
        for (seq, holder) in &sem.holders {
            ctx.index.remove_holders(1);
            ctx.index
                .remove_hold_end(self.id, name, *seq, holder.ends_at);
            if let Some(lease) = self.leases.get_mut(seq) {
                lease.holds.remove(name);
            }
        }
        for (seq, waiter) in &sem.waiters {
            ctx.index
                .remove_waiter_deadline(self.id, name, *seq, waiter.deadline_ns);
            if let Some(lease) = self.leases.get_mut(seq) {
                lease.waits.remove(name);
            }
        }
        Some(sem)
    }

    /// Makes `seq` a holder of `sem` (replacing the hold it had, if any); returns the hold
    /// replaced.
    pub(in crate::state) fn add_holder(
        &mut self,
        sem_name: &str,
        seq: u64,
        holder: Holder,
        ctx: &mut Ctx,
    ) -> Option<Holder> {
        let sem = self.semaphores.get_mut(sem_name)?;
        sem.held = sem.held.saturating_add(holder.weight);
        sem.holders_by_token.insert(holder.token, seq);
        let added = quota::entry_bytes(&holder.metadata);
        ctx.index
            .add_hold_end(self.id, sem_name, seq, holder.ends_at);
        let old = sem.holders.insert(seq, holder);
        ctx.tally
            .holders_changed
            .insert((self.name.clone(), sem_name.to_string()));
        match &old {
            Some(old) => {
                sem.held = sem.held.saturating_sub(old.weight);
                sem.holders_by_token.remove(&old.token);
                let kept = sem.holders.get(&seq).map(|h| h.ends_at);
                if kept != Some(old.ends_at) {
                    ctx.index
                        .remove_hold_end(self.id, sem_name, seq, old.ends_at);
                }
                let removed = quota::entry_bytes(&old.metadata);
                self.remove_usage(0, removed, ctx);
                self.add_usage(0, added, ctx);
            }
            None => {
                self.add_usage(1, added, ctx);
                ctx.index.add_holders(1);
                if let Some(lease) = self.leases.get_mut(&seq) {
                    lease.holds.insert(sem_name.to_string());
                }
            }
        }
        old
    }

    /// Drops the hold of `seq` on `sem`, if it has one.
    pub(in crate::state) fn remove_holder(
        &mut self,
        sem_name: &str,
        seq: u64,
        ctx: &mut Ctx,
    ) -> Option<Holder> {
        let sem = self.semaphores.get_mut(sem_name)?;
        let old = sem.take_holder(seq)?;
        ctx.index.remove_holders(1);
        ctx.index
            .remove_hold_end(self.id, sem_name, seq, old.ends_at);
        ctx.tally
            .holders_changed
            .insert((self.name.clone(), sem_name.to_string()));
        self.remove_usage(1, quota::entry_bytes(&old.metadata), ctx);
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.holds.remove(sem_name);
        }
        Some(old)
    }

    /// Queues `seq` at the end of `sem`'s queue with the next ticket (the caller checked it is
    /// not queued there yet).
    pub(in crate::state) fn add_waiter(
        &mut self,
        sem_name: &str,
        seq: u64,
        mut waiter: Waiter,
        ctx: &mut Ctx,
    ) {
        let Some(sem) = self.semaphores.get_mut(sem_name) else {
            return;
        };
        sem.last_ticket = sem.last_ticket.saturating_add(1);
        waiter.ticket = sem.last_ticket;
        sem.queue.insert(waiter.ticket, seq);
        ctx.index
            .add_waiter_deadline(self.id, sem_name, seq, waiter.deadline_ns);
        let bytes = quota::entry_bytes(&waiter.metadata);
        sem.waiters.insert(seq, waiter);
        self.add_usage(1, bytes, ctx);
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.waits.insert(sem_name.to_string());
        }
    }

    /// Takes `seq` out of `sem`'s queue, if it waits there.
    pub(in crate::state) fn remove_waiter(
        &mut self,
        sem_name: &str,
        seq: u64,
        ctx: &mut Ctx,
    ) -> Option<Waiter> {
        let sem = self.semaphores.get_mut(sem_name)?;
        let waiter = sem.take_waiter(seq)?;
        ctx.index
            .remove_waiter_deadline(self.id, sem_name, seq, waiter.deadline_ns);
        self.remove_usage(1, quota::entry_bytes(&waiter.metadata), ctx);
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.waits.remove(sem_name);
        }
        Some(waiter)
    }

    /// Moves the deadline of the waiter `seq` of `sem`.
    pub(in crate::state) fn set_waiter_deadline(
        &mut self,
        sem_name: &str,
        seq: u64,
        deadline_ns: Nanos,
        ctx: &mut Ctx,
    ) {
        let ns_id = self.id;
        let Some(waiter) = self
            .semaphores
            .get_mut(sem_name)
            .and_then(|sem| sem.waiters.get_mut(&seq))
        else {
            return;
        };
        if waiter.deadline_ns == deadline_ns {
            return;
        }
        ctx.index
            .remove_waiter_deadline(ns_id, sem_name, seq, waiter.deadline_ns);
        ctx.index
            .add_waiter_deadline(ns_id, sem_name, seq, deadline_ns);
        waiter.deadline_ns = deadline_ns;
    }

    /// Changes what the waiter `seq` of `sem` asks for (its place and deadline stay).
    pub(in crate::state) fn set_waiter_request(
        &mut self,
        sem_name: &str,
        seq: u64,
        weight: u64,
        max_hold_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) {
        let Some(waiter) = self
            .semaphores
            .get_mut(sem_name)
            .and_then(|sem| sem.waiters.get_mut(&seq))
        else {
            return;
        };
        let before = quota::entry_bytes(&waiter.metadata);
        waiter.weight = weight;
        waiter.max_hold_ns = max_hold_ns;
        waiter.metadata = metadata.clone();
        let after = quota::entry_bytes(&waiter.metadata);
        self.remove_usage(0, before, ctx);
        self.add_usage(0, after, ctx);
    }

    /// Adds a new lease (the caller took `seq` from the counter).
    pub(in crate::state) fn add_lease(&mut self, seq: u64, lease: Lease, ctx: &mut Ctx) {
        ctx.index.add_lease_expiry(self.id, seq, lease.expires_at);
        self.add_usage(0, lease.bytes(), ctx);
        self.leases_by_process
            .insert((process_key(&lease.process_id), seq));
        self.leases.insert(seq, Box::new(lease));
    }

    /// Removes a lease with its holds and waits; returns it (its `holds` and `waits` say what
    /// it had) so the caller can tell waiters and move queues.
    pub(in crate::state) fn remove_lease(&mut self, seq: u64, ctx: &mut Ctx) -> Option<Box<Lease>> {
        let lease = self.leases.remove(&seq)?;
        ctx.index
            .remove_lease_expiry(self.id, seq, lease.expires_at);
        self.remove_usage(0, lease.bytes(), ctx);
        self.leases_by_process
            .remove(&(process_key(&lease.process_id), seq));
        for object in &lease.holds {
            match lock_path(object) {
                Some(path) => drop(self.remove_lock_holder(path, seq, ctx)),
                None => drop(self.remove_holder(object, seq, ctx)),
            }
        }
        for object in &lease.waits {
            match lock_path(object) {
                Some(path) => drop(self.remove_lock_waiter(path, seq, ctx)),
                None => drop(self.remove_waiter(object, seq, ctx)),
            }
        }
        Some(lease)
    }

    /// Sets the TTL a lease is refreshed and extended by (its expiry does not move).
    pub(in crate::state) fn set_lease_ttl(&mut self, seq: u64, ttl_s: u64) {
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.ttl_s = ttl_s;
        }
    }

    /// Moves the expiry of lease `seq`.
    pub(in crate::state) fn set_lease_expiry(
        &mut self,
        seq: u64,
        expires_at: Nanos,
        ctx: &mut Ctx,
    ) {
        let Some(lease) = self.leases.get_mut(&seq) else {
            return;
        };
        move_expiry(ctx.index, self.id, seq, lease, expires_at);
    }

    /// Moves the expiry of every lease to `expiry(lease)`.
    pub(in crate::state) fn set_lease_expiries(
        &mut self,
        ctx: &mut Ctx,
        expiry: impl Fn(&Lease) -> Nanos,
    ) {
        for (seq, lease) in self.leases.iter_mut() {
            let expires_at = expiry(lease);
            move_expiry(ctx.index, self.id, *seq, lease, expires_at);
        }
    }
}

pub(super) fn move_expiry(
    index: &mut Index,
    ns_id: u64,
    seq: u64,
    lease: &mut Lease,
    expires_at: Nanos,
) {
    if expires_at == lease.expires_at {
        return;
    }
    index.remove_lease_expiry(ns_id, seq, lease.expires_at);
    lease.expires_at = expires_at;
    index.add_lease_expiry(ns_id, seq, expires_at);
}

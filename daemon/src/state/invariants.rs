//! The invariant check: every rule the state keeps, verified from the data alone.
//!
//! What always holds (and what [`State::check_invariants`] verifies):
//! - for every semaphore: sum of holder weights = `held` <= permits; at most 1000 holders and
//!   10 000 waiters; every weight is 1..=permits
//! - every holder and waiter belongs to a lease of the same namespace, and that lease lists it
//! - a lease that both holds and waits for one semaphore is upgrading: waiter weight > held
//!   weight
//! - the head of every queue cannot be granted (grants are never left undone; a set at the
//!   head can be granted only when it can be in every member)
//! - all-or-none acquires (`set.rs`): a set waiter names 2 to 16 distinct members, itself
//!   among them, and waits in every member with the same set and deadline; its lease holds
//!   none of the members while it waits (so a set is held all or none); and the set entries
//!   stand in the same relative order in every queue they share (the "comes before" relation
//!   of neighbouring set entries over all queues has no cycle: one global arrival order)
//! - fencing tokens are unique and <= the token counter (each grant takes the next one, so they
//!   increase strictly in grant order); queue tickets are unique and <= the semaphore's counter
//! - the lease clock never decreases (checked by the property tests across steps); display
//!   times are on the wall clock, which may go back, so nothing orders them
//! - every derived index equals what the data implies (computed here independently of the
//!   incremental upkeep in the data's methods)
//! - the remembered request ids keep the rules of `requests.rs` (cap, retention, order, and
//!   a link only from a queued acquire to a waiter that waits)
//! - access control keeps its own rules (see `auth`): tokens name existing roles, hashes are
//!   unique, and while it is on a cluster-admin token exists
//! - wait groups and barriers keep the rules of `sync.rs` ([`super::sync::check`])
//! - the audit trail keeps the rules of `audit.rs` (bound, order, reason length)

use std::collections::{BTreeMap, BTreeSet};

use super::data::{Index, Namespace, State, process_key};
use super::limits::*;
use super::locks::ancestors;
use super::types::{LeaseKind, lock_object, lock_path};

impl State {
    /// Verifies every invariant listed in the module docs, and that indexes match the data.
    pub fn check_invariants(&self) -> Result<(), String> {
        let data = &self.data;
        let mut expected = Index::default();
        let mut tokens = BTreeSet::new();
        for (name, ns) in data.namespaces.map() {
            let at = |what: &str| format!("namespace {name}: {what}");
            if ns.name() != name {
                return Err(at(&format!("stored under a different name {}", ns.name())));
            }
            if ns.id() == 0 || ns.id() > data.last_namespace_id {
                return Err(at("id not from the counter"));
            }
            if !expected.add_namespace(ns.id(), name) {
                return Err(at("id used twice"));
            }
            if ns.version == 0 {
                return Err(at("version 0"));
            }
            // What each lease should list, from the semaphores' side.
            let mut lease_holds: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
            let mut lease_waits: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
            for (sem_name, sem) in ns.semaphores() {
                let at = |what: &str| format!("semaphore {name}/{sem_name}: {what}");
                if !(1..=PERMITS_MAX).contains(&sem.permits) {
                    return Err(at("permits out of range"));
                }
                if sem.version == 0 {
                    return Err(at("version 0"));
                }
                let mut held = 0u64;
                let mut by_token = BTreeMap::new();
                for (seq, h) in sem.holders() {
                    if !ns.leases().contains_key(seq) {
                        return Err(at(&format!("holder of lease number {seq} has no lease")));
                    }
                    if h.weight == 0 || h.weight > sem.permits {
                        return Err(at("holder weight out of range"));
                    }
                    if h.token == 0 || h.token > data.last_token || !tokens.insert(h.token) {
                        return Err(at(&format!(
                            "fencing token {} reused or not from the counter",
                            h.token
                        )));
                    }
                    if (h.ends_at == 0) != (h.ends_wall == 0) {
                        return Err(at("a hold limit on one clock only"));
                    }
                    expected.add_hold_end(ns.id(), sem_name, *seq, h.ends_at);
                    held = held.saturating_add(h.weight);
                    by_token.insert(h.token, *seq);
                    lease_holds
                        .entry(*seq)
                        .or_default()
                        .insert(sem_name.clone());
                }
                if held > sem.permits {
                    return Err(at(&format!(
                        "held weight {held} exceeds permits {}",
                        sem.permits
                    )));
                }
                if held != sem.held() || !by_token.iter().eq(sem.holders_by_token()) {
                    return Err(at("holder index does not match the holders"));
                }
                if sem.holders().len() > HOLDERS_PER_SEMAPHORE_MAX
                    || sem.waiters().len() > WAITERS_PER_SEMAPHORE_MAX
                {
                    return Err(at("over the holder or waiter quota"));
                }
                let mut queue = BTreeMap::new();
                for (seq, w) in sem.waiters() {
                    if !ns.leases().contains_key(seq) {
                        return Err(at(&format!("waiter of lease number {seq} has no lease")));
                    }
                    if w.weight == 0 || w.weight > sem.permits {
                        return Err(at("waiter weight out of range"));
                    }
                    if sem.holders().get(seq).is_some_and(|h| h.weight >= w.weight) {
                        return Err(at("an upgrading waiter must want more than it holds"));
                    }
                    if w.ticket == 0
                        || w.ticket > sem.last_ticket()
                        || queue.insert(w.ticket, *seq).is_some()
                    {
                        return Err(at("queue ticket reused or not from the counter"));
                    }
                    expected.add_waiter_deadline(ns.id(), sem_name, *seq, w.deadline_ns);
                    lease_waits
                        .entry(*seq)
                        .or_default()
                        .insert(sem_name.clone());
                }
                if !queue.iter().eq(sem.queue()) {
                    return Err(at("queue index does not match the waiters"));
                }
                if let Some((_, seq)) = sem.queue().first_key_value()
                    && let Some(head) = sem.waiters().get(seq)
                    && if head.set.is_empty() {
                        sem.can_grant(*seq, head.weight)
                    } else {
                        ns.set_grantable(*seq, &head.set)
                    }
                {
                    return Err(at("the head of the queue fits but was not granted"));
                }
                expected.add_holders(sem.holders().len() as u64);
            }
            check_sets(ns)?;
            self.check_locks(
                ns,
                &mut expected,
                &mut tokens,
                &mut lease_holds,
                &mut lease_waits,
            )?;
            let mut by_process = BTreeSet::new();
            for (seq, lease) in ns.leases() {
                let at = |what: &str| format!("lease number {seq} in {name}: {what}");
                if *seq == 0 || *seq > data.last_lease_seq {
                    return Err(at("id not from the counter"));
                }
                if !(TTL_MIN_S..=TTL_MAX_S).contains(&lease.ttl_s) {
                    return Err(at("ttl out of range"));
                }
                let semaphores = lease.holds.iter().chain(&lease.waits);
                if lease.kind == LeaseKind::Lock
                    && semaphores.clone().any(|o| lock_path(o).is_none())
                    || lease.kind == LeaseKind::Semaphore
                        && semaphores.clone().any(|o| lock_path(o).is_some())
                {
                    return Err(at("holds or waits for what its kind cannot"));
                }
                if !lease
                    .holds
                    .iter()
                    .eq(&lease_holds.remove(seq).unwrap_or_default())
                    || !lease
                        .waits
                        .iter()
                        .eq(&lease_waits.remove(seq).unwrap_or_default())
                {
                    return Err(at("holds/waits do not match the semaphores"));
                }
                expected.add_lease_expiry(ns.id(), *seq, lease.expires_at);
                by_process.insert((process_key(&lease.process_id), *seq));
            }
            if by_process != *ns.leases_by_process() {
                return Err(at("process index does not match the leases"));
            }
            ns.sync_objects().check_derived(ns.id(), &mut expected)?;
            super::sync::check(ns)?;
            let usage = ns.computed_usage();
            if usage != ns.usage() {
                return Err(at(&format!(
                    "quota usage {:?} does not match the data ({usage:?})",
                    ns.usage()
                )));
            }
            expected.add_bytes(usage.bytes);
        }
        if expected != *self.index() {
            return Err("global indexes do not match the data".into());
        }
        data.requests.check(data.clock_ns, |(ns, sem, lease)| {
            data.namespaces.get(ns).is_some_and(|ns| {
                ns.lease_seq(lease).is_some_and(|seq| match lock_path(sem) {
                    Some(path) => ns.locks().waiter(path, seq).is_some(),
                    None => ns
                        .semaphores()
                        .get(sem)
                        .is_some_and(|sem| sem.waiters().contains_key(&seq)),
                })
            })
        })?;
        data.audit.check_invariants()?;
        data.auth.check_invariants()
    }
}

impl State {
    /// The locks of `ns`: every holder and queued acquire belongs to a lock lease of the
    /// namespace (recorded in `lease_holds`/`lease_waits` for the leases' check); a lock held
    /// exclusive has one holder and at most 1000 hold one shared; no two leases hold
    /// conflicting modes on the same path or on a path and its ancestor; tokens are unique;
    /// tickets are from the counter; and no queued acquire could be granted now.
    fn check_locks(
        &self,
        ns: &Namespace,
        expected: &mut Index,
        tokens: &mut BTreeSet<u64>,
        lease_holds: &mut BTreeMap<u64, BTreeSet<String>>,
        lease_waits: &mut BTreeMap<u64, BTreeSet<String>>,
    ) -> Result<(), String> {
        let locks = ns.locks();
        let name = ns.name();
        for (path, lock) in locks.held() {
            let at = |what: &str| format!("lock {name}/{path}: {what}");
            if lock.holders().is_empty() {
                return Err(at("held by nobody"));
            }
            if lock.exclusive() && lock.holders().len() != 1 {
                return Err(at("exclusive with more than one holder"));
            }
            if lock.holders().len() > HOLDERS_PER_LOCK_MAX {
                return Err(at("over the holder quota"));
            }
            for (seq, h) in lock.holders() {
                if ns
                    .leases()
                    .get(seq)
                    .is_none_or(|l| l.kind != LeaseKind::Lock)
                {
                    return Err(at(&format!(
                        "holder of lease number {seq} has no lock lease"
                    )));
                }
                if h.token == 0 || h.token > self.data.last_token || !tokens.insert(h.token) {
                    return Err(at(&format!(
                        "fencing token {} reused or not from the counter",
                        h.token
                    )));
                }
                lease_holds
                    .entry(*seq)
                    .or_default()
                    .insert(lock_object(path));
                // Conflicts are checked from the descendant's side: each of its ancestors.
                for ancestor in ancestors(path) {
                    if let Some(above) = locks.held().get(ancestor)
                        && above
                            .holders()
                            .iter()
                            .any(|(other, a)| other != seq && (a.exclusive || h.exclusive))
                    {
                        return Err(at(&format!("held beside a conflicting hold on {ancestor}")));
                    }
                }
            }
            expected.add_holders(lock.holders().len() as u64);
        }
        let mut waiting = BTreeMap::new();
        for (ticket, w) in locks.queue() {
            let at = |what: &str| format!("lock {name}/{}: {what}", w.path);
            if *ticket == 0 || *ticket > locks.last_ticket() {
                return Err(at("queue ticket not from the counter"));
            }
            if ns
                .leases()
                .get(&w.seq)
                .is_none_or(|l| l.kind != LeaseKind::Lock)
            {
                return Err(at(&format!(
                    "waiter of lease number {} has no lock lease",
                    w.seq
                )));
            }
            if locks
                .holder(&w.path, w.seq)
                .is_some_and(|h| h.exclusive || !w.exclusive)
            {
                return Err(at(
                    "a queued acquire of a lease that holds it at least as strongly",
                ));
            }
            if waiting.insert((w.path.clone(), w.seq), *ticket).is_some() {
                return Err(at("a lease queued twice for one path"));
            }
            let object = lock_object(&w.path);
            expected.add_waiter_deadline(ns.id(), &object, w.seq, w.deadline_ns);
            lease_waits.entry(w.seq).or_default().insert(object);
        }
        if waiting != *locks.waiting() {
            return Err(format!(
                "lock queue index of namespace {name} does not match the queue"
            ));
        }
        if let Some(path) = ns.grantable_lock() {
            return Err(format!(
                "lock {name}/{path}: a queued acquire could be granted but was not"
            ));
        }
        Ok(())
    }
}

/// The rules of all-or-none acquires in `ns` (see the module docs).
fn check_sets(ns: &Namespace) -> Result<(), String> {
    let name = ns.name();
    // A set entry: (lease seq, first member). Edges: entry -> the next set entry behind it in
    // some queue.
    let mut edges: BTreeMap<(u64, String), BTreeSet<(u64, String)>> = BTreeMap::new();
    for (sem_name, sem) in ns.semaphores() {
        let at = |what: &str| format!("semaphore {name}/{sem_name}: {what}");
        let mut previous: Option<(u64, String)> = None;
        for seq in sem.queue().values() {
            let Some(w) = sem.waiters().get(seq) else {
                continue;
            };
            if w.set.is_empty() {
                continue;
            }
            let distinct: BTreeSet<&String> = w.set.iter().collect();
            if !(SET_MEMBERS_MIN..=SET_MEMBERS_MAX).contains(&w.set.len())
                || distinct.len() != w.set.len()
                || !distinct.contains(sem_name)
            {
                return Err(at(&format!(
                    "set waiter of lease number {seq} names a malformed set"
                )));
            }
            for member in &w.set {
                let Some(other) = ns.semaphores().get(member) else {
                    return Err(at(&format!(
                        "set waiter of lease number {seq} names missing semaphore {member}"
                    )));
                };
                match other.waiters().get(seq) {
                    Some(o) if o.set == w.set && o.deadline_ns == w.deadline_ns => {}
                    _ => {
                        return Err(at(&format!(
                            "set waiter of lease number {seq} does not wait in member {member} \
                             with the same set and deadline"
                        )));
                    }
                }
                if other.holders().contains_key(seq) {
                    return Err(at(&format!(
                        "set waiter of lease number {seq} holds member {member} while it waits"
                    )));
                }
            }
            let entry = (*seq, w.set[0].clone());
            edges.entry(entry.clone()).or_default();
            if let Some(before) = previous.replace(entry.clone()) {
                edges.entry(before).or_default().insert(entry);
            }
        }
    }
    // Kahn's algorithm: every entry is removed iff the relation has no cycle.
    let mut incoming: BTreeMap<&(u64, String), usize> = edges.keys().map(|k| (k, 0)).collect();
    for targets in edges.values() {
        for target in targets {
            if let Some(count) = incoming.get_mut(target) {
                *count += 1;
            }
        }
    }
    let mut ready: Vec<&(u64, String)> = incoming
        .iter()
        .filter(|(_, count)| **count == 0)
        .map(|(k, _)| *k)
        .collect();
    let mut removed = 0usize;
    while let Some(entry) = ready.pop() {
        removed += 1;
        for target in edges.get(entry).into_iter().flatten() {
            if let Some(count) = incoming.get_mut(target) {
                *count -= 1;
                if *count == 0 {
                    ready.push(target);
                }
            }
        }
    }
    if removed != edges.len() {
        return Err(format!(
            "namespace {name}: set waiters stand in different orders in different queues"
        ));
    }
    Ok(())
}

//! The state and its `apply`.
//!
//! # Data
//!
//! The canonical data ([`Data`]) is what snapshots carry and [`State::hash`] covers: the clock,
//! three counters (fencing tokens, lease ids, namespace ids) and the namespaces with their
//! semaphores (holders and waiters keyed by lease) and leases. Everything else is derived and
//! rebuilt from it on decode:
//! - per semaphore: `held` (sum of holder weights), `holders_by_token` (grant order) and `queue`
//!   (ticket -> lease, i.e. FIFO order)
//! - per lease: the semaphores it holds and waits for
//! - per namespace: `leases_by_process` for the `process_id` filter
//! - globally: `lease_expiry` and `waiter_deadlines`, ordered by time, so that reaping and
//!   [`State::next_due_ns`] never scan; `namespace_names` (id -> name); the holder count
//!
//! A lease id is `ls_` + 16 hex digits of a sequence number + 8 hex digits of a mix of it, so
//! the state keys leases by the number, ids sort in creation order, and a number is never
//! reused (the counter survives namespace deletes).
//!
//! # Invariants (checked by [`State::check_invariants`])
//! - for every semaphore: sum of holder weights = `held` <= permits; at most 1000 holders and
//!   10 000 waiters; every weight is 1..=permits
//! - every holder and waiter belongs to a lease of the same namespace, and that lease lists it
//! - a lease that both holds and waits for one semaphore is upgrading: waiter weight > held
//!   weight
//! - the head of every queue cannot be granted (grants are never left undone)
//! - fencing tokens are unique and <= the token counter (each grant takes the next one, so they
//!   increase strictly in grant order); queue tickets are unique and <= the semaphore's counter
//! - every timestamp written by a command is <= the clock; the clock never decreases
//! - every derived index equals what the data implies
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
//! - Reads take the reader's `now_ns` and hide leases with `expires_at <= now_ns`, their holders
//!   and waiters, and waiters whose deadline has passed; counts in semaphore views match.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use bincode::Options;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::limits::*;
use super::paging::paginate;
use super::types::*;
use super::validate;

/// The whole replicated state. Same state + same batch => same replies and events, on every
/// node and every replay.
#[derive(Clone, Debug, Default)]
pub struct State {
    data: Data,
    index: Index,
}

/// The canonical data: what snapshots carry and `hash` covers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Data {
    clock_ns: Nanos,
    /// The last fencing token handed out (0: none yet).
    last_token: u64,
    /// The last lease sequence number handed out (0: none yet).
    last_lease_seq: u64,
    /// The last namespace id handed out (0: none yet).
    last_namespace_id: u64,
    namespaces: BTreeMap<String, Namespace>,
}

/// Indexes over [`Data`], rebuilt on decode and never serialized.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Index {
    /// `(expires_at, namespace id, lease seq)` for every lease.
    lease_expiry: BTreeSet<(Nanos, u64, u64)>,
    /// `(deadline_ns, namespace id, semaphore, lease seq)` for every waiter.
    waiter_deadlines: BTreeSet<(Nanos, u64, String, u64)>,
    namespace_names: BTreeMap<u64, String>,
    /// Number of holders over all semaphores.
    holders: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Namespace {
    id: u64,
    name: String,
    description: String,
    metadata: Metadata,
    created_at: Nanos,
    updated_at: Nanos,
    version: u64,
    semaphores: BTreeMap<String, Semaphore>,
    /// By lease sequence number. Boxed: the map's nodes stay small, which matters at a million
    /// leases.
    leases: BTreeMap<u64, Box<Lease>>,
    /// Derived: `(process_key(process_id), lease seq)`; a hash, not the string, so the index
    /// costs 16 bytes per lease. Readers compare the actual process id.
    #[serde(skip)]
    leases_by_process: BTreeSet<(u64, u64)>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Semaphore {
    description: String,
    metadata: Metadata,
    permits: u64,
    version: u64,
    created_at: Nanos,
    updated_at: Nanos,
    last_activity_at: Nanos,
    /// By lease sequence number.
    holders: BTreeMap<u64, Holder>,
    /// By lease sequence number; FIFO order is by `Waiter::ticket`.
    waiters: BTreeMap<u64, Waiter>,
    /// The last queue ticket handed out.
    last_ticket: u64,
    /// Derived: sum of holder weights.
    #[serde(skip)]
    held: u64,
    /// Derived: fencing token -> lease seq (grant order).
    #[serde(skip)]
    holders_by_token: BTreeMap<u64, u64>,
    /// Derived: ticket -> lease seq (queue order).
    #[serde(skip)]
    queue: BTreeMap<u64, u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Holder {
    weight: u64,
    locked_at: Nanos,
    metadata: Metadata,
    token: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Waiter {
    ticket: u64,
    weight: u64,
    queued_at: Nanos,
    deadline_ns: Nanos,
    metadata: Metadata,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Lease {
    process_id: String,
    metadata: Metadata,
    created_at: Nanos,
    expires_at: Nanos,
    ttl_s: u64,
    /// Derived: semaphores this lease holds.
    #[serde(skip)]
    holds: BTreeSet<String>,
    /// Derived: semaphores this lease waits for.
    #[serde(skip)]
    waits: BTreeSet<String>,
}

/// What a command may change besides its namespace: the token counter, the global indexes and
/// the event stream.
struct Ctx<'a> {
    clock_ns: Nanos,
    last_token: &'a mut u64,
    index: &'a mut Index,
    events: &'a mut Vec<Event>,
}

impl Ctx<'_> {
    fn next_token(&mut self) -> u64 {
        *self.last_token = self.last_token.saturating_add(1);
        *self.last_token
    }
}

/// Which leases, holders and waiters a read shows: those still alive at the reader's clock.
#[derive(Clone, Copy)]
struct Visibility {
    now_ns: Nanos,
    /// Nothing in the whole state is due at `now_ns`: skip the per-item checks.
    everything: bool,
}

// ---- lease ids ----

const LEASE_ID_PREFIX: &str = "ls_";

/// A deterministic 32-bit scramble of the sequence number (splitmix64's finalizer), so ids look
/// opaque without any randomness.
fn lease_mix(seq: u64) -> u32 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 32) as u32
}

fn lease_id(seq: u64) -> String {
    format!("{LEASE_ID_PREFIX}{seq:016x}{:08x}", lease_mix(seq))
}

/// The sequence number behind a lease id, if the id is one this state could have made.
fn lease_seq(id: &str) -> Option<u64> {
    let digits = id.strip_prefix(LEASE_ID_PREFIX)?;
    if digits.len() != 24
        || !digits
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let seq = u64::from_str_radix(digits.get(..16)?, 16).ok()?;
    let mix = u32::from_str_radix(digits.get(16..)?, 16).ok()?;
    (mix == lease_mix(seq)).then_some(seq)
}

fn ttl_ns(ttl_s: u64) -> Nanos {
    i64::try_from(ttl_s)
        .unwrap_or(i64::MAX)
        .saturating_mul(NANOS_PER_SEC)
}

fn namespace_not_found(name: &str) -> Error {
    Error::not_found(format!("namespace {name} not found"))
}

fn semaphore_not_found(name: &str) -> Error {
    Error::not_found(format!("semaphore {name} not found"))
}

fn lease_not_found(id: &str) -> Error {
    Error::not_found(format!("lease {id} not found"))
}

fn version_mismatch(expected: u64, found: u64) -> Error {
    Error::invalid(format!(
        "version mismatch: expected {expected}, found {found}"
    ))
}

// ---- semaphores ----

impl Semaphore {
    fn new(description: &str, permits: u64, metadata: &Metadata, clock_ns: Nanos) -> Self {
        Semaphore {
            description: description.to_string(),
            metadata: metadata.clone(),
            permits,
            version: 1,
            created_at: clock_ns,
            updated_at: clock_ns,
            last_activity_at: clock_ns,
            holders: BTreeMap::new(),
            waiters: BTreeMap::new(),
            last_ticket: 0,
            held: 0,
            holders_by_token: BTreeMap::new(),
            queue: BTreeMap::new(),
        }
    }

    /// Whether `seq` could hold `weight` now: its own current weight counts as free, and a new
    /// holder needs a free holder slot.
    fn can_grant(&self, seq: u64, weight: u64) -> bool {
        let own = self.holders.get(&seq).map_or(0, |h| h.weight);
        let fits = self.held.saturating_sub(own).saturating_add(weight) <= self.permits;
        let slot = own > 0 || self.holders.len() < HOLDERS_PER_SEMAPHORE_MAX;
        fits && slot
    }

    /// Inserts or replaces the holder of `seq`; returns the one replaced.
    fn set_holder(&mut self, seq: u64, holder: Holder) -> Option<Holder> {
        self.held = self.held.saturating_add(holder.weight);
        self.holders_by_token.insert(holder.token, seq);
        let old = self.holders.insert(seq, holder);
        if let Some(old) = &old {
            self.held = self.held.saturating_sub(old.weight);
            self.holders_by_token.remove(&old.token);
        }
        old
    }

    fn remove_holder(&mut self, seq: u64) -> Option<Holder> {
        let old = self.holders.remove(&seq)?;
        self.held = self.held.saturating_sub(old.weight);
        self.holders_by_token.remove(&old.token);
        Some(old)
    }

    fn push_waiter(&mut self, seq: u64, mut waiter: Waiter) {
        self.last_ticket = self.last_ticket.saturating_add(1);
        waiter.ticket = self.last_ticket;
        self.queue.insert(waiter.ticket, seq);
        self.waiters.insert(seq, waiter);
    }

    fn remove_waiter(&mut self, seq: u64) -> Option<Waiter> {
        let waiter = self.waiters.remove(&seq)?;
        self.queue.remove(&waiter.ticket);
        Some(waiter)
    }

    /// The view with everything counted (apply's replies: nothing is due at the clock).
    fn view(&self, name: &str) -> SemaphoreView {
        SemaphoreView {
            name: name.to_string(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            permits: self.permits,
            active_holds: self.held,
            active_holders_count: self.holders.len() as u64,
            waiters_count: self.waiters.len() as u64,
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_activity_at: self.last_activity_at,
        }
    }

    fn holder_view(&self, seq: u64) -> Option<HolderView> {
        let h = self.holders.get(&seq)?;
        Some(HolderView {
            lease_id: lease_id(seq),
            weight: h.weight,
            locked_at: h.locked_at,
            metadata: h.metadata.clone(),
            token: h.token,
        })
    }
}

fn waiter_view(seq: u64, w: &Waiter, position: u64) -> WaiterView {
    WaiterView {
        lease_id: lease_id(seq),
        weight: w.weight,
        queued_at: w.queued_at,
        deadline_ns: w.deadline_ns,
        metadata: w.metadata.clone(),
        position,
    }
}

impl Lease {
    fn view(&self, seq: u64) -> LeaseView {
        LeaseView {
            lease_id: lease_id(seq),
            process_id: self.process_id.clone(),
            metadata: self.metadata.clone(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            ttl_s: self.ttl_s,
        }
    }
}

// ---- namespaces: the commands ----

impl Namespace {
    fn view(&self) -> NamespaceView {
        NamespaceView {
            name: self.name.clone(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
        }
    }

    /// The sequence number of a lease of this namespace, or `NotFound`.
    fn find_lease(&self, id: &str) -> Result<u64, Error> {
        lease_seq(id)
            .filter(|seq| self.leases.contains_key(seq))
            .ok_or_else(|| lease_not_found(id))
    }

    fn find_semaphore(&self, name: &str) -> Result<&Semaphore, Error> {
        self.semaphores
            .get(name)
            .ok_or_else(|| semaphore_not_found(name))
    }

    fn reply_semaphore(&self, name: &str) -> Reply {
        Ok(Outcome::Semaphore(self.find_semaphore(name)?.view(name)))
    }

    fn deadline_key(&self, deadline_ns: Nanos, sem: &str, seq: u64) -> (Nanos, u64, String, u64) {
        (deadline_ns, self.id, sem.to_string(), seq)
    }

    /// Grants waiters of `sem` from the head while the head fits (strict FIFO).
    fn grant_from_head(&mut self, sem_name: &str, ctx: &mut Ctx) {
        let ns_id = self.id;
        let Some(sem) = self.semaphores.get_mut(sem_name) else {
            return;
        };
        while let Some((_, &seq)) = sem.queue.first_key_value() {
            let fits = sem
                .waiters
                .get(&seq)
                .is_some_and(|w| sem.can_grant(seq, w.weight));
            if !fits {
                break;
            }
            let Some(waiter) = sem.remove_waiter(seq) else {
                break;
            };
            ctx.index.waiter_deadlines.remove(&(
                waiter.deadline_ns,
                ns_id,
                sem_name.to_string(),
                seq,
            ));
            if let Some(lease) = self.leases.get_mut(&seq) {
                lease.waits.remove(sem_name);
                lease.holds.insert(sem_name.to_string());
            }
            let token = ctx.next_token();
            let holder = Holder {
                weight: waiter.weight,
                locked_at: ctx.clock_ns,
                metadata: waiter.metadata,
                token,
            };
            if sem.set_holder(seq, holder).is_none() {
                ctx.index.holders += 1;
            }
            ctx.events.push(Event::Granted {
                ns: self.name.clone(),
                sem: sem_name.to_string(),
                lease: lease_id(seq),
                token,
                weight: waiter.weight,
            });
        }
    }

    /// Removes the waiter of `seq` from `sem` (no grants), telling its caller `reason`.
    fn end_wait(&mut self, sem_name: &str, seq: u64, reason: WaitEnd, ctx: &mut Ctx) -> bool {
        let Some(sem) = self.semaphores.get_mut(sem_name) else {
            return false;
        };
        let Some(waiter) = sem.remove_waiter(seq) else {
            return false;
        };
        ctx.index.waiter_deadlines.remove(&(
            waiter.deadline_ns,
            self.id,
            sem_name.to_string(),
            seq,
        ));
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.waits.remove(sem_name);
        }
        ctx.events.push(Event::WaitEnded {
            ns: self.name.clone(),
            sem: sem_name.to_string(),
            lease: lease_id(seq),
            reason,
        });
        true
    }

    /// Drops the hold of `seq` on `sem` (no grants).
    fn end_hold(&mut self, sem_name: &str, seq: u64, ctx: &mut Ctx) -> bool {
        let Some(sem) = self.semaphores.get_mut(sem_name) else {
            return false;
        };
        if sem.remove_holder(seq).is_none() {
            return false;
        }
        ctx.index.holders = ctx.index.holders.saturating_sub(1);
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.holds.remove(sem_name);
        }
        true
    }

    /// Removes a lease with its holds and waits (no grants); adds the semaphores whose queues
    /// may now move to `affected`.
    fn remove_lease(&mut self, seq: u64, ctx: &mut Ctx, affected: &mut BTreeSet<String>) -> bool {
        let Some(lease) = self.leases.remove(&seq) else {
            return false;
        };
        ctx.index
            .lease_expiry
            .remove(&(lease.expires_at, self.id, seq));
        self.leases_by_process
            .remove(&(process_key(&lease.process_id), seq));
        for sem_name in &lease.holds {
            if let Some(sem) = self.semaphores.get_mut(sem_name) {
                if sem.remove_holder(seq).is_some() {
                    ctx.index.holders = ctx.index.holders.saturating_sub(1);
                }
                affected.insert(sem_name.clone());
            }
        }
        for sem_name in &lease.waits {
            if let Some(sem) = self.semaphores.get_mut(sem_name)
                && let Some(waiter) = sem.remove_waiter(seq)
            {
                ctx.index.waiter_deadlines.remove(&(
                    waiter.deadline_ns,
                    self.id,
                    sem_name.clone(),
                    seq,
                ));
                ctx.events.push(Event::WaitEnded {
                    ns: self.name.clone(),
                    sem: sem_name.clone(),
                    lease: lease_id(seq),
                    reason: WaitEnd::LeaseGone,
                });
                affected.insert(sem_name.clone());
            }
        }
        true
    }

    fn create_semaphore(
        &mut self,
        name: &str,
        description: &str,
        permits: u64,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) -> Reply {
        if self.semaphores.contains_key(name) {
            return Err(Error::already_exists(format!(
                "semaphore {name} already exists"
            )));
        }
        if self.semaphores.len() >= SEMAPHORES_PER_NAMESPACE_MAX {
            return Err(Error::exhausted(format!(
                "semaphore quota reached: at most {SEMAPHORES_PER_NAMESPACE_MAX} semaphores per namespace"
            )));
        }
        let sem = Semaphore::new(description, permits, metadata, ctx.clock_ns);
        let view = sem.view(name);
        self.semaphores.insert(name.to_string(), sem);
        Ok(Outcome::Semaphore(view))
    }

    fn update_semaphore(
        &mut self,
        name: &str,
        description: &str,
        permits: u64,
        metadata: &Metadata,
        expected_version: u64,
        ctx: &mut Ctx,
    ) -> Reply {
        let sem = self
            .semaphores
            .get_mut(name)
            .ok_or_else(|| semaphore_not_found(name))?;
        if expected_version != sem.version {
            return Err(version_mismatch(expected_version, sem.version));
        }
        if permits < sem.held {
            return Err(Error::invalid(format!(
                "permits below active holds: {permits} < {}",
                sem.held
            )));
        }
        if sem.waiters.values().any(|w| w.weight > permits) {
            return Err(Error::invalid(
                "permits below the weight of a queued waiter",
            ));
        }
        sem.description = description.to_string();
        sem.metadata = metadata.clone();
        sem.permits = permits;
        sem.version = sem.version.saturating_add(1);
        sem.updated_at = ctx.clock_ns;
        self.grant_from_head(name, ctx);
        self.reply_semaphore(name)
    }

    fn delete_semaphore(&mut self, name: &str, ctx: &mut Ctx) -> Reply {
        let Some(sem) = self.semaphores.remove(name) else {
            return Ok(Outcome::Done);
        };
        for seq in sem.holders.keys() {
            ctx.index.holders = ctx.index.holders.saturating_sub(1);
            if let Some(lease) = self.leases.get_mut(seq) {
                lease.holds.remove(name);
            }
        }
        for seq in sem.queue.values() {
            if let Some(waiter) = sem.waiters.get(seq) {
                ctx.index.waiter_deadlines.remove(&self.deadline_key(
                    waiter.deadline_ns,
                    name,
                    *seq,
                ));
            }
            if let Some(lease) = self.leases.get_mut(seq) {
                lease.waits.remove(name);
            }
            ctx.events.push(Event::WaitEnded {
                ns: self.name.clone(),
                sem: name.to_string(),
                lease: lease_id(*seq),
                reason: WaitEnd::SemaphoreGone,
            });
        }
        Ok(Outcome::Done)
    }

    fn create_lease(
        &mut self,
        process_id: &str,
        ttl_s: u64,
        metadata: &Metadata,
        last_lease_seq: &mut u64,
        ctx: &mut Ctx,
    ) -> Reply {
        if self.leases.len() >= LEASES_PER_NAMESPACE_MAX {
            return Err(Error::exhausted(format!(
                "lease quota reached: at most {LEASES_PER_NAMESPACE_MAX} leases per namespace"
            )));
        }
        let Some(seq) = last_lease_seq.checked_add(1) else {
            return Err(Error::exhausted("lease ids exhausted"));
        };
        *last_lease_seq = seq;
        let lease = Lease {
            process_id: process_id.to_string(),
            metadata: metadata.clone(),
            created_at: ctx.clock_ns,
            expires_at: ctx.clock_ns.saturating_add(ttl_ns(ttl_s)),
            ttl_s,
            holds: BTreeSet::new(),
            waits: BTreeSet::new(),
        };
        let view = lease.view(seq);
        ctx.index
            .lease_expiry
            .insert((lease.expires_at, self.id, seq));
        self.leases_by_process
            .insert((process_key(&lease.process_id), seq));
        self.leases.insert(seq, Box::new(lease));
        Ok(Outcome::Lease(view))
    }

    fn refresh_lease(&mut self, id: &str, ttl_s: u64, ctx: &mut Ctx) -> Reply {
        let seq = self.find_lease(id)?;
        let lease = self
            .leases
            .get_mut(&seq)
            .ok_or_else(|| lease_not_found(id))?;
        if ttl_s != 0 {
            lease.ttl_s = ttl_s;
        }
        let expires_at = ctx.clock_ns.saturating_add(ttl_ns(lease.ttl_s));
        ctx.index
            .lease_expiry
            .remove(&(lease.expires_at, self.id, seq));
        lease.expires_at = expires_at;
        ctx.index.lease_expiry.insert((expires_at, self.id, seq));
        Ok(Outcome::Lease(lease.view(seq)))
    }

    fn revoke_lease(&mut self, id: &str, ctx: &mut Ctx) -> Reply {
        let seq = self.find_lease(id)?;
        let mut affected = BTreeSet::new();
        self.remove_lease(seq, ctx, &mut affected);
        for sem in &affected {
            self.grant_from_head(sem, ctx);
        }
        Ok(Outcome::Done)
    }

    fn acquire(
        &mut self,
        sem_name: &str,
        id: &str,
        weight: u64,
        wait_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) -> Reply {
        let weight = weight.max(1);
        let permits = self.find_semaphore(sem_name)?.permits;
        let seq = self.find_lease(id)?;
        if weight > permits {
            return Err(validate::weight_exceeds_permits());
        }
        let clock = ctx.clock_ns;
        let ns_id = self.id;
        let Some(sem) = self.semaphores.get_mut(sem_name) else {
            return Err(semaphore_not_found(sem_name));
        };
        let held_weight = sem.holders.get(&seq).map(|h| h.weight);
        let queued = sem.waiters.contains_key(&seq);

        // Re-acquire at the same or a lower weight: granted at once, with a new token. A pending
        // upgrade of this lease is settled by it.
        if held_weight.is_some_and(|held| weight <= held) {
            if queued {
                if let Some(waiter) = sem.remove_waiter(seq) {
                    ctx.index.waiter_deadlines.remove(&(
                        waiter.deadline_ns,
                        ns_id,
                        sem_name.to_string(),
                        seq,
                    ));
                }
                if let Some(lease) = self.leases.get_mut(&seq) {
                    lease.waits.remove(sem_name);
                }
            }
            let token = ctx.next_token();
            let holder = Holder {
                weight,
                locked_at: clock,
                metadata: metadata.clone(),
                token,
            };
            sem.set_holder(seq, holder);
            sem.last_activity_at = clock;
            if queued {
                ctx.events.push(Event::Granted {
                    ns: self.name.clone(),
                    sem: sem_name.to_string(),
                    lease: id.to_string(),
                    token,
                    weight,
                });
            }
            self.grant_from_head(sem_name, ctx);
            return self.acquired(sem_name, token);
        }

        // Re-attach: keep the place in the queue, take the new weight and the later deadline.
        if queued {
            sem.last_activity_at = clock;
            if let Some(waiter) = sem.waiters.get_mut(&seq) {
                let deadline_ns = waiter.deadline_ns.max(clock.saturating_add(wait_ns));
                if deadline_ns != waiter.deadline_ns {
                    ctx.index.waiter_deadlines.remove(&(
                        waiter.deadline_ns,
                        ns_id,
                        sem_name.to_string(),
                        seq,
                    ));
                    ctx.index.waiter_deadlines.insert((
                        deadline_ns,
                        ns_id,
                        sem_name.to_string(),
                        seq,
                    ));
                    waiter.deadline_ns = deadline_ns;
                }
                waiter.weight = weight;
                waiter.metadata = metadata.clone();
            }
            self.grant_from_head(sem_name, ctx);
            let sem = self.find_semaphore(sem_name)?;
            let status = match (sem.waiters.get(&seq), sem.holders.get(&seq)) {
                (Some(waiter), _) if wait_ns > 0 => AcquireStatus::Queued {
                    deadline_ns: waiter.deadline_ns,
                },
                (Some(_), _) => AcquireStatus::Unavailable,
                (None, Some(holder)) => AcquireStatus::Acquired {
                    token: holder.token,
                },
                (None, None) => AcquireStatus::Unavailable,
            };
            return Ok(Outcome::Acquire(AcquireReply {
                status,
                semaphore: sem.view(sem_name),
            }));
        }

        // A new acquire (or an upgrade of a hold): granted at once only if nobody waits and it
        // fits; a non-blocking one never jumps the queue, and neither does a blocking one.
        let fits = sem
            .held
            .saturating_sub(held_weight.unwrap_or(0))
            .saturating_add(weight)
            <= sem.permits;
        if sem.queue.is_empty() && fits {
            if held_weight.is_none() && sem.holders.len() >= HOLDERS_PER_SEMAPHORE_MAX {
                return Err(Error::exhausted(format!(
                    "holder quota reached: at most {HOLDERS_PER_SEMAPHORE_MAX} holders per semaphore"
                )));
            }
            let token = ctx.next_token();
            let holder = Holder {
                weight,
                locked_at: clock,
                metadata: metadata.clone(),
                token,
            };
            if sem.set_holder(seq, holder).is_none() {
                ctx.index.holders += 1;
            }
            sem.last_activity_at = clock;
            if let Some(lease) = self.leases.get_mut(&seq) {
                lease.holds.insert(sem_name.to_string());
            }
            return self.acquired(sem_name, token);
        }
        if wait_ns <= 0 {
            sem.last_activity_at = clock;
            return Ok(Outcome::Acquire(AcquireReply {
                status: AcquireStatus::Unavailable,
                semaphore: sem.view(sem_name),
            }));
        }
        if sem.waiters.len() >= WAITERS_PER_SEMAPHORE_MAX {
            return Err(Error::exhausted(format!(
                "waiter quota reached: at most {WAITERS_PER_SEMAPHORE_MAX} waiters per semaphore"
            )));
        }
        let deadline_ns = clock.saturating_add(wait_ns);
        sem.push_waiter(
            seq,
            Waiter {
                ticket: 0,
                weight,
                queued_at: clock,
                deadline_ns,
                metadata: metadata.clone(),
            },
        );
        sem.last_activity_at = clock;
        ctx.index
            .waiter_deadlines
            .insert((deadline_ns, ns_id, sem_name.to_string(), seq));
        if let Some(lease) = self.leases.get_mut(&seq) {
            lease.waits.insert(sem_name.to_string());
        }
        Ok(Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Queued { deadline_ns },
            semaphore: sem.view(sem_name),
        }))
    }

    fn acquired(&self, sem_name: &str, token: u64) -> Reply {
        let sem = self.find_semaphore(sem_name)?;
        Ok(Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Acquired { token },
            semaphore: sem.view(sem_name),
        }))
    }

    fn release(&mut self, sem_name: &str, id: &str, ctx: &mut Ctx) -> Reply {
        self.find_semaphore(sem_name)?;
        let seq = self.find_lease(id)?;
        let released = self.end_hold(sem_name, seq, ctx);
        let dequeued = self.end_wait(sem_name, seq, WaitEnd::GaveUp, ctx);
        if let Some(sem) = self.semaphores.get_mut(sem_name) {
            sem.last_activity_at = ctx.clock_ns;
        }
        if released || dequeued {
            self.grant_from_head(sem_name, ctx);
        }
        self.reply_semaphore(sem_name)
    }

    fn give_up(
        &mut self,
        sem_name: &str,
        id: &str,
        deadline_ns: Nanos,
        linger_ns: Nanos,
        ctx: &mut Ctx,
    ) -> GiveUpReply {
        let Some(seq) = lease_seq(id).filter(|seq| self.leases.contains_key(seq)) else {
            return GiveUpReply::NotQueued;
        };
        let Some(sem) = self.semaphores.get(sem_name) else {
            return GiveUpReply::NotQueued;
        };
        // Queued comes first: a lease that holds and waits is upgrading, and giving up the
        // upgrade keeps the hold it had.
        if let Some(waiter) = sem.waiters.get(&seq) {
            if waiter.deadline_ns > deadline_ns {
                return GiveUpReply::StillQueued {
                    deadline_ns: waiter.deadline_ns,
                };
            }
            if linger_ns > 0 {
                let lingered = waiter
                    .deadline_ns
                    .min(ctx.clock_ns.saturating_add(linger_ns));
                let ns_id = self.id;
                if let Some(waiter) = self
                    .semaphores
                    .get_mut(sem_name)
                    .and_then(|s| s.waiters.get_mut(&seq))
                    && lingered != waiter.deadline_ns
                {
                    let key = |deadline_ns| (deadline_ns, ns_id, sem_name.to_string(), seq);
                    ctx.index.waiter_deadlines.remove(&key(waiter.deadline_ns));
                    ctx.index.waiter_deadlines.insert(key(lingered));
                    waiter.deadline_ns = lingered;
                }
                return GiveUpReply::StillQueued {
                    deadline_ns: lingered,
                };
            }
            self.end_wait(sem_name, seq, WaitEnd::GaveUp, ctx);
            self.grant_from_head(sem_name, ctx);
            return GiveUpReply::Removed;
        }
        match sem.holders.get(&seq) {
            Some(holder) => GiveUpReply::Granted {
                token: holder.token,
            },
            None => GiveUpReply::NotQueued,
        }
    }
}

// ---- the state: apply ----

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one Raft entry: advances the clock to `max(clock, batch.now_ns)`, then applies
    /// each command in order (reaping due leases and waiters before each command except
    /// `ExtendLeases`). Returns one reply per command; grants and ended waits are pushed to
    /// `events` in order.
    pub fn apply_batch(&mut self, batch: &Batch, events: &mut Vec<Event>) -> Vec<Reply> {
        self.data.clock_ns = self.data.clock_ns.max(batch.now_ns);
        batch
            .cmds
            .iter()
            .map(|cmd| self.apply(cmd, events))
            .collect()
    }

    fn apply(&mut self, cmd: &Cmd, events: &mut Vec<Event>) -> Reply {
        if !matches!(cmd, Cmd::ExtendLeases) {
            self.reap(events);
        }
        cmd.validate()?;
        let Data {
            clock_ns,
            last_token,
            last_lease_seq,
            last_namespace_id,
            namespaces,
        } = &mut self.data;
        let mut ctx = Ctx {
            clock_ns: *clock_ns,
            last_token,
            index: &mut self.index,
            events: &mut *events,
        };
        match cmd {
            Cmd::CreateNamespace {
                name,
                description,
                metadata,
            } => {
                if namespaces.contains_key(name) {
                    return Err(Error::already_exists(format!(
                        "namespace {name} already exists"
                    )));
                }
                if namespaces.len() >= NAMESPACES_MAX {
                    return Err(Error::exhausted(format!(
                        "namespace quota reached: at most {NAMESPACES_MAX} namespaces"
                    )));
                }
                let Some(id) = last_namespace_id.checked_add(1) else {
                    return Err(Error::exhausted("namespace ids exhausted"));
                };
                *last_namespace_id = id;
                let ns = Namespace {
                    id,
                    name: name.clone(),
                    description: description.clone(),
                    metadata: metadata.clone(),
                    created_at: ctx.clock_ns,
                    updated_at: ctx.clock_ns,
                    version: 1,
                    semaphores: BTreeMap::new(),
                    leases: BTreeMap::new(),
                    leases_by_process: BTreeSet::new(),
                };
                let view = ns.view();
                ctx.index.namespace_names.insert(id, name.clone());
                namespaces.insert(name.clone(), ns);
                Ok(Outcome::Namespace(view))
            }
            Cmd::UpdateNamespace {
                name,
                description,
                metadata,
                expected_version,
            } => {
                let ns = ns_mut(namespaces, name)?;
                if *expected_version != ns.version {
                    return Err(version_mismatch(*expected_version, ns.version));
                }
                ns.description = description.clone();
                ns.metadata = metadata.clone();
                ns.version = ns.version.saturating_add(1);
                ns.updated_at = ctx.clock_ns;
                Ok(Outcome::Namespace(ns.view()))
            }
            Cmd::DeleteNamespace { name } => {
                if let Some(ns) = namespaces.remove(name) {
                    delete_namespace_contents(ns, &mut ctx);
                }
                Ok(Outcome::Done)
            }
            Cmd::CreateSemaphore {
                ns,
                name,
                description,
                permits,
                metadata,
            } => ns_mut(namespaces, ns)?.create_semaphore(
                name,
                description,
                *permits,
                metadata,
                &mut ctx,
            ),
            Cmd::UpdateSemaphore {
                ns,
                name,
                description,
                permits,
                metadata,
                expected_version,
            } => ns_mut(namespaces, ns)?.update_semaphore(
                name,
                description,
                *permits,
                metadata,
                *expected_version,
                &mut ctx,
            ),
            Cmd::DeleteSemaphore { ns, name } => {
                ns_mut(namespaces, ns)?.delete_semaphore(name, &mut ctx)
            }
            Cmd::CreateLease {
                ns,
                process_id,
                ttl_s,
                metadata,
            } => ns_mut(namespaces, ns)?.create_lease(
                process_id,
                *ttl_s,
                metadata,
                last_lease_seq,
                &mut ctx,
            ),
            Cmd::RefreshLease { ns, lease, ttl_s } => {
                ns_mut(namespaces, ns)?.refresh_lease(lease, *ttl_s, &mut ctx)
            }
            Cmd::RevokeLease { ns, lease } => ns_mut(namespaces, ns)?.revoke_lease(lease, &mut ctx),
            Cmd::Acquire {
                ns,
                sem,
                lease,
                weight,
                wait_ns,
                metadata,
            } => ns_mut(namespaces, ns)?.acquire(sem, lease, *weight, *wait_ns, metadata, &mut ctx),
            Cmd::Release { ns, sem, lease } => {
                ns_mut(namespaces, ns)?.release(sem, lease, &mut ctx)
            }
            Cmd::GiveUp {
                ns,
                sem,
                lease,
                deadline_ns,
                linger_ns,
            } => {
                let reply = match namespaces.get_mut(ns) {
                    Some(ns) => ns.give_up(sem, lease, *deadline_ns, *linger_ns, &mut ctx),
                    None => GiveUpReply::NotQueued,
                };
                Ok(Outcome::GiveUp(reply))
            }
            Cmd::Expire => Ok(Outcome::Done),
            Cmd::ExtendLeases => {
                extend_leases(namespaces, &mut ctx);
                Ok(Outcome::Done)
            }
        }
    }

    /// Revokes every lease and removes every waiter due at the clock, then grants from the
    /// heads of the queues that changed. Removals come first, so a waiter that is due is never
    /// granted.
    fn reap(&mut self, events: &mut Vec<Event>) {
        let clock_ns = self.data.clock_ns;
        let mut affected: BTreeSet<(String, String)> = BTreeSet::new();
        while let Some(&(expires_at, ns_id, seq)) = self.index.lease_expiry.first() {
            if expires_at > clock_ns {
                break;
            }
            self.index.lease_expiry.pop_first();
            let Some(name) = self.index.namespace_names.get(&ns_id).cloned() else {
                continue;
            };
            let Some(ns) = self.data.namespaces.get_mut(&name) else {
                continue;
            };
            let mut ctx = Ctx {
                clock_ns,
                last_token: &mut self.data.last_token,
                index: &mut self.index,
                events: &mut *events,
            };
            let mut sems = BTreeSet::new();
            ns.remove_lease(seq, &mut ctx, &mut sems);
            affected.extend(sems.into_iter().map(|sem| (name.clone(), sem)));
        }
        while let Some((deadline_ns, ..)) = self.index.waiter_deadlines.first() {
            if *deadline_ns > clock_ns {
                break;
            }
            let Some((_, ns_id, sem, seq)) = self.index.waiter_deadlines.pop_first() else {
                break;
            };
            let Some(name) = self.index.namespace_names.get(&ns_id).cloned() else {
                continue;
            };
            let Some(ns) = self.data.namespaces.get_mut(&name) else {
                continue;
            };
            let mut ctx = Ctx {
                clock_ns,
                last_token: &mut self.data.last_token,
                index: &mut self.index,
                events: &mut *events,
            };
            ns.end_wait(&sem, seq, WaitEnd::TimedOut, &mut ctx);
            affected.insert((name, sem));
        }
        for (name, sem) in affected {
            if let Some(ns) = self.data.namespaces.get_mut(&name) {
                let mut ctx = Ctx {
                    clock_ns,
                    last_token: &mut self.data.last_token,
                    index: &mut self.index,
                    events: &mut *events,
                };
                ns.grant_from_head(&sem, &mut ctx);
            }
        }
    }

    /// The state machine's clock (ns): the largest batch time applied so far.
    pub fn clock_ns(&self) -> Nanos {
        self.data.clock_ns
    }

    /// The earliest time at which a lease expires or a waiter's deadline passes, if any.
    pub fn next_due_ns(&self) -> Option<Nanos> {
        let lease = self.index.lease_expiry.first().map(|e| e.0);
        let waiter = self.index.waiter_deadlines.first().map(|e| e.0);
        match (lease, waiter) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

fn ns_mut<'a>(
    namespaces: &'a mut BTreeMap<String, Namespace>,
    name: &str,
) -> Result<&'a mut Namespace, Error> {
    namespaces
        .get_mut(name)
        .ok_or_else(|| namespace_not_found(name))
}

/// Removes what a deleted namespace held from the global indexes; its waiters' callers learn
/// that the semaphore is gone.
fn delete_namespace_contents(ns: Namespace, ctx: &mut Ctx) {
    ctx.index.namespace_names.remove(&ns.id);
    for (sem_name, sem) in &ns.semaphores {
        ctx.index.holders = ctx.index.holders.saturating_sub(sem.holders.len() as u64);
        for seq in sem.queue.values() {
            if let Some(waiter) = sem.waiters.get(seq) {
                ctx.index.waiter_deadlines.remove(&ns.deadline_key(
                    waiter.deadline_ns,
                    sem_name,
                    *seq,
                ));
            }
            ctx.events.push(Event::WaitEnded {
                ns: ns.name.clone(),
                sem: sem_name.clone(),
                lease: lease_id(*seq),
                reason: WaitEnd::SemaphoreGone,
            });
        }
    }
    for (seq, lease) in &ns.leases {
        ctx.index
            .lease_expiry
            .remove(&(lease.expires_at, ns.id, *seq));
    }
}

/// Every lease lives at least its TTL from the clock (a new leader's first command).
fn extend_leases(namespaces: &mut BTreeMap<String, Namespace>, ctx: &mut Ctx) {
    for ns in namespaces.values_mut() {
        for (seq, lease) in ns.leases.iter_mut() {
            let at_least = ctx.clock_ns.saturating_add(ttl_ns(lease.ttl_s));
            if at_least > lease.expires_at {
                ctx.index
                    .lease_expiry
                    .remove(&(lease.expires_at, ns.id, *seq));
                lease.expires_at = at_least;
                ctx.index.lease_expiry.insert((at_least, ns.id, *seq));
            }
        }
    }
}

// ---- reads ----

impl Namespace {
    fn lease_visible(&self, seq: u64, vis: Visibility) -> bool {
        vis.everything
            || self
                .leases
                .get(&seq)
                .is_some_and(|l| l.expires_at > vis.now_ns)
    }

    fn waiter_visible(&self, seq: u64, waiter: &Waiter, vis: Visibility) -> bool {
        vis.everything || (waiter.deadline_ns > vis.now_ns && self.lease_visible(seq, vis))
    }

    /// The semaphore as a reader at `vis.now_ns` sees it.
    fn semaphore_view(&self, name: &str, sem: &Semaphore, vis: Visibility) -> SemaphoreView {
        let mut view = sem.view(name);
        if !vis.everything {
            let live: Vec<u64> = sem
                .holders
                .iter()
                .filter(|(seq, _)| self.lease_visible(**seq, vis))
                .map(|(_, h)| h.weight)
                .collect();
            view.active_holds = live.iter().fold(0u64, |sum, w| sum.saturating_add(*w));
            view.active_holders_count = live.len() as u64;
            view.waiters_count = sem
                .waiters
                .iter()
                .filter(|(seq, w)| self.waiter_visible(**seq, w, vis))
                .count() as u64;
        }
        view
    }
}

impl State {
    fn visibility(&self, now_ns: Nanos) -> Visibility {
        let everything = self.next_due_ns().is_none_or(|due| due > now_ns);
        Visibility { now_ns, everything }
    }

    fn namespace(&self, name: &str) -> Result<&Namespace, Error> {
        self.data
            .namespaces
            .get(name)
            .ok_or_else(|| namespace_not_found(name))
    }

    pub fn get_namespace(&self, name: &str) -> Result<NamespaceView, Error> {
        validate::name("namespace_name", name)?;
        Ok(self.namespace(name)?.view())
    }

    pub fn list_namespaces(&self, page: &PageRequest) -> Result<Page<NamespaceView>, Error> {
        paginate(page, |lo, hi| {
            self.data
                .namespaces
                .range((lo, hi))
                .map(|(k, ns)| (k.clone(), ns.view()))
        })
    }

    pub fn get_semaphore(
        &self,
        ns: &str,
        name: &str,
        now_ns: Nanos,
    ) -> Result<SemaphoreView, Error> {
        validate::name("namespace_name", ns)?;
        validate::name("semaphore_name", name)?;
        let namespace = self.namespace(ns)?;
        let sem = namespace.find_semaphore(name)?;
        Ok(namespace.semaphore_view(name, sem, self.visibility(now_ns)))
    }

    pub fn list_semaphores(
        &self,
        ns: &str,
        page: &PageRequest,
        now_ns: Nanos,
    ) -> Result<Page<SemaphoreView>, Error> {
        validate::name("namespace_name", ns)?;
        let namespace = self.namespace(ns)?;
        let vis = self.visibility(now_ns);
        paginate(page, |lo, hi| {
            namespace
                .semaphores
                .range((lo, hi))
                .map(move |(name, sem)| (name.clone(), namespace.semaphore_view(name, sem, vis)))
        })
    }

    /// Holders in grant order (by fencing token).
    pub fn list_holders(
        &self,
        ns: &str,
        sem: &str,
        page: &PageRequest,
        now_ns: Nanos,
    ) -> Result<Page<HolderView>, Error> {
        validate::name("namespace_name", ns)?;
        validate::name("semaphore_name", sem)?;
        let namespace = self.namespace(ns)?;
        let semaphore = namespace.find_semaphore(sem)?;
        let vis = self.visibility(now_ns);
        paginate(page, |lo, hi| {
            semaphore
                .holders_by_token
                .range((lo, hi))
                .filter(move |(_, seq)| namespace.lease_visible(**seq, vis))
                .filter_map(|(token, seq)| Some((*token, semaphore.holder_view(*seq)?)))
        })
    }

    /// Waiters in queue order, with the semaphore.
    pub fn list_waiters(
        &self,
        ns: &str,
        sem: &str,
        page: &PageRequest,
        now_ns: Nanos,
    ) -> Result<(SemaphoreView, Page<WaiterView>), Error> {
        validate::name("namespace_name", ns)?;
        validate::name("semaphore_name", sem)?;
        let namespace = self.namespace(ns)?;
        let semaphore = namespace.find_semaphore(sem)?;
        let vis = self.visibility(now_ns);
        let visible = move |seq: &u64| {
            semaphore
                .waiters
                .get(seq)
                .filter(|w| namespace.waiter_visible(*seq, w, vis))
                .map(|w| (*seq, w))
        };
        let mut page = paginate(page, |lo, hi| {
            semaphore
                .queue
                .range((lo, hi))
                .filter_map(move |(ticket, seq)| {
                    visible(seq).map(|(seq, w)| (*ticket, (*ticket, seq, w)))
                })
        })?;
        // Positions count the visible waiters ahead; the page's waiters are consecutive.
        let first_position = match page.items.first() {
            Some((ticket, ..)) => semaphore
                .queue
                .range(..*ticket)
                .filter(|(_, seq)| visible(seq).is_some())
                .count(),
            None => 0,
        };
        let items = page
            .items
            .drain(..)
            .enumerate()
            .map(|(i, (_, seq, w))| waiter_view(seq, w, (first_position + i) as u64))
            .collect();
        let waiters = Page {
            items,
            next_token: page.next_token,
            previous_token: page.previous_token,
        };
        Ok((namespace.semaphore_view(sem, semaphore, vis), waiters))
    }

    pub fn get_lease(&self, ns: &str, lease: &str, now_ns: Nanos) -> Result<LeaseView, Error> {
        validate::name("namespace_name", ns)?;
        validate::lease_id(lease)?;
        let namespace = self.namespace(ns)?;
        lease_seq(lease)
            .and_then(|seq| Some((seq, namespace.leases.get(&seq)?)))
            .filter(|(_, l)| l.expires_at > now_ns)
            .map(|(seq, l)| l.view(seq))
            .ok_or_else(|| lease_not_found(lease))
    }

    /// Leases in creation order; `process_id` filters when `Some`.
    pub fn list_leases(
        &self,
        ns: &str,
        process_id: Option<&str>,
        page: &PageRequest,
        now_ns: Nanos,
    ) -> Result<Page<LeaseView>, Error> {
        validate::name("namespace_name", ns)?;
        if let Some(process_id) = process_id {
            validate::process_id(process_id)?;
        }
        let namespace = self.namespace(ns)?;
        let alive = move |lease: &Lease| lease.expires_at > now_ns;
        match process_id {
            None => paginate(page, |lo, hi| {
                namespace
                    .leases
                    .range((lo, hi))
                    .filter(move |(_, l)| alive(l))
                    .map(|(seq, l)| (*seq, l.view(*seq)))
            }),
            Some(process_id) => paginate(page, |lo: Bound<u64>, hi: Bound<u64>| {
                // Only one bound is ever given, so the range below is never inverted.
                let key = |seq| (process_key(process_id), seq);
                let lo = match lo {
                    Bound::Unbounded => Bound::Included(key(0)),
                    Bound::Included(seq) => Bound::Included(key(seq)),
                    Bound::Excluded(seq) => Bound::Excluded(key(seq)),
                };
                let hi = match hi {
                    Bound::Unbounded => Bound::Included(key(u64::MAX)),
                    Bound::Included(seq) => Bound::Included(key(seq)),
                    Bound::Excluded(seq) => Bound::Excluded(key(seq)),
                };
                namespace
                    .leases_by_process
                    .range((lo, hi))
                    .filter_map(|(_, seq)| Some((*seq, &**namespace.leases.get(seq)?)))
                    .filter(move |(_, l)| l.process_id == process_id && alive(l))
                    .map(|(seq, l)| (seq, l.view(seq)))
            }),
        }
    }

    /// The holder of `sem` owned by `lease`, if it holds (no expiry filtering).
    pub fn holder(&self, ns: &str, sem: &str, lease: &str) -> Option<HolderView> {
        let namespace = self.data.namespaces.get(ns)?;
        namespace
            .semaphores
            .get(sem)?
            .holder_view(lease_seq(lease)?)
    }

    /// The waiter of `sem` owned by `lease`, if queued (no expiry filtering).
    pub fn waiter(&self, ns: &str, sem: &str, lease: &str) -> Option<WaiterView> {
        let semaphore = self.data.namespaces.get(ns)?.semaphores.get(sem)?;
        let seq = lease_seq(lease)?;
        let waiter = semaphore.waiters.get(&seq)?;
        let position = semaphore.queue.range(..waiter.ticket).count() as u64;
        Some(waiter_view(seq, waiter, position))
    }

    pub fn stats(&self) -> Stats {
        Stats {
            namespaces: self.data.namespaces.len() as u64,
            semaphores: self
                .data
                .namespaces
                .values()
                .map(|ns| ns.semaphores.len() as u64)
                .sum(),
            leases: self.index.lease_expiry.len() as u64,
            holders: self.index.holders,
            waiters: self.index.waiter_deadlines.len() as u64,
        }
    }
}

// ---- hashing, snapshots, invariants ----

/// Snapshot header: magic, then the format version (little endian u32), then the data.
const SNAPSHOT_MAGIC: &[u8; 8] = b"conch-sm";
const SNAPSHOT_FORMAT: u32 = 1;

fn bincode_options() -> impl Options {
    // Varint integers, little endian, trailing bytes rejected.
    bincode::DefaultOptions::new()
}

/// FNV-1a, 64 bit: fixed, portable, written out so no library's hasher choice can change it.
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// 64-bit FNV-1a of `bytes`: the state hash's function, also the storage checksums'. Not
/// cryptographic: it catches torn writes and bit rot, not tampering.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv1a(Fnv1a::OFFSET_BASIS);
    hasher.update(bytes);
    hasher.0
}

/// The key of a process id in `leases_by_process`.
fn process_key(process_id: &str) -> u64 {
    fnv1a64(process_id.as_bytes())
}

impl std::io::Write for Fnv1a {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.update(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Serialize for State {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.data.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for State {
    /// Deserializes the canonical data and rebuilds (and checks) every index.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let data = Data::deserialize(deserializer)?;
        State::from_data(data).map_err(serde::de::Error::custom)
    }
}

impl State {
    /// A 64-bit hash of the whole state; equal states hash equal on every node and build.
    pub fn hash(&self) -> u64 {
        let mut hasher = Fnv1a(Fnv1a::OFFSET_BASIS);
        // Writing into the hasher cannot fail, and the data has no unserializable parts; a
        // failure would still hash deterministically (to a truncated prefix).
        let _ = bincode_options().serialize_into(&mut hasher, &self.data);
        hasher.0
    }

    pub fn encode_snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(SNAPSHOT_MAGIC);
        bytes.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        bincode_options()
            .serialize_into(&mut bytes, &self.data)
            .map_err(|e| SnapshotError::Encode(e.to_string()))?;
        Ok(bytes)
    }

    /// Decodes and checks a snapshot; indexes are rebuilt, never trusted from the bytes.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let rest = bytes
            .strip_prefix(SNAPSHOT_MAGIC.as_slice())
            .ok_or_else(|| {
                SnapshotError::Decode("not a conch state snapshot (bad magic)".into())
            })?;
        let (format, rest) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| SnapshotError::Decode("truncated header".into()))?;
        let format = u32::from_le_bytes(*format);
        if format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Decode(format!(
                "unsupported format version {format} (this build reads {SNAPSHOT_FORMAT})"
            )));
        }
        let data: Data = bincode_options()
            .with_limit(rest.len() as u64)
            .deserialize(rest)
            .map_err(|e| SnapshotError::Decode(e.to_string()))?;
        State::from_data(data).map_err(SnapshotError::Inconsistent)
    }

    /// Builds the state from canonical data: fills every derived field and index, then checks
    /// every invariant.
    fn from_data(mut data: Data) -> Result<State, String> {
        let mut index = Index::default();
        for (name, ns) in data.namespaces.iter_mut() {
            if index.namespace_names.insert(ns.id, name.clone()).is_some() {
                return Err(format!("namespace id {} is used twice", ns.id));
            }
            ns.leases_by_process.clear();
            for (seq, lease) in ns.leases.iter_mut() {
                lease.holds.clear();
                lease.waits.clear();
                index.lease_expiry.insert((lease.expires_at, ns.id, *seq));
                ns.leases_by_process
                    .insert((process_key(&lease.process_id), *seq));
            }
            for (sem_name, sem) in ns.semaphores.iter_mut() {
                sem.held = 0;
                sem.holders_by_token.clear();
                sem.queue.clear();
                for (seq, holder) in &sem.holders {
                    sem.held = sem.held.saturating_add(holder.weight);
                    sem.holders_by_token.insert(holder.token, *seq);
                    index.holders = index.holders.saturating_add(1);
                    let lease = ns.leases.get_mut(seq).ok_or_else(|| {
                        format!(
                            "holder {} of {name}/{sem_name} has no lease",
                            lease_id(*seq)
                        )
                    })?;
                    lease.holds.insert(sem_name.clone());
                }
                for (seq, waiter) in &sem.waiters {
                    sem.queue.insert(waiter.ticket, *seq);
                    index.waiter_deadlines.insert((
                        waiter.deadline_ns,
                        ns.id,
                        sem_name.clone(),
                        *seq,
                    ));
                    let lease = ns.leases.get_mut(seq).ok_or_else(|| {
                        format!(
                            "waiter {} of {name}/{sem_name} has no lease",
                            lease_id(*seq)
                        )
                    })?;
                    lease.waits.insert(sem_name.clone());
                }
            }
        }
        let state = State { data, index };
        state.check_invariants()?;
        Ok(state)
    }

    /// Verifies every invariant listed in the module docs, and that indexes match the data.
    pub fn check_invariants(&self) -> Result<(), String> {
        let data = &self.data;
        let clock = data.clock_ns;
        let mut expected = Index::default();
        let mut tokens = BTreeSet::new();
        for (name, ns) in &data.namespaces {
            let at = |what: &str| format!("namespace {name}: {what}");
            if ns.name != *name {
                return Err(at(&format!("stored under a different name {}", ns.name)));
            }
            if ns.id == 0 || ns.id > data.last_namespace_id {
                return Err(at("id not from the counter"));
            }
            if expected
                .namespace_names
                .insert(ns.id, name.clone())
                .is_some()
            {
                return Err(at("id used twice"));
            }
            if ns.version == 0 || ns.created_at > ns.updated_at || ns.updated_at > clock {
                return Err(at("version or timestamps out of order"));
            }
            // What each lease should list, from the semaphores' side.
            let mut lease_holds: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
            let mut lease_waits: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
            for (sem_name, sem) in &ns.semaphores {
                let at = |what: &str| format!("semaphore {name}/{sem_name}: {what}");
                if !(1..=PERMITS_MAX).contains(&sem.permits) {
                    return Err(at("permits out of range"));
                }
                if sem.version == 0
                    || sem.created_at > sem.updated_at
                    || sem.updated_at > clock
                    || sem.last_activity_at > clock
                {
                    return Err(at("version or timestamps out of order"));
                }
                let mut held = 0u64;
                let mut by_token = BTreeMap::new();
                for (seq, h) in &sem.holders {
                    if !ns.leases.contains_key(seq) {
                        return Err(at(&format!("holder {} has no lease", lease_id(*seq))));
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
                    if h.locked_at > clock {
                        return Err(at("holder locked in the future"));
                    }
                    held = held.saturating_add(h.weight);
                    by_token.insert(h.token, *seq);
                    lease_holds.entry(*seq).or_default().insert(sem_name);
                }
                if held > sem.permits {
                    return Err(at(&format!(
                        "held weight {held} exceeds permits {}",
                        sem.permits
                    )));
                }
                if held != sem.held || by_token != sem.holders_by_token {
                    return Err(at("holder index does not match the holders"));
                }
                if sem.holders.len() > HOLDERS_PER_SEMAPHORE_MAX
                    || sem.waiters.len() > WAITERS_PER_SEMAPHORE_MAX
                {
                    return Err(at("over the holder or waiter quota"));
                }
                let mut queue = BTreeMap::new();
                for (seq, w) in &sem.waiters {
                    if !ns.leases.contains_key(seq) {
                        return Err(at(&format!("waiter {} has no lease", lease_id(*seq))));
                    }
                    if w.weight == 0 || w.weight > sem.permits {
                        return Err(at("waiter weight out of range"));
                    }
                    if sem.holders.get(seq).is_some_and(|h| h.weight >= w.weight) {
                        return Err(at("an upgrading waiter must want more than it holds"));
                    }
                    if w.ticket == 0
                        || w.ticket > sem.last_ticket
                        || queue.insert(w.ticket, *seq).is_some()
                    {
                        return Err(at("queue ticket reused or not from the counter"));
                    }
                    if w.queued_at > clock {
                        return Err(at("waiter queued in the future"));
                    }
                    expected.waiter_deadlines.insert((
                        w.deadline_ns,
                        ns.id,
                        sem_name.clone(),
                        *seq,
                    ));
                    lease_waits.entry(*seq).or_default().insert(sem_name);
                }
                if queue != sem.queue {
                    return Err(at("queue index does not match the waiters"));
                }
                if let Some((_, seq)) = sem.queue.first_key_value()
                    && let Some(head) = sem.waiters.get(seq)
                    && sem.can_grant(*seq, head.weight)
                {
                    return Err(at("the head of the queue fits but was not granted"));
                }
                expected.holders = expected.holders.saturating_add(sem.holders.len() as u64);
            }
            let mut by_process = BTreeSet::new();
            for (seq, lease) in &ns.leases {
                let at = |what: &str| format!("lease {} in {name}: {what}", lease_id(*seq));
                if *seq == 0 || *seq > data.last_lease_seq {
                    return Err(at("id not from the counter"));
                }
                if !(TTL_MIN_S..=TTL_MAX_S).contains(&lease.ttl_s) || lease.created_at > clock {
                    return Err(at("ttl or creation time out of range"));
                }
                let holds: BTreeSet<&str> = lease.holds.iter().map(String::as_str).collect();
                let waits: BTreeSet<&str> = lease.waits.iter().map(String::as_str).collect();
                if holds != lease_holds.remove(seq).unwrap_or_default()
                    || waits != lease_waits.remove(seq).unwrap_or_default()
                {
                    return Err(at("holds/waits do not match the semaphores"));
                }
                expected
                    .lease_expiry
                    .insert((lease.expires_at, ns.id, *seq));
                by_process.insert((process_key(&lease.process_id), *seq));
            }
            if by_process != ns.leases_by_process {
                return Err(at("process index does not match the leases"));
            }
        }
        if expected != self.index {
            return Err("global indexes do not match the data".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

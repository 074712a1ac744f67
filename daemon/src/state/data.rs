//! The data and its indexes.
//!
//! The canonical data ([`Data`]) is what snapshots carry and [`State::hash`] covers: the lease
//! clock, the newest wall-clock stamp, three counters (fencing tokens, lease ids, namespace ids),
//! the namespaces with their semaphores (holders and waiters keyed by lease) and leases, and the
//! remembered request ids (`requests.rs`, which keeps that table's own indexes), the audit trail
//! (`audit.rs`). Everything else
//! is derived:
//! - per semaphore: `held` (sum of holder weights), `holders_by_token` (grant order) and `queue`
//!   (ticket -> lease, i.e. FIFO order)
//! - per lease: the semaphores it holds and waits for
//! - per namespace: `leases_by_process` for the `process_id` filter
//! - globally ([`Index`]): `lease_expiry` and `waiter_deadlines`, ordered by time, so that
//!   reaping and [`State::next_due_ns`] never scan; `namespace_names` (id -> name); the holder
//!   count
//!
//! What always holds here: every derived field and index equals what the data implies. The
//! collections a derived index depends on are private to this module, index keys are built
//! only by [`Index`]'s own methods, and the only ways to change the data are the methods of this
//! module's children (`namespace.rs`: `add_holder`, `remove_holder`, `add_waiter`,
//! `remove_waiter`, `set_waiter_deadline`, `add_lease`, `remove_lease`, `set_lease_expiry`,
//! `remove_semaphore`, [`Namespaces::add`], [`Namespaces::remove`]; `locks.rs`: the lock
//! table's; `sync.rs`: wait groups' and barriers'), each of which updates every index it
//! touches. They decide nothing: which grant, which event, which error is the command code's
//! business. This file holds the data's types, the indexes and rebuilding them from the data;
//! `records.rs` the constructors, sizes and accessors of a semaphore and a lease.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::audit::Audit;
use super::auth::Auth;
use super::hash::fnv1a64;
use super::lock_data::LockTable;
use super::quota::{Budget, Quotas, Usage};
use super::requests::Requests;
use super::small_map::{SmallMap, SmallSet};
use super::types::*;
use super::version::ClusterVersion;

mod locks;
mod namespace;
mod records;
mod sync;
pub(super) use locks::lock_entry_bytes;
pub(super) use sync::{Barrier, Job, Participant, WaitGroup};

/// The whole replicated state. Same state + same batch => same replies and events, on every
/// node and every replay.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub(super) data: Data,
    index: Index,
    /// What applying did, for metrics; neither replicated nor hashed.
    tally: Tally,
}

/// Counts of what applying batches did on this node since the last [`State::take_tally`]:
/// grants, each queued grant's wait, and lease expirations. They never influence a reply, an
/// event or the data, so states that differ only here are the same state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Every grant (immediate or from a queue).
    pub grants: u64,
    /// For each grant that ended a wait: wall-clock time from entering the queue to the grant.
    pub waits_ns: Vec<Nanos>,
    /// Leases revoked because their expiry passed.
    pub expirations: u64,
    /// Holds ended because their hold limit passed.
    pub holds_ended: u64,
    /// Semaphores, as (namespace, semaphore), whose holders changed: a hold added, replaced
    /// or dropped, or the semaphore deleted. Holder watches wake on these only.
    pub holders_changed: BTreeSet<(String, String)>,
}

/// The canonical data: what snapshots carry and `hash` covers.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Data {
    pub(super) clock_ns: Nanos,
    /// The last fencing token handed out (0: none yet).
    pub(super) last_token: u64,
    /// The last lease sequence number handed out (0: none yet).
    pub(super) last_lease_seq: u64,
    /// The last namespace id handed out (0: none yet).
    pub(super) last_namespace_id: u64,
    pub(super) namespaces: Namespaces,
    /// Remembered request ids and their replies (see `requests.rs`).
    pub(super) requests: Requests,
    /// The newest batch's wall-clock stamp: only for the times users read (it may go back).
    pub(super) wall_ns: Nanos,
    /// Access control: roles, token hashes, the enabled flag.
    pub(super) auth: Auth,
    /// The budget on the stored bytes of all namespaces together (`quota.rs`).
    pub(super) budget: Budget,
    /// The audit trail of revokes, forced releases, capacity and quota changes (`audit.rs`).
    pub(super) audit: Audit,
    /// The cluster version (`version.rs`). Not in this struct's serde layout, which is data
    /// format 7's: the encoding of later formats appends it (`snapshot.rs`).
    #[serde(skip)]
    pub(super) cluster_version: ClusterVersion,
}

/// Indexes over [`Data`], rebuilt on decode and never serialized. The state's own index is
/// reached only through `&` outside this module; the invariant check builds a fresh one with
/// the same methods to compare.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Index {
    /// `(expires_at, namespace id, lease seq)` for every lease.
    lease_expiry: BTreeSet<(Nanos, u64, u64)>,
    /// `(deadline_ns, namespace id, semaphore, lease seq)` for every waiter.
    waiter_deadlines: BTreeSet<(Nanos, u64, String, u64)>,
    /// `(ends_at, namespace id, semaphore, lease seq)` for every semaphore hold with a hold
    /// limit ([`Holder::ends_at`]).
    hold_ends: BTreeSet<(Nanos, u64, String, u64)>,
    namespace_names: BTreeMap<u64, String>,
    /// Number of holders over all semaphores.
    holders: u64,
    /// Stored bytes of all namespaces (`quota.rs`).
    bytes: u64,
    /// When something is due for each wait group and barrier (`data/sync.rs`).
    sync_due: sync::SyncDue,
}

/// The namespaces by name. Serialized exactly as the map it wraps.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct Namespaces(BTreeMap<String, Namespace>);

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Namespace {
    id: u64,
    name: String,
    pub(super) description: String,
    pub(super) metadata: Metadata,
    pub(super) created_at: Nanos,
    pub(super) updated_at: Nanos,
    pub(super) version: u64,
    semaphores: BTreeMap<String, Semaphore>,
    /// By lease sequence number. Boxed: the map's nodes stay small, which matters at a million
    /// leases.
    leases: BTreeMap<u64, Box<Lease>>,
    quotas: Quotas,
    locks: LockTable,
    /// Wait groups and barriers (`data/sync.rs`).
    sync: sync::SyncObjects,
    /// Derived: `(process_key(process_id), lease seq)`; a hash, not the string, so the index
    /// costs 16 bytes per lease. Readers compare the actual process id.
    #[serde(skip)]
    leases_by_process: BTreeSet<(u64, u64)>,
    /// Derived: what it uses of its quotas.
    #[serde(skip)]
    usage: Usage,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Semaphore {
    pub(super) description: String,
    pub(super) metadata: Metadata,
    pub(super) permits: u64,
    pub(super) version: u64,
    pub(super) created_at: Nanos,
    pub(super) updated_at: Nanos,
    pub(super) last_activity_at: Nanos,
    /// The longest any grant may hold this semaphore, on the lease clock (0: no limit). An
    /// acquire may ask for less; the smaller wins. A change applies to later grants.
    pub(super) max_hold_ns: Nanos,
    /// By lease sequence number. Small maps: most semaphores have a holder or two, and a
    /// `BTreeMap`'s first node has room for eleven (see `small_map.rs`).
    holders: SmallMap<u64, Holder>,
    /// By lease sequence number; FIFO order is by `Waiter::ticket`.
    waiters: SmallMap<u64, Waiter>,
    /// The last queue ticket handed out.
    last_ticket: u64,
    /// Derived: sum of holder weights.
    #[serde(skip)]
    held: u64,
    /// Derived: fencing token -> lease seq (grant order).
    #[serde(skip)]
    holders_by_token: SmallMap<u64, u64>,
    /// Derived: ticket -> lease seq (queue order).
    #[serde(skip)]
    queue: SmallMap<u64, u64>,
}

/// Reached only through `&` outside this module: a hold changes by replacing it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Holder {
    pub(super) weight: u64,
    pub(super) locked_at: Nanos,
    pub(super) metadata: Metadata,
    pub(super) token: u64,
    /// When the hold ends whatever the lease does, on the lease clock (0: never). A
    /// re-acquire by the same lease keeps the earlier end.
    pub(super) ends_at: Nanos,
    /// The same instant on the wall clock, for users to read (0: never).
    pub(super) ends_wall: Nanos,
}

impl Holder {
    /// How long the hold may still last at lease clock `clock_ns` (0: no hold limit; a hold at
    /// or past its end has none of it left, which reaping is about to make true).
    pub(super) fn hold_left(&self, clock_ns: Nanos) -> Nanos {
        hold_left(self.ends_at, clock_ns)
    }
}

/// What is left at `clock_ns` of a hold ending at `ends_at` (0 for both: no hold limit).
pub(super) fn hold_left(ends_at: Nanos, clock_ns: Nanos) -> Nanos {
    match ends_at {
        0 => 0,
        end => end.saturating_sub(clock_ns),
    }
}

/// Reached only through `&` outside this module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Waiter {
    pub(super) ticket: u64,
    pub(super) weight: u64,
    pub(super) queued_at: Nanos,
    pub(super) deadline_ns: Nanos,
    pub(super) metadata: Metadata,
    /// The hold limit the acquire asked for (0: only the semaphore's).
    pub(super) max_hold_ns: Nanos,
    /// Empty for a single acquire. For an all-or-none acquire (`set.rs`): every member's
    /// semaphore name, this one included, in the order of the command; the lease waits in
    /// each of them with the same set and deadline, and is granted all of them at once.
    pub(super) set: Vec<String>,
}

/// Reached only through `&` outside this module.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Lease {
    pub(super) process_id: String,
    pub(super) metadata: Metadata,
    pub(super) created_at: Nanos,
    pub(super) expires_at: Nanos,
    pub(super) ttl_s: u64,
    /// The id of the token that created it (none: created without a known token). While
    /// access control is on, only that token, or one with admin on the namespace, may use it.
    pub(super) owner: Option<u64>,
    /// The secret part of the lease's id (see `lease_id.rs`).
    pub(super) secret: u64,
    pub(super) kind: LeaseKind,
    /// Derived: what this lease holds: semaphore names, or lock objects ([`lock_object`]).
    #[serde(skip)]
    pub(super) holds: SmallSet<String>,
    /// Derived: what this lease waits for, named as in `holds`.
    #[serde(skip)]
    pub(super) waits: SmallSet<String>,
}

/// What a command may change besides its namespace: the token counter, the global indexes
/// (only through the methods of this module) and the event stream.
pub(super) struct Ctx<'a> {
    /// The lease clock: every expiry and deadline is measured on it.
    pub(super) clock_ns: Nanos,
    /// The wall clock: every time stored for users to read (`created_at`, ...) takes it.
    pub(super) wall_ns: Nanos,
    /// The state's budget on stored bytes (see `quota.rs`).
    pub(super) budget_bytes: u64,
    last_token: &'a mut u64,
    index: &'a mut Index,
    pub(super) events: &'a mut Vec<Event>,
    pub(super) tally: &'a mut Tally,
}

/// A state taken apart for one command: what the command may change.
pub(super) struct Parts<'a> {
    pub(super) namespaces: &'a mut Namespaces,
    pub(super) last_lease_seq: &'a mut u64,
    pub(super) last_namespace_id: &'a mut u64,
    pub(super) ctx: Ctx<'a>,
    pub(super) auth: &'a mut Auth,
    pub(super) budget: &'a mut Budget,
    /// Read only: the remembered request ids (`once.rs` changes them, around a command).
    pub(super) requests: &'a Requests,
    pub(super) audit: &'a mut Audit,
    pub(super) cluster_version: &'a mut ClusterVersion,
}

/// The key of a process id in `leases_by_process`.
pub(super) fn process_key(process_id: &str) -> u64 {
    fnv1a64(process_id.as_bytes())
}

impl State {
    /// Returns and resets what applying did since the last call.
    pub fn take_tally(&mut self) -> Tally {
        std::mem::take(&mut self.tally)
    }

    pub(super) fn index(&self) -> &Index {
        &self.index
    }

    pub(super) fn parts<'a>(&'a mut self, events: &'a mut Vec<Event>) -> Parts<'a> {
        let Data {
            clock_ns,
            last_token,
            last_lease_seq,
            last_namespace_id,
            namespaces,
            wall_ns,
            auth,
            budget,
            requests,
            audit,
            cluster_version,
            ..
        } = &mut self.data;
        Parts {
            namespaces,
            last_lease_seq,
            last_namespace_id,
            ctx: Ctx {
                clock_ns: *clock_ns,
                wall_ns: *wall_ns,
                budget_bytes: budget.bytes,
                last_token,
                index: &mut self.index,
                events,
                tally: &mut self.tally,
            },
            auth,
            budget,
            requests,
            audit,
            cluster_version,
        }
    }

    /// Builds the state from canonical data, filling every derived field and index from it
    /// (whatever the bytes held for them). Fails only on references to missing things; the
    /// caller checks the invariants.
    pub(super) fn rebuild(mut data: Data) -> Result<State, String> {
        data.requests.rebuild()?;
        let mut index = Index::default();
        data.auth.rebuild()?;
        for (name, ns) in data.namespaces.0.iter_mut() {
            if !index.add_namespace(ns.id, name) {
                return Err(format!("namespace id {} is used twice", ns.id));
            }
            ns.leases_by_process.clear();
            for (seq, lease) in ns.leases.iter_mut() {
                lease.holds.clear();
                lease.waits.clear();
                index.add_lease_expiry(ns.id, *seq, lease.expires_at);
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
                    index.add_holders(1);
                    index.add_hold_end(ns.id, sem_name, *seq, holder.ends_at);
                    let lease = ns.leases.get_mut(seq).ok_or_else(|| {
                        format!("holder of lease number {seq} in {name}/{sem_name} has no lease")
                    })?;
                    lease.holds.insert(sem_name.clone());
                }
                for (seq, waiter) in &sem.waiters {
                    sem.queue.insert(waiter.ticket, *seq);
                    index.add_waiter_deadline(ns.id, sem_name, *seq, waiter.deadline_ns);
                    let lease = ns.leases.get_mut(seq).ok_or_else(|| {
                        format!("waiter of lease number {seq} in {name}/{sem_name} has no lease")
                    })?;
                    lease.waits.insert(sem_name.clone());
                }
            }
            ns.locks.rebuild()?;
            for (path, lock) in ns.locks.held() {
                for seq in lock.holders().keys() {
                    index.add_holders(1);
                    lease_of_kind(&mut ns.leases, *seq, LeaseKind::Lock, name, path)?
                        .holds
                        .insert(lock_object(path));
                }
            }
            for waiter in ns.locks.queue().values() {
                let object = lock_object(&waiter.path);
                index.add_waiter_deadline(ns.id, &object, waiter.seq, waiter.deadline_ns);
                lease_of_kind(
                    &mut ns.leases,
                    waiter.seq,
                    LeaseKind::Lock,
                    name,
                    &waiter.path,
                )?
                .waits
                .insert(object);
            }
            ns.sync.rebuild(ns.id, &mut index);
            ns.usage = ns.computed_usage();
            index.add_bytes(ns.usage.bytes);
        }
        Ok(State {
            data,
            index,
            tally: Tally::default(),
        })
    }
}

/// The lease `seq` of namespace `ns`, which a hold or wait on lock `path` names; an error if it
/// is missing or of another kind.
fn lease_of_kind<'a>(
    leases: &'a mut BTreeMap<u64, Box<Lease>>,
    seq: u64,
    kind: LeaseKind,
    ns: &str,
    path: &str,
) -> Result<&'a mut Lease, String> {
    match leases.get_mut(&seq) {
        Some(lease) if lease.kind == kind => Ok(lease),
        Some(_) => Err(format!(
            "lease number {seq} on lock {ns}/{path} is not a lock lease"
        )),
        None => Err(format!(
            "lease number {seq} on lock {ns}/{path} has no lease"
        )),
    }
}

impl Index {
    pub(super) fn add_lease_expiry(&mut self, ns_id: u64, seq: u64, expires_at: Nanos) {
        self.lease_expiry.insert((expires_at, ns_id, seq));
    }

    fn remove_lease_expiry(&mut self, ns_id: u64, seq: u64, expires_at: Nanos) {
        self.lease_expiry.remove(&(expires_at, ns_id, seq));
    }

    pub(super) fn add_waiter_deadline(
        &mut self,
        ns_id: u64,
        sem: &str,
        seq: u64,
        deadline_ns: Nanos,
    ) {
        self.waiter_deadlines
            .insert((deadline_ns, ns_id, sem.to_string(), seq));
    }

    fn remove_waiter_deadline(&mut self, ns_id: u64, sem: &str, seq: u64, deadline_ns: Nanos) {
        self.waiter_deadlines
            .remove(&(deadline_ns, ns_id, sem.to_string(), seq));
    }

    /// Records when a hold ends (nothing for a hold without a limit, `ends_at` 0).
    pub(super) fn add_hold_end(&mut self, ns_id: u64, sem: &str, seq: u64, ends_at: Nanos) {
        if ends_at > 0 {
            self.hold_ends
                .insert((ends_at, ns_id, sem.to_string(), seq));
        }
    }

    fn remove_hold_end(&mut self, ns_id: u64, sem: &str, seq: u64, ends_at: Nanos) {
        if ends_at > 0 {
            self.hold_ends
                .remove(&(ends_at, ns_id, sem.to_string(), seq));
        }
    }

    /// Records a namespace id; false if it was taken.
    pub(super) fn add_namespace(&mut self, id: u64, name: &str) -> bool {
        self.namespace_names.insert(id, name.to_string()).is_none()
    }

    pub(super) fn add_holders(&mut self, count: u64) {
        self.holders = self.holders.saturating_add(count);
    }

    pub(super) fn leases(&self) -> u64 {
        self.lease_expiry.len() as u64
    }

    pub(super) fn waiters(&self) -> u64 {
        self.waiter_deadlines.len() as u64
    }

    fn remove_holders(&mut self, count: u64) {
        self.holders = self.holders.saturating_sub(count);
    }

    pub(super) fn holders(&self) -> u64 {
        self.holders
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(super) fn add_bytes(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_add(bytes);
    }

    fn remove_bytes(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// The earliest time at which a lease expires, a waiter's deadline passes or a hold
    /// reaches its limit, if any.
    pub(super) fn next_due_ns(&self) -> Option<Nanos> {
        let lease = self.lease_expiry.first().map(|e| e.0);
        let waiter = self.waiter_deadlines.first().map(|e| e.0);
        let hold = self.hold_ends.first().map(|e| e.0);
        [lease, waiter, hold, self.next_sync_due()]
            .into_iter()
            .flatten()
            .min()
    }
}

impl Ctx<'_> {
    pub(super) fn next_token(&mut self) -> u64 {
        *self.last_token = self.last_token.saturating_add(1);
        *self.last_token
    }

    /// Stored bytes of all namespaces.
    pub(super) fn stored_bytes(&self) -> u64 {
        self.index.bytes
    }

    pub(super) fn namespace_name(&self, id: u64) -> Option<&String> {
        self.index.namespace_names.get(&id)
    }

    /// Takes the earliest lease expiry entry if it is due: `(namespace id, lease seq)`. The
    /// caller removes that lease next.
    pub(super) fn pop_lease_due(&mut self) -> Option<(u64, u64)> {
        let &(expires_at, ns_id, seq) = self.index.lease_expiry.first()?;
        if expires_at > self.clock_ns {
            return None;
        }
        self.index.lease_expiry.pop_first();
        Some((ns_id, seq))
    }

    /// Takes the earliest waiter deadline entry if it is due: `(namespace id, semaphore, lease
    /// seq)`. The caller removes that waiter next.
    pub(super) fn pop_waiter_due(&mut self) -> Option<(u64, String, u64)> {
        let (deadline_ns, ..) = self.index.waiter_deadlines.first()?;
        if *deadline_ns > self.clock_ns {
            return None;
        }
        let (_, ns_id, sem, seq) = self.index.waiter_deadlines.pop_first()?;
        Some((ns_id, sem, seq))
    }

    /// Takes the earliest hold end if it is due: `(namespace id, semaphore, lease seq)`. The
    /// caller removes that hold next.
    pub(super) fn pop_hold_due(&mut self) -> Option<(u64, String, u64)> {
        let (ends_at, ..) = self.index.hold_ends.first()?;
        if *ends_at > self.clock_ns {
            return None;
        }
        let (_, ns_id, sem, seq) = self.index.hold_ends.pop_first()?;
        Some((ns_id, sem, seq))
    }
}

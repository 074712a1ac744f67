//! Wait groups and barriers as stored, and the only methods that change them.
//!
//! A child of `data`, so that it keeps the namespace's usage and the global due index the same
//! way the semaphores' methods do. Canonical: every field not marked derived. Derived (rebuilt
//! on decode, checked by `check_invariants`): each group's `jobs_bytes`, each barrier's
//! `participants_bytes` and `participants_count`, and the global `sync_due` index.
//!
//! Each wait group and barrier has exactly one entry in `sync_due`, at the lease-clock time
//! something is due for it ([`WaitGroup::due_ns`], [`Barrier::due_ns`]): an ACTIVE group's
//! deadline, a finished group's deletion, a barrier's deletion after inactivity. Reaping finds
//! them there without scanning, and [`State::next_due_ns`](super::State::next_due_ns) includes
//! them, so the leader's expiry task proposes `Expire` when one is due.
//!
//! Size model (see `quota.rs`): a wait group or barrier costs what a semaphore does (an object
//! with its name, description and metadata); each completed job and each participant costs an
//! entry (`ENTRY_BYTES` plus its id and metadata) and counts against the entries quota.
//! Storage is linear: a group's jobs are one ordered map by job id, so a group with a million
//! jobs costs a million entries in the state and in snapshots, never more.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::super::limits::BARRIER_GENERATIONS_KEPT;
use super::super::quota;
use super::super::sync_types::{SyncKind, WaitGroupStatus};
use super::super::types::{Metadata, NANOS_PER_SEC, Nanos};
use super::{Ctx, Index, Namespace, Usage};

/// `(due_ns, namespace id, kind, name)` for every wait group and barrier.
pub(in crate::state) type SyncDue = BTreeSet<(Nanos, u64, SyncKind, String)>;

/// Seconds as nanoseconds on the lease clock, saturating.
fn secs_ns(s: u64) -> Nanos {
    i64::try_from(s)
        .unwrap_or(i64::MAX)
        .saturating_mul(NANOS_PER_SEC)
}

/// The wait groups and barriers of one namespace.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(in crate::state) struct SyncObjects {
    wait_groups: BTreeMap<String, WaitGroup>,
    barriers: BTreeMap<String, Barrier>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(in crate::state) struct WaitGroup {
    pub(in crate::state) description: String,
    pub(in crate::state) metadata: Metadata,
    pub(in crate::state) counter: u64,
    pub(in crate::state) status: WaitGroupStatus,
    pub(in crate::state) version: u64,
    pub(in crate::state) created_at: Nanos,
    pub(in crate::state) updated_at: Nanos,
    /// Wall clock, as the caller set it: for display.
    pub(in crate::state) expires_at: Nanos,
    /// Lease clock: when an ACTIVE group expires.
    pub(in crate::state) deadline_ns: Nanos,
    pub(in crate::state) delete_after_finished_s: u64,
    /// Wall clock; 0 while ACTIVE.
    pub(in crate::state) finished_at: Nanos,
    /// Lease clock: when it finished (its deletion counts from here); 0 while ACTIVE.
    pub(in crate::state) finished_ns: Nanos,
    pub(in crate::state) last_activity_at: Nanos,
    /// By job id.
    jobs: BTreeMap<String, Job>,
    /// Derived: the stored bytes of its jobs.
    #[serde(skip)]
    jobs_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Job {
    pub(in crate::state) completed_at: Nanos,
    pub(in crate::state) metadata: Metadata,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(in crate::state) struct Barrier {
    pub(in crate::state) description: String,
    pub(in crate::state) metadata: Metadata,
    pub(in crate::state) expected: u64,
    pub(in crate::state) generation: u64,
    pub(in crate::state) version: u64,
    pub(in crate::state) created_at: Nanos,
    pub(in crate::state) updated_at: Nanos,
    /// Wall clock: creation or the latest arrival, for display.
    pub(in crate::state) last_activity_at: Nanos,
    /// Lease clock: creation or the latest arrival (its deletion counts from here).
    pub(in crate::state) active_ns: Nanos,
    pub(in crate::state) delete_inactive_after_s: u64,
    /// Generation -> process id -> arrival; only the last [`BARRIER_GENERATIONS_KEPT`].
    participants: BTreeMap<u64, BTreeMap<String, Participant>>,
    /// Derived: the stored bytes of its participants.
    #[serde(skip)]
    participants_bytes: u64,
    /// Derived: how many participant records it keeps.
    #[serde(skip)]
    participants_count: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::state) struct Participant {
    pub(in crate::state) arrived_at: Nanos,
    pub(in crate::state) metadata: Metadata,
}

fn record_bytes(id: &str, metadata: &Metadata) -> u64 {
    quota::entry_bytes(metadata).saturating_add(id.len() as u64)
}

impl WaitGroup {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::state) fn new(
        description: &str,
        metadata: &Metadata,
        counter: u64,
        expires_at: Nanos,
        deadline_ns: Nanos,
        delete_after_finished_s: u64,
        wall_ns: Nanos,
    ) -> Self {
        WaitGroup {
            description: description.to_string(),
            metadata: metadata.clone(),
            counter,
            status: WaitGroupStatus::Active,
            version: 1,
            created_at: wall_ns,
            updated_at: wall_ns,
            expires_at,
            deadline_ns,
            delete_after_finished_s,
            finished_at: 0,
            finished_ns: 0,
            last_activity_at: wall_ns,
            jobs: BTreeMap::new(),
            jobs_bytes: 0,
        }
    }

    /// The lease-clock time something is due for it: expiry while ACTIVE, deletion after.
    pub(in crate::state) fn due_ns(&self) -> Nanos {
        match self.status {
            WaitGroupStatus::Active => self.deadline_ns,
            _ => self
                .finished_ns
                .saturating_add(secs_ns(self.delete_after_finished_s)),
        }
    }

    /// Its own stored bytes (without its jobs) under `name`.
    fn own_bytes(&self, name: &str) -> u64 {
        quota::object_bytes(&[name, &self.description], &self.metadata)
    }

    /// Its stored bytes with its jobs.
    pub(in crate::state) fn bytes(&self, name: &str) -> u64 {
        self.own_bytes(name).saturating_add(self.jobs_bytes)
    }

    pub(in crate::state) fn jobs(&self) -> &BTreeMap<String, Job> {
        &self.jobs
    }

    pub(in crate::state) fn completed(&self) -> u64 {
        self.jobs.len() as u64
    }

    /// What a job record of `job_id` with `metadata` costs.
    pub(in crate::state) fn job_bytes(job_id: &str, metadata: &Metadata) -> u64 {
        record_bytes(job_id, metadata)
    }

    fn computed_jobs_bytes(&self) -> u64 {
        self.jobs
            .iter()
            .map(|(id, job)| record_bytes(id, &job.metadata))
            .fold(0, u64::saturating_add)
    }
}

impl Barrier {
    pub(in crate::state) fn new(
        description: &str,
        metadata: &Metadata,
        expected: u64,
        delete_inactive_after_s: u64,
        wall_ns: Nanos,
        clock_ns: Nanos,
    ) -> Self {
        Barrier {
            description: description.to_string(),
            metadata: metadata.clone(),
            expected,
            generation: 1,
            version: 1,
            created_at: wall_ns,
            updated_at: wall_ns,
            last_activity_at: wall_ns,
            active_ns: clock_ns,
            delete_inactive_after_s,
            participants: BTreeMap::new(),
            participants_bytes: 0,
            participants_count: 0,
        }
    }

    /// The lease-clock time it is deleted if nobody arrives before.
    pub(in crate::state) fn due_ns(&self) -> Nanos {
        self.active_ns
            .saturating_add(secs_ns(self.delete_inactive_after_s))
    }

    fn own_bytes(&self, name: &str) -> u64 {
        quota::object_bytes(&[name, &self.description], &self.metadata)
    }

    pub(in crate::state) fn bytes(&self, name: &str) -> u64 {
        self.own_bytes(name).saturating_add(self.participants_bytes)
    }

    /// The arrivals of `generation` (empty when none are kept).
    pub(in crate::state) fn participants(
        &self,
        generation: u64,
    ) -> Option<&BTreeMap<String, Participant>> {
        self.participants.get(&generation)
    }

    /// Arrivals in the current generation.
    pub(in crate::state) fn arrived(&self) -> u64 {
        self.participants
            .get(&self.generation)
            .map_or(0, |p| p.len() as u64)
    }

    pub(in crate::state) fn participant_bytes(process_id: &str, metadata: &Metadata) -> u64 {
        record_bytes(process_id, metadata)
    }

    fn computed_participants(&self) -> (u64, u64) {
        let mut bytes = 0u64;
        let mut count = 0u64;
        for (id, p) in self.participants.values().flatten() {
            bytes = bytes.saturating_add(record_bytes(id, &p.metadata));
            count += 1;
        }
        (count, bytes)
    }
}

impl Index {
    fn add_sync_due(&mut self, due: Nanos, ns_id: u64, kind: SyncKind, name: &str) {
        self.sync_due.insert((due, ns_id, kind, name.to_string()));
    }

    fn remove_sync_due(&mut self, due: Nanos, ns_id: u64, kind: SyncKind, name: &str) {
        self.sync_due.remove(&(due, ns_id, kind, name.to_string()));
    }

    pub(in crate::state) fn next_sync_due(&self) -> Option<Nanos> {
        self.sync_due.first().map(|e| e.0)
    }
}

impl Ctx<'_> {
    /// Takes the earliest wait group or barrier entry of the due index if it is due: the
    /// caller expires or deletes that object next.
    pub(in crate::state) fn pop_sync_due(&mut self) -> Option<(u64, SyncKind, String)> {
        let (due, ..) = self.index.sync_due.first()?;
        if *due > self.clock_ns {
            return None;
        }
        let (_, ns_id, kind, name) = self.index.sync_due.pop_first()?;
        Some((ns_id, kind, name))
    }
}

impl SyncObjects {
    /// Adds its objects to a fresh index and fills their derived fields (decode).
    pub(super) fn rebuild(&mut self, ns_id: u64, index: &mut Index) {
        for (name, wg) in self.wait_groups.iter_mut() {
            wg.jobs_bytes = wg.computed_jobs_bytes();
            index.add_sync_due(wg.due_ns(), ns_id, SyncKind::WaitGroup, name);
        }
        for (name, b) in self.barriers.iter_mut() {
            (b.participants_count, b.participants_bytes) = b.computed_participants();
            index.add_sync_due(b.due_ns(), ns_id, SyncKind::Barrier, name);
        }
    }

    /// Removes its objects from the index (its namespace goes).
    pub(super) fn unindex(&self, ns_id: u64, index: &mut Index) {
        for (name, wg) in &self.wait_groups {
            index.remove_sync_due(wg.due_ns(), ns_id, SyncKind::WaitGroup, name);
        }
        for (name, b) in &self.barriers {
            index.remove_sync_due(b.due_ns(), ns_id, SyncKind::Barrier, name);
        }
    }

    /// Adds what its objects use to `usage` (from the data, O(objects + records)).
    pub(super) fn add_computed_usage(&self, usage: &mut Usage) {
        for (name, wg) in &self.wait_groups {
            usage.bytes = usage
                .bytes
                .saturating_add(wg.own_bytes(name))
                .saturating_add(wg.computed_jobs_bytes());
            usage.entries = usage.entries.saturating_add(wg.completed());
        }
        for (name, b) in &self.barriers {
            let (count, bytes) = b.computed_participants();
            usage.bytes = usage
                .bytes
                .saturating_add(b.own_bytes(name))
                .saturating_add(bytes);
            usage.entries = usage.entries.saturating_add(count);
        }
    }

    /// Checks the derived fields against the data and adds each object's due entry to
    /// `expected` (the invariant check's own index).
    pub(in crate::state) fn check_derived(
        &self,
        ns_id: u64,
        expected: &mut Index,
    ) -> Result<(), String> {
        for (name, wg) in &self.wait_groups {
            if wg.jobs_bytes != wg.computed_jobs_bytes() {
                return Err(format!(
                    "wait group {name}: job bytes do not match its jobs"
                ));
            }
            expected.add_sync_due(wg.due_ns(), ns_id, SyncKind::WaitGroup, name);
        }
        for (name, b) in &self.barriers {
            if (b.participants_count, b.participants_bytes) != b.computed_participants() {
                return Err(format!(
                    "barrier {name}: participant counts do not match its participants"
                ));
            }
            if b.participants
                .keys()
                .any(|g| *g > b.generation || *g + BARRIER_GENERATIONS_KEPT <= b.generation)
            {
                return Err(format!(
                    "barrier {name}: keeps participants of a generation it should not"
                ));
            }
            expected.add_sync_due(b.due_ns(), ns_id, SyncKind::Barrier, name);
        }
        Ok(())
    }
}

impl Namespace {
    pub(in crate::state) fn sync_objects(&self) -> &SyncObjects {
        &self.sync
    }

    pub(in crate::state) fn wait_groups(&self) -> &BTreeMap<String, WaitGroup> {
        &self.sync.wait_groups
    }

    pub(in crate::state) fn barriers(&self) -> &BTreeMap<String, Barrier> {
        &self.sync.barriers
    }

    /// Adds a new wait group with no jobs (the caller checked the name is free).
    pub(in crate::state) fn add_wait_group(&mut self, name: &str, wg: WaitGroup, ctx: &mut Ctx) {
        ctx.index
            .add_sync_due(wg.due_ns(), self.id, SyncKind::WaitGroup, name);
        self.add_usage(wg.completed(), wg.bytes(name), ctx);
        self.sync.wait_groups.insert(name.to_string(), wg);
    }

    /// Removes a wait group with its jobs.
    pub(in crate::state) fn remove_wait_group(
        &mut self,
        name: &str,
        ctx: &mut Ctx,
    ) -> Option<WaitGroup> {
        let wg = self.sync.wait_groups.remove(name)?;
        ctx.index
            .remove_sync_due(wg.due_ns(), self.id, SyncKind::WaitGroup, name);
        self.remove_usage(wg.completed(), wg.bytes(name), ctx);
        Some(wg)
    }

    /// Changes a wait group's attributes with `change` (its jobs change only through
    /// [`Namespace::add_jobs`]), keeping its usage and due entry.
    pub(in crate::state) fn change_wait_group(
        &mut self,
        name: &str,
        ctx: &mut Ctx,
        change: impl FnOnce(&mut WaitGroup),
    ) {
        let ns_id = self.id;
        let Some(wg) = self.sync.wait_groups.get_mut(name) else {
            return;
        };
        let (bytes, due) = (wg.own_bytes(name), wg.due_ns());
        change(wg);
        let (new_bytes, new_due) = (wg.own_bytes(name), wg.due_ns());
        // Always re-added: the reaping takes an entry out before it changes the object.
        ctx.index
            .remove_sync_due(due, ns_id, SyncKind::WaitGroup, name);
        ctx.index
            .add_sync_due(new_due, ns_id, SyncKind::WaitGroup, name);
        self.remove_usage(0, bytes, ctx);
        self.add_usage(0, new_bytes, ctx);
    }

    /// Records `jobs` (job ids the group does not have yet) as completed.
    pub(in crate::state) fn add_jobs(
        &mut self,
        name: &str,
        jobs: Vec<(String, Job)>,
        ctx: &mut Ctx,
    ) {
        let Some(wg) = self.sync.wait_groups.get_mut(name) else {
            return;
        };
        let mut added = 0u64;
        let mut bytes = 0u64;
        for (id, job) in jobs {
            let cost = record_bytes(&id, &job.metadata);
            if let std::collections::btree_map::Entry::Vacant(slot) = wg.jobs.entry(id) {
                slot.insert(job);
                added += 1;
                bytes = bytes.saturating_add(cost);
            }
        }
        wg.jobs_bytes = wg.jobs_bytes.saturating_add(bytes);
        self.add_usage(added, bytes, ctx);
    }

    /// Adds a new barrier with no arrivals (the caller checked the name is free).
    pub(in crate::state) fn add_barrier(&mut self, name: &str, b: Barrier, ctx: &mut Ctx) {
        ctx.index
            .add_sync_due(b.due_ns(), self.id, SyncKind::Barrier, name);
        self.add_usage(b.participants_count, b.bytes(name), ctx);
        self.sync.barriers.insert(name.to_string(), b);
    }

    pub(in crate::state) fn remove_barrier(
        &mut self,
        name: &str,
        ctx: &mut Ctx,
    ) -> Option<Barrier> {
        let b = self.sync.barriers.remove(name)?;
        ctx.index
            .remove_sync_due(b.due_ns(), self.id, SyncKind::Barrier, name);
        self.remove_usage(b.participants_count, b.bytes(name), ctx);
        Some(b)
    }

    /// Changes a barrier's attributes with `change` (its participants change only through
    /// [`Namespace::add_participant`] and [`Namespace::trip_barrier`]).
    pub(in crate::state) fn change_barrier(
        &mut self,
        name: &str,
        ctx: &mut Ctx,
        change: impl FnOnce(&mut Barrier),
    ) {
        let ns_id = self.id;
        let Some(b) = self.sync.barriers.get_mut(name) else {
            return;
        };
        let (bytes, due, generation) = (b.own_bytes(name), b.due_ns(), b.generation);
        change(b);
        // The generation moves only by a trip.
        b.generation = generation;
        let (new_bytes, new_due) = (b.own_bytes(name), b.due_ns());
        ctx.index
            .remove_sync_due(due, ns_id, SyncKind::Barrier, name);
        ctx.index
            .add_sync_due(new_due, ns_id, SyncKind::Barrier, name);
        self.remove_usage(0, bytes, ctx);
        self.add_usage(0, new_bytes, ctx);
    }

    /// Records the arrival of `process_id` in the barrier's current generation (the caller
    /// checked it has not arrived).
    pub(in crate::state) fn add_participant(
        &mut self,
        name: &str,
        process_id: &str,
        participant: Participant,
        ctx: &mut Ctx,
    ) {
        let Some(b) = self.sync.barriers.get_mut(name) else {
            return;
        };
        let cost = record_bytes(process_id, &participant.metadata);
        let old = b
            .participants
            .entry(b.generation)
            .or_default()
            .insert(process_id.to_string(), participant);
        let (count, bytes) = match old {
            Some(old) => (0, record_bytes(process_id, &old.metadata)),
            None => (1, 0),
        };
        b.participants_count = b.participants_count.saturating_add(count);
        b.participants_bytes = b
            .participants_bytes
            .saturating_add(cost)
            .saturating_sub(bytes);
        self.remove_usage(0, bytes, ctx);
        self.add_usage(count, cost, ctx);
    }

    /// Trips the barrier: the next generation starts with no arrivals, and the participants
    /// of generations no longer kept are dropped.
    pub(in crate::state) fn trip_barrier(&mut self, name: &str, ctx: &mut Ctx) {
        let Some(b) = self.sync.barriers.get_mut(name) else {
            return;
        };
        b.generation = b.generation.saturating_add(1);
        let keep_from = b
            .generation
            .saturating_sub(BARRIER_GENERATIONS_KEPT - 1)
            .max(1);
        let kept = b.participants.split_off(&keep_from);
        let dropped = std::mem::replace(&mut b.participants, kept);
        let mut count = 0u64;
        let mut bytes = 0u64;
        for (id, p) in dropped.values().flatten() {
            count += 1;
            bytes = bytes.saturating_add(record_bytes(id, &p.metadata));
        }
        b.participants_count = b.participants_count.saturating_sub(count);
        b.participants_bytes = b.participants_bytes.saturating_sub(bytes);
        self.remove_usage(count, bytes, ctx);
    }
}

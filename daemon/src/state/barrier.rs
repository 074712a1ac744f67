//! Barriers: a reusable rendezvous of `expected` processes, by generation (Grackle's semantics).
//!
//! Decisions:
//! - An arrival names the generation it is for, which must be the barrier's current one
//!   (`InvalidArgument` otherwise). It is idempotent per (generation, process id): a process
//!   that arrived already is answered with the barrier as it is, and nothing changes.
//! - The arrival that makes `expected` arrivals trips the barrier in the same entry: the
//!   generation goes up by one with no arrivals, the reply says `tripped`, and the entry emits
//!   [`Event::Synced`] so every caller waiting on that generation is released together.
//! - Update is a full replacement of description, expected, the inactivity window and
//!   metadata, with `expected_version` equal to its version; `expected` may not go below the
//!   arrivals, and lowering it to them trips the barrier (reply `tripped`).
//! - Creation and each arrival that counts are activity: the barrier is deleted
//!   `delete_inactive_after_seconds` of lease clock after the latest, by the reaping before
//!   commands (as leases expire). Updates and waits are not activity. A read past that time
//!   does not find it.
//! - Participant records are kept for the current generation and the one that tripped last
//!   (`limits::BARRIER_GENERATIONS_KEPT`); listing an older generation lists nothing.

use super::data::{Barrier, Ctx, Namespace, Participant, State};
use super::limits::BARRIERS_PER_NAMESPACE_MAX;
use super::paging::paginate;
use super::quota;
use super::read::{Times, version_mismatch};
use super::sync_types::*;
use super::types::*;
use super::validate;

pub(super) fn barrier_not_found(name: &str) -> Error {
    Error::not_found(format!("barrier {name} not found"))
}

impl Barrier {
    pub(super) fn view(&self, name: &str, _times: Times) -> BarrierView {
        BarrierView {
            name: name.to_string(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            expected: self.expected,
            arrived: self.arrived(),
            generation: self.generation,
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_activity_at: self.last_activity_at,
            delete_inactive_after_s: self.delete_inactive_after_s,
        }
    }

    fn visible(&self, clock_ns: Nanos) -> bool {
        self.due_ns() > clock_ns
    }
}

fn synced(ns: &Namespace, name: &str, ctx: &mut Ctx) {
    ctx.events.push(Event::Synced {
        ns: ns.name().to_string(),
        kind: SyncKind::Barrier,
        name: name.to_string(),
    });
}

fn trip(ns: &mut Namespace, name: &str, ctx: &mut Ctx) {
    ns.trip_barrier(name, ctx);
    synced(ns, name, ctx);
}

impl Namespace {
    pub(super) fn apply_barrier(&mut self, cmd: &BarrierCmd, ctx: &mut Ctx) -> Reply {
        match cmd {
            BarrierCmd::Create {
                name,
                description,
                expected,
                delete_inactive_after_s,
                metadata,
                ..
            } => {
                if self.barriers().contains_key(name) {
                    return Err(Error::already_exists(format!(
                        "barrier {name} already exists"
                    )));
                }
                if self.barriers().len() >= BARRIERS_PER_NAMESPACE_MAX {
                    return Err(Error::exhausted(format!(
                        "barrier quota reached: at most {BARRIERS_PER_NAMESPACE_MAX} barriers per namespace"
                    )));
                }
                let b = Barrier::new(
                    description,
                    metadata,
                    *expected,
                    *delete_inactive_after_s,
                    ctx.wall_ns,
                    ctx.clock_ns,
                );
                self.room_for(0, 0, 0, b.bytes(name), ctx)?;
                self.add_barrier(name, b, ctx);
                self.reply_barrier(name, false, ctx)
            }
            BarrierCmd::Update {
                name,
                description,
                expected,
                delete_inactive_after_s,
                metadata,
                expected_version,
                ..
            } => {
                let b = self.find_barrier(name)?;
                if *expected_version != b.version {
                    return Err(version_mismatch(*expected_version, b.version));
                }
                if *expected < b.arrived() {
                    return Err(Error::invalid(format!(
                        "expected_processes below arrived processes: {expected} < {}",
                        b.arrived()
                    )));
                }
                let grows = quota::object_bytes(&[name, description], metadata)
                    .saturating_sub(quota::object_bytes(&[name, &b.description], &b.metadata));
                self.room_for(0, 0, 0, grows, ctx)?;
                let trips = b.arrived() >= *expected;
                let wall_ns = ctx.wall_ns;
                self.change_barrier(name, ctx, |b| {
                    b.description = description.clone();
                    b.metadata = metadata.clone();
                    b.expected = *expected;
                    b.delete_inactive_after_s = *delete_inactive_after_s;
                    b.version = b.version.saturating_add(1);
                    b.updated_at = wall_ns;
                });
                if trips {
                    trip(self, name, ctx);
                }
                self.reply_barrier(name, trips, ctx)
            }
            BarrierCmd::Delete { name, .. } => {
                if self.remove_barrier(name, ctx).is_some() {
                    synced(self, name, ctx);
                }
                Ok(Outcome::Done)
            }
            BarrierCmd::Arrive {
                name,
                process_id,
                expected_generation,
                metadata,
                ..
            } => {
                let b = self.find_barrier(name)?;
                if *expected_generation != b.generation {
                    return Err(Error::invalid(format!(
                        "expected_generation {expected_generation} is not the current generation {} of barrier {name}",
                        b.generation
                    )));
                }
                if b.participants(b.generation)
                    .is_some_and(|p| p.contains_key(process_id))
                {
                    return self.reply_barrier(name, false, ctx);
                }
                let trips = b.arrived().saturating_add(1) >= b.expected;
                self.room_for(
                    0,
                    0,
                    1,
                    Barrier::participant_bytes(process_id, metadata),
                    ctx,
                )?;
                let participant = Participant {
                    arrived_at: ctx.wall_ns,
                    metadata: metadata.clone(),
                };
                self.add_participant(name, process_id, participant, ctx);
                let (wall_ns, clock_ns) = (ctx.wall_ns, ctx.clock_ns);
                self.change_barrier(name, ctx, |b| {
                    b.last_activity_at = wall_ns;
                    b.active_ns = clock_ns;
                });
                if trips {
                    trip(self, name, ctx);
                }
                self.reply_barrier(name, trips, ctx)
            }
        }
    }

    fn find_barrier(&self, name: &str) -> Result<&Barrier, Error> {
        self.barriers()
            .get(name)
            .ok_or_else(|| barrier_not_found(name))
    }

    fn reply_barrier(&self, name: &str, tripped: bool, ctx: &Ctx) -> Reply {
        Ok(Outcome::Barrier(BarrierReply {
            barrier: self.find_barrier(name)?.view(name, ctx.times()),
            tripped,
        }))
    }
}

/// Deletes the barrier `name` if its inactivity window passed (the reaping; its due entry was
/// taken already).
pub(super) fn reap(ns: &mut Namespace, name: &str, ctx: &mut Ctx) {
    if ns
        .barriers()
        .get(name)
        .is_some_and(|b| b.due_ns() <= ctx.clock_ns)
    {
        ns.remove_barrier(name, ctx);
        synced(ns, name, ctx);
    }
}

impl State {
    fn visible_barrier<'a>(&'a self, ns: &str, name: &str) -> Result<&'a Barrier, Error> {
        validate::name("namespace_name", ns)?;
        validate::name("barrier_name", name)?;
        self.namespace(ns)?
            .barriers()
            .get(name)
            .filter(|b| b.visible(self.clock_ns()))
            .ok_or_else(|| barrier_not_found(name))
    }

    pub fn get_barrier(&self, ns: &str, name: &str) -> Result<BarrierView, Error> {
        Ok(self.visible_barrier(ns, name)?.view(name, self.times()))
    }

    /// Barriers by name.
    pub fn list_barriers(&self, ns: &str, page: &PageRequest) -> Result<Page<BarrierView>, Error> {
        validate::name("namespace_name", ns)?;
        let namespace = self.namespace(ns)?;
        let (clock_ns, times) = (self.clock_ns(), self.times());
        paginate(page, |lo, hi| {
            namespace
                .barriers()
                .range((lo, hi))
                .filter(move |(_, b)| b.visible(clock_ns))
                .map(move |(name, b)| (name.clone(), b.view(name, times)))
        })
    }

    /// The arrivals of `generation` by process id (empty for a generation not kept).
    pub fn list_participants(
        &self,
        ns: &str,
        name: &str,
        generation: u64,
        page: &PageRequest,
    ) -> Result<Page<ParticipantView>, Error> {
        let b = self.visible_barrier(ns, name)?;
        if generation == 0 {
            return Err(Error::invalid("generation must be greater than 0"));
        }
        let participants = b.participants(generation);
        paginate(page, |lo, hi| {
            participants
                .into_iter()
                .flat_map(move |p| p.range::<String, _>((lo.clone(), hi.clone())))
                .map(|(id, p)| {
                    let view = ParticipantView {
                        process_id: id.clone(),
                        arrived_at: p.arrived_at,
                        metadata: p.metadata.clone(),
                    };
                    (id.clone(), view)
                })
        })
    }
}

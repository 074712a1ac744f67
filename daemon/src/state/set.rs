//! All-or-none acquires ([`Cmd::AcquireSet`]): one lease takes several semaphores in one grant,
//! or none of them.
//!
//! A blocked set is one queue entry that stands in every member's queue: a [`Waiter`] in each
//! member's semaphore whose `set` names all the members. It is appended to every member's queue
//! in the same command, so two entries that share members stand in the same relative order in
//! every queue they share (the order in which their commands were applied). It is granted, every
//! member at once in one command, when it is at the head of every member's queue and every
//! member has room; until then it blocks each member's queue behind it (strict FIFO: a single
//! acquire never passes it, nor does a set behind it).
//!
//! Why this cannot deadlock: the oldest entry of all queues is at the head of each of its
//! queues (every entry older than it in one of them would be older overall), so it waits only
//! for holders to release, never for another waiter. Two jobs taking `{a, b}` and `{b, a}`
//! are granted one after the other.
//!
//! Decisions:
//! - A set acquire takes only semaphores the lease neither holds nor waits for
//!   (`FailedPrecondition` otherwise), so while the set waits the lease holds none of its
//!   members. Two exceptions keep retries and re-attaches safe: the same set acquire of a lease
//!   whose set still waits re-attaches (keeps its place, takes the later deadline); of a lease
//!   that holds every member at exactly the asked weights and waits for none of them, answers
//!   `Acquired` with those holds' tokens (no new grant).
//! - A single acquire of a semaphore the lease waits for as a member of a set is refused
//!   (`FailedPrecondition`): it would change one member of the set alone.
//! - Any exit from the queue ends the whole set: its deadline (all members share it), a give-up
//!   or a release naming any member, the lease ending, or a member being deleted. Every
//!   member's caller learns of it ([`Event::WaitEnded`] per member, the same reason).
//! - A grant of a set emits [`Event::Granted`] for every member, all in one applied entry.
//! - Once granted, the holds are ordinary holds: releasing one member releases that member
//!   only, and each member's hold limit ends its hold alone.

use super::data::{Ctx, Namespace, Waiter};
use super::limits::*;
use super::quota;
use super::types::*;

fn failed_precondition(message: String) -> Error {
    Error {
        kind: ErrorKind::FailedPrecondition,
        message,
    }
}

impl Namespace {
    /// Whether the set waiter of `seq` with members `set` could be granted now: it is at the
    /// head of every member's queue and every member has room for it.
    pub(super) fn set_grantable(&self, seq: u64, set: &[String]) -> bool {
        set.iter().all(|member| {
            self.semaphores().get(member).is_some_and(|sem| {
                sem.queue().first_key_value().map(|(_, s)| *s) == Some(seq)
                    && sem
                        .waiters()
                        .get(&seq)
                        .is_some_and(|w| sem.can_grant(seq, w.weight))
            })
        })
    }

    /// Grants the set waiter of `seq` every member at once (the caller checked
    /// [`Namespace::set_grantable`]).
    pub(super) fn grant_set(&mut self, seq: u64, set: &[String], ctx: &mut Ctx) {
        for member in set {
            let Some(waiter) = self
                .semaphores()
                .get(member)
                .and_then(|sem| sem.waiters().get(&seq))
            else {
                continue;
            };
            let (weight, max_hold_ns) = (waiter.weight, waiter.max_hold_ns);
            let metadata = waiter.metadata.clone();
            self.grant(member, seq, weight, max_hold_ns, metadata, ctx);
        }
    }

    /// The members of the set `seq` waits for in `sem` (empty when it waits there alone or
    /// not at all).
    pub(super) fn set_of(&self, sem_name: &str, seq: u64) -> Vec<String> {
        self.semaphores()
            .get(sem_name)
            .and_then(|sem| sem.waiters().get(&seq))
            .map(|w| w.set.clone())
            .unwrap_or_default()
    }

    /// Removes the waiter of `seq` from `sem` and, when it is a member of a set, from every
    /// member (no grants), telling its callers `reason`. Returns the semaphores it left (empty
    /// when it did not wait there): their queues may move.
    pub(super) fn end_wait_all(
        &mut self,
        sem_name: &str,
        seq: u64,
        reason: WaitEnd,
        ctx: &mut Ctx,
    ) -> Vec<String> {
        let set = self.set_of(sem_name, seq);
        let members = if set.is_empty() {
            vec![sem_name.to_string()]
        } else {
            set
        };
        members
            .into_iter()
            .filter(|member| self.end_wait(member, seq, reason, ctx))
            .collect()
    }

    /// Moves the deadline of the waiter of `seq` in `sem`, and of every member of its set.
    pub(super) fn set_wait_deadline(
        &mut self,
        sem_name: &str,
        seq: u64,
        deadline_ns: Nanos,
        ctx: &mut Ctx,
    ) {
        let set = self.set_of(sem_name, seq);
        if set.is_empty() {
            self.set_waiter_deadline(sem_name, seq, deadline_ns, ctx);
        }
        for member in &set {
            self.set_waiter_deadline(member, seq, deadline_ns, ctx);
        }
    }

    /// The error for a single acquire of a semaphore the lease waits for as a set member.
    pub(super) fn check_not_set_member(&self, sem_name: &str, seq: u64) -> Result<(), Error> {
        if self.set_of(sem_name, seq).is_empty() {
            return Ok(());
        }
        Err(failed_precondition(format!(
            "lease {} waits for semaphore {sem_name} as a member of a set: release it (which \
             ends the set's wait) before acquiring it alone",
            self.lease_id(seq)
        )))
    }

    /// [`Cmd::AcquireSet`]; `members` passed `validate::set_members`.
    pub(super) fn acquire_set(
        &mut self,
        members: &[SetMember],
        id: &str,
        wait_ns: Nanos,
        max_hold_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) -> Reply {
        let seq = self.find_lease_of(LeaseKind::Semaphore, id)?;
        let names: Vec<String> = members.iter().map(|m| m.sem.clone()).collect();
        let weights: Vec<u64> = members.iter().map(|m| m.weight.max(1)).collect();
        for (name, weight) in names.iter().zip(&weights) {
            let sem = self.find_semaphore(name)?;
            if *weight > sem.permits {
                return Err(Error::invalid(format!(
                    "weight {weight} exceeds the permits of semaphore {name} ({})",
                    sem.permits
                )));
            }
        }
        let (clock, wall) = (ctx.clock_ns, ctx.wall_ns);

        // The same set still waiting: a re-attach.
        if self.set_of(&names[0], seq) == names {
            return self.reattach_set(&names, &weights, seq, wait_ns, max_hold_ns, metadata, ctx);
        }
        // Already granted exactly this (a retry whose reply was lost): the holds' tokens.
        let held: Option<Vec<SetGrant>> = names
            .iter()
            .zip(&weights)
            .map(|(name, weight)| {
                let sem = self.semaphores().get(name)?;
                let holder = sem.holders().get(&seq).filter(|h| h.weight == *weight)?;
                (!sem.waiters().contains_key(&seq)).then_some(SetGrant {
                    token: holder.token,
                    hold_ns: holder.hold_left(clock),
                })
            })
            .collect();
        if let Some(grants) = held {
            return Ok(set_reply(AcquireSetStatus::Acquired { grants }, names));
        }
        for name in &names {
            let sem = self.find_semaphore(name)?;
            if sem.holders().contains_key(&seq) || sem.waiters().contains_key(&seq) {
                return Err(failed_precondition(format!(
                    "lease {id} already holds or waits for semaphore {name}: a set acquire takes \
                     only semaphores the lease neither holds nor waits for"
                )));
            }
        }

        // Quotas: one entry per member, each with the metadata.
        let count = names.len() as u64;
        let bytes = quota::entry_bytes(metadata).saturating_mul(count);
        self.room_for(0, 0, count, bytes, ctx)?;

        // Granted at once only if every member's queue is empty and every member fits.
        let mut free = true;
        for (name, weight) in names.iter().zip(&weights) {
            let sem = self.find_semaphore(name)?;
            free &= sem.queue().is_empty() && sem.held().saturating_add(*weight) <= sem.permits;
        }
        if free {
            for name in &names {
                if self.find_semaphore(name)?.holders().len() >= HOLDERS_PER_SEMAPHORE_MAX {
                    return Err(Error::exhausted(format!(
                        "holder quota reached on semaphore {name}: at most \
                         {HOLDERS_PER_SEMAPHORE_MAX} holders per semaphore"
                    )));
                }
            }
            let mut grants = Vec::with_capacity(names.len());
            for (name, weight) in names.iter().zip(&weights) {
                let grant = self.grant(name, seq, *weight, max_hold_ns, metadata.clone(), ctx);
                self.touch(name, wall);
                grants.push(SetGrant {
                    token: grant.token,
                    hold_ns: grant.hold_ns,
                });
            }
            return Ok(set_reply(AcquireSetStatus::Acquired { grants }, names));
        }
        for name in &names {
            self.touch(name, wall);
        }
        if wait_ns <= 0 {
            return Ok(set_reply(AcquireSetStatus::Unavailable, names));
        }
        for name in &names {
            if self.find_semaphore(name)?.waiters().len() >= WAITERS_PER_SEMAPHORE_MAX {
                return Err(Error::exhausted(format!(
                    "waiter quota reached on semaphore {name}: at most \
                     {WAITERS_PER_SEMAPHORE_MAX} waiters per semaphore"
                )));
            }
        }
        let deadline_ns = clock.saturating_add(wait_ns);
        for (name, weight) in names.iter().zip(&weights) {
            let waiter = Waiter {
                ticket: 0,
                weight: *weight,
                queued_at: wall,
                deadline_ns,
                metadata: metadata.clone(),
                max_hold_ns,
                set: names.clone(),
            };
            self.add_waiter(name, seq, waiter, ctx);
        }
        Ok(set_reply(AcquireSetStatus::Queued { deadline_ns }, names))
    }

    /// Re-attach of a set that still waits: it keeps its place in every queue, takes the later
    /// deadline and what the command asks for now.
    #[allow(clippy::too_many_arguments)]
    fn reattach_set(
        &mut self,
        names: &[String],
        weights: &[u64],
        seq: u64,
        wait_ns: Nanos,
        max_hold_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) -> Reply {
        let (clock, wall) = (ctx.clock_ns, ctx.wall_ns);
        let mut old_bytes = 0u64;
        let mut deadline_ns = clock.saturating_add(wait_ns);
        for name in names {
            if let Some(w) = self.find_semaphore(name)?.waiters().get(&seq) {
                old_bytes = old_bytes.saturating_add(quota::entry_bytes(&w.metadata));
                deadline_ns = deadline_ns.max(w.deadline_ns);
            }
        }
        let new_bytes = quota::entry_bytes(metadata).saturating_mul(names.len() as u64);
        self.room_for(0, 0, 0, new_bytes.saturating_sub(old_bytes), ctx)?;
        for (name, weight) in names.iter().zip(weights) {
            self.set_waiter_deadline(name, seq, deadline_ns, ctx);
            self.set_waiter_request(name, seq, *weight, max_hold_ns, metadata, ctx);
            self.touch(name, wall);
        }
        // A lower weight may let it through now.
        self.grant_from_head(&names[0], ctx);
        let still_waits = self.find_semaphore(&names[0])?.waiters().contains_key(&seq);
        let status = if still_waits {
            match wait_ns {
                0 => AcquireSetStatus::Unavailable,
                _ => AcquireSetStatus::Queued { deadline_ns },
            }
        } else {
            // A set leaves its queues only whole: granted every member, or none.
            match self.set_grants(names, seq, clock) {
                Some(grants) => AcquireSetStatus::Acquired { grants },
                None => AcquireSetStatus::Unavailable,
            }
        };
        Ok(set_reply(status, names.to_vec()))
    }

    /// The reply of a set acquire whose members the lease now holds, from the holds (`None`
    /// if one is missing).
    pub(super) fn set_grants(
        &self,
        names: &[String],
        seq: u64,
        clock_ns: Nanos,
    ) -> Option<Vec<SetGrant>> {
        names
            .iter()
            .map(|name| {
                let holder = self.semaphores().get(name)?.holders().get(&seq)?;
                Some(SetGrant {
                    token: holder.token,
                    hold_ns: holder.hold_left(clock_ns),
                })
            })
            .collect()
    }
}

fn set_reply(status: AcquireSetStatus, members: Vec<String>) -> Outcome {
    Outcome::AcquireSet(AcquireSetReply { status, members })
}

//! Queues and grants: acquire, release, give up, and what a removed lease or waiter means for
//! a queue.
//!
//! What always holds after every method here: the head of every queue cannot be granted now
//! (no grant is ever left undone), grants leave a queue only from its head (strict FIFO), and
//! every grant goes through [`Namespace::grant`], which takes the next fencing token and emits
//! [`Event::Granted`] exactly when the grant ends a wait. Every other exit from a queue emits
//! [`Event::WaitEnded`].

use std::collections::BTreeSet;

use super::data::{Ctx, Holder, Namespace, Semaphore, Waiter, hold_left};
use super::limits::*;
use super::quota;
use super::types::*;
use super::validate;

impl Semaphore {
    /// Whether `seq` could hold `weight` now: its own current weight counts as free, and a new
    /// holder needs a free holder slot.
    pub(super) fn can_grant(&self, seq: u64, weight: u64) -> bool {
        let own = self.holders().get(&seq).map_or(0, |h| h.weight);
        let fits = self.held().saturating_sub(own).saturating_add(weight) <= self.permits;
        let slot = own > 0 || self.holders().len() < HOLDERS_PER_SEMAPHORE_MAX;
        fits && slot
    }
}

/// The earlier of two instants or limits where 0 means none.
fn earlier(a: Nanos, b: Nanos) -> Nanos {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// What a grant answers: its token and, on the lease clock, how long it may still hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Grant {
    pub(super) token: u64,
    pub(super) hold_ns: Nanos,
}

impl Grant {
    fn status(self) -> AcquireStatus {
        AcquireStatus::Acquired {
            token: self.token,
            hold_ns: self.hold_ns,
        }
    }
}

impl Namespace {
    /// The one grant path: `seq` holds `weight` of `sem` from now with the next fencing token,
    /// replacing any hold it had. The hold ends at the smaller of `max_hold_ns` (0: none) and
    /// the semaphore's limit from now, or at the replaced hold's end if that is earlier: a
    /// re-acquire never extends a hold. A wait of `seq` on `sem` ends with this grant and is
    /// announced as [`Event::Granted`]; a grant to a lease that was not queued is announced by
    /// the reply.
    pub(super) fn grant(
        &mut self,
        sem_name: &str,
        seq: u64,
        weight: u64,
        max_hold_ns: Nanos,
        metadata: Metadata,
        ctx: &mut Ctx,
    ) -> Grant {
        let (limit, old_end) = self.semaphores().get(sem_name).map_or((0, 0), |sem| {
            let old_end = sem.holders().get(&seq).map_or(0, |h| h.ends_at);
            (earlier(sem.max_hold_ns, max_hold_ns), old_end)
        });
        let fresh_end = match limit {
            0 => 0,
            limit => ctx.clock_ns.saturating_add(limit),
        };
        let ends_at = earlier(old_end, fresh_end);
        let hold_ns = hold_left(ends_at, ctx.clock_ns);
        let ends_wall = match ends_at {
            0 => 0,
            _ => ctx.wall_ns.saturating_add(hold_ns),
        };
        let waiter = self.remove_waiter(sem_name, seq, ctx);
        let was_queued = waiter.is_some();
        ctx.tally.grants += 1;
        if let Some(waiter) = waiter {
            ctx.tally
                .waits_ns
                .push(ctx.wall_ns.saturating_sub(waiter.queued_at));
        }
        let token = ctx.next_token();
        let holder = Holder {
            weight,
            locked_at: ctx.wall_ns,
            metadata,
            token,
            ends_at,
            ends_wall,
        };
        self.add_holder(sem_name, seq, holder, ctx);
        if was_queued {
            ctx.events.push(Event::Granted {
                ns: self.name().to_string(),
                sem: sem_name.to_string(),
                lease: self.lease_id(seq),
                token,
                weight,
                hold_ns,
            });
        }
        Grant { token, hold_ns }
    }

    /// Grants waiters of `sem` from the head while the head fits (strict FIFO). A set at the
    /// head is granted when it can be in every member; its grant moves the other members'
    /// queues too.
    pub(super) fn grant_from_head(&mut self, sem_name: &str, ctx: &mut Ctx) {
        let mut pending = vec![sem_name.to_string()];
        while let Some(name) = pending.pop() {
            self.grant_head_of(&name, ctx, &mut pending);
        }
    }

    /// Grants from the head of `sem`'s queue; adds the other members of every set it grants
    /// to `pending`.
    fn grant_head_of(&mut self, sem_name: &str, ctx: &mut Ctx, pending: &mut Vec<String>) {
        loop {
            let Some(sem) = self.semaphores().get(sem_name) else {
                return;
            };
            let Some((_, &seq)) = sem.queue().first_key_value() else {
                return;
            };
            let Some(waiter) = sem.waiters().get(&seq) else {
                return;
            };
            if !waiter.set.is_empty() {
                let set = waiter.set.clone();
                if !self.set_grantable(seq, &set) {
                    return;
                }
                self.grant_set(seq, &set, ctx);
                pending.extend(set.into_iter().filter(|member| member != sem_name));
                continue;
            }
            if !sem.can_grant(seq, waiter.weight) {
                return;
            }
            let (weight, max_hold_ns) = (waiter.weight, waiter.max_hold_ns);
            let metadata = waiter.metadata.clone();
            self.grant(sem_name, seq, weight, max_hold_ns, metadata, ctx);
        }
    }

    /// Removes the waiter of `seq` from `sem` (no grants), telling its caller `reason`.
    pub(super) fn end_wait(
        &mut self,
        sem_name: &str,
        seq: u64,
        reason: WaitEnd,
        ctx: &mut Ctx,
    ) -> bool {
        if self.remove_waiter(sem_name, seq, ctx).is_none() {
            return false;
        }
        self.wait_ended(sem_name, self.lease_id(seq), reason, ctx);
        true
    }

    /// Tells the caller waiting with lease `lease` (an id) on `sem` that its wait ended.
    pub(super) fn wait_ended(&self, sem_name: &str, lease: String, reason: WaitEnd, ctx: &mut Ctx) {
        ctx.events.push(Event::WaitEnded {
            ns: self.name().to_string(),
            sem: sem_name.to_string(),
            lease,
            reason,
        });
    }

    /// Removes a lease with its holds and waits (no grants); adds the semaphores whose queues
    /// may now move to `affected`.
    pub(super) fn end_lease(
        &mut self,
        seq: u64,
        cause: LossCause,
        ctx: &mut Ctx,
        affected: &mut BTreeSet<String>,
    ) -> bool {
        let Some(lease) = self.remove_lease(seq, ctx) else {
            return false;
        };
        self.lost(lease.id(seq), String::new(), cause, ctx);
        affected.extend(lease.holds.iter().cloned());
        for sem_name in &lease.waits {
            self.wait_ended(sem_name, lease.id(seq), WaitEnd::LeaseGone, ctx);
            affected.insert(sem_name.clone());
        }
        true
    }

    /// Tells the holder of lease `lease` (an id) that it lost the lease (`object` empty) or its
    /// hold of `object`.
    pub(super) fn lost(&self, lease: String, object: String, cause: LossCause, ctx: &mut Ctx) {
        ctx.events.push(Event::Lost {
            ns: self.name().to_string(),
            lease,
            object,
            cause,
        });
    }

    /// Deletes a semaphore; its holders lose their holds and its waiters' callers learn that
    /// it is gone. A set waiting for it fails whole: it leaves every other member's queue too,
    /// whose queues then move.
    pub(super) fn end_semaphore(&mut self, name: &str, ctx: &mut Ctx) {
        let Some(sem) = self.remove_semaphore(name, ctx) else {
            return;
        };
        for seq in sem.holders().keys() {
            let lease = self.lease_id(*seq);
            self.lost(lease, name.to_string(), LossCause::SemaphoreDeleted, ctx);
        }
        let mut affected = BTreeSet::new();
        for seq in sem.queue().values() {
            self.wait_ended(name, self.lease_id(*seq), WaitEnd::SemaphoreGone, ctx);
            let set = sem.waiters().get(seq).map(|w| w.set.clone());
            for member in set.iter().flatten().filter(|m| *m != name) {
                if self.end_wait(member, *seq, WaitEnd::SemaphoreGone, ctx) {
                    affected.insert(member.clone());
                }
            }
        }
        self.move_queues(&affected, ctx);
    }

    pub(super) fn revoke_lease(&mut self, kind: LeaseKind, id: &str, ctx: &mut Ctx) -> Reply {
        let seq = self.find_lease_of(kind, id)?;
        let mut affected = BTreeSet::new();
        self.end_lease(seq, LossCause::Revoked, ctx, &mut affected);
        self.move_queues(&affected, ctx);
        Ok(Outcome::Done)
    }

    /// Grants what can be granted now in the queues of `affected` (semaphore names and lock
    /// objects): from the head of each semaphore's queue, and one pass over the lock queue if
    /// any lock is among them.
    pub(super) fn move_queues(&mut self, affected: &BTreeSet<String>, ctx: &mut Ctx) {
        let mut locks = false;
        for object in affected {
            if lock_path(object).is_some() {
                locks = true;
            } else {
                self.grant_from_head(object, ctx);
            }
        }
        if locks {
            self.grant_locks(ctx);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire(
        &mut self,
        sem_name: &str,
        id: &str,
        weight: u64,
        wait_ns: Nanos,
        max_hold_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) -> Reply {
        let weight = weight.max(1);
        let permits = self.find_semaphore(sem_name)?.permits;
        let seq = self.find_lease_of(LeaseKind::Semaphore, id)?;
        if weight > permits {
            return Err(validate::weight_exceeds_permits());
        }
        self.check_not_set_member(sem_name, seq)?;
        let (clock, wall) = (ctx.clock_ns, ctx.wall_ns);
        let sem = self.find_semaphore(sem_name)?;
        let held_weight = sem.holders().get(&seq).map(|h| h.weight);
        let queued = sem.waiters().contains_key(&seq);

        // Quotas: a new holder or waiter counts one entry and its bytes; one that replaces a
        // hold or a wait of this lease counts only what its metadata adds.
        let new_bytes = quota::entry_bytes(metadata);
        let replaced = if queued {
            sem.waiters()
                .get(&seq)
                .map(|w| quota::entry_bytes(&w.metadata))
        } else {
            let fits_now = sem.queue().is_empty()
                && sem
                    .held()
                    .saturating_sub(held_weight.unwrap_or(0))
                    .saturating_add(weight)
                    <= sem.permits;
            let replaces_hold = held_weight.is_some_and(|held| weight <= held || fits_now);
            sem.holders()
                .get(&seq)
                .filter(|_| replaces_hold)
                .map(|h| quota::entry_bytes(&h.metadata))
        };
        match replaced {
            Some(old) => self.room_for(0, 0, 0, new_bytes.saturating_sub(old), ctx)?,
            None => self.room_for(0, 0, 1, new_bytes, ctx)?,
        }
        let sem = self.find_semaphore(sem_name)?;

        // Re-acquire at the same or a lower weight: granted at once, with a new token. A pending
        // upgrade of this lease is settled by it.
        if held_weight.is_some_and(|held| weight <= held) {
            let grant = self.grant(sem_name, seq, weight, max_hold_ns, metadata.clone(), ctx);
            self.touch(sem_name, wall);
            self.grant_from_head(sem_name, ctx);
            return self.acquired(sem_name, grant);
        }

        // Re-attach: keep the place in the queue, take the new weight and the later deadline.
        if queued {
            let deadline_ns = sem.waiters().get(&seq).map(|w| w.deadline_ns);
            self.touch(sem_name, wall);
            if let Some(deadline_ns) = deadline_ns {
                let deadline_ns = deadline_ns.max(clock.saturating_add(wait_ns));
                self.set_waiter_deadline(sem_name, seq, deadline_ns, ctx);
                self.set_waiter_request(sem_name, seq, weight, max_hold_ns, metadata, ctx);
            }
            self.grant_from_head(sem_name, ctx);
            let sem = self.find_semaphore(sem_name)?;
            let status = match (sem.waiters().get(&seq), sem.holders().get(&seq)) {
                (Some(waiter), _) if wait_ns > 0 => AcquireStatus::Queued {
                    deadline_ns: waiter.deadline_ns,
                },
                (Some(_), _) => AcquireStatus::Unavailable,
                (None, Some(holder)) => AcquireStatus::Acquired {
                    token: holder.token,
                    hold_ns: holder.hold_left(clock),
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
            .held()
            .saturating_sub(held_weight.unwrap_or(0))
            .saturating_add(weight)
            <= sem.permits;
        if sem.queue().is_empty() && fits {
            if held_weight.is_none() && sem.holders().len() >= HOLDERS_PER_SEMAPHORE_MAX {
                return Err(Error::exhausted(format!(
                    "holder quota reached: at most {HOLDERS_PER_SEMAPHORE_MAX} holders per semaphore"
                )));
            }
            let grant = self.grant(sem_name, seq, weight, max_hold_ns, metadata.clone(), ctx);
            self.touch(sem_name, wall);
            return self.acquired(sem_name, grant);
        }
        if wait_ns <= 0 {
            self.touch(sem_name, wall);
            return Ok(Outcome::Acquire(AcquireReply {
                status: AcquireStatus::Unavailable,
                semaphore: self.find_semaphore(sem_name)?.view(sem_name),
            }));
        }
        if sem.waiters().len() >= WAITERS_PER_SEMAPHORE_MAX {
            return Err(Error::exhausted(format!(
                "waiter quota reached: at most {WAITERS_PER_SEMAPHORE_MAX} waiters per semaphore"
            )));
        }
        let deadline_ns = clock.saturating_add(wait_ns);
        let waiter = Waiter {
            ticket: 0,
            weight,
            queued_at: wall,
            deadline_ns,
            metadata: metadata.clone(),
            max_hold_ns,
            set: Vec::new(),
        };
        self.add_waiter(sem_name, seq, waiter, ctx);
        self.touch(sem_name, wall);
        Ok(Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Queued { deadline_ns },
            semaphore: self.find_semaphore(sem_name)?.view(sem_name),
        }))
    }

    /// Records activity on a semaphore (a display time, on the wall clock).
    pub(super) fn touch(&mut self, sem_name: &str, wall_ns: Nanos) {
        if let Some(sem) = self.semaphore_mut(sem_name) {
            sem.last_activity_at = wall_ns;
        }
    }

    fn acquired(&self, sem_name: &str, grant: Grant) -> Reply {
        let sem = self.find_semaphore(sem_name)?;
        Ok(Outcome::Acquire(AcquireReply {
            status: grant.status(),
            semaphore: sem.view(sem_name),
        }))
    }

    pub(super) fn release(&mut self, sem_name: &str, id: &str, ctx: &mut Ctx) -> Reply {
        self.find_semaphore(sem_name)?;
        let seq = self.find_lease_of(LeaseKind::Semaphore, id)?;
        let released = self.remove_holder(sem_name, seq, ctx).is_some();
        // A set's wait ends whole, whichever member the release names.
        let mut affected: BTreeSet<String> = self
            .end_wait_all(sem_name, seq, WaitEnd::GaveUp, ctx)
            .into_iter()
            .collect();
        self.touch(sem_name, ctx.wall_ns);
        if released {
            affected.insert(sem_name.to_string());
        }
        self.move_queues(&affected, ctx);
        self.reply_semaphore(sem_name)
    }

    pub(super) fn give_up(
        &mut self,
        sem_name: &str,
        id: &str,
        deadline_ns: Nanos,
        linger_ns: Nanos,
        ctx: &mut Ctx,
    ) -> GiveUpReply {
        let Some(seq) = self.lease_seq(id) else {
            return GiveUpReply::NotQueued;
        };
        if let Some(path) = lock_path(sem_name) {
            return self.give_up_lock(path, seq, deadline_ns, linger_ns, ctx);
        }
        let Some(sem) = self.semaphores().get(sem_name) else {
            return GiveUpReply::NotQueued;
        };
        // Queued comes first: a lease that holds and waits is upgrading, and giving up the
        // upgrade keeps the hold it had.
        if let Some(waiter) = sem.waiters().get(&seq) {
            if waiter.deadline_ns > deadline_ns {
                return GiveUpReply::StillQueued {
                    deadline_ns: waiter.deadline_ns,
                };
            }
            if linger_ns > 0 {
                let lingered = waiter
                    .deadline_ns
                    .min(ctx.clock_ns.saturating_add(linger_ns));
                self.set_wait_deadline(sem_name, seq, lingered, ctx);
                return GiveUpReply::StillQueued {
                    deadline_ns: lingered,
                };
            }
            let affected = self.end_wait_all(sem_name, seq, WaitEnd::GaveUp, ctx);
            self.move_queues(&affected.into_iter().collect(), ctx);
            return GiveUpReply::Removed;
        }
        match sem.holders().get(&seq) {
            Some(holder) => GiveUpReply::Granted {
                token: holder.token,
                hold_ns: holder.hold_left(ctx.clock_ns),
            },
            None => GiveUpReply::NotQueued,
        }
    }
}

//! Hierarchical read/write locks: acquire, release, delete, give up, and the one grant path.
//!
//! A lock name is a `/`-separated path. Its ancestors are its proper prefixes that end right
//! before a `/` (of `a/b/c`: `a` and `a/b`); its descendants are the names that start with it
//! and a `/`. Two holds of different leases conflict when their paths are the same or one is an
//! ancestor of the other, and at least one of them is exclusive. A lease never conflicts with
//! itself.
//!
//! # Order of grants
//!
//! Blocked acquires wait in one queue per namespace, in arrival order across paths and modes.
//! A queued acquire is granted as soon as it conflicts with no hold and with no acquire queued
//! before it; an acquire that arrives while an earlier queued one conflicts with it queues
//! behind it even if no hold stands in its way. So a waiting exclusive acquire holds back the
//! later shared acquires of its subtree and its ancestors, and no acquire waits on ones that
//! came after it: nobody waits forever while the ones it conflicts with keep coming. Acquires
//! that conflict with nothing before them are granted together, whatever their place.
//!
//! What always holds after every method here: no queued acquire could be granted now (none is
//! left undone), and every grant goes through [`Namespace::grant_lock`], which takes the next
//! fencing token (so tokens increase per path) and emits [`Event::Granted`] exactly when the
//! grant ends a wait. Every other exit from the queue emits [`Event::WaitEnded`].
//!
//! # Re-acquiring
//!
//! A lease that holds a path and acquires it again in the same or a weaker mode (exclusive to
//! shared) is granted at once with a new token; one that holds it shared and asks for exclusive
//! is an upgrade that queues like any acquire while the shared hold stays (two shared holders
//! upgrading at once wait for each other until one times out). An acquire of a path the lease
//! already waits for re-attaches: it keeps its place, takes the new mode and metadata, and the
//! later of the two deadlines.
//!
//! # Cost
//!
//! An acquire looks at the path, its ancestors and its descendants (held and queued). Any
//! change that can unblock a queued acquire (a release, an expiry, a removed waiter) runs one
//! pass over the namespace's lock queue, each step as costly as an acquire.

use std::collections::BTreeMap;

use super::data::{Ctx, Namespace, lock_entry_bytes};
use super::limits::*;
use super::lock_data::{LockHolder, LockWaiter};
use super::types::*;

/// The ancestors of `path`, nearest last.
pub(super) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(i, _)| &path[..i])
        .filter(|p| !p.is_empty())
}

/// The bounds of `path`'s descendants in an ordered map keyed by path: `path/` up to, not
/// including, `path0` (`0` is the character after `/`).
pub(super) fn descendant_bounds(path: &str) -> (String, String) {
    (format!("{path}/"), format!("{path}0"))
}

fn conflict(a_exclusive: bool, b_exclusive: bool) -> bool {
    a_exclusive || b_exclusive
}

/// Acquires blocked so far in a pass, by path: each with its lease and mode.
type Blocked = BTreeMap<String, Vec<(u64, bool)>>;

/// Whether an acquire of `path` by `seq` conflicts with one in `blocked`, and where.
fn blocked_conflict(blocked: &Blocked, path: &str, seq: u64, exclusive: bool) -> Contention {
    let hits = |entries: &Vec<(u64, bool)>| {
        entries
            .iter()
            .any(|(other, other_exclusive)| *other != seq && conflict(exclusive, *other_exclusive))
    };
    if blocked.get(path).is_some_and(hits) {
        return Contention::Peer;
    }
    if ancestors(path).any(|a| blocked.get(a).is_some_and(hits)) {
        return Contention::Ancestor;
    }
    let (lo, hi) = descendant_bounds(path);
    if blocked.range(lo..hi).any(|(_, entries)| hits(entries)) {
        return Contention::Descendant;
    }
    Contention::None
}

/// What an acquire decided before anything changes.
enum Decision {
    /// Granted now, replacing the lease's hold on the path if it had one.
    Grant,
    /// Blocked: by what, and the conflicting held locks on other paths.
    Blocked(Contention, Vec<String>),
}

impl Namespace {
    /// The number of lock lease `id` of this namespace, or `NotFound`.
    fn find_lock_lease(&self, id: &str) -> Result<u64, Error> {
        self.find_lease_of(LeaseKind::Lock, id)
    }

    /// Where an acquire of `path` by `seq` conflicts with a hold of another lease, and the
    /// conflicting locks on other paths (ancestors, then descendants; at most
    /// [`BLOCKING_LOCKS_MAX`]).
    fn hold_conflict(&self, path: &str, seq: u64, exclusive: bool) -> (Contention, Vec<String>) {
        let held = self.locks().held();
        let conflicts = |p: &str| {
            held.get(p).is_some_and(|lock| {
                lock.holders()
                    .iter()
                    .any(|(other, h)| *other != seq && conflict(exclusive, h.exclusive))
            })
        };
        let mut reason = Contention::None;
        if conflicts(path) {
            reason = Contention::Peer;
        }
        let mut blocking = Vec::new();
        for ancestor in ancestors(path) {
            if conflicts(ancestor) {
                if reason == Contention::None {
                    reason = Contention::Ancestor;
                }
                if blocking.len() < BLOCKING_LOCKS_MAX {
                    blocking.push(ancestor.to_string());
                }
            }
        }
        let (lo, hi) = descendant_bounds(path);
        for (descendant, _) in held.range(lo..hi) {
            if blocking.len() >= BLOCKING_LOCKS_MAX && reason != Contention::None {
                break;
            }
            if conflicts(descendant) {
                if reason == Contention::None {
                    reason = Contention::Descendant;
                }
                if blocking.len() < BLOCKING_LOCKS_MAX {
                    blocking.push(descendant.clone());
                }
            }
        }
        (reason, blocking)
    }

    /// Where an acquire of `path` by `seq` conflicts with a queued acquire of another lease.
    fn queue_conflict(&self, path: &str, seq: u64, exclusive: bool) -> Contention {
        let locks = self.locks();
        let conflicts = |(p, other): &(String, u64)| {
            *other != seq
                && locks
                    .waiter(p, *other)
                    .is_some_and(|w| conflict(exclusive, w.exclusive))
        };
        let on = |p: &str| {
            locks
                .waiting()
                .range((p.to_string(), 0)..=(p.to_string(), u64::MAX))
                .any(|(key, _)| conflicts(key))
        };
        if on(path) {
            return Contention::Peer;
        }
        if ancestors(path).any(on) {
            return Contention::Ancestor;
        }
        let (lo, hi) = descendant_bounds(path);
        let lo = (lo, 0);
        let hi = (hi, 0);
        if locks.waiting().range(lo..hi).any(|(key, _)| conflicts(key)) {
            return Contention::Descendant;
        }
        Contention::None
    }

    /// Whether `seq` may hold `path` as one more holder.
    fn lock_slot(&self, path: &str, seq: u64) -> bool {
        self.locks().held().get(path).is_none_or(|lock| {
            lock.holders().contains_key(&seq) || lock.holders().len() < HOLDERS_PER_LOCK_MAX
        })
    }

    /// The one grant path: `seq` holds `path` from now with the next fencing token, replacing
    /// its hold there. A queued acquire of `seq` for `path` ends with this grant and is
    /// announced as [`Event::Granted`]; a grant to a lease that was not queued is announced by
    /// the reply.
    fn grant_lock(
        &mut self,
        path: &str,
        seq: u64,
        exclusive: bool,
        metadata: Metadata,
        ctx: &mut Ctx,
    ) -> u64 {
        let waiter = self.remove_lock_waiter(path, seq, ctx);
        ctx.tally.grants += 1;
        if let Some(waiter) = &waiter {
            ctx.tally
                .waits_ns
                .push(ctx.wall_ns.saturating_sub(waiter.queued_at));
        }
        let token = ctx.next_token();
        let holder = LockHolder {
            exclusive,
            locked_at: ctx.wall_ns,
            metadata,
            token,
        };
        self.add_lock_holder(path, seq, holder, ctx);
        self.touch_lock(path, ctx.wall_ns);
        if waiter.is_some() {
            ctx.events.push(Event::Granted {
                ns: self.name().to_string(),
                sem: lock_object(path),
                lease: self.lease_id(seq),
                token,
                weight: u64::from(exclusive),
                hold_ns: 0,
            });
        }
        token
    }

    /// Grants every queued acquire that conflicts with no hold and no acquire queued before it
    /// (see the module's "Order of grants").
    pub(super) fn grant_locks(&mut self, ctx: &mut Ctx) {
        if self.locks().queue().is_empty() {
            return;
        }
        let tickets: Vec<u64> = self.locks().queue().keys().copied().collect();
        let mut blocked = Blocked::new();
        for ticket in tickets {
            let Some(waiter) = self.locks().queue().get(&ticket) else {
                continue;
            };
            let (path, seq, exclusive) = (waiter.path.clone(), waiter.seq, waiter.exclusive);
            if self.free_in_pass(&blocked, waiter) {
                let metadata = waiter.metadata.clone();
                self.grant_lock(&path, seq, exclusive, metadata, ctx);
            } else {
                blocked.entry(path).or_default().push((seq, exclusive));
            }
        }
    }

    /// Whether a pass that found `blocked` before `waiter` grants it.
    fn free_in_pass(&self, blocked: &Blocked, waiter: &LockWaiter) -> bool {
        let (path, seq, exclusive) = (waiter.path.as_str(), waiter.seq, waiter.exclusive);
        blocked_conflict(blocked, path, seq, exclusive) == Contention::None
            && self.hold_conflict(path, seq, exclusive).0 == Contention::None
            && self.lock_slot(path, seq)
    }

    /// The path of the first queued acquire a pass would grant now, if any (none, after every
    /// command: see the module docs).
    pub(super) fn grantable_lock(&self) -> Option<String> {
        let mut blocked = Blocked::new();
        for waiter in self.locks().queue().values() {
            if self.free_in_pass(&blocked, waiter) {
                return Some(waiter.path.clone());
            }
            blocked
                .entry(waiter.path.clone())
                .or_default()
                .push((waiter.seq, waiter.exclusive));
        }
        None
    }

    /// Removes the queued acquire of `seq` for `path` (no grants), telling its caller `reason`.
    pub(super) fn end_lock_wait(
        &mut self,
        path: &str,
        seq: u64,
        reason: WaitEnd,
        ctx: &mut Ctx,
    ) -> bool {
        if self.remove_lock_waiter(path, seq, ctx).is_none() {
            return false;
        }
        self.wait_ended(&lock_object(path), self.lease_id(seq), reason, ctx);
        true
    }

    fn decide(&self, path: &str, seq: u64, exclusive: bool) -> Decision {
        let (reason, blocking) = self.hold_conflict(path, seq, exclusive);
        if reason != Contention::None {
            return Decision::Blocked(reason, blocking);
        }
        match self.queue_conflict(path, seq, exclusive) {
            Contention::None => Decision::Grant,
            queued => Decision::Blocked(queued, blocking),
        }
    }

    pub(super) fn acquire_lock(
        &mut self,
        path: &str,
        id: &str,
        exclusive: bool,
        wait_ns: Nanos,
        metadata: &Metadata,
        ctx: &mut Ctx,
    ) -> Reply {
        let seq = self.find_lock_lease(id)?;
        let (clock, wall) = (ctx.clock_ns, ctx.wall_ns);
        let held = self
            .locks()
            .holder(path, seq)
            .map(|h| (h.exclusive, lock_entry_bytes(path, &h.metadata), h.token));
        let queued = self
            .locks()
            .waiter(path, seq)
            .map(|w| (w.deadline_ns, lock_entry_bytes(path, &w.metadata)));
        let new_bytes = lock_entry_bytes(path, metadata);

        // The same or a weaker mode than held: granted at once, settling a queued upgrade.
        if let Some((held_exclusive, old_bytes, _)) = held
            && (held_exclusive || !exclusive)
        {
            self.room_for(0, 0, 0, new_bytes.saturating_sub(old_bytes), ctx)?;
            let token = self.grant_lock(path, seq, exclusive, metadata.clone(), ctx);
            self.grant_locks(ctx);
            return self.lock_reply(
                path,
                AcquireStatus::Acquired { token, hold_ns: 0 },
                Decision::Grant,
            );
        }

        // Re-attach: keep the place, take the new mode and metadata and the later deadline.
        if let Some((deadline_ns, old_bytes)) = queued {
            self.room_for(0, 0, 0, new_bytes.saturating_sub(old_bytes), ctx)?;
            let deadline_ns = deadline_ns.max(clock.saturating_add(wait_ns));
            self.set_lock_waiter(path, seq, exclusive, deadline_ns, metadata, ctx);
            self.touch_lock(path, wall);
            self.grant_locks(ctx);
            if let Some(holder) = self.locks().holder(path, seq)
                && self.locks().waiter(path, seq).is_none()
            {
                let token = holder.token;
                return self.lock_reply(
                    path,
                    AcquireStatus::Acquired { token, hold_ns: 0 },
                    Decision::Grant,
                );
            }
            let decision = self.blocked_by(path, seq, exclusive);
            let status = if wait_ns > 0 {
                AcquireStatus::Queued { deadline_ns }
            } else {
                AcquireStatus::Unavailable
            };
            return self.lock_reply(path, status, decision);
        }

        // A new acquire, or an upgrade of a shared hold.
        let decision = self.decide(path, seq, exclusive);
        match (&decision, held) {
            (Decision::Grant, Some((_, old_bytes, _))) => {
                self.room_for(0, 0, 0, new_bytes.saturating_sub(old_bytes), ctx)?;
            }
            (Decision::Blocked(..), _) if wait_ns <= 0 => {}
            _ => self.room_for(0, 0, 1, new_bytes, ctx)?,
        }
        match decision {
            Decision::Grant => {
                if !self.lock_slot(path, seq) {
                    return Err(Error::exhausted(format!(
                        "holder quota reached: at most {HOLDERS_PER_LOCK_MAX} holders per lock"
                    )));
                }
                let token = self.grant_lock(path, seq, exclusive, metadata.clone(), ctx);
                self.lock_reply(
                    path,
                    AcquireStatus::Acquired { token, hold_ns: 0 },
                    Decision::Grant,
                )
            }
            Decision::Blocked(..) if wait_ns <= 0 => {
                self.touch_lock(path, wall);
                self.lock_reply(path, AcquireStatus::Unavailable, decision)
            }
            Decision::Blocked(..) => {
                if self.locks().waiters_of(path) >= WAITERS_PER_LOCK_MAX {
                    return Err(Error::exhausted(format!(
                        "waiter quota reached: at most {WAITERS_PER_LOCK_MAX} waiters per lock"
                    )));
                }
                let deadline_ns = clock.saturating_add(wait_ns);
                self.add_lock_waiter(
                    LockWaiter {
                        seq,
                        path: path.to_string(),
                        exclusive,
                        queued_at: wall,
                        deadline_ns,
                        metadata: metadata.clone(),
                    },
                    ctx,
                );
                self.touch_lock(path, wall);
                self.lock_reply(path, AcquireStatus::Queued { deadline_ns }, decision)
            }
        }
    }

    /// What blocks the queued acquire of `seq` for `path` now: holds, or acquires queued
    /// before it.
    fn blocked_by(&self, path: &str, seq: u64, exclusive: bool) -> Decision {
        let (reason, blocking) = self.hold_conflict(path, seq, exclusive);
        if reason != Contention::None {
            return Decision::Blocked(reason, blocking);
        }
        let Some(&mine) = self.locks().waiting().get(&(path.to_string(), seq)) else {
            return Decision::Blocked(Contention::Peer, blocking);
        };
        let mut before = Blocked::new();
        for waiter in self.locks().queue().range(..mine).map(|(_, w)| w) {
            before
                .entry(waiter.path.clone())
                .or_default()
                .push((waiter.seq, waiter.exclusive));
        }
        Decision::Blocked(blocked_conflict(&before, path, seq, exclusive), blocking)
    }

    fn lock_reply(&self, path: &str, status: AcquireStatus, decision: Decision) -> Reply {
        let (reason, blocking) = match decision {
            Decision::Grant => (Contention::None, Vec::new()),
            Decision::Blocked(reason, blocking) => (reason, blocking),
        };
        Ok(Outcome::AcquireLock(AcquireLockReply {
            status,
            lock: self.lock_view(path),
            reason,
            blocking: blocking.iter().map(|p| self.lock_view(p)).collect(),
        }))
    }

    pub(super) fn release_lock(&mut self, path: &str, id: &str, ctx: &mut Ctx) -> Reply {
        let seq = self.find_lock_lease(id)?;
        let released = self.remove_lock_holder(path, seq, ctx).is_some();
        let dequeued = self.end_lock_wait(path, seq, WaitEnd::GaveUp, ctx);
        if released || dequeued {
            self.grant_locks(ctx);
        }
        Ok(Outcome::Lock(self.lock_view(path)))
    }

    pub(super) fn delete_lock(&mut self, path: &str, ctx: &mut Ctx) -> Reply {
        let holders = self.remove_lock(path, ctx);
        for seq in &holders {
            let lease = self.lease_id(*seq);
            self.lost(lease, lock_object(path), LossCause::LockDeleted, ctx);
        }
        if !holders.is_empty() {
            self.grant_locks(ctx);
        }
        Ok(Outcome::Done)
    }

    /// [`Namespace::give_up`] of a queued lock acquire.
    pub(super) fn give_up_lock(
        &mut self,
        path: &str,
        seq: u64,
        deadline_ns: Nanos,
        linger_ns: Nanos,
        ctx: &mut Ctx,
    ) -> GiveUpReply {
        // Queued comes first: a lease that holds and waits is upgrading, and giving up the
        // upgrade keeps the hold it had.
        if let Some(waiter) = self.locks().waiter(path, seq) {
            if waiter.deadline_ns > deadline_ns {
                return GiveUpReply::StillQueued {
                    deadline_ns: waiter.deadline_ns,
                };
            }
            if linger_ns > 0 {
                let lingered = waiter
                    .deadline_ns
                    .min(ctx.clock_ns.saturating_add(linger_ns));
                let (exclusive, metadata) = (waiter.exclusive, waiter.metadata.clone());
                self.set_lock_waiter(path, seq, exclusive, lingered, &metadata, ctx);
                return GiveUpReply::StillQueued {
                    deadline_ns: lingered,
                };
            }
            self.end_lock_wait(path, seq, WaitEnd::GaveUp, ctx);
            self.grant_locks(ctx);
            return GiveUpReply::Removed;
        }
        match self.locks().holder(path, seq) {
            Some(holder) => GiveUpReply::Granted {
                token: holder.token,
                hold_ns: 0,
            },
            None => GiveUpReply::NotQueued,
        }
    }

    /// Lock `path` as it stands (unlocked when nobody holds it).
    pub(super) fn lock_view(&self, path: &str) -> LockView {
        self.lock_view_where(path, |_| true)
    }

    /// Lock `path` showing only the holders whose lease `alive` admits.
    pub(super) fn lock_view_where(&self, path: &str, alive: impl Fn(u64) -> bool) -> LockView {
        let lock = self.locks().held().get(path);
        let mut holders: Vec<LockHolderView> = lock
            .into_iter()
            .flat_map(|lock| lock.holders())
            .filter(|(seq, _)| alive(**seq))
            .map(|(seq, h)| LockHolderView {
                lease_id: self.lease_id(*seq),
                exclusive: h.exclusive,
                locked_at: h.locked_at,
                metadata: h.metadata.clone(),
                token: h.token,
                owner: self.leases().get(seq).and_then(|l| l.owner),
            })
            .collect();
        holders.sort_by_key(|h| h.token);
        // Unlocked (no holder shown): no mode and no times.
        let held = !holders.is_empty();
        LockView {
            name: path.to_string(),
            exclusive: held.then(|| holders.iter().any(|h| h.exclusive)),
            locked_at: holders.iter().map(|h| h.locked_at).min().unwrap_or(0),
            last_activity_at: lock.filter(|_| held).map_or(0, |l| l.last_activity_at),
            holders,
            waiters: self.locks().waiters_of(path) as u64,
        }
    }
}

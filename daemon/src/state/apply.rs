//! Command dispatch: `apply_batch`, the reaping before each command, and the commands that are
//! not about queues (namespaces, semaphores, leases, extending leases).
//!
//! What always holds here: the clock never decreases; due leases and waiters are reaped before
//! every command except `ExtendLeases`, removals before grants, so a waiter that is due is never
//! granted; a command refused by validation or by its handler changes nothing besides that
//! reaping; and every change goes through the index-keeping methods of the data.

use std::collections::{BTreeMap, BTreeSet};

use super::audit::{AuditAction, AuditObject, Draft};
use super::data::{Ctx, Lease, Namespace, Namespaces, Parts, Semaphore, State};
use super::limits::*;
use super::read::{lease_not_found, namespace_not_found, semaphore_not_found, version_mismatch};
use super::types::*;

fn ttl_ns(ttl_s: u64) -> Nanos {
    i64::try_from(ttl_s)
        .unwrap_or(i64::MAX)
        .saturating_mul(NANOS_PER_SEC)
}

fn ns_mut<'a>(namespaces: &'a mut Namespaces, name: &str) -> Result<&'a mut Namespace, Error> {
    namespaces
        .get_mut(name)
        .ok_or_else(|| namespace_not_found(name))
}

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one Raft entry: advances the lease clock to `max(clock, batch.now_ns)` and takes
    /// the batch's wall stamp for display times, then applies
    /// each command in order (reaping due leases and waiters before each command except
    /// `ExtendLeases`). Returns one reply per command; grants and ended waits are pushed to
    /// `events` in order.
    pub fn apply_batch(&mut self, batch: &Batch, events: &mut Vec<Event>) -> Vec<Reply> {
        self.data.clock_ns = self.data.clock_ns.max(batch.now_ns);
        self.data.wall_ns = batch.wall_ns;
        self.data.requests.expire(self.data.clock_ns);
        batch
            .cmds
            .iter()
            .map(|cmd| self.apply_tracked(cmd, events))
            .collect()
    }

    pub(super) fn apply(&mut self, cmd: &Cmd, events: &mut Vec<Event>) -> Reply {
        let Parts {
            namespaces,
            last_lease_seq,
            last_namespace_id,
            mut ctx,
            auth,
            budget,
            requests,
            audit,
            cluster_version,
        } = self.parts(events);
        if !matches!(cmd, Cmd::ExtendLeases) {
            reap(namespaces, &mut ctx);
            super::sync::reap(namespaces, &mut ctx);
        }
        cmd.validate()?;
        let (token, cmd) = match cmd {
            Cmd::As { token, cmd } => (Some(token), &**cmd),
            cmd => (None, cmd),
        };
        if let Some(access) = super::auth::access_of(cmd) {
            auth.authorize(token, access)?;
        }
        let caller = token.and_then(|t| auth.token_id(t));
        // A lease is used only by the token that created it, or one with admin on its
        // namespace (checked after the command's own access, before anything changes).
        if let Some((ns, lease)) = cmd.lease_used()
            && let Some(owner) = namespaces.get(ns).and_then(|n| n.lease_owner(lease))
        {
            auth.may_use_lease(token, caller, ns, lease, owner)
                .map_err(|denied| super::read::as_if_missing(cmd, denied))?;
        }
        // What the trail records if the command succeeds, read before it changes anything.
        let drafts = audit_drafts(namespaces, cmd, caller, budget);
        let ctx = &mut ctx;
        let reply = match cmd {
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
                let ns = Namespace::new(id, name, description, metadata, ctx.wall_ns);
                super::quota::check(
                    "the state's byte budget",
                    ctx.stored_bytes(),
                    ns.usage().bytes,
                    ctx.budget_bytes,
                )?;
                *last_namespace_id = id;
                let view = ns.view();
                namespaces.add(ns, ctx);
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
                let grows =
                    super::quota::object_bytes(&[name, description], metadata).saturating_sub(
                        super::quota::object_bytes(&[name, &ns.description], &ns.metadata),
                    );
                ns.room_for(0, 0, 0, grows, ctx)?;
                ns.set_attributes(description, metadata, ctx);
                ns.version = ns.version.saturating_add(1);
                ns.updated_at = ctx.wall_ns;
                Ok(Outcome::Namespace(ns.view()))
            }
            Cmd::DeleteNamespace { name } => {
                if let Some(ns) = namespaces.remove(name, ctx) {
                    super::sync::namespace_gone(&ns, ctx);
                    // Its leases are lost with it.
                    for seq in ns.leases().keys() {
                        let lease = ns.lease_id(*seq);
                        ns.lost(lease, String::new(), LossCause::NamespaceDeleted, ctx);
                    }
                    // Its waiters' callers learn that the semaphore is gone.
                    for (sem_name, sem) in ns.semaphores() {
                        for seq in sem.queue().values() {
                            ns.wait_ended(sem_name, ns.lease_id(*seq), WaitEnd::SemaphoreGone, ctx);
                        }
                    }
                    for waiter in ns.locks().queue().values() {
                        let object = lock_object(&waiter.path);
                        ns.wait_ended(
                            &object,
                            ns.lease_id(waiter.seq),
                            WaitEnd::SemaphoreGone,
                            ctx,
                        );
                    }
                }
                Ok(Outcome::Done)
            }
            Cmd::CreateSemaphore {
                ns,
                name,
                description,
                permits,
                metadata,
                max_hold_ns,
            } => ns_mut(namespaces, ns)?.create_semaphore(
                name,
                description,
                *permits,
                metadata,
                *max_hold_ns,
                ctx,
            ),
            Cmd::UpdateSemaphore {
                ns,
                name,
                description,
                permits,
                metadata,
                expected_version,
                max_hold_ns,
            } => ns_mut(namespaces, ns)?.update_semaphore(
                name,
                description,
                *permits,
                metadata,
                *expected_version,
                *max_hold_ns,
                ctx,
            ),
            Cmd::DeleteSemaphore { ns, name } => {
                ns_mut(namespaces, ns)?.end_semaphore(name, ctx);
                Ok(Outcome::Done)
            }
            Cmd::CreateLease {
                ns,
                kind,
                process_id,
                ttl_s,
                metadata,
                secret,
            } => {
                let expires_at = ctx.clock_ns.saturating_add(ttl_ns(*ttl_s));
                let mut lease = Lease::new(
                    process_id,
                    *ttl_s,
                    metadata,
                    ctx.wall_ns,
                    expires_at,
                    caller,
                    *secret,
                );
                lease.kind = *kind;
                ns_mut(namespaces, ns)?.create_lease(lease, last_lease_seq, ctx)
            }
            Cmd::RefreshLease {
                ns,
                kind,
                lease,
                ttl_s,
            } => ns_mut(namespaces, ns)?.refresh_lease(*kind, lease, *ttl_s, ctx),
            Cmd::RevokeLease { ns, kind, lease } => {
                ns_mut(namespaces, ns)?.revoke_lease(*kind, lease, ctx)
            }
            Cmd::AcquireLock {
                ns,
                path,
                lease,
                exclusive,
                wait_ns,
                metadata,
            } => ns_mut(namespaces, ns)?
                .acquire_lock(path, lease, *exclusive, *wait_ns, metadata, ctx),
            Cmd::ReleaseLock { ns, path, lease } => {
                ns_mut(namespaces, ns)?.release_lock(path, lease, ctx)
            }
            Cmd::DeleteLock { ns, path } => ns_mut(namespaces, ns)?.delete_lock(path, ctx),
            Cmd::Acquire {
                ns,
                sem,
                lease,
                weight,
                wait_ns,
                metadata,
                max_hold_ns,
            } => ns_mut(namespaces, ns)?.acquire(
                sem,
                lease,
                *weight,
                *wait_ns,
                *max_hold_ns,
                metadata,
                ctx,
            ),
            Cmd::Release { ns, sem, lease } => ns_mut(namespaces, ns)?.release(sem, lease, ctx),
            Cmd::AcquireSet {
                ns,
                lease,
                members,
                wait_ns,
                metadata,
                max_hold_ns,
            } => ns_mut(namespaces, ns)?.acquire_set(
                members,
                lease,
                *wait_ns,
                *max_hold_ns,
                metadata,
                ctx,
            ),
            Cmd::GiveUp {
                ns,
                sem,
                lease,
                deadline_ns,
                linger_ns,
            } => {
                let reply = match namespaces.get_mut(ns) {
                    Some(ns) => ns.give_up(sem, lease, *deadline_ns, *linger_ns, ctx),
                    None => GiveUpReply::NotQueued,
                };
                Ok(Outcome::GiveUp(reply))
            }
            Cmd::SetQuotas { ns, quotas } => {
                let ns = ns_mut(namespaces, ns)?;
                ns.set_quotas(*quotas);
                Ok(Outcome::Quotas(
                    ns.quota_view(ctx, requests.count(ns.name())),
                ))
            }
            Cmd::SetBudget { bytes } => {
                budget.bytes = *bytes;
                Ok(Outcome::Budget {
                    budget_bytes: *bytes,
                    state_bytes: ctx.stored_bytes(),
                })
            }
            Cmd::WaitGroup(cmd) => super::sync::apply_wait_group(namespaces, cmd, ctx),
            Cmd::Barrier(cmd) => super::sync::apply_barrier(namespaces, cmd, ctx),
            Cmd::Expire => Ok(Outcome::Done),
            Cmd::SetClusterVersion { version } => {
                if *version > super::version::NEWEST {
                    return Err(Error::failed_precondition(format!(
                        "cluster version {version} is newer than this release speaks (at most {})",
                        super::version::NEWEST
                    )));
                }
                cluster_version.0 = cluster_version.0.max(*version);
                Ok(Outcome::Done)
            }
            Cmd::ExtendLeases => {
                extend_leases(namespaces, ctx);
                Ok(Outcome::Done)
            }
            // Handled by `apply_tracked`; one nested in another is refused by validation.
            Cmd::Once { .. } => Err(Error::invalid(
                "conch-request-id applies to client writes only",
            )),
            // Unwrapped above; one nested in another is refused by validation.
            Cmd::As { .. } => Err(Error::invalid("a command carries one token")),
            Cmd::AuthEnable
            | Cmd::AuthDisable
            | Cmd::RoleCreate { .. }
            | Cmd::RoleGrant { .. }
            | Cmd::RoleRevoke { .. }
            | Cmd::RoleDelete { .. }
            | Cmd::TokenCreate { .. }
            | Cmd::TokenRevoke { .. }
            | Cmd::AuthBootstrap { .. } => auth
                .apply(cmd, ctx.wall_ns)
                .unwrap_or_else(|| Err(Error::invalid("not an access control command"))),
            Cmd::RevokeHolder {
                ns,
                kind,
                object,
                lease,
                reason,
            } => {
                let draft = ns_mut(namespaces, ns)?.revoke_holder(*kind, object, lease, ctx)?;
                let draft = Draft {
                    reason: reason.clone(),
                    ..draft
                };
                let actor = auth.actor(caller);
                Ok(Outcome::Audit(audit.push(
                    draft,
                    &actor,
                    ctx.wall_ns,
                    ctx.clock_ns,
                )))
            }
        };
        if reply.is_ok() && !drafts.is_empty() {
            let actor = auth.actor(caller);
            for draft in drafts {
                audit.push(draft, &actor, ctx.wall_ns, ctx.clock_ns);
            }
        }
        reply
    }
}

/// The audit records `cmd` makes if it succeeds (see `audit.rs`), from the state before it
/// runs: the holders a revoke by another token or a deletion drops, and what a capacity or
/// quota change changes. `RevokeHolder` makes its own.
fn audit_drafts(
    namespaces: &Namespaces,
    cmd: &Cmd,
    caller: Option<u64>,
    budget: &super::quota::Budget,
) -> Vec<Draft> {
    let holder_draft = |action, ns: &Namespace, object: &str, seq: u64| {
        let (kind, name) = match lock_path(object) {
            Some(path) => (AuditObject::Lock, path),
            None => (AuditObject::Semaphore, object),
        };
        let draft = Draft::new(action, ns.name(), kind, name);
        match ns.leases().get(&seq) {
            Some(lease) => draft.holder(lease.id(seq), &lease.process_id, lease.owner),
            None => draft,
        }
    };
    match cmd {
        Cmd::RevokeLease { ns, kind, lease } => {
            let Some(n) = namespaces.get(ns) else {
                return Vec::new();
            };
            let Some((seq, l)) = n
                .lease_seq(lease)
                .and_then(|seq| n.leases().get(&seq).map(|l| (seq, l)))
                .filter(|(_, l)| l.kind == *kind)
            else {
                return Vec::new();
            };
            // Only knowable with tokens: a lease made by one token, revoked by another.
            match (l.owner, caller) {
                (Some(owner), Some(caller)) if owner != caller => l
                    .holds
                    .iter()
                    .map(|object| holder_draft(AuditAction::RevokeLease, n, object, seq))
                    .collect(),
                _ => Vec::new(),
            }
        }
        Cmd::DeleteSemaphore { ns, name } => namespaces
            .get(ns)
            .and_then(|n| n.semaphores().get(name).map(|sem| (n, sem)))
            .map(|(n, sem)| {
                sem.holders_by_token()
                    .values()
                    .map(|seq| holder_draft(AuditAction::DeleteSemaphore, n, name, *seq))
                    .collect()
            })
            .unwrap_or_default(),
        Cmd::DeleteLock { ns, path } => namespaces
            .get(ns)
            .and_then(|n| n.locks().held().get(path).map(|lock| (n, lock)))
            .map(|(n, lock)| {
                let object = lock_object(path);
                lock.holders()
                    .keys()
                    .map(|seq| holder_draft(AuditAction::DeleteLock, n, &object, *seq))
                    .collect()
            })
            .unwrap_or_default(),
        Cmd::UpdateSemaphore {
            ns,
            name,
            permits,
            max_hold_ns,
            ..
        } => {
            let Some(sem) = namespaces.get(ns).and_then(|n| n.semaphores().get(name)) else {
                return Vec::new();
            };
            let mut changes = Vec::new();
            if *permits != sem.permits {
                changes.push(format!("permits {} -> {permits}", sem.permits));
            }
            if let Some(hold) = max_hold_ns
                && *hold != sem.max_hold_ns
            {
                changes.push(format!(
                    "hold limit {} -> {}",
                    hold_limit(sem.max_hold_ns),
                    hold_limit(*hold)
                ));
            }
            if changes.is_empty() {
                return Vec::new();
            }
            let mut draft = Draft::new(
                AuditAction::UpdateSemaphore,
                ns,
                AuditObject::Semaphore,
                name,
            );
            draft.detail = changes.join(", ");
            vec![draft]
        }
        Cmd::SetQuotas { ns, quotas } => {
            let Some(old) = namespaces.get(ns).map(|n| n.quotas()) else {
                return Vec::new();
            };
            let changes: Vec<String> = [
                ("semaphores", old.semaphores, quotas.semaphores),
                ("leases", old.leases, quotas.leases),
                ("entries", old.entries, quotas.entries),
                ("bytes", old.bytes, quotas.bytes),
                ("request_ids", old.request_ids, quotas.request_ids),
            ]
            .into_iter()
            .filter(|(_, old, new)| old != new)
            .map(|(what, old, new)| format!("{what} {old} -> {new}"))
            .collect();
            if changes.is_empty() {
                return Vec::new();
            }
            let mut draft = Draft::new(AuditAction::SetQuotas, ns, AuditObject::Namespace, "");
            draft.detail = changes.join(", ");
            vec![draft]
        }
        Cmd::SetBudget { bytes } if *bytes != budget.bytes => {
            let mut draft = Draft::new(AuditAction::SetBudget, "", AuditObject::State, "");
            draft.detail = format!("budget_bytes {} -> {bytes}", budget.bytes);
            vec![draft]
        }
        _ => Vec::new(),
    }
}

/// A hold limit as a record's detail shows it: `none`, `30s`, `1500ms`.
fn hold_limit(ns: Nanos) -> String {
    match ns {
        0 => "none".to_string(),
        ns if ns % NANOS_PER_SEC == 0 => format!("{}s", ns / NANOS_PER_SEC),
        ns if ns % NANOS_PER_MS == 0 => format!("{}ms", ns / NANOS_PER_MS),
        ns => format!("{ns}ns"),
    }
}

/// Revokes every lease, removes every waiter and ends every hold due at the clock, then grants
/// from the heads of the queues that changed. Removals come first, so a waiter that is due is
/// never granted.
fn reap(namespaces: &mut Namespaces, ctx: &mut Ctx) {
    let mut affected: BTreeSet<(String, String)> = BTreeSet::new();
    while let Some((ns_id, seq)) = ctx.pop_lease_due() {
        let Some(name) = ctx.namespace_name(ns_id).cloned() else {
            continue;
        };
        let Some(ns) = namespaces.get_mut(&name) else {
            continue;
        };
        let mut sems = BTreeSet::new();
        if ns.end_lease(seq, LossCause::Expired, ctx, &mut sems) {
            ctx.tally.expirations += 1;
        }
        affected.extend(sems.into_iter().map(|sem| (name.clone(), sem)));
    }
    while let Some((ns_id, sem, seq)) = ctx.pop_waiter_due() {
        let Some(name) = ctx.namespace_name(ns_id).cloned() else {
            continue;
        };
        let Some(ns) = namespaces.get_mut(&name) else {
            continue;
        };
        match lock_path(&sem) {
            Some(path) => {
                ns.end_lock_wait(path, seq, WaitEnd::TimedOut, ctx);
            }
            // A set's members share its deadline: the first of them due ends it whole.
            None => {
                for member in ns.end_wait_all(&sem, seq, WaitEnd::TimedOut, ctx) {
                    affected.insert((name.clone(), member));
                }
            }
        }
        affected.insert((name, sem));
    }
    while let Some((ns_id, sem, seq)) = ctx.pop_hold_due() {
        let Some(name) = ctx.namespace_name(ns_id).cloned() else {
            continue;
        };
        let Some(ns) = namespaces.get_mut(&name) else {
            continue;
        };
        if ns.remove_holder(&sem, seq, ctx).is_some() {
            ctx.tally.holds_ended += 1;
            let lease = ns.lease_id(seq);
            ns.lost(lease, sem.clone(), LossCause::HoldLimit, ctx);
        }
        affected.insert((name, sem));
    }
    let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, object) in affected {
        by_namespace.entry(name).or_default().insert(object);
    }
    for (name, objects) in by_namespace {
        if let Some(ns) = namespaces.get_mut(&name) {
            ns.move_queues(&objects, ctx);
        }
    }
}

/// Every lease lives at least its TTL from the clock (a new leader's first command).
fn extend_leases(namespaces: &mut Namespaces, ctx: &mut Ctx) {
    let clock_ns = ctx.clock_ns;
    for ns in namespaces.values_mut() {
        ns.set_lease_expiries(ctx, |lease| {
            lease
                .expires_at
                .max(clock_ns.saturating_add(ttl_ns(lease.ttl_s)))
        });
    }
}

impl Namespace {
    #[allow(clippy::too_many_arguments)]
    fn create_semaphore(
        &mut self,
        name: &str,
        description: &str,
        permits: u64,
        metadata: &Metadata,
        max_hold_ns: Nanos,
        ctx: &mut Ctx,
    ) -> Reply {
        if self.semaphores().contains_key(name) {
            return Err(Error::already_exists(format!(
                "semaphore {name} already exists"
            )));
        }
        if self.semaphores().len() >= SEMAPHORES_PER_NAMESPACE_MAX {
            return Err(Error::exhausted(format!(
                "semaphore quota reached: at most {SEMAPHORES_PER_NAMESPACE_MAX} semaphores per namespace"
            )));
        }
        let mut sem = Semaphore::new(description, permits, metadata, ctx.wall_ns);
        sem.max_hold_ns = max_hold_ns;
        self.room_for(1, 0, 0, sem.bytes(name), ctx)?;
        let view = sem.view(name);
        self.add_semaphore(name, sem, ctx);
        Ok(Outcome::Semaphore(view))
    }

    #[allow(clippy::too_many_arguments)]
    fn update_semaphore(
        &mut self,
        name: &str,
        description: &str,
        permits: u64,
        metadata: &Metadata,
        expected_version: u64,
        max_hold_ns: Option<Nanos>,
        ctx: &mut Ctx,
    ) -> Reply {
        let sem = self
            .semaphore_mut(name)
            .ok_or_else(|| semaphore_not_found(name))?;
        if expected_version != sem.version {
            return Err(version_mismatch(expected_version, sem.version));
        }
        if permits < sem.held() {
            return Err(Error::invalid(format!(
                "permits below active holds: {permits} < {}",
                sem.held()
            )));
        }
        if sem.waiters().values().any(|w| w.weight > permits) {
            return Err(Error::invalid(
                "permits below the weight of a queued waiter",
            ));
        }
        let grows = super::quota::object_bytes(&[name, description], metadata).saturating_sub(
            super::quota::object_bytes(&[name, &sem.description], &sem.metadata),
        );
        self.room_for(0, 0, 0, grows, ctx)?;
        self.set_semaphore_attributes(name, description, metadata, ctx);
        let Some(sem) = self.semaphore_mut(name) else {
            return Err(semaphore_not_found(name));
        };
        sem.permits = permits;
        if let Some(max_hold_ns) = max_hold_ns {
            sem.max_hold_ns = max_hold_ns;
        }
        sem.version = sem.version.saturating_add(1);
        sem.updated_at = ctx.wall_ns;
        self.grant_from_head(name, ctx);
        self.reply_semaphore(name)
    }

    /// Adds `lease` under the next lease number.
    fn create_lease(&mut self, lease: Lease, last_lease_seq: &mut u64, ctx: &mut Ctx) -> Reply {
        if self.leases().len() >= LEASES_PER_NAMESPACE_MAX {
            return Err(Error::exhausted(format!(
                "lease quota reached: at most {LEASES_PER_NAMESPACE_MAX} leases per namespace"
            )));
        }
        self.room_for(0, 1, 0, lease.bytes(), ctx)?;
        let Some(seq) = last_lease_seq.checked_add(1) else {
            return Err(Error::exhausted("lease ids exhausted"));
        };
        *last_lease_seq = seq;
        let view = lease.view(seq, ctx.times());
        self.add_lease(seq, lease, ctx);
        Ok(Outcome::Lease(view))
    }

    /// An administrator's revoke of the lease `id` of `kind`, which must hold or wait for
    /// `object`: the whole lease goes, as with `RevokeLease`, and the queues it leaves move.
    /// Answers the trail's record of it (without the reason, which the caller adds).
    fn revoke_holder(
        &mut self,
        kind: LeaseKind,
        object: &str,
        id: &str,
        ctx: &mut Ctx,
    ) -> Result<Draft, Error> {
        let seq = self.find_lease_of(kind, id)?;
        let (key, object_kind, noun) = match kind {
            LeaseKind::Semaphore => (object.to_string(), AuditObject::Semaphore, "semaphore"),
            LeaseKind::Lock => (lock_object(object), AuditObject::Lock, "lock"),
        };
        let lease = self.leases().get(&seq).ok_or_else(|| lease_not_found(id))?;
        if !lease.holds.contains(&key) && !lease.waits.contains(&key) {
            return Err(Error::not_found(format!(
                "{} {id} neither holds nor waits for {noun} {}/{object}",
                kind.noun(),
                self.name()
            )));
        }
        let draft = Draft::new(AuditAction::RevokeHolder, self.name(), object_kind, object).holder(
            id.to_string(),
            &lease.process_id,
            lease.owner,
        );
        self.revoke_lease(kind, id, ctx)?;
        Ok(draft)
    }

    fn refresh_lease(&mut self, kind: LeaseKind, id: &str, ttl_s: u64, ctx: &mut Ctx) -> Reply {
        let seq = self.find_lease_of(kind, id)?;
        if ttl_s != 0 {
            self.set_lease_ttl(seq, ttl_s);
        }
        let ttl_s = self.leases().get(&seq).map_or(ttl_s, |lease| lease.ttl_s);
        self.set_lease_expiry(seq, ctx.clock_ns.saturating_add(ttl_ns(ttl_s)), ctx);
        let lease = self.leases().get(&seq).ok_or_else(|| lease_not_found(id))?;
        Ok(Outcome::Lease(lease.view(seq, ctx.times())))
    }
}

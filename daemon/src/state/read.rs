//! Reads and views: lookups, the views replies carry, and the reads a node serves from its
//! applied state.
//!
//! What always holds here: nothing changes the state, and what a read shows depends on the
//! replicated state only (never on the reading node's clock), so every node that applied the
//! same entries answers the same. Reads hide leases with `expires_at <= clock` (the state's lease
//! clock), their holders and waiters, and waiters whose deadline has passed; counts in semaphore
//! views match what is shown. A lease's displayed `expires_at` is on the wall clock: the newest
//! batch's wall stamp plus the time the lease has left on the lease clock.
//!
//! The reads of locks are in `read/locks.rs`, the audit trail's in `read/audit.rs`.

use std::ops::Bound;

use super::auth::TokenHash;
use super::data::{Ctx, Holder, Lease, Namespace, Semaphore, State, Waiter, process_key};
use super::lease_id::{lease_id, parse_lease_id};
use super::paging::paginate;
use super::types::*;
use super::validate;

mod audit;
mod locks;

/// The state's two clocks, for views: the lease clock decides, the wall clock is displayed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Times {
    pub(super) clock_ns: Nanos,
    pub(super) wall_ns: Nanos,
}

impl Times {
    /// A lease-clock instant shown on the wall clock.
    pub(super) fn display(self, lease_clock_ns: Nanos) -> Nanos {
        self.wall_ns
            .saturating_add(lease_clock_ns.saturating_sub(self.clock_ns))
    }
}

impl Ctx<'_> {
    pub(super) fn times(&self) -> Times {
        Times {
            clock_ns: self.clock_ns,
            wall_ns: self.wall_ns,
        }
    }
}

/// Which leases, holders and waiters a read shows: those still alive at the state's clock.
#[derive(Clone, Copy)]
struct Visibility {
    now_ns: Nanos,
    /// Nothing in the whole state is due at `now_ns`: skip the per-item checks.
    everything: bool,
}

pub(super) fn namespace_not_found(name: &str) -> Error {
    Error::not_found(format!("namespace {name} not found"))
}

pub(super) fn semaphore_not_found(name: &str) -> Error {
    Error::not_found(format!("semaphore {name} not found"))
}

/// A refresh or revoke of a lease another token created answers as one of a missing lease
/// (`denied` becomes NOT_FOUND with the same message), so a token learns nothing of leases it
/// may not see; other refusals stay as they are.
pub(super) fn as_if_missing(cmd: &Cmd, denied: Error) -> Error {
    match cmd {
        Cmd::RefreshLease { kind, lease, .. } | Cmd::RevokeLease { kind, lease, .. }
            if denied.kind == ErrorKind::PermissionDenied =>
        {
            lease_of_kind_not_found(*kind, lease)
        }
        _ => denied,
    }
}

pub(super) fn lease_not_found(id: &str) -> Error {
    Error::not_found(format!("lease {id} not found"))
}

pub(super) fn lease_of_kind_not_found(kind: LeaseKind, id: &str) -> Error {
    Error::not_found(format!("{} {id} not found", kind.noun()))
}

pub(super) fn version_mismatch(expected: u64, found: u64) -> Error {
    Error::invalid(format!(
        "version mismatch: expected {expected}, found {found}"
    ))
}

impl Semaphore {
    /// The view with everything counted (apply's replies: nothing is due at the clock).
    pub(super) fn view(&self, name: &str) -> SemaphoreView {
        SemaphoreView {
            name: name.to_string(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            permits: self.permits,
            active_holds: self.held(),
            active_holders_count: self.holders().len() as u64,
            waiters_count: self.waiters().len() as u64,
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_activity_at: self.last_activity_at,
            max_hold_ns: self.max_hold_ns,
        }
    }

    /// The holder of lease `seq`, a lease of `namespace`.
    fn holder_view(&self, seq: u64, namespace: &Namespace) -> Option<HolderView> {
        let h = self.holders().get(&seq)?;
        let lease = namespace.leases().get(&seq);
        Some(HolderView {
            lease_id: namespace.lease_id(seq),
            owner: lease.and_then(|l| l.owner),
            weight: h.weight,
            locked_at: h.locked_at,
            metadata: h.metadata.clone(),
            token: h.token,
            ends_at: h.ends_wall,
            hold_left_ns: 0,
        })
    }
}

/// The waiter `w` of lease `seq`, a lease of `namespace`.
fn waiter_view(seq: u64, namespace: &Namespace, w: &Waiter, position: u64) -> WaiterView {
    WaiterView {
        lease_id: namespace.lease_id(seq),
        owner: namespace.leases().get(&seq).and_then(|l| l.owner),
        weight: w.weight,
        queued_at: w.queued_at,
        deadline_ns: w.deadline_ns,
        metadata: w.metadata.clone(),
        position,
    }
}

impl Lease {
    /// This lease's id, as lease `seq`.
    pub(super) fn id(&self, seq: u64) -> String {
        lease_id(seq, self.secret)
    }

    pub(super) fn view(&self, seq: u64, times: Times) -> LeaseView {
        LeaseView {
            lease_id: self.id(seq),
            process_id: self.process_id.clone(),
            metadata: self.metadata.clone(),
            created_at: self.created_at,
            expires_at: times.display(self.expires_at),
            ttl_s: self.ttl_s,
            owner: self.owner,
        }
    }
}

impl Namespace {
    pub(super) fn view(&self) -> NamespaceView {
        NamespaceView {
            name: self.name().to_string(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            version: self.version,
        }
    }

    /// Its quotas and usage, with the state's budget as `ctx` has it.
    /// Its quotas and usage, with the state's budget as `ctx` has it and `request_ids`
    /// remembered for it.
    pub(super) fn quota_view(&self, ctx: &Ctx, request_ids: u64) -> QuotaView {
        self.quota_view_with(ctx.budget_bytes, ctx.stored_bytes(), request_ids)
    }

    pub(super) fn quota_view_with(
        &self,
        budget_bytes: u64,
        state_bytes: u64,
        request_ids: u64,
    ) -> QuotaView {
        let usage = self.usage();
        QuotaView {
            namespace: self.name().to_string(),
            quotas: self.quotas(),
            semaphores: self.semaphores().len() as u64,
            leases: self.leases().len() as u64,
            entries: usage.entries,
            bytes: usage.bytes,
            request_ids,
            budget_bytes,
            state_bytes,
        }
    }

    /// The token that created lease `id`, if it is a lease of this namespace created with one.
    pub(super) fn lease_owner(&self, id: &str) -> Option<u64> {
        let seq = self.lease_seq(id)?;
        self.leases().get(&seq)?.owner
    }

    /// The sequence number of lease `id` if it is a lease of this namespace: the number names
    /// a lease here and the secret is that lease's.
    pub(super) fn lease_seq(&self, id: &str) -> Option<u64> {
        let (seq, secret) = parse_lease_id(id)?;
        self.leases()
            .get(&seq)
            .filter(|lease| lease.secret == secret)
            .map(|_| seq)
    }

    /// The id of lease `seq` of this namespace.
    pub(super) fn lease_id(&self, seq: u64) -> String {
        lease_id(seq, self.leases().get(&seq).map_or(0, |lease| lease.secret))
    }

    /// The sequence number of a lease of this namespace of `kind`, or `NotFound` (a lease of
    /// the other kind is not one, as in Grackle, where the two kinds are kept apart).
    pub(super) fn find_lease_of(&self, kind: LeaseKind, id: &str) -> Result<u64, Error> {
        self.lease_seq(id)
            .filter(|seq| self.leases().get(seq).is_some_and(|l| l.kind == kind))
            .ok_or_else(|| lease_of_kind_not_found(kind, id))
    }

    pub(super) fn find_semaphore(&self, name: &str) -> Result<&Semaphore, Error> {
        self.semaphores()
            .get(name)
            .ok_or_else(|| semaphore_not_found(name))
    }

    pub(super) fn reply_semaphore(&self, name: &str) -> Reply {
        Ok(Outcome::Semaphore(self.find_semaphore(name)?.view(name)))
    }
}

impl Namespace {
    fn lease_visible(&self, seq: u64, vis: Visibility) -> bool {
        vis.everything
            || self
                .leases()
                .get(&seq)
                .is_some_and(|l| l.expires_at > vis.now_ns)
    }

    /// A hold shows while its lease lives and its hold limit has not passed.
    fn holder_visible(&self, seq: u64, holder: &Holder, vis: Visibility) -> bool {
        vis.everything
            || ((holder.ends_at == 0 || holder.ends_at > vis.now_ns)
                && self.lease_visible(seq, vis))
    }

    fn waiter_visible(&self, seq: u64, waiter: &Waiter, vis: Visibility) -> bool {
        vis.everything || (waiter.deadline_ns > vis.now_ns && self.lease_visible(seq, vis))
    }

    /// The semaphore as a read at `vis.now_ns` shows it.
    fn semaphore_view(&self, name: &str, sem: &Semaphore, vis: Visibility) -> SemaphoreView {
        let mut view = sem.view(name);
        if !vis.everything {
            let live: Vec<u64> = sem
                .holders()
                .iter()
                .filter(|(seq, h)| self.holder_visible(**seq, h, vis))
                .map(|(_, h)| h.weight)
                .collect();
            view.active_holds = live.iter().fold(0u64, |sum, w| sum.saturating_add(*w));
            view.active_holders_count = live.len() as u64;
            view.waiters_count = sem
                .waiters()
                .iter()
                .filter(|(seq, w)| self.waiter_visible(**seq, w, vis))
                .count() as u64;
        }
        view
    }
}

impl State {
    /// The state machine's lease clock (ns): the largest batch stamp applied so far.
    pub fn clock_ns(&self) -> Nanos {
        self.data.clock_ns
    }

    /// The newest batch's wall-clock stamp (ns since the Unix epoch), for display.
    pub fn wall_ns(&self) -> Nanos {
        self.data.wall_ns
    }

    pub(super) fn times(&self) -> Times {
        Times {
            clock_ns: self.data.clock_ns,
            wall_ns: self.data.wall_ns,
        }
    }

    /// The earliest time at which a lease expires or a waiter's deadline passes, if any.
    pub fn next_due_ns(&self) -> Option<Nanos> {
        self.index().next_due_ns()
    }

    fn visibility(&self) -> Visibility {
        let now_ns = self.data.clock_ns;
        let everything = self.next_due_ns().is_none_or(|due| due > now_ns);
        Visibility { now_ns, everything }
    }

    pub(super) fn namespace(&self, name: &str) -> Result<&Namespace, Error> {
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
        self.list_namespaces_visible(page, |_| true)
    }

    /// The namespaces `visible` admits, paged among themselves: pages, their tokens and whether
    /// a next or previous page exists are made of visible namespaces only, so a caller learns no
    /// other name, not even through a token.
    pub fn list_namespaces_visible(
        &self,
        page: &PageRequest,
        visible: impl Fn(&str) -> bool,
    ) -> Result<Page<NamespaceView>, Error> {
        paginate(page, |lo, hi| {
            self.data
                .namespaces
                .map()
                .range((lo, hi))
                .filter(|(k, _)| visible(k))
                .map(|(k, ns)| (k.clone(), ns.view()))
        })
    }

    pub fn get_semaphore(&self, ns: &str, name: &str) -> Result<SemaphoreView, Error> {
        validate::name("namespace_name", ns)?;
        validate::name("semaphore_name", name)?;
        let namespace = self.namespace(ns)?;
        let sem = namespace.find_semaphore(name)?;
        Ok(namespace.semaphore_view(name, sem, self.visibility()))
    }

    pub fn list_semaphores(
        &self,
        ns: &str,
        page: &PageRequest,
    ) -> Result<Page<SemaphoreView>, Error> {
        validate::name("namespace_name", ns)?;
        let namespace = self.namespace(ns)?;
        let vis = self.visibility();
        paginate(page, |lo, hi| {
            namespace
                .semaphores()
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
    ) -> Result<Page<HolderView>, Error> {
        validate::name("namespace_name", ns)?;
        validate::name("semaphore_name", sem)?;
        let namespace = self.namespace(ns)?;
        let semaphore = namespace.find_semaphore(sem)?;
        let vis = self.visibility();
        paginate(page, |lo, hi| {
            semaphore
                .holders_by_token()
                .range((lo, hi))
                .filter(move |(_, seq)| {
                    semaphore
                        .holders()
                        .get(seq)
                        .is_some_and(|h| namespace.holder_visible(**seq, h, vis))
                })
                .filter_map(|(token, seq)| Some((*token, semaphore.holder_view(*seq, namespace)?)))
        })
    }

    /// Waiters in queue order, with the semaphore.
    pub fn list_waiters(
        &self,
        ns: &str,
        sem: &str,
        page: &PageRequest,
    ) -> Result<(SemaphoreView, Page<WaiterView>), Error> {
        validate::name("namespace_name", ns)?;
        validate::name("semaphore_name", sem)?;
        let namespace = self.namespace(ns)?;
        let semaphore = namespace.find_semaphore(sem)?;
        let vis = self.visibility();
        let visible = move |seq: &u64| {
            semaphore
                .waiters()
                .get(seq)
                .filter(|w| namespace.waiter_visible(*seq, w, vis))
                .map(|w| (*seq, w))
        };
        let mut page = paginate(page, |lo, hi| {
            semaphore
                .queue()
                .range((lo, hi))
                .filter_map(move |(ticket, seq)| {
                    visible(seq).map(|(seq, w)| (*ticket, (*ticket, seq, w)))
                })
        })?;
        // Positions count the visible waiters ahead; the page's waiters are consecutive.
        let first_position = match page.items.first() {
            Some((ticket, ..)) => semaphore
                .queue()
                .range(..*ticket)
                .filter(|(_, seq)| visible(seq).is_some())
                .count(),
            None => 0,
        };
        let items = page
            .items
            .drain(..)
            .enumerate()
            .map(|(i, (_, seq, w))| waiter_view(seq, namespace, w, (first_position + i) as u64))
            .collect();
        let waiters = Page {
            items,
            next_token: page.next_token,
            previous_token: page.previous_token,
        };
        Ok((namespace.semaphore_view(sem, semaphore, vis), waiters))
    }

    /// Lease `lease` of `kind` in `ns`, if alive at the state's clock.
    pub fn get_lease(&self, ns: &str, kind: LeaseKind, lease: &str) -> Result<LeaseView, Error> {
        validate::name("namespace_name", ns)?;
        validate::lease_id(lease)?;
        let namespace = self.namespace(ns)?;
        let (now_ns, times) = (self.data.clock_ns, self.times());
        namespace
            .lease_seq(lease)
            .and_then(|seq| Some((seq, namespace.leases().get(&seq)?)))
            .filter(|(_, l)| l.expires_at > now_ns && l.kind == kind)
            .map(|(seq, l)| l.view(seq, times))
            .ok_or_else(|| lease_of_kind_not_found(kind, lease))
    }

    /// What lease `lease` of `kind` in `ns` holds, if the lease is alive at the state's clock
    /// (else `NotFound`, as [`State::get_lease`]): its holds in object order.
    pub fn lease_holds(
        &self,
        ns: &str,
        kind: LeaseKind,
        lease: &str,
    ) -> Result<Vec<LeaseHold>, Error> {
        self.get_lease(ns, kind, lease)?;
        let namespace = self.namespace(ns)?;
        let Some(seq) = namespace.lease_seq(lease) else {
            return Err(lease_of_kind_not_found(kind, lease));
        };
        let Some(l) = namespace.leases().get(&seq) else {
            return Err(lease_of_kind_not_found(kind, lease));
        };
        let holds = l
            .holds
            .iter()
            .filter_map(|object| match lock_path(object) {
                Some(path) => namespace.locks().holder(path, seq).map(|h| LeaseHold {
                    object: object.clone(),
                    token: h.token,
                    weight: 1,
                    exclusive: h.exclusive,
                }),
                None => namespace
                    .semaphores()
                    .get(object)
                    .and_then(|sem| sem.holders().get(&seq))
                    .map(|h| LeaseHold {
                        object: object.clone(),
                        token: h.token,
                        weight: h.weight,
                        exclusive: false,
                    }),
            })
            .collect();
        Ok(holds)
    }

    /// Refuses `cmd` if it uses an existing lease that `token` may not use (see
    /// [`Auth::may_use_lease`](super::auth::Auth::may_use_lease)).
    pub fn may_use_lease(&self, token: Option<&TokenHash>, cmd: &Cmd) -> Result<(), Error> {
        let Some((ns, lease)) = cmd.unwrapped().lease_used() else {
            return Ok(());
        };
        let Some(owner) = self
            .data
            .namespaces
            .get(ns)
            .and_then(|n| n.lease_owner(lease))
        else {
            return Ok(());
        };
        let caller = token.and_then(|t| self.data.auth.token_id(t));
        self.data
            .auth
            .may_use_lease(token, caller, ns, lease, owner)
            .map_err(|denied| as_if_missing(cmd.unwrapped(), denied))
    }

    /// Leases in creation order; `process_id` filters when `Some`.
    pub fn list_leases(
        &self,
        ns: &str,
        kind: LeaseKind,
        process_id: Option<&str>,
        page: &PageRequest,
    ) -> Result<Page<LeaseView>, Error> {
        self.list_leases_visible(ns, kind, process_id, page, |_| true)
    }

    /// [`State::list_leases`] of the leases whose owner `visible` admits, paged among
    /// themselves.
    pub fn list_leases_visible(
        &self,
        ns: &str,
        kind: LeaseKind,
        process_id: Option<&str>,
        page: &PageRequest,
        visible: impl Fn(Option<u64>) -> bool + Copy,
    ) -> Result<Page<LeaseView>, Error> {
        validate::name("namespace_name", ns)?;
        if let Some(process_id) = process_id {
            validate::process_id(process_id)?;
        }
        let namespace = self.namespace(ns)?;
        let (now_ns, times) = (self.data.clock_ns, self.times());
        let alive = move |lease: &Lease| {
            lease.expires_at > now_ns && lease.kind == kind && visible(lease.owner)
        };
        match process_id {
            None => paginate(page, |lo, hi| {
                namespace
                    .leases()
                    .range((lo, hi))
                    .filter(move |(_, l)| alive(l))
                    .map(move |(seq, l)| (*seq, l.view(*seq, times)))
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
                    .leases_by_process()
                    .range((lo, hi))
                    .filter_map(|(_, seq)| Some((*seq, &**namespace.leases().get(seq)?)))
                    .filter(move |(_, l)| l.process_id == process_id && alive(l))
                    .map(move |(seq, l)| (seq, l.view(seq, times)))
            }),
        }
    }

    /// The hold of `lease` on `sem` (a semaphore, or a lock's wait object), if it holds (no
    /// expiry filtering). A lock hold shows weight 1 when exclusive, 0 when shared.
    pub fn holder(&self, ns: &str, sem: &str, lease: &str) -> Option<HolderView> {
        let namespace = self.data.namespaces.get(ns)?;
        let seq = namespace.lease_seq(lease)?;
        if let Some(path) = lock_path(sem) {
            let h = namespace.locks().holder(path, seq)?;
            return Some(HolderView {
                lease_id: namespace.lease_id(seq),
                weight: u64::from(h.exclusive),
                locked_at: h.locked_at,
                metadata: h.metadata.clone(),
                token: h.token,
                ends_at: 0,
                hold_left_ns: 0,
                owner: namespace.leases().get(&seq).and_then(|l| l.owner),
            });
        }
        let sem = namespace.semaphores().get(sem)?;
        let mut view = sem.holder_view(seq, namespace)?;
        if let Some(h) = sem.holders().get(&seq).filter(|h| h.ends_at > 0) {
            view.hold_left_ns = h.hold_left(self.data.clock_ns).max(1);
        }
        Some(view)
    }

    /// The queued acquire of `lease` for `sem` (a semaphore, or a lock's wait object), if
    /// queued (no expiry filtering).
    pub fn waiter(&self, ns: &str, sem: &str, lease: &str) -> Option<WaiterView> {
        let namespace = self.data.namespaces.get(ns)?;
        if let Some(path) = lock_path(sem) {
            let seq = namespace.lease_seq(lease)?;
            let w = namespace.locks().waiter(path, seq)?;
            let ticket = namespace.locks().waiting().get(&(path.to_string(), seq))?;
            let position = namespace.locks().queue().range(..*ticket).count() as u64;
            return Some(WaiterView {
                lease_id: namespace.lease_id(seq),
                weight: u64::from(w.exclusive),
                queued_at: w.queued_at,
                deadline_ns: w.deadline_ns,
                metadata: w.metadata.clone(),
                position,
                owner: namespace.leases().get(&seq).and_then(|l| l.owner),
            });
        }
        let semaphore = namespace.semaphores().get(sem)?;
        let seq = namespace.lease_seq(lease)?;
        let waiter = semaphore.waiters().get(&seq)?;
        let position = semaphore.queue().range(..waiter.ticket).count() as u64;
        Some(waiter_view(seq, namespace, waiter, position))
    }

    /// Namespace `ns`'s quotas and usage.
    pub fn quotas(&self, ns: &str) -> Result<QuotaView, Error> {
        validate::name("namespace_name", ns)?;
        Ok(self.namespace(ns)?.quota_view_with(
            self.data.budget.bytes,
            self.index().bytes(),
            self.data.requests.count(ns),
        ))
    }

    /// Every namespace's quotas and usage, by name (for metrics).
    pub fn all_quotas(&self) -> Vec<QuotaView> {
        let (budget, bytes) = (self.data.budget.bytes, self.index().bytes());
        self.data
            .namespaces
            .map()
            .values()
            .map(|ns| ns.quota_view_with(budget, bytes, self.data.requests.count(ns.name())))
            .collect()
    }

    /// The state's budget on stored bytes, and the stored bytes.
    pub fn budget(&self) -> (u64, u64) {
        (self.data.budget.bytes, self.index().bytes())
    }

    /// The totals over the namespaces `visible` lets through (a token's readable ones).
    pub fn stats_where(&self, mut visible: impl FnMut(&str) -> bool) -> Stats {
        let mut stats = Stats::default();
        for ns in self.data.namespaces.map().values() {
            if !visible(ns.name()) {
                continue;
            }
            stats.namespaces += 1;
            stats.semaphores += ns.semaphores().len() as u64;
            stats.leases += ns.leases().len() as u64;
            for sem in ns.semaphores().values() {
                stats.holders += sem.holders().len() as u64;
                stats.waiters += sem.waiters().len() as u64;
            }
        }
        stats
    }

    pub fn stats(&self) -> Stats {
        Stats {
            namespaces: self.data.namespaces.len() as u64,
            semaphores: self
                .data
                .namespaces
                .map()
                .values()
                .map(|ns| ns.semaphores().len() as u64)
                .sum(),
            leases: self.index().leases(),
            holders: self.index().holders(),
            waiters: self.index().waiters(),
        }
    }
}

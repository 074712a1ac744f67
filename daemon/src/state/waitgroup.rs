//! Wait groups: a counter of jobs and the distinct jobs reported done (Grackle's semantics).
//!
//! Decisions:
//! - A group is ACTIVE until its distinct completed jobs reach `counter` (COMPLETED) or its
//!   deadline passes (EXPIRED); both are final. It finishes in the entry that completes it, or
//!   (expiry) in the reaping before the first command at or after its deadline, and that entry
//!   emits [`Event::Synced`] so every waiting caller looks again.
//! - `expires_at` is the wall-clock time the caller gave. The decision is made on the lease
//!   clock: the group's deadline is the batch's lease clock plus `expires_at` minus the batch's
//!   wall stamp, fixed when set (create, or an update that changes `expires_at`), so no later
//!   step of any wall clock moves it. The view shows `expires_at` as given.
//! - A finished group is deleted `delete_after_finished_seconds` (lease clock) after it
//!   finished, by the same reaping.
//! - Completing a job id already completed counts nothing and keeps its first record
//!   (completed_at, metadata); ids repeated within one call count once. A call that would take
//!   the distinct completed jobs past `counter` is refused whole, as is any completion of a
//!   finished group.
//! - Update is a full replacement of description, counter, expires_at, retention and metadata,
//!   only of an ACTIVE group, with `expected_version` equal to its version; `counter` may not go
//!   below the completed jobs, and lowering it to them completes the group.
//! - Reads decide at the state's lease clock: an ACTIVE group past its deadline shows EXPIRED
//!   (finished at its deadline) before the reaping records it; a finished group past its
//!   deletion is not found.
//!
//! Cost: O(log n + jobs in the call) per command; delete is O(jobs) to free them.

use std::collections::BTreeMap;

use super::data::{Ctx, Job, Namespace, State, WaitGroup};
use super::limits::WAIT_GROUPS_PER_NAMESPACE_MAX;
use super::paging::paginate;
use super::quota;
use super::read::{Times, version_mismatch};
use super::sync_types::*;
use super::types::*;
use super::validate;

pub(super) fn wait_group_not_found(name: &str) -> Error {
    Error::not_found(format!("wait group {name} not found"))
}

/// The lease-clock deadline of wall-clock `expires_at`, as of the batch's two stamps.
fn deadline_of(expires_at: Nanos, ctx: &Ctx) -> Nanos {
    ctx.clock_ns
        .saturating_add(expires_at.saturating_sub(ctx.wall_ns))
}

impl WaitGroup {
    /// The view as a read at `times` shows it (see the module's decisions).
    pub(super) fn view(&self, name: &str, times: Times) -> WaitGroupView {
        let (status, finished_at) =
            if self.status == WaitGroupStatus::Active && self.deadline_ns <= times.clock_ns {
                (WaitGroupStatus::Expired, times.display(self.deadline_ns))
            } else {
                (self.status, self.finished_at)
            };
        WaitGroupView {
            name: name.to_string(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
            counter: self.counter,
            completed_jobs: self.completed(),
            status,
            version: self.version,
            created_at: self.created_at,
            updated_at: self.updated_at,
            expires_at: self.expires_at,
            delete_after_finished_s: self.delete_after_finished_s,
            finished_at,
            last_activity_at: self.last_activity_at,
        }
    }

    /// Whether a read at `clock_ns` shows it (a finished group past its deletion is gone).
    fn visible(&self, clock_ns: Nanos) -> bool {
        !self.status.finished() || self.due_ns() > clock_ns
    }
}

/// Marks the group finished with `status` at lease-clock `at_ns` and tells its waiters.
fn finish(ns: &mut Namespace, name: &str, status: WaitGroupStatus, at_ns: Nanos, ctx: &mut Ctx) {
    let finished_at = ctx.times().display(at_ns);
    ns.change_wait_group(name, ctx, |wg| {
        wg.status = status;
        wg.finished_ns = at_ns;
        wg.finished_at = finished_at;
    });
    synced(ns, name, ctx);
}

fn synced(ns: &Namespace, name: &str, ctx: &mut Ctx) {
    ctx.events.push(Event::Synced {
        ns: ns.name().to_string(),
        kind: SyncKind::WaitGroup,
        name: name.to_string(),
    });
}

impl Namespace {
    pub(super) fn apply_wait_group(&mut self, cmd: &WaitGroupCmd, ctx: &mut Ctx) -> Reply {
        match cmd {
            WaitGroupCmd::Create {
                name,
                description,
                counter,
                expires_at,
                delete_after_finished_s,
                metadata,
                ..
            } => {
                if self.wait_groups().contains_key(name) {
                    return Err(Error::already_exists(format!(
                        "wait group {name} already exists"
                    )));
                }
                if self.wait_groups().len() >= WAIT_GROUPS_PER_NAMESPACE_MAX {
                    return Err(Error::exhausted(format!(
                        "wait group quota reached: at most {WAIT_GROUPS_PER_NAMESPACE_MAX} wait groups per namespace"
                    )));
                }
                let wg = WaitGroup::new(
                    description,
                    metadata,
                    *counter,
                    *expires_at,
                    deadline_of(*expires_at, ctx),
                    *delete_after_finished_s,
                    ctx.wall_ns,
                );
                self.room_for(0, 0, 0, wg.bytes(name), ctx)?;
                self.add_wait_group(name, wg, ctx);
                self.reply_wait_group(name, ctx)
            }
            WaitGroupCmd::Update {
                name,
                description,
                counter,
                expires_at,
                delete_after_finished_s,
                metadata,
                expected_version,
                ..
            } => {
                let wg = self.find_wait_group(name)?;
                if *expected_version != wg.version {
                    return Err(version_mismatch(*expected_version, wg.version));
                }
                if wg.status.finished() {
                    return Err(Error::invalid(format!(
                        "only active wait groups can be updated: wait group {name} is {}",
                        status_name(wg.status)
                    )));
                }
                if *counter < wg.completed() {
                    return Err(Error::invalid(format!(
                        "counter below completed jobs: {counter} < {}",
                        wg.completed()
                    )));
                }
                let grows = quota::object_bytes(&[name, description], metadata)
                    .saturating_sub(quota::object_bytes(&[name, &wg.description], &wg.metadata));
                self.room_for(0, 0, 0, grows, ctx)?;
                let deadline = match *expires_at == wg.expires_at {
                    true => wg.deadline_ns,
                    false => deadline_of(*expires_at, ctx),
                };
                let done = wg.completed() == *counter;
                let wall_ns = ctx.wall_ns;
                self.change_wait_group(name, ctx, |wg| {
                    wg.description = description.clone();
                    wg.metadata = metadata.clone();
                    wg.counter = *counter;
                    wg.expires_at = *expires_at;
                    wg.deadline_ns = deadline;
                    wg.delete_after_finished_s = *delete_after_finished_s;
                    wg.version = wg.version.saturating_add(1);
                    wg.updated_at = wall_ns;
                });
                if done {
                    finish(self, name, WaitGroupStatus::Completed, ctx.clock_ns, ctx);
                }
                self.reply_wait_group(name, ctx)
            }
            WaitGroupCmd::Delete { name, .. } => {
                if self.remove_wait_group(name, ctx).is_some() {
                    synced(self, name, ctx);
                }
                Ok(Outcome::Done)
            }
            WaitGroupCmd::Complete { name, jobs, .. } => {
                let wg = self.find_wait_group(name)?;
                if wg.status.finished() {
                    return Err(Error::invalid(format!(
                        "only active wait groups accept jobs: wait group {name} is {}",
                        status_name(wg.status)
                    )));
                }
                // The first record of each id this group has not seen counts.
                let mut new: BTreeMap<&str, &Metadata> = BTreeMap::new();
                for job in jobs {
                    if !wg.jobs().contains_key(&job.job_id) {
                        new.entry(&job.job_id).or_insert(&job.metadata);
                    }
                }
                let completed = wg.completed().saturating_add(new.len() as u64);
                if completed > wg.counter {
                    return Err(Error::invalid(format!(
                        "too many jobs completed: {completed} would exceed counter {}",
                        wg.counter
                    )));
                }
                let bytes = new
                    .iter()
                    .map(|(id, m)| WaitGroup::job_bytes(id, m))
                    .fold(0u64, u64::saturating_add);
                self.room_for(0, 0, new.len() as u64, bytes, ctx)?;
                let records: Vec<(String, Job)> = new
                    .into_iter()
                    .map(|(id, metadata)| {
                        let job = Job {
                            completed_at: ctx.wall_ns,
                            metadata: metadata.clone(),
                        };
                        (id.to_string(), job)
                    })
                    .collect();
                let counter = wg.counter;
                self.add_jobs(name, records, ctx);
                let wall_ns = ctx.wall_ns;
                self.change_wait_group(name, ctx, |wg| wg.last_activity_at = wall_ns);
                if completed == counter {
                    finish(self, name, WaitGroupStatus::Completed, ctx.clock_ns, ctx);
                }
                self.reply_wait_group(name, ctx)
            }
        }
    }

    fn find_wait_group(&self, name: &str) -> Result<&WaitGroup, Error> {
        self.wait_groups()
            .get(name)
            .ok_or_else(|| wait_group_not_found(name))
    }

    fn reply_wait_group(&self, name: &str, ctx: &Ctx) -> Reply {
        Ok(Outcome::WaitGroup(
            self.find_wait_group(name)?.view(name, ctx.times()),
        ))
    }
}

/// Expires the group `name` if it is ACTIVE and its deadline passed, or deletes it if it is
/// finished and its deletion is due (the reaping; its due entry was taken already).
pub(super) fn reap(ns: &mut Namespace, name: &str, ctx: &mut Ctx) {
    let Some(wg) = ns.wait_groups().get(name) else {
        return;
    };
    match wg.status {
        WaitGroupStatus::Active if wg.deadline_ns <= ctx.clock_ns => {
            let at_ns = wg.deadline_ns;
            finish(ns, name, WaitGroupStatus::Expired, at_ns, ctx);
        }
        WaitGroupStatus::Completed | WaitGroupStatus::Expired if wg.due_ns() <= ctx.clock_ns => {
            ns.remove_wait_group(name, ctx);
            synced(ns, name, ctx);
        }
        _ => {}
    }
}

fn status_name(status: WaitGroupStatus) -> &'static str {
    match status {
        WaitGroupStatus::Active => "active",
        WaitGroupStatus::Completed => "completed",
        WaitGroupStatus::Expired => "expired",
    }
}

impl State {
    fn visible_wait_group<'a>(
        &'a self,
        ns: &str,
        name: &str,
    ) -> Result<(&'a Namespace, &'a WaitGroup), Error> {
        validate::name("namespace_name", ns)?;
        validate::name("wait_group_name", name)?;
        let namespace = self.namespace(ns)?;
        let wg = namespace
            .wait_groups()
            .get(name)
            .filter(|wg| wg.visible(self.clock_ns()))
            .ok_or_else(|| wait_group_not_found(name))?;
        Ok((namespace, wg))
    }

    pub fn get_wait_group(&self, ns: &str, name: &str) -> Result<WaitGroupView, Error> {
        let (_, wg) = self.visible_wait_group(ns, name)?;
        Ok(wg.view(name, self.times()))
    }

    /// Wait groups by name.
    pub fn list_wait_groups(
        &self,
        ns: &str,
        page: &PageRequest,
    ) -> Result<Page<WaitGroupView>, Error> {
        validate::name("namespace_name", ns)?;
        let namespace = self.namespace(ns)?;
        let (clock_ns, times) = (self.clock_ns(), self.times());
        paginate(page, |lo, hi| {
            namespace
                .wait_groups()
                .range((lo, hi))
                .filter(move |(_, wg)| wg.visible(clock_ns))
                .map(move |(name, wg)| (name.clone(), wg.view(name, times)))
        })
    }

    /// A group's completed jobs by job id.
    pub fn list_completed_jobs(
        &self,
        ns: &str,
        name: &str,
        page: &PageRequest,
    ) -> Result<Page<JobView>, Error> {
        let (_, wg) = self.visible_wait_group(ns, name)?;
        paginate(page, |lo, hi| {
            wg.jobs().range((lo, hi)).map(|(id, job)| {
                let view = JobView {
                    job_id: id.clone(),
                    completed_at: job.completed_at,
                    metadata: job.metadata.clone(),
                };
                (id.clone(), view)
            })
        })
    }
}

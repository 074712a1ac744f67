//! The Grackle wait group and barrier calls (16 of `GrackleApi`; `grackle.rs` hands them here).
//!
//! Like the semaphore calls: each write checks the caller's access early (write on the
//! namespace; the state machine checks again where it applies), runs once per
//! `conch-request-id`, and is proposed through the node; each read checks read access and is
//! linearizable. Fields Grackle sends as int64 are refused when negative, naming the field.
//!
//! `WaitForWaitGroup` and `WaitAtBarrier` need read access. Each starts with a linearizable
//! read, then watches its object on this node's applied state (`sync_watch.rs`): the applied
//! entry that completes, expires or deletes the group, or trips or deletes the barrier, wakes
//! every waiter at once, and each reads the object again. Nothing is proposed and nothing polls;
//! the call's own timeout (0-300 s, on this node's monotonic clock) ends it with `TIMED_OUT`.
//! A call with a timeout counts against its principal's waiting calls (`admission.rs`).

use std::sync::Arc;
use std::time::Duration;

use conch_proto::grackle as pb;
use tonic::{Request, Response, Status};

use super::admission::{Principal, Waiting};
use super::auth::Caller;
use super::status::ApiError;
use super::{convert, request_id};
use crate::node::Node;
use crate::state::auth::{Access, Permission};
use crate::state::limits::TIMEOUT_MAX_S;

/// Grackle's bounds on a wait group, checked here, before proposing, as upstream checks them:
/// at most this many jobs...
pub(crate) const WAIT_GROUP_COUNTER_MAX: i64 = 100_000_000;
/// ...and an `expires_at` at least this far ahead of the node's wall clock when the call comes.
/// Only the API checks them: the state machine applies what was proposed, so entries of a log
/// written before (or by a release without these checks) apply exactly as they did.
pub(crate) const WAIT_GROUP_EXPIRY_MIN: Duration = Duration::from_secs(60);

/// The node's wall clock, in nanoseconds since the Unix epoch.
fn wall_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Refuses a wait group of more than [`WAIT_GROUP_COUNTER_MAX`] jobs or one that would expire
/// within [`WAIT_GROUP_EXPIRY_MIN`] of `now_ns`, naming the field (`INVALID_ARGUMENT`).
fn grackle_wait_group_bounds(counter: i64, expires_at: i64, now_ns: i64) -> Result<(), ApiError> {
    if counter > WAIT_GROUP_COUNTER_MAX {
        return Err(
            Error::invalid(format!("counter must be at most {WAIT_GROUP_COUNTER_MAX}")).into(),
        );
    }
    let earliest = now_ns.saturating_add(WAIT_GROUP_EXPIRY_MIN.as_nanos() as i64);
    if expires_at < earliest {
        return Err(Error::invalid(format!(
            "expires_at must be at least {} seconds in the future",
            WAIT_GROUP_EXPIRY_MIN.as_secs()
        ))
        .into());
    }
    Ok(())
}
use crate::state::{
    BarrierCmd, BarrierView, Cmd, Error, JobDone, JobView, Outcome, ParticipantView, State,
    SyncKind, WaitGroupCmd, WaitGroupStatus, WaitGroupView,
};

type Answer<T> = Result<Response<T>, Status>;

pub(crate) struct SyncApi {
    node: Arc<Node>,
    waiting: Arc<Waiting>,
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A count or duration Grackle sends as int64: negative is refused naming `field`.
fn non_negative(field: &str, v: i64) -> Result<u64, ApiError> {
    u64::try_from(v)
        .map_err(|_| ApiError::from(Error::invalid(format!("{field} must not be negative"))))
}

fn timeout(v: i32) -> Result<Duration, ApiError> {
    if !(0..=TIMEOUT_MAX_S).contains(&i64::from(v)) {
        return Err(Error::invalid(format!(
            "timeout_seconds must be between 0 and {TIMEOUT_MAX_S}"
        ))
        .into());
    }
    Ok(Duration::from_secs(u64::try_from(v).unwrap_or(0)))
}

fn unexpected(outcome: Outcome) -> Status {
    ApiError::Internal(format!("unexpected state machine reply: {outcome:?}")).into()
}

pub(crate) fn wait_group(v: WaitGroupView) -> pb::WaitGroup {
    let status = match v.status {
        WaitGroupStatus::Active => pb::WaitGroupStatus::Active,
        WaitGroupStatus::Completed => pb::WaitGroupStatus::Completed,
        WaitGroupStatus::Expired => pb::WaitGroupStatus::Expired,
    };
    pb::WaitGroup {
        name: v.name,
        description: v.description,
        created_at: v.created_at,
        updated_at: v.updated_at,
        version: to_i64(v.version),
        expires_at: v.expires_at,
        counter: to_i64(v.counter),
        completed_jobs: to_i64(v.completed_jobs),
        metadata: v.metadata.into_iter().collect(),
        status: status as i32,
        delete_after_finished_seconds: to_i64(v.delete_after_finished_s),
        finished_at: v.finished_at,
        last_activity_at: v.last_activity_at,
    }
}

fn job(v: JobView) -> pb::WaitGroupJob {
    pb::WaitGroupJob {
        job_id: v.job_id,
        completed_at: v.completed_at,
        metadata: v.metadata.into_iter().collect(),
    }
}

pub(crate) fn barrier(v: BarrierView) -> pb::Barrier {
    pb::Barrier {
        name: v.name,
        description: v.description,
        expected_processes: to_i64(v.expected),
        arrived_processes: to_i64(v.arrived),
        generation: to_i64(v.generation),
        created_at: v.created_at,
        updated_at: v.updated_at,
        version: to_i64(v.version),
        metadata: v.metadata.into_iter().collect(),
        last_activity_at: v.last_activity_at,
        delete_inactive_after_seconds: to_i64(v.delete_inactive_after_s),
    }
}

fn participant(v: ParticipantView) -> pb::BarrierParticipant {
    pb::BarrierParticipant {
        process_id: v.process_id,
        arrived_at: v.arrived_at,
        metadata: v.metadata.into_iter().collect(),
    }
}

/// Who asks for a write and under which request id, and the message.
fn write_request<T>(
    node: &Node,
    request: Request<T>,
) -> Result<(Caller, Option<String>, T), Status> {
    let caller = Caller::of(node, &request);
    let (id, r) = request_id::split(request)?;
    Ok((caller, id, r))
}

impl SyncApi {
    pub(crate) fn new(node: Arc<Node>, waiting: Arc<Waiting>) -> Self {
        SyncApi { node, waiting }
    }

    /// Proposes `cmd` for `caller`, once per request id.
    async fn write(
        &self,
        caller: &Caller,
        id: Option<String>,
        cmd: Cmd,
    ) -> Result<Outcome, ApiError> {
        caller.allow_write(&self.node, &cmd)?;
        let cmd = request_id::wrap(id, caller.sign(cmd));
        cmd.validate()?;
        Ok(self.node.write_one(cmd).await??)
    }

    async fn write_wait_group(
        &self,
        caller: &Caller,
        id: Option<String>,
        cmd: WaitGroupCmd,
    ) -> Result<pb::WaitGroup, Status> {
        match self.write(caller, id, Cmd::WaitGroup(cmd)).await? {
            Outcome::WaitGroup(v) => Ok(wait_group(v)),
            other => Err(unexpected(other)),
        }
    }

    async fn write_barrier(
        &self,
        caller: &Caller,
        id: Option<String>,
        cmd: BarrierCmd,
    ) -> Result<(pb::Barrier, bool), Status> {
        match self.write(caller, id, Cmd::Barrier(cmd)).await? {
            Outcome::Barrier(r) => Ok((barrier(r.barrier), r.tripped)),
            other => Err(unexpected(other)),
        }
    }

    /// The caller of `request`, once it may read `ns`.
    fn reader<T>(&self, request: &Request<T>, ns: &str) -> Result<Caller, ApiError> {
        let caller = Caller::of(&self.node, request);
        caller.allow(&self.node, Access::Namespace(ns, Permission::Read))?;
        Ok(caller)
    }

    /// A linearizable read.
    async fn read<T>(&self, read: impl FnOnce(&State) -> Result<T, Error>) -> Result<T, ApiError> {
        self.node.linearizable().await?;
        Ok(self.node.applied.read(read)?)
    }

    pub(crate) async fn create_wait_group(
        &self,
        request: Request<pb::CreateWaitGroupRequest>,
    ) -> Answer<pb::CreateWaitGroupResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        grackle_wait_group_bounds(r.counter, r.expires_at, wall_now_ns())?;
        let cmd = WaitGroupCmd::Create {
            ns: r.namespace_name,
            name: r.wait_group_name,
            description: r.description,
            counter: non_negative("counter", r.counter)?,
            expires_at: r.expires_at,
            delete_after_finished_s: non_negative(
                "delete_after_finished_seconds",
                r.delete_after_finished_seconds,
            )?,
            metadata: convert::metadata(r.metadata),
        };
        let wg = self.write_wait_group(&caller, id, cmd).await?;
        Ok(Response::new(pb::CreateWaitGroupResponse {
            wait_group: Some(wg),
        }))
    }

    pub(crate) async fn update_wait_group(
        &self,
        request: Request<pb::UpdateWaitGroupRequest>,
    ) -> Answer<pb::UpdateWaitGroupResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        grackle_wait_group_bounds(r.counter, r.expires_at, wall_now_ns())?;
        let cmd = WaitGroupCmd::Update {
            ns: r.namespace_name,
            name: r.wait_group_name,
            description: r.description,
            counter: non_negative("counter", r.counter)?,
            expires_at: r.expires_at,
            delete_after_finished_s: non_negative(
                "delete_after_finished_seconds",
                r.delete_after_finished_seconds,
            )?,
            metadata: convert::metadata(r.metadata),
            expected_version: non_negative("expected_version", r.expected_version)?,
        };
        let wg = self.write_wait_group(&caller, id, cmd).await?;
        Ok(Response::new(pb::UpdateWaitGroupResponse {
            wait_group: Some(wg),
        }))
    }

    pub(crate) async fn delete_wait_group(
        &self,
        request: Request<pb::DeleteWaitGroupRequest>,
    ) -> Answer<pb::DeleteWaitGroupResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        let cmd = WaitGroupCmd::Delete {
            ns: r.namespace_name,
            name: r.wait_group_name,
        };
        self.write(&caller, id, Cmd::WaitGroup(cmd)).await?;
        Ok(Response::new(pb::DeleteWaitGroupResponse {}))
    }

    pub(crate) async fn complete_jobs(
        &self,
        request: Request<pb::CompleteJobsFromWaitGroupRequest>,
    ) -> Answer<pb::CompleteJobsFromWaitGroupResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        let cmd = WaitGroupCmd::Complete {
            ns: r.namespace_name,
            name: r.wait_group_name,
            jobs: r
                .jobs
                .into_iter()
                .map(|j| JobDone {
                    job_id: j.job_id,
                    metadata: convert::metadata(j.metadata),
                })
                .collect(),
        };
        let wg = self.write_wait_group(&caller, id, cmd).await?;
        Ok(Response::new(pb::CompleteJobsFromWaitGroupResponse {
            wait_group: Some(wg),
        }))
    }

    pub(crate) async fn get_wait_group(
        &self,
        request: Request<pb::GetWaitGroupRequest>,
    ) -> Answer<pb::GetWaitGroupResponse> {
        self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let wg = self
            .read(|s| s.get_wait_group(&r.namespace_name, &r.wait_group_name))
            .await?;
        Ok(Response::new(pb::GetWaitGroupResponse {
            wait_group: Some(wait_group(wg)),
        }))
    }

    pub(crate) async fn list_wait_groups(
        &self,
        request: Request<pb::ListWaitGroupsRequest>,
    ) -> Answer<pb::ListWaitGroupsResponse> {
        self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| s.list_wait_groups(&r.namespace_name, &page))
            .await?;
        Ok(Response::new(pb::ListWaitGroupsResponse {
            wait_groups: page.items.into_iter().map(wait_group).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        }))
    }

    pub(crate) async fn list_completed_jobs(
        &self,
        request: Request<pb::ListWaitGroupCompletedJobsRequest>,
    ) -> Answer<pb::ListWaitGroupCompletedJobsResponse> {
        self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| s.list_completed_jobs(&r.namespace_name, &r.wait_group_name, &page))
            .await?;
        Ok(Response::new(pb::ListWaitGroupCompletedJobsResponse {
            jobs: page.items.into_iter().map(job).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        }))
    }

    pub(crate) async fn wait_for_wait_group(
        &self,
        request: Request<pb::WaitForWaitGroupRequest>,
    ) -> Answer<pb::WaitForWaitGroupResponse> {
        let remote = request.remote_addr();
        let caller = self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let timeout = timeout(r.timeout_seconds)?;
        let (ns, name) = (r.namespace_name.as_str(), r.wait_group_name.as_str());
        let _waiting = match timeout.is_zero() {
            true => None,
            false => Some(self.waiting.enter(Principal::new(caller.token(), remote))?),
        };
        let (wg, outcome) = self
            .wait(SyncKind::WaitGroup, ns, name, timeout, |s| {
                let wg = s.get_wait_group(ns, name)?;
                let outcome = match wg.status {
                    WaitGroupStatus::Completed => Some(pb::WaitGroupWaitOutcome::Completed),
                    WaitGroupStatus::Expired => Some(pb::WaitGroupWaitOutcome::Expired),
                    WaitGroupStatus::Active => None,
                };
                Ok((wg, outcome))
            })
            .await?;
        Ok(Response::new(pb::WaitForWaitGroupResponse {
            wait_group: Some(wait_group(wg)),
            outcome: outcome.unwrap_or(pb::WaitGroupWaitOutcome::TimedOut) as i32,
        }))
    }

    /// Reads the object with `look` until it says the wait is over (`Some`), or `timeout`
    /// passes or the node stops (`None`, with the object as last read). Woken only by the
    /// applied entries that concern the object (see the module docs).
    async fn wait<V, O>(
        &self,
        kind: SyncKind,
        ns: &str,
        name: &str,
        timeout: Duration,
        look: impl Fn(&State) -> Result<(V, Option<O>), Error>,
    ) -> Result<(V, Option<O>), ApiError> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.node.linearizable().await?;
        // Watch before reading, so no entry applied between the read and the wait is missed.
        let mut watch = self.node.applied.watch_sync(kind, ns, name);
        loop {
            let (view, done) = self.node.applied.read(&look)?;
            if done.is_some() || tokio::time::Instant::now() >= deadline {
                return Ok((view, done));
            }
            tracing::debug!(
                parked = true,
                ns,
                name,
                kind = kind.as_str(),
                "sync wait parked"
            );
            tokio::select! {
                _ = watch.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                () = self.node.tasks.stopping() => return Ok((view, None)),
            }
        }
    }

    pub(crate) async fn create_barrier(
        &self,
        request: Request<pb::CreateBarrierRequest>,
    ) -> Answer<pb::CreateBarrierResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        let cmd = BarrierCmd::Create {
            ns: r.namespace_name,
            name: r.barrier_name,
            description: r.description,
            expected: non_negative("expected_processes", r.expected_processes)?,
            delete_inactive_after_s: non_negative(
                "delete_inactive_after_seconds",
                r.delete_inactive_after_seconds,
            )?,
            metadata: convert::metadata(r.metadata),
        };
        let (b, _) = self.write_barrier(&caller, id, cmd).await?;
        Ok(Response::new(pb::CreateBarrierResponse {
            barrier: Some(b),
        }))
    }

    pub(crate) async fn update_barrier(
        &self,
        request: Request<pb::UpdateBarrierRequest>,
    ) -> Answer<pb::UpdateBarrierResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        let cmd = BarrierCmd::Update {
            ns: r.namespace_name,
            name: r.barrier_name,
            description: r.description,
            expected: non_negative("expected_processes", r.expected_processes)?,
            delete_inactive_after_s: non_negative(
                "delete_inactive_after_seconds",
                r.delete_inactive_after_seconds,
            )?,
            metadata: convert::metadata(r.metadata),
            expected_version: non_negative("expected_version", r.expected_version)?,
        };
        let (b, _) = self.write_barrier(&caller, id, cmd).await?;
        Ok(Response::new(pb::UpdateBarrierResponse {
            barrier: Some(b),
        }))
    }

    pub(crate) async fn delete_barrier(
        &self,
        request: Request<pb::DeleteBarrierRequest>,
    ) -> Answer<pb::DeleteBarrierResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        let cmd = BarrierCmd::Delete {
            ns: r.namespace_name,
            name: r.barrier_name,
        };
        self.write(&caller, id, Cmd::Barrier(cmd)).await?;
        Ok(Response::new(pb::DeleteBarrierResponse {}))
    }

    pub(crate) async fn arrive_at_barrier(
        &self,
        request: Request<pb::ArriveAtBarrierRequest>,
    ) -> Answer<pb::ArriveAtBarrierResponse> {
        let (caller, id, r) = write_request(&self.node, request)?;
        let cmd = BarrierCmd::Arrive {
            ns: r.namespace_name,
            name: r.barrier_name,
            process_id: r.process_id,
            expected_generation: non_negative("expected_generation", r.expected_generation)?,
            metadata: convert::metadata(r.metadata),
        };
        let (b, tripped) = self.write_barrier(&caller, id, cmd).await?;
        Ok(Response::new(pb::ArriveAtBarrierResponse {
            barrier: Some(b),
            all_arrived: tripped,
        }))
    }

    pub(crate) async fn get_barrier(
        &self,
        request: Request<pb::GetBarrierRequest>,
    ) -> Answer<pb::GetBarrierResponse> {
        self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let b = self
            .read(|s| s.get_barrier(&r.namespace_name, &r.barrier_name))
            .await?;
        Ok(Response::new(pb::GetBarrierResponse {
            barrier: Some(barrier(b)),
        }))
    }

    pub(crate) async fn list_barriers(
        &self,
        request: Request<pb::ListBarriersRequest>,
    ) -> Answer<pb::ListBarriersResponse> {
        self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| s.list_barriers(&r.namespace_name, &page))
            .await?;
        Ok(Response::new(pb::ListBarriersResponse {
            barriers: page.items.into_iter().map(barrier).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        }))
    }

    pub(crate) async fn list_participants(
        &self,
        request: Request<pb::ListBarrierParticipantsRequest>,
    ) -> Answer<pb::ListBarrierParticipantsResponse> {
        self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let generation = non_negative("generation", r.generation)?;
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| s.list_participants(&r.namespace_name, &r.barrier_name, generation, &page))
            .await?;
        Ok(Response::new(pb::ListBarrierParticipantsResponse {
            participants: page.items.into_iter().map(participant).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        }))
    }

    pub(crate) async fn wait_at_barrier(
        &self,
        request: Request<pb::WaitAtBarrierRequest>,
    ) -> Answer<pb::WaitAtBarrierResponse> {
        let remote = request.remote_addr();
        let caller = self.reader(&request, &request.get_ref().namespace_name)?;
        let r = request.into_inner();
        let timeout = timeout(r.timeout_seconds)?;
        let generation = non_negative("expected_generation", r.expected_generation)?;
        if generation == 0 {
            return Err(ApiError::from(Error::invalid(
                "expected_generation must be greater than 0",
            ))
            .into());
        }
        let (ns, name) = (r.namespace_name.as_str(), r.barrier_name.as_str());
        crate::state::validate::name("namespace_name", ns).map_err(ApiError::from)?;
        crate::state::validate::name("barrier_name", name).map_err(ApiError::from)?;
        let _waiting = match timeout.is_zero() {
            true => None,
            false => Some(self.waiting.enter(Principal::new(caller.token(), remote))?),
        };
        let (b, tripped) = self
            .wait(SyncKind::Barrier, ns, name, timeout, |s| {
                let b = s.get_barrier(ns, name)?;
                let tripped = (b.generation > generation).then_some(());
                Ok((b, tripped))
            })
            .await?;
        let outcome = match tripped {
            Some(()) => pb::BarrierWaitOutcome::Tripped,
            None => pb::BarrierWaitOutcome::TimedOut,
        };
        Ok(Response::new(pb::WaitAtBarrierResponse {
            barrier: Some(barrier(b)),
            outcome: outcome as i32,
        }))
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;

    #[test]
    fn grackle_refuses_huge_wait_groups_and_near_expiry() {
        let now = 1_700_000_000_000_000_000;
        let minute = 60_000_000_000;
        assert!(grackle_wait_group_bounds(1, now + minute, now).is_ok());
        assert!(grackle_wait_group_bounds(WAIT_GROUP_COUNTER_MAX, i64::MAX, now).is_ok());
        let too_many = grackle_wait_group_bounds(WAIT_GROUP_COUNTER_MAX + 1, i64::MAX, now);
        assert!(format!("{:?}", too_many.err()).contains("counter"));
        let soon = grackle_wait_group_bounds(1, now + minute - 1, now);
        assert!(format!("{:?}", soon.err()).contains("expires_at"));
        assert!(grackle_wait_group_bounds(1, now - 1, now).is_err());
    }
}

//! The Grackle semaphore API. Each handler validates, builds a command (or a read), runs it
//! through the node and converts the reply; a blocking acquire waits in `wait.rs`.
//!
//! The service and the trait's handlers are here; `grackle/acquire.rs` holds a semaphore
//! acquire's two parts, `grackle/leases.rs` the lease calls both kinds of lease share,
//! `grackle/locks.rs` the lock calls.

use std::sync::Arc;

use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_server::GrackleApi;
use tonic::{Request, Response, Status};

use super::auth::Caller;
use super::status::ApiError;
use super::{convert, request_id};
use crate::node::Node;
use crate::state::auth::{Access, Permission};
use crate::state::{
    Cmd, Error, LeaseKind, NANOS_PER_MS, NANOS_PER_SEC, Nanos, Outcome, State, limits,
};

mod acquire;
mod leases;
mod locks;

use acquire::Started;

pub(crate) struct GrackleService {
    node: Arc<Node>,
    /// Blocking acquires per principal (see `admission.rs`).
    waiting: Arc<super::admission::Waiting>,
}

impl GrackleService {
    pub(crate) fn new(node: Arc<Node>, waiting: Arc<super::admission::Waiting>) -> Self {
        GrackleService { node, waiting }
    }

    /// The wait group and barrier calls (`sync.rs`).
    fn sync(&self) -> super::sync::SyncApi {
        super::sync::SyncApi::new(Arc::clone(&self.node), Arc::clone(&self.waiting))
    }

    /// The request's message, once its caller may `need` on the namespace it names.
    fn permitted<T: InNamespace>(
        &self,
        request: Request<T>,
        need: Permission,
    ) -> Result<T, Status> {
        self.permitted_caller(request, need).map(|(_, r)| r)
    }

    /// [`GrackleService::permitted`], with the caller (for reads that show only what it may see).
    fn permitted_caller<T: InNamespace>(
        &self,
        request: Request<T>,
        need: Permission,
    ) -> Result<(Caller, T), Status> {
        let caller = Caller::of(&self.node, &request);
        let r = request.into_inner();
        caller.allow(&self.node, Access::Namespace(r.namespace(), need))?;
        Ok((caller, r))
    }

    /// A write's caller and request id (the access it needs is checked by [`Write::command`]).
    fn write_request<T>(&self, request: Request<T>) -> Result<(Write, T), Status> {
        let caller = Caller::of(&self.node, &request);
        let (id, r) = request_id::split(request)?;
        Ok((Write { caller, id }, r))
    }

    async fn write(&self, write: Write, cmd: Cmd) -> Result<Outcome, ApiError> {
        let cmd = write.command(&self.node, cmd)?;
        cmd.validate()?;
        Ok(self.node.write_one(cmd).await??)
    }

    async fn read<T>(&self, read: impl FnOnce(&State) -> Result<T, Error>) -> Result<T, ApiError> {
        self.node.linearizable().await?;
        Ok(self.node.applied.read(read)?)
    }

    fn reply<T>(&self, message: T) -> Result<Response<T>, Status> {
        Ok(Response::new(message))
    }
}

/// Who asks for a write and under which request id.
struct Write {
    caller: Caller,
    id: Option<String>,
}

impl Write {
    /// `cmd` as proposed, once the caller may make it here: with the caller's token (the state
    /// machine checks it again where it applies), run once per request id. The access a command
    /// needs is the state's own [`access_of`], so both checks ask the same.
    fn command(self, node: &Node, cmd: Cmd) -> Result<Cmd, ApiError> {
        self.caller.allow_write(node, &cmd)?;
        Ok(request_id::wrap(self.id, self.caller.sign(cmd)))
    }
}

/// A hold limit's remainder in whole milliseconds, rounded down so that a caller stops no later
/// than the server ends the hold; a limited hold never reads as 0 (no limit).
pub(super) fn hold_ms(hold_ns: Nanos) -> u64 {
    match hold_ns {
        0 => 0,
        ns => convert::ms(ns).max(1),
    }
}

/// Wait requested by an acquire, in ns: `timeout_ms` (conch) wins over `timeout_seconds`.
pub(super) fn wait_ns(timeout_ms: u64, timeout_seconds: i32) -> Result<Nanos, Error> {
    if timeout_ms > 0 {
        let max_ms = limits::TIMEOUT_MAX_S as u64 * 1000;
        if timeout_ms > max_ms {
            return Err(Error::invalid(format!("timeout_ms must be 0-{max_ms}")));
        }
        return Ok(timeout_ms as i64 * NANOS_PER_MS);
    }
    let seconds = i64::from(timeout_seconds);
    if !(0..=limits::TIMEOUT_MAX_S).contains(&seconds) {
        return Err(Error::invalid(format!(
            "timeout_seconds must be 0-{}",
            limits::TIMEOUT_MAX_S
        )));
    }
    Ok(seconds * NANOS_PER_SEC)
}

fn unexpected(outcome: Outcome) -> Status {
    ApiError::Internal(format!("unexpected state machine reply: {outcome:?}")).into()
}

#[tonic::async_trait]
impl GrackleApi for GrackleService {
    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().name))]
    async fn create_namespace(
        &self,
        request: Request<pb::CreateNamespaceRequest>,
    ) -> Result<Response<pb::CreateNamespaceResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::CreateNamespace {
            name: r.name,
            description: r.description,
            metadata: convert::metadata(r.metadata),
        };
        match self.write(write, cmd).await? {
            Outcome::Namespace(ns) => self.reply(pb::CreateNamespaceResponse {
                namespace: Some(convert::namespace(ns)),
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn list_namespaces(
        &self,
        request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        let caller = Caller::of(&self.node, &request);
        caller.authenticated(&self.node)?;
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        // With access control on, only the namespaces the caller may read, filtered before
        // paging so that no token names another.
        let page = self
            .read(|s| s.list_namespaces_visible(&page, |ns| caller.may_read_in(s, ns)))
            .await?;
        self.reply(pb::ListNamespacesResponse {
            namespaces: page.items.into_iter().map(convert::namespace).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        })
    }

    async fn get_namespace(
        &self,
        request: Request<pb::GetNamespaceRequest>,
    ) -> Result<Response<pb::GetNamespaceResponse>, Status> {
        let r = self.permitted(request, Permission::Read)?;
        let ns = self.read(|s| s.get_namespace(&r.namespace_name)).await?;
        self.reply(pb::GetNamespaceResponse {
            namespace: Some(convert::namespace(ns)),
        })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name))]
    async fn update_namespace(
        &self,
        request: Request<pb::UpdateNamespaceRequest>,
    ) -> Result<Response<pb::UpdateNamespaceResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::UpdateNamespace {
            name: r.namespace_name,
            description: r.description,
            metadata: convert::metadata(r.metadata),
            expected_version: r.expected_version,
        };
        match self.write(write, cmd).await? {
            Outcome::Namespace(ns) => self.reply(pb::UpdateNamespaceResponse {
                namespace: Some(convert::namespace(ns)),
            }),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name))]
    async fn delete_namespace(
        &self,
        request: Request<pb::DeleteNamespaceRequest>,
    ) -> Result<Response<pb::DeleteNamespaceResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        self.write(
            write,
            Cmd::DeleteNamespace {
                name: r.namespace_name,
            },
        )
        .await?;
        self.reply(pb::DeleteNamespaceResponse {})
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn create_semaphore(
        &self,
        request: Request<pb::CreateSemaphoreRequest>,
    ) -> Result<Response<pb::CreateSemaphoreResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::CreateSemaphore {
            ns: r.namespace_name,
            name: r.semaphore_name,
            description: r.description,
            permits: r.permits,
            metadata: convert::metadata(r.metadata),
            max_hold_ns: convert::ms_to_ns(r.max_hold_ms),
        };
        match self.write(write, cmd).await? {
            Outcome::Semaphore(sem) => self.reply(pb::CreateSemaphoreResponse {
                semaphore: Some(convert::semaphore(sem)),
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn list_semaphores(
        &self,
        request: Request<pb::ListSemaphoresRequest>,
    ) -> Result<Response<pb::ListSemaphoresResponse>, Status> {
        let r = self.permitted(request, Permission::Read)?;
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| s.list_semaphores(&r.namespace_name, &page))
            .await?;
        self.reply(pb::ListSemaphoresResponse {
            semaphores: page.items.into_iter().map(convert::semaphore).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        })
    }

    async fn get_semaphore(
        &self,
        request: Request<pb::GetSemaphoreRequest>,
    ) -> Result<Response<pb::GetSemaphoreResponse>, Status> {
        let r = self.permitted(request, Permission::Read)?;
        let sem = self
            .read(|s| s.get_semaphore(&r.namespace_name, &r.semaphore_name))
            .await?;
        self.reply(pb::GetSemaphoreResponse {
            semaphore: Some(convert::semaphore(sem)),
        })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn acquire_semaphore(
        &self,
        request: Request<pb::AcquireSemaphoreRequest>,
    ) -> Result<Response<pb::AcquireSemaphoreResponse>, Status> {
        // The node's port serves this path by its own route (`acquire_route.rs`, through
        // `acquire_semaphore_owned`); this is the same call for anything that reaches the
        // generated service. Everything up to the acquire's reply runs in a future of its own,
        // freed before the wait, and the wait in another: this body keeps a pointer across each
        // await, as `instrument` keeps room for the body twice.
        let parked = {
            let started = Box::pin(self.start_acquire(request)).await?;
            match started {
                Started::Answered(message) => return self.reply(message),
                Started::Queued(parked) => parked,
            }
        };
        let message = Box::pin(self.finish_wait(parked)).await?;
        self.reply(message)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn release_semaphore(
        &self,
        request: Request<pb::ReleaseSemaphoreRequest>,
    ) -> Result<Response<pb::ReleaseSemaphoreResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::Release {
            ns: r.namespace_name,
            sem: r.semaphore_name,
            lease: r.lease_id,
        };
        match self.write(write, cmd).await? {
            Outcome::Semaphore(sem) => self.reply(pb::ReleaseSemaphoreResponse {
                semaphore: Some(convert::semaphore(sem)),
            }),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn update_semaphore(
        &self,
        request: Request<pb::UpdateSemaphoreRequest>,
    ) -> Result<Response<pb::UpdateSemaphoreResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::UpdateSemaphore {
            ns: r.namespace_name,
            name: r.semaphore_name,
            description: r.description,
            permits: r.permits,
            metadata: convert::metadata(r.metadata),
            expected_version: r.expected_version,
            max_hold_ns: r.max_hold_ms.map(convert::ms_to_ns),
        };
        match self.write(write, cmd).await? {
            Outcome::Semaphore(sem) => self.reply(pb::UpdateSemaphoreResponse {
                semaphore: Some(convert::semaphore(sem)),
            }),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn delete_semaphore(
        &self,
        request: Request<pb::DeleteSemaphoreRequest>,
    ) -> Result<Response<pb::DeleteSemaphoreResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        self.write(
            write,
            Cmd::DeleteSemaphore {
                ns: r.namespace_name,
                name: r.semaphore_name,
            },
        )
        .await?;
        self.reply(pb::DeleteSemaphoreResponse {})
    }

    async fn list_semaphore_holders(
        &self,
        request: Request<pb::ListSemaphoreHoldersRequest>,
    ) -> Result<Response<pb::ListSemaphoreHoldersResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let ns = r.namespace_name.as_str();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| {
                let mut page = s.list_holders(ns, &r.semaphore_name, &page)?;
                for h in &mut page.items {
                    caller.hide_lease_id(s, ns, &mut h.lease_id, h.owner);
                }
                Ok(page)
            })
            .await?;
        self.reply(pb::ListSemaphoreHoldersResponse {
            holders: page.items.into_iter().map(convert::holder).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name))]
    async fn create_semaphore_lease(
        &self,
        request: Request<pb::CreateSemaphoreLeaseRequest>,
    ) -> Result<Response<pb::CreateSemaphoreLeaseResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let lease = self
            .create_lease(
                write,
                LeaseKind::Semaphore,
                r.namespace_name,
                r.process_id,
                r.ttl_seconds,
                r.metadata,
            )
            .await?;
        self.reply(pb::CreateSemaphoreLeaseResponse { lease: Some(lease) })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name))]
    async fn revoke_semaphore_lease(
        &self,
        request: Request<pb::RevokeSemaphoreLeaseRequest>,
    ) -> Result<Response<pb::RevokeSemaphoreLeaseResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::RevokeLease {
            ns: r.namespace_name,
            kind: LeaseKind::Semaphore,
            lease: r.lease_id,
        };
        self.write(write, cmd).await?;
        self.reply(pb::RevokeSemaphoreLeaseResponse {})
    }

    async fn refresh_semaphore_lease(
        &self,
        request: Request<pb::RefreshSemaphoreLeaseRequest>,
    ) -> Result<Response<pb::RefreshSemaphoreLeaseResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let lease = self
            .refresh_lease(
                write,
                LeaseKind::Semaphore,
                r.namespace_name,
                r.lease_id,
                r.ttl_seconds,
            )
            .await?;
        self.reply(pb::RefreshSemaphoreLeaseResponse { lease: Some(lease) })
    }

    async fn list_semaphore_leases(
        &self,
        request: Request<pb::ListSemaphoreLeasesRequest>,
    ) -> Result<Response<pb::ListSemaphoreLeasesResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .list_leases(
                &caller,
                &r.namespace_name,
                LeaseKind::Semaphore,
                &r.process_id,
                &page,
            )
            .await?;
        self.reply(pb::ListSemaphoreLeasesResponse {
            leases: page.items.into_iter().map(convert::lease).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        })
    }

    async fn get_semaphore_lease(
        &self,
        request: Request<pb::GetSemaphoreLeaseRequest>,
    ) -> Result<Response<pb::GetSemaphoreLeaseResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let lease = self
            .get_lease(
                &caller,
                &r.namespace_name,
                LeaseKind::Semaphore,
                &r.lease_id,
            )
            .await?;
        self.reply(pb::GetSemaphoreLeaseResponse { lease: Some(lease) })
    }

    async fn acquire_lock(
        &self,
        request: Request<pb::AcquireLockRequest>,
    ) -> Result<Response<pb::AcquireLockResponse>, Status> {
        self.acquire_lock_call(request).await
    }

    async fn release_lock(
        &self,
        request: Request<pb::ReleaseLockRequest>,
    ) -> Result<Response<pb::ReleaseLockResponse>, Status> {
        self.release_lock_call(request).await
    }

    async fn get_lock(
        &self,
        request: Request<pb::GetLockRequest>,
    ) -> Result<Response<pb::GetLockResponse>, Status> {
        self.get_lock_call(request).await
    }

    async fn delete_lock(
        &self,
        request: Request<pb::DeleteLockRequest>,
    ) -> Result<Response<pb::DeleteLockResponse>, Status> {
        self.delete_lock_call(request).await
    }

    async fn list_locks(
        &self,
        request: Request<pb::ListLocksRequest>,
    ) -> Result<Response<pb::ListLocksResponse>, Status> {
        self.list_locks_call(request).await
    }

    async fn create_lock_lease(
        &self,
        request: Request<pb::CreateLockLeaseRequest>,
    ) -> Result<Response<pb::CreateLockLeaseResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let lease = self
            .create_lease(
                write,
                LeaseKind::Lock,
                r.namespace_name,
                r.process_id,
                r.ttl_seconds,
                r.metadata,
            )
            .await?;
        self.reply(pb::CreateLockLeaseResponse { lease: Some(lease) })
    }

    async fn revoke_lock_lease(
        &self,
        request: Request<pb::RevokeLockLeaseRequest>,
    ) -> Result<Response<pb::RevokeLockLeaseResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::RevokeLease {
            ns: r.namespace_name,
            kind: LeaseKind::Lock,
            lease: r.lease_id,
        };
        self.write(write, cmd).await?;
        self.reply(pb::RevokeLockLeaseResponse {})
    }

    async fn refresh_lock_lease(
        &self,
        request: Request<pb::RefreshLockLeaseRequest>,
    ) -> Result<Response<pb::RefreshLockLeaseResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let lease = self
            .refresh_lease(
                write,
                LeaseKind::Lock,
                r.namespace_name,
                r.lease_id,
                r.ttl_seconds,
            )
            .await?;
        self.reply(pb::RefreshLockLeaseResponse { lease: Some(lease) })
    }

    async fn list_lock_leases(
        &self,
        request: Request<pb::ListLockLeasesRequest>,
    ) -> Result<Response<pb::ListLockLeasesResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .list_leases(
                &caller,
                &r.namespace_name,
                LeaseKind::Lock,
                &r.process_id,
                &page,
            )
            .await?;
        self.reply(pb::ListLockLeasesResponse {
            leases: page.items.into_iter().map(convert::lease).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        })
    }

    async fn get_lock_lease(
        &self,
        request: Request<pb::GetLockLeaseRequest>,
    ) -> Result<Response<pb::GetLockLeaseResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let lease = self
            .get_lease(&caller, &r.namespace_name, LeaseKind::Lock, &r.lease_id)
            .await?;
        self.reply(pb::GetLockLeaseResponse { lease: Some(lease) })
    }
    // Wait groups and barriers: `sync.rs`.
    async fn create_wait_group(
        &self,
        request: Request<pb::CreateWaitGroupRequest>,
    ) -> Result<Response<pb::CreateWaitGroupResponse>, Status> {
        self.sync().create_wait_group(request).await
    }

    async fn update_wait_group(
        &self,
        request: Request<pb::UpdateWaitGroupRequest>,
    ) -> Result<Response<pb::UpdateWaitGroupResponse>, Status> {
        self.sync().update_wait_group(request).await
    }

    async fn list_wait_groups(
        &self,
        request: Request<pb::ListWaitGroupsRequest>,
    ) -> Result<Response<pb::ListWaitGroupsResponse>, Status> {
        self.sync().list_wait_groups(request).await
    }

    async fn get_wait_group(
        &self,
        request: Request<pb::GetWaitGroupRequest>,
    ) -> Result<Response<pb::GetWaitGroupResponse>, Status> {
        self.sync().get_wait_group(request).await
    }

    async fn delete_wait_group(
        &self,
        request: Request<pb::DeleteWaitGroupRequest>,
    ) -> Result<Response<pb::DeleteWaitGroupResponse>, Status> {
        self.sync().delete_wait_group(request).await
    }

    async fn complete_jobs_from_wait_group(
        &self,
        request: Request<pb::CompleteJobsFromWaitGroupRequest>,
    ) -> Result<Response<pb::CompleteJobsFromWaitGroupResponse>, Status> {
        self.sync().complete_jobs(request).await
    }

    async fn list_wait_group_completed_jobs(
        &self,
        request: Request<pb::ListWaitGroupCompletedJobsRequest>,
    ) -> Result<Response<pb::ListWaitGroupCompletedJobsResponse>, Status> {
        self.sync().list_completed_jobs(request).await
    }

    async fn wait_for_wait_group(
        &self,
        request: Request<pb::WaitForWaitGroupRequest>,
    ) -> Result<Response<pb::WaitForWaitGroupResponse>, Status> {
        self.sync().wait_for_wait_group(request).await
    }

    async fn create_barrier(
        &self,
        request: Request<pb::CreateBarrierRequest>,
    ) -> Result<Response<pb::CreateBarrierResponse>, Status> {
        self.sync().create_barrier(request).await
    }

    async fn list_barriers(
        &self,
        request: Request<pb::ListBarriersRequest>,
    ) -> Result<Response<pb::ListBarriersResponse>, Status> {
        self.sync().list_barriers(request).await
    }

    async fn get_barrier(
        &self,
        request: Request<pb::GetBarrierRequest>,
    ) -> Result<Response<pb::GetBarrierResponse>, Status> {
        self.sync().get_barrier(request).await
    }

    async fn delete_barrier(
        &self,
        request: Request<pb::DeleteBarrierRequest>,
    ) -> Result<Response<pb::DeleteBarrierResponse>, Status> {
        self.sync().delete_barrier(request).await
    }

    async fn update_barrier(
        &self,
        request: Request<pb::UpdateBarrierRequest>,
    ) -> Result<Response<pb::UpdateBarrierResponse>, Status> {
        self.sync().update_barrier(request).await
    }

    async fn arrive_at_barrier(
        &self,
        request: Request<pb::ArriveAtBarrierRequest>,
    ) -> Result<Response<pb::ArriveAtBarrierResponse>, Status> {
        self.sync().arrive_at_barrier(request).await
    }

    async fn wait_at_barrier(
        &self,
        request: Request<pb::WaitAtBarrierRequest>,
    ) -> Result<Response<pb::WaitAtBarrierResponse>, Status> {
        self.sync().wait_at_barrier(request).await
    }

    async fn list_barrier_participants(
        &self,
        request: Request<pb::ListBarrierParticipantsRequest>,
    ) -> Result<Response<pb::ListBarrierParticipantsResponse>, Status> {
        self.sync().list_participants(request).await
    }
}

/// A request about one namespace, whose permission the caller needs.
trait InNamespace {
    fn namespace(&self) -> &str;
}

macro_rules! in_namespace {
    ($($request:ty),* $(,)?) => {
        $(impl InNamespace for $request {
            fn namespace(&self) -> &str {
                &self.namespace_name
            }
        })*
    };
}

in_namespace!(
    pb::GetNamespaceRequest,
    pb::UpdateNamespaceRequest,
    pb::DeleteNamespaceRequest,
    pb::CreateSemaphoreRequest,
    pb::ListSemaphoresRequest,
    pb::GetSemaphoreRequest,
    pb::AcquireSemaphoreRequest,
    pb::ReleaseSemaphoreRequest,
    pb::UpdateSemaphoreRequest,
    pb::DeleteSemaphoreRequest,
    pb::ListSemaphoreHoldersRequest,
    pb::CreateSemaphoreLeaseRequest,
    pb::RevokeSemaphoreLeaseRequest,
    pb::RefreshSemaphoreLeaseRequest,
    pb::ListSemaphoreLeasesRequest,
    pb::GetSemaphoreLeaseRequest,
    pb::AcquireLockRequest,
    pb::ReleaseLockRequest,
    pb::GetLockRequest,
    pb::DeleteLockRequest,
    pb::ListLocksRequest,
    pb::CreateLockLeaseRequest,
    pb::RevokeLockLeaseRequest,
    pb::RefreshLockLeaseRequest,
    pb::ListLockLeasesRequest,
    pb::GetLockLeaseRequest,
);

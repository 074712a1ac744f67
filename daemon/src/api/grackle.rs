//! The Grackle semaphore API. Each handler validates, builds a command (or a read), runs it
//! through the node and converts the reply.

use std::sync::Arc;
use std::time::Duration;

use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_server::GrackleApi;
use tonic::{Request, Response, Status};

use super::{convert, respond, status};
use crate::applied::{WaitEvent, WaitKey, WaitOutcome, WaitTicket};
use crate::node::{Node, now_ns};
use crate::state::{
    AcquireStatus, Cmd, Error, GiveUpReply, NANOS_PER_MS, NANOS_PER_SEC, Nanos, Outcome, State,
    WaitEnd, limits,
};

/// How long after its deadline a waiting call gives up on its own if the leader's clock has not
/// timed the waiter out (e.g. no leader).
const WAIT_GRACE: Duration = Duration::from_millis(500);

/// How long the waiter of a call that went away (cancelled, connection broken) keeps its place,
/// so a client that re-attaches through another connection does not lose its queue position.
const ABANDONED_WAIT_LINGER_NS: Nanos = 5 * NANOS_PER_SEC;

pub struct GrackleService {
    node: Arc<Node>,
}

impl GrackleService {
    pub fn new(node: Arc<Node>) -> Self {
        GrackleService { node }
    }

    async fn write(&self, cmd: Cmd) -> Result<Outcome, Status> {
        cmd.validate().map_err(status::from_state)?;
        let reply = self.node.write_one(cmd).await.map_err(status::from_node)?;
        reply.map_err(status::from_state)
    }

    async fn read<T>(
        &self,
        read: impl FnOnce(&State, Nanos) -> Result<T, Error>,
    ) -> Result<T, Status> {
        self.node.linearizable().await.map_err(status::from_node)?;
        self.node
            .applied
            .read(|state| read(state, now_ns()))
            .map_err(status::from_state)
    }

    fn reply<T>(&self, message: T) -> Result<Response<T>, Status> {
        Ok(respond(&self.node, message))
    }

    /// Waits for a queued acquire to end. The applied state is the truth; events only wake us.
    ///
    /// `index` is the log index of the acquire that queued: until this node has applied it, its
    /// state knows nothing of the waiter, so it is not read before then. A node that cannot catch
    /// up before the deadline asks the log instead (GiveUp answers whether the grant came first).
    async fn wait_for_grant(
        &self,
        key: WaitKey,
        mut ticket: WaitTicket,
        deadline_ns: Nanos,
        index: u64,
    ) -> Result<pb::AcquireSemaphoreResponse, Status> {
        let mut give_up = GiveUpOnDrop {
            node: Arc::clone(&self.node),
            key: Some(key.clone()),
            deadline_ns,
        };
        let remaining =
            Duration::from_nanos(u64::try_from(deadline_ns.saturating_sub(now_ns())).unwrap_or(0));
        let local_deadline = tokio::time::Instant::now() + remaining + WAIT_GRACE;
        let caught_up =
            tokio::time::timeout_at(local_deadline, self.node.applied.wait_applied(index)).await;
        if caught_up.is_err() {
            give_up.disarm();
            return self.give_up_now(&key, deadline_ns).await;
        }
        // Events from before this acquire's entry concern an earlier wait of the same lease.
        let mut last = None;
        let note = |event: WaitEvent, last: &mut Option<WaitOutcome>| {
            if event.index >= index || event.outcome == WaitOutcome::Recheck {
                *last = Some(event.outcome);
            }
        };
        loop {
            let queued = self
                .node
                .applied
                .read(|s| s.waiter(&key.ns, &key.sem, &key.lease).is_some());
            // Every event up to the state just read is already in the ticket.
            while let Some(event) = ticket.try_next() {
                note(event, &mut last);
            }
            if !queued {
                give_up.disarm();
                return self.ended(&key, last);
            }
            tokio::select! {
                event = ticket.next() => match event {
                    Some(event) => note(event, &mut last),
                    None => {
                        give_up.disarm();
                        return self.give_up_now(&key, deadline_ns).await;
                    }
                },
                _ = tokio::time::sleep_until(local_deadline) => {
                    give_up.disarm();
                    return self.give_up_now(&key, deadline_ns).await;
                }
            }
        }
    }

    /// Ends this call's wait through the log: the answer says whether the grant came first.
    async fn give_up_now(
        &self,
        key: &WaitKey,
        deadline_ns: Nanos,
    ) -> Result<pb::AcquireSemaphoreResponse, Status> {
        let cmd = Cmd::GiveUp {
            ns: key.ns.clone(),
            sem: key.sem.clone(),
            lease: key.lease.clone(),
            deadline_ns,
            linger_ns: 0,
        };
        match self.write(cmd).await? {
            Outcome::GiveUp(GiveUpReply::Granted { token }) => {
                self.acquire_response(key, Some(token))
            }
            _ => self.acquire_response(key, None),
        }
    }

    /// Answers a wait that left the queue, according to how it ended.
    fn ended(
        &self,
        key: &WaitKey,
        last: Option<WaitOutcome>,
    ) -> Result<pb::AcquireSemaphoreResponse, Status> {
        match last {
            Some(WaitOutcome::Granted { token, .. }) => self.acquire_response(key, Some(token)),
            Some(WaitOutcome::Ended(WaitEnd::LeaseGone)) => Err(Status::not_found(format!(
                "lease {} expired or was revoked while waiting for semaphore {}",
                key.lease, key.sem
            ))),
            Some(WaitOutcome::Ended(WaitEnd::SemaphoreGone)) => Err(Status::not_found(format!(
                "semaphore {} was deleted while waiting",
                key.sem
            ))),
            Some(WaitOutcome::Ended(WaitEnd::TimedOut | WaitEnd::GaveUp)) => {
                self.acquire_response(key, None)
            }
            // No event seen (state replaced by a snapshot): the holder table decides.
            Some(WaitOutcome::Recheck) | None => {
                let token = self
                    .node
                    .applied
                    .read(|s| s.holder(&key.ns, &key.sem, &key.lease))
                    .map(|h| h.token);
                self.acquire_response(key, token)
            }
        }
    }

    fn acquire_response(
        &self,
        key: &WaitKey,
        token: Option<u64>,
    ) -> Result<pb::AcquireSemaphoreResponse, Status> {
        let semaphore = self
            .node
            .applied
            .read(|s| s.get_semaphore(&key.ns, &key.sem, now_ns()))
            .map_err(status::from_state)?;
        let outcome = if token.is_some() {
            pb::AcquireOutcome::Acquired
        } else {
            pb::AcquireOutcome::TimedOut
        };
        Ok(acquire_message(
            convert::semaphore(semaphore),
            outcome,
            token.unwrap_or(0),
        ))
    }
}

fn acquire_message(
    semaphore: pb::Semaphore,
    outcome: pb::AcquireOutcome,
    token: u64,
) -> pb::AcquireSemaphoreResponse {
    pb::AcquireSemaphoreResponse {
        semaphore: Some(semaphore),
        success: outcome == pb::AcquireOutcome::Acquired,
        outcome: outcome as i32,
        fencing_token: token,
    }
}

/// Gives up a wait when the waiting call goes away (client cancelled or disconnected): the
/// waiter lingers briefly in case the client re-attaches, then leaves the queue.
struct GiveUpOnDrop {
    node: Arc<Node>,
    key: Option<WaitKey>,
    deadline_ns: Nanos,
}

impl GiveUpOnDrop {
    fn disarm(&mut self) {
        self.key = None;
    }
}

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let node = Arc::clone(&self.node);
        let cmd = Cmd::GiveUp {
            ns: key.ns,
            sem: key.sem,
            lease: key.lease,
            deadline_ns: self.deadline_ns,
            linger_ns: ABANDONED_WAIT_LINGER_NS,
        };
        tokio::spawn(async move {
            if let Err(e) = node.write_one(cmd).await {
                tracing::warn!(error = %e, "give up an abandoned wait");
            }
        });
    }
}

/// Wait requested by an acquire, in ns: `timeout_ms` (conch) wins over `timeout_seconds`.
fn wait_ns(request: &pb::AcquireSemaphoreRequest) -> Result<Nanos, Status> {
    if request.timeout_ms > 0 {
        let max_ms = limits::TIMEOUT_MAX_S as u64 * 1000;
        if request.timeout_ms > max_ms {
            return Err(Status::invalid_argument(format!(
                "timeout_ms must be 0-{max_ms}"
            )));
        }
        return Ok(request.timeout_ms as i64 * NANOS_PER_MS);
    }
    let seconds = i64::from(request.timeout_seconds);
    if !(0..=limits::TIMEOUT_MAX_S).contains(&seconds) {
        return Err(Status::invalid_argument(format!(
            "timeout_seconds must be 0-{}",
            limits::TIMEOUT_MAX_S
        )));
    }
    Ok(seconds * NANOS_PER_SEC)
}

fn unexpected(outcome: Outcome) -> Status {
    Status::internal(format!("unexpected state machine reply: {outcome:?}"))
}

#[tonic::async_trait]
impl GrackleApi for GrackleService {
    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().name))]
    async fn create_namespace(
        &self,
        request: Request<pb::CreateNamespaceRequest>,
    ) -> Result<Response<pb::CreateNamespaceResponse>, Status> {
        let r = request.into_inner();
        let cmd = Cmd::CreateNamespace {
            name: r.name,
            description: r.description,
            metadata: convert::metadata(r.metadata),
        };
        match self.write(cmd).await? {
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
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self.read(|s, _| s.list_namespaces(&page)).await?;
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
        let r = request.into_inner();
        let ns = self.read(|s, _| s.get_namespace(&r.namespace_name)).await?;
        self.reply(pb::GetNamespaceResponse {
            namespace: Some(convert::namespace(ns)),
        })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name))]
    async fn update_namespace(
        &self,
        request: Request<pb::UpdateNamespaceRequest>,
    ) -> Result<Response<pb::UpdateNamespaceResponse>, Status> {
        let r = request.into_inner();
        let cmd = Cmd::UpdateNamespace {
            name: r.namespace_name,
            description: r.description,
            metadata: convert::metadata(r.metadata),
            expected_version: r.expected_version,
        };
        match self.write(cmd).await? {
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
        let r = request.into_inner();
        self.write(Cmd::DeleteNamespace {
            name: r.namespace_name,
        })
        .await?;
        self.reply(pb::DeleteNamespaceResponse {})
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn create_semaphore(
        &self,
        request: Request<pb::CreateSemaphoreRequest>,
    ) -> Result<Response<pb::CreateSemaphoreResponse>, Status> {
        let r = request.into_inner();
        let cmd = Cmd::CreateSemaphore {
            ns: r.namespace_name,
            name: r.semaphore_name,
            description: r.description,
            permits: r.permits,
            metadata: convert::metadata(r.metadata),
        };
        match self.write(cmd).await? {
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
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s, now| s.list_semaphores(&r.namespace_name, &page, now))
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
        let r = request.into_inner();
        let sem = self
            .read(|s, now| s.get_semaphore(&r.namespace_name, &r.semaphore_name, now))
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
        let r = request.into_inner();
        let wait_ns = wait_ns(&r)?;
        let key = WaitKey {
            ns: r.namespace_name,
            sem: r.semaphore_name,
            lease: r.lease_id,
        };
        let cmd = Cmd::Acquire {
            ns: key.ns.clone(),
            sem: key.sem.clone(),
            lease: key.lease.clone(),
            weight: r.weight,
            wait_ns,
            metadata: convert::metadata(r.metadata),
        };
        cmd.validate().map_err(status::from_state)?;
        // Register before proposing, so the grant cannot slip past us.
        let ticket = (wait_ns > 0).then(|| self.node.applied.register_wait(key.clone()));
        let (reply, index) = self
            .node
            .write_one_at(cmd)
            .await
            .map_err(status::from_node)?;
        let reply = match reply.map_err(status::from_state)? {
            Outcome::Acquire(reply) => reply,
            other => return Err(unexpected(other)),
        };
        let semaphore = convert::semaphore(reply.semaphore);
        let message = match (reply.status, ticket) {
            (AcquireStatus::Acquired { token }, _) => {
                acquire_message(semaphore, pb::AcquireOutcome::Acquired, token)
            }
            (AcquireStatus::Queued { deadline_ns }, Some(ticket)) => {
                self.wait_for_grant(key, ticket, deadline_ns, index).await?
            }
            (AcquireStatus::Unavailable | AcquireStatus::Queued { .. }, _) => {
                acquire_message(semaphore, pb::AcquireOutcome::Unavailable, 0)
            }
        };
        self.reply(message)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name, sem = %request.get_ref().semaphore_name))]
    async fn release_semaphore(
        &self,
        request: Request<pb::ReleaseSemaphoreRequest>,
    ) -> Result<Response<pb::ReleaseSemaphoreResponse>, Status> {
        let r = request.into_inner();
        let cmd = Cmd::Release {
            ns: r.namespace_name,
            sem: r.semaphore_name,
            lease: r.lease_id,
        };
        match self.write(cmd).await? {
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
        let r = request.into_inner();
        let cmd = Cmd::UpdateSemaphore {
            ns: r.namespace_name,
            name: r.semaphore_name,
            description: r.description,
            permits: r.permits,
            metadata: convert::metadata(r.metadata),
            expected_version: r.expected_version,
        };
        match self.write(cmd).await? {
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
        let r = request.into_inner();
        self.write(Cmd::DeleteSemaphore {
            ns: r.namespace_name,
            name: r.semaphore_name,
        })
        .await?;
        self.reply(pb::DeleteSemaphoreResponse {})
    }

    async fn list_semaphore_holders(
        &self,
        request: Request<pb::ListSemaphoreHoldersRequest>,
    ) -> Result<Response<pb::ListSemaphoreHoldersResponse>, Status> {
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s, now| s.list_holders(&r.namespace_name, &r.semaphore_name, &page, now))
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
        let r = request.into_inner();
        let cmd = Cmd::CreateLease {
            ns: r.namespace_name,
            process_id: r.process_id,
            ttl_s: r.ttl_seconds,
            metadata: convert::metadata(r.metadata),
        };
        match self.write(cmd).await? {
            Outcome::Lease(lease) => self.reply(pb::CreateSemaphoreLeaseResponse {
                lease: Some(convert::lease(lease)),
            }),
            other => Err(unexpected(other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(ns = %request.get_ref().namespace_name))]
    async fn revoke_semaphore_lease(
        &self,
        request: Request<pb::RevokeSemaphoreLeaseRequest>,
    ) -> Result<Response<pb::RevokeSemaphoreLeaseResponse>, Status> {
        let r = request.into_inner();
        self.write(Cmd::RevokeLease {
            ns: r.namespace_name,
            lease: r.lease_id,
        })
        .await?;
        self.reply(pb::RevokeSemaphoreLeaseResponse {})
    }

    async fn refresh_semaphore_lease(
        &self,
        request: Request<pb::RefreshSemaphoreLeaseRequest>,
    ) -> Result<Response<pb::RefreshSemaphoreLeaseResponse>, Status> {
        let r = request.into_inner();
        let cmd = Cmd::RefreshLease {
            ns: r.namespace_name,
            lease: r.lease_id,
            ttl_s: r.ttl_seconds,
        };
        match self.write(cmd).await? {
            Outcome::Lease(lease) => self.reply(pb::RefreshSemaphoreLeaseResponse {
                lease: Some(convert::lease(lease)),
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn list_semaphore_leases(
        &self,
        request: Request<pb::ListSemaphoreLeasesRequest>,
    ) -> Result<Response<pb::ListSemaphoreLeasesResponse>, Status> {
        let r = request.into_inner();
        let page = convert::page(r.pagination_token, r.limit);
        let process_id = (!r.process_id.is_empty()).then_some(r.process_id.as_str());
        let page = self
            .read(|s, now| s.list_leases(&r.namespace_name, process_id, &page, now))
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
        let r = request.into_inner();
        let lease = self
            .read(|s, now| s.get_lease(&r.namespace_name, &r.lease_id, now))
            .await?;
        self.reply(pb::GetSemaphoreLeaseResponse {
            lease: Some(convert::lease(lease)),
        })
    }
}

//! A semaphore acquire, in two parts: up to its reply (answered at once, or queued and parked),
//! then the wait of a parked call; and the answer either part gives.

use std::future::Future;
use std::sync::Arc;

use conch_proto::grackle as pb;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{GrackleService, hold_ms, unexpected, wait_ns};
use crate::api::convert;
use crate::api::status::ApiError;
use crate::callers::waiters::WaitKey;
use crate::jobs::wait;
use crate::state::{AcquireStatus, Cmd, Nanos, Outcome};

impl GrackleService {
    /// `AcquireSemaphore` as its own route serves it (`acquire_route.rs`): the same call as the
    /// trait's, as a future that owns what it needs, so the route keeps it inline rather than in
    /// a box of its own. The request moves into the boxed start at once: the future never keeps
    /// room for it while the call waits.
    pub(in crate::api) fn acquire_semaphore_owned(
        self: Arc<Self>,
        request: Request<pb::AcquireSemaphoreRequest>,
    ) -> impl Future<Output = Result<Response<pb::AcquireSemaphoreResponse>, Status>> + Send + 'static
    {
        let span = tracing::debug_span!(
            "acquire_semaphore",
            ns = %request.get_ref().namespace_name,
            sem = %request.get_ref().semaphore_name
        );
        let this = Arc::clone(&self);
        let start = Box::pin(async move { this.start_acquire(request).await });
        async move {
            let parked = match start.await? {
                Started::Answered(message) => return Ok(Response::new(message)),
                Started::Queued(parked) => parked,
            };
            let message = self.finish_wait(parked).await?;
            Ok(Response::new(message))
        }
        .instrument(span)
    }

    /// An acquire up to its reply: answered at once, or queued and parked for its wait.
    pub(super) async fn start_acquire(
        &self,
        request: Request<pb::AcquireSemaphoreRequest>,
    ) -> Result<Started, Status> {
        let remote = request.remote_addr();
        let (write, r) = self.write_request(request)?;
        let wait_ns = wait_ns(r.timeout_ms, r.timeout_seconds).map_err(ApiError::from)?;
        // A call that may wait counts against its principal's waiting calls until it ends;
        // one past the limit is refused before anything is proposed.
        let waiting = match wait_ns > 0 {
            true => Some(self.waiting.enter(crate::api::admission::Principal::new(
                write.caller.token(),
                remote,
            ))?),
            false => None,
        };
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
            max_hold_ns: convert::ms_to_ns(r.max_hold_ms),
        };
        let cmd = write.command(&self.node, cmd)?;
        cmd.validate().map_err(ApiError::from)?;
        // Register before proposing, so the grant cannot slip past us.
        let ticket = (wait_ns > 0).then(|| self.node.applied.register_wait(key));
        let (reply, index) = self.node.write_one_at(cmd).await.map_err(ApiError::from)?;
        let reply = match reply.map_err(ApiError::from)? {
            Outcome::Acquire(reply) => reply,
            other => return Err(unexpected(other)),
        };
        Ok(match (reply.status, ticket, waiting) {
            (AcquireStatus::Acquired { token, hold_ns }, _, _) => {
                Started::Answered(acquire_message(
                    convert::semaphore(reply.semaphore),
                    pb::AcquireOutcome::Acquired,
                    (token, hold_ns),
                ))
            }
            (AcquireStatus::Queued { deadline_ns }, Some(ticket), Some(waiting)) => {
                Started::Queued(Parked {
                    ticket,
                    deadline_ns,
                    index,
                    _waiting: waiting,
                })
            }
            (AcquireStatus::Unavailable | AcquireStatus::Queued { .. }, _, _) => {
                Started::Answered(acquire_message(
                    convert::semaphore(reply.semaphore),
                    pb::AcquireOutcome::Unavailable,
                    (0, 0),
                ))
            }
        })
    }

    /// Waits for a parked acquire to end and answers it. `parked` is the only room this future
    /// keeps for the wait's ticket and permit: the wait borrows them rather than taking copies.
    pub(super) async fn finish_wait(
        &self,
        mut parked: Parked,
    ) -> Result<pb::AcquireSemaphoreResponse, ApiError> {
        let granted = wait::wait_for_grant(
            &self.node,
            &mut parked.ticket,
            parked.deadline_ns,
            parked.index,
        )
        .await
        .map_err(ApiError::from)?;
        self.acquire_response(parked.ticket.key(), granted)
    }

    pub(super) fn acquire_response(
        &self,
        key: &WaitKey,
        granted: Option<wait::Granted>,
    ) -> Result<pb::AcquireSemaphoreResponse, ApiError> {
        let semaphore = self
            .node
            .applied
            .read(|s| s.get_semaphore(&key.ns, &key.sem))?;
        let outcome = if granted.is_some() {
            pb::AcquireOutcome::Acquired
        } else {
            pb::AcquireOutcome::TimedOut
        };
        Ok(acquire_message(
            convert::semaphore(semaphore),
            outcome,
            granted.map_or((0, 0), |g| (g.token, g.hold_ns)),
        ))
    }
}

/// How an acquire's first part ended.
pub(super) enum Started {
    Answered(pb::AcquireSemaphoreResponse),
    Queued(Parked),
}

/// A blocking acquire that queued: all a call keeps while it waits. Its waiter's names live
/// once, in the registry, shared with `ticket`.
pub(super) struct Parked {
    ticket: crate::callers::waiters::WaitTicket,
    deadline_ns: Nanos,
    index: u64,
    /// Counts against the principal's waiting calls until the call ends.
    _waiting: crate::api::admission::WaitPermit,
}

/// An acquire's answer; `(token, hold_ns)` of the grant, `(0, 0)` when not acquired.
pub(super) fn acquire_message(
    semaphore: pb::Semaphore,
    outcome: pb::AcquireOutcome,
    (token, hold_ns): (u64, Nanos),
) -> pb::AcquireSemaphoreResponse {
    pb::AcquireSemaphoreResponse {
        semaphore: Some(semaphore),
        outcome: outcome as i32,
        fencing_token: token,
        hold_ms: hold_ms(hold_ns),
    }
}

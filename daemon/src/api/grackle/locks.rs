//! The Grackle lock calls (the lease calls are shared with the semaphores'). A blocking acquire
//! waits in `wait.rs` like a semaphore's, under the lock's wait object.

use conch_proto::grackle as pb;
use tonic::{Request, Response, Status};

use super::{GrackleService, unexpected, wait_ns};
use crate::api::admission::{Principal, WaitPermit};
use crate::api::auth::Caller;
use crate::api::convert;
use crate::api::status::ApiError;
use crate::callers::waiters::{WaitKey, WaitTicket};
use crate::jobs::wait;
use crate::state::auth::Permission;
use crate::state::{AcquireLockReply, AcquireStatus, Cmd, Contention, Nanos, Outcome, lock_object};

/// How a lock acquire's first part ended.
enum LockStarted {
    Answered(pb::AcquireLockResponse),
    Queued(Box<ParkedLock>),
}

/// A blocking lock acquire that queued: all a call keeps while it waits.
struct ParkedLock {
    ticket: WaitTicket,
    deadline_ns: Nanos,
    index: u64,
    /// Counts against the principal's waiting calls until the call ends.
    _waiting: WaitPermit,
    caller: Caller,
    path: String,
    /// The reply that queued it: the contention reported if the wait runs out.
    queued: AcquireLockReply,
}

impl GrackleService {
    pub(super) async fn acquire_lock_call(
        &self,
        request: Request<pb::AcquireLockRequest>,
    ) -> Result<Response<pb::AcquireLockResponse>, Status> {
        // As for a semaphore: everything up to the acquire's reply runs in a future of its own,
        // freed before the wait, so a waiting call keeps only its parked wait.
        let parked = {
            let started = Box::pin(self.start_lock(request)).await?;
            match started {
                LockStarted::Answered(message) => return self.reply(message),
                LockStarted::Queued(parked) => parked,
            }
        };
        let message = Box::pin(self.finish_lock_wait(*parked)).await?;
        self.reply(message)
    }

    /// A lock acquire up to its reply: answered at once, or queued and parked for its wait.
    async fn start_lock(
        &self,
        request: Request<pb::AcquireLockRequest>,
    ) -> Result<LockStarted, Status> {
        let remote = request.remote_addr();
        let (write, r) = self.write_request(request)?;
        let caller = write.caller.clone();
        let ns = r.namespace_name.clone();
        let wait_ns = wait_ns(r.timeout_ms, r.timeout_seconds).map_err(ApiError::from)?;
        let waiting = match wait_ns > 0 {
            true => Some(
                self.waiting
                    .enter(Principal::new(write.caller.token(), remote))?,
            ),
            false => None,
        };
        let key = WaitKey {
            ns: r.namespace_name.clone(),
            sem: lock_object(&r.lock_name),
            lease: r.lease_id.clone(),
        };
        let cmd = Cmd::AcquireLock {
            ns: r.namespace_name,
            path: r.lock_name.clone(),
            lease: r.lease_id,
            exclusive: r.exclusive,
            wait_ns,
            metadata: convert::metadata(r.metadata),
        };
        let cmd = write.command(&self.node, cmd)?;
        cmd.validate().map_err(ApiError::from)?;
        // Register before proposing, so the grant cannot slip past us.
        let ticket = (wait_ns > 0).then(|| self.node.applied.register_wait(key));
        let (reply, index) = self.node.write_one_at(cmd).await.map_err(ApiError::from)?;
        let mut reply = match reply.map_err(ApiError::from)? {
            Outcome::AcquireLock(reply) => reply,
            other => return Err(unexpected(other)),
        };
        self.hide_lease_ids(&caller, &ns, &mut reply);
        Ok(match (reply.status, ticket, waiting) {
            (AcquireStatus::Acquired { .. }, _, _) => {
                LockStarted::Answered(convert::acquire_lock(reply))
            }
            (AcquireStatus::Queued { deadline_ns }, Some(ticket), Some(waiting)) => {
                LockStarted::Queued(Box::new(ParkedLock {
                    ticket,
                    deadline_ns,
                    index,
                    _waiting: waiting,
                    caller,
                    path: r.lock_name,
                    queued: reply,
                }))
            }
            (AcquireStatus::Unavailable | AcquireStatus::Queued { .. }, _, _) => {
                LockStarted::Answered(convert::acquire_lock(AcquireLockReply {
                    status: AcquireStatus::Unavailable,
                    ..reply
                }))
            }
        })
    }

    /// Waits for a parked lock acquire to end and answers it.
    async fn finish_lock_wait(
        &self,
        parked: ParkedLock,
    ) -> Result<pb::AcquireLockResponse, ApiError> {
        let ParkedLock {
            mut ticket,
            deadline_ns,
            index,
            _waiting,
            caller,
            path,
            queued,
        } = parked;
        let key = std::sync::Arc::clone(ticket.key());
        let granted = wait::wait_for_grant(&self.node, &mut ticket, deadline_ns, index).await?;
        let token = granted.map(|g| g.token);
        let mut answer = self.answer_wait(&key, &path, token, queued)?;
        self.hide_lease_ids(&caller, &key.ns, &mut answer);
        Ok(convert::acquire_lock(answer))
    }

    /// The answer to an acquire that waited: the lock as this node has it now; when the wait
    /// timed out, the contention as the acquire first found it.
    fn answer_wait(
        &self,
        key: &WaitKey,
        path: &str,
        token: Option<u64>,
        queued: AcquireLockReply,
    ) -> Result<AcquireLockReply, ApiError> {
        let lock = self.node.applied.read(|s| s.get_lock(&key.ns, path))?;
        Ok(match token {
            Some(token) => AcquireLockReply {
                status: AcquireStatus::Acquired { token, hold_ns: 0 },
                lock,
                reason: Contention::None,
                blocking: Vec::new(),
            },
            // Still queued as far as the reply goes: the wait ran out.
            None => AcquireLockReply { lock, ..queued },
        })
    }

    /// Clears the lease ids of holders the caller may not see (other tokens' leases, unless it
    /// has admin on the namespace).
    fn hide_lease_ids(&self, caller: &Caller, ns: &str, reply: &mut AcquireLockReply) {
        self.node.applied.read(|s| {
            let locks = std::iter::once(&mut reply.lock).chain(reply.blocking.iter_mut());
            for h in locks.flat_map(|l| l.holders.iter_mut()) {
                caller.hide_lease_id(s, ns, &mut h.lease_id, h.owner);
            }
        });
    }

    pub(super) async fn release_lock_call(
        &self,
        request: Request<pb::ReleaseLockRequest>,
    ) -> Result<Response<pb::ReleaseLockResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::ReleaseLock {
            ns: r.namespace_name,
            path: r.lock_name,
            lease: r.lease_id,
        };
        match self.write(write, cmd).await? {
            Outcome::Lock(lock) => self.reply(pb::ReleaseLockResponse {
                lock: Some(convert::lock(lock)),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub(super) async fn get_lock_call(
        &self,
        request: Request<pb::GetLockRequest>,
    ) -> Result<Response<pb::GetLockResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let ns = r.namespace_name.as_str();
        let lock = self
            .read(|s| {
                let mut lock = s.get_lock(ns, &r.lock_name)?;
                for h in &mut lock.holders {
                    caller.hide_lease_id(s, ns, &mut h.lease_id, h.owner);
                }
                Ok(lock)
            })
            .await?;
        self.reply(pb::GetLockResponse {
            lock: Some(convert::lock(lock)),
        })
    }

    pub(super) async fn delete_lock_call(
        &self,
        request: Request<pb::DeleteLockRequest>,
    ) -> Result<Response<pb::DeleteLockResponse>, Status> {
        let (write, r) = self.write_request(request)?;
        let cmd = Cmd::DeleteLock {
            ns: r.namespace_name,
            path: r.lock_name,
        };
        self.write(write, cmd).await?;
        self.reply(pb::DeleteLockResponse {})
    }

    pub(super) async fn list_locks_call(
        &self,
        request: Request<pb::ListLocksRequest>,
    ) -> Result<Response<pb::ListLocksResponse>, Status> {
        let (caller, r) = self.permitted_caller(request, Permission::Read)?;
        let ns = r.namespace_name.as_str();
        let page = convert::page(r.pagination_token, r.limit);
        let page = self
            .read(|s| {
                let mut page = s.list_locks(ns, &page)?;
                for h in page.items.iter_mut().flat_map(|l| l.holders.iter_mut()) {
                    caller.hide_lease_id(s, ns, &mut h.lease_id, h.owner);
                }
                Ok(page)
            })
            .await?;
        self.reply(pb::ListLocksResponse {
            locks: page.items.into_iter().map(convert::lock).collect(),
            next_pagination_token: page.next_token,
            previous_pagination_token: page.previous_token,
        })
    }
}

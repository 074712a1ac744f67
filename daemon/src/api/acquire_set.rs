//! `conch.v1.ConchApi/AcquireSemaphores`: the all-or-none acquire of several semaphores
//! (`state/set.rs`), with AcquireSemaphore's admission, access check, request ids, forwarding
//! and blocking wait.

use std::sync::Arc;

use conch_proto::conch as cpb;
use conch_proto::grackle as pb;
use tonic::{Request, Response, Status};

use super::auth::Caller;
use super::grackle::{hold_ms, wait_ns};
use super::status::ApiError;
use super::{convert, request_id};
use crate::callers::waiters::WaitKey;
use crate::jobs::wait;
use crate::node::Node;
use crate::state::{AcquireSetStatus, Cmd, Nanos, Outcome, SetMember};

pub(crate) async fn acquire_semaphores(
    node: &Arc<Node>,
    waiting: &Arc<super::admission::Waiting>,
    request: Request<cpb::AcquireSemaphoresRequest>,
) -> Result<Response<cpb::AcquireSemaphoresResponse>, Status> {
    let remote = request.remote_addr();
    let caller = Caller::of(node, &request);
    let (id, r) = request_id::split(request)?;
    let wait_ns = wait_ns(r.timeout_ms, 0).map_err(ApiError::from)?;
    // A call that may wait counts against its principal's waiting calls until it ends.
    let _waiting = match wait_ns > 0 {
        true => Some(waiting.enter(super::admission::Principal::new(caller.token(), remote))?),
        false => None,
    };
    let members: Vec<SetMember> = r
        .semaphores
        .into_iter()
        .map(|m| SetMember {
            sem: m.semaphore_name,
            weight: m.weight,
        })
        .collect();
    let keys: Vec<WaitKey> = members
        .iter()
        .map(|m| WaitKey {
            ns: r.namespace_name.clone(),
            sem: m.sem.clone(),
            lease: r.lease_id.clone(),
        })
        .collect();
    let names: Vec<String> = members.iter().map(|m| m.sem.clone()).collect();
    let cmd = Cmd::AcquireSet {
        ns: r.namespace_name,
        lease: r.lease_id,
        members,
        wait_ns,
        metadata: convert::metadata(r.metadata),
        max_hold_ns: convert::ms_to_ns(r.max_hold_ms),
    };
    caller.allow_write(node, &cmd)?;
    let cmd = request_id::wrap(id, caller.sign(cmd));
    cmd.validate().map_err(ApiError::from)?;
    // Register every member before proposing, so no grant can slip past.
    let tickets: Vec<_> = match wait_ns > 0 {
        true => keys
            .iter()
            .map(|key| node.applied.register_wait(key.clone()))
            .collect(),
        false => Vec::new(),
    };
    let (reply, index) = Box::pin(node.write_one_at(cmd))
        .await
        .map_err(ApiError::from)?;
    let status = match reply.map_err(ApiError::from)? {
        Outcome::AcquireSet(reply) => reply.status,
        other => {
            return Err(
                ApiError::Internal(format!("unexpected state machine reply: {other:?}")).into(),
            );
        }
    };
    let grants: Option<Vec<(u64, Nanos)>> = match status {
        AcquireSetStatus::Acquired { grants } => {
            Some(grants.iter().map(|g| (g.token, g.hold_ns)).collect())
        }
        AcquireSetStatus::Queued { deadline_ns } if !tickets.is_empty() => {
            let granted = wait::wait_for_set_grant(node, &keys, tickets, deadline_ns, index)
                .await
                .map_err(ApiError::from)?;
            match granted {
                Some(grants) => Some(grants.iter().map(|g| (g.token, g.hold_ns)).collect()),
                None => {
                    return Ok(Response::new(cpb::AcquireSemaphoresResponse {
                        outcome: pb::AcquireOutcome::TimedOut as i32,
                        grants: Vec::new(),
                    }));
                }
            }
        }
        AcquireSetStatus::Unavailable | AcquireSetStatus::Queued { .. } => None,
    };
    Ok(Response::new(match grants {
        Some(grants) => cpb::AcquireSemaphoresResponse {
            outcome: pb::AcquireOutcome::Acquired as i32,
            grants: names
                .into_iter()
                .zip(grants)
                .map(|(semaphore_name, (token, hold_ns))| cpb::SetGrant {
                    semaphore_name,
                    fencing_token: token,
                    hold_ms: hold_ms(hold_ns),
                })
                .collect(),
        },
        None => cpb::AcquireSemaphoresResponse {
            outcome: pb::AcquireOutcome::Unavailable as i32,
            grants: Vec::new(),
        },
    }))
}

//! The one mapping from conch errors to gRPC status codes (Grackle's conventions). Handlers
//! return [`ApiError`] (or an error that converts into it); only [`ApiError`]'s conversion below
//! builds a [`Status`].
//!
//! | error | code |
//! | --- | --- |
//! | a request field out of range, an unknown member, a refused command | `INVALID_ARGUMENT` |
//! | an absent namespace, semaphore or lease (also expired, or gone while waiting) | `NOT_FOUND` |
//! | a duplicate | `ALREADY_EXISTS` |
//! | a quota | `RESOURCE_EXHAUSTED` |
//! | no leader reachable in time, a leader change mid-call, shutting down | `UNAVAILABLE` |
//! | Raft refused a membership, leadership or snapshot change | `FAILED_PRECONDITION` |
//! | a snapshot that did not complete in time | `DEADLINE_EXCEEDED` |
//! | a peer message that does not decode | `INVALID_ARGUMENT` |
//! | a bug (unexpected reply, encoding failure) | `INTERNAL` |
//! | a peer call without a node certificate, with peer mutual TLS on | `PERMISSION_DENIED` |
//! | a peer call from another cluster (another cluster id, or none) | `FAILED_PRECONDITION` |
//! | access control is on and the call has no token, or an unknown or revoked one | `UNAUTHENTICATED` |
//! | the token's role lacks the permission (the message names namespace and permission) | `PERMISSION_DENIED` |
//! | an access control change the state refuses (enable without an admin token, …) | `FAILED_PRECONDITION` |
//! | a new learner's address that does not answer as an empty node or one of this cluster | `FAILED_PRECONDITION` |
//! | a call in a form the server does not take (a compressed message) | `UNIMPLEMENTED` |
//! | a unary call without its message | `INTERNAL` (as tonic's generated servers answer) |
//!
//! An admin call forwarded to another node (the leader, or a leadership transfer's target)
//! answers with that node's status, unchanged.

use tonic::{Code, Status};

use crate::base::error::NodeError;
use crate::jobs::wait::WaitError;
use crate::state::{Error, ErrorKind};

/// Why a call failed, before it becomes a [`Status`].
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Refused by the state machine, or by the same checks made before proposing.
    #[error(transparent)]
    State(#[from] Error),
    /// The write or read path could not serve the call (no leader, shutting down, a bug).
    #[error(transparent)]
    Node(#[from] NodeError),
    /// Raft refused an admin operation (`action` names it).
    #[error("{action}: {message}")]
    Raft {
        action: &'static str,
        message: String,
    },
    /// An admin operation did not complete within its bound.
    #[error("{0}")]
    Timeout(String),
    /// Bytes from a peer that do not decode.
    #[error("malformed peer message: {0}")]
    MalformedPeerMessage(String),
    /// Something that cannot happen unless this build has a bug.
    #[error("{0}")]
    Internal(String),
    /// The answer of the node an admin call was forwarded to (the leader, or the target of a
    /// leadership transfer), passed on unchanged.
    #[error("{}", .0.message())]
    Forwarded(Status),
    /// A peer call on a connection that did not present a node certificate.
    #[error("{0}")]
    PeerRefused(String),
    /// A peer call from another cluster.
    #[error("{0}")]
    ClusterMismatch(String),
    /// Access control: no token, or an unknown or revoked one.
    #[error("{0}")]
    Unauthenticated(String),
    /// Access control: a known token whose role lacks the permission (the message names the
    /// namespace and the permission).
    #[error("{0}")]
    PermissionDenied(String),
    /// A new learner's address did not answer as a conch node that is empty or of this cluster
    /// (the message says what answered, if anything).
    #[error("{0}")]
    NotJoinable(String),
    /// A call in a form this server does not take (a compressed message); the message says
    /// which, as tonic's generated server says it.
    #[error("{0}")]
    Unsupported(String),
    /// A unary call whose body held no message (answered as tonic's generated server does).
    #[error("Missing request message.")]
    MissingMessage,
}

impl From<crate::state::auth::Denied> for ApiError {
    fn from(denied: crate::state::auth::Denied) -> Self {
        use crate::state::auth::Denied;
        match denied {
            Denied::Unauthenticated(message) => ApiError::Unauthenticated(message),
            Denied::PermissionDenied(message) => ApiError::PermissionDenied(message),
        }
    }
}

impl From<WaitError> for ApiError {
    fn from(error: WaitError) -> Self {
        match error {
            WaitError::State(error) => ApiError::State(error),
            WaitError::Node(error) => ApiError::Node(error),
        }
    }
}

impl ApiError {
    pub fn raft(action: &'static str, error: impl std::fmt::Display) -> Self {
        ApiError::Raft {
            action,
            message: error.to_string(),
        }
    }
}

impl From<ApiError> for Status {
    fn from(error: ApiError) -> Status {
        match error {
            ApiError::State(error) => from_state(error),
            ApiError::Node(error) => from_node(error),
            error @ ApiError::Raft { .. } => Status::failed_precondition(error.to_string()),
            ApiError::Timeout(message) => Status::deadline_exceeded(message),
            error @ ApiError::MalformedPeerMessage(_) => {
                Status::invalid_argument(error.to_string())
            }
            ApiError::Internal(message) => internal(message),
            ApiError::Forwarded(status) => status,
            ApiError::PeerRefused(message) => Status::permission_denied(message),
            ApiError::ClusterMismatch(message) => Status::failed_precondition(message),
            ApiError::Unauthenticated(message) => Status::unauthenticated(message),
            ApiError::PermissionDenied(message) => Status::permission_denied(message),
            ApiError::NotJoinable(message) => Status::failed_precondition(message),
            ApiError::Unsupported(message) => Status::unimplemented(message),
            // Not `internal`: the caller sent nothing, no bug of this node's to log.
            error @ ApiError::MissingMessage => Status::internal(error.to_string()),
        }
    }
}

fn from_state(error: Error) -> Status {
    let code = match error.kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::Unauthenticated => Code::Unauthenticated,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
    };
    Status::new(code, error.message)
}

fn from_node(error: NodeError) -> Status {
    match error {
        NodeError::Unavailable(message) => Status::unavailable(message),
        NodeError::NotLeader { node } => Status::unavailable(format!(
            "node {node} {}",
            crate::base::error::NOT_LEADER_SUFFIX
        )),
        NodeError::Internal(message) => internal(message),
        NodeError::StorageFailed(message) => Status::unavailable(message),
    }
}

fn internal(message: String) -> Status {
    tracing::error!(error = %message, "internal error");
    Status::internal(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(error: impl Into<ApiError>) -> (Code, String) {
        let status = Status::from(error.into());
        (status.code(), status.message().to_string())
    }

    #[test]
    fn state_errors_map_to_grackle_codes() {
        assert_eq!(
            status(Error::invalid("weight exceeds semaphore permits")).0,
            Code::InvalidArgument
        );
        assert_eq!(
            status(Error::not_found("lease x not found")).0,
            Code::NotFound
        );
        assert_eq!(
            status(Error::already_exists("namespace a exists")).0,
            Code::AlreadyExists
        );
        assert_eq!(
            status(Error::exhausted("too many waiters")).0,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn node_and_admin_errors_map_to_their_codes() {
        assert_eq!(
            status(NodeError::Unavailable("no leader".into())),
            (Code::Unavailable, "no leader".into())
        );
        assert_eq!(
            status(NodeError::NotLeader { node: 2 }),
            (Code::Unavailable, "node 2 is not the leader; retry".into())
        );
        assert_eq!(status(NodeError::Internal("bug".into())).0, Code::Internal);
        assert_eq!(
            status(NodeError::StorageFailed("node 2 stopped: disk full".into())),
            (Code::Unavailable, "node 2 stopped: disk full".into())
        );
        assert_eq!(
            status(ApiError::raft("change membership", "learner lagging")),
            (
                Code::FailedPrecondition,
                "change membership: learner lagging".into()
            )
        );
        assert_eq!(
            status(ApiError::Timeout("snapshot slow".into())).0,
            Code::DeadlineExceeded
        );
        assert_eq!(
            status(ApiError::MalformedPeerMessage("eof".into())),
            (Code::InvalidArgument, "malformed peer message: eof".into())
        );
        assert_eq!(status(ApiError::Internal("bug".into())).0, Code::Internal);
        assert_eq!(
            status(ApiError::Unauthenticated("unknown or revoked token".into())).0,
            Code::Unauthenticated
        );
        assert_eq!(
            status(ApiError::PermissionDenied(
                "lacks write on namespace a".into()
            ))
            .0,
            Code::PermissionDenied
        );
        let leader = Status::failed_precondition("from the leader");
        assert_eq!(
            status(ApiError::Forwarded(leader)),
            (Code::FailedPrecondition, "from the leader".into())
        );
        assert_eq!(
            status(ApiError::PeerRefused("no node certificate".into())).0,
            Code::PermissionDenied
        );
        assert_eq!(
            status(ApiError::ClusterMismatch("cluster a, not b".into())).0,
            Code::FailedPrecondition
        );
        assert_eq!(
            status(ApiError::NotJoinable("nothing answered".into())).0,
            Code::FailedPrecondition
        );
        assert_eq!(
            status(ApiError::Unsupported("compressed".into())),
            (Code::Unimplemented, "compressed".into())
        );
        assert_eq!(
            status(ApiError::MissingMessage),
            (Code::Internal, "Missing request message.".into())
        );
    }
}

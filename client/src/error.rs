//! The one error type of the client library.
//!
//! Every variant names the operation that failed (`"get semaphore"`, `"refresh lease"`, ...), so
//! `Display` alone makes a useful one-line message. gRPC statuses are mapped by [`Error::from_status`]
//! following conch's status table: absent things are `NotFound`, duplicates `AlreadyExists`, bad
//! input `InvalidArgument`, a request the cluster's present state does not allow
//! `FailedPrecondition`, quotas `ResourceExhausted`; `Unavailable` is only returned after every
//! endpoint was tried.

use std::time::Duration;

use tonic::{Code, Status};

/// Result alias of the client library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`Lease`](crate::Lease) is no longer held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLoss {
    /// The server no longer knows the lease (it expired, was revoked, or its namespace was
    /// deleted).
    NotFound {
        /// The server's message.
        message: String,
    },
    /// No refresh succeeded for `since`, which is the lease's TTL minus a safety margin: the
    /// server may expire the lease soon, so the client gives it up first.
    NoRefresh {
        /// Time since the last successful refresh was sent.
        since: Duration,
        /// The last refresh error, if any refresh was attempted.
        last_error: Option<String>,
    },
}

impl std::fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseLoss::NotFound { message } => {
                write!(f, "the server no longer knows it ({message})")
            }
            LeaseLoss::NoRefresh { since, last_error } => {
                write!(
                    f,
                    "no refresh succeeded for {}",
                    crate::duration::format_duration(*since)
                )?;
                if let Some(e) = last_error {
                    write!(f, " (last error: {e})")?;
                }
                Ok(())
            }
        }
    }
}

/// Errors of the client library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint answered (transport errors, or every node said `Unavailable`) before the
    /// retry budget ran out.
    #[error("{op}: no conch node answered (tried {}): {last}", .endpoints.join(", "))]
    Unavailable {
        /// The operation.
        op: &'static str,
        /// The endpoints that were tried.
        endpoints: Vec<String>,
        /// The last error seen.
        last: String,
    },
    /// The namespace, semaphore or lease does not exist (or the lease expired).
    #[error("{op}: not found: {message}")]
    NotFound {
        /// The operation.
        op: &'static str,
        /// The server's message.
        message: String,
    },
    /// The request was rejected as invalid; the message names the field.
    #[error("{op}: invalid argument: {message}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// The server's (or the client's own validation) message.
        message: String,
    },
    /// The request is valid, but the cluster's present state does not allow it (a learner
    /// address that is not an empty node or one of this cluster, a leadership transfer that did
    /// not happen, access control that cannot be turned on yet); the message says why.
    #[error("{op}: failed precondition: {message}")]
    FailedPrecondition {
        /// The operation.
        op: &'static str,
        /// The server's message.
        message: String,
    },
    /// The thing to create exists already.
    #[error("{op}: already exists: {message}")]
    AlreadyExists {
        /// The operation.
        op: &'static str,
        /// The server's message.
        message: String,
    },
    /// A quota was hit (waiters per semaphore, leases per namespace, ...).
    #[error("{op}: resource exhausted: {message}")]
    ResourceExhausted {
        /// The operation.
        op: &'static str,
        /// The server's message.
        message: String,
    },
    /// The call did not finish within its deadline.
    #[error("{op}: no answer within {}", crate::duration::format_duration(*.timeout))]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// The lease the operation depends on was lost.
    #[error("{op}: lease {lease_id} lost: {reason}")]
    LeaseLost {
        /// The operation.
        op: &'static str,
        /// The lost lease.
        lease_id: String,
        /// Why it was lost.
        reason: LeaseLoss,
    },
    /// An endpoint could not be parsed.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server answered something the client cannot use (e.g. a required field missing).
    #[error("{op}: unexpected reply: {message}")]
    Protocol {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        message: String,
    },
    /// Any other gRPC status (e.g. `Internal`).
    #[error("{op}: {} ({:?})", .status.message(), .status.code())]
    Other {
        /// The operation.
        op: &'static str,
        /// The status as received.
        status: Box<Status>,
    },
    /// TLS settings that cannot be used (an unreadable or invalid file, a certificate without
    /// its key); the message names the option and the file.
    #[error("TLS settings: {what}")]
    InvalidTls {
        /// What is wrong.
        what: String,
    },
    /// A token (`CONCH_TOKEN`, `--token-file`, `CONCH_TOKEN_FILE`) that cannot be sent.
    #[error("invalid token: {reason}")]
    InvalidToken {
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// Maps a gRPC status answered by a server for `op`.
    pub fn from_status(op: &'static str, status: Status) -> Error {
        let message = status.message().to_string();
        match status.code() {
            Code::NotFound => Error::NotFound { op, message },
            Code::InvalidArgument | Code::OutOfRange => Error::InvalidArgument { op, message },
            Code::FailedPrecondition => Error::FailedPrecondition { op, message },
            Code::AlreadyExists => Error::AlreadyExists { op, message },
            Code::ResourceExhausted => Error::ResourceExhausted { op, message },
            _ => Error::Other {
                op,
                status: Box::new(status),
            },
        }
    }

    /// The gRPC code this error stands for, if it came from (or stands for) a status.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Unavailable { .. } => Some(Code::Unavailable),
            Error::NotFound { .. } => Some(Code::NotFound),
            Error::InvalidArgument { .. } => Some(Code::InvalidArgument),
            Error::FailedPrecondition { .. } => Some(Code::FailedPrecondition),
            Error::AlreadyExists { .. } => Some(Code::AlreadyExists),
            Error::ResourceExhausted { .. } => Some(Code::ResourceExhausted),
            Error::Timeout { .. } => Some(Code::DeadlineExceeded),
            Error::Other { status, .. } => Some(status.code()),
            Error::InvalidToken { .. } => None,
            Error::LeaseLost { .. }
            | Error::InvalidEndpoint { .. }
            | Error::Protocol { .. }
            | Error::InvalidTls { .. } => None,
        }
    }

    /// `true` for [`Error::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// `true` for [`Error::AlreadyExists`].
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::AlreadyExists { .. })
    }

    /// `true` when no node could be reached or none could serve the call
    /// ([`Error::Unavailable`] or [`Error::Timeout`]).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Timeout { .. })
    }

    /// `true` for [`Error::LeaseLost`].
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }
}

/// How the call machinery treats a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The endpoint could not be reached or the connection broke: try another endpoint and
    /// avoid this one for a moment.
    Transport,
    /// The node answered but cannot serve now (no leader, shutting down): try another
    /// endpoint (the leader hint first).
    NodeUnavailable,
    /// A definite answer: return it.
    Final,
}

/// Classifies a status returned by an attempt.
///
/// tonic attaches a `source` to statuses it makes itself from transport failures (connect
/// errors, broken HTTP/2 streams); statuses sent by a server carry none.
pub(crate) fn classify(status: &Status) -> Class {
    let local = std::error::Error::source(status).is_some();
    match status.code() {
        Code::Unavailable if local => Class::Transport,
        Code::Unavailable => Class::NodeUnavailable,
        Code::Unknown | Code::Cancelled | Code::Internal if local => Class::Transport,
        _ => Class::Final,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_variants_naming_the_operation() {
        let e = Error::from_status("get semaphore", Status::not_found("semaphore x"));
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "get semaphore: not found: semaphore x");

        let e = Error::from_status(
            "acquire",
            Status::invalid_argument("weight exceeds permits"),
        );
        assert!(matches!(e, Error::InvalidArgument { .. }));
        assert_eq!(e.code(), Some(Code::InvalidArgument));

        let e = Error::from_status(
            "add learner",
            Status::failed_precondition("it is a node of another cluster"),
        );
        assert_eq!(e.code(), Some(Code::FailedPrecondition));
        assert_eq!(
            e.to_string(),
            "add learner: failed precondition: it is a node of another cluster"
        );

        let e = Error::from_status("create namespace", Status::already_exists("conch"));
        assert!(e.is_already_exists());

        let e = Error::from_status("acquire", Status::resource_exhausted("too many waiters"));
        assert!(matches!(e, Error::ResourceExhausted { .. }));

        let e = Error::from_status("get lease", Status::internal("disk on fire"));
        assert_eq!(e.code(), Some(Code::Internal));
        assert_eq!(e.to_string(), "get lease: disk on fire (Internal)");
    }

    #[test]
    fn unavailable_lists_the_endpoints() {
        let e = Error::Unavailable {
            op: "get semaphore",
            endpoints: vec!["a:1".into(), "b:2".into()],
            last: "connection refused".into(),
        };
        assert_eq!(
            e.to_string(),
            "get semaphore: no conch node answered (tried a:1, b:2): connection refused"
        );
        assert!(e.is_unavailable());
    }

    #[test]
    fn server_statuses_and_transport_failures_are_told_apart() {
        assert_eq!(
            classify(&Status::unavailable("no leader")),
            Class::NodeUnavailable
        );
        assert_eq!(classify(&Status::not_found("x")), Class::Final);
        assert_eq!(classify(&Status::internal("x")), Class::Final);

        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let mut local = Status::unavailable("tcp connect error");
        local.set_source(std::sync::Arc::new(io));
        assert_eq!(classify(&local), Class::Transport);

        let io = std::io::Error::other("stream reset");
        let mut local = Status::unknown("h2 protocol error");
        local.set_source(std::sync::Arc::new(io));
        assert_eq!(classify(&local), Class::Transport);
    }

    #[test]
    fn lease_loss_reads_well() {
        let l = LeaseLoss::NoRefresh {
            since: Duration::from_secs(8),
            last_error: Some("refresh lease: no answer within 2s".into()),
        };
        assert_eq!(
            l.to_string(),
            "no refresh succeeded for 8s (last error: refresh lease: no answer within 2s)"
        );
    }
}

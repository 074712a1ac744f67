//! What a failed call to the leader means for its caller: tried again through whichever node
//! leads next (`NodeError::NotLeader`) when the leader certainly did not take it, reported
//! otherwise, saying whether the outcome is unknown.

use super::LeaderInfo;
use super::forward_stream::ForwardFailure;
use crate::base::error::NodeError;

/// A failed forward of a write to the leader. It is tried again (through whichever node leads
/// next) only when the leader certainly did not take it: it answered that it is not the
/// leader, or no connection to it was ever made. A connection lost after the request went out
/// (the leader killed right after committing, a connection reset) leaves the outcome unknown:
/// the write may be committed, and sending it again would apply it twice.
pub(super) fn forward_failure(status: &tonic::Status, leader: &LeaderInfo) -> NodeError {
    let refused = std::error::Error::source(status).is_none()
        && status
            .message()
            .ends_with(crate::base::error::NOT_LEADER_SUFFIX);
    if status.code() == tonic::Code::Unavailable && (refused || never_connected(status)) {
        return NodeError::NotLeader { node: leader.id };
    }
    NodeError::Unavailable(format!(
        "forward to leader {} at {}: {}; the outcome is unknown",
        leader.id,
        leader.addr,
        status.message()
    ))
}

/// A forward that got no answer over the stream. A batch that never went out (no stream could
/// be opened) is tried again when the failure may pass (the leader unreachable, stepping down,
/// or not answering the opening in time), and is reported as it is otherwise (a refusal):
/// either way nothing was sent. A batch that went out and got no answer has an unknown
/// outcome, as after a unary call whose connection was lost (see [`forward_failure`]).
pub(super) fn stream_failure(failure: ForwardFailure, leader: &LeaderInfo) -> NodeError {
    match failure {
        ForwardFailure::NotSent(status)
            if matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
            ) =>
        {
            NodeError::NotLeader { node: leader.id }
        }
        ForwardFailure::NotSent(status) => NodeError::Unavailable(format!(
            "forward to leader {} at {}: {}; nothing was sent",
            leader.id,
            leader.addr,
            status.message()
        )),
        ForwardFailure::Unknown(why) => NodeError::Unavailable(format!(
            "forward to leader {} at {}: {why}; the outcome is unknown",
            leader.id, leader.addr
        )),
        // Answered by a unary call where it happens; never reported as such.
        ForwardFailure::Unsupported => NodeError::NotLeader { node: leader.id },
    }
}

/// Whether a call failed because no connection could be made (so nothing was sent).
fn never_connected(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
            )
        {
            return true;
        }
        // tonic wraps a failed connect in a type of its own, named in its debug form.
        if format!("{e:?}").starts_with("ConnectError") {
            return true;
        }
        source = e.source();
    }
    false
}

/// A failed call to the leader that may be retried whatever happened to it (a read index):
/// `UNAVAILABLE` means the leader is unreachable, so the caller retries elsewhere; anything else
/// is reported as `what` failed, with `note` after the leader's message.
pub(super) fn peer_failure(
    status: &tonic::Status,
    leader: &LeaderInfo,
    what: String,
    note: &str,
) -> NodeError {
    if status.code() == tonic::Code::Unavailable {
        NodeError::NotLeader { node: leader.id }
    } else {
        NodeError::Unavailable(format!("{what}: {}{note}", status.message()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn leader() -> LeaderInfo {
        LeaderInfo {
            id: 1,
            addr: "127.0.0.1:7001".into(),
            term: 3,
        }
    }

    fn with_source(message: &str, kind: std::io::ErrorKind) -> tonic::Status {
        let mut status = tonic::Status::unavailable(message);
        status.set_source(Arc::new(std::io::Error::new(kind, "io")));
        status
    }

    #[test]
    fn a_forward_is_retried_only_when_the_leader_certainly_did_not_take_it() {
        let not_leader =
            tonic::Status::unavailable(format!("node 1 {}", crate::base::error::NOT_LEADER_SUFFIX));
        assert_eq!(
            forward_failure(&not_leader, &leader()),
            NodeError::NotLeader { node: 1 }
        );
        let refused = with_source("tcp connect error", std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            forward_failure(&refused, &leader()),
            NodeError::NotLeader { node: 1 }
        );
        // Sent, then the connection went: the leader may have committed it.
        for status in [
            with_source("connection reset", std::io::ErrorKind::ConnectionReset),
            tonic::Status::unavailable("node 1 is shutting down"),
            tonic::Status::deadline_exceeded("timeout expired"),
        ] {
            match forward_failure(&status, &leader()) {
                NodeError::Unavailable(message) => {
                    assert!(message.contains("the outcome is unknown"), "{message}")
                }
                other => panic!("{status:?} is no refusal: {other:?}"),
            }
        }
    }

    #[test]
    fn a_streamed_forward_is_retried_only_when_it_never_went_out() {
        // No stream could be opened: nothing was sent, so a passing failure is retried.
        for status in [
            tonic::Status::unavailable("tcp connect error"),
            tonic::Status::deadline_exceeded("no forward stream opened in time"),
        ] {
            assert_eq!(
                stream_failure(ForwardFailure::NotSent(status), &leader()),
                NodeError::NotLeader { node: 1 }
            );
        }
        // Refused at the opening: reported, and nothing was sent.
        match stream_failure(
            ForwardFailure::NotSent(tonic::Status::permission_denied("members only")),
            &leader(),
        ) {
            NodeError::Unavailable(message) => {
                assert!(message.contains("members only"), "{message}");
                assert!(message.contains("nothing was sent"), "{message}");
            }
            other => panic!("a refusal is no retry: {other:?}"),
        }
        // Sent, then the stream broke or the leader went silent: the outcome is unknown.
        match stream_failure(
            ForwardFailure::Unknown("the forward stream failed: reset".into()),
            &leader(),
        ) {
            NodeError::Unavailable(message) => {
                assert!(message.contains("the outcome is unknown"), "{message}");
                assert!(message.contains("reset"), "{message}");
            }
            other => panic!("a lost batch is no refusal: {other:?}"),
        }
    }
}

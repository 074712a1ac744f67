//! The one mapping from conch errors to gRPC status codes (Grackle's conventions).

use tonic::{Code, Status};

use crate::node::NodeError;
use crate::state::{Error, ErrorKind};

pub fn from_state(error: Error) -> Status {
    let code = match error.kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
    };
    Status::new(code, error.message)
}

pub fn from_node(error: NodeError) -> Status {
    match error {
        NodeError::Unavailable(message) => Status::unavailable(message),
        NodeError::NotLeader { node } => {
            Status::unavailable(format!("node {node} is not the leader; retry"))
        }
        NodeError::Internal(message) => {
            tracing::error!(error = %message, "internal error");
            Status::internal(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_errors_map_to_grackle_codes() {
        assert_eq!(
            from_state(Error::invalid("weight exceeds semaphore permits")).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            from_state(Error::not_found("lease x not found")).code(),
            Code::NotFound
        );
        assert_eq!(
            from_state(Error::already_exists("namespace a exists")).code(),
            Code::AlreadyExists
        );
        assert_eq!(
            from_state(Error::exhausted("too many waiters")).code(),
            Code::ResourceExhausted
        );
        let status = from_node(NodeError::Unavailable("no leader".into()));
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unavailable, "no leader")
        );
    }
}

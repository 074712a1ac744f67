//! The request id a client attaches to a write (`conch-request-id` metadata): one per logical
//! operation, reused by every retry of it. A write with an id runs as [`Cmd::Once`], so a retry
//! answers the first attempt's reply instead of running again; a write without one (a plain
//! Grackle client) runs as before. See `docs/design.md` (Exactly-once writes).

use tonic::{Request, Status};

use super::status::ApiError;
use crate::state::{Cmd, validate};

pub(crate) use conch_proto::wire::REQUEST_ID_HEADER;

/// The request's id, if it carries one (refused when it is not a valid id), and its message.
pub(crate) fn split<T>(request: Request<T>) -> Result<(Option<String>, T), Status> {
    let id = match request.metadata().get(REQUEST_ID_HEADER) {
        None => None,
        Some(value) => {
            let id = value.to_str().unwrap_or_default().to_string();
            validate::request_id(&id).map_err(ApiError::from)?;
            Some(id)
        }
    };
    Ok((id, request.into_inner()))
}

/// `cmd`, run once per request id when there is one.
pub(crate) fn wrap(id: Option<String>, cmd: Cmd) -> Cmd {
    match id {
        Some(request_id) => Cmd::Once {
            request_id,
            cmd: Box::new(cmd),
        },
        None => cmd,
    }
}

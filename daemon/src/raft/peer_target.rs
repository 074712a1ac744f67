//! Every Raft RPC names the node it is meant for, and a node refuses one meant for another.
//!
//! openraft counts a reply as the vote or the acknowledgement of the node it sent the request
//! to. If the address used for node 3 leads to another member (a stale DNS entry, swapped
//! addresses, a port taken by another process that forwards elsewhere), that member's reply
//! would count as node 3's: a quorum could be counted from fewer real nodes, and a leader could
//! even send its own entries to itself. So the sender puts the target's id in the
//! [`PEER_TARGET_HEADER`] metadata, and the receiver refuses a request naming another id before
//! Raft sees it (the sender sees the refusal as a network error and keeps retrying, so the
//! misrouted link counts as down). A request without the header (a sender from before it
//! existed) is accepted.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;

use super::NodeId;

pub(crate) use conch_proto::wire::PEER_TARGET_HEADER;
/// A refusal is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);

static LOGGED: Mutex<Option<Instant>> = Mutex::new(None);

/// Sets the target of an outgoing Raft RPC.
pub(crate) fn name_target<T>(request: &mut tonic::Request<T>, target: NodeId) {
    if let Ok(value) = target.to_string().parse() {
        request.metadata_mut().insert(PEER_TARGET_HEADER, value);
    }
}

/// Checks that an incoming Raft RPC is meant for node `own`; the error says which node it was
/// meant for.
pub(crate) fn check(own: NodeId, metadata: &MetadataMap) -> Result<(), String> {
    let Some(value) = metadata.get(PEER_TARGET_HEADER) else {
        return Ok(());
    };
    if crate::sim_hooks::regressions::active(crate::sim_hooks::regressions::Bug::MisroutedReplies) {
        return Ok(());
    }
    let target = value.to_str().ok().and_then(|v| v.parse::<NodeId>().ok());
    if target == Some(own) {
        return Ok(());
    }
    let message = match target {
        Some(target) => format!(
            "this is node {own}, not node {target}: the address the sender uses for node \
             {target} leads here"
        ),
        None => format!("this is node {own}; the request names no valid target node"),
    };
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
        tracing::warn!("refused a raft message: {message}");
        *logged = Some(Instant::now());
    }
    Err(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_meant_for_another_node_is_refused() {
        let mut request = tonic::Request::new(());
        assert_eq!(check(2, request.metadata()), Ok(()), "no header: accepted");
        name_target(&mut request, 2);
        assert_eq!(check(2, request.metadata()), Ok(()));
        let refused = check(1, request.metadata()).unwrap_err();
        assert!(refused.contains("this is node 1, not node 2"), "{refused}");
        request
            .metadata_mut()
            .insert(PEER_TARGET_HEADER, "x".parse().expect("ascii"));
        assert!(check(1, request.metadata()).is_err());
    }
}

//! `WaitHolderChange`: a caller that knows a semaphore's holder (by its fencing token) waits
//! until that holder is gone or replaced, and gets the holders then. `conch elect --observe`
//! follows an election with it, without polling.
//!
//! The wait starts with a linearizable read (so an answer is never older than the call), then
//! watches the one semaphore on this node's applied state: only an applied entry that changed
//! its holders wakes the wait, which reads them again, so a watcher costs work per change of its
//! semaphore, not per entry. Nothing is proposed and no timer fires besides the call's own
//! deadline. See `docs/design.md` (Holder-change waits).

use std::time::Duration;

use crate::node::Node;
use crate::state::{Error, ErrorKind, HolderView, PageRequest, State};

use super::status::ApiError;

/// The longest a single call waits; the caller asks again.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// What a wait ends with: the holders in grant order, and whether the semaphore exists.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Holders {
    pub holders: Vec<HolderView>,
    pub exists: bool,
}

impl Holders {
    /// The fencing token of the first holder; 0 when nobody holds.
    pub fn token(&self) -> u64 {
        self.holders.first().map_or(0, |h| h.token)
    }
}

/// The holders of `ns/sem` in `state` (a missing namespace or semaphore: nobody, not an error).
pub fn holders(state: &State, ns: &str, sem: &str) -> Result<Holders, Error> {
    match state.list_holders(ns, sem, &PageRequest::default()) {
        Ok(page) => Ok(Holders {
            holders: page.items,
            exists: true,
        }),
        Err(e) if e.kind == ErrorKind::NotFound => Ok(Holders::default()),
        Err(e) => Err(e),
    }
}

/// Waits until the first holder of `ns/sem` is not the grant `known_token` (0: nobody), or
/// `timeout` (at most [`MAX_WAIT`]) passes, and answers with the holders at that point.
pub async fn wait(
    node: &Node,
    ns: &str,
    sem: &str,
    known_token: u64,
    timeout: Duration,
) -> Result<Holders, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
    node.linearizable().await?;
    // Watch before reading, so no change applied between the read and the wait is missed.
    let mut watch = node.applied.watch_holders(ns, sem);
    loop {
        let now = node.applied.read(|s| holders(s, ns, sem))?;
        if now.token() != known_token {
            return Ok(now);
        }
        // A test sees the wait parked by this event (`parked`), before it changes the holder.
        tracing::debug!(
            parked = true,
            ns,
            sem,
            known_token,
            "holder-change wait parked"
        );
        tokio::select! {
            () = watch.changed() => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(now),
            // The node stops: answer with what is known, the caller watches on elsewhere.
            () = node.tasks.stopping() => return Ok(now),
        }
    }
}

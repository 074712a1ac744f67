//! Expiry: the leader proposes `Expire` when its applied state has a lease or a waiter past due
//! on the lease clock (`clock.rs`: monotonic, never the wall clock; sleeps are monotonic too).
//! An idle cluster writes nothing. A new leader's first batch extends every
//! lease; whether that is still due is decided in one place, [`Node::extension_due`], and this
//! task proposes that batch right after an election when no client writes first. See
//! `docs/design.md` (Time).

use std::sync::Arc;
use std::time::Duration;

use crate::node::Node;
use crate::state::Cmd;

/// Longest sleep between checks while leading.
const RECHECK: Duration = Duration::from_secs(1);
/// Pause after a failed proposal before trying again.
const RETRY: Duration = Duration::from_millis(50);

pub(crate) async fn run(node: Arc<Node>) {
    // The role and term only: openraft's full metrics change at every step of every write.
    let mut metrics = node.raft.server_metrics();
    let mut applied = node.applied.subscribe_applied();
    loop {
        if !node.is_leader() {
            if metrics.changed().await.is_err() {
                return;
            }
            continue;
        }
        let due = node.applied.read(|state| state.next_due_ns());
        let now = node.lease_clock_ns();
        let must_propose = node.extension_due() || due.is_some_and(|due| due <= now);
        if must_propose {
            // A new term's first batch also carries ExtendLeases.
            match node.write_one(Cmd::Expire).await {
                Ok(_) => {
                    if node.extension_due() {
                        // Leadership moved while proposing; let the news arrive.
                        tokio::time::sleep(RETRY).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "lease expiry proposal failed");
                    tokio::time::sleep(RETRY).await;
                }
            }
            continue;
        }
        let sleep = match due {
            Some(due) => Duration::from_nanos(u64::try_from(due.saturating_sub(now)).unwrap_or(0))
                .min(RECHECK),
            None => RECHECK,
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            changed = applied.changed() => if changed.is_err() { return },
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}

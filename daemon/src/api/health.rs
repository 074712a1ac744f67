//! gRPC health (`grpc.health.v1.Health`) that a load balancer can act on: a node reports
//! SERVING only while it knows a leader and has applied its log up to within
//! [`CATCHING_UP_ENTRIES`] of its end; otherwise NOT_SERVING (no leader: writes and linearizable
//! reads would wait and fail; catching up: it is far behind). A leader that has not heard from a
//! majority for longer than the longest election timeout is cut off (the others are electing
//! or have elected another leader) and counts as having no leader. The overall status (service
//! "") and the Grackle service's follow the same rule. The reporter follows Raft's metrics, so
//! it changes as soon as the node learns of a leader or loses it, and it looks again every
//! heartbeat, since a leader's silent majority changes no metric.

use std::sync::Arc;

use conch_proto::grackle::grackle_api_server::GrackleApiServer;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::grackle::GrackleService;
use crate::node::{Node, RaftStatus};

/// A node whose applied index is further than this behind its log is catching up.
pub(crate) const CATCHING_UP_ENTRIES: u64 = 1000;

/// Whether a node with these metrics should take client traffic.
pub(crate) fn serving(leader_known: bool, last_log_index: u64, last_applied_index: u64) -> bool {
    leader_known && last_log_index.saturating_sub(last_applied_index) <= CATCHING_UP_ENTRIES
}

/// Whether the node should take client traffic now, and if not why: the rule of this module's
/// gRPC health, and of `/readyz` on the metrics listener (`http/metrics.rs`).
pub(crate) fn readiness(node: &Node, m: &RaftStatus) -> Result<(), String> {
    if node.removal.removed().is_some() {
        return Err("removed from the cluster".into());
    }
    // The longest election timeout: by then the others have started an election.
    let cut_off_after = node.config.election_timeout * 2;
    let cut_off = m.leading
        && m.millis_since_quorum_ack
            .is_none_or(|ms| u128::from(ms) > cut_off_after.as_millis());
    if m.current_leader.is_none() {
        return Err(format!(
            "no leader known (state {}, term {})",
            m.state, m.term
        ));
    }
    if cut_off {
        return Err(format!(
            "leading term {} but no majority has answered for over {} ms",
            m.term,
            cut_off_after.as_millis()
        ));
    }
    if !serving(true, m.last_log_index, m.applied_index) {
        return Err(format!(
            "catching up: applied index {} of log index {} (ready within {CATCHING_UP_ENTRIES})",
            m.applied_index, m.last_log_index
        ));
    }
    Ok(())
}

/// Keeps the health statuses in step with the node's view of the cluster until Raft stops (a
/// node removed from the cluster reports NOT_SERVING from then on). Checked at once when the
/// role, vote or membership changes (openraft's server metrics), and every heartbeat for the
/// rest (a node catching up): the full metrics change at every step of every write.
pub(crate) async fn follow(node: Arc<Node>, reporter: HealthReporter) {
    let mut server = node.raft.server_metrics();
    let mut reported = None;
    loop {
        server.borrow_and_update();
        let now = readiness(&node, &node.raft_status()).is_ok();
        if reported != Some(now) {
            report(&reporter, now).await;
            reported = Some(now);
        }
        tokio::select! {
            changed = server.changed() => if changed.is_err() {
                if node.removal.removed().is_some() && reported != Some(false) {
                    report(&reporter, false).await;
                }
                return;
            },
            _ = tokio::time::sleep(node.config.heartbeat) => {}
        }
    }
}

/// Sets the overall status and the Grackle service's.
async fn report(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status(
            <GrackleApiServer<GrackleService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_needs_a_leader_and_an_applied_log() {
        assert!(serving(true, 10, 10));
        assert!(serving(true, 10 + CATCHING_UP_ENTRIES, 10));
        assert!(!serving(true, 11 + CATCHING_UP_ENTRIES, 10));
        assert!(!serving(false, 10, 10));
        assert!(
            serving(true, 0, 5),
            "an applied index past the log (snapshot) is fine"
        );
    }
}

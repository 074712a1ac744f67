//! gRPC health (`grpc.health.v1.Health`) that a load balancer can act on: a node reports
//! SERVING only while it knows a leader and has applied its log up to within
//! [`CATCHING_UP_ENTRIES`] of its end; otherwise NOT_SERVING (no leader: writes and linearizable
//! reads would wait and fail; catching up: it is far behind). The overall status (service "")
//! and the Grackle service's follow the same rule. The reporter follows Raft's metrics, so it
//! changes as soon as the node learns of a leader or loses it.

use std::sync::Arc;

use conch_proto::grackle::grackle_api_server::GrackleApiServer;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::grackle::GrackleService;
use crate::node::Node;

/// A node whose applied index is further than this behind its log is catching up.
pub const CATCHING_UP_ENTRIES: u64 = 1000;

/// Whether a node with these metrics should take client traffic.
pub fn serving(leader_known: bool, last_log_index: u64, last_applied_index: u64) -> bool {
    leader_known && last_log_index.saturating_sub(last_applied_index) <= CATCHING_UP_ENTRIES
}

/// Keeps the health statuses in step with the node's view of the cluster until Raft stops.
pub async fn follow(node: Arc<Node>, reporter: HealthReporter) {
    let mut metrics = node.raft.metrics();
    let mut reported = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            serving(
                m.current_leader.is_some(),
                m.last_log_index.unwrap_or(0),
                m.last_applied.map(|l| l.index).unwrap_or(0),
            )
        };
        if reported != Some(now) {
            let status = if now {
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
            reported = Some(now);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
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

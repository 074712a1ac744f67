//! Upgrades seen from a whole node: a node capped at the previous cluster version bootstraps
//! there and is finalized once upgraded, and a new cluster's raise survives a restart. Here
//! rather than beside `upgrade.rs` because they start a node, which sits above it.

use std::sync::Arc;
use std::time::Duration;

use crate::api::upgrade::{NodeInfo, finalize, new_cluster_version, record_new_cluster};
use crate::node::Node;
use crate::state::version::{BASE, NEWEST};

async fn leading(config: crate::NodeConfig) -> anyhow::Result<crate::ConchNode> {
    let node = crate::ConchNode::start(config).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !node.is_leader() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "no leader in 30 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(node)
}

async fn version_reaches(node: &Arc<Node>, version: u32) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while node.applied.read(|s| s.cluster_version()).0 < version {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "cluster version {version} not reached in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_speaks_version_1_only_bootstraps_there_and_is_finalized_once_upgraded()
-> anyhow::Result<()> {
    use conch_proto::conch::ClusterStatusRequest;
    let dir = tempfile::tempdir()?;
    let single = || crate::NodeConfig::single("127.0.0.1:0", dir.path());
    let bad = crate::ConchNode::start(single().cluster_version_max(NEWEST + 1))
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        bad.as_deref(),
        Some("cluster_version_max 3: this build speaks cluster versions 1 to 2")
    );

    let running = leading(single().cluster_version_max(BASE)).await?;
    let node = Arc::clone(running.node());
    assert_eq!(NodeInfo::this_node(&node).cluster_version_max, BASE);
    let refused = finalize(&node).await.expect_err("it speaks version 1 only");
    assert!(
        refused.to_string().starts_with(&format!(
            "cannot finalize the upgrade to cluster version 2: node 1 runs conch {}",
            crate::support::release::RELEASE
        )),
        "{refused}"
    );
    let status = running
        .client()
        .admin()
        .cluster_status(ClusterStatusRequest {})
        .await?
        .into_inner();
    assert_eq!(
        (status.cluster_version, status.cluster_version_max),
        (1, 1),
        "{status:?}"
    );
    assert_eq!(new_cluster_version(dir.path())?, None, "nothing to raise");
    running.shutdown().await?;

    // Upgraded: restarted on its data speaking the newest version. The cluster was not
    // created at it, so it stays at version 1 until finalized.
    let running = leading(single()).await?;
    let node = Arc::clone(running.node());
    node.linearizable().await?;
    assert_eq!(node.applied.read(|s| s.cluster_version()).0, BASE);
    let done = finalize(&node).await?;
    assert_eq!((done.previous, done.current), (1, 2));
    running.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_s_version_is_raised_after_a_restart_and_its_record_then_removed()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let single = || crate::NodeConfig::single("127.0.0.1:0", dir.path());
    // A new cluster: raised at once, and the record removed.
    let running = leading(single()).await?;
    version_reaches(running.node(), NEWEST).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while new_cluster_version(dir.path())?.is_some() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the record stays");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.shutdown().await?;

    // A bootstrap whose process stopped before the raise: a directory at version 1 that
    // holds the record (made here from a node that speaks version 1 only).
    let dir = tempfile::tempdir()?;
    let single = || crate::NodeConfig::single("127.0.0.1:0", dir.path());
    let running = leading(single().cluster_version_max(BASE)).await?;
    running.shutdown().await?;
    record_new_cluster(dir.path(), NEWEST)?;
    let running = leading(single()).await?;
    version_reaches(running.node(), NEWEST).await?;
    running.shutdown().await?;
    Ok(())
}

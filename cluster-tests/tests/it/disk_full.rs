//! A node whose disk fills up: each node's data directory is on a small tmpfs of its own
//! (mounting needs root, as on CI). When one node's disk is full, that node stops with exit
//! status 74 and one line naming the full disk, the other two keep serving, and once the space
//! is back and the node is started again (as a supervisor would) it reads its log cleanly,
//! catches up, and agrees with the others on the state hash.

use std::time::Duration;

use anyhow::{Context, ensure};
use cluster_tests::disk::{CONCHD_EXIT_STORAGE, mount_works};
use cluster_tests::ops::{self, acquired};
use cluster_tests::{Cluster, wait_for};
use conch_proto::grackle as pb;

const NS: &str = "disk";
/// Far more than the test writes: only the filler fills it.
const DISK_BYTES: u64 = 64 << 20;
const FULL_LINE: &str = "the disk holding its data directory is full";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_full_disk_stops_cleanly_and_catches_up_when_space_returns()
-> anyhow::Result<()> {
    mount_works().context("this test mounts a tmpfs per node (run it as root, as CI does)")?;
    let mut cluster =
        Cluster::launch_on(3, &[], false, false, &|_, _| Vec::new(), Some(DISK_BYTES)).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await?;
    let full = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader)
        .context("a follower")?;
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, NS).await?;
    ops::semaphore(&mut c, NS, "slot", 1).await?;
    let before = ops::lease(&mut c, NS, 60).await?;
    let r = ops::acquire(&mut c, NS, "slot", &before, 1, 0).await?;
    ensure!(acquired(&r), "{r:?}");
    cluster.wait_for_agreement(Duration::from_secs(30)).await?;

    let filled = cluster.fill_disk(full)?;
    ensure!(filled > 0, "the filler wrote nothing");
    // Every write reaches the full node's log: it must stop at its first append.
    let mut written = 0;
    let status = wait_for(
        "the node with the full disk to exit",
        Duration::from_secs(60),
        || {
            written += 1;
            let name = format!("during-{written}");
            let status = cluster.exit_status(full);
            let addr = cluster.addr(leader);
            async move {
                if status.is_some() {
                    return status;
                }
                // The other two keep serving writes meanwhile.
                let mut c =
                    cluster_tests::ops::Grackle::new(cluster_tests::channel(&addr).await.ok()?);
                let _ = ops::namespace(&mut c, &name).await;
                None
            }
        },
    )
    .await?;
    ensure!(
        status.code() == Some(CONCHD_EXIT_STORAGE),
        "node {full} exited with {status}, not {CONCHD_EXIT_STORAGE}: {}",
        cluster.logs_tail()
    );
    let log = cluster.log(full);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(FULL_LINE)).collect();
    ensure!(
        lines.len() == 1 && lines[0].starts_with("conchd: node"),
        "one line naming the full disk expected, got {lines:?}"
    );
    // The full node refuses: nothing answers on its port any more.
    ensure!(
        cluster.status(full).await.is_err(),
        "the stopped node still answers"
    );

    // The cluster keeps serving without it: writes and linearizable reads.
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, "while-full").await?;
    let during = ops::lease(&mut c, NS, 60).await?;
    let r = ops::acquire(&mut c, NS, "slot", &during, 1, 0).await?;
    ensure!(!acquired(&r), "the slot is held, yet granted again: {r:?}");

    // Space returns; the node starts again, as a supervisor would, and catches up.
    cluster.free_disks()?;
    let restarted = cluster.restart_exited()?;
    ensure!(
        restarted.iter().map(|(id, _)| *id).collect::<Vec<_>>() == vec![full],
        "{restarted:?}"
    );
    let (applied, _) = cluster
        .wait_for_agreement(Duration::from_secs(60))
        .await
        .with_context(|| cluster.logs_tail())?;
    ensure!(applied > 0);
    let mut c = cluster.grackle(full).await?;
    let holders = ops::holders(&mut c, NS, "slot").await?;
    ensure!(
        holders.len() == 1 && holders[0].lease_id == before,
        "the hold made before the disk filled is gone after the restart: {holders:?}"
    );
    c.get_namespace(pb::GetNamespaceRequest {
        namespace_name: "while-full".into(),
    })
    .await
    .context("the write made while the node was down is on it")?;
    // And it takes part again: a write through it commits.
    ops::namespace(&mut c, "after").await?;
    cluster.wait_for_agreement(Duration::from_secs(30)).await?;
    Ok(())
}

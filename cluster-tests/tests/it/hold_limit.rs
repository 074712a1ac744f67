//! Hold limits over the wire, through a follower: a semaphore's `max_hold_ms` and an acquire's,
//! the answer's `hold_ms`, the holder's `hold_ends_at`, an update that leaves the limit as it is,
//! and a blocked waiter granted when the holder's limit passes while its lease lives on.
//!
//! Waits have long server-side timeouts and every other wait is on a condition with a deadline:
//! a grant that did not come from the limit would leave the waiter waiting past the test's own
//! deadline.

use std::time::Duration;

use cluster_tests::ops;
use cluster_tests::{Cluster, wait_for};
use conch_proto::grackle as pb;

const WAIT: Duration = Duration::from_secs(30);
const NS: &str = "jobs";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_ends_at_its_limit_and_the_waiter_gets_it() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(WAIT).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .ok_or_else(|| anyhow::anyhow!("no follower"))?;
    let mut c = cluster.grackle(follower).await?;
    ops::namespace(&mut c, NS).await?;
    let created = c
        .create_semaphore(pb::CreateSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: "db".into(),
            permits: 1,
            max_hold_ms: 600_000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .semaphore
        .unwrap_or_default();
    assert_eq!(created.max_hold_ms, 600_000);

    // A Grackle client's update (no max_hold_ms) keeps the limit.
    let updated = c
        .update_semaphore(pb::UpdateSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: "db".into(),
            description: "one at a time".into(),
            permits: 1,
            expected_version: created.version,
            ..Default::default()
        })
        .await?
        .into_inner()
        .semaphore
        .unwrap_or_default();
    assert_eq!(updated.max_hold_ms, 600_000);

    // The acquire asks for less: 2 s wins, and the answer says how much is left.
    let a = ops::lease(&mut c, NS, 60).await?;
    let granted = c
        .acquire_semaphore(pb::AcquireSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: "db".into(),
            lease_id: a.clone(),
            weight: 1,
            max_hold_ms: 2_000,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(ops::acquired(&granted), "{granted:?}");
    assert!(
        granted.hold_ms > 0 && granted.hold_ms <= 2_000,
        "hold_ms {}",
        granted.hold_ms
    );
    let holders = ops::holders(&mut c, NS, "db").await?;
    assert_eq!(holders.len(), 1);
    assert!(
        holders[0].hold_ends_at > holders[0].locked_at,
        "{:?}",
        holders[0]
    );

    // A waiter through another node gets the slot when the limit passes, while A's lease is
    // still alive (its TTL is 60 s).
    let mut w = cluster.grackle(leader).await?;
    let b = ops::lease(&mut w, NS, 60).await?;
    let waiter = tokio::spawn(async move { ops::acquire(&mut w, NS, "db", &b, 1, 120).await });
    let got = tokio::time::timeout(WAIT, waiter).await???;
    assert!(ops::acquired(&got), "{got:?}");
    assert!(
        got.hold_ms > 0 && got.hold_ms <= 600_000,
        "the semaphore's own limit: {}",
        got.hold_ms
    );
    // A's lease lives on, holding nothing.
    let leases = c
        .get_semaphore_lease(pb::GetSemaphoreLeaseRequest {
            namespace_name: NS.into(),
            lease_id: a.clone(),
        })
        .await;
    assert!(leases.is_ok(), "{leases:?}");
    wait_for("A's hold to be gone from every node", WAIT, || {
        let cluster = &cluster;
        let a = a.clone();
        async move {
            for id in cluster.ids() {
                let mut c = cluster.grackle(id).await.ok()?;
                let holders = ops::holders(&mut c, NS, "db").await.ok()?;
                if holders.iter().any(|h| h.lease_id == a) {
                    return None;
                }
            }
            Some(())
        }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_limits_out_of_range_are_refused() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    cluster.wait_for_leader(WAIT).await?;
    let mut c = cluster.grackle(cluster.ids()[0]).await?;
    ops::namespace(&mut c, NS).await?;
    for bad in [1, 999, 2_592_000_001, u64::MAX] {
        let e = c
            .create_semaphore(pb::CreateSemaphoreRequest {
                namespace_name: NS.into(),
                semaphore_name: "db".into(),
                permits: 1,
                max_hold_ms: bad,
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        assert!(e.message().contains("max_hold_ms"), "{}", e.message());
    }
    Ok(())
}

//! The Grackle lock calls against real conchd processes: every call through a follower, the
//! pushed grant of a blocked acquire, fairness between readers and a writer, and a leader kill
//! with holders and waiters in place.

use std::time::Duration;

use cluster_tests::ops::Grackle;
use cluster_tests::{Cluster, wait_for};
use conch_proto::conch::ListLockWaitersRequest;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle as pb;
use tonic::Code;

async fn lock_lease(c: &mut Grackle, ns: &str, ttl_seconds: u64) -> anyhow::Result<String> {
    let lease = c
        .create_lock_lease(pb::CreateLockLeaseRequest {
            namespace_name: ns.into(),
            process_id: "locks-test".into(),
            ttl_seconds,
            ..Default::default()
        })
        .await?
        .into_inner()
        .lease
        .unwrap_or_default();
    Ok(lease.lease_id)
}

async fn acquire(
    c: &mut Grackle,
    ns: &str,
    path: &str,
    lease: &str,
    exclusive: bool,
    timeout_seconds: i32,
) -> Result<pb::AcquireLockResponse, tonic::Status> {
    Ok(c.acquire_lock(pb::AcquireLockRequest {
        namespace_name: ns.into(),
        lock_name: path.into(),
        exclusive,
        lease_id: lease.into(),
        timeout_seconds,
        ..Default::default()
    })
    .await?
    .into_inner())
}

fn outcome(r: &pb::AcquireLockResponse) -> pb::AcquireOutcome {
    r.outcome()
}

async fn waiters(cluster: &Cluster, id: u64, ns: &str, path: &str) -> Vec<String> {
    let Some(channel) = cluster.channel(id) else {
        return vec![];
    };
    let mut api = ConchApiClient::new(channel);
    match api
        .list_lock_waiters(ListLockWaitersRequest {
            namespace_name: ns.into(),
            lock_name: path.into(),
            ..Default::default()
        })
        .await
    {
        Ok(r) => r
            .into_inner()
            .waiters
            .into_iter()
            .map(|w| w.lease_id)
            .collect(),
        Err(_) => vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_call_answers_through_a_follower() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(1);
    let mut c = cluster.grackle(follower).await?;
    cluster_tests::ops::namespace(&mut c, "app").await?;

    let a = lock_lease(&mut c, "app", 30).await?;
    let b = lock_lease(&mut c, "app", 30).await?;
    let got = c
        .get_lock_lease(pb::GetLockLeaseRequest {
            namespace_name: "app".into(),
            lease_id: a.clone(),
        })
        .await?
        .into_inner()
        .lease
        .unwrap_or_default();
    assert_eq!(got.lease_id, a);
    let refreshed = c
        .refresh_lock_lease(pb::RefreshLockLeaseRequest {
            namespace_name: "app".into(),
            lease_id: a.clone(),
            ttl_seconds: 60,
        })
        .await?
        .into_inner()
        .lease
        .unwrap_or_default();
    assert_eq!(refreshed.ttl_seconds, 60);
    let leases = c
        .list_lock_leases(pb::ListLockLeasesRequest {
            namespace_name: "app".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .leases;
    assert_eq!(leases.len(), 2);
    // A semaphore lease is not a lock lease, and the other way round.
    let sem_lease = cluster_tests::ops::lease(&mut c, "app", 30).await?;
    let err = acquire(&mut c, "app", "x", &sem_lease, true, 0)
        .await
        .expect_err("a semaphore lease cannot hold a lock");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = c
        .get_semaphore_lease(pb::GetSemaphoreLeaseRequest {
            namespace_name: "app".into(),
            lease_id: a.clone(),
        })
        .await
        .expect_err("a lock lease is no semaphore lease");
    assert_eq!(err.code(), Code::NotFound);

    let r = acquire(&mut c, "app", "users/1", &a, true, 0).await?;
    assert_eq!(outcome(&r), pb::AcquireOutcome::Acquired);
    assert!(r.fencing_token > 0);
    let lock = r.lock.unwrap_or_default();
    assert_eq!(lock.state(), pb::LockState::ExclusiveLocked);
    assert_eq!(lock.lock_holders.len(), 1);

    let r = acquire(&mut c, "app", "users", &b, false, 0).await?;
    assert_eq!(outcome(&r), pb::AcquireOutcome::Unavailable);
    assert_eq!(r.reason(), pb::ContentionReason::Descendant);
    assert_eq!(
        r.blocking_locks
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>(),
        ["users/1"]
    );
    let r = acquire(&mut c, "app", "users/1/x", &b, false, 0).await?;
    assert_eq!(r.reason(), pb::ContentionReason::Ancestor);
    let r = acquire(&mut c, "app", "users/2", &b, true, 0).await?;
    assert_eq!(
        outcome(&r),
        pb::AcquireOutcome::Acquired,
        "siblings are independent"
    );

    // Every node answers the same reads.
    for id in cluster.ids() {
        let mut n = cluster.grackle(id).await?;
        let lock = n
            .get_lock(pb::GetLockRequest {
                namespace_name: "app".into(),
                lock_name: "users/1".into(),
            })
            .await?
            .into_inner()
            .lock
            .unwrap_or_default();
        assert_eq!(lock.state(), pb::LockState::ExclusiveLocked, "node {id}");
        let never = n
            .get_lock(pb::GetLockRequest {
                namespace_name: "app".into(),
                lock_name: "never/held".into(),
            })
            .await?
            .into_inner()
            .lock
            .unwrap_or_default();
        assert_eq!(never.state(), pb::LockState::Unlocked, "node {id}");
        let names: Vec<String> = n
            .list_locks(pb::ListLocksRequest {
                namespace_name: "app".into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .locks
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(names, ["users/1", "users/2"], "node {id}");
    }

    let released = c
        .release_lock(pb::ReleaseLockRequest {
            namespace_name: "app".into(),
            lock_name: "users/1".into(),
            lease_id: a.clone(),
        })
        .await?
        .into_inner()
        .lock
        .unwrap_or_default();
    assert_eq!(released.state(), pb::LockState::Unlocked);
    c.delete_lock(pb::DeleteLockRequest {
        namespace_name: "app".into(),
        lock_name: "users/2".into(),
    })
    .await?;
    let r = acquire(&mut c, "app", "users", &a, true, 0).await?;
    assert_eq!(outcome(&r), pb::AcquireOutcome::Acquired, "{r:?}");
    c.revoke_lock_lease(pb::RevokeLockLeaseRequest {
        namespace_name: "app".into(),
        lease_id: a.clone(),
    })
    .await?;
    let r = acquire(&mut c, "app", "users", &b, true, 0).await?;
    assert_eq!(
        outcome(&r),
        pb::AcquireOutcome::Acquired,
        "a revoke frees its locks"
    );

    // Bad input is refused naming the field, and changes nothing.
    let err = acquire(&mut c, "app", "bad name", &b, true, 0)
        .await
        .expect_err("a space is not allowed");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("lock_name"), "{}", err.message());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_queued_behind_readers_is_granted_before_later_readers() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let mut c = cluster.grackle(1).await?;
    cluster_tests::ops::namespace(&mut c, "app").await?;
    let (r1, w, r2) = (
        lock_lease(&mut c, "app", 60).await?,
        lock_lease(&mut c, "app", 60).await?,
        lock_lease(&mut c, "app", 60).await?,
    );
    let r = acquire(&mut c, "app", "cfg", &r1, false, 0).await?;
    assert_eq!(outcome(&r), pb::AcquireOutcome::Acquired);

    // The writer waits through node 2, then a reader through node 3.
    let mut n2 = cluster.grackle(2).await?;
    let w_lease = w.clone();
    let writer =
        tokio::spawn(async move { acquire(&mut n2, "app", "cfg", &w_lease, true, 60).await });
    wait_for("the writer to queue", Duration::from_secs(10), || async {
        (waiters(&cluster, 1, "app", "cfg").await == [w.clone()]).then_some(())
    })
    .await?;
    let mut n3 = cluster.grackle(3).await?;
    let r2_lease = r2.clone();
    let reader =
        tokio::spawn(async move { acquire(&mut n3, "app", "cfg", &r2_lease, false, 60).await });
    wait_for(
        "the reader to queue behind it",
        Duration::from_secs(10),
        || async {
            (waiters(&cluster, 1, "app", "cfg").await == [w.clone(), r2.clone()]).then_some(())
        },
    )
    .await?;

    c.release_lock(pb::ReleaseLockRequest {
        namespace_name: "app".into(),
        lock_name: "cfg".into(),
        lease_id: r1.clone(),
    })
    .await?;
    let granted = writer.await??;
    assert_eq!(
        outcome(&granted),
        pb::AcquireOutcome::Acquired,
        "{granted:?}"
    );
    assert!(
        !reader.is_finished(),
        "the later reader still waits for the writer"
    );
    let lock = c
        .get_lock(pb::GetLockRequest {
            namespace_name: "app".into(),
            lock_name: "cfg".into(),
        })
        .await?
        .into_inner()
        .lock
        .unwrap_or_default();
    assert_eq!(lock.state(), pb::LockState::ExclusiveLocked);
    assert_eq!(lock.lock_holders[0].lease_id, w);
    c.release_lock(pb::ReleaseLockRequest {
        namespace_name: "app".into(),
        lock_name: "cfg".into(),
        lease_id: w.clone(),
    })
    .await?;
    let read = reader.await??;
    assert_eq!(outcome(&read), pb::AcquireOutcome::Acquired);
    assert!(
        read.fencing_token > granted.fencing_token,
        "tokens rise per path"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_their_queue_survive_a_leader_kill() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let others: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let (f1, f2) = (others[0], others[1]);
    let mut c = cluster.grackle(f1).await?;
    cluster_tests::ops::namespace(&mut c, "app").await?;
    let (h, w) = (
        lock_lease(&mut c, "app", 60).await?,
        lock_lease(&mut c, "app", 60).await?,
    );
    let held = acquire(&mut c, "app", "db/primary", &h, true, 0).await?;
    assert_eq!(outcome(&held), pb::AcquireOutcome::Acquired);
    let mut n2 = cluster.grackle(f2).await?;
    let w_lease = w.clone();
    let waiter =
        tokio::spawn(async move { acquire(&mut n2, "app", "db", &w_lease, true, 120).await });
    wait_for("the waiter to queue", Duration::from_secs(10), || async {
        (waiters(&cluster, f1, "app", "db").await == [w.clone()]).then_some(())
    })
    .await?;

    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    assert_ne!(new_leader, leader);
    let mut c = cluster.grackle(f1).await?;
    let lock = c
        .get_lock(pb::GetLockRequest {
            namespace_name: "app".into(),
            lock_name: "db/primary".into(),
        })
        .await?
        .into_inner()
        .lock
        .unwrap_or_default();
    assert_eq!(lock.lock_holders.len(), 1, "the hold survives: {lock:?}");
    assert_eq!(
        waiters(&cluster, f1, "app", "db").await,
        std::slice::from_ref(&w)
    );

    // The release through the new cluster wakes the waiter on the other follower.
    c.release_lock(pb::ReleaseLockRequest {
        namespace_name: "app".into(),
        lock_name: "db/primary".into(),
        lease_id: h.clone(),
    })
    .await?;
    let granted = waiter.await??;
    assert_eq!(
        outcome(&granted),
        pb::AcquireOutcome::Acquired,
        "{granted:?}"
    );
    assert!(granted.fencing_token > held.fencing_token);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_acquire_times_out_with_its_reason() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    let mut c = cluster.grackle(1).await?;
    cluster_tests::ops::namespace(&mut c, "app").await?;
    let (h, w) = (
        lock_lease(&mut c, "app", 60).await?,
        lock_lease(&mut c, "app", 60).await?,
    );
    acquire(&mut c, "app", "a/b", &h, false, 0).await?;
    let r = acquire(&mut c, "app", "a", &w, true, 1).await?;
    assert_eq!(outcome(&r), pb::AcquireOutcome::TimedOut, "{r:?}");
    assert_eq!(r.reason(), pb::ContentionReason::Descendant);
    assert_eq!(r.blocking_locks[0].name, "a/b");
    assert!(
        waiters(&cluster, 1, "app", "a").await.is_empty(),
        "the timed-out acquire left"
    );
    Ok(())
}

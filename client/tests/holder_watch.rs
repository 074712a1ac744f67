//! `Client::wait_holder_change` against real conchd nodes run in-process (tests/common): the
//! server answers when the holder changes, not before, and a missing semaphore counts as nobody.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::Cluster;
use conch_client::{Client, ClientConfig};

const NS: &str = "t";

async fn client(cluster: &Cluster) -> Client {
    let config = ClientConfig {
        request_timeout: Duration::from_secs(2),
        retry_for: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    Client::connect_with(cluster.endpoints(), config)
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_ends_when_the_holder_changes_and_not_before() {
    let cluster = Cluster::start(3).await;
    let c = client(&cluster).await;

    // No namespace, no semaphore: nobody holds, answered at once.
    let now = c
        .wait_holder_change(NS, "s", 0, Duration::ZERO)
        .await
        .expect("wait");
    assert!(!now.exists && now.holders.is_empty() && now.token() == 0);

    c.ensure_namespace(NS).await.expect("namespace");
    c.ensure_semaphore(NS, "s", 1).await.expect("semaphore");

    // Nothing changes: the wait runs to its timeout and says so.
    let t0 = Instant::now();
    let same = c
        .wait_holder_change(NS, "s", 0, Duration::from_millis(400))
        .await
        .expect("wait");
    assert!(same.exists && same.token() == 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );

    // A grant ends a long wait long before its timeout, with the new holder.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let r = c
                .wait_holder_change(NS, "s", 0, Duration::from_secs(30))
                .await;
            (r, t0.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lease = c
        .create_lease(NS, "test", Duration::from_secs(10), HashMap::new())
        .await
        .expect("lease");
    let guard = c
        .acquire(&lease, NS, "s", 1, None, HashMap::new())
        .await
        .expect("acquire")
        .expect("granted");
    let (r, took) = waiter.await.expect("join");
    let changed = r.expect("wait");
    assert_eq!(changed.token(), guard.fencing_token());
    assert_eq!(changed.holders[0].lease_id, lease.id());
    assert!(took < Duration::from_secs(20), "{took:?}");

    // Asking with the current holder waits for its release.
    let waiter = {
        let c = c.clone();
        let known = guard.fencing_token();
        tokio::spawn(async move {
            c.wait_holder_change(NS, "s", known, Duration::from_secs(30))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "answered before anything changed");
    guard.release().await.expect("release");
    let after = waiter.await.expect("join").expect("wait");
    assert_eq!(after.token(), 0);
    assert!(after.exists);
    lease.revoke().await.expect("revoke");
}

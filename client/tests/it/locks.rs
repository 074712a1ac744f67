//! The client's lock calls against real conchd nodes run in-process (tests/it/common): lock
//! leases kept alive and revoked, a wait chained over many RPCs keeping its place, the
//! contention an unsuccessful acquire reports, fencing tokens, and a hold dropped by
//! `DeleteLock`.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::{Cluster, eventually};
use conch_client::lock::{self, LockOutcome};
use conch_client::proto::grackle::ContentionReason;
use conch_client::{Client, ClientConfig, Error, Guard, Lease, LeaseKind};

const NS: &str = "t";

/// A client whose blocking acquires ask the server to wait 600 ms per call, so a few seconds
/// cover many chained RPCs.
async fn client(cluster: &Cluster) -> Client {
    let config = ClientConfig {
        request_timeout: Duration::from_secs(2),
        retry_for: Duration::from_secs(5),
        acquire_rpc_wait: Duration::from_millis(600),
        reattach_margin: Duration::from_millis(250),
        acquire_slack: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let c = Client::connect_with(cluster.endpoints(), config)
        .await
        .unwrap();
    c.ensure_namespace(NS).await.unwrap();
    c
}

async fn lease(c: &Client, ttl_s: u64) -> Lease {
    c.create_lock_lease(NS, "test", Duration::from_secs(ttl_s), HashMap::new())
        .await
        .unwrap()
}

fn acquired(outcome: LockOutcome) -> Guard {
    match outcome {
        LockOutcome::Acquired(g) => g,
        LockOutcome::Blocked(b) => panic!("expected a grant, blocked: {}", b.describe()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_leases_are_their_own_kind_and_are_kept_alive() {
    let cluster = Cluster::start(1).await;
    let c = client(&cluster).await;
    // A 2 s lease outlives several TTLs: the keep-alive refreshes it with RefreshLockLease.
    // Watched refresh by refresh until they span two TTLs past the create.
    let l = lease(&c, 2).await;
    assert_eq!(l.kind(), LeaseKind::Lock);
    let mut refreshed = l.refreshed();
    let created = *refreshed.borrow_and_update();
    tokio::time::timeout(Duration::from_secs(30), async {
        while refreshed.borrow_and_update().duration_since(created) < 2 * l.ttl() {
            refreshed.changed().await.expect("the keep-alive runs");
        }
    })
    .await
    .expect("refreshes span two TTLs");
    assert!(!l.is_lost(), "{:?}", l.state());
    let read = c.get_lease_of(LeaseKind::Lock, NS, l.id()).await.unwrap();
    assert_eq!(read.lease_id, l.id());
    let listed = c.list_leases_of(LeaseKind::Lock, NS, "test").await.unwrap();
    assert!(listed.iter().any(|x| x.lease_id == l.id()), "{listed:?}");
    // Not a semaphore lease.
    assert!(c.get_lease(NS, l.id()).await.unwrap_err().is_not_found());
    // A semaphore lease cannot hold locks: refused before asking.
    let sl = c
        .create_lease(NS, "test", Duration::from_secs(5), HashMap::new())
        .await
        .unwrap();
    let err = c
        .acquire_lock(&sl, NS, "a", true, None, HashMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { .. }) && err.to_string().contains("lock lease"),
        "{err}"
    );
    let id = l.id().to_string();
    l.revoke().await.unwrap();
    let gone = c.get_lease_of(LeaseKind::Lock, NS, &id).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    sl.revoke().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_acquire_says_why_and_a_chained_wait_keeps_its_place() {
    let cluster = Cluster::start(1).await;
    let c = client(&cluster).await;
    let (la, lb, lc) = (
        lease(&c, 10).await,
        lease(&c, 10).await,
        lease(&c, 10).await,
    );
    // A holds a/b exclusive.
    let ga = acquired(
        c.acquire_lock(&la, NS, "a/b", true, Some(Duration::ZERO), HashMap::new())
            .await
            .unwrap(),
    );
    assert!(ga.fencing_token() > 0);

    // B on the parent, without waiting: blocked by the descendant a/b.
    match c
        .acquire_lock(&lb, NS, "a", true, Some(Duration::ZERO), HashMap::new())
        .await
        .unwrap()
    {
        LockOutcome::Blocked(b) => {
            assert_eq!(b.reason, ContentionReason::Descendant);
            let paths: Vec<&str> = b.blocking.iter().map(|l| l.name.as_str()).collect();
            assert_eq!(paths, ["a/b"]);
        }
        LockOutcome::Acquired(_) => panic!("a is blocked by a/b"),
    }
    // A bounded wait over several RPCs ends without the lock, and says why.
    match c
        .acquire_lock(
            &lb,
            NS,
            "a",
            true,
            Some(Duration::from_millis(1500)),
            HashMap::new(),
        )
        .await
        .unwrap()
    {
        LockOutcome::Blocked(b) => assert_eq!(b.reason, ContentionReason::Descendant),
        LockOutcome::Acquired(_) => panic!("a is still blocked"),
    }
    assert!(c.list_lock_waiters(NS, "a").await.unwrap().is_empty());

    // B then C wait forever; B stays first across many chained RPCs.
    let wait = |l: Lease, path: &'static str| {
        let c = c.clone();
        tokio::spawn(async move {
            let r = c
                .acquire_lock(&l, NS, path, true, None, HashMap::new())
                .await;
            (r, l)
        })
    };
    let b = wait(lb, "a");
    assert!(
        eventually(Duration::from_secs(10), async || {
            c.list_lock_waiters(NS, "a").await.unwrap().len() == 1
        })
        .await
    );
    let cw = wait(lc, "a/b/c");
    assert!(
        eventually(Duration::from_secs(10), async || {
            c.list_lock_waiters(NS, "a").await.unwrap().len() == 2
        })
        .await
    );
    let head = c.list_lock_waiters(NS, "a").await.unwrap()[0].clone();
    assert_eq!(head.lock_name, "a");
    // Every request through node 0's proxy counts, this test's own listings too: those are
    // taken off.
    let rpcs = cluster.requests(0);
    let mut listings = 0;
    assert!(
        eventually(Duration::from_secs(60), async || {
            let q = c.list_lock_waiters(NS, "a").await.unwrap();
            listings += 1;
            assert_eq!(q.len(), 2, "a waiter fell out of the queue: {q:?}");
            assert_eq!(q[0].lease_id, head.lease_id, "the head changed");
            cluster.requests(0) >= rpcs + listings + 10
        })
        .await,
        "the waits were chained over several RPCs"
    );

    // A releases: B (the older acquire) gets a; C, under a, waits for B.
    let a_token = ga.fencing_token();
    ga.release().await.unwrap();
    let (gb, lb) = b.await.unwrap();
    let gb = acquired(gb.unwrap());
    assert!(gb.fencing_token() > a_token, "tokens increase");
    let held = c.get_lock(NS, "a").await.unwrap();
    assert!(lock::holds(&held, gb.fencing_token()));
    assert_eq!(c.list_lock_waiters(NS, "a").await.unwrap().len(), 1);

    // DeleteLock drops B's hold while its lease lives on; C is granted.
    c.delete_lock(NS, "a").await.unwrap();
    let (gc, lc) = cw.await.unwrap();
    let gc = acquired(gc.unwrap());
    assert!(gc.fencing_token() > gb.fencing_token());
    assert!(!lb.is_lost());
    let after = c.get_lock(NS, "a").await.unwrap();
    assert!(!lock::holds(&after, gb.fencing_token()), "{after:?}");
    let listed = c.list_locks(NS).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["a/b/c"]);
    // Releasing a dropped hold is fine.
    gb.release().await.unwrap();
    gc.release().await.unwrap();
    for l in [la, lb, lc] {
        l.revoke().await.unwrap();
    }
}

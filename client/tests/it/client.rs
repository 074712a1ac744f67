//! The client library against real conchd nodes run in-process (tests/it/common): queue
//! positions across chained RPCs and node failures, lease loss, failover, leader hints.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::{Cluster, Mode, eventually};
use conch_client::{Client, ClientConfig, Error, Guard, Lease, LeaseLoss};
use tokio::task::JoinHandle;

const NS: &str = "t";

/// A client with short per-RPC waits, so a few seconds cover many chained RPCs.
async fn client(cluster: &Cluster) -> Client {
    client_with(
        cluster,
        Duration::from_millis(600),
        Duration::from_millis(250),
    )
    .await
}

/// A client whose blocking acquires ask the server to wait `rpc_wait` per call and re-attach
/// `margin` before that wait ends.
async fn client_with(cluster: &Cluster, rpc_wait: Duration, margin: Duration) -> Client {
    let config = ClientConfig {
        request_timeout: Duration::from_secs(2),
        retry_for: Duration::from_secs(5),
        connect_timeout: Duration::from_millis(500),
        keepalive_interval: Duration::from_millis(500),
        keepalive_timeout: Duration::from_millis(500),
        acquire_rpc_wait: rpc_wait,
        reattach_margin: margin,
        acquire_slack: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    Client::connect_with(cluster.endpoints(), config)
        .await
        .unwrap()
}

async fn lease(c: &Client, ttl_s: u64) -> Lease {
    c.create_lease(NS, "test", Duration::from_secs(ttl_s), HashMap::new())
        .await
        .unwrap()
}

/// One permit of semaphore "s" for `l`, waiting as long as it takes.
async fn hold(c: &Client, l: &Lease) -> Guard {
    c.acquire(l, NS, "s", 1, None, HashMap::new())
        .await
        .unwrap()
        .unwrap()
}

/// `l` waits (forever) for a permit of "s" in a task, which returns the outcome and the lease.
fn wait_in_task(c: &Client, l: Lease) -> JoinHandle<(conch_client::Result<Option<Guard>>, Lease)> {
    let c = c.clone();
    tokio::spawn(async move {
        let g = c.acquire(&l, NS, "s", 1, None, HashMap::new()).await;
        (g, l)
    })
}

/// Waits until `n` leases are queued on "s".
async fn queued(cluster: &Cluster, n: usize) {
    cluster
        .await_queued(NS, "s", n, Duration::from_secs(5))
        .await;
}

/// The client's leader hint names the leader's client address.
fn assert_hint_is(c: &Client, cluster: &Cluster, leader: usize) {
    assert_eq!(
        c.leader_hint().as_deref(),
        Some(cluster.nodes[leader].addr.as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_creates_once_and_tolerates_existing() {
    let cluster = Cluster::start(1).await;
    let c = client(&cluster).await;
    let s = c.ensure_semaphore(NS, "db.2", 2).await.unwrap();
    assert_eq!((s.name.as_str(), s.permits), ("db.2", 2));
    let s = c.ensure_semaphore(NS, "db.2", 2).await.unwrap();
    assert_eq!(s.permits, 2);
    c.ensure_namespace(NS).await.unwrap();
    assert!(
        c.create_namespace(NS, "")
            .await
            .unwrap_err()
            .is_already_exists()
    );
    assert!(
        c.get_semaphore(NS, "nope")
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forever_wait_keeps_its_place_across_many_rpcs() {
    // t=0     A holds the only permit; B queues (forever), then C
    // t=0..3s B's wait spans ~6 chained RPCs of 600ms; B stays at the head throughout
    // t=3s    A releases -> B (not C) is granted
    let cluster = Cluster::start(1).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    let (la, lb, lc) = (
        lease(&c, 10).await,
        lease(&c, 10).await,
        lease(&c, 10).await,
    );
    let ga = c
        .acquire(&la, NS, "s", 1, Some(Duration::ZERO), HashMap::new())
        .await
        .unwrap()
        .unwrap();

    let b = wait_in_task(&c, lb);
    queued(&cluster, 1).await;
    let cwait = wait_in_task(&c, lc);
    queued(&cluster, 2).await;
    let head = cluster.queue(NS, "s").await[0].clone();

    // Until the waits have been chained over at least ten more RPCs (each ends after 600 ms
    // and is re-attached), the queue keeps both waiters, the head first.
    let rpcs = cluster.requests(0);
    let chained = eventually(Duration::from_secs(60), async || {
        let q = cluster.queue(NS, "s").await;
        assert_eq!(q.len(), 2, "a waiter fell out of the queue: {q:?}");
        assert_eq!(q[0], head, "the head changed");
        cluster.requests(0) >= rpcs + 10
    })
    .await;
    assert!(
        chained,
        "expected chained acquire RPCs, saw {}",
        cluster.requests(0) - rpcs
    );

    ga.release().await.unwrap();
    let (gb, lb) = b.await.unwrap();
    let gb = gb.unwrap().expect("B granted");
    assert_eq!(gb.lease_id(), head);
    assert!(gb.fencing_token() > 0);
    assert_eq!(cluster.queue(NS, "s").await.len(), 1);
    gb.release().await.unwrap();
    let (gc, lc) = cwait.await.unwrap();
    let gc = gc.unwrap().expect("C granted");
    assert!(gc.fencing_token() > 1, "tokens increase");
    gc.release().await.unwrap();
    for l in [la, lb, lc] {
        l.revoke().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_ends_on_time_and_leaves_no_waiter() {
    let cluster = Cluster::start(1).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    let (la, lb) = (lease(&c, 10).await, lease(&c, 10).await);
    let _ga = hold(&c, &la).await;

    // Non-blocking: one RPC, answered without waiting.
    let rpcs = cluster.requests(0);
    let none = c
        .acquire(&lb, NS, "s", 1, Some(Duration::ZERO), HashMap::new())
        .await
        .unwrap();
    assert!(none.is_none());
    assert_eq!(
        cluster.requests(0),
        rpcs + 1,
        "one acquire, no chained wait"
    );

    // 1.5s spans three chained RPCs and ends with the last one's TIMED_OUT.
    let t0 = Instant::now();
    let none = c
        .acquire(
            &lb,
            NS,
            "s",
            1,
            Some(Duration::from_millis(1500)),
            HashMap::new(),
        )
        .await
        .unwrap();
    let took = t0.elapsed();
    assert!(none.is_none());
    // It waited the whole time it was given (how much longer it took is the machine's).
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert!(
        cluster.queue(NS, "s").await.is_empty(),
        "the waiter is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_when_its_node_dies() {
    // t=0    A holds; B waits through the leader (its hint), C queues behind B
    // t=1s   the leader crashes (cut off from clients and peers), another node is elected: B
    //        re-attaches through it, still ahead of C (a cut-off leader cannot commit the
    //        cancellation of B's call)
    // t=2.5s A releases -> B is granted
    let cluster = Cluster::start(3).await;
    cluster.semaphore(NS, "s", 1).await;
    // A waiter's place lasts until the deadline of its newest call. The election after the
    // crash must fit inside it, even on a slow machine: calls of 20 s, re-attached 5 s early.
    let c = client_with(&cluster, Duration::from_secs(20), Duration::from_secs(5)).await;
    let (la, lb, lc) = (
        lease(&c, 10).await,
        lease(&c, 10).await,
        lease(&c, 10).await,
    );
    let ga = hold(&c, &la).await;
    let leader = cluster.leader().await;
    assert_hint_is(&c, &cluster, leader);
    let b = wait_in_task(&c, lb);
    queued(&cluster, 1).await;
    let head = cluster.queue(NS, "s").await[0].clone();
    let cwait = wait_in_task(&c, lc);
    queued(&cluster, 2).await;

    tokio::time::sleep(Duration::from_millis(1000)).await;
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let before: u64 = others.iter().map(|i| cluster.requests(*i)).sum();
    cluster.set_mode(leader, Mode::Down);
    // Between the cut-off leader's last committed deadline for B and B's re-attachment through
    // the new leader, a listing may omit B (it omits waiters past their deadline, reaped or
    // not); then B is back at the head, ahead of C.
    assert!(
        eventually(Duration::from_secs(10), async || {
            let q = cluster.queue(NS, "s").await;
            q.len() == 2 && q[0] == head
        })
        .await,
        "B re-attached at the head: {:?}",
        cluster.queue(NS, "s").await
    );
    ga.release().await.unwrap();
    let (gb, lb) = b.await.unwrap();
    assert_eq!(gb.unwrap().expect("B granted").lease_id(), head);
    let after: u64 = others.iter().map(|i| cluster.requests(*i)).sum();
    assert!(after > before, "traffic moved to the other nodes");
    drop(cwait);
    drop((la, lb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_is_abandoned_by_waiters_and_refreshes() {
    let cluster = Cluster::start(3).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    let (la, lb) = (lease(&c, 5).await, lease(&c, 5).await);
    let ga = hold(&c, &la).await;
    // The client talks to the leader (its hint): that is the node B waits through.
    let leader = cluster.leader().await;
    assert_hint_is(&c, &cluster, leader);
    let b = wait_in_task(&c, lb);
    queued(&cluster, 1).await;
    let head = cluster.queue(NS, "s").await[0].clone();

    // The leader freezes like a SIGSTOPped process: bytes stop, connections stay open (to its
    // clients and its peers, so the others elect a new leader).
    cluster.set_mode(leader, Mode::Stall);
    let stalled_at = Instant::now();
    // A refresh that succeeds more than the 5 s TTL after the stall can only have gone
    // through another node, and shows the lease outlived its TTL there.
    let mut refreshed = la.refreshed();
    tokio::time::timeout(
        Duration::from_secs(60),
        refreshed.wait_for(|at| *at > stalled_at + Duration::from_secs(5)),
    )
    .await
    .expect("A's lease was refreshed past its TTL")
    .expect("the lease's refresher is running");
    drop(refreshed);
    assert!(!la.is_lost(), "A's lease survived through the other nodes");
    assert_eq!(
        cluster.queue(NS, "s").await.first(),
        Some(&head),
        "B kept its place"
    );
    ga.release().await.unwrap();
    let (gb, _lb) = b.await.unwrap();
    assert_eq!(gb.unwrap().expect("B granted").lease_id(), head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_every_node_loses_the_lease_before_the_server_expires_it() {
    // ttl 3s: the client gives up 2s after its last successful refresh; the server would
    // expire the lease 3s after it.
    // One node: with every node cut off, the test still reads the server's view of the lease
    // past the proxies (a cut-off node of a larger cluster could not answer without a quorum).
    let cluster = Cluster::start(1).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    let l = lease(&c, 3).await;
    let _g = hold(&c, &l).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    cluster.set_mode(0, Mode::Down);
    let loss = tokio::time::timeout(Duration::from_secs(5), l.lost())
        .await
        .expect("lost in time");
    assert!(matches!(loss, LeaseLoss::NoRefresh { .. }), "{loss:?}");
    // Before the server expired it: the lease is still there.
    assert!(
        cluster.lease_exists(NS, l.id()).await,
        "the client gave up before the server expired the lease"
    );
    assert!(l.is_lost());
    // A lost lease stays lost even once the nodes are back (and answer this client again).
    cluster.set_mode(0, Mode::Up);
    assert!(
        eventually(Duration::from_secs(10), async || c
            .get_semaphore(NS, "s")
            .await
            .is_ok())
        .await,
        "the node answers again"
    );
    assert!(l.is_lost());
    let err = c
        .acquire(&l, NS, "s", 1, None, HashMap::new())
        .await
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_reported_at_the_next_refresh_and_ends_a_wait() {
    let cluster = Cluster::start(1).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    let (la, lb) = (lease(&c, 3).await, lease(&c, 3).await);
    let _ga = hold(&c, &la).await;
    let id_b = lb.id().to_string();
    let b = wait_in_task(&c, lb);
    queued(&cluster, 1).await;
    cluster.revoke(NS, &id_b).await;
    let err = tokio::time::timeout(Duration::from_secs(3), b)
        .await
        .expect("wait ended")
        .unwrap()
        .0
        .unwrap_err();
    assert!(err.is_not_found() || err.is_lease_lost(), "{err}");

    cluster.revoke(NS, la.id()).await;
    let loss = tokio::time::timeout(Duration::from_secs(3), la.lost())
        .await
        .expect("lost");
    assert!(matches!(loss, LeaseLoss::NotFound { .. }), "{loss:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_guard_or_a_lease_frees_the_permits() {
    let cluster = Cluster::start(1).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    let l = lease(&c, 10).await;
    let g = hold(&c, &l).await;
    assert_eq!(cluster.holders(NS, "s").await, [l.id().to_string()]);
    drop(g);
    assert!(
        eventually(Duration::from_secs(5), async || cluster
            .holders(NS, "s")
            .await
            .is_empty())
        .await
    );
    let _g = hold(&c, &l).await;
    let before = cluster.lease_count(NS).await;
    drop(l);
    assert!(
        eventually(Duration::from_secs(5), async || cluster
            .lease_count(NS)
            .await
            == before - 1)
        .await
    );
    assert!(cluster.holders(NS, "s").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_follow_the_leader_hint_and_fail_over() {
    let cluster = Cluster::start(3).await;
    cluster.semaphore(NS, "s", 1).await;
    let c = client(&cluster).await;
    c.get_semaphore(NS, "s").await.unwrap(); // learns the hint
    let leader = cluster.leader().await;
    let before = cluster.requests(leader);
    for _ in 0..5 {
        c.get_semaphore(NS, "s").await.unwrap();
    }
    assert_eq!(
        cluster.requests(leader),
        before + 5,
        "reads went to the leader"
    );
    assert_hint_is(&c, &cluster, leader);

    // The leader dies: the others elect a new one, and calls move on without an error.
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let before: u64 = others.iter().map(|i| cluster.requests(*i)).sum();
    cluster.set_mode(leader, Mode::Down);
    c.get_semaphore(NS, "s").await.unwrap();
    c.get_semaphore(NS, "s").await.unwrap();
    let after: u64 = others.iter().map(|i| cluster.requests(*i)).sum();
    assert!(after >= before + 2, "traffic moved to the other nodes");

    // Everything dies: Unavailable naming the endpoints (how soon is the routing tests' part,
    // in client.rs, in virtual time).
    for i in 0..3 {
        cluster.set_mode(i, Mode::Down);
    }
    match c.get_semaphore(NS, "s").await {
        Err(Error::Unavailable { endpoints, .. }) => assert_eq!(endpoints.len(), 3),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_show_holders_then_waiters_in_order() {
    let cluster = Cluster::start(1).await;
    cluster.semaphore(NS, "s", 2).await;
    let c = client(&cluster).await;
    let meta = |i: usize| HashMap::from([("host".to_string(), format!("n{i}"))]);
    let (l0, l1) = (lease(&c, 10).await, lease(&c, 10).await);
    let _g0 = c
        .acquire(&l0, NS, "s", 1, None, meta(0))
        .await
        .unwrap()
        .unwrap();
    let _g1 = c
        .acquire(&l1, NS, "s", 1, None, meta(1))
        .await
        .unwrap()
        .unwrap();
    let mut waits = Vec::new();
    for i in 2..4 {
        let l = lease(&c, 10).await;
        let cc = c.clone();
        waits.push(tokio::spawn(async move {
            let _ = cc.acquire(&l, NS, "s", 1, None, meta(i)).await;
            l
        }));
        // Queue one at a time so the order is known.
        queued(&cluster, i - 1).await;
    }
    let holders = c.list_holders(NS, "s").await.unwrap();
    let hosts: Vec<_> = holders.iter().map(|h| h.metadata["host"].clone()).collect();
    assert_eq!(hosts, ["n0", "n1"]);
    assert!(holders[0].fencing_token < holders[1].fencing_token);
    let w = c.list_waiters(NS, "s").await.unwrap();
    assert_eq!(
        w.semaphore.map(|s| (s.permits, s.active_holds)),
        Some((2, 2))
    );
    let waiting: Vec<_> = w
        .waiters
        .iter()
        .map(|w| (w.metadata["host"].clone(), w.position))
        .collect();
    assert_eq!(waiting, [("n2".to_string(), 0), ("n3".to_string(), 1)]);
    for t in waits {
        t.abort();
    }
}

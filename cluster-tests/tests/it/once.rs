//! Exactly-once writes across a lost reply: a write goes through a proxy that delivers it and
//! swallows the reply, the test waits until the cluster applied it, then the write is sent
//! again with the same `conch-request-id`. The retry answers what the first attempt did, and
//! the state shows one effect. Through the leader and through a follower (a forwarded write),
//! with raw gRPC and with the client library (whose own retry reuses the id).

use std::collections::HashMap;
use std::time::Duration;

use cluster_tests::net::lazy_channel;
use cluster_tests::ops::{self, Grackle};
use cluster_tests::{Cluster, wait_for};
use conch_client::{Client, ClientConfig};
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_testkit::proxy::{LinkMode, LinkProxy};
use tonic::Request;
use tonic::metadata::MetadataValue;

const SWALLOW: LinkMode = LinkMode::SwallowReplies(Duration::from_millis(700));
const WAIT: Duration = Duration::from_secs(20);

fn with_id<T>(message: T, id: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(Duration::from_secs(10));
    if let Ok(value) = MetadataValue::try_from(id) {
        request.metadata_mut().insert("conch-request-id", value);
    }
    request
}

async fn leader_and_follower(cluster: &Cluster) -> anyhow::Result<(u64, u64)> {
    let leader = cluster.wait_for_leader(WAIT).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .ok_or_else(|| anyhow::anyhow!("no follower"))?;
    Ok((leader, follower))
}

async fn leases(c: &Grackle, ns: &str) -> Vec<pb::Lease> {
    let mut c = c.clone();
    c.list_semaphore_leases(pb::ListSemaphoreLeasesRequest {
        namespace_name: ns.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner().leases)
    .unwrap_or_default()
}

async fn holders(c: &Grackle, ns: &str, sem: &str) -> Vec<pb::SemaphoreHolder> {
    ops::holders(&mut c.clone(), ns, sem)
        .await
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_reply_was_lost_is_answered_again_not_applied_again() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let (leader, follower) = leader_and_follower(&cluster).await?;
    for target in [leader, follower] {
        let proxy = LinkProxy::start(cluster.addr(target)).await?;
        proxy.set(SWALLOW);
        let lost = GrackleApiClient::new(lazy_channel(&proxy.addr.to_string())?);
        let direct = cluster.grackle(target).await?;
        let ns = format!("jobs-{target}");
        let id = |what: &str| format!("{what}-{target}");

        // Create a namespace.
        let create_ns = pb::CreateNamespaceRequest {
            name: ns.clone(),
            ..Default::default()
        };
        let status = lost
            .clone()
            .create_namespace(with_id(create_ns.clone(), &id("ns")))
            .await
            .expect_err("the reply is lost");
        eprintln!("create namespace through the proxy: {status:?}");
        let created = wait_for("the namespace", WAIT, || {
            let mut c = direct.clone();
            let name = ns.clone();
            async move {
                c.get_namespace(pb::GetNamespaceRequest {
                    namespace_name: name,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().namespace)
            }
        })
        .await?;
        let retry = direct
            .clone()
            .create_namespace(with_id(create_ns.clone(), &id("ns")))
            .await?
            .into_inner()
            .namespace;
        assert_eq!(retry.as_ref(), Some(&created), "the first reply, again");
        let without_id = ops::namespace(&mut direct.clone(), &ns).await;
        assert_eq!(
            without_id.map_err(|s| s.code()).err(),
            Some(tonic::Code::AlreadyExists),
            "a create without an id runs again"
        );

        // Create a semaphore.
        let create_sem = pb::CreateSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: "db".into(),
            permits: 1,
            ..Default::default()
        };
        lost.clone()
            .create_semaphore(with_id(create_sem.clone(), &id("sem")))
            .await
            .expect_err("the reply is lost");
        let created = wait_for("the semaphore", WAIT, || {
            let mut c = direct.clone();
            let ns = ns.clone();
            async move {
                c.get_semaphore(pb::GetSemaphoreRequest {
                    namespace_name: ns,
                    semaphore_name: "db".into(),
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().semaphore)
            }
        })
        .await?;
        let retry = direct
            .clone()
            .create_semaphore(with_id(create_sem, &id("sem")))
            .await?
            .into_inner()
            .semaphore;
        assert_eq!(retry.as_ref(), Some(&created));

        // Create a lease: one lease, and the retry names it.
        let create_lease = pb::CreateSemaphoreLeaseRequest {
            namespace_name: ns.clone(),
            process_id: "worker".into(),
            ttl_seconds: 60,
            ..Default::default()
        };
        lost.clone()
            .create_semaphore_lease(with_id(create_lease.clone(), &id("lease")))
            .await
            .expect_err("the reply is lost");
        let created = wait_for("the lease", WAIT, || {
            let direct = direct.clone();
            let ns = ns.clone();
            async move { leases(&direct, &ns).await.pop() }
        })
        .await?;
        let retry = direct
            .clone()
            .create_semaphore_lease(with_id(create_lease, &id("lease")))
            .await?
            .into_inner()
            .lease;
        assert_eq!(
            retry.map(|l| l.lease_id),
            Some(created.lease_id.clone()),
            "the same lease"
        );
        assert_eq!(leases(&direct, &ns).await.len(), 1, "one lease");
        let lease = created.lease_id;

        // Acquire: one grant, and the retry carries its fencing token.
        let acquire = pb::AcquireSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: "db".into(),
            lease_id: lease.clone(),
            weight: 1,
            ..Default::default()
        };
        lost.clone()
            .acquire_semaphore(with_id(acquire.clone(), &id("acquire")))
            .await
            .expect_err("the reply is lost");
        let holder = wait_for("the holder", WAIT, || {
            let direct = direct.clone();
            let ns = ns.clone();
            async move { holders(&direct, &ns, "db").await.pop() }
        })
        .await?;
        let retry = direct
            .clone()
            .acquire_semaphore(with_id(acquire.clone(), &id("acquire")))
            .await?
            .into_inner();
        assert!(ops::acquired(&retry), "{retry:?}");
        assert_eq!(retry.fencing_token, holder.fencing_token, "the same grant");
        let now = holders(&direct, &ns, "db").await;
        assert_eq!(now.len(), 1);
        assert_eq!(
            now[0].fencing_token, holder.fencing_token,
            "no second grant"
        );

        // Release: released once; the retry answers the release, not a new one.
        let release = pb::ReleaseSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: "db".into(),
            lease_id: lease.clone(),
        };
        lost.clone()
            .release_semaphore(with_id(release.clone(), &id("release")))
            .await
            .expect_err("the reply is lost");
        wait_for("the release", WAIT, || {
            let direct = direct.clone();
            let ns = ns.clone();
            async move { holders(&direct, &ns, "db").await.is_empty().then_some(()) }
        })
        .await?;
        let retry = direct
            .clone()
            .release_semaphore(with_id(release, &id("release")))
            .await?
            .into_inner()
            .semaphore
            .unwrap_or_default();
        assert_eq!(retry.active_holds, 0);
        // Someone else takes the slot; a late retry of the release must not free it.
        let other = ops::lease(&mut direct.clone(), &ns, 60).await?;
        let granted = ops::acquire(&mut direct.clone(), &ns, "db", &other, 1, 0).await?;
        assert!(ops::acquired(&granted));
        direct
            .clone()
            .release_semaphore(with_id(
                pb::ReleaseSemaphoreRequest {
                    namespace_name: ns.clone(),
                    semaphore_name: "db".into(),
                    lease_id: lease.clone(),
                },
                &id("release"),
            ))
            .await?;
        // And a late retry of the first acquire must not take a second grant.
        let late = direct
            .clone()
            .acquire_semaphore(with_id(acquire, &id("acquire")))
            .await?
            .into_inner();
        assert_eq!(late.fencing_token, holder.fencing_token);
        let now = holders(&direct, &ns, "db").await;
        assert_eq!(now.len(), 1);
        assert_eq!(now[0].lease_id, other);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_request_id_is_refused() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    let mut c = cluster.grackle(1).await?;
    let status = c
        .create_namespace(with_id(
            pb::CreateNamespaceRequest {
                name: "jobs".into(),
                ..Default::default()
            },
            "not an id!",
        ))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("conch-request-id"), "{status:?}");
    let err = c
        .get_namespace(pb::GetNamespaceRequest {
            namespace_name: "jobs".into(),
        })
        .await
        .expect_err("nothing created");
    assert_eq!(err.code(), tonic::Code::NotFound);
    Ok(())
}

/// The client library retries a write whose connection broke after the cluster applied it,
/// with the same request id, and returns the first reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_library_retries_with_the_same_id() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let (_, follower) = leader_and_follower(&cluster).await?;
    let proxy = LinkProxy::start(cluster.addr(follower)).await?;
    let direct = cluster.grackle(follower).await?;
    let config = ClientConfig {
        request_timeout: Duration::from_secs(5),
        retry_for: Duration::from_secs(60),
        ..ClientConfig::default()
    };
    // A fresh client per call: a client that got an answer follows the leader hint in it,
    // past the proxy.
    let fresh = async || Client::connect_with([proxy.addr.to_string()], config.clone()).await;

    // Every call: swallow its replies until the cluster shows the effect, then let the
    // client's retry through.
    async fn lossy<T, F>(proxy: &LinkProxy, call: F, applied: impl AsyncFnMut() -> bool) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static + std::fmt::Debug,
    {
        proxy.set(SWALLOW);
        let task = tokio::spawn(call);
        let mut applied = applied;
        let deadline = tokio::time::Instant::now() + WAIT;
        while !applied().await {
            assert!(tokio::time::Instant::now() < deadline, "never applied");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if task.is_finished() {
            panic!(
                "the call ended before its reply could be lost: {:?}",
                task.await
            );
        }
        proxy.set(LinkMode::Pass);
        task.await.expect("the call's task")
    }

    let c = fresh().await?;
    let ns = lossy(
        &proxy,
        async move { c.create_namespace("jobs", "").await },
        async || {
            direct
                .clone()
                .get_namespace(pb::GetNamespaceRequest {
                    namespace_name: "jobs".into(),
                })
                .await
                .is_ok()
        },
    )
    .await?;
    assert_eq!(ns.name, "jobs", "created once, not AlreadyExists");

    let c = fresh().await?;
    lossy(
        &proxy,
        async move { c.create_semaphore("jobs", "db", 1, "").await },
        async || holders_or_none(&direct).await.is_some(),
    )
    .await?;

    let c = fresh().await?;
    let lease = lossy(
        &proxy,
        async move {
            c.create_lease("jobs", "worker", Duration::from_secs(60), HashMap::new())
                .await
        },
        async || !leases(&direct, "jobs").await.is_empty(),
    )
    .await?;
    let all = leases(&direct, "jobs").await;
    assert_eq!(all.len(), 1, "one lease");
    assert_eq!(all[0].lease_id, lease.id(), "the lease created");

    let c = fresh().await?;
    let lease = std::sync::Arc::new(lease);
    let l = lease.clone();
    let guard = lossy(
        &proxy,
        async move {
            c.acquire(&l, "jobs", "db", 1, Some(Duration::ZERO), HashMap::new())
                .await
        },
        async || !holders(&direct, "jobs", "db").await.is_empty(),
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("not acquired"))?;
    let now = holders(&direct, "jobs", "db").await;
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].fencing_token, guard.fencing_token(), "the one grant");

    let c = fresh().await?;
    let id = lease.id().to_string();
    lossy(
        &proxy,
        async move { c.release("jobs", "db", &id).await },
        async || holders(&direct, "jobs", "db").await.is_empty(),
    )
    .await?;
    drop(guard); // its own release finds nothing held
    Ok(())
}

async fn holders_or_none(direct: &Grackle) -> Option<()> {
    direct
        .clone()
        .get_semaphore(pb::GetSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db".into(),
        })
        .await
        .ok()
        .map(|_| ())
}

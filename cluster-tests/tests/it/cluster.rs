//! The replicated cluster, end to end: real conchd processes on loopback.

use std::time::{Duration, Instant};

use cluster_tests::ops::{self, acquired};
use cluster_tests::{Cluster, wait_for};
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::{ListSemaphoreWaitersRequest, TriggerSnapshotRequest};
use conch_proto::grackle as pb;

async fn waiters(cluster: &Cluster, id: u64, ns: &str, sem: &str) -> Vec<String> {
    let Ok(channel) = cluster_tests::channel(&cluster.addr(id)).await else {
        return vec![];
    };
    let mut api = ConchApiClient::new(channel);
    match api
        .list_semaphore_waiters(ListSemaphoreWaitersRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
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
async fn every_rpc_answers_the_same_through_every_node() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let mut n1 = cluster.grackle(1).await?;
    let mut n2 = cluster.grackle(2).await?;
    let mut n3 = cluster.grackle(3).await?;

    ops::namespace(&mut n1, "jobs").await?;
    let err = ops::namespace(&mut n2, "jobs")
        .await
        .expect_err("duplicate namespace");
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    ops::semaphore(&mut n2, "jobs", "db", 2).await?;
    let lease = ops::lease(&mut n3, "jobs", 30).await?;
    let r = ops::acquire(&mut n1, "jobs", "db", &lease, 1, 0).await?;
    assert!(acquired(&r), "{r:?}");
    assert!(r.fencing_token > 0);

    for id in 1..=3 {
        let mut c = cluster.grackle(id).await?;
        let ns = c
            .get_namespace(pb::GetNamespaceRequest {
                namespace_name: "jobs".into(),
            })
            .await?
            .into_inner()
            .namespace
            .unwrap_or_default();
        assert_eq!(ns.name, "jobs");
        let sem = c
            .get_semaphore(pb::GetSemaphoreRequest {
                namespace_name: "jobs".into(),
                semaphore_name: "db".into(),
            })
            .await?
            .into_inner()
            .semaphore
            .unwrap_or_default();
        assert_eq!(
            (sem.permits, sem.active_holds, sem.active_holders_count),
            (2, 1, 1),
            "node {id}"
        );
        let holders = ops::holders(&mut c, "jobs", "db").await?;
        assert_eq!(holders.len(), 1, "node {id}");
        assert_eq!(holders[0].lease_id, lease);
        assert_eq!(holders[0].fencing_token, r.fencing_token);
        let leases = c
            .list_semaphore_leases(pb::ListSemaphoreLeasesRequest {
                namespace_name: "jobs".into(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .leases;
        assert_eq!(leases.len(), 1, "node {id}");
        let got = c
            .get_semaphore_lease(pb::GetSemaphoreLeaseRequest {
                namespace_name: "jobs".into(),
                lease_id: lease.clone(),
            })
            .await?
            .into_inner()
            .lease
            .unwrap_or_default();
        assert_eq!(got.lease_id, lease);
        let list = c
            .list_semaphores(pb::ListSemaphoresRequest {
                namespace_name: "jobs".into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        assert_eq!(list.semaphores.len(), 1);
        let namespaces = c
            .list_namespaces(pb::ListNamespacesRequest::default())
            .await?
            .into_inner()
            .namespaces;
        assert_eq!(namespaces.len(), 1);
        let bad = c
            .get_semaphore(pb::GetSemaphoreRequest {
                namespace_name: "jobs".into(),
                semaphore_name: "nope".into(),
            })
            .await
            .expect_err("absent semaphore");
        assert_eq!(bad.code(), tonic::Code::NotFound, "node {id}");
    }

    // Updates, refresh, release, revoke and deletes through different nodes.
    let updated = n2
        .update_namespace(pb::UpdateNamespaceRequest {
            namespace_name: "jobs".into(),
            description: "batch jobs".into(),
            expected_version: 1,
            ..Default::default()
        })
        .await?
        .into_inner()
        .namespace
        .unwrap_or_default();
    assert_eq!(updated.version, 2);
    let mismatch = n3
        .update_semaphore(pb::UpdateSemaphoreRequest {
            namespace_name: "jobs".into(),
            semaphore_name: "db".into(),
            permits: 3,
            expected_version: 7,
            ..Default::default()
        })
        .await
        .expect_err("version mismatch");
    assert_eq!(mismatch.code(), tonic::Code::InvalidArgument);
    assert!(
        mismatch.message().contains("version mismatch"),
        "{}",
        mismatch.message()
    );
    n3.refresh_semaphore_lease(pb::RefreshSemaphoreLeaseRequest {
        namespace_name: "jobs".into(),
        lease_id: lease.clone(),
        ttl_seconds: 0,
    })
    .await?;
    let sem = ops::release(&mut n1, "jobs", "db", &lease).await?;
    assert_eq!(sem.active_holds, 0);
    n2.revoke_semaphore_lease(pb::RevokeSemaphoreLeaseRequest {
        namespace_name: "jobs".into(),
        lease_id: lease.clone(),
    })
    .await?;
    n3.delete_semaphore(pb::DeleteSemaphoreRequest {
        namespace_name: "jobs".into(),
        semaphore_name: "db".into(),
    })
    .await?;
    n1.delete_namespace(pb::DeleteNamespaceRequest {
        namespace_name: "jobs".into(),
    })
    .await?;
    n1.delete_namespace(pb::DeleteNamespaceRequest {
        namespace_name: "jobs".into(),
    })
    .await?;
    cluster.wait_for_agreement(Duration::from_secs(10)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_acquire_is_granted_promptly_after_a_release_on_another_node() -> anyhow::Result<()>
{
    let cluster = Cluster::start(3).await?;
    let mut n1 = cluster.grackle(1).await?;
    let ops::Held { holder, waiter, .. } = ops::held_by_one(&mut n1, "app", "lock", 30, 30).await?;

    let mut n2 = cluster.grackle(2).await?;
    let waiter_lease = waiter.clone();
    let blocked = tokio::spawn(async move {
        let r = ops::acquire(&mut n2, "app", "lock", &waiter_lease, 1, 60).await;
        (r, Instant::now())
    });
    wait_for("the waiter to queue", Duration::from_secs(10), || async {
        waiters(&cluster, 3, "app", "lock")
            .await
            .contains(&waiter)
            .then_some(())
    })
    .await?;

    let mut n3 = cluster.grackle(3).await?;
    let released_at = Instant::now();
    ops::release(&mut n3, "app", "lock", &holder).await?;
    let (reply, granted_at) = blocked.await?;
    let reply = reply?;
    assert!(acquired(&reply), "{reply:?}");
    let handoff = granted_at.duration_since(released_at);
    // The call asked to wait 60 s and came back `ACQUIRED`: the release woke it (a timeout
    // answers without the permit).
    eprintln!("handoff through three nodes: {handoff:?}");
    let holders = ops::holders(&mut n1, "app", "lock").await?;
    assert_eq!(
        holders
            .iter()
            .map(|h| h.lease_id.clone())
            .collect::<Vec<_>>(),
        vec![waiter]
    );
    Ok(())
}

/// A node that stops answers the blocking calls waiting on it (UNAVAILABLE, naming the stop) and
/// their waiters keep their place in the queue, for the client to re-attach elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_answers_its_waiting_calls_and_their_waiters_stay_queued()
-> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let mut n1 = cluster.grackle(1).await?;
    let ops::Held { waiter, .. } = ops::held_by_one(&mut n1, "app", "lock", 60, 60).await?;

    let mut n2 = cluster.grackle(2).await?;
    let waiter_lease = waiter.clone();
    let blocked =
        tokio::spawn(
            async move { ops::acquire(&mut n2, "app", "lock", &waiter_lease, 1, 60).await },
        );
    wait_for("the waiter to queue", Duration::from_secs(10), || async {
        waiters(&cluster, 2, "app", "lock")
            .await
            .contains(&waiter)
            .then_some(())
    })
    .await?;

    cluster.signal(2, nix::sys::signal::Signal::SIGTERM);
    let status = match tokio::time::timeout(Duration::from_secs(30), blocked).await?? {
        Ok(reply) => anyhow::bail!("the waiting call was answered {reply:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("shutting down"),
        "{}",
        status.message()
    );
    assert_eq!(waiters(&cluster, 1, "app", "lock").await, vec![waiter]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_loses_no_acknowledged_write_and_the_node_catches_up() -> anyhow::Result<()> {
    let mut cluster = Cluster::start_with(3, &["--snapshot-every", "50"]).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    let other = cluster
        .running_ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(1);
    let mut c = cluster.grackle(other).await?;
    for i in 0..20 {
        ops::namespace(&mut c, &format!("before-{i}")).await?;
    }

    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(15)).await?;
    assert_ne!(new_leader, leader);
    let mut c = cluster.grackle(new_leader).await?;
    let names: Vec<String> = c
        .list_namespaces(pb::ListNamespacesRequest {
            limit: 250,
            ..Default::default()
        })
        .await?
        .into_inner()
        .namespaces
        .into_iter()
        .map(|n| n.name)
        .collect();
    for i in 0..20 {
        assert!(
            names.contains(&format!("before-{i}")),
            "lost before-{i}: {names:?}"
        );
    }
    // Enough writes while it is down that the log is compacted past the killed node.
    for i in 0..150 {
        ops::namespace(&mut c, &format!("after-{i}")).await?;
    }
    let mut admin = cluster.admin(new_leader).await?;
    let snapshot = admin
        .trigger_snapshot(TriggerSnapshotRequest::default())
        .await?
        .into_inner();
    assert!(snapshot.snapshot_index > 0);

    let new_term = cluster.status(new_leader).await?.term;
    let logged_before_restart = cluster.log(leader).len();
    cluster.restart(leader)?;
    cluster.wait_for_agreement(Duration::from_secs(30)).await?;
    let status = cluster.status(leader).await?;
    assert_eq!(status.namespaces, 170, "restarted node state: {status:?}");
    // The restarted former leader never claims, in its log or its status, the leadership of a
    // term it no longer leads (openraft remembers its own old vote).
    let log = cluster.log(leader);
    for line in log[logged_before_restart..]
        .lines()
        .filter(|l| l.contains("leader elected"))
    {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| {
                    v.trim_matches(|c: char| !c.is_ascii_digit())
                        .parse::<u64>()
                        .ok()
                })
        };
        let (Some(named), Some(term)) = (field("leader="), field("term=")) else {
            panic!("unparsable leader line: {line:?}");
        };
        assert!(
            !(named == leader && term <= new_term),
            "the restarted node logged a stale leadership of its own: {line:?} (node {new_leader} leads term {new_term})"
        );
    }
    assert!(
        status.leader_id != leader || status.state == "Leader",
        "the restarted node names itself leader without leading: {status:?}"
    );
    // The entries it missed were compacted away: it caught up from the leader's snapshot.
    let log = cluster.log(leader);
    assert!(
        log.contains("snapshot installed"),
        "no snapshot install in the log:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_every_namespace_semaphore_lease_holder_and_waiter()
-> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let mut c = cluster.grackle(1).await?;
    let held = ops::held_by_one(&mut c, "keep", "one", 120, 120).await?;
    let (holder, waiter) = (held.holder.clone(), held.waiter.clone());
    let mut c2 = cluster.grackle(2).await?;
    let waiter_lease = waiter.clone();
    // Queue a waiter for long enough to outlive the restart; its call dies with the nodes.
    let queued =
        tokio::spawn(
            async move { ops::acquire(&mut c2, "keep", "one", &waiter_lease, 1, 200).await },
        );
    wait_for("the waiter to queue", Duration::from_secs(10), || async {
        waiters(&cluster, 1, "keep", "one")
            .await
            .contains(&waiter)
            .then_some(())
    })
    .await?;
    let before = cluster.wait_for_agreement(Duration::from_secs(10)).await?;

    for id in 1..=3 {
        cluster.kill(id);
    }
    queued.abort();
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let mut c = cluster.grackle(3).await?;
    let holders = ops::holders(&mut c, "keep", "one").await?;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].lease_id, holder);
    assert_eq!(holders[0].fencing_token, held.fencing_token);
    assert_eq!(waiters(&cluster, 3, "keep", "one").await, vec![waiter]);
    let leases = c
        .list_semaphore_leases(pb::ListSemaphoreLeasesRequest {
            namespace_name: "keep".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .leases;
    assert_eq!(leases.len(), 2);
    let after = cluster.wait_for_agreement(Duration::from_secs(10)).await?;
    assert!(after.0 >= before.0);
    Ok(())
}

/// Every node killed at once right after a burst of writes, then started again: a read on the
/// old leader (which restarts as leader, its vote being on disk, but with an older commit
/// index) and on every other node sees every write that was acknowledged before the kill. The
/// race this guards against (a read served before the restarted leader commits again) is
/// narrow here; the fault run's kill-all faults with many clients are what found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_right_after_a_whole_cluster_restart_see_every_acknowledged_write()
-> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let mut c = cluster.grackle(leader).await?;
    let names: Vec<String> = (0..40).map(|i| format!("burst-{i}")).collect();
    for name in &names {
        c.create_namespace(pb::CreateNamespaceRequest {
            name: name.clone(),
            ..Default::default()
        })
        .await?;
    }
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    for id in [leader]
        .into_iter()
        .chain((1..=3).filter(|&id| id != leader))
    {
        for name in &names {
            let found = wait_for(
                &format!("node {id} to answer for {name}"),
                Duration::from_secs(20),
                || async {
                    let mut c = cluster.grackle(id).await.ok()?;
                    let request = pb::GetNamespaceRequest {
                        namespace_name: name.clone(),
                    };
                    match c.get_namespace(request).await {
                        Ok(_) => Some(Ok(())),
                        // Not serving yet (no leader, catching up): ask again.
                        Err(s) if s.code() == tonic::Code::Unavailable => None,
                        Err(s) => Some(Err(s)),
                    }
                },
            )
            .await?;
            if let Err(s) = found {
                anyhow::bail!(
                    "node {id} answered {name} acknowledged before the restart with {s:?}"
                );
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_keep_serving_with_two_down() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(5).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    // Take down the leader and one follower.
    let follower = cluster
        .running_ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(1);
    cluster.kill(leader);
    cluster.kill(follower);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(15)).await?;
    for id in cluster.running_ids() {
        let mut c = cluster.grackle(id).await?;
        ops::namespace(&mut c, &format!("written-via-{id}")).await?;
    }
    let status = cluster.status(new_leader).await?;
    assert_eq!(status.namespaces, 3);
    cluster.wait_for_agreement(Duration::from_secs(10)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrefreshed_lease_expires_and_its_permits_go_to_the_next_waiter() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let mut c = cluster.grackle(1).await?;
    let ops::Held {
        holder: short,
        waiter: long,
        ..
    } = ops::held_by_one(&mut c, "ttl", "slot", 1, 60).await?;

    let mut c2 = cluster.grackle(2).await?;
    let started = Instant::now();
    let r = ops::acquire(&mut c2, "ttl", "slot", &long, 1, 30).await?;
    assert!(acquired(&r), "{r:?}");
    let waited = started.elapsed();
    // Granted within its 30 s wait (a timeout answers without the permit): the expiry freed it.
    eprintln!("granted after the 1 s lease expired: {waited:?}");
    let gone = c
        .get_semaphore_lease(pb::GetSemaphoreLeaseRequest {
            namespace_name: "ttl".into(),
            lease_id: short.clone(),
        })
        .await
        .expect_err("expired lease");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_as_a_learner_then_votes() -> anyhow::Result<()> {
    use conch_proto::conch::{AddLearnerRequest, ChangeMembershipRequest};

    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    let follower = cluster
        .running_ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(1);
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, "before-join").await?;

    // The new node names the members and itself; with the highest id it does not bootstrap.
    let dir = tempfile::tempdir()?;
    let port = cluster_tests::Port::bind()?;
    let addr = port.addr().to_string();
    let members: Vec<String> = (1..=3)
        .map(|id| format!("{id}={}", cluster.addr(id)))
        .collect();
    let initial = format!("{},4={addr}", members.join(","));
    let data_dir = dir.path().join("node4");
    let data_dir = data_dir.to_string_lossy();
    let _node4 = cluster_tests::Daemon::spawn_on(
        port,
        &[
            "--id",
            "4",
            "--data-dir",
            &data_dir,
            "--initial-cluster",
            &initial,
        ],
        dir.path(),
    )?;

    // Membership changes sent to a follower are carried out by the leader.
    let mut admin = cluster.admin(follower).await?;
    let added = wait_for(
        "node 4 to be added as a learner",
        Duration::from_secs(20),
        || {
            let mut admin = admin.clone();
            let addr = addr.clone();
            async move {
                admin
                    .add_learner(AddLearnerRequest { node_id: 4, addr })
                    .await
                    .ok()
            }
        },
    )
    .await?
    .into_inner();
    assert!(
        added.members.iter().any(|m| m.id == 4 && !m.voter),
        "{added:?}"
    );
    let changed = admin
        .change_membership(ChangeMembershipRequest {
            voters: vec![1, 2, 3, 4],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        changed.members.iter().filter(|m| m.voter).count(),
        4,
        "{changed:?}"
    );

    // The new voter has the old data and serves writes.
    let mut c4 = conch_proto::grackle::grackle_api_client::GrackleApiClient::new(
        cluster_tests::channel(&addr).await?,
    );
    ops::namespace(&mut c4, "after-join").await?;
    let names: Vec<String> = c4
        .list_namespaces(pb::ListNamespacesRequest::default())
        .await?
        .into_inner()
        .namespaces
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(
        names,
        vec!["after-join".to_string(), "before-join".to_string()]
    );

    // The CLI drives the same calls: take node 4 out again, and snapshot.
    let conch = |args: &[&str]| {
        let mut command = tokio::process::Command::new(cluster_tests::binary("conch"));
        command
            .arg("--endpoints")
            .arg(cluster.addr(follower))
            .args(args)
            .kill_on_drop(true);
        command
    };
    let removed = conch(&["cluster", "remove", "4"]).output().await?;
    let stdout = String::from_utf8_lossy(&removed.stdout);
    assert!(
        removed.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.ends_with("voter")).count(),
        3,
        "{stdout}"
    );
    assert!(!stdout.contains("  4  "), "{stdout}");
    let snapshot = conch(&["cluster", "snapshot"]).output().await?;
    assert!(
        snapshot.status.success(),
        "{}",
        String::from_utf8_lossy(&snapshot.stderr)
    );
    assert!(String::from_utf8_lossy(&snapshot.stdout).contains("snapshot at log index"));
    Ok(())
}

/// An ordinary restart of one node is quiet on the others with conchd's default log filter: no
/// ERROR line (openraft logs one per failed retry, twice a second, which the default filter
/// leaves out), and the unreachable peer said in one WARN line per interval, counting the failed
/// calls it stands for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarting_peer_is_one_warning_not_a_stream_of_errors() -> anyhow::Result<()> {
    // conchd's default filter (`DEFAULT_LOG` in daemon/src/config.rs).
    const DEFAULT_LOG: &str = "info,openraft=warn,openraft::replication=off,\
                               openraft::engine::handler::replication_handler=error";
    let mut cluster = Cluster::start_with(3, &["--log", DEFAULT_LOG]).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let down = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader)
        .ok_or_else(|| anyhow::anyhow!("a follower"))?;
    cluster.kill(down);
    let said = format!("node={down}");
    wait_for(
        "the leader to say the peer is unreachable",
        Duration::from_secs(20),
        || async {
            cluster
                .log(leader)
                .lines()
                .any(|l| l.contains("peer unreachable") && l.contains(&said))
                .then_some(())
        },
    )
    .await?;
    // Writes keep committing with two of three, each one a failed append to the node that is
    // down.
    let mut c = cluster.grackle(leader).await?;
    for i in 0..20 {
        ops::namespace(&mut c, &format!("quiet-{i}")).await?;
    }
    cluster.restart(down)?;
    cluster.wait_for_agreement(Duration::from_secs(30)).await?;
    for id in cluster.ids().into_iter().filter(|&id| id != down) {
        let log = cluster.log(id);
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        assert!(errors.is_empty(), "node {id} logged errors: {errors:#?}");
        let warned: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("peer unreachable") && l.contains(&said))
            .collect();
        // One line per 30 s while it lasts: the test is shorter than two intervals.
        assert!(warned.len() <= 2, "node {id}: {warned:#?}");
        assert!(
            warned
                .iter()
                .all(|l| l.contains("failed_calls_since_last_said")),
            "{warned:#?}"
        );
    }
    Ok(())
}

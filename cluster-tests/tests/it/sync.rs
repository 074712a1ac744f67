//! Wait groups and barriers on real clusters: all 16 calls through the leader and through a
//! follower, waiters released by the entry that completes, expires or trips their object,
//! across a leader kill, and the `conch wait-group` / `conch barrier` CLI.
//!
//! No fixed sleeps and no timing assertions: waiters wait with long server-side timeouts (a
//! waiter that was not woken by its object's entry would hold its call for minutes, and the
//! test's own deadline would fail it), and everything else waits on conditions with deadlines.

use std::time::Duration;

use cluster_tests::ops::{self, Grackle};
use cluster_tests::{Cluster, run_conch, unix_nanos_in, wait_for};
use conch_client::{Client, ClientConfig};
use conch_proto::grackle as pb;
use tokio::task::JoinHandle;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(20);
/// A waiter's server-side timeout: far longer than any test may take.
const LONG: i32 = 240;

async fn leader_and_follower(cluster: &Cluster) -> anyhow::Result<(u64, u64)> {
    let leader = cluster.wait_for_leader(WAIT).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .ok_or_else(|| anyhow::anyhow!("no follower"))?;
    Ok((leader, follower))
}

fn create_group(
    ns: &str,
    name: &str,
    counter: i64,
    expires_in: Duration,
) -> pb::CreateWaitGroupRequest {
    pb::CreateWaitGroupRequest {
        namespace_name: ns.into(),
        wait_group_name: name.into(),
        description: "shards".into(),
        counter,
        expires_at: unix_nanos_in(expires_in),
        metadata: [("team".to_string(), "data".to_string())].into(),
        delete_after_finished_seconds: 600,
    }
}

fn jobs(ids: &[&str]) -> Vec<pb::CompleteJobRequest> {
    ids.iter()
        .map(|id| pb::CompleteJobRequest {
            job_id: (*id).into(),
            metadata: Default::default(),
        })
        .collect()
}

fn code<T>(r: Result<T, tonic::Status>) -> Option<Code> {
    r.err().map(|s| s.code())
}

/// A WaitForWaitGroup on `c` with a long timeout, in the background.
fn wait_group_waiter(
    c: &Grackle,
    ns: &str,
    name: &str,
) -> JoinHandle<Result<pb::WaitForWaitGroupResponse, tonic::Status>> {
    let mut c = c.clone();
    let req = pb::WaitForWaitGroupRequest {
        namespace_name: ns.into(),
        wait_group_name: name.into(),
        timeout_seconds: LONG,
    };
    tokio::spawn(async move { c.wait_for_wait_group(req).await.map(|r| r.into_inner()) })
}

fn barrier_waiter(
    c: &Grackle,
    ns: &str,
    name: &str,
    generation: i64,
) -> JoinHandle<Result<pb::WaitAtBarrierResponse, tonic::Status>> {
    let mut c = c.clone();
    let req = pb::WaitAtBarrierRequest {
        namespace_name: ns.into(),
        barrier_name: name.into(),
        expected_generation: generation,
        timeout_seconds: LONG,
    };
    tokio::spawn(async move { c.wait_at_barrier(req).await.map(|r| r.into_inner()) })
}

/// The waiter's answer within the test's deadline.
async fn answer<T>(waiter: JoinHandle<Result<T, tonic::Status>>) -> anyhow::Result<T> {
    Ok(tokio::time::timeout(WAIT, waiter).await???)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_group_call_through_the_leader_and_a_follower() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let (leader, follower) = leader_and_follower(&cluster).await?;
    for target in [leader, follower] {
        let mut c = cluster.grackle(target).await?;
        let ns = format!("wg-{target}");
        ops::namespace(&mut c, &ns).await?;
        let created = c
            .create_wait_group(create_group(&ns, "batch", 3, Duration::from_secs(3600)))
            .await?
            .into_inner()
            .wait_group
            .unwrap_or_default();
        assert_eq!(created.status, pb::WaitGroupStatus::Active as i32);
        assert_eq!(
            (created.counter, created.completed_jobs, created.version),
            (3, 0, 1)
        );
        assert_eq!(created.delete_after_finished_seconds, 600);
        assert_eq!(
            code(
                c.create_wait_group(create_group(&ns, "batch", 3, Duration::from_secs(3600)))
                    .await
            ),
            Some(Code::AlreadyExists)
        );
        assert_eq!(
            code(
                c.create_wait_group(create_group(&ns, "zero", 0, Duration::from_secs(3600)))
                    .await
            ),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            code(
                c.create_wait_group(create_group("absent", "x", 1, Duration::from_secs(3600)))
                    .await
            ),
            Some(Code::NotFound)
        );
        let got = c
            .get_wait_group(pb::GetWaitGroupRequest {
                namespace_name: ns.clone(),
                wait_group_name: "batch".into(),
            })
            .await?
            .into_inner()
            .wait_group;
        assert_eq!(got.as_ref(), Some(&created));
        let listed = c
            .list_wait_groups(pb::ListWaitGroupsRequest {
                namespace_name: ns.clone(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .wait_groups;
        assert_eq!(listed, vec![created.clone()]);

        // Full replacement, guarded by the version.
        let update = |counter: i64, expected_version: i64| pb::UpdateWaitGroupRequest {
            namespace_name: ns.clone(),
            wait_group_name: "batch".into(),
            description: "more shards".into(),
            counter,
            expires_at: created.expires_at,
            metadata: Default::default(),
            expected_version,
            delete_after_finished_seconds: 600,
        };
        assert_eq!(
            code(c.update_wait_group(update(4, 7)).await),
            Some(Code::InvalidArgument)
        );
        let updated = c
            .update_wait_group(update(4, 1))
            .await?
            .into_inner()
            .wait_group
            .unwrap_or_default();
        assert_eq!((updated.counter, updated.version), (4, 2));
        assert!(
            updated.metadata.is_empty(),
            "an update replaces the metadata"
        );

        // A zero timeout answers at once.
        let now = c
            .wait_for_wait_group(pb::WaitForWaitGroupRequest {
                namespace_name: ns.clone(),
                wait_group_name: "batch".into(),
                timeout_seconds: 0,
            })
            .await?
            .into_inner();
        assert_eq!(now.outcome, pb::WaitGroupWaitOutcome::TimedOut as i32);

        // Waiters on every node, released by the completion.
        let mut waiters = Vec::new();
        for id in cluster.ids() {
            waiters.push(wait_group_waiter(&cluster.grackle(id).await?, &ns, "batch"));
        }
        let complete = |ids: &[&str]| pb::CompleteJobsFromWaitGroupRequest {
            namespace_name: ns.clone(),
            wait_group_name: "batch".into(),
            jobs: jobs(ids),
        };
        let wg = c
            .complete_jobs_from_wait_group(complete(&["a", "b", "a"]))
            .await?
            .into_inner()
            .wait_group
            .unwrap_or_default();
        assert_eq!(wg.completed_jobs, 2);
        assert_eq!(
            code(
                c.complete_jobs_from_wait_group(complete(&["c", "d", "e"]))
                    .await
            ),
            Some(Code::InvalidArgument),
            "past the counter: refused whole"
        );
        let wg = c
            .complete_jobs_from_wait_group(complete(&["b", "c", "d"]))
            .await?
            .into_inner()
            .wait_group
            .unwrap_or_default();
        assert_eq!(
            (wg.status, wg.completed_jobs),
            (pb::WaitGroupStatus::Completed as i32, 4)
        );
        assert!(wg.finished_at > 0);
        for waiter in waiters {
            let r = answer(waiter).await?;
            assert_eq!(r.outcome, pb::WaitGroupWaitOutcome::Completed as i32);
            assert_eq!(r.wait_group.map(|w| w.completed_jobs), Some(4));
        }
        let done = c
            .list_wait_group_completed_jobs(pb::ListWaitGroupCompletedJobsRequest {
                namespace_name: ns.clone(),
                wait_group_name: "batch".into(),
                pagination_token: String::new(),
                limit: 2,
            })
            .await?
            .into_inner();
        let ids: Vec<&str> = done.jobs.iter().map(|j| j.job_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(!done.next_pagination_token.is_empty());
        assert_eq!(
            code(c.complete_jobs_from_wait_group(complete(&["z"])).await),
            Some(Code::InvalidArgument)
        );
        assert_eq!(
            code(c.update_wait_group(update(5, 3)).await),
            Some(Code::InvalidArgument)
        );

        c.delete_wait_group(pb::DeleteWaitGroupRequest {
            namespace_name: ns.clone(),
            wait_group_name: "batch".into(),
        })
        .await?;
        assert_eq!(
            code(
                c.get_wait_group(pb::GetWaitGroupRequest {
                    namespace_name: ns.clone(),
                    wait_group_name: "batch".into(),
                })
                .await
            ),
            Some(Code::NotFound)
        );
    }
    Ok(())
}

/// As upstream Grackle: more than 100 000 000 jobs, or an `expires_at` less than a minute
/// ahead, is refused before anything is proposed, on create and on update, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grackle_bounds_on_wait_groups_are_refused_before_proposing() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    let mut c = cluster.grackle(1).await?;
    ops::namespace(&mut c, "bounds").await?;
    for (counter, expires_in, field) in [
        (100_000_001, Duration::from_secs(3600), "counter"),
        (5, Duration::from_secs(50), "expires_at"),
    ] {
        let refused = c
            .create_wait_group(create_group("bounds", "g", counter, expires_in))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(field), "{refused:?}");
        let absent = c
            .get_wait_group(pb::GetWaitGroupRequest {
                namespace_name: "bounds".into(),
                wait_group_name: "g".into(),
            })
            .await
            .expect_err("nothing was made");
        assert_eq!(absent.code(), Code::NotFound, "{absent:?}");
    }
    // The largest group and the nearest expiry that are allowed.
    let made = c
        .create_wait_group(create_group(
            "bounds",
            "g",
            100_000_000,
            Duration::from_secs(70),
        ))
        .await?
        .into_inner()
        .wait_group
        .unwrap_or_default();
    assert_eq!(made.counter, 100_000_000);
    let update = |counter: i64, expires_in: Duration| pb::UpdateWaitGroupRequest {
        namespace_name: "bounds".into(),
        wait_group_name: "g".into(),
        description: String::new(),
        counter,
        expires_at: unix_nanos_in(expires_in),
        delete_after_finished_seconds: made.delete_after_finished_seconds,
        metadata: Default::default(),
        expected_version: made.version,
    };
    for (counter, expires_in) in [
        (100_000_001, Duration::from_secs(3600)),
        (5, Duration::from_secs(10)),
    ] {
        let refused = c
            .update_wait_group(update(counter, expires_in))
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    }
    let kept = c
        .get_wait_group(pb::GetWaitGroupRequest {
            namespace_name: "bounds".into(),
            wait_group_name: "g".into(),
        })
        .await?
        .into_inner()
        .wait_group
        .unwrap_or_default();
    assert_eq!((kept.counter, kept.version), (100_000_000, made.version));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_group_expires_and_its_waiters_learn_it() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let (_, follower) = leader_and_follower(&cluster).await?;
    let mut c = cluster.grackle(follower).await?;
    ops::namespace(&mut c, "exp").await?;
    // The soonest expiry Grackle allows: a minute ahead (and a little, for the way there).
    c.create_wait_group(create_group("exp", "soon", 5, Duration::from_secs(62)))
        .await?;
    // A channel without the harness's 10 s request timeout: this wait lasts a minute.
    let patient = pb::grackle_api_client::GrackleApiClient::new(cluster_tests::net::lazy_channel(
        &cluster.addr(follower),
    )?);
    let waiter = wait_group_waiter(&patient, "exp", "soon");
    let r = tokio::time::timeout(Duration::from_secs(62) + WAIT, waiter).await???;
    assert_eq!(r.outcome, pb::WaitGroupWaitOutcome::Expired as i32);
    let wg = r.wait_group.unwrap_or_default();
    assert_eq!(wg.status, pb::WaitGroupStatus::Expired as i32);
    assert!(wg.finished_at > 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_barrier_call_through_the_leader_and_a_follower() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let (leader, follower) = leader_and_follower(&cluster).await?;
    for target in [leader, follower] {
        let mut c = cluster.grackle(target).await?;
        let ns = format!("b-{target}");
        ops::namespace(&mut c, &ns).await?;
        let create = pb::CreateBarrierRequest {
            namespace_name: ns.clone(),
            barrier_name: "phase".into(),
            description: "end of map".into(),
            expected_processes: 3,
            delete_inactive_after_seconds: 600,
            metadata: Default::default(),
        };
        let b = c
            .create_barrier(create.clone())
            .await?
            .into_inner()
            .barrier
            .unwrap_or_default();
        assert_eq!(
            (b.generation, b.arrived_processes, b.expected_processes),
            (1, 0, 3)
        );
        assert_eq!(
            code(c.create_barrier(create.clone()).await),
            Some(Code::AlreadyExists)
        );
        let mut bad = create.clone();
        bad.delete_inactive_after_seconds = 10;
        assert_eq!(
            code(c.create_barrier(bad).await),
            Some(Code::InvalidArgument)
        );

        let mut waiters = Vec::new();
        for id in cluster.ids() {
            waiters.push(barrier_waiter(&cluster.grackle(id).await?, &ns, "phase", 1));
        }
        let arrive = |who: &str, generation: i64| pb::ArriveAtBarrierRequest {
            namespace_name: ns.clone(),
            barrier_name: "phase".into(),
            process_id: who.into(),
            expected_generation: generation,
            metadata: Default::default(),
        };
        assert!(
            !c.arrive_at_barrier(arrive("p1", 1))
                .await?
                .into_inner()
                .all_arrived
        );
        let again = c.arrive_at_barrier(arrive("p1", 1)).await?.into_inner();
        assert_eq!(
            again.barrier.map(|b| b.arrived_processes),
            Some(1),
            "once per process"
        );
        assert_eq!(
            code(c.arrive_at_barrier(arrive("p2", 2)).await),
            Some(Code::InvalidArgument)
        );
        c.arrive_at_barrier(arrive("p2", 1)).await?;
        let last = c.arrive_at_barrier(arrive("p3", 1)).await?.into_inner();
        assert!(last.all_arrived);
        assert_eq!(
            last.barrier.map(|b| (b.generation, b.arrived_processes)),
            Some((2, 0))
        );
        for waiter in waiters {
            let r = answer(waiter).await?;
            assert_eq!(r.outcome, pb::BarrierWaitOutcome::Tripped as i32);
            assert_eq!(r.barrier.map(|b| b.generation), Some(2));
        }
        let who = c
            .list_barrier_participants(pb::ListBarrierParticipantsRequest {
                namespace_name: ns.clone(),
                barrier_name: "phase".into(),
                generation: 1,
                ..Default::default()
            })
            .await?
            .into_inner()
            .participants;
        let ids: Vec<&str> = who.iter().map(|p| p.process_id.as_str()).collect();
        assert_eq!(ids, ["p1", "p2", "p3"]);

        // Lowering the parties to the arrivals trips generation 2.
        c.arrive_at_barrier(arrive("p1", 2)).await?;
        let waiter = barrier_waiter(&c, &ns, "phase", 2);
        let update = |expected: i64, version: i64| pb::UpdateBarrierRequest {
            namespace_name: ns.clone(),
            barrier_name: "phase".into(),
            description: String::new(),
            expected_processes: expected,
            metadata: Default::default(),
            expected_version: version,
            delete_inactive_after_seconds: 600,
        };
        assert_eq!(
            code(c.update_barrier(update(1, 5)).await),
            Some(Code::InvalidArgument)
        );
        let b = c
            .update_barrier(update(1, 1))
            .await?
            .into_inner()
            .barrier
            .unwrap_or_default();
        assert_eq!((b.generation, b.version, b.expected_processes), (3, 2, 1));
        assert_eq!(
            answer(waiter).await?.outcome,
            pb::BarrierWaitOutcome::Tripped as i32
        );
        // A wait on a generation already tripped answers at once.
        let past = c
            .wait_at_barrier(pb::WaitAtBarrierRequest {
                namespace_name: ns.clone(),
                barrier_name: "phase".into(),
                expected_generation: 1,
                timeout_seconds: 0,
            })
            .await?
            .into_inner();
        assert_eq!(past.outcome, pb::BarrierWaitOutcome::Tripped as i32);
        let now = c
            .wait_at_barrier(pb::WaitAtBarrierRequest {
                namespace_name: ns.clone(),
                barrier_name: "phase".into(),
                expected_generation: 3,
                timeout_seconds: 0,
            })
            .await?
            .into_inner();
        assert_eq!(now.outcome, pb::BarrierWaitOutcome::TimedOut as i32);

        let got = c
            .get_barrier(pb::GetBarrierRequest {
                namespace_name: ns.clone(),
                barrier_name: "phase".into(),
            })
            .await?
            .into_inner()
            .barrier;
        let listed = c
            .list_barriers(pb::ListBarriersRequest {
                namespace_name: ns.clone(),
                ..Default::default()
            })
            .await?
            .into_inner()
            .barriers;
        assert_eq!(got.into_iter().collect::<Vec<_>>(), listed);
        c.delete_barrier(pb::DeleteBarrierRequest {
            namespace_name: ns.clone(),
            barrier_name: "phase".into(),
        })
        .await?;
        assert_eq!(
            code(c.arrive_at_barrier(arrive("p1", 3)).await),
            Some(Code::NotFound)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_released_after_the_leader_is_killed() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let (leader, follower) = leader_and_follower(&cluster).await?;
    let c = cluster.grackle(follower).await?;
    ops::namespace(&mut c.clone(), "ha").await?;
    c.clone()
        .create_wait_group(create_group("ha", "g", 2, Duration::from_secs(3600)))
        .await?;
    c.clone()
        .create_barrier(pb::CreateBarrierRequest {
            namespace_name: "ha".into(),
            barrier_name: "b".into(),
            expected_processes: 2,
            delete_inactive_after_seconds: 600,
            ..Default::default()
        })
        .await?;
    // Waiters on the follower, through the client library: a wait whose first read meets the
    // leader's death answers UNAVAILABLE, and the library asks again.
    let on_follower =
        Client::connect_with([cluster.addr(follower)], ClientConfig::default()).await?;
    let group_waiter = {
        let client = on_follower.clone();
        tokio::spawn(async move {
            client
                .wait_for_wait_group("ha", "g", Duration::from_secs(LONG as u64))
                .await
        })
    };
    let barrier_waiter_ = {
        let client = on_follower.clone();
        tokio::spawn(async move {
            client
                .wait_at_barrier("ha", "b", 1, Duration::from_secs(LONG as u64))
                .await
        })
    };

    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(WAIT).await?;
    assert_ne!(new_leader, leader);

    // Through the client library, which retries with one request id per write.
    let endpoints: Vec<String> = cluster
        .running_ids()
        .iter()
        .map(|id| cluster.addr(*id))
        .collect();
    let client = Client::connect_with(endpoints, ClientConfig::default()).await?;
    client
        .complete_jobs("ha", "g", vec![("j1".into(), Default::default())])
        .await?;
    let wg = client
        .complete_jobs("ha", "g", vec![("j2".into(), Default::default())])
        .await?;
    assert_eq!(wg.status, pb::WaitGroupStatus::Completed as i32);
    client
        .arrive_at_barrier("ha", "b", "p1", 1, Default::default())
        .await?;
    let (b, tripped) = client
        .arrive_at_barrier("ha", "b", "p2", 1, Default::default())
        .await?;
    assert!(tripped);
    assert_eq!(b.generation, 2);

    let (_, outcome) = tokio::time::timeout(WAIT, group_waiter).await???;
    assert_eq!(outcome, pb::WaitGroupWaitOutcome::Completed);
    let (_, outcome) = tokio::time::timeout(WAIT, barrier_waiter_).await???;
    assert_eq!(outcome, pb::BarrierWaitOutcome::Tripped);
    // Every running node agrees.
    for id in cluster.running_ids() {
        let c = cluster.grackle(id).await?;
        let got = wait_for("the group completed on every node", WAIT, || {
            let mut c = c.clone();
            async move {
                c.get_wait_group(pb::GetWaitGroupRequest {
                    namespace_name: "ha".into(),
                    wait_group_name: "g".into(),
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().wait_group)
                .filter(|w| w.status == pb::WaitGroupStatus::Completed as i32)
            }
        })
        .await?;
        assert_eq!(got.completed_jobs, 2);
        let jobs = client.list_completed_jobs("ha", "g").await?;
        assert_eq!(jobs.len(), 2);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_reports_waits_and_meets() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    cluster.wait_for_leader(WAIT).await?;
    let endpoints = cluster.endpoints().join(",");
    let conch = |args: Vec<&'static str>| {
        let endpoints = endpoints.clone();
        async move { run_conch(&endpoints, &args, &[]).await }
    };

    let (code, out, err) = conch(vec![
        "wait-group",
        "create",
        "nightly",
        "--jobs",
        "2",
        "--expires-in",
        "1h",
    ])
    .await?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("nightly  active  0/2 jobs"), "{out}");
    let (code, _, err) = conch(vec!["wait-group", "create", "nightly", "--jobs", "2"]).await?;
    assert_eq!(code, 65, "exists already: {err}");

    // A waiter in the background, released when the second job reports.
    let waiter = tokio::spawn(conch(vec![
        "wait-group",
        "wait",
        "nightly",
        "--timeout",
        "2m",
    ]));
    let (code, out, err) = conch(vec!["wait-group", "done", "nightly", "shard-1"]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1/2 jobs"), "{out}");
    // A failing command reports nothing.
    let (code, _, _) = conch(vec![
        "wait-group",
        "run",
        "nightly",
        "shard-2",
        "--",
        "sh",
        "-c",
        "exit 3",
    ])
    .await?;
    assert_eq!(code, 3, "the command's status");
    let (code, out, _) = conch(vec!["wait-group", "status", "nightly", "--json"]).await?;
    assert_eq!(code, 2, "still active");
    let json: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(json["completed_jobs"], 1);
    let (code, _, err) = conch(vec![
        "wait-group",
        "run",
        "nightly",
        "shard-2",
        "--",
        "true",
    ])
    .await?;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tokio::time::timeout(WAIT, waiter).await???;
    assert_eq!(code, 0, "completed: {out} {err}");
    assert!(out.contains("completed  2/2 jobs"), "{out}");
    let (code, out, _) = conch(vec!["wait-group", "status", "nightly", "--jobs"]).await?;
    assert_eq!(code, 0);
    assert!(out.contains("shard-1") && out.contains("shard-2"), "{out}");
    let (code, _, _) = conch(vec!["wait-group", "done", "nightly", "shard-3"]).await?;
    assert_eq!(code, 64, "a finished group takes no jobs");
    let (code, _, _) = conch(vec!["wait-group", "status", "absent"]).await?;
    assert_eq!(code, 65);
    let (code, _, _) = conch(vec![
        "wait-group",
        "create",
        "short",
        "--jobs",
        "1",
        "--keep",
        "5s",
    ])
    .await?;
    assert_eq!(code, 64, "--keep below a minute");
    conch(vec!["wait-group", "create", "never", "--jobs", "1"]).await?;
    let (code, _, _) = conch(vec!["wait-group", "wait", "never", "--timeout", "1s"]).await?;
    assert_eq!(code, 75, "--timeout passed");

    // A barrier of two: the first party waits, the second trips it; both run their command.
    let (code, _, err) = conch(vec!["barrier", "create", "meet", "--parties", "2"]).await?;
    assert_eq!(code, 0, "{err}");
    let first = tokio::spawn(conch(vec![
        "barrier",
        "wait",
        "meet",
        "--id",
        "a",
        "--timeout",
        "2m",
        "--",
        "sh",
        "-c",
        "echo gen=$CONCH_BARRIER_GENERATION",
    ]));
    wait_for("the first party's arrival", WAIT, || async move {
        let (_, out, _) = conch(vec!["barrier", "wait", "meet", "--who", "--json"])
            .await
            .ok()?;
        let json: serde_json::Value = serde_json::from_str(out.trim()).ok()?;
        (json["arrived"] == serde_json::json!(["a"])).then_some(())
    })
    .await?;
    let (code, out, err) = conch(vec![
        "barrier",
        "wait",
        "meet",
        "--id",
        "b",
        "--",
        "sh",
        "-c",
        "echo gen=$CONCH_BARRIER_GENERATION",
    ])
    .await?;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "gen=1");
    let (code, out, err) = tokio::time::timeout(WAIT, first).await???;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "gen=1");
    let (code, out, _) = conch(vec!["barrier", "wait", "meet", "--who"]).await?;
    assert_eq!(code, 0);
    assert!(
        out.contains("generation 2") && out.contains("(tripped): a b"),
        "{out}"
    );
    let (code, _, _) = conch(vec![
        "barrier",
        "wait",
        "meet",
        "--id",
        "c",
        "--timeout",
        "1s",
    ])
    .await?;
    assert_eq!(code, 75, "the other party never came");
    Ok(())
}

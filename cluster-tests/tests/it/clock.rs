//! Wall-clock steps: every node runs under libfaketime with its wall clock read from a file
//! this test rewrites (`+3600` = one hour ahead), while the monotonic clock stays real. Lease
//! time must follow monotonic time only: a step of any node's wall clock, either way and at any
//! moment, never expires a lease whose holder keeps refreshing, never delays the return of a
//! crashed holder's slot, and never makes two nodes disagree about which leases are alive.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use cluster_tests::ops::{self, Grackle, acquired};
use cluster_tests::{Cluster, PATIENT_LEADER_WAIT, wait_for};
use conch_proto::conch::TransferLeaderRequest;
use conch_proto::grackle as pb;
use tokio::task::JoinHandle;

/// Debian's libfaketime (package `faketime`), installed by `scripts/install-test-deps.sh`.
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
const HOUR: i64 = 3_600;
const NS: &str = "clock";
const SEM: &str = "slot";
/// The holder's TTL; it refreshes every second.
const TTL: Duration = Duration::from_secs(6);

fn offset_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("faketime-node{id}"))
}

/// Starts `n` nodes, each with its wall clock faked from its own offset file (starting at +0),
/// patient enough for the leadership transfers the tests make.
async fn start(n: u64) -> anyhow::Result<Cluster> {
    ensure!(
        Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: install the test dependencies with scripts/install-test-deps.sh \
         (make test runs it)"
    );
    let env = |id: u64, dir: &Path| {
        let file = offset_file(dir, id);
        // The file must exist before the node starts; a failure shows as a wrong offset below.
        let _ = std::fs::write(&file, "+0\n");
        vec![
            ("LD_PRELOAD".to_string(), FAKETIME_LIB.to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".to_string(),
                file.display().to_string(),
            ),
            ("FAKETIME_NO_CACHE".to_string(), "1".to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
        ]
    };
    Cluster::start_with_env(n, &PATIENT_LEADER_WAIT, &env).await
}

/// Steps node `id`'s wall clock to `offset_s` seconds from the real one.
fn step(cluster: &Cluster, id: u64, offset_s: i64) -> anyhow::Result<()> {
    let file = offset_file(cluster.dir(), id);
    std::fs::write(&file, format!("{offset_s:+}\n")).with_context(|| file.display().to_string())
}

fn real_now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

async fn leader(cluster: &Cluster) -> anyhow::Result<u64> {
    cluster.wait_for_leader(Duration::from_secs(30)).await
}

/// Refreshes the holder's lease through node `via`; a node in the middle of a leader change
/// may answer UNAVAILABLE, which is retried, but the lease must never be gone.
async fn refresh(cluster: &Cluster, via: u64, lease: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = cluster.grackle(via).await?;
        let result = c
            .refresh_semaphore_lease(pb::RefreshSemaphoreLeaseRequest {
                namespace_name: NS.into(),
                lease_id: lease.into(),
                ttl_seconds: 0,
            })
            .await;
        match result {
            Ok(_) => return Ok(()),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                ensure!(Instant::now() < deadline, "refresh unavailable: {status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => bail!("refresh of the live holder {lease} failed: {status:?}"),
        }
    }
}

/// A blocking acquire by `lease` through node `via`, in the background: returns when granted
/// (or on an error, or after its 300 s wait). Returns once the waiter is queued.
async fn wait_in_queue(
    cluster: &Cluster,
    via: u64,
    lease: &str,
) -> anyhow::Result<JoinHandle<anyhow::Result<bool>>> {
    let addr = cluster.addr(via);
    let owned = lease.to_string();
    let waiter = tokio::spawn(async move {
        // No per-call deadline: the call waits as long as the acquire does.
        let channel = cluster_tests::net::connect(&addr, Duration::from_secs(2)).await?;
        let reply = ops::acquire(&mut Grackle::new(channel), NS, SEM, &owned, 1, 300).await?;
        Ok(acquired(&reply))
    });
    wait_for(
        "the waiter in the queue",
        Duration::from_secs(30),
        || async {
            let mut c = cluster.grackle(via).await.ok()?;
            let sem = c
                .get_semaphore(pb::GetSemaphoreRequest {
                    namespace_name: NS.into(),
                    semaphore_name: SEM.into(),
                })
                .await
                .ok()?
                .into_inner()
                .semaphore?;
            (sem.waiters_count == 1 || waiter.is_finished()).then_some(())
        },
    )
    .await?;
    ensure!(
        !waiter.is_finished(),
        "the waiter {lease} was answered at once"
    );
    Ok(waiter)
}

/// The holders of the semaphore as node `id` reads them.
async fn holders(cluster: &Cluster, id: u64) -> anyhow::Result<Vec<String>> {
    let mut c = cluster.grackle(id).await?;
    Ok(ops::holders(&mut c, NS, SEM)
        .await?
        .into_iter()
        .map(|h| h.lease_id)
        .collect())
}

/// Keeps `holder` refreshed every second for `duration`, checking each time that it alone
/// holds the slot and that the waiter is still waiting.
async fn hold_for(
    cluster: &Cluster,
    holder: &str,
    waiter: &JoinHandle<anyhow::Result<bool>>,
    duration: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let end = Instant::now() + duration;
    let mut round = 0u64;
    while Instant::now() < end {
        let ids = cluster.ids();
        let via = ids[(round as usize) % ids.len()];
        round += 1;
        // A call may fail while the machine is loaded (a leader that briefly cannot confirm
        // its quorum); a holder retries. It must succeed well within the TTL.
        let seen = wait_for(
            &format!("{what}: a refresh and a read of the holders"),
            TTL / 2,
            || async {
                refresh(cluster, via, holder).await.ok()?;
                let leader = leader(cluster).await.ok()?;
                holders(cluster, leader).await.ok()
            },
        )
        .await?;
        ensure!(
            seen == vec![holder.to_string()],
            "{what}: the refreshed holder {holder} lost its slot; holders {seen:?}"
        );
        ensure!(
            !waiter.is_finished(),
            "{what}: the waiter was answered while the holder kept refreshing"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Every node's reads at one applied index agree about which leases are alive and who holds.
async fn reads_agree(cluster: &Cluster, must_include: &[&str]) -> anyhow::Result<()> {
    wait_for(
        "reads agreeing at one applied index",
        Duration::from_secs(30),
        || async {
            let (index, _) = cluster
                .wait_for_agreement(Duration::from_secs(10))
                .await
                .ok()?;
            let mut views = Vec::new();
            for id in cluster.ids() {
                let mut c = cluster.grackle(id).await.ok()?;
                let leases: BTreeSet<String> = c
                    .list_semaphore_leases(pb::ListSemaphoreLeasesRequest {
                        namespace_name: NS.into(),
                        ..Default::default()
                    })
                    .await
                    .ok()?
                    .into_inner()
                    .leases
                    .into_iter()
                    .map(|l| l.lease_id)
                    .collect();
                views.push((leases, holders(cluster, id).await.ok()?));
            }
            // Only a comparison at one index means anything: try again if a write came between.
            let (after, _) = cluster
                .wait_for_agreement(Duration::from_secs(10))
                .await
                .ok()?;
            (after == index).then_some(views)
        },
    )
    .await
    .and_then(|views| {
        let first = &views[0];
        ensure!(
            views.iter().all(|v| v == first),
            "nodes disagree about live leases: {views:?}"
        );
        for lease in must_include {
            ensure!(
                first.0.contains(*lease),
                "live lease {lease} hidden: {views:?}"
            );
        }
        Ok(())
    })
}

async fn transfer_leader(cluster: &Cluster, to: u64) -> anyhow::Result<()> {
    let from = leader(cluster).await?;
    let mut admin = cluster.admin(from).await?;
    admin
        .transfer_leader(TransferLeaderRequest { to_node_id: to })
        .await?;
    wait_for("the new leader", Duration::from_secs(30), || async {
        (cluster.leader().await == Some(to)).then_some(())
    })
    .await?;
    leader(cluster).await.map(|_| ())
}

/// The slot, a holder that keeps refreshing and a waiter queued behind it, through every kind
/// of wall-clock step: the holder keeps the slot and every node reads the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_never_expire_a_refreshed_lease() -> anyhow::Result<()> {
    let cluster = start(3).await?;
    let result = steps_never_expire(&cluster).await;
    result.map_err(|e| e.context(cluster.logs_tail()))
}

async fn steps_never_expire(cluster: &Cluster) -> anyhow::Result<()> {
    let first_leader = leader(cluster).await?;
    let mut c = cluster.grackle(first_leader).await?;
    ops::namespace(&mut c, NS).await?;
    ops::semaphore(&mut c, NS, SEM, 1).await?;
    let holder = ops::lease(&mut c, NS, TTL.as_secs()).await?;
    ensure!(acquired(
        &ops::acquire(&mut c, NS, SEM, &holder, 1, 0).await?
    ));
    let waiter_lease = ops::lease(&mut c, NS, 300).await?;
    let follower = |leader: u64| cluster.ids().into_iter().find(|id| *id != leader);
    let waiter_node = follower(first_leader).context("a follower")?;
    let waiter = wait_in_queue(cluster, waiter_node, &waiter_lease).await?;
    hold_for(
        cluster,
        &holder,
        &waiter,
        Duration::from_secs(2),
        "baseline",
    )
    .await?;
    let both = [holder.as_str(), waiter_lease.as_str()];

    // The leader's wall clock one hour ahead, mid-term: display times follow it...
    let l = leader(cluster).await?;
    step(cluster, l, HOUR)?;
    let probe = ops::lease(&mut cluster.grackle(l).await?, NS, 1).await?;
    let probe = cluster
        .grackle(l)
        .await?
        .get_semaphore_lease(pb::GetSemaphoreLeaseRequest {
            namespace_name: NS.into(),
            lease_id: probe,
        })
        .await?
        .into_inner()
        .lease
        .unwrap_or_default();
    ensure!(
        probe.created_at / 1_000_000_000 > real_now_s() + HOUR - 600,
        "the leader's faked wall clock is not an hour ahead: created_at {}",
        probe.created_at
    );
    // ...and lease time does not.
    hold_for(cluster, &holder, &waiter, 2 * TTL, "leader +1h").await?;
    reads_agree(cluster, &both).await?;

    // Two hours back, mid-term.
    step(cluster, l, -HOUR)?;
    hold_for(cluster, &holder, &waiter, 2 * TTL, "leader -1h").await?;
    reads_agree(cluster, &both).await?;
    step(cluster, l, 0)?;

    // A follower's wall clock, either way: its reads still show the live holder.
    let f = follower(l).context("a follower")?;
    for offset in [HOUR, -HOUR] {
        step(cluster, f, offset)?;
        hold_for(cluster, &holder, &waiter, TTL, "follower step").await?;
        reads_agree(cluster, &both).await?;
    }
    step(cluster, f, 0)?;

    // A node's wall clock stepped just before it becomes the leader.
    for offset in [HOUR, -HOUR] {
        let l = leader(cluster).await?;
        let next = follower(l).context("a follower")?;
        step(cluster, next, offset)?;
        transfer_leader(cluster, next).await?;
        hold_for(cluster, &holder, &waiter, 2 * TTL, "new leader stepped").await?;
        reads_agree(cluster, &both).await?;
    }

    waiter.abort();
    Ok(())
}

/// A crashed holder's slot comes back within TTL + one failover extension + 1 s whatever the
/// wall clocks say: with the leader's wall clock behind, and after the leader dies with every
/// remaining node's wall clock stepped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_slot_comes_back_in_time_after_clock_steps() -> anyhow::Result<()> {
    let mut cluster = start(3).await?;
    let result = crashed_slot_comes_back(&mut cluster).await;
    result.map_err(|e| e.context(cluster.logs_tail()))
}

async fn crashed_slot_comes_back(cluster: &mut Cluster) -> anyhow::Result<()> {
    let l = leader(cluster).await?;
    let mut c = cluster.grackle(l).await?;
    ops::namespace(&mut c, NS).await?;
    ops::semaphore(&mut c, NS, SEM, 1).await?;

    // 1. The leader's wall clock an hour behind: expiry must not wait for it to catch up.
    step(cluster, l, -HOUR)?;
    let crashed = ops::lease(&mut c, NS, TTL.as_secs()).await?;
    ensure!(acquired(
        &ops::acquire(&mut c, NS, SEM, &crashed, 1, 0).await?
    ));
    let next = ops::lease(&mut c, NS, 300).await?;
    let via = cluster
        .ids()
        .into_iter()
        .find(|id| *id != l)
        .context("a follower")?;
    let waiter = wait_in_queue(cluster, via, &next).await?;
    refresh(cluster, l, &crashed).await?;
    let last_refresh = Instant::now();
    // The holder "crashes": no more refreshes.
    ensure!(
        waiter.await??,
        "the waiter was not granted the crashed holder's slot"
    );
    let took = last_refresh.elapsed();
    ensure!(
        took <= 2 * TTL + Duration::from_secs(1),
        "the slot came back after {took:?} (TTL {TTL:?})"
    );
    ensure!(holders(cluster, l).await? == vec![next.clone()]);
    ops::release(&mut c, NS, SEM, &next).await?;

    // 2. The holder and the leader crash together; the other nodes' wall clocks are stepped
    //    one hour each way, so whichever takes over has a wrong wall clock.
    let crashed = ops::lease(&mut c, NS, TTL.as_secs()).await?;
    ensure!(acquired(
        &ops::acquire(&mut c, NS, SEM, &crashed, 1, 0).await?
    ));
    let others: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != l).collect();
    step(cluster, others[0], HOUR)?;
    step(cluster, others[1], -HOUR)?;
    let next = ops::lease(&mut c, NS, 300).await?;
    let waiter = wait_in_queue(cluster, others[0], &next).await?;
    refresh(cluster, l, &crashed).await?;
    let last_refresh = Instant::now();
    cluster.kill(l);
    let new_leader = leader(cluster).await?;
    let election = last_refresh.elapsed();
    ensure!(
        waiter.await??,
        "the waiter was not granted the crashed holder's slot"
    );
    let took = last_refresh.elapsed();
    ensure!(
        took <= election + 2 * TTL + Duration::from_secs(1),
        "the slot came back after {took:?} (election {election:?}, TTL {TTL:?})"
    );
    ensure!(holders(cluster, new_leader).await? == vec![next.clone()]);
    Ok(())
}

/// Wait group expiry and barrier deletion follow the lease clock: every node's wall clock
/// stepped two hours ahead (past the group's `expires_at` and the barrier's inactivity window)
/// and later two hours back expires and deletes nothing. Each check follows a write, so the
/// reaping that would have done it ran after the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_never_expire_a_wait_group_or_delete_a_barrier() -> anyhow::Result<()> {
    let cluster = start(3).await?;
    let first = leader(&cluster).await?;
    let mut c = cluster.grackle(first).await?;
    ops::namespace(&mut c, NS).await?;
    let in_an_hour = (real_now_s() + HOUR) * 1_000_000_000;
    c.create_wait_group(pb::CreateWaitGroupRequest {
        namespace_name: NS.into(),
        wait_group_name: "g".into(),
        counter: 10,
        expires_at: in_an_hour,
        delete_after_finished_seconds: 60,
        ..Default::default()
    })
    .await?;
    c.create_barrier(pb::CreateBarrierRequest {
        namespace_name: NS.into(),
        barrier_name: "b".into(),
        expected_processes: 10,
        delete_inactive_after_seconds: 60,
        ..Default::default()
    })
    .await?;
    for (round, offset) in [(1, 2 * HOUR), (2, -2 * HOUR)] {
        for id in cluster.ids() {
            step(&cluster, id, offset)?;
        }
        let now_leader = leader(&cluster).await?;
        let mut c = cluster.grackle(now_leader).await?;
        let wg = c
            .complete_jobs_from_wait_group(pb::CompleteJobsFromWaitGroupRequest {
                namespace_name: NS.into(),
                wait_group_name: "g".into(),
                jobs: vec![pb::CompleteJobRequest {
                    job_id: format!("job-{round}"),
                    metadata: Default::default(),
                }],
            })
            .await?
            .into_inner()
            .wait_group
            .unwrap_or_default();
        ensure!(
            wg.status == pb::WaitGroupStatus::Active as i32,
            "round {round}: the group is {wg:?}"
        );
        let b = c
            .arrive_at_barrier(pb::ArriveAtBarrierRequest {
                namespace_name: NS.into(),
                barrier_name: "b".into(),
                process_id: format!("p{round}"),
                expected_generation: 1,
                metadata: Default::default(),
            })
            .await?
            .into_inner();
        ensure!(
            b.barrier.is_some_and(|b| b.arrived_processes == round),
            "round {round}: the barrier kept its arrivals"
        );
    }
    Ok(())
}

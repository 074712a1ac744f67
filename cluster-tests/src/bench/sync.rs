//! S1-S3: wait groups and barriers.
//!
//! - **S1**: a barrier of 64 parties dealt over the three nodes. Per round, 63 parties arrive and
//!   park in `WaitAtBarrier`; once every one of them is parked (the nodes' `conch_waiting_calls`
//!   say so), the 64th arrives. Measured: the time from sending the last arrival to the last of
//!   the 63 waiters released (`p50_ms`/`p99_ms` over the rounds), and each waiter's own release
//!   time from the same instant (`waiter_p99_ms`).
//! - **S2**: a wait group with 1 000 waiters dealt over the three nodes (16 connections per
//!   node). Per round, a fresh group of counter 1 gets its 1 000 parked waiters, then its one
//!   job is completed through the leader. Measured: the time from sending the completion to
//!   each waiter's release (`p50_ms`/`p99_ms` over every waiter of every round) and to the last
//!   waiter of a round (`last_p99_ms`).
//! - **S3**: a wait group of 100 000 jobs, reported 50 per call: memory of each node before and
//!   after, the snapshot's size and the time to take it on every node, the data directory, and
//!   the time to report the jobs.
//!
//! Parked waiters are seen through each node's metrics, so these workloads need a cluster
//! started by conch-bench (not `--endpoints`).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::conch::TriggerSnapshotRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::grackle as pb;
use tokio::task::JoinSet;

use crate::net::{Grackle, connect};
use crate::scrape::scrape;
use crate::{Cluster, unix_nanos_in};

use super::stats::{Latencies, Row, round1};
use super::{Target, batched, check_setup, dir_bytes, rss_mb, secs};

/// Parties of S1's barrier.
pub const S1_PARTIES: usize = 64;
/// Rounds (generations) of S1.
pub const S1_ROUNDS: i64 = 100;
/// Waiters per S2 round.
pub const S2_WAITERS: usize = 1_000;
/// Rounds (groups) of S2.
pub const S2_ROUNDS: usize = 5;
/// Jobs of S3's wait group.
pub const S3_JOBS: usize = 100_000;

/// Connections per node that the waiters of S1 and S2 share.
const CONNECTIONS_PER_NODE: usize = 16;
/// Server-side timeout of every wait: far longer than a run.
const WAIT_TIMEOUT_S: i32 = 300;
/// How long the parked waiters may take to be seen parked.
const PARK_DEADLINE: Duration = Duration::from_secs(60);

/// `CONNECTIONS_PER_NODE` clients to every node, node by node in turn, so that client `i` is
/// on node `i % nodes`.
async fn spread_clients(target: &Target) -> anyhow::Result<Vec<Grackle>> {
    let mut per_node = Vec::new();
    for addr in &target.endpoints {
        per_node.push(target.clients(addr, CONNECTIONS_PER_NODE).await?);
    }
    let mut out = Vec::new();
    for i in 0..CONNECTIONS_PER_NODE {
        for node in &per_node {
            out.push(node[i].clone());
        }
    }
    Ok(out)
}

/// Waits until the nodes together hold at least `n` waiting calls.
async fn parked(cluster: &Cluster, n: usize) -> anyhow::Result<()> {
    let addrs: Vec<String> = cluster
        .ids()
        .into_iter()
        .map(|id| {
            cluster
                .metrics_addr(id)
                .with_context(|| format!("node {id} announced no metrics address"))
        })
        .collect::<anyhow::Result<_>>()?;
    crate::wait_for("the waiters to park", PARK_DEADLINE, || {
        let addrs = addrs.clone();
        async move {
            let mut total = 0.0;
            for addr in &addrs {
                total += scrape(addr).await.ok()?.value("conch_waiting_calls");
            }
            (total >= n as f64).then_some(())
        }
    })
    .await
}

/// Collects the waiters' answers: the instant each was released, failing on any error.
async fn released(mut waiters: JoinSet<anyhow::Result<Instant>>) -> anyhow::Result<Vec<Instant>> {
    let mut out = Vec::new();
    while let Some(joined) = tokio::time::timeout(PARK_DEADLINE, waiters.join_next())
        .await
        .context("a waiter was not released within 60 s")?
    {
        out.push(joined.context("waiter task")??);
    }
    Ok(out)
}

/// S1 with `parties` parties (at least 2) over `rounds` generations.
pub async fn s1(target: &Target, parties: usize, rounds: i64) -> anyhow::Result<Row> {
    if parties < 2 {
        bail!("S1 needs at least 2 parties");
    }
    let cluster = target
        .cluster
        .as_ref()
        .context("S1 needs a cluster started by conch-bench (no --endpoints)")?;
    let clients = spread_clients(target).await?;
    let ns = target.ns.clone();
    let barrier = "s1".to_string();
    clients[0]
        .clone()
        .create_barrier(pb::CreateBarrierRequest {
            namespace_name: ns.clone(),
            barrier_name: barrier.clone(),
            expected_processes: parties as i64,
            delete_inactive_after_seconds: 3_600,
            ..Default::default()
        })
        .await
        .context("create the barrier")?;
    let arrive = |c: &Grackle, party: usize, generation: i64| {
        let mut c = c.clone();
        let request = pb::ArriveAtBarrierRequest {
            namespace_name: ns.clone(),
            barrier_name: barrier.clone(),
            process_id: format!("p{party}"),
            expected_generation: generation,
            metadata: Default::default(),
        };
        async move { c.arrive_at_barrier(request).await.map(|_| ()) }
    };
    let mut last_waiter = Latencies::default();
    let mut each_waiter = Latencies::default();
    let mut arrive_ack = Latencies::default();
    for generation in 1..=rounds {
        let early = parties - 1;
        let results = batched(early, early, |p| {
            arrive(&clients[p % clients.len()], p, generation)
        })
        .await;
        check_setup("the early arrivals", results)?;
        let mut waiters = JoinSet::new();
        for p in 0..early {
            let mut c = clients[p % clients.len()].clone();
            let request = pb::WaitAtBarrierRequest {
                namespace_name: ns.clone(),
                barrier_name: barrier.clone(),
                expected_generation: generation,
                timeout_seconds: WAIT_TIMEOUT_S,
            };
            waiters.spawn(async move {
                let r = c.wait_at_barrier(request).await?.into_inner();
                let at = Instant::now();
                if r.outcome != pb::BarrierWaitOutcome::Tripped as i32 {
                    bail!("a waiter was released with outcome {}", r.outcome);
                }
                Ok(at)
            });
        }
        parked(cluster, early).await?;
        let sent = Instant::now();
        arrive(&clients[early % clients.len()], early, generation)
            .await
            .context("the last arrival")?;
        arrive_ack.push(sent.elapsed());
        let times = released(waiters).await?;
        for t in &times {
            each_waiter.push(t.saturating_duration_since(sent));
        }
        if let Some(last) = times.iter().max() {
            last_waiter.push(last.saturating_duration_since(sent));
        }
    }
    let mut row = Row::new("S1", parties as u64);
    row.set("rounds", rounds);
    row.opt("p50_ms", last_waiter.pct_ms(50.0));
    row.opt("p99_ms", last_waiter.pct_ms(99.0));
    row.opt("max_ms", last_waiter.pct_ms(100.0));
    row.opt("waiter_p50_ms", each_waiter.pct_ms(50.0));
    row.opt("waiter_p99_ms", each_waiter.pct_ms(99.0));
    row.opt("last_arrival_ack_p50_ms", arrive_ack.pct_ms(50.0));
    Ok(row)
}

/// S2 with `waiters` waiters per group over `rounds` groups.
pub async fn s2(target: &Target, waiters: usize, rounds: usize) -> anyhow::Result<Row> {
    let cluster = target
        .cluster
        .as_ref()
        .context("S2 needs a cluster started by conch-bench (no --endpoints)")?;
    let clients = spread_clients(target).await?;
    let leader = target.leader().await?;
    let mut on_leader = target.clients(&leader.addr, 1).await?;
    let mut completer = on_leader.pop().context("a client on the leader")?;
    let ns = target.ns.clone();
    let mut each_waiter = Latencies::default();
    let mut last_waiter = Latencies::default();
    for round in 0..rounds {
        let group = format!("s2-{round}");
        completer
            .create_wait_group(pb::CreateWaitGroupRequest {
                namespace_name: ns.clone(),
                wait_group_name: group.clone(),
                counter: 1,
                expires_at: unix_nanos_in(Duration::from_secs(3_600)),
                delete_after_finished_seconds: 600,
                ..Default::default()
            })
            .await
            .with_context(|| format!("create wait group {group}"))?;
        let mut parked_waiters = JoinSet::new();
        for w in 0..waiters {
            let mut c = clients[w % clients.len()].clone();
            let request = pb::WaitForWaitGroupRequest {
                namespace_name: ns.clone(),
                wait_group_name: group.clone(),
                timeout_seconds: WAIT_TIMEOUT_S,
            };
            parked_waiters.spawn(async move {
                let r = c.wait_for_wait_group(request).await?.into_inner();
                let at = Instant::now();
                if r.outcome != pb::WaitGroupWaitOutcome::Completed as i32 {
                    bail!("a waiter was released with outcome {}", r.outcome);
                }
                Ok(at)
            });
        }
        parked(cluster, waiters).await?;
        let sent = Instant::now();
        completer
            .complete_jobs_from_wait_group(pb::CompleteJobsFromWaitGroupRequest {
                namespace_name: ns.clone(),
                wait_group_name: group.clone(),
                jobs: vec![pb::CompleteJobRequest {
                    job_id: "the-job".into(),
                    metadata: Default::default(),
                }],
            })
            .await
            .with_context(|| format!("complete the job of {group}"))?;
        let times = released(parked_waiters).await?;
        if times.len() != waiters {
            bail!("{} of {waiters} waiters answered", times.len());
        }
        for t in &times {
            each_waiter.push(t.saturating_duration_since(sent));
        }
        if let Some(last) = times.iter().max() {
            last_waiter.push(last.saturating_duration_since(sent));
        }
    }
    let mut row = Row::new("S2", waiters as u64);
    row.set("rounds", rounds);
    row.opt("p50_ms", each_waiter.pct_ms(50.0));
    row.opt("p99_ms", each_waiter.pct_ms(99.0));
    row.opt("last_p50_ms", last_waiter.pct_ms(50.0));
    row.opt("last_p99_ms", last_waiter.pct_ms(99.0));
    Ok(row)
}

fn mb(bytes: u64) -> f64 {
    round1(bytes as f64 / (1024.0 * 1024.0))
}

/// Resident memory of every node, in node order.
fn rss_of(cluster: &Cluster) -> anyhow::Result<Vec<f64>> {
    cluster
        .nodes
        .values()
        .map(|n| rss_mb(n.pid().context("a node is not running")?))
        .collect()
}

/// S3 with a group of `jobs` jobs.
pub async fn s3(target: &mut Target, jobs: usize) -> anyhow::Result<Row> {
    const PER_CALL: usize = 50;
    const IN_FLIGHT: usize = 32;
    let leader = target.leader().await?;
    let pool = target.clients(&leader.addr, 8).await?;
    let ns = target.ns.clone();
    let group = "s3".to_string();
    pool[0]
        .clone()
        .create_wait_group(pb::CreateWaitGroupRequest {
            namespace_name: ns.clone(),
            wait_group_name: group.clone(),
            counter: jobs as i64,
            expires_at: unix_nanos_in(Duration::from_secs(3_600)),
            delete_after_finished_seconds: 600,
            ..Default::default()
        })
        .await
        .context("create the wait group")?;
    let cluster = target.cluster_mut()?;
    cluster
        .wait_for_agreement(Duration::from_secs(60))
        .await
        .context("nodes agree before the jobs")?;
    let rss_before = rss_of(cluster)?;

    let calls = jobs.div_ceil(PER_CALL);
    let started = Instant::now();
    let results = batched(calls, IN_FLIGHT, |call| {
        let mut c = pool[call % pool.len()].clone();
        let reported = (call * PER_CALL..((call + 1) * PER_CALL).min(jobs))
            .map(|j| pb::CompleteJobRequest {
                job_id: format!("job-{j:06}"),
                metadata: Default::default(),
            })
            .collect();
        let request = pb::CompleteJobsFromWaitGroupRequest {
            namespace_name: ns.clone(),
            wait_group_name: group.clone(),
            jobs: reported,
        };
        async move { c.complete_jobs_from_wait_group(request).await.map(|_| ()) }
    })
    .await;
    check_setup("report the jobs", results)?;
    let report_s = secs(started.elapsed());
    let got = pool[0]
        .clone()
        .get_wait_group(pb::GetWaitGroupRequest {
            namespace_name: ns.clone(),
            wait_group_name: group.clone(),
        })
        .await
        .context("get the wait group")?
        .into_inner()
        .wait_group
        .context("no wait group in the answer")?;
    if got.completed_jobs != jobs as i64 {
        bail!(
            "the group counts {} completed jobs, not {jobs}",
            got.completed_jobs
        );
    }

    let cluster = target.cluster_mut()?;
    cluster
        .wait_for_agreement(Duration::from_secs(60))
        .await
        .context("nodes agree after the jobs")?;
    let rss_after = rss_of(cluster)?;
    let mut snapshot_ms = Vec::new();
    let mut snapshot_bytes = 0;
    for id in cluster.ids() {
        let channel = connect(&cluster.addr(id), Duration::from_secs(1)).await?;
        let mut admin = ConchAdminClient::new(channel);
        let t = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(60),
            admin.trigger_snapshot(TriggerSnapshotRequest::default()),
        )
        .await
        .context("a snapshot did not finish within 60 s")?
        .with_context(|| format!("trigger a snapshot on node {id}"))?;
        snapshot_ms.push(round1(secs(t.elapsed()) * 1000.0));
        if let Some(node) = cluster.nodes.get(&id) {
            snapshot_bytes = snapshot_bytes.max(dir_bytes(&node.data_dir.join("snapshots")));
        }
    }
    let data_dir_mb: Vec<f64> = cluster
        .nodes
        .values()
        .map(|n| mb(dir_bytes(&n.data_dir)))
        .collect();
    let growth: Vec<f64> = rss_after
        .iter()
        .zip(&rss_before)
        .map(|(after, before)| round1(after - before))
        .collect();
    let most_growth = growth.iter().copied().fold(0.0, f64::max);

    let mut row = Row::new("S3", IN_FLIGHT as u64);
    row.set("jobs", jobs);
    row.set("rss_mb", rss_after.iter().copied().fold(0.0, f64::max));
    row.set("rss_mb_nodes", rss_after);
    row.set("rss_growth_mb_nodes", growth);
    row.set(
        "rss_bytes_per_job",
        round1(most_growth * 1024.0 * 1024.0 / jobs as f64),
    );
    row.set("snapshot_mb", mb(snapshot_bytes));
    row.set(
        "snapshot_bytes_per_job",
        round1(snapshot_bytes as f64 / jobs as f64),
    );
    row.set("snapshot_ms", snapshot_ms);
    row.set("data_dir_mb", data_dir_mb);
    row.set("report_s", round1(report_s));
    row.set("jobs_per_s", round1(jobs as f64 / report_s.max(1e-9)));
    Ok(row)
}

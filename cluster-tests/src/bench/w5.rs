//! W5: scale. `leases` leases and `semaphores` semaphores (permits 1), each semaphore with one
//! holder and, for the first `waiters` semaphores, one waiter whose blocking acquire (timeout
//! 300 s) stays open while we measure. The other leases hold nothing. All leases have TTL 300 s,
//! so nothing expires during the run.
//!
//! Measured: resident memory of each node (`VmRSS`), the snapshot size after `TriggerSnapshot`
//! on every node, and the restart of a follower after kill -9: time from spawning it until its
//! `ClusterStatus` shows it applied as far as the leader and a linearizable read through it
//! (`GetSemaphore`) succeeds.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::conch::TriggerSnapshotRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::grackle as pb;

use crate::net::{connect, status};

use super::stats::{Row, round1};
use super::{Opts, Target, batched, check_setup, create_leases, dir_bytes, rss_mb, secs};

const IN_FLIGHT: usize = 256;
const TTL_S: u64 = 300;

fn mb(bytes: u64) -> f64 {
    round1(bytes as f64 / (1024.0 * 1024.0))
}

pub async fn run(target: &mut Target, opts: &Opts) -> anyhow::Result<Row> {
    let (n_leases, n_sems) = (opts.w5_leases, opts.w5_semaphores);
    let n_waiters = opts
        .w5_waiters
        .min(n_sems)
        .min(n_leases.saturating_sub(n_sems));
    if n_leases < n_sems {
        bail!("W5 needs at least as many leases as semaphores");
    }
    target.cluster_mut()?;
    let leader = target.leader().await?;
    let pool = target.clients(&leader.addr, 16).await?;
    let ns = target.ns.clone();
    let setup_start = Instant::now();

    let results = batched(n_sems, IN_FLIGHT, |i| {
        let mut c = pool[i % pool.len()].clone();
        let ns = ns.clone();
        async move {
            c.create_semaphore(pb::CreateSemaphoreRequest {
                namespace_name: ns,
                semaphore_name: format!("s{i}"),
                permits: 1,
                ..Default::default()
            })
            .await
            .map(|_| ())
        }
    })
    .await;
    check_setup("create semaphores", results)?;
    let semaphores_s = secs(setup_start.elapsed());

    let t = Instant::now();
    let leases = create_leases(
        &pool,
        &ns,
        n_leases,
        IN_FLIGHT,
        TTL_S,
        |i| format!("w5-{}", i % 1000),
        "create leases",
    )
    .await?;
    let leases_s = secs(t.elapsed());

    let t = Instant::now();
    let results = batched(n_sems, IN_FLIGHT, |i| {
        let mut c = pool[i % pool.len()].clone();
        let ns = ns.clone();
        let lease = leases[i].clone();
        async move {
            let r = c
                .acquire_semaphore(pb::AcquireSemaphoreRequest {
                    namespace_name: ns,
                    semaphore_name: format!("s{i}"),
                    lease_id: lease,
                    weight: 1,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if r.outcome != pb::AcquireOutcome::Acquired as i32 {
                return Err(tonic::Status::failed_precondition(format!(
                    "holder not granted: outcome {}",
                    r.outcome
                )));
            }
            Ok(())
        }
    })
    .await;
    check_setup("acquire holders", results)?;
    let holders_s = secs(t.elapsed());

    // Waiters: blocking acquires that stay open, spread over their own connections.
    let t = Instant::now();
    let waiter_pool = target.clients(&leader.addr, 64).await?;
    let mut waiters = Vec::with_capacity(n_waiters);
    for i in 0..n_waiters {
        let mut c = waiter_pool[i % waiter_pool.len()].clone();
        let request = pb::AcquireSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: format!("s{i}"),
            lease_id: leases[n_sems + i].clone(),
            weight: 1,
            timeout_ms: TTL_S * 1000,
            ..Default::default()
        };
        waiters.push(tokio::spawn(async move {
            c.acquire_semaphore(request)
                .await
                .map(|r| r.into_inner().outcome)
        }));
    }
    let queued = crate::wait_for("all waiters queued", Duration::from_secs(120), || {
        let addr = leader.addr.clone();
        async move {
            status(&addr)
                .await
                .ok()
                .filter(|s| s.waiters as usize >= n_waiters)
        }
    })
    .await?;
    let waiters_s = secs(t.elapsed());
    let setup_s = secs(setup_start.elapsed());

    let cluster = target.cluster_mut()?;
    cluster
        .wait_for_agreement(Duration::from_secs(60))
        .await
        .context("nodes agree after setup")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rss = Vec::new();
    for node in cluster.nodes.values() {
        let pid = node.pid().context("node not running")?;
        rss.push(rss_mb(pid)?);
    }

    // Snapshot on every node.
    let mut snapshot_bytes = Vec::new();
    let mut snapshot_ms = Vec::new();
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in &ids {
        let channel = connect(&cluster.addr(*id), Duration::from_secs(1)).await?;
        let mut admin = ConchAdminClient::new(channel);
        let t = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(60),
            admin.trigger_snapshot(TriggerSnapshotRequest::default()),
        )
        .await
        .context("snapshot did not finish within 60 s")?
        .with_context(|| format!("trigger snapshot on node {id}"))?;
        snapshot_ms.push(round1(secs(t.elapsed()) * 1000.0));
        let dir = cluster
            .nodes
            .get(id)
            .map(|n| n.data_dir.join("snapshots"))
            .context("node")?;
        snapshot_bytes.push(dir_bytes(&dir));
    }
    let data_bytes: Vec<u64> = cluster
        .nodes
        .values()
        .map(|n| dir_bytes(&n.data_dir))
        .collect();

    // Restart a follower.
    let leader_now = target.leader().await?;
    let cluster = target.cluster_mut()?;
    let follower = ids
        .iter()
        .copied()
        .find(|id| *id != leader_now.leader_id)
        .context("no follower")?;
    let follower_addr = cluster.addr(follower);
    cluster.kill(follower);
    let restart_start = Instant::now();
    cluster.restart(follower)?;
    let probe_sem = format!("s{}", n_sems.saturating_sub(1));
    let leader_addr = leader_now.addr.clone();
    let ns2 = ns.clone();
    crate::wait_for(
        "the restarted follower to serve",
        Duration::from_secs(120),
        || {
            let (follower_addr, leader_addr, ns, sem) = (
                follower_addr.clone(),
                leader_addr.clone(),
                ns2.clone(),
                probe_sem.clone(),
            );
            async move {
                let here = status(&follower_addr).await.ok()?;
                let lead = status(&leader_addr).await.ok()?;
                if here.applied_index < lead.applied_index {
                    return None;
                }
                let channel = connect(&follower_addr, Duration::from_millis(200))
                    .await
                    .ok()?;
                let mut c = pb::grackle_api_client::GrackleApiClient::new(channel);
                let read = c.get_semaphore(pb::GetSemaphoreRequest {
                    namespace_name: ns,
                    semaphore_name: sem,
                });
                tokio::time::timeout(Duration::from_secs(2), read)
                    .await
                    .ok()?
                    .ok()
                    .map(|_| ())
            }
        },
    )
    .await?;
    let restart_ms = round1(secs(restart_start.elapsed()) * 1000.0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cluster = target.cluster_mut()?;
    let restarted_rss = cluster
        .nodes
        .get(&follower)
        .and_then(|n| n.pid())
        .map(rss_mb)
        .transpose()?;

    let mut still_waiting = 0;
    for w in waiters {
        if !w.is_finished() {
            still_waiting += 1;
        }
        w.abort();
    }

    let mut row = Row::new("W5", n_waiters as u64);
    row.set("rss_mb", rss.iter().copied().fold(0.0, f64::max));
    row.set("rss_mb_nodes", rss);
    row.opt("restarted_rss_mb", restarted_rss);
    row.set("restart_ms", restart_ms);
    row.set(
        "snapshot_mb",
        mb(snapshot_bytes.iter().copied().max().unwrap_or(0)),
    );
    row.set("snapshot_ms", snapshot_ms);
    row.set(
        "data_dir_mb",
        data_bytes.into_iter().map(mb).collect::<Vec<_>>(),
    );
    row.set("leases", queued.leases);
    row.set("semaphores", queued.semaphores);
    row.set("holders", queued.holders);
    row.set("waiters", queued.waiters);
    row.set("waiters_open_at_end", still_waiting);
    row.set("setup_s", round1(setup_s));
    row.set(
        "setup_ops_per_s",
        round1(
            (n_sems as f64 + n_leases as f64 + n_sems as f64 + n_waiters as f64)
                / (semaphores_s + leases_s + holders_s + waiters_s),
        ),
    );
    row.set("restarted_node", follower);
    Ok(row)
}

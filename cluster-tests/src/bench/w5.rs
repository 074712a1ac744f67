//! W5: scale. `leases` leases and `semaphores` semaphores (permits 1), each semaphore with one
//! holder and, for the first `waiters` semaphores, one waiter whose blocking acquire (timeout
//! 300 s) stays open while we measure. The other leases hold nothing. All leases have TTL 300 s,
//! so nothing expires during the run.
//!
//! Measured: resident memory of each node (`VmRSS`), the snapshot size after `TriggerSnapshot`
//! on every node, the data directory of each node (blocks allocated, as `du` counts them), and
//! the restart of a follower after kill -9: time from spawning it until its `ClusterStatus`
//! shows it applied as far as the leader and a linearizable read through it (`GetSemaphore`)
//! succeeds.
//!
//! The cost of each kind of object: every kind is added in a step of its own (namespaces,
//! semaphores, leases, holders, waiters; after the restart, leases with a remembered request id
//! and access-control entries), and around each step every node is measured once all nodes
//! agree: resident memory, the log bytes written (`conch_log_appended_bytes_total`) and, after a
//! snapshot of the leader, the snapshot's size. A step's growth divided by its count is the
//! cost of one object (a `W5 cost` row). Resident memory moves in pages and the allocator keeps
//! freed memory, so a figure is good to a few bytes per object at these counts, not exact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_auth_client::ConchAuthClient;
use conch_proto::conch::{
    RoleCreateRequest, RoleGrantRequest, TokenCreateRequest, TriggerSnapshotRequest,
};
use conch_proto::grackle as pb;

use crate::Cluster;
use crate::net::{connect, status};
use crate::scrape::scrape;

use super::stats::{Row, round1};
use super::{DirSizes, Opts, Target, batched, check_setup, create_leases, dir_sizes, rss_mb, secs};

const IN_FLIGHT: usize = 256;
const TTL_S: u64 = 300;
/// Namespaces added in their own step, to measure one.
const NAMESPACES: usize = 1_000;
/// Leases created with a request id, and access-control entries, in the steps after the restart.
const REQUEST_IDS: usize = 10_000;
const ACL_ENTRIES: usize = 1_000;

/// The W5 targets (3 nodes, 100 000 leases, 10 000 semaphores, holders and waiters).
pub const TARGET_LEADER_RSS_MB: f64 = 120.0;
pub const TARGET_FOLLOWER_RSS_MB: f64 = 90.0;
pub const TARGET_DATA_DIR_MB: f64 = 25.0;
pub const TARGET_RESTART_MS: f64 = 1000.0;

fn mb(bytes: u64) -> f64 {
    round1(bytes as f64 / (1024.0 * 1024.0))
}

/// One node, measured once.
#[derive(Clone, Copy, Debug, Default)]
struct NodeLook {
    rss_kb: u64,
    /// `conch_log_appended_bytes_total` and `conch_log_appended_entries_total`.
    log_bytes: f64,
    log_entries: f64,
}

/// Every running node, measured once, and the leader's snapshot size when one was taken.
#[derive(Clone, Debug, Default)]
struct Look {
    nodes: BTreeMap<u64, NodeLook>,
    snapshot_bytes: Option<u64>,
}

/// `VmRSS` in kB, exactly (`rss_mb` rounds).
fn vm_rss_kb(pid: u32) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS in /proc/<pid>/status")
}

/// Waits until all nodes agree, lets the allocator settle, then measures every node; with
/// `snapshot`, the leader (`leader`) takes a snapshot first and its size is recorded.
async fn look(cluster: &Cluster, leader: u64, snapshot: bool) -> anyhow::Result<Look> {
    cluster
        .wait_for_agreement(Duration::from_secs(60))
        .await
        .context("nodes agree")?;
    let mut out = Look::default();
    if snapshot {
        out.snapshot_bytes = Some(snapshot_node(cluster, leader).await?.0);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (id, node) in &cluster.nodes {
        let Some(pid) = node.pid() else { continue };
        let metrics = match cluster.metrics_addr(*id) {
            Some(addr) => scrape(&addr).await.ok(),
            None => None,
        };
        out.nodes.insert(
            *id,
            NodeLook {
                rss_kb: vm_rss_kb(pid)?,
                log_bytes: metrics
                    .as_ref()
                    .map_or(0.0, |m| m.value("conch_log_appended_bytes_total")),
                log_entries: metrics
                    .as_ref()
                    .map_or(0.0, |m| m.value("conch_log_appended_entries_total")),
            },
        );
    }
    Ok(out)
}

/// Snapshots node `id` now: (size of its snapshot directory, milliseconds taken).
async fn snapshot_node(cluster: &Cluster, id: u64) -> anyhow::Result<(u64, f64)> {
    let channel = connect(&cluster.addr(id), Duration::from_secs(1)).await?;
    let mut admin = ConchAdminClient::new(channel);
    let t = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(60),
        admin.trigger_snapshot(TriggerSnapshotRequest::default()),
    )
    .await
    .context("snapshot did not finish within 60 s")?
    .with_context(|| format!("trigger snapshot on node {id}"))?;
    let ms = round1(secs(t.elapsed()) * 1000.0);
    let dir = cluster
        .nodes
        .get(&id)
        .map(|n| n.data_dir.join("snapshots"))
        .context("node")?;
    Ok((dir_sizes(&dir).allocated, ms))
}

/// The growth between two looks, per object: one `W5 cost` row.
fn cost_row(kind: &str, count: usize, before: &Look, after: &Look, leader: u64) -> Row {
    let per = |x: f64| round1(x / count.max(1) as f64);
    let delta = |id: u64, f: &dyn Fn(&NodeLook) -> f64| -> Option<f64> {
        Some(f(after.nodes.get(&id)?) - f(before.nodes.get(&id)?))
    };
    let rss = |n: &NodeLook| n.rss_kb as f64 * 1024.0;
    let followers: Vec<f64> = after
        .nodes
        .keys()
        .filter(|id| **id != leader)
        .filter_map(|id| delta(*id, &rss))
        .collect();
    let mut row = Row::new("W5 cost", count as u64);
    row.set("object", kind);
    row.opt("leader_bytes", delta(leader, &rss).map(per));
    row.opt(
        "follower_bytes",
        (!followers.is_empty())
            .then(|| per(followers.iter().sum::<f64>() / followers.len() as f64)),
    );
    let log_bytes = delta(leader, &|n| n.log_bytes);
    let log_entries = delta(leader, &|n| n.log_entries);
    row.opt("log_bytes", log_bytes.map(per));
    if let (Some(bytes), Some(entries)) = (log_bytes, log_entries)
        && entries > 0.0
    {
        row.set("log_entries", entries as u64);
        row.set("log_bytes_per_entry", round1(bytes / entries));
    }
    if let (Some(a), Some(b)) = (before.snapshot_bytes, after.snapshot_bytes) {
        row.set("snapshot_bytes", per(b as f64 - a as f64));
    }
    row
}

/// One `W5 target` row: the figure beside its target.
fn target_row(figure: &str, value: f64, target: f64) -> Row {
    let mut row = Row::new("W5 target", 0);
    row.set("figure", figure);
    row.set("value", value);
    row.set("target", format!("<= {target}"));
    row.set("met", if value <= target { "met" } else { "missed" });
    row
}

async fn create_namespaces(
    pool: &[pb::grackle_api_client::GrackleApiClient<crate::net::NodeChannel>],
    n: usize,
) -> anyhow::Result<()> {
    let results = batched(n, IN_FLIGHT, |i| {
        let mut c = pool[i % pool.len()].clone();
        async move {
            c.create_namespace(pb::CreateNamespaceRequest {
                name: format!("w5-ns-{i}"),
                ..Default::default()
            })
            .await
            .map(|_| ())
        }
    })
    .await;
    check_setup("create namespaces", results).map(drop)
}

/// `n` leases in `ns`, each created with a `conch-request-id` (remembered with its reply).
async fn create_leases_with_ids(
    pool: &[pb::grackle_api_client::GrackleApiClient<crate::net::NodeChannel>],
    ns: &str,
    n: usize,
) -> anyhow::Result<()> {
    let results = batched(n, IN_FLIGHT, |i| {
        let mut c = pool[i % pool.len()].clone();
        let mut request = tonic::Request::new(pb::CreateSemaphoreLeaseRequest {
            namespace_name: ns.to_string(),
            process_id: format!("w5-{}", i % 1000),
            ttl_seconds: TTL_S,
            ..Default::default()
        });
        let id = format!("{:032x}", 0x5eed_0000_0000_0000_u128 + i as u128);
        async move {
            let value = id
                .parse()
                .map_err(|_| tonic::Status::internal("request id is not metadata"))?;
            request.metadata_mut().insert("conch-request-id", value);
            c.create_semaphore_lease(request).await.map(|_| ())
        }
    })
    .await;
    check_setup("create leases with request ids", results).map(drop)
}

/// `n` access-control entries: a role with one grant on a namespace, and a token of it.
async fn create_acl_entries(leader: &str, n: usize) -> anyhow::Result<()> {
    let auth = ConchAuthClient::new(connect(leader, Duration::from_secs(1)).await?);
    let results = batched(n, 64, |i| {
        let mut auth = auth.clone();
        async move {
            let role = format!("w5-role-{i}");
            auth.role_create(RoleCreateRequest {
                name: role.clone(),
                cluster_admin: false,
            })
            .await?;
            auth.role_grant(RoleGrantRequest {
                role: role.clone(),
                namespace: format!("w5-ns-{}", i % NAMESPACES),
                permission: "write".into(),
            })
            .await?;
            auth.token_create(TokenCreateRequest {
                name: format!("w5-token-{i}"),
                role,
            })
            .await
            .map(|_| ())
        }
    })
    .await;
    check_setup("create access-control entries", results).map(drop)
}

pub async fn run(target: &mut Target, opts: &Opts) -> anyhow::Result<Vec<Row>> {
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
    let leader_id = leader.leader_id;
    let pool = target.clients(&leader.addr, 16).await?;
    let ns = target.ns.clone();
    let mut costs = Vec::new();
    let mut before = look(target.cluster_mut()?, leader_id, true).await?;
    let base = before.clone();

    create_namespaces(&pool, NAMESPACES).await?;
    let after = look(target.cluster_mut()?, leader_id, true).await?;
    costs.push(cost_row(
        "namespace",
        NAMESPACES,
        &before,
        &after,
        leader_id,
    ));
    before = after;

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
    let after = look(target.cluster_mut()?, leader_id, true).await?;
    costs.push(cost_row("semaphore", n_sems, &before, &after, leader_id));
    before = after;

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
    let after = look(target.cluster_mut()?, leader_id, true).await?;
    costs.push(cost_row("lease", n_leases, &before, &after, leader_id));
    before = after;

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
    let after = look(target.cluster_mut()?, leader_id, true).await?;
    costs.push(cost_row("holder", n_sems, &before, &after, leader_id));
    before = after;

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
    let setup_s = semaphores_s + leases_s + holders_s + waiters_s;

    // The headline figures: memory with everything in place, before any further snapshot.
    let cluster = target.cluster_mut()?;
    let after = look(cluster, leader_id, false).await?;
    let rss: Vec<f64> = after
        .nodes
        .values()
        .map(|n| round1(n.rss_kb as f64 / 1024.0))
        .collect();
    let leader_rss = after
        .nodes
        .get(&leader_id)
        .map(|n| round1(n.rss_kb as f64 / 1024.0));
    let follower_rss = after
        .nodes
        .iter()
        .filter(|(id, _)| **id != leader_id)
        .map(|(_, n)| round1(n.rss_kb as f64 / 1024.0))
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));

    // Snapshot on every node, then the data directories.
    let mut snapshot_bytes = Vec::new();
    let mut snapshot_ms = Vec::new();
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in &ids {
        let (bytes, ms) = snapshot_node(cluster, *id).await?;
        snapshot_bytes.push(bytes);
        snapshot_ms.push(ms);
    }
    let mut after = after;
    after.snapshot_bytes = snapshot_bytes
        .get(ids.iter().position(|id| *id == leader_id).unwrap_or(0))
        .copied();
    costs.push(cost_row("waiter", n_waiters, &before, &after, leader_id));
    let dirs: Vec<DirSizes> = cluster
        .nodes
        .values()
        .map(|n| dir_sizes(&n.data_dir))
        .collect();
    let everything = after.clone();

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

    // Request ids and access-control entries, after the headline figures. The restarted
    // follower starts from a new baseline, so the steps begin with a fresh look.
    // In a namespace of their own: the bench namespace may be at its lease quota's maximum
    // (W5 at 10x holds 1 000 000 leases there).
    let leader_id = leader_now.leader_id;
    let pool = target.clients(&leader_now.addr, 16).await?;
    let extra_ns = "w5-extra".to_string();
    check_setup(
        "create the namespace w5-extra",
        vec![
            pool[0]
                .clone()
                .create_namespace(pb::CreateNamespaceRequest {
                    name: extra_ns.clone(),
                    ..Default::default()
                })
                .await,
        ],
    )?;
    target.lift_quotas_of(&leader_now.addr, &extra_ns).await?;
    let before = look(target.cluster_mut()?, leader_id, true).await?;
    create_leases(
        &pool,
        &extra_ns,
        REQUEST_IDS,
        IN_FLIGHT,
        TTL_S,
        |i| format!("w5-{}", i % 1000),
        "create leases without request ids",
    )
    .await?;
    let middle = look(target.cluster_mut()?, leader_id, true).await?;
    create_leases_with_ids(&pool, &extra_ns, REQUEST_IDS).await?;
    let after = look(target.cluster_mut()?, leader_id, true).await?;
    let plain = cost_row("lease (again)", REQUEST_IDS, &before, &middle, leader_id);
    let with_id = cost_row(
        "lease with request id",
        REQUEST_IDS,
        &middle,
        &after,
        leader_id,
    );
    costs.push(difference("request id", &with_id, &plain));
    let before = after;
    create_acl_entries(&leader_now.addr, ACL_ENTRIES).await?;
    let after = look(target.cluster_mut()?, leader_id, true).await?;
    costs.push(cost_row(
        "access-control entry (role, grant, token)",
        ACL_ENTRIES,
        &before,
        &after,
        leader_id,
    ));

    let mut still_waiting = 0;
    for w in waiters {
        if !w.is_finished() {
            still_waiting += 1;
        }
        w.abort();
    }

    let data_dir_mb: Vec<f64> = dirs.iter().map(|d| mb(d.allocated)).collect();
    let largest_dir = data_dir_mb.iter().copied().fold(0.0, f64::max);
    let mut row = Row::new("W5", n_waiters as u64);
    row.set("rss_mb", rss.iter().copied().fold(0.0, f64::max));
    row.set("rss_mb_nodes", rss);
    row.opt("leader_rss_mb", leader_rss);
    row.opt("follower_rss_mb", follower_rss);
    row.opt("restarted_rss_mb", restarted_rss);
    row.set("restart_ms", restart_ms);
    row.set(
        "snapshot_mb",
        mb(snapshot_bytes.iter().copied().max().unwrap_or(0)),
    );
    row.set("snapshot_ms", snapshot_ms);
    row.set("data_dir_mb", data_dir_mb);
    row.set(
        "data_dir_apparent_mb",
        dirs.iter().map(|d| mb(d.apparent)).collect::<Vec<_>>(),
    );
    row.set(
        "base_rss_mb",
        base.nodes
            .values()
            .map(|n| round1(n.rss_kb as f64 / 1024.0))
            .collect::<Vec<_>>(),
    );
    if let Some(node) = everything.nodes.get(&leader_id) {
        row.set("log_entries", node.log_entries as u64);
    }
    row.set("leases", queued.leases);
    row.set("semaphores", queued.semaphores);
    row.set("holders", queued.holders);
    row.set("waiters", queued.waiters);
    row.set("waiters_open_at_end", still_waiting);
    row.set("setup_s", round1(setup_s));
    row.set(
        "setup_ops_per_s",
        round1((n_sems as f64 + n_leases as f64 + n_sems as f64 + n_waiters as f64) / setup_s),
    );
    row.set("restarted_node", follower);

    let mut rows = vec![row];
    rows.extend(costs);
    if let Some(v) = leader_rss {
        rows.push(target_row("leader RSS MB", v, TARGET_LEADER_RSS_MB));
    }
    if let Some(v) = follower_rss {
        rows.push(target_row("follower RSS MB", v, TARGET_FOLLOWER_RSS_MB));
    }
    rows.push(target_row(
        "data dir MB (largest)",
        largest_dir,
        TARGET_DATA_DIR_MB,
    ));
    rows.push(target_row(
        "restart to serving ms",
        restart_ms,
        TARGET_RESTART_MS,
    ));
    Ok(rows)
}

/// `with` minus `without`, field by field: the cost of what `with` adds to each object.
fn difference(kind: &str, with: &Row, without: &Row) -> Row {
    let mut row = Row::new(
        "W5 cost",
        with.fields
            .get("clients")
            .and_then(|v| v.as_u64())
            .unwrap_or(0),
    );
    row.set("object", kind);
    for key in [
        "leader_bytes",
        "follower_bytes",
        "log_bytes",
        "snapshot_bytes",
    ] {
        let a = with.fields.get(key).and_then(|v| v.as_f64());
        let b = without.fields.get(key).and_then(|v| v.as_f64());
        row.opt(key, a.zip(b).map(|(a, b)| round1(a - b)));
    }
    row
}

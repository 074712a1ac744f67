//! W4: `leases` live leases, each refreshed once a second by the generator.
//!
//! Refresh k is due at `start + k / leases` seconds (lease `k % leases`), so the load is spread
//! evenly over each second; at most 64 refreshes are in flight, over 8 connections to the
//! leader. A refresh that cannot start on time starts late (the held rate then falls short of
//! the target). Latency is measured from the send (p50/p99) and from the due time
//! (`p99_due_ms`, which counts time spent queued behind the in-flight bound).
//!
//! On a cluster this process started, every node's data directory (blocks allocated) is sampled
//! every 5 s through the window: a log that is purged after each snapshot keeps it flat however
//! long the run (`data_dir_mb_first`, `_max`, `_last`: the largest node at each sample).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use conch_proto::grackle as pb;
use tokio::sync::{Mutex, Semaphore};

use super::stats::{Errors, Latencies, Row, round1};
use super::{Opts, Target, create_leases, dir_bytes, secs};

const IN_FLIGHT: usize = 64;
const TTL_S: u64 = 10;

#[derive(Default)]
struct Tally {
    sent: Latencies,
    due: Latencies,
    ok: u64,
    errors: Errors,
}

pub async fn run(target: &Target, opts: &Opts) -> anyhow::Result<Row> {
    let n = opts.w4_leases;
    let leader = target.leader().await?;
    let pool = target.clients(&leader.addr, 8).await?;
    let ns = target.ns.clone();
    let setup_start = Instant::now();
    let leases = Arc::new(
        create_leases(
            &pool,
            &ns,
            n,
            256,
            TTL_S,
            |_| "w4".into(),
            "create W4 leases",
        )
        .await?,
    );
    let setup_s = secs(setup_start.elapsed());

    let t0 = Instant::now();
    let window_start = t0 + opts.warmup;
    let window_end = window_start + opts.duration;
    let total = ((secs(window_end - t0)) * n as f64) as usize;
    let step = Duration::from_secs(1) / n.max(1) as u32;
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let tally = Arc::new(Mutex::new(Tally::default()));

    let sampler = {
        let leader_addr = leader.addr.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(window_start.into()).await;
            let a = crate::net::status(&leader_addr).await;
            tokio::time::sleep_until(window_end.into()).await;
            let b = crate::net::status(&leader_addr).await;
            (a, b)
        })
    };

    let data_dirs: Vec<std::path::PathBuf> = target
        .cluster
        .as_ref()
        .map(|c| c.nodes.values().map(|n| n.data_dir.clone()).collect())
        .unwrap_or_default();
    let disk_sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        if data_dirs.is_empty() {
            return samples;
        }
        tokio::time::sleep_until(window_start.into()).await;
        loop {
            let largest = data_dirs.iter().map(|d| dir_bytes(d)).max().unwrap_or(0);
            samples.push(largest);
            if Instant::now() >= window_end {
                return samples;
            }
            let next = (Instant::now() + Duration::from_secs(5)).min(window_end);
            tokio::time::sleep_until(next.into()).await;
        }
    });

    for k in 0..total {
        let due = t0 + step * k as u32;
        tokio::time::sleep_until(due.into()).await;
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .context("in-flight bound")?;
        let mut c = pool[k % pool.len()].clone();
        let lease = leases[k % n].clone();
        let ns = ns.clone();
        let tally = Arc::clone(&tally);
        tokio::spawn(async move {
            let sent = Instant::now();
            let request = pb::RefreshSemaphoreLeaseRequest {
                namespace_name: ns,
                lease_id: lease,
                ttl_seconds: TTL_S,
            };
            let result =
                tokio::time::timeout(Duration::from_secs(5), c.refresh_semaphore_lease(request))
                    .await;
            let done = Instant::now();
            drop(permit);
            let mut t = tally.lock().await;
            if done < window_start || done > window_end {
                return;
            }
            match result {
                Ok(Ok(_)) => {
                    t.ok += 1;
                    t.sent.push(done - sent);
                    t.due.push(done.saturating_duration_since(due));
                }
                Ok(Err(s)) => t.errors.status(&s),
                Err(_) => t.errors.add("DeadlineExceeded"),
            }
        });
    }
    // Wait for the last refreshes to finish.
    let _ = permits.acquire_many(IN_FLIGHT as u32).await;
    let (a, b) = sampler.await.context("status sampler")?;
    let (a, b) = (
        a.context("leader status at window start")?,
        b.context("leader status at window end")?,
    );
    let entries = b.applied_index.saturating_sub(a.applied_index) as f64;
    let disk = disk_sampler.await.context("disk sampler")?;

    let mut t = tally.lock().await;
    let window = secs(opts.duration);
    let mut row = Row::new("W4", n as u64);
    row.set("refreshes_per_s", round1(t.ok as f64 / window));
    row.set("target_per_s", n as u64);
    row.opt("p50_ms", t.sent.pct_ms(50.0));
    row.opt("p99_ms", t.sent.pct_ms(99.0));
    row.opt("p99_due_ms", t.due.pct_ms(99.0));
    row.set("raft_entries_per_s", round1(entries / window));
    let per_entry = if entries > 0.0 {
        Some(round1(t.ok as f64 / entries))
    } else {
        None
    };
    row.opt("refreshes_per_entry", per_entry);
    let mb = |b: u64| round1(b as f64 / (1024.0 * 1024.0));
    if let (Some(first), Some(last)) = (disk.first(), disk.last()) {
        row.set("data_dir_mb_first", mb(*first));
        row.set(
            "data_dir_mb_max",
            mb(disk.iter().copied().max().unwrap_or(0)),
        );
        row.set("data_dir_mb_last", mb(*last));
        row.set("disk_samples", disk.len());
    }
    row.set("setup_s", round1(setup_s));
    row.set("errors", t.errors.total());
    if t.errors.total() > 0 {
        row.set("error_kinds", t.errors.to_value());
    }
    Ok(row)
}

//! W1 (uncontended acquire+release cycles), W1b (plus lease create and revoke in every cycle)
//! and W3 (W1 at 8 clients while the leader is killed).
//!
//! Every client has its own connection, its own semaphore (permits 1) and, in W1, its own
//! lease. A cycle is a blocking acquire (timeout 5 s; uncontended, so granted at once, as
//! `conch sema` would do it) followed by a release; in W1b it is create lease, acquire,
//! release, revoke lease. Calls go to the leader directly and follow the `conch-leader` hint.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use conch_proto::grackle as pb;

use crate::net::Failover;
use crate::scrape::{Scrape, scrape};

use super::breakdown;
use super::stats::{Errors, Latencies, Row, round1};
use super::{Opts, Placement, Target, batched, check_setup, leader_index, ms_between, secs};

const LEASE_TTL_S: u64 = 60;

#[derive(Clone)]
struct CycleCfg {
    ns: String,
    sem: String,
    /// The client's lease (W1); `None`: create and revoke one in every cycle (W1b).
    lease: Option<String>,
    /// Time every call (`--breakdown`): each is one write.
    time_calls: bool,
}

#[derive(Default)]
struct ClientLog {
    /// (completed at, cycle latency) of every successful cycle.
    done: Vec<(Instant, Duration)>,
    /// (seen at, error) of every failed call.
    errors: Vec<(Instant, String)>,
    redirects: u64,
    /// (completed at, latency) of every successful call, when `time_calls`.
    calls: Vec<(Instant, Duration)>,
}

/// Runs cycles until `stop_at`.
async fn client_loop(mut conn: Failover, cfg: CycleCfg, stop_at: Instant) -> ClientLog {
    let mut log = ClientLog::default();
    while Instant::now() < stop_at {
        let start = Instant::now();
        match cycle(&mut conn, &cfg, &mut log.calls).await {
            Ok(()) => log.done.push((Instant::now(), start.elapsed())),
            Err(e) => {
                log.errors.push((Instant::now(), e));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    log.redirects = conn.redirects;
    log
}

fn code(s: &tonic::Status) -> String {
    format!("{:?}", s.code())
}

/// Runs `call` on `conn`, noting its latency in `calls` when `cfg.time_calls`.
async fn timed<T, F, Fut>(
    conn: &mut Failover,
    cfg: &CycleCfg,
    calls: &mut Vec<(Instant, Duration)>,
    call: F,
) -> Result<T, String>
where
    F: FnOnce(crate::net::Grackle) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let start = Instant::now();
    let reply = conn.call(call).await.map_err(|s| code(&s))?;
    if cfg.time_calls {
        let now = Instant::now();
        calls.push((now, now - start));
    }
    Ok(reply)
}

async fn cycle(
    conn: &mut Failover,
    cfg: &CycleCfg,
    calls: &mut Vec<(Instant, Duration)>,
) -> Result<(), String> {
    let lease = match &cfg.lease {
        Some(lease) => lease.clone(),
        None => {
            let request = pb::CreateSemaphoreLeaseRequest {
                namespace_name: cfg.ns.clone(),
                process_id: "bench".into(),
                ttl_seconds: LEASE_TTL_S,
                ..Default::default()
            };
            let r = timed(conn, cfg, calls, move |mut c| async move {
                c.create_semaphore_lease(request).await
            })
            .await?;
            r.lease
                .map(|l| l.lease_id)
                .ok_or("lease missing in reply")?
        }
    };
    let acquire = pb::AcquireSemaphoreRequest {
        namespace_name: cfg.ns.clone(),
        semaphore_name: cfg.sem.clone(),
        lease_id: lease.clone(),
        weight: 1,
        timeout_ms: 5_000,
        ..Default::default()
    };
    let r = timed(conn, cfg, calls, move |mut c| async move {
        c.acquire_semaphore(acquire).await
    })
    .await?;
    if r.outcome != pb::AcquireOutcome::Acquired as i32 {
        return Err(format!("not acquired (outcome {})", r.outcome));
    }
    let release = pb::ReleaseSemaphoreRequest {
        namespace_name: cfg.ns.clone(),
        semaphore_name: cfg.sem.clone(),
        lease_id: lease.clone(),
    };
    timed(conn, cfg, calls, move |mut c| async move {
        c.release_semaphore(release).await
    })
    .await?;
    if cfg.lease.is_none() {
        let revoke = pb::RevokeSemaphoreLeaseRequest {
            namespace_name: cfg.ns.clone(),
            lease_id: lease,
        };
        timed(conn, cfg, calls, move |mut c| async move {
            c.revoke_semaphore_lease(revoke).await
        })
        .await?;
    }
    Ok(())
}

/// Creates one semaphore (permits 1) and, unless `per_cycle_lease`, one lease per client.
async fn setup(
    target: &Target,
    leader: &str,
    prefix: &str,
    clients: usize,
    per_cycle_lease: bool,
) -> anyhow::Result<Vec<CycleCfg>> {
    let pool = target.clients(leader, 8).await?;
    let ns = target.ns.clone();
    let results = batched(clients, 64, |i| {
        let mut c = pool[i % pool.len()].clone();
        let ns = ns.clone();
        let sem = format!("{prefix}-{i}");
        async move {
            c.create_semaphore(pb::CreateSemaphoreRequest {
                namespace_name: ns.clone(),
                semaphore_name: sem.clone(),
                permits: 1,
                ..Default::default()
            })
            .await?;
            let lease = if per_cycle_lease {
                None
            } else {
                let r = c
                    .create_semaphore_lease(pb::CreateSemaphoreLeaseRequest {
                        namespace_name: ns.clone(),
                        process_id: "bench".into(),
                        ttl_seconds: LEASE_TTL_S,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                Some(r.lease.map(|l| l.lease_id).unwrap_or_default())
            };
            Ok(CycleCfg {
                ns,
                sem,
                lease,
                time_calls: false,
            })
        }
    })
    .await;
    check_setup("create semaphores and leases", results)
}

/// One W1 / W1b run: `clients` clients for warm-up + duration.
pub async fn run(
    target: &Target,
    opts: &Opts,
    clients: usize,
    per_cycle_lease: bool,
    placement: Placement,
) -> anyhow::Result<Row> {
    let workload = if per_cycle_lease { "W1b" } else { "W1" };
    let before = target.leader().await?;
    let prefix = format!("{}-{clients}-{}", workload.to_lowercase(), placement.name());
    let mut cfgs = setup(target, &before.addr, &prefix, clients, per_cycle_lease).await?;
    for cfg in &mut cfgs {
        cfg.time_calls = opts.breakdown;
    }

    let t0 = Instant::now();
    let window_start = t0 + opts.warmup;
    let window_end = window_start + opts.duration;
    let leader_at = leader_index(&target.endpoints, &before.addr)?;
    let mut tasks = Vec::new();
    for (i, cfg) in cfgs.into_iter().enumerate() {
        let conn = match placement {
            Placement::Leader => {
                Failover::new(&target.endpoints, &before.addr, Duration::from_secs(5))
            }
            Placement::Spread => {
                let node = &target.endpoints[placement.node(i, target.endpoints.len(), leader_at)];
                Failover::pinned(&target.endpoints, node, Duration::from_secs(5))
            }
        };
        tasks.push(tokio::spawn(client_loop(conn, cfg, window_end)));
    }
    tokio::time::sleep_until(window_start.into()).await;
    let at_start = target.leader().await?;
    let scraped_before = match opts.breakdown {
        true => Some(scrape_all(target).await?),
        false => None,
    };
    // Calls that write nothing, paced, to the clients' node while the writes run: what a call
    // costs outside the server under the same load.
    let client_addr = match placement {
        Placement::Leader => before.addr.clone(),
        Placement::Spread => {
            target.endpoints[placement.node(0, target.endpoints.len(), leader_at)].clone()
        }
    };
    let probe = opts.breakdown.then(|| {
        let addr = client_addr.clone();
        tokio::spawn(async move {
            let until = window_end - EMPTY_CALL_PAUSE;
            empty_calls(&addr, usize::MAX, EMPTY_CALL_PAUSE, Some(until)).await
        })
    });
    tokio::time::sleep_until(window_end.into()).await;
    let at_end = target.leader().await?;
    let scraped_after = match opts.breakdown {
        true => Some(scrape_all(target).await?),
        false => None,
    };

    let debug = std::env::var_os("CONCH_BENCH_DEBUG").is_some();
    let mut latencies = Latencies::default();
    let mut errors = Errors::default();
    let mut redirects = 0;
    let mut calls = Vec::new();
    for task in tasks {
        let log = task.await.context("client task")?;
        calls.extend(
            log.calls
                .iter()
                .filter(|(at, _)| *at >= window_start && *at <= window_end)
                .map(|(_, latency)| *latency),
        );
        for (at, latency) in log.done {
            if at >= window_start && at <= window_end {
                latencies.push(latency);
                if debug && latency > Duration::from_millis(20) {
                    let wall =
                        std::time::SystemTime::now() - Instant::now().saturating_duration_since(at);
                    let unix = wall
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs_f64())
                        .unwrap_or(0.0);
                    eprintln!(
                        "{workload} {clients} clients: slow cycle {:.1} ms ending at +{} ms (unix {unix:.3})",
                        latency.as_secs_f64() * 1000.0,
                        ms_between(t0, at)
                    );
                }
            }
        }
        for (_, e) in log.errors {
            errors.add(e);
        }
        redirects += log.redirects;
    }
    let after = target.leader().await?;

    let cycles = latencies.len() as f64;
    let ops_per_cycle = if per_cycle_lease { 4.0 } else { 2.0 };
    let entries = at_end.applied_index.saturating_sub(at_start.applied_index) as f64;
    let window = secs(opts.duration);
    let mut row = Row::new(workload, clients as u64);
    row.set("system", "conch");
    row.set("placement", placement.name());
    row.set("cycles_per_s", round1(cycles / window));
    row.opt("p50_ms", latencies.pct_ms(50.0));
    row.opt("p99_ms", latencies.pct_ms(99.0));
    row.set("ops_per_s", round1(cycles * ops_per_cycle / window));
    row.set("raft_entries_per_s", round1(entries / window));
    let per_entry = if entries > 0.0 {
        Some((cycles * ops_per_cycle / entries * 100.0).round() / 100.0)
    } else {
        None
    };
    row.opt("ops_per_entry", per_entry);
    row.set("errors", errors.total());
    if errors.total() > 0 {
        row.set("error_kinds", errors.to_value());
    }
    row.set("leader_changes", after.term.saturating_sub(before.term));
    row.set("leader_moved", before.leader_id != after.leader_id);
    row.set("redirects", redirects);
    if let (Some(before_scrape), Some(after_scrape)) = (scraped_before, scraped_after) {
        if at_end.leader_id != before.leader_id {
            anyhow::bail!(
                "the leader changed during the run (node {} to {}): the breakdown would mix two leaders",
                before.leader_id,
                at_end.leader_id
            );
        }
        let cluster = target
            .cluster
            .as_ref()
            .context("--breakdown needs a cluster started by conch-bench")?;
        let client = cluster
            .ids()
            .into_iter()
            .find(|id| cluster.addr(*id) == client_addr)
            .with_context(|| format!("no node of the cluster serves {client_addr}"))?;
        let window = breakdown::Window {
            before: &before_scrape,
            after: &after_scrape,
            leader: before.leader_id,
            client,
        };
        let mut result = breakdown::breakdown(&window, breakdown::end_to_end(&calls));
        if let Some(probe) = probe {
            let latencies = probe.await.context("empty calls")??;
            result.empty_calls.push(breakdown::empty_call(
                &format!(
                    "during the window, one every {} ms",
                    EMPTY_CALL_PAUSE.as_millis()
                ),
                &latencies,
                &before_scrape[&client],
                &after_scrape[&client],
            ));
        }
        let before_empty = scrape(&metrics_addr(cluster, client)?).await?;
        let latencies = empty_calls(&client_addr, EMPTY_CALLS, Duration::ZERO, None).await?;
        let after_empty = scrape(&metrics_addr(cluster, client)?).await?;
        result.empty_calls.push(breakdown::empty_call(
            "after the window, one after another",
            &latencies,
            &before_empty,
            &after_empty,
        ));
        row.set("breakdown", serde_json::to_value(&result)?);
    }
    Ok(row)
}

/// Calls that write nothing, timed after a `--breakdown` window.
const EMPTY_CALLS: usize = 1_000;
/// The pause between calls that write nothing during a `--breakdown` window (few enough to
/// leave the writes' numbers alone).
const EMPTY_CALL_PAUSE: Duration = Duration::from_millis(20);

/// Times up to `n` calls of `ConchAdmin.ClusterStatus` (local, writes nothing) to `addr`, one
/// at a time on one connection, `pause` apart, until `until` if given.
async fn empty_calls(
    addr: &str,
    n: usize,
    pause: Duration,
    until: Option<Instant>,
) -> anyhow::Result<Vec<Duration>> {
    let channel = crate::net::connect(addr, Duration::from_secs(1)).await?;
    let mut admin = conch_proto::conch::conch_admin_client::ConchAdminClient::new(channel);
    let mut out = Vec::with_capacity(n.min(EMPTY_CALLS));
    for _ in 0..n {
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let start = Instant::now();
        admin
            .cluster_status(conch_proto::conch::ClusterStatusRequest {})
            .await
            .context("ClusterStatus")?;
        out.push(start.elapsed());
    }
    Ok(out)
}

fn metrics_addr(cluster: &crate::Cluster, id: u64) -> anyhow::Result<String> {
    cluster
        .metrics_addr(id)
        .with_context(|| format!("node {id} serves no metrics"))
}

/// Every node's metrics, by node id (the cluster conch-bench started).
async fn scrape_all(target: &Target) -> anyhow::Result<BTreeMap<u64, Scrape>> {
    let cluster = target
        .cluster
        .as_ref()
        .context("--breakdown needs a cluster started by conch-bench (no --endpoints)")?;
    let mut out = BTreeMap::new();
    for id in cluster.ids() {
        out.insert(id, scrape(&metrics_addr(cluster, id)?).await?);
    }
    Ok(out)
}

/// W3's clients, and how long they run before and after the kill.
pub const FAILOVER_CLIENTS: usize = 8;
pub const FAILOVER_BEFORE_KILL: Duration = Duration::from_secs(5);
pub const FAILOVER_AFTER_KILL: Duration = Duration::from_secs(10);

/// Window in which W3 counts throughput after the kill.
const FAILOVER_WINDOW: Duration = Duration::from_millis(200);

/// The W3 row (any system) from every successful cycle's (start, completion) instants: the
/// pre-kill rate, the first success after the kill (of a cycle started after it: a cycle the old
/// leader served just before it died proves nothing about the failover), when a 200 ms window
/// first reaches half the pre-kill rate, and the rate from 5 s after the kill to the end.
pub fn failover_row(
    cycles: Vec<(Instant, Instant)>,
    pre_start: Instant,
    killed_at: Instant,
    stop_at: Instant,
    errors: Errors,
) -> Row {
    const WINDOW: Duration = FAILOVER_WINDOW;
    let first = cycles
        .iter()
        .filter(|(started, _)| *started > killed_at)
        .map(|(_, finished)| *finished)
        .min();
    let mut done: Vec<Instant> = cycles.into_iter().map(|(_, finished)| finished).collect();
    done.sort_unstable();
    let pre = done
        .iter()
        .filter(|at| **at >= pre_start && **at < killed_at)
        .count() as f64;
    let pre_rate = pre / secs(killed_at.saturating_duration_since(pre_start));
    let need = pre_rate * secs(WINDOW) / 2.0;
    let mut half = None;
    let mut k = 0u32;
    while killed_at + WINDOW * (k + 1) <= stop_at {
        let from = killed_at + WINDOW * k;
        let to = from + WINDOW;
        let n = done.iter().filter(|at| **at >= from && **at < to).count() as f64;
        if n >= need {
            half = Some(ms_between(killed_at, to));
            break;
        }
        k += 1;
    }
    let post_start = killed_at + Duration::from_secs(5);
    let post = done
        .iter()
        .filter(|at| **at >= post_start && **at < stop_at)
        .count() as f64;
    let mut row = Row::new("W3", FAILOVER_CLIENTS as u64);
    row.opt(
        "first_success_ms",
        first.map(|at| ms_between(killed_at, at)),
    );
    row.opt("half_throughput_ms", half);
    row.set("pre_kill_cycles_per_s", round1(pre_rate));
    row.set(
        "post_kill_cycles_per_s",
        round1(post / secs(stop_at.saturating_duration_since(post_start))),
    );
    row.set("errors", errors.total());
    row.set("error_kinds", errors.to_value());
    row
}

/// W3: W1 at 8 clients; kill -9 of the leader after the warm-up plus 5 s; runs 10 s after the
/// kill. Clients fail over with 1 s per-call deadlines.
pub async fn failover(target: &mut Target, opts: &Opts) -> anyhow::Result<Row> {
    const CLIENTS: usize = FAILOVER_CLIENTS;
    const BEFORE_KILL: Duration = FAILOVER_BEFORE_KILL;
    const AFTER_KILL: Duration = FAILOVER_AFTER_KILL;
    target.cluster_mut()?;
    let before = target.leader().await?;
    let cfgs = setup(target, &before.addr, "w3", CLIENTS, false).await?;

    let t0 = Instant::now();
    let pre_start = t0 + opts.warmup;
    let kill_at = pre_start + BEFORE_KILL;
    let stop_at = kill_at + AFTER_KILL;
    let mut tasks = Vec::new();
    for cfg in cfgs {
        let conn = Failover::new(&target.endpoints, &before.addr, Duration::from_secs(1));
        tasks.push(tokio::spawn(client_loop(conn, cfg, stop_at)));
    }
    tokio::time::sleep_until(kill_at.into()).await;
    let leader = target.leader().await?;
    let killed_at = Instant::now();
    let killed_wall = std::time::SystemTime::now();
    target.cluster_mut()?.kill(leader.leader_id);
    tokio::time::sleep_until(stop_at.into()).await;

    let debug = std::env::var_os("CONCH_BENCH_DEBUG").is_some();
    let mut done = Vec::new();
    let mut errors = Errors::default();
    for (i, task) in tasks.into_iter().enumerate() {
        let log = task.await.context("client task")?;
        if debug {
            let first = log
                .done
                .iter()
                .find(|(at, latency)| *at - *latency > killed_at)
                .map(|(at, _)| ms_between(killed_at, *at));
            let errs: Vec<String> = log
                .errors
                .iter()
                .filter(|(at, _)| *at >= killed_at)
                .map(|(at, e)| format!("{}ms:{e}", ms_between(killed_at, *at)))
                .collect();
            eprintln!("W3 client {i}: first success after kill {first:?} ms; errors {errs:?}");
        }
        done.extend(log.done.into_iter().map(|(at, latency)| (at - latency, at)));
        for (at, e) in log.errors {
            if at >= killed_at {
                errors.add(e);
            }
        }
    }
    if debug {
        let wall = killed_wall
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        eprintln!("W3 killed node {} at unix {wall:.3}", leader.leader_id);
        if let Some(cluster) = &target.cluster {
            for id in cluster.running_ids() {
                eprintln!("--- node {id} log (tail) ---");
                let log = cluster.log(id);
                let lines: Vec<&str> = log.lines().collect();
                for line in &lines[lines.len().saturating_sub(40)..] {
                    eprintln!("{line}");
                }
            }
        }
    }
    let after = target.leader().await?;
    let mut row = failover_row(done, pre_start, killed_at, stop_at, errors);
    row.set("killed_leader", leader.leader_id);
    row.set("new_leader", after.leader_id);
    row.set("term_change", after.term.saturating_sub(leader.term));
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_success_after_a_kill_is_a_cycle_started_after_it() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let killed_at = ms(1_000);
        let cycles = vec![
            (ms(100), ms(110)),
            (ms(990), ms(1_000) + Duration::from_micros(100)), // served just before the kill
            (ms(1_005), ms(2_500)),                            // waited out the election
            (ms(2_000), ms(2_300)),
        ];
        let row = failover_row(cycles, t0, killed_at, ms(3_000), Errors::default());
        assert_eq!(
            row.fields.get("first_success_ms").and_then(|v| v.as_f64()),
            Some(1_300.0),
            "{:?}",
            row.fields
        );
    }
}

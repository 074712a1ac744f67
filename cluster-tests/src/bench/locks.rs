//! L1, L2, L3: conch's hierarchical read/write locks (BENCHMARKS.md, "Locks"), and the rows every system's
//! lock runs are reported in (the etcd recipes are in `etcd_locks.rs`).
//!
//! - **L1**, uncontended: C clients, each with its own lock lease (kept for the run) and its
//!   own path `l1-<C>-<placement>/<i>` (siblings, so independent), looping a blocking
//!   exclusive acquire (timeout 5 s; granted at once) and a release. Cycles per second and the
//!   p50/p99 of a cycle.
//! - **L2**, contended hand-off: 16 clients on one path, each looping a blocking exclusive
//!   acquire (timeout 30 s), no hold, release. The hand-off gap pairs grants with releases as
//!   W2 does (see [`super::w2::handoff_gaps`]): with one holder at a time, the n-th release
//!   frees the grant after the n-th.
//! - **L3**, readers and a writer: on one path, 8 readers loop a shared acquire and release,
//!   1 writer loops an exclusive acquire and release, no hold. The writer's wait (acquire sent
//!   to grant received) p50/p99 and the readers' cycles per second: conch's queue is FIFO
//!   across modes, so a stream of readers cannot starve the writer.
//!
//! Clients are placed as in W1: on the leader following the hint, or spread over the nodes
//! without following it.

use std::time::{Duration, Instant};

use anyhow::Context;
use conch_proto::grackle as pb;

use crate::net::{Failover, Grackle};

use super::stats::{Errors, Latencies, Row, round1};
use super::w2::{Event, handoff_gaps};
use super::{Opts, Placement, Target, batched, check_setup, leader_index, secs};

/// Client counts of L1's rows.
pub const L1_CLIENTS: [usize; 2] = [1, 64];
/// Clients on L2's one path.
pub const L2_CLIENTS: usize = 16;
/// Readers on L3's path (plus one writer).
pub const L3_READERS: usize = 8;

const LEASE_TTL_S: u64 = 60;
/// The wait of L1's acquire (uncontended: granted at once).
const L1_TIMEOUT_MS: u64 = 5_000;
/// The wait of L2's and L3's blocking acquires.
const WAIT_TIMEOUT_MS: u64 = 30_000;

/// One lock client: its connection, lease and path.
struct LockClient {
    conn: Failover,
    ns: String,
    path: String,
    lease: String,
}

impl LockClient {
    /// Acquires the path (waiting up to `timeout_ms`); the fencing token, or what went wrong.
    async fn acquire(&mut self, exclusive: bool, timeout_ms: u64) -> Result<u64, String> {
        let request = pb::AcquireLockRequest {
            namespace_name: self.ns.clone(),
            lock_name: self.path.clone(),
            exclusive,
            lease_id: self.lease.clone(),
            timeout_ms,
            ..Default::default()
        };
        let r = self
            .conn
            .call(move |mut c| async move { c.acquire_lock(request).await })
            .await
            .map_err(|s| format!("{:?}", s.code()))?;
        if r.outcome != pb::AcquireOutcome::Acquired as i32 {
            return Err(format!("not acquired (outcome {})", r.outcome));
        }
        Ok(r.fencing_token)
    }

    async fn release(&mut self) -> Result<(), String> {
        let request = pb::ReleaseLockRequest {
            namespace_name: self.ns.clone(),
            lock_name: self.path.clone(),
            lease_id: self.lease.clone(),
        };
        self.conn
            .call(move |mut c| async move { c.release_lock(request).await })
            .await
            .map_err(|s| format!("{:?}", s.code()))?;
        Ok(())
    }
}

/// Creates `n` lock leases over the clients of `pool`.
async fn lock_leases(
    pool: &[Grackle],
    ns: &str,
    n: usize,
    what: &str,
) -> anyhow::Result<Vec<String>> {
    let results = batched(n, 64, |i| {
        let mut c = pool[i % pool.len()].clone();
        let request = pb::CreateLockLeaseRequest {
            namespace_name: ns.to_string(),
            process_id: format!("bench-{i}"),
            ttl_seconds: LEASE_TTL_S,
            ..Default::default()
        };
        async move {
            let r = c.create_lock_lease(request).await?.into_inner();
            Ok(r.lease.map(|l| l.lease_id).unwrap_or_default())
        }
    })
    .await;
    check_setup(what, results)
}

/// `n` clients of `target`, the `i`th on the path `path(i)`, each with a new lock lease and
/// its own connection placed by `placement`; calls wait up to `deadline`.
async fn clients(
    target: &Target,
    n: usize,
    placement: Placement,
    deadline: Duration,
    path: impl Fn(usize) -> String,
    what: &str,
) -> anyhow::Result<Vec<LockClient>> {
    let leader = target.leader().await?;
    let pool = target.clients(&leader.addr, 4).await?;
    let leases = lock_leases(&pool, &target.ns, n, what).await?;
    let leader_at = leader_index(&target.endpoints, &leader.addr)?;
    Ok(leases
        .into_iter()
        .enumerate()
        .map(|(i, lease)| {
            let conn = match placement {
                Placement::Leader => Failover::new(&target.endpoints, &leader.addr, deadline),
                Placement::Spread => {
                    let node =
                        &target.endpoints[placement.node(i, target.endpoints.len(), leader_at)];
                    Failover::pinned(&target.endpoints, node, deadline)
                }
            };
            LockClient {
                conn,
                ns: target.ns.clone(),
                path: path(i),
                lease,
            }
        })
        .collect())
}

/// The warm-up's end and the window's end, from now.
fn window(opts: &Opts) -> (Instant, Instant) {
    let start = Instant::now() + opts.warmup;
    (start, start + opts.duration)
}

/// L1 on conch: `clients` clients, each cycling an exclusive acquire and a release on a path
/// of its own.
pub async fn l1(
    target: &Target,
    opts: &Opts,
    clients: usize,
    placement: Placement,
) -> anyhow::Result<Row> {
    let base = format!("l1-{clients}-{}", placement.name());
    let lock_clients =
        clients_of(target, clients, placement, Duration::from_secs(5), &base).await?;
    let (window_start, window_end) = window(opts);
    let mut tasks = Vec::new();
    for mut client in lock_clients {
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut errors = Errors::default();
            while Instant::now() < window_end {
                let start = Instant::now();
                let cycle = async {
                    client.acquire(true, L1_TIMEOUT_MS).await?;
                    client.release().await
                };
                match cycle.await {
                    Ok(()) => done.push((Instant::now(), start.elapsed())),
                    Err(e) => {
                        errors.add(e);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (done, errors, client.conn.redirects)
        }));
    }
    let mut done = Vec::new();
    let mut errors = Errors::default();
    let mut redirects = 0;
    for task in tasks {
        let (d, e, r) = task.await.context("client task")?;
        done.extend(d);
        errors.merge(e);
        redirects += r;
    }
    let mut row = cycles_row(done, opts, window_start, window_end, clients, errors);
    row.set("system", "conch");
    row.set("placement", placement.name());
    row.set("redirects", redirects);
    Ok(row)
}

async fn clients_of(
    target: &Target,
    n: usize,
    placement: Placement,
    deadline: Duration,
    base: &str,
) -> anyhow::Result<Vec<LockClient>> {
    clients(
        target,
        n,
        placement,
        deadline,
        |i| format!("{base}/{i}"),
        &format!("create {base} lock leases"),
    )
    .await
}

/// The L1 row (any system) from every cycle's (completed at, latency).
pub fn cycles_row(
    done: Vec<(Instant, Duration)>,
    opts: &Opts,
    window_start: Instant,
    window_end: Instant,
    clients: usize,
    errors: Errors,
) -> Row {
    let mut latencies = Latencies::default();
    for (at, latency) in done {
        if at >= window_start && at <= window_end {
            latencies.push(latency);
        }
    }
    let mut row = Row::new("L1", clients as u64);
    row.set(
        "cycles_per_s",
        round1(latencies.len() as f64 / secs(opts.duration)),
    );
    row.opt("p50_ms", latencies.pct_ms(50.0));
    row.opt("p99_ms", latencies.pct_ms(99.0));
    set_errors(&mut row, errors);
    row
}

fn set_errors(row: &mut Row, errors: Errors) {
    row.set("errors", errors.total());
    if errors.total() > 0 {
        row.set("error_kinds", errors.to_value());
    }
}

/// L2 on conch: 16 clients on one path, exclusive, no hold.
pub async fn l2(target: &Target, opts: &Opts, placement: Placement) -> anyhow::Result<Row> {
    let path = format!("l2-{}", placement.name());
    let lock_clients = clients(
        target,
        L2_CLIENTS,
        placement,
        Duration::from_secs(35),
        |_| path.clone(),
        "create L2 lock leases",
    )
    .await?;
    let (window_start, window_end) = window(opts);
    let mut tasks = Vec::new();
    for mut client in lock_clients {
        tasks.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let mut errors = Errors::default();
            while Instant::now() < window_end {
                if let Err(e) = client.acquire(true, WAIT_TIMEOUT_MS).await {
                    errors.add(e);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                events.push((Instant::now(), Event::Grant));
                events.push((Instant::now(), Event::Release));
                if let Err(e) = client.release().await {
                    errors.add(e);
                }
            }
            (events, errors)
        }));
    }
    let mut events = Vec::new();
    let mut errors = Errors::default();
    for task in tasks {
        let (e, errs) = task.await.context("client task")?;
        events.extend(e);
        errors.merge(errs);
    }
    let mut row = handoff_row(events, opts, window_start, window_end, errors);
    row.set("system", "conch");
    row.set("placement", placement.name());
    Ok(row)
}

/// The L2 row (any system): grants per second in the window and the hand-off gap between a
/// release sent and the grant it freed (one holder at a time).
pub fn handoff_row(
    events: Vec<(Instant, Event)>,
    opts: &Opts,
    window_start: Instant,
    window_end: Instant,
    errors: Errors,
) -> Row {
    let (grants, mut gaps) = handoff_gaps(events, window_start, window_end);
    let mut row = Row::new("L2", L2_CLIENTS as u64);
    row.set("grants_per_s", round1(grants as f64 / secs(opts.duration)));
    row.opt("handoff_p50_ms", gaps.pct_ms(50.0));
    row.opt("handoff_p99_ms", gaps.pct_ms(99.0));
    row.set("handoffs", gaps.len() as u64);
    set_errors(&mut row, errors);
    row
}

/// What one L3 client saw: the readers' cycles and the writer's waits, each as (completed at,
/// duration).
#[derive(Default)]
pub struct RwLog {
    pub reader_cycles: Vec<(Instant, Duration)>,
    pub writer_waits: Vec<(Instant, Duration)>,
    pub errors: Errors,
}

impl RwLog {
    pub fn merge(&mut self, other: RwLog) {
        self.reader_cycles.extend(other.reader_cycles);
        self.writer_waits.extend(other.writer_waits);
        self.errors.merge(other.errors);
    }
}

/// L3 on conch: 8 readers (shared) and 1 writer (exclusive) on one path, no hold.
pub async fn l3(target: &Target, opts: &Opts, placement: Placement) -> anyhow::Result<Row> {
    let path = format!("l3-{}", placement.name());
    let lock_clients = clients(
        target,
        L3_READERS + 1,
        placement,
        Duration::from_secs(35),
        |_| path.clone(),
        "create L3 lock leases",
    )
    .await?;
    let (window_start, window_end) = window(opts);
    let mut tasks = Vec::new();
    for (i, mut client) in lock_clients.into_iter().enumerate() {
        // The last client writes; with spread placement the writer is on a follower too.
        let writer = i == L3_READERS;
        tasks.push(tokio::spawn(async move {
            let mut log = RwLog::default();
            while Instant::now() < window_end {
                let start = Instant::now();
                if let Err(e) = client.acquire(writer, WAIT_TIMEOUT_MS).await {
                    log.errors.add(e);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let waited = (Instant::now(), start.elapsed());
                if let Err(e) = client.release().await {
                    log.errors.add(e);
                    continue;
                }
                if writer {
                    log.writer_waits.push(waited);
                } else {
                    log.reader_cycles.push((Instant::now(), start.elapsed()));
                }
            }
            log
        }));
    }
    let mut log = RwLog::default();
    for task in tasks {
        log.merge(task.await.context("client task")?);
    }
    let mut row = rw_row(log, opts, window_start, window_end);
    row.set("system", "conch");
    row.set("placement", placement.name());
    Ok(row)
}

/// The L3 row (any system): readers' cycles per second (and a cycle's p50/p99), the writer's
/// wait p50/p99 and grants per second, counting what completed in the window.
pub fn rw_row(log: RwLog, opts: &Opts, window_start: Instant, window_end: Instant) -> Row {
    let in_window = |at: &Instant| *at >= window_start && *at <= window_end;
    let mut readers = Latencies::default();
    for (at, latency) in &log.reader_cycles {
        if in_window(at) {
            readers.push(*latency);
        }
    }
    let mut waits = Latencies::default();
    for (at, wait) in &log.writer_waits {
        if in_window(at) {
            waits.push(*wait);
        }
    }
    let window = secs(opts.duration);
    let mut row = Row::new("L3", (L3_READERS + 1) as u64);
    row.set("reader_cycles_per_s", round1(readers.len() as f64 / window));
    row.opt("writer_wait_p50_ms", waits.pct_ms(50.0));
    row.opt("writer_wait_p99_ms", waits.pct_ms(99.0));
    row.set("writer_cycles_per_s", round1(waits.len() as f64 / window));
    row.opt("reader_p50_ms", readers.pct_ms(50.0));
    row.opt("reader_p99_ms", readers.pct_ms(99.0));
    row.set("readers", L3_READERS as u64);
    set_errors(&mut row, log.errors);
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> Opts {
        Opts {
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            w4_leases: 1,
            w5_leases: 1,
            w5_semaphores: 1,
            w5_waiters: 1,
            tls: false,
            auth: false,
            w1_clients: vec![1],
            breakdown: false,
            w1b_clients: vec![1],
            w6: Default::default(),
        }
    }

    fn num(row: &Row, key: &str) -> Option<f64> {
        row.fields.get(key).and_then(serde_json::Value::as_f64)
    }

    #[test]
    fn with_one_holder_the_nth_release_frees_the_grant_after_the_nth() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // Client A: granted at 0, releases at 1; B (queued) granted at 4; releases at 5; A
        // (queued again) granted at 7. The first grant has no gap.
        let events = vec![
            (ms(7), Event::Grant),
            (ms(0), Event::Grant),
            (ms(5), Event::Release),
            (ms(1), Event::Release),
            (ms(4), Event::Grant),
        ];
        let row = handoff_row(events, &opts(), t0, ms(1_000), Errors::default());
        assert_eq!(num(&row, "handoffs"), Some(2.0), "{}", row.json());
        assert_eq!(num(&row, "handoff_p50_ms"), Some(2.0), "{}", row.json());
        assert_eq!(num(&row, "handoff_p99_ms"), Some(3.0), "{}", row.json());
        assert_eq!(num(&row, "grants_per_s"), Some(3.0), "{}", row.json());
        assert_eq!(row.fields.get("workload"), Some(&"L2".into()));
    }

    #[test]
    fn a_grant_before_the_window_still_uses_up_its_release() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let events = vec![
            (ms(0), Event::Grant),
            (ms(1), Event::Release),
            (ms(3), Event::Grant), // in the warm-up: paired with the release at 1, not counted
            (ms(20), Event::Release),
            (ms(26), Event::Grant),
        ];
        let row = handoff_row(events, &opts(), ms(10), ms(1_010), Errors::default());
        assert_eq!(num(&row, "handoffs"), Some(1.0), "{}", row.json());
        assert_eq!(num(&row, "handoff_p99_ms"), Some(6.0), "{}", row.json());
    }

    #[test]
    fn the_rw_row_counts_only_what_completed_in_the_window() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let log = RwLog {
            reader_cycles: vec![
                (ms(5), Duration::from_millis(1)), // warm-up
                (ms(20), Duration::from_millis(2)),
                (ms(30), Duration::from_millis(4)),
            ],
            writer_waits: vec![
                (ms(5), Duration::from_millis(50)), // warm-up
                (ms(40), Duration::from_millis(7)),
            ],
            errors: Errors::default(),
        };
        let row = rw_row(log, &opts(), ms(10), ms(1_010));
        assert_eq!(
            num(&row, "reader_cycles_per_s"),
            Some(2.0),
            "{}",
            row.json()
        );
        assert_eq!(num(&row, "writer_wait_p99_ms"), Some(7.0), "{}", row.json());
        assert_eq!(num(&row, "reader_p50_ms"), Some(2.0), "{}", row.json());
        assert_eq!(
            num(&row, "writer_cycles_per_s"),
            Some(1.0),
            "{}",
            row.json()
        );
    }
}

//! W2: one semaphore with permits 2 and 16 clients acquiring and releasing at once.
//!
//! Each client loops: blocking acquire (timeout 30 s) -> hold (0 ms, or uniform 0..=20 ms)
//! -> release. Clients note the instant a release is sent and the instant a grant is observed,
//! all in this process. The handoff gap pairs grants with releases in order: the n-th release
//! sent frees the slot the n-th grant after the first `permits` takes (the queue is FIFO and
//! never empty for long with 16 clients on 2 permits). Grants before any release (the first
//! two) have no gap.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Context;
use conch_proto::grackle as pb;

use crate::net::Failover;
use crate::rng::Rng;

use super::stats::{Errors, Latencies, Row, round1};
use super::{Opts, Placement, Target, create_leases, leader_index, secs};

pub const CLIENTS: usize = 16;
pub const PERMITS: u64 = 2;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// A release was sent (timestamp before the call).
    Release,
    /// A grant was observed (timestamp after the reply).
    Grant,
}

#[derive(Default)]
struct ClientLog {
    events: Vec<(Instant, Event)>,
    errors: Errors,
}

async fn client_loop(
    mut conn: Failover,
    ns: String,
    sem: String,
    lease: String,
    hold_max_ms: u64,
    seed: u64,
    stop_at: Instant,
) -> ClientLog {
    let mut log = ClientLog::default();
    let mut rng = Rng::new(seed);
    while Instant::now() < stop_at {
        let acquire = pb::AcquireSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: sem.clone(),
            lease_id: lease.clone(),
            weight: 1,
            timeout_ms: 30_000,
            ..Default::default()
        };
        match conn
            .call(move |mut c| async move { c.acquire_semaphore(acquire).await })
            .await
        {
            Ok(r) if r.outcome == pb::AcquireOutcome::Acquired as i32 => {
                log.events.push((Instant::now(), Event::Grant))
            }
            Ok(r) => {
                log.errors
                    .add(format!("not acquired (outcome {})", r.outcome));
                continue;
            }
            Err(s) => {
                log.errors.status(&s);
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        }
        if hold_max_ms > 0 {
            tokio::time::sleep(Duration::from_millis(rng.range(0, hold_max_ms))).await;
        }
        let release = pb::ReleaseSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: sem.clone(),
            lease_id: lease.clone(),
        };
        log.events.push((Instant::now(), Event::Release));
        if let Err(s) = conn
            .call(move |mut c| async move { c.release_semaphore(release).await })
            .await
        {
            log.errors.status(&s);
        }
    }
    log
}

pub async fn run(
    target: &Target,
    opts: &Opts,
    hold_max_ms: u64,
    placement: Placement,
) -> anyhow::Result<Row> {
    let leader = target.leader().await?;
    let sem = format!("w2-hold{hold_max_ms}-{}", placement.name());
    let pool = target.clients(&leader.addr, 4).await?;
    let mut c = pool[0].clone();
    c.create_semaphore(pb::CreateSemaphoreRequest {
        namespace_name: target.ns.clone(),
        semaphore_name: sem.clone(),
        permits: PERMITS,
        ..Default::default()
    })
    .await
    .context("create the W2 semaphore")?;
    let ns = target.ns.clone();
    let leases = create_leases(
        &pool,
        &ns,
        CLIENTS,
        16,
        60,
        |i| format!("w2-{i}"),
        "create W2 leases",
    )
    .await?;

    let t0 = Instant::now();
    let window_start = t0 + opts.warmup;
    let window_end = window_start + opts.duration;
    let leader_at = leader_index(&target.endpoints, &leader.addr)?;
    let mut tasks = Vec::new();
    for (i, lease) in leases.into_iter().enumerate() {
        let deadline = Duration::from_secs(35);
        let conn = match placement {
            Placement::Leader => Failover::new(&target.endpoints, &leader.addr, deadline),
            Placement::Spread => {
                let node = &target.endpoints[placement.node(i, target.endpoints.len(), leader_at)];
                Failover::pinned(&target.endpoints, node, deadline)
            }
        };
        let seed = 0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1) ^ (hold_max_ms << 32);
        tasks.push(tokio::spawn(client_loop(
            conn,
            ns.clone(),
            sem.clone(),
            lease,
            hold_max_ms,
            seed,
            window_end,
        )));
    }
    let mut events = Vec::new();
    let mut errors = Errors::default();
    for task in tasks {
        let log = task.await.context("client task")?;
        events.extend(log.events);
        errors.merge(log.errors);
    }
    let mut row = handoff_row(events, opts, window_start, window_end, hold_max_ms, errors);
    row.set("system", "conch");
    row.set("placement", placement.name());
    Ok(row)
}

/// The grants observed in the window and their handoff gaps (any system, any number of
/// slots): in time order, each grant is paired with the oldest release not yet paired, so the
/// n-th release sent frees the n-th grant after the first `permits` (those find no release
/// before them and have no gap). Grants outside the window still consume their release.
pub fn handoff_gaps(
    mut events: Vec<(Instant, Event)>,
    window_start: Instant,
    window_end: Instant,
) -> (u64, Latencies) {
    events.sort_unstable();
    let mut releases: VecDeque<Instant> = VecDeque::new();
    let mut gaps = Latencies::default();
    let mut grants = 0u64;
    for (at, event) in events {
        match event {
            Event::Release => releases.push_back(at),
            Event::Grant => {
                let freed_by = releases.pop_front();
                if at < window_start || at > window_end {
                    continue;
                }
                grants += 1;
                if let Some(sent) = freed_by {
                    gaps.push(at.saturating_duration_since(sent));
                }
            }
        }
    }
    (grants, gaps)
}

/// The W2 row from every client's grants and releases (any system): grants per second in the
/// window, and the handoff gap, pairing the n-th release sent with the grant it freed.
pub fn handoff_row(
    events: Vec<(Instant, Event)>,
    opts: &Opts,
    window_start: Instant,
    window_end: Instant,
    hold_max_ms: u64,
    errors: Errors,
) -> Row {
    let (grants, mut gaps) = handoff_gaps(events, window_start, window_end);
    let hold = if hold_max_ms == 0 {
        "0".to_string()
    } else {
        format!("0-{hold_max_ms}")
    };
    let mut row = Row::new("W2", CLIENTS as u64);
    row.set("hold_ms", hold);
    row.set("grants_per_s", round1(grants as f64 / secs(opts.duration)));
    row.opt("handoff_p50_ms", gaps.pct_ms(50.0));
    row.opt("handoff_p99_ms", gaps.pct_ms(99.0));
    row.set("handoffs", gaps.len() as u64);
    row.set("permits", PERMITS);
    row.set("errors", errors.total());
    if errors.total() > 0 {
        row.set("error_kinds", errors.to_value());
    }
    row
}

//! W6: ten thousand live sessions on one cell.
//!
//! A session is what one client process keeps while it runs (what `conch sema` keeps): its own
//! gRPC channel (one TCP connection, never shared), one lease refreshed every third of its TTL,
//! a `WatchLoss` stream on that lease, and either one slot of a semaphore or a blocking acquire
//! parked on one. Session `i` is on node `i mod 3`; its connection comes from the loopback
//! source address 127.0.0.(2 + (i / 3) mod A), with A chosen so that at most [`ADDRESS_BUDGET`]
//! sessions share an address on one node (half of conchd's default
//! `--max-connections-per-address`), so no node limit is raised or reached.
//!
//! Semaphores: session `i` uses semaphore `i mod M` (M = sessions / 10 unless given), whose
//! permits (9 unless given) its first sessions hold; the others park a blocking acquire on it.
//! At 10 000 sessions: 1 000 semaphores of 9 permits, ten sessions each, 9 000 holders and
//! 1 000 parked acquires. During the run every holder holds for a random time (exponential,
//! mean 30 s), releases, and at once issues a blocking acquire again: each release hands its
//! slot to the waiter parked on that semaphore, and the releaser parks in its place.
//!
//! Refreshes: session `i`'s refreshes are due at `t0 + (i / n + k) × TTL/3`, so the sessions'
//! refreshes are spread evenly over each third of the TTL whenever each session was created. A
//! refresh answering NOT_FOUND, a watch answering NOT_FOUND or a loss pushed on the watch ends
//! the session: a lease lost.
//!
//! Setup (bounded: [`IN_FLIGHT`] at a time): the semaphores; the sessions (connect, create the
//! lease, start refreshing and watching at once); the holders' non-blocking acquires; then the
//! waiters park, and setup ends when the leader counts every waiter and every watch has answered
//! `watching`. Then the holders start their hold times: a warm-up of at least one refresh period,
//! then the measured window.
//!
//! Measured in the window: refresh latency (from send), the hand-off (from a release's send to
//! the grant it freed, observed by the parked waiter, paired per semaphore as W2 pairs them: a
//! grant leaves the node in the same applied entry as the release's own reply, so timing from
//! that reply would read zero), errors (every failed call by code, from the start of setup),
//! leases lost (also from the start of setup), each node's resident memory (`VmRSS`, sampled
//! every second, the largest), CPU seconds (`utime + stime`) and established connections on
//! its port (`/proc/net/tcp`), and what 1 000 sessions cost the cluster (summed over the nodes).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::watch_loss_response::Message as WatchMessage;
use conch_proto::conch::{LossCause, WatchLossRequest, WatchedLeaseKind};
use conch_proto::grackle as pb;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::Code;

use crate::net::{Grackle, NodeChannel, connect_from};
use crate::rng::Rng;
use crate::scrape::scrape;

use super::stats::{Errors, Latencies, Row, round1};
use super::w2::{Event, handoff_gaps};
use super::{Opts, Target, batched, check_setup, secs};

/// Calls in flight at once while setting up.
const IN_FLIGHT: usize = 256;
/// conchd's default `--max-connections-per-address`.
pub const NODE_PER_ADDRESS_CAP: usize = 1_000;
/// At most this many sessions share a source address on one node (half the node's cap).
pub const ADDRESS_BUDGET: usize = NODE_PER_ADDRESS_CAP / 2;
/// Open files the bench needs beyond one per session (its own probes, the runtime, the nodes'
/// logs).
pub const FD_MARGIN: u64 = 512;
/// A parked acquire's `timeout_ms`; one that times out is issued again.
const ACQUIRE_TIMEOUT_MS: u64 = 60_000;
/// Client-side deadline of the calls that do not wait.
const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// A refresh with no answer within this is counted `DeadlineExceeded`.
const REFRESH_DEADLINE: Duration = Duration::from_secs(5);

/// The targets printed beside the figures.
pub const TARGET_REFRESH_P99_MS: f64 = 20.0;
pub const TARGET_HANDOFF_P99_MS: f64 = 50.0;
pub const TARGET_RSS_MB: f64 = 250.0;
/// The knee: the session count at which refresh p99 passes this.
pub const KNEE_REFRESH_P99_MS: f64 = 50.0;

/// W6's settings (`--w6-*`).
#[derive(Clone, Debug)]
pub struct W6Opts {
    pub sessions: usize,
    /// Default: sessions / 10.
    pub semaphores: Option<usize>,
    pub permits: u64,
    pub ttl: Duration,
    /// Mean of a holder's (exponential) hold time.
    pub hold_mean: Duration,
    /// The measured window of a run.
    pub duration: Duration,
    /// Default: enough for [`ADDRESS_BUDGET`] sessions per address and node.
    pub source_addresses: Option<usize>,
    /// Search the knee instead of one run.
    pub knee: bool,
    /// The knee's session counts; default [`knee_steps`] up to what the open-file limit allows.
    pub knee_steps: Option<Vec<usize>>,
    /// The measured window of each knee step.
    pub knee_window: Duration,
}

impl Default for W6Opts {
    fn default() -> Self {
        W6Opts {
            sessions: 10_000,
            semaphores: None,
            permits: 9,
            ttl: Duration::from_secs(10),
            hold_mean: Duration::from_secs(30),
            duration: Duration::from_secs(300),
            source_addresses: None,
            knee: false,
            knee_steps: None,
            knee_window: Duration::from_secs(60),
        }
    }
}

/// Where each session goes: its node, source address and semaphore, and whether it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub sessions: usize,
    pub nodes: usize,
    pub semaphores: usize,
    pub permits: u64,
    pub addresses: usize,
}

impl Layout {
    /// `semaphores` default to sessions / 10 (at least 1), `addresses` to enough for
    /// [`ADDRESS_BUDGET`] sessions per address and node; fails on a layout no node takes.
    pub fn new(
        sessions: usize,
        nodes: usize,
        semaphores: Option<usize>,
        permits: u64,
        addresses: Option<usize>,
    ) -> anyhow::Result<Layout> {
        if sessions == 0 || nodes == 0 {
            bail!("W6 needs at least one session and one node");
        }
        if permits == 0 {
            bail!("--w6-permits must be at least 1");
        }
        let semaphores = semaphores.unwrap_or(sessions / 10).max(1);
        if semaphores > sessions {
            bail!("--w6-semaphores {semaphores} is more than the {sessions} sessions");
        }
        let per_node = sessions.div_ceil(nodes);
        let addresses = addresses
            .unwrap_or(per_node.div_ceil(ADDRESS_BUDGET))
            .max(1);
        if addresses > MAX_SOURCE_ADDRESSES {
            bail!("--w6-source-addresses {addresses}: at most {MAX_SOURCE_ADDRESSES}");
        }
        let layout = Layout {
            sessions,
            nodes,
            semaphores,
            permits,
            addresses,
        };
        let most = layout.most_per_address();
        if most > NODE_PER_ADDRESS_CAP {
            bail!(
                "--w6-source-addresses {addresses} puts {most} connections from one address on a \
                 node, past conchd's default cap of {NODE_PER_ADDRESS_CAP} per address: give at \
                 least {}",
                per_node.div_ceil(NODE_PER_ADDRESS_CAP)
            );
        }
        Ok(layout)
    }

    pub fn node(&self, i: usize) -> usize {
        i % self.nodes
    }

    /// Index of session `i`'s source address (see [`source_address`]).
    pub fn address(&self, i: usize) -> usize {
        (i / self.nodes) % self.addresses
    }

    pub fn semaphore(&self, i: usize) -> usize {
        i % self.semaphores
    }

    /// Whether session `i` takes a slot at setup (else it parks an acquire).
    pub fn is_holder(&self, i: usize) -> bool {
        ((i / self.semaphores) as u64) < self.permits
    }

    pub fn holders(&self) -> usize {
        (0..self.sessions).filter(|i| self.is_holder(*i)).count()
    }

    pub fn waiters(&self) -> usize {
        self.sessions - self.holders()
    }

    /// Sessions on node `k`.
    pub fn on_node(&self, k: usize) -> usize {
        (0..self.sessions).filter(|i| self.node(*i) == k).count()
    }

    /// The most sessions from one source address on one node.
    pub fn most_per_address(&self) -> usize {
        let mut counts = BTreeMap::new();
        for i in 0..self.sessions {
            *counts.entry((self.node(i), self.address(i))).or_insert(0) += 1;
        }
        counts.into_values().max().unwrap_or(0)
    }
}

/// Source addresses run from 127.0.0.2 up, inside 127.0.0.0/8.
const MAX_SOURCE_ADDRESSES: usize = (1 << 24) - 3;

/// The `k`th source address: 127.0.0.2, 127.0.0.3, ... (every address of 127.0.0.0/8 is the
/// loopback interface's on Linux).
pub fn source_address(k: usize) -> IpAddr {
    let base = u32::from(Ipv4Addr::new(127, 0, 0, 2));
    IpAddr::V4(Ipv4Addr::from(base + k as u32))
}

/// The first refresh slot of session `i` of `n` at or after `after`: slots are at
/// `grid + (i / n + k) × period`, so `n` sessions' refreshes are spread evenly over a period.
pub fn next_due(grid: Instant, period: Duration, i: usize, n: usize, after: Instant) -> Instant {
    let period_ns = period.as_nanos().max(1);
    let offset = Duration::from_nanos((period_ns * i as u128 / n.max(1) as u128) as u64);
    let first = grid + offset;
    if after <= first {
        return first;
    }
    let behind = (after - first).as_nanos();
    let k = behind.div_ceil(period_ns);
    first + Duration::from_nanos((k * period_ns) as u64)
}

/// An exponential hold time of mean `mean` from `u` uniform in [0, 1), capped at 20 means.
pub fn exp_hold(u: f64, mean: Duration) -> Duration {
    let x = -(1.0 - u.clamp(0.0, 1.0 - f64::EPSILON)).ln();
    mean.mul_f64(x.clamp(0.0, 20.0))
}

/// Hand-offs per semaphore: each semaphore's events paired as W2 pairs them (a grant with the
/// oldest release of that semaphore not yet paired); grants in the window and their gaps.
pub fn handoffs(
    events: Vec<(usize, Instant, Event)>,
    window_start: Instant,
    window_end: Instant,
) -> (u64, Latencies) {
    let mut by_semaphore: BTreeMap<usize, Vec<(Instant, Event)>> = BTreeMap::new();
    for (sem, at, event) in events {
        by_semaphore.entry(sem).or_default().push((at, event));
    }
    let mut grants = 0;
    let mut gaps = Latencies::default();
    for (_, events) in by_semaphore {
        let (g, l) = handoff_gaps(events, window_start, window_end);
        grants += g;
        gaps.merge(l);
    }
    (grants, gaps)
}

/// Whether a knee step is past the knee: its refresh p99 above `threshold`, or nothing measured.
pub fn past_knee(refresh_p99_ms: Option<f64>, threshold: f64) -> bool {
    refresh_p99_ms.is_none_or(|p| p > threshold)
}

/// The first step (session count) past the knee, if any.
pub fn knee_of(steps: &[(usize, Option<f64>)], threshold: f64) -> Option<usize> {
    steps
        .iter()
        .find(|(_, p99)| past_knee(*p99, threshold))
        .map(|(sessions, _)| *sessions)
}

/// The knee's session counts: 2 000, 5 000, 10 000, 15 000, then every 5 000, up to `most`; the
/// last step is `most` (rounded down to 500) when the series does not end there.
pub fn knee_steps(most: usize) -> Vec<usize> {
    let mut steps: Vec<usize> = [2_000, 5_000]
        .into_iter()
        .chain((1..).map(|k| k * 5_000).skip(1))
        .take_while(|s| *s <= most)
        .collect();
    let top = most / 500 * 500;
    if top > 0 && steps.last().is_none_or(|last| *last < top) {
        steps.push(top);
    }
    steps
}

/// Open files `sessions` sessions need in this process.
pub fn fds_needed(sessions: usize) -> u64 {
    sessions as u64 + FD_MARGIN
}

/// The most sessions `fd_limit` open files allow.
pub fn max_sessions(fd_limit: u64) -> usize {
    fd_limit.saturating_sub(FD_MARGIN) as usize
}

/// Raises this process's soft limit of open files to its hard limit (the nodes it starts
/// inherit it); returns the limit now in force.
pub fn raise_nofile() -> anyhow::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        bail!(
            "getrlimit(RLIMIT_NOFILE): {}",
            std::io::Error::last_os_error()
        );
    }
    let mut hard = limit.rlim_max;
    if hard == libc::RLIM_INFINITY {
        // The kernel refuses more than fs.nr_open.
        hard = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20);
    }
    if limit.rlim_cur < hard {
        let raised = libc::rlimit {
            rlim_cur: hard,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            bail!(
                "setrlimit(RLIMIT_NOFILE) to {hard}: {}",
                std::io::Error::last_os_error()
            );
        }
        return Ok(hard);
    }
    Ok(limit.rlim_cur)
}

/// Fails, saying what to do, when `fd_limit` open files are too few for `sessions`.
pub fn check_fds(sessions: usize, fd_limit: u64) -> anyhow::Result<()> {
    let needed = fds_needed(sessions);
    if needed > fd_limit {
        bail!(
            "W6 with {sessions} sessions needs about {needed} open files (one connection each), \
             but this process may open {fd_limit} (RLIMIT_NOFILE, raised to its hard limit): run \
             at most {} sessions (--w6-sessions) or raise the hard limit (ulimit -Hn, \
             LimitNOFILE=)",
            max_sessions(fd_limit)
        );
    }
    Ok(())
}

/// `utime + stime` of a process from its `/proc/<pid>/stat` text, in clock ticks.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    // "pid (comm) state ...": comm may hold spaces, so count fields after the last ')'; the
    // first of those is field 3, utime is field 14 and stime 15.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU seconds a process has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    Some(cpu_ticks(&stat)? as f64 / hz)
}

/// Established TCP connections whose local port is `port`, from `/proc/net/tcp` text: the
/// server's ends of the connections to a node listening there.
pub fn established_on(proc_net_tcp: &str, port: u16) -> usize {
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1);
            let state = fields.nth(1);
            let local_port = local
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && state == Some("01")
        })
        .count()
}

/// `VmRSS` in MiB, unrounded.
fn rss_mib(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Where the sessions are, as the run sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Sessions refresh and watch; holders have their slots.
    Setup,
    /// The waiters park their acquires.
    Queue,
    /// The holders hold and hand over; every session stops at `until`.
    Run { until: Instant },
}

/// What one session needs to know.
#[derive(Clone)]
struct SessionCfg {
    index: usize,
    sessions: usize,
    ns: String,
    semaphore: usize,
    lease: String,
    holder: bool,
    ttl: Duration,
    hold_mean: Duration,
    grid: Instant,
    seed: u64,
}

impl SessionCfg {
    fn semaphore_name(&self) -> String {
        semaphore_name(self.semaphore)
    }
}

fn semaphore_name(k: usize) -> String {
    format!("w6-{k}")
}

fn code(s: &tonic::Status) -> String {
    format!("{:?}", s.code())
}

#[derive(Default)]
struct RefreshLog {
    /// (answered at, latency) of each refresh that succeeded.
    done: Vec<(Instant, Duration)>,
    errors: Vec<String>,
    lost: Option<String>,
}

#[derive(Default)]
struct SemaLog {
    events: Vec<(Instant, Event)>,
    errors: Vec<String>,
    timeouts: u64,
}

#[derive(Default)]
struct WatchLog {
    errors: Vec<String>,
    lost: Option<String>,
}

/// Everything one session saw.
struct SessionLog {
    semaphore: usize,
    refreshes: Vec<(Instant, Duration)>,
    events: Vec<(Instant, Event)>,
    errors: Vec<String>,
    lost: Option<String>,
    acquire_timeouts: u64,
}

/// Resolves when the session should stop: the run's end passed, the lease was lost, or the run
/// was abandoned (its phase sender dropped).
async fn ended(mut phase: watch::Receiver<Phase>, mut lost: watch::Receiver<bool>) {
    loop {
        let until = match *phase.borrow_and_update() {
            Phase::Run { until } => Some(until),
            _ => None,
        };
        let deadline = async {
            match until {
                Some(until) => tokio::time::sleep_until(until.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = deadline => return,
            changed = phase.changed() => if changed.is_err() { return },
            _ = lost.wait_for(|l| *l) => return,
        }
    }
}

async fn refresh_loop(
    cfg: &SessionCfg,
    mut client: Grackle,
    lost: &watch::Sender<bool>,
    log: &mut RefreshLog,
) {
    let period = cfg.ttl / 3;
    let mut after = Instant::now();
    loop {
        let due = next_due(cfg.grid, period, cfg.index, cfg.sessions, after);
        tokio::time::sleep_until(due.into()).await;
        let request = pb::RefreshSemaphoreLeaseRequest {
            namespace_name: cfg.ns.clone(),
            lease_id: cfg.lease.clone(),
            ttl_seconds: cfg.ttl.as_secs(),
        };
        let sent = Instant::now();
        let result =
            tokio::time::timeout(REFRESH_DEADLINE, client.refresh_semaphore_lease(request)).await;
        let done = Instant::now();
        match result {
            Ok(Ok(_)) => log.done.push((done, done - sent)),
            Ok(Err(s)) if s.code() == Code::NotFound => {
                log.lost = Some("refresh NOT_FOUND".into());
                lost.send_replace(true);
                return;
            }
            Ok(Err(s)) => log.errors.push(code(&s)),
            Err(_) => log.errors.push("DeadlineExceeded".into()),
        }
        after = (due + Duration::from_nanos(1)).max(Instant::now());
    }
}

async fn watch_loop(
    cfg: &SessionCfg,
    mut api: ConchApiClient<NodeChannel>,
    lost: &watch::Sender<bool>,
    watching: &AtomicUsize,
    log: &mut WatchLog,
) {
    let mut counted = false;
    loop {
        let request = WatchLossRequest {
            namespace_name: cfg.ns.clone(),
            lease_id: cfg.lease.clone(),
            kind: WatchedLeaseKind::Semaphore as i32,
        };
        match api.watch_loss(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(message)) => match message.message {
                            Some(WatchMessage::Watching(_)) if !counted => {
                                counted = true;
                                watching.fetch_add(1, Ordering::SeqCst);
                            }
                            Some(WatchMessage::Lost(event)) => {
                                let cause = LossCause::try_from(event.cause)
                                    .map(|c| c.as_str_name().to_string())
                                    .unwrap_or_else(|_| format!("cause {}", event.cause));
                                log.lost = Some(format!("pushed {cause}"));
                                lost.send_replace(true);
                                return;
                            }
                            _ => {}
                        },
                        Ok(None) => {
                            log.errors.push("watch ended".into());
                            break;
                        }
                        Err(s) => {
                            log.errors.push(code(&s));
                            break;
                        }
                    }
                }
            }
            Err(s) if s.code() == Code::NotFound => {
                log.lost = Some("watch NOT_FOUND".into());
                lost.send_replace(true);
                return;
            }
            Err(s) => log.errors.push(code(&s)),
        }
        // Watch again, as a holder whose stream ended does.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn sema_loop(
    cfg: &SessionCfg,
    mut client: Grackle,
    mut phase: watch::Receiver<Phase>,
    log: &mut SemaLog,
) {
    let mut rng = Rng::derive(cfg.seed, cfg.index as u64);
    let mut holding = cfg.holder;
    let holder = cfg.holder;
    let wanted = move |p: &Phase| match holder {
        // A holder starts its hold time with the run; a waiter parks once told to queue.
        true => matches!(p, Phase::Run { .. }),
        false => *p != Phase::Setup,
    };
    if phase.wait_for(wanted).await.is_err() {
        return;
    }
    loop {
        if holding {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            tokio::time::sleep(exp_hold(u, cfg.hold_mean)).await;
            let request = pb::ReleaseSemaphoreRequest {
                namespace_name: cfg.ns.clone(),
                semaphore_name: cfg.semaphore_name(),
                lease_id: cfg.lease.clone(),
            };
            let sent = Instant::now();
            match tokio::time::timeout(CALL_DEADLINE, client.release_semaphore(request)).await {
                Ok(Ok(_)) => log.events.push((sent, Event::Release)),
                Ok(Err(s)) => log.errors.push(code(&s)),
                Err(_) => log.errors.push("DeadlineExceeded".into()),
            }
            holding = false;
        }
        let request = pb::AcquireSemaphoreRequest {
            namespace_name: cfg.ns.clone(),
            semaphore_name: cfg.semaphore_name(),
            lease_id: cfg.lease.clone(),
            weight: 1,
            timeout_ms: ACQUIRE_TIMEOUT_MS,
            ..Default::default()
        };
        let deadline = Duration::from_millis(ACQUIRE_TIMEOUT_MS) + CALL_DEADLINE;
        match tokio::time::timeout(deadline, client.acquire_semaphore(request)).await {
            Ok(Ok(r)) => match pb::AcquireOutcome::try_from(r.into_inner().outcome) {
                Ok(pb::AcquireOutcome::Acquired) => {
                    log.events.push((Instant::now(), Event::Grant));
                    holding = true;
                }
                Ok(pb::AcquireOutcome::TimedOut) => log.timeouts += 1,
                other => log.errors.push(format!("not acquired ({other:?})")),
            },
            Ok(Err(s)) => {
                log.errors.push(code(&s));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(_) => log.errors.push("DeadlineExceeded".into()),
        }
    }
}

/// One session, from its lease's creation to the run's end (or its lease's loss).
async fn session(
    cfg: SessionCfg,
    client: Grackle,
    api: ConchApiClient<NodeChannel>,
    phase: watch::Receiver<Phase>,
    watching: Arc<AtomicUsize>,
) -> SessionLog {
    let (lost_tx, lost_rx) = watch::channel(false);
    let mut refresh = RefreshLog::default();
    let mut sema = SemaLog::default();
    let mut watch = WatchLog::default();
    let stop = || ended(phase.clone(), lost_rx.clone());
    tokio::join!(
        async {
            tokio::select! {
                _ = stop() => {}
                _ = refresh_loop(&cfg, client.clone(), &lost_tx, &mut refresh) => {}
            }
        },
        async {
            tokio::select! {
                _ = stop() => {}
                _ = sema_loop(&cfg, client.clone(), phase.clone(), &mut sema) => {}
            }
        },
        async {
            tokio::select! {
                _ = stop() => {}
                _ = watch_loop(&cfg, api, &lost_tx, &watching, &mut watch) => {}
            }
        },
    );
    let mut errors = refresh.errors;
    errors.extend(sema.errors);
    errors.extend(watch.errors);
    SessionLog {
        semaphore: cfg.semaphore,
        refreshes: refresh.done,
        events: sema.events,
        errors,
        lost: refresh.lost.or(watch.lost),
        acquire_timeouts: sema.timeouts,
    }
}

/// The session tasks, aborted if the run is abandoned.
struct Sessions(Vec<JoinHandle<SessionLog>>);

impl Drop for Sessions {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// One node as W6 measures it.
struct NodeLook {
    id: u64,
    addr: String,
    pid: u32,
    port: u16,
    metrics: Option<String>,
}

fn established(nodes: &[NodeLook]) -> Vec<usize> {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    nodes
        .iter()
        .map(|n| established_on(&text, n.port))
        .collect()
}

fn cpu_all(nodes: &[NodeLook]) -> Vec<Option<f64>> {
    nodes.iter().map(|n| cpu_seconds(n.pid)).collect()
}

/// A node's `conch_connections_refused_total`, summed over its series: (closed for idleness,
/// refused or closed for any other reason). The bench's own status channels may sit idle
/// through a long window; a session's connection never does.
async fn refused(metrics: &Option<String>) -> Option<(u64, u64)> {
    let scraped = scrape(metrics.as_deref()?).await.ok()?;
    let mut idle = 0.0;
    let mut other = 0.0;
    for (name, value) in &scraped.series {
        if !name.starts_with("conch_connections_refused_total") {
            continue;
        }
        match name.contains("reason=\"idle\"") {
            true => idle += value,
            false => other += value,
        }
    }
    Some((idle as u64, other as u64))
}

/// One W6 run of `sessions` sessions with a measured window of `window`, on `target` (a cluster
/// this process started).
pub async fn run(
    target: &Target,
    opts: &Opts,
    sessions: usize,
    window: Duration,
    fd_limit: u64,
) -> anyhow::Result<Row> {
    let w6 = &opts.w6;
    check_fds(sessions, fd_limit)?;
    let cluster = target
        .cluster
        .as_ref()
        .context("W6 measures the nodes' processes: it needs the cluster conch-bench starts")?;
    let mut nodes = Vec::new();
    for addr in &target.endpoints {
        let (id, node) = cluster
            .nodes
            .iter()
            .find(|(_, n)| n.addr == *addr)
            .with_context(|| format!("no node serves {addr}"))?;
        let port = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .with_context(|| format!("no port in {addr}"))?;
        nodes.push(NodeLook {
            id: *id,
            addr: addr.clone(),
            pid: node
                .pid()
                .with_context(|| format!("node {id} is not running"))?,
            port,
            metrics: cluster.metrics_addr(*id),
        });
    }
    let layout = Layout::new(
        sessions,
        nodes.len(),
        w6.semaphores,
        w6.permits,
        w6.source_addresses,
    )?;
    let base_rss: Vec<f64> = nodes
        .iter()
        .map(|n| rss_mib(n.pid).unwrap_or(0.0))
        .collect();
    let leader = target.leader().await?;
    let ns = target.ns.clone();

    // The semaphores.
    let setup_start = Instant::now();
    let pool = target.clients(&leader.addr, 8).await?;
    let results = batched(layout.semaphores, IN_FLIGHT, |k| {
        let mut c = pool[k % pool.len()].clone();
        let request = pb::CreateSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: semaphore_name(k),
            permits: layout.permits,
            ..Default::default()
        };
        async move { c.create_semaphore(request).await.map(drop) }
    })
    .await;
    check_setup("create the W6 semaphores", results)?;
    drop(pool);
    let semaphores_s = secs(setup_start.elapsed());

    // The sessions: each connects, creates its lease and starts refreshing at once.
    let t = Instant::now();
    let grid = Instant::now();
    let (phase_tx, phase_rx) = watch::channel(Phase::Setup);
    let watching = Arc::new(AtomicUsize::new(0));
    let seed = 0x5E55_1045_u64 ^ sessions as u64;
    let started = batched(sessions, IN_FLIGHT, |i| {
        let addr = nodes[layout.node(i)].addr.clone();
        let from = source_address(layout.address(i));
        let ns = ns.clone();
        let phase = phase_rx.clone();
        let watching = Arc::clone(&watching);
        let (ttl, hold_mean) = (w6.ttl, w6.hold_mean);
        async move {
            let channel = connect_from(&addr, from, Duration::from_secs(5)).await?;
            let mut client =
                Grackle::new(channel.clone()).max_decoding_message_size(16 * 1024 * 1024);
            let api = ConchApiClient::new(channel);
            let request = pb::CreateSemaphoreLeaseRequest {
                namespace_name: ns.clone(),
                process_id: format!("w6-{i}"),
                ttl_seconds: ttl.as_secs(),
                ..Default::default()
            };
            let reply = tokio::time::timeout(CALL_DEADLINE, client.create_semaphore_lease(request))
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("create lease"))??;
            let lease = reply
                .into_inner()
                .lease
                .map(|l| l.lease_id)
                .ok_or_else(|| tonic::Status::internal("no lease in the reply"))?;
            let cfg = SessionCfg {
                index: i,
                sessions,
                ns,
                semaphore: layout.semaphore(i),
                lease: lease.clone(),
                holder: layout.is_holder(i),
                ttl,
                hold_mean,
                grid,
                seed,
            };
            let task = tokio::spawn(session(cfg, client.clone(), api, phase, watching));
            Ok((client, lease, task))
        }
    })
    .await;
    let mut tasks = Sessions(Vec::with_capacity(sessions));
    let mut clients = Vec::with_capacity(sessions);
    let mut first_error = None;
    let mut setup_errors = Errors::default();
    for result in started {
        match result {
            Ok((client, lease, task)) => {
                tasks.0.push(task);
                clients.push((client, lease));
            }
            Err(s) => {
                setup_errors.status(&s);
                first_error.get_or_insert(s);
            }
        }
    }
    if let Some(s) = first_error {
        bail!(
            "open the W6 sessions: {} failed {:?}; first: {:?} {}",
            setup_errors.total(),
            setup_errors.0,
            s.code(),
            s.message()
        );
    }
    let sessions_s = secs(t.elapsed());

    // The holders take their slots, each over its own connection.
    let t = Instant::now();
    let holders: Vec<usize> = (0..sessions).filter(|i| layout.is_holder(*i)).collect();
    let results = batched(holders.len(), IN_FLIGHT, |k| {
        let i = holders[k];
        let (mut client, lease) = clients[i].clone();
        let request = pb::AcquireSemaphoreRequest {
            namespace_name: ns.clone(),
            semaphore_name: semaphore_name(layout.semaphore(i)),
            lease_id: lease,
            weight: 1,
            timeout_ms: 0,
            ..Default::default()
        };
        async move {
            let reply = tokio::time::timeout(CALL_DEADLINE, client.acquire_semaphore(request))
                .await
                .map_err(|_| tonic::Status::deadline_exceeded("acquire"))??
                .into_inner();
            if reply.outcome != pb::AcquireOutcome::Acquired as i32 {
                return Err(tonic::Status::failed_precondition(format!(
                    "holder {i} not granted: outcome {}",
                    reply.outcome
                )));
            }
            Ok(())
        }
    })
    .await;
    check_setup("take the W6 holders' slots", results)?;
    drop(clients);
    let holders_s = secs(t.elapsed());

    // The waiters park; every watch answers.
    let t = Instant::now();
    let waiters = layout.waiters();
    phase_tx.send_replace(Phase::Queue);
    let wait = Duration::from_secs(60) + Duration::from_millis(10 * sessions as u64);
    let leader_id = leader.leader_id;
    let counted = crate::wait_for(
        "every W6 waiter parked and every loss watch up",
        wait,
        || {
            let watching = Arc::clone(&watching);
            async move {
                if watching.load(Ordering::SeqCst) < sessions {
                    return None;
                }
                let s = cluster.status(leader_id).await.ok()?;
                (s.waiters as usize >= waiters).then_some(s)
            }
        },
    )
    .await
    .with_context(|| {
        format!(
            "{} of {sessions} watches up",
            watching.load(Ordering::SeqCst)
        )
    })?;
    let queue_s = secs(t.elapsed());
    let setup_s = secs(setup_start.elapsed());

    // The run: a warm-up of at least one refresh period, then the window.
    let warmup = opts.warmup.max(w6.ttl / 3);
    let run_start = Instant::now();
    let window_start = run_start + warmup;
    let window_end = window_start + window;
    phase_tx.send_replace(Phase::Run { until: window_end });
    tokio::time::sleep_until(window_start.into()).await;
    let status_start = cluster.status(leader_id).await.ok();
    let cpu_start = cpu_all(&nodes);
    let bench_cpu_start = cpu_seconds(std::process::id());
    let mut rss_max = base_rss.clone();
    let mut conns_max = vec![0usize; nodes.len()];
    let mut next_conns = Instant::now();
    loop {
        for (k, node) in nodes.iter().enumerate() {
            if let Some(rss) = rss_mib(node.pid) {
                rss_max[k] = rss_max[k].max(rss);
            }
        }
        if Instant::now() >= next_conns {
            for (k, n) in established(&nodes).into_iter().enumerate() {
                conns_max[k] = conns_max[k].max(n);
            }
            next_conns = Instant::now() + Duration::from_secs(15);
        }
        let now = Instant::now();
        if now >= window_end {
            break;
        }
        let next = (now + Duration::from_secs(1)).min(window_end);
        tokio::time::sleep_until(next.into()).await;
    }
    let cpu_end = cpu_all(&nodes);
    let bench_cpu_end = cpu_seconds(std::process::id());
    for (k, n) in established(&nodes).into_iter().enumerate() {
        conns_max[k] = conns_max[k].max(n);
    }
    let status_end = cluster.status(leader_id).await.ok();
    let mut refused_nodes = Vec::new();
    let mut idle_nodes = Vec::new();
    for node in &nodes {
        let counts = refused(&node.metrics).await;
        idle_nodes.push(counts.map(|c| c.0));
        refused_nodes.push(counts.map(|c| c.1));
    }

    // Every session stops at the window's end by itself.
    let mut refreshes = Latencies::default();
    let mut events = Vec::new();
    let mut errors = Errors::default();
    let mut lost = Errors::default();
    let mut acquire_timeouts = 0;
    let mut unfinished = 0;
    let collect_by = Instant::now() + Duration::from_secs(30);
    for task in std::mem::take(&mut tasks.0) {
        let log = match tokio::time::timeout_at(collect_by.into(), task).await {
            Ok(joined) => joined.context("W6 session task")?,
            Err(_) => {
                unfinished += 1;
                continue;
            }
        };
        for (at, latency) in log.refreshes {
            if at >= window_start && at <= window_end {
                refreshes.push(latency);
            }
        }
        events.extend(
            log.events
                .into_iter()
                .map(|(at, event)| (log.semaphore, at, event)),
        );
        for e in log.errors {
            errors.add(e);
        }
        if let Some(cause) = log.lost {
            lost.add(cause);
        }
        acquire_timeouts += log.acquire_timeouts;
    }
    drop(phase_tx);
    if unfinished > 0 {
        errors.add(format!("session not stopped within 30 s ({unfinished})"));
    }
    let (grants, mut gaps) = handoffs(events, window_start, window_end);

    let window_s = secs(window);
    let cpu_s: Vec<Option<f64>> = cpu_start
        .iter()
        .zip(&cpu_end)
        .map(|(a, b)| Some(round1(b.as_ref()? - a.as_ref()?)))
        .collect();
    let cpu_pct: Vec<Option<f64>> = cpu_s
        .iter()
        .map(|c| c.map(|c| round1(c / window_s * 100.0)))
        .collect();
    let thousands = sessions as f64 / 1000.0;
    let rss_growth: f64 = rss_max.iter().zip(&base_rss).map(|(m, b)| m - b).sum();
    let cpu_total: f64 = cpu_pct.iter().flatten().sum();
    let conns_total: usize = conns_max.iter().sum();

    let mut row = Row::new("W6", sessions as u64);
    row.set("refreshes_per_s", round1(refreshes.len() as f64 / window_s));
    row.set(
        "target_refreshes_per_s",
        round1(sessions as f64 / secs(w6.ttl / 3)),
    );
    row.opt("p50_ms", refreshes.pct_ms(50.0));
    row.opt("p99_ms", refreshes.pct_ms(99.0));
    row.opt("refresh_max_ms", refreshes.pct_ms(100.0));
    row.set("leases_lost", lost.total());
    if lost.total() > 0 {
        row.set("lost_causes", lost.to_value());
    }
    row.set("errors", errors.total());
    if errors.total() > 0 {
        row.set("error_kinds", errors.to_value());
    }
    row.set("handoffs", gaps.len() as u64);
    row.set("grants_in_window", grants);
    row.set("handoffs_per_s", round1(gaps.len() as f64 / window_s));
    row.opt("handoff_p50_ms", gaps.pct_ms(50.0));
    row.opt("handoff_p99_ms", gaps.pct_ms(99.0));
    row.set("acquire_timeouts", acquire_timeouts);
    row.set(
        "rss_mb",
        round1(rss_max.iter().copied().fold(0.0, f64::max)),
    );
    row.set(
        "rss_mb_nodes",
        rss_max.iter().map(|m| round1(*m)).collect::<Vec<_>>(),
    );
    row.set(
        "base_rss_mb_nodes",
        base_rss.iter().map(|m| round1(*m)).collect::<Vec<_>>(),
    );
    row.set("cpu_s_nodes", cpu_s);
    row.set("cpu_pct_nodes", cpu_pct);
    if let (Some(a), Some(b)) = (bench_cpu_start, bench_cpu_end) {
        row.set("bench_cpu_pct", round1((b - a) / window_s * 100.0));
    }
    row.set("conns_nodes", conns_max.clone());
    row.set(
        "sessions_nodes",
        (0..nodes.len())
            .map(|k| layout.on_node(k))
            .collect::<Vec<_>>(),
    );
    row.set("refused_conns_nodes", refused_nodes);
    row.set("idle_closed_conns_nodes", idle_nodes);
    row.set("per_1k_rss_mb", round1(rss_growth / thousands));
    row.set("per_1k_cpu_pct", round1(cpu_total / thousands));
    row.set("per_1k_conns", round1(conns_total as f64 / thousands));
    if let (Some(a), Some(b)) = (&status_start, &status_end) {
        row.set(
            "raft_entries_per_s",
            round1(b.applied_index.saturating_sub(a.applied_index) as f64 / window_s),
        );
        row.set("leader_changes", b.term.saturating_sub(leader.term));
    }
    row.set("leader", leader_id);
    row.set(
        "leader_node",
        nodes
            .iter()
            .position(|n| n.id == leader_id)
            .map(|k| k as u64),
    );
    row.set("semaphores", layout.semaphores as u64);
    row.set("permits", layout.permits);
    row.set("holders", layout.holders() as u64);
    row.set("waiters", waiters as u64);
    row.set("waiters_at_setup", counted.waiters);
    row.set("source_addresses", layout.addresses as u64);
    row.set("most_per_address", layout.most_per_address() as u64);
    row.set("ttl_s", w6.ttl.as_secs());
    row.set("hold_mean_s", secs(w6.hold_mean));
    row.set("window_s", window_s);
    row.set("warmup_s", round1(secs(warmup)));
    row.set("setup_s", round1(setup_s));
    row.set("setup_semaphores_s", round1(semaphores_s));
    row.set("setup_sessions_s", round1(sessions_s));
    row.set("setup_holders_s", round1(holders_s));
    row.set("setup_queue_s", round1(queue_s));
    row.set("fd_limit", fd_limit);
    Ok(row)
}

/// One `W6 target` row: the figure beside its target (`None`: not measured).
fn target_row(figure: &str, value: Option<f64>, target: f64) -> Row {
    let mut row = Row::new("W6 target", 0);
    row.set("figure", figure);
    row.opt("value", value);
    row.set("target", format!("<= {target}"));
    let met = match value {
        Some(v) if v <= target => "met",
        Some(_) => "missed",
        None => "not measured",
    };
    row.set("met", met);
    row
}

fn number(row: &Row, key: &str) -> Option<f64> {
    row.fields.get(key).and_then(|v| v.as_f64())
}

/// The target rows of a W6 row.
pub fn target_rows(row: &Row) -> Vec<Row> {
    vec![
        target_row("leases lost", number(row, "leases_lost"), 0.0),
        target_row("errors", number(row, "errors"), 0.0),
        target_row(
            "refresh p99 ms",
            number(row, "p99_ms"),
            TARGET_REFRESH_P99_MS,
        ),
        target_row(
            "hand-off p99 ms",
            number(row, "handoff_p99_ms"),
            TARGET_HANDOFF_P99_MS,
        ),
        target_row(
            "RSS MB per node (largest)",
            number(row, "rss_mb"),
            TARGET_RSS_MB,
        ),
    ]
}

/// W6 as `conch-bench --only W6` runs it: one run with its target rows, or with `--w6-knee` the
/// knee search. Every run gets a fresh cluster.
pub async fn main(endpoints: &Option<Vec<String>>, opts: &Opts) -> anyhow::Result<Vec<Row>> {
    if endpoints.is_some() {
        bail!("W6 measures the nodes' processes: it needs the cluster conch-bench starts");
    }
    let fd_limit = raise_nofile()?;
    if !opts.w6.knee {
        check_fds(opts.w6.sessions, fd_limit)?;
        let target = Target::new(&None, "w6", opts.tls, opts.auth).await?;
        let row = run(&target, opts, opts.w6.sessions, opts.w6.duration, fd_limit).await?;
        let mut rows = target_rows(&row);
        rows.insert(0, row);
        return Ok(rows);
    }
    let most = max_sessions(fd_limit);
    let steps = match &opts.w6.knee_steps {
        Some(steps) => steps.clone(),
        None => knee_steps(most),
    };
    if let Some(too_many) = steps.iter().find(|s| fds_needed(**s) > fd_limit) {
        check_fds(*too_many, fd_limit)?;
    }
    let mut rows = Vec::new();
    let mut measured = Vec::new();
    for sessions in steps.iter().copied() {
        eprintln!("conch-bench: W6 knee step: {sessions} sessions");
        let result = async {
            let target = Target::new(&None, "w6", opts.tls, opts.auth).await?;
            run(&target, opts, sessions, opts.w6.knee_window, fd_limit).await
        }
        .await;
        let p99 = match result {
            Ok(mut row) => {
                let p99 = number(&row, "p99_ms");
                row.set("knee_step", true);
                rows.push(row);
                p99
            }
            Err(e) => {
                let mut row = Row::new("W6", sessions as u64);
                row.set("knee_step", true);
                row.set("error", format!("{e:#}"));
                rows.push(row);
                None
            }
        };
        measured.push((sessions, p99));
        if past_knee(p99, KNEE_REFRESH_P99_MS) {
            break;
        }
    }
    let knee = knee_of(&measured, KNEE_REFRESH_P99_MS);
    let mut row = Row::new("W6 knee", knee.unwrap_or(0) as u64);
    row.opt("knee_sessions", knee.map(|k| k as f64));
    row.set(
        "knee",
        match knee {
            Some(k) => format!("refresh p99 passed {KNEE_REFRESH_P99_MS} ms at {k} sessions"),
            None => format!(
                "refresh p99 stayed within {KNEE_REFRESH_P99_MS} ms up to {} sessions (the open-file limit allows {most})",
                measured.last().map_or(0, |(s, _)| *s)
            ),
        },
    );
    row.set(
        "steps",
        measured
            .iter()
            .map(|(s, p)| serde_json::json!({"sessions": s, "refresh_p99_ms": p}))
            .collect::<Vec<_>>(),
    );
    row.set("window_s", secs(opts.w6.knee_window));
    row.set("fd_limit", fd_limit);
    rows.push(row);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_thousand_sessions_are_nine_holders_and_one_waiter_per_semaphore() {
        let layout = Layout::new(10_000, 3, None, 9, None).expect("layout");
        assert_eq!(layout.semaphores, 1_000);
        assert_eq!(layout.holders(), 9_000);
        assert_eq!(layout.waiters(), 1_000);
        // Ten sessions per semaphore, nine of them holders.
        let mut per_sem = vec![(0, 0); 1_000];
        for i in 0..10_000 {
            let s = layout.semaphore(i);
            per_sem[s].0 += 1;
            if layout.is_holder(i) {
                per_sem[s].1 += 1;
            }
        }
        assert!(per_sem.iter().all(|c| *c == (10, 9)), "{per_sem:?}");
        // Even over the nodes, and a semaphore's sessions are on more than one node.
        assert_eq!(
            (0..3).map(|k| layout.on_node(k)).collect::<Vec<_>>(),
            [3_334, 3_333, 3_333]
        );
        let nodes_of_sem0: std::collections::BTreeSet<usize> = (0..10_000)
            .filter(|i| layout.semaphore(*i) == 0)
            .map(|i| layout.node(i))
            .collect();
        assert_eq!(nodes_of_sem0.len(), 3);
    }

    #[test]
    fn source_addresses_keep_every_node_under_its_per_address_cap() {
        let layout = Layout::new(10_000, 3, None, 9, None).expect("layout");
        assert_eq!(layout.addresses, 7);
        assert!(layout.most_per_address() <= ADDRESS_BUDGET);
        let knee = Layout::new(19_000, 3, None, 9, None).expect("layout");
        assert!(knee.most_per_address() <= ADDRESS_BUDGET);
        // Too few addresses given: refused, naming the cap and how many it takes.
        let err = Layout::new(10_000, 3, None, 9, Some(2))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("1000 per address"), "{err}");
        assert!(err.contains("at least 4"), "{err}");
        assert_eq!(source_address(0).to_string(), "127.0.0.2");
        assert_eq!(source_address(253).to_string(), "127.0.0.255");
        assert_eq!(source_address(254).to_string(), "127.0.1.0");
    }

    #[test]
    fn a_layout_no_run_can_have_is_refused() {
        assert!(Layout::new(0, 3, None, 9, None).is_err());
        assert!(Layout::new(30, 3, None, 0, None).is_err());
        assert!(Layout::new(30, 3, Some(31), 9, None).is_err());
        // Few sessions: one semaphore at least.
        let small = Layout::new(5, 3, None, 9, None).expect("layout");
        assert_eq!(
            (small.semaphores, small.holders(), small.waiters()),
            (1, 5, 0)
        );
    }

    #[test]
    fn refresh_slots_spread_the_sessions_over_a_period() {
        let grid = Instant::now();
        let period = Duration::from_millis(3_000);
        // Before its first slot: the first slot.
        assert_eq!(
            next_due(grid, period, 1, 3, grid),
            grid + Duration::from_millis(1_000)
        );
        // Past it: the next slot of the same phase.
        assert_eq!(
            next_due(grid, period, 1, 3, grid + Duration::from_millis(1_001)),
            grid + Duration::from_millis(4_000)
        );
        assert_eq!(
            next_due(grid, period, 1, 3, grid + Duration::from_millis(4_000)),
            grid + Duration::from_millis(4_000)
        );
        // 300 sessions created at random moments: their slots in any one period are evenly
        // spread, ten per tenth of the period.
        let mut rng = Rng::new(7);
        let from = grid + Duration::from_secs(60);
        let mut per_tenth = [0usize; 10];
        for i in 0..300 {
            let created = grid + Duration::from_millis(rng.below(50_000));
            let mut due = next_due(grid, period, i, 300, created);
            while due < from {
                due = next_due(grid, period, i, 300, due + Duration::from_nanos(1));
            }
            assert!(due < from + period);
            let tenth = ((due - from).as_nanos() * 10 / period.as_nanos()) as usize;
            per_tenth[tenth] += 1;
        }
        assert_eq!(per_tenth, [30; 10]);
    }

    #[test]
    fn hold_times_average_their_mean() {
        let mean = Duration::from_secs(30);
        assert_eq!(exp_hold(0.0, mean), Duration::ZERO);
        assert!(exp_hold(0.999_999_999, mean) <= mean * 20);
        let mut rng = Rng::new(11);
        let n = 20_000;
        let total: f64 = (0..n)
            .map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                exp_hold(u, mean).as_secs_f64()
            })
            .sum();
        let average = total / n as f64;
        assert!((28.5..31.5).contains(&average), "{average}");
    }

    #[test]
    fn hand_offs_pair_within_each_semaphore() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let events = vec![
            // Semaphore 1: released at 10, its waiter granted at 14.
            (1, ms(10), Event::Release),
            (1, ms(14), Event::Grant),
            // Semaphore 2: released at 12, granted at 40; a grant on semaphore 1 in between
            // must not take semaphore 2's release.
            (2, ms(12), Event::Release),
            (1, ms(20), Event::Release),
            (1, ms(23), Event::Grant),
            (2, ms(40), Event::Grant),
        ];
        let (grants, mut gaps) = handoffs(events, t0, ms(100));
        assert_eq!(grants, 3);
        assert_eq!(gaps.len(), 3);
        assert_eq!(gaps.pct_ms(100.0), Some(28.0));
        assert_eq!(gaps.pct_ms(50.0), Some(4.0));
        // Grants outside the window are not counted, yet consume their release.
        let events = vec![
            (1, ms(1), Event::Release),
            (1, ms(2), Event::Grant),
            (1, ms(60), Event::Release),
            (1, ms(65), Event::Grant),
        ];
        let (grants, mut gaps) = handoffs(events, ms(50), ms(100));
        assert_eq!((grants, gaps.pct_ms(50.0)), (1, Some(5.0)));
    }

    #[test]
    fn the_knee_is_the_first_step_past_the_threshold() {
        assert_eq!(
            knee_of(&[(2_000, Some(4.0)), (5_000, Some(12.0))], 50.0),
            None
        );
        assert_eq!(
            knee_of(
                &[
                    (2_000, Some(4.0)),
                    (5_000, Some(50.0)),
                    (10_000, Some(50.1))
                ],
                50.0
            ),
            Some(10_000)
        );
        // A step that measured nothing (it failed) is past the knee.
        assert_eq!(
            knee_of(&[(2_000, Some(4.0)), (5_000, None)], 50.0),
            Some(5_000)
        );
    }

    #[test]
    fn knee_steps_run_up_to_the_open_file_limit() {
        assert_eq!(
            knee_steps(max_sessions(20_000)),
            [2_000, 5_000, 10_000, 15_000, 19_000]
        );
        assert_eq!(knee_steps(20_000), [2_000, 5_000, 10_000, 15_000, 20_000]);
        assert_eq!(knee_steps(4_000), [2_000, 4_000]);
        assert_eq!(knee_steps(300), Vec::<usize>::new());
        assert!(check_fds(10_000, 20_000).is_ok());
        let err = check_fds(19_800, 20_000)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("at most 19488 sessions"), "{err}");
    }

    #[test]
    fn proc_figures_are_read_from_their_fields() {
        let stat = "4242 (conchd (x) y) S 1 4242 4242 0 -1 4194560 5000 0 0 0 731 269 0 0 20 0 \
                    9 0 123 456 789";
        assert_eq!(cpu_ticks(stat), Some(1_000));
        assert_eq!(cpu_ticks("garbage"), None);
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:1F90 0200007F:A001 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0200007F:A001 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:1F90 0300007F:A002 01 00000000:00000000 00:00000000 00000000     0        0 4 1
   4: 0100007F:1F90 0300007F:A003 06 00000000:00000000 00:00000000 00000000     0        0 5 1
";
        // Port 0x1F90 = 8080: two established server ends; the listener, the client's end and
        // the TIME_WAIT one do not count.
        assert_eq!(established_on(tcp, 8080), 2);
        assert_eq!(established_on(tcp, 8081), 0);
    }
}

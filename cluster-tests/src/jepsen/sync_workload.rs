//! The wait group and barrier workload of a Jepsen run, with its checker.
//!
//! Two lanes run rounds one after another while the nemesis injects faults. A round creates a
//! wait group of [`JOBS`] jobs and a barrier of [`PARTIES`] parties, then concurrently:
//! - workers complete random job ids from a pool (overlapping, so ids repeat), and a finisher
//!   completes the first [`JOBS`] ids of the pool, so the group must complete;
//! - waiters call `WaitForWaitGroup` until it answers `COMPLETED`;
//! - each party arrives at generation 1 and calls `WaitAtBarrier` until it answers `TRIPPED`.
//!
//! Every write carries one `conch-request-id` for all its attempts and is retried on another
//! node after a failure that may not have applied it, until it answers or the workload stops;
//! every call goes to a random node. Checks, from the recorded invocation and response times:
//! - a wait group view never shows more completed jobs than distinct ids invoked before the
//!   view's response, shows COMPLETED exactly when completed jobs equal the counter, and a
//!   waiter's COMPLETED comes only after that many distinct ids were invoked;
//! - a barrier never trips (a TRIPPED wait, an arrival answering `all_arrived`) before
//!   [`PARTIES`] distinct parties invoked their arrival, and trips exactly once per round;
//! - every waiter is released: once the workload stops (faults healed), each round's waiters
//!   must have their answer within the grace period, and the final reads must show the group
//!   COMPLETED with every job and the barrier at generation 2.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::{Code, Request};

use crate::net::NodeChannel as Channel;
use crate::rng::Rng;

/// Jobs that complete a group.
pub const JOBS: i64 = 4;
/// Parties that trip a barrier.
pub const PARTIES: usize = 3;
const POOL: [&str; 6] = ["j0", "j1", "j2", "j3", "j4", "j5"];
const LANES: u64 = 2;
const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// A wait RPC's server-side wait.
const WAIT_S: i32 = 3;

/// What the workload saw and what it found wrong.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub rounds: usize,
    pub calls: usize,
    pub violations: Vec<String>,
}

/// One round's record: what was invoked when, and what came back when.
#[derive(Default)]
struct Round {
    /// (job id, invoked at)
    jobs_invoked: Vec<(String, Instant)>,
    /// (completed_jobs, status, counter, response at)
    views: Vec<(i64, i32, i64, Instant)>,
    /// Waiter answers COMPLETED at.
    completed_answers: Vec<Instant>,
    /// Party arrival invoked at.
    arrivals_invoked: Vec<(String, Instant)>,
    /// Trips seen (a TRIPPED wait or an all_arrived arrival) at.
    trips_seen: Vec<Instant>,
}

pub struct SyncWorkload {
    stop: Arc<AtomicBool>,
    shared: Vec<Arc<Lane>>,
    lanes: Vec<JoinHandle<SyncReport>>,
}

struct Lane {
    ns: String,
    channels: Vec<(u64, Channel)>,
    rng: std::sync::Mutex<Rng>,
    stop: Arc<AtomicBool>,
    calls: AtomicUsize,
    /// Past this instant (set when the workload stops) the lane gives up waiting.
    give_up: std::sync::Mutex<Option<Instant>>,
}

fn with_id<T>(message: T, id: Option<&str>, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    if let Some(id) = id
        && let Ok(value) = id.parse()
    {
        request.metadata_mut().insert("conch-request-id", value);
    }
    request
}

/// Whether a failure may be retried (it may not have been applied, or the node could not
/// answer now). A status this process made from the HTTP/2 connection's end (a node stopping
/// sends GOAWAY, which tonic reports as `Internal`) is no answer from the server, whatever its
/// code; every call carries a request id, so the retry takes effect at most once.
fn transient(status: &tonic::Status) -> bool {
    let connection_ended = std::error::Error::source(status).is_some()
        && status.message().starts_with("h2 protocol error");
    connection_ended
        || matches!(
            status.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
        )
}

impl Lane {
    fn client(&self) -> GrackleApiClient<Channel> {
        let i = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            rng.below(self.channels.len() as u64) as usize
        };
        GrackleApiClient::new(self.channels[i].1.clone())
    }

    fn over(&self) -> bool {
        let give_up = *self.give_up.lock().unwrap_or_else(|p| p.into_inner());
        give_up.is_some_and(|t| Instant::now() >= t)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Runs `call` on random nodes until it answers something other than a transient failure,
    /// or the lane gives up (`None`).
    async fn retry<T, F, Fut>(&self, mut call: F) -> Option<Result<T, tonic::Status>>
    where
        F: FnMut(GrackleApiClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        loop {
            if self.over() {
                return None;
            }
            self.calls.fetch_add(1, Ordering::Relaxed);
            match call(self.client()).await {
                Err(s) if transient(&s) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return Some(other),
            }
        }
    }

    async fn round(self: &Arc<Self>, r: u64, lane: u64, report: &mut SyncReport) {
        let wg = format!("wg-{lane}-{r}");
        let barrier = format!("b-{lane}-{r}");
        let create_wg = pb::CreateWaitGroupRequest {
            namespace_name: self.ns.clone(),
            wait_group_name: wg.clone(),
            counter: JOBS,
            expires_at: i64::MAX,
            delete_after_finished_seconds: 3600,
            ..Default::default()
        };
        let id = format!("{wg}-create");
        match self
            .retry(|mut c| {
                let req = with_id(create_wg.clone(), Some(&id), RPC_TIMEOUT);
                async move { c.create_wait_group(req).await }
            })
            .await
        {
            Some(Ok(_)) => {}
            Some(Err(s)) => {
                report.violations.push(format!("create {wg}: {s:?}"));
                return;
            }
            None => return,
        }
        let create_b = pb::CreateBarrierRequest {
            namespace_name: self.ns.clone(),
            barrier_name: barrier.clone(),
            expected_processes: PARTIES as i64,
            delete_inactive_after_seconds: 3600,
            ..Default::default()
        };
        let id = format!("{barrier}-create");
        match self
            .retry(|mut c| {
                let req = with_id(create_b.clone(), Some(&id), RPC_TIMEOUT);
                async move { c.create_barrier(req).await }
            })
            .await
        {
            Some(Ok(_)) => {}
            Some(Err(s)) => {
                report.violations.push(format!("create {barrier}: {s:?}"));
                return;
            }
            None => return,
        }
        report.rounds += 1;
        let record = Arc::new(Mutex::new(Round::default()));
        let mut tasks: Vec<JoinHandle<Option<String>>> = Vec::new();
        // Workers and the finisher.
        let mut plans: Vec<Vec<String>> = Vec::new();
        {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..2 {
                let a = rng.below(POOL.len() as u64) as usize;
                let b = rng.below(POOL.len() as u64) as usize;
                plans.push(vec![POOL[a].to_string(), POOL[b].to_string()]);
            }
        }
        plans.push(
            POOL[..JOBS as usize]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
        // The finisher's ids complete the group; extra ids beyond the counter are refused, so
        // the workers' random ids go first only as far as they fit.
        for (w, plan) in plans.into_iter().enumerate() {
            let lane_ = Arc::clone(self);
            let record = Arc::clone(&record);
            let wg = wg.clone();
            tasks.push(tokio::spawn(async move {
                for (k, job) in plan.iter().enumerate() {
                    let req = pb::CompleteJobsFromWaitGroupRequest {
                        namespace_name: lane_.ns.clone(),
                        wait_group_name: wg.clone(),
                        jobs: vec![pb::CompleteJobRequest {
                            job_id: job.clone(),
                            metadata: Default::default(),
                        }],
                    };
                    let id = format!("{wg}-w{w}-{k}");
                    record
                        .lock()
                        .await
                        .jobs_invoked
                        .push((job.clone(), Instant::now()));
                    let answer = lane_
                        .retry(|mut c| {
                            let req = with_id(req.clone(), Some(&id), RPC_TIMEOUT);
                            async move { c.complete_jobs_from_wait_group(req).await }
                        })
                        .await;
                    match answer {
                        Some(Ok(r)) => {
                            if let Some(v) = r.into_inner().wait_group {
                                record.lock().await.views.push((
                                    v.completed_jobs,
                                    v.status,
                                    v.counter,
                                    Instant::now(),
                                ));
                            }
                        }
                        // Past the counter (a worker's id after the group filled), or the
                        // group already completed: refused, nothing changed.
                        Some(Err(s)) if s.code() == Code::InvalidArgument => {}
                        Some(Err(s)) => return Some(format!("complete {job} on {wg}: {s:?}")),
                        None => return None,
                    }
                }
                None
            }));
        }
        // Wait group waiters.
        for _ in 0..2 {
            let lane_ = Arc::clone(self);
            let record = Arc::clone(&record);
            let wg = wg.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let req = pb::WaitForWaitGroupRequest {
                        namespace_name: lane_.ns.clone(),
                        wait_group_name: wg.clone(),
                        timeout_seconds: WAIT_S,
                    };
                    let answer = lane_
                        .retry(|mut c| {
                            let req = with_id(
                                req.clone(),
                                None,
                                RPC_TIMEOUT + Duration::from_secs(WAIT_S as u64),
                            );
                            async move { c.wait_for_wait_group(req).await }
                        })
                        .await;
                    match answer {
                        Some(Ok(r)) => {
                            let r = r.into_inner();
                            let now = Instant::now();
                            let mut rec = record.lock().await;
                            if let Some(v) = &r.wait_group {
                                rec.views.push((v.completed_jobs, v.status, v.counter, now));
                            }
                            if r.outcome == pb::WaitGroupWaitOutcome::Completed as i32 {
                                rec.completed_answers.push(now);
                                return None;
                            }
                            if r.outcome != pb::WaitGroupWaitOutcome::TimedOut as i32 {
                                return Some(format!("wait for {wg}: outcome {}", r.outcome));
                            }
                        }
                        Some(Err(s)) => return Some(format!("wait for {wg}: {s:?}")),
                        None => return Some(format!("a waiter of {wg} was never released")),
                    }
                }
            }));
        }
        // Barrier parties: arrive, then wait.
        for p in 0..PARTIES {
            let lane_ = Arc::clone(self);
            let record = Arc::clone(&record);
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let who = format!("p{p}");
                let req = pb::ArriveAtBarrierRequest {
                    namespace_name: lane_.ns.clone(),
                    barrier_name: barrier.clone(),
                    process_id: who.clone(),
                    expected_generation: 1,
                    metadata: Default::default(),
                };
                let id = format!("{barrier}-{who}");
                record
                    .lock()
                    .await
                    .arrivals_invoked
                    .push((who.clone(), Instant::now()));
                match lane_
                    .retry(|mut c| {
                        let req = with_id(req.clone(), Some(&id), RPC_TIMEOUT);
                        async move { c.arrive_at_barrier(req).await }
                    })
                    .await
                {
                    Some(Ok(r)) => {
                        if r.into_inner().all_arrived {
                            record.lock().await.trips_seen.push(Instant::now());
                        }
                    }
                    Some(Err(s)) => return Some(format!("arrive {who} at {barrier}: {s:?}")),
                    None => return None,
                }
                loop {
                    let req = pb::WaitAtBarrierRequest {
                        namespace_name: lane_.ns.clone(),
                        barrier_name: barrier.clone(),
                        expected_generation: 1,
                        timeout_seconds: WAIT_S,
                    };
                    let answer = lane_
                        .retry(|mut c| {
                            let req = with_id(
                                req.clone(),
                                None,
                                RPC_TIMEOUT + Duration::from_secs(WAIT_S as u64),
                            );
                            async move { c.wait_at_barrier(req).await }
                        })
                        .await;
                    match answer {
                        Some(Ok(r))
                            if r.get_ref().outcome == pb::BarrierWaitOutcome::Tripped as i32 =>
                        {
                            record.lock().await.trips_seen.push(Instant::now());
                            return None;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(s)) => return Some(format!("wait at {barrier}: {s:?}")),
                        None => {
                            return Some(format!("party {who} of {barrier} was never released"));
                        }
                    }
                }
            }));
        }
        for task in tasks {
            match task.await {
                Ok(Some(problem)) => report.violations.push(problem),
                Ok(None) => {}
                Err(e) => report
                    .violations
                    .push(format!("a task of round {wg} failed: {e}")),
            }
        }
        let record = record.lock().await;
        check_round(&wg, &barrier, &record, &mut report.violations);
        // The final state, once the round is over (skipped when the lane gave up).
        if self.over() {
            return;
        }
        let get = pb::GetWaitGroupRequest {
            namespace_name: self.ns.clone(),
            wait_group_name: wg.clone(),
        };
        if let Some(Ok(r)) = self
            .retry(|mut c| {
                let req = with_id(get.clone(), None, RPC_TIMEOUT);
                async move { c.get_wait_group(req).await }
            })
            .await
        {
            let v = r.into_inner().wait_group.unwrap_or_default();
            if v.status != pb::WaitGroupStatus::Completed as i32 || v.completed_jobs != JOBS {
                report
                    .violations
                    .push(format!("{wg} after its round: {v:?}"));
            }
        }
        let get = pb::GetBarrierRequest {
            namespace_name: self.ns.clone(),
            barrier_name: barrier.clone(),
        };
        if let Some(Ok(r)) = self
            .retry(|mut c| {
                let req = with_id(get.clone(), None, RPC_TIMEOUT);
                async move { c.get_barrier(req).await }
            })
            .await
        {
            let b = r.into_inner().barrier.unwrap_or_default();
            if b.generation != 2 || b.arrived_processes != 0 {
                report.violations.push(format!(
                    "{barrier} after its round tripped other than once: {b:?}"
                ));
            }
        }
    }
}

fn check_round(wg: &str, barrier: &str, r: &Round, out: &mut Vec<String>) {
    let distinct_before = |t: Instant| {
        r.jobs_invoked
            .iter()
            .filter(|(_, at)| *at <= t)
            .map(|(j, _)| j.as_str())
            .collect::<BTreeSet<_>>()
            .len() as i64
    };
    for (done, status, counter, at) in &r.views {
        let completed = *status == pb::WaitGroupStatus::Completed as i32;
        if completed != (done == counter) || done > counter {
            out.push(format!(
                "{wg}: a view with {done}/{counter} jobs says status {status}"
            ));
        }
        if *done > distinct_before(*at) {
            out.push(format!(
                "{wg}: a view shows {done} jobs done, only {} distinct were invoked",
                distinct_before(*at)
            ));
        }
    }
    for at in &r.completed_answers {
        if distinct_before(*at) < JOBS {
            out.push(format!(
                "{wg}: a waiter was released before {JOBS} jobs were invoked"
            ));
        }
    }
    for at in &r.trips_seen {
        let arrived = r
            .arrivals_invoked
            .iter()
            .filter(|(_, t)| t <= at)
            .map(|(p, _)| p.as_str())
            .collect::<BTreeSet<_>>()
            .len();
        if arrived < PARTIES {
            out.push(format!(
                "{barrier}: tripped with {arrived} of {PARTIES} arrivals invoked"
            ));
        }
    }
}

impl SyncWorkload {
    /// Starts the lanes on `channels` in namespace `ns` (which exists).
    pub fn start(ns: &str, channels: Vec<(u64, Channel)>, seed: u64) -> SyncWorkload {
        SyncWorkload::start_paced(ns, channels, seed, Duration::ZERO)
    }

    /// [`SyncWorkload::start`], each lane pausing `pause` between rounds (the simulator's
    /// calls take simulated milliseconds, so unpaced lanes would pile up far more rounds per
    /// second than a real cluster serves).
    pub fn start_paced(
        ns: &str,
        channels: Vec<(u64, Channel)>,
        seed: u64,
        pause: Duration,
    ) -> SyncWorkload {
        let stop = Arc::new(AtomicBool::new(false));
        let mut lanes = Vec::new();
        let mut shared = Vec::new();
        for lane in 0..LANES {
            let l = Arc::new(Lane {
                ns: ns.to_string(),
                channels: channels.clone(),
                rng: std::sync::Mutex::new(Rng::derive(seed, 1_000 + lane)),
                stop: Arc::clone(&stop),
                calls: AtomicUsize::new(0),
                give_up: std::sync::Mutex::new(None),
            });
            shared.push(Arc::clone(&l));
            lanes.push(tokio::spawn(async move {
                let mut report = SyncReport::default();
                let mut r = 0;
                while !l.stopping() {
                    l.round(r, lane, &mut report).await;
                    r += 1;
                    if !pause.is_zero() && !l.stopping() {
                        tokio::time::sleep(pause).await;
                    }
                }
                report.calls = l.calls.load(Ordering::Relaxed);
                report
            }));
        }
        SyncWorkload {
            stop,
            shared,
            lanes,
        }
    }

    /// Stops starting rounds; the rounds under way get `grace` to finish (the faults are
    /// healed by then), after which their waiters count as never released.
    pub async fn stop(self, grace: Duration) -> SyncReport {
        self.stop.store(true, Ordering::Relaxed);
        let give_up = Instant::now() + grace;
        for lane in &self.shared {
            *lane.give_up.lock().unwrap_or_else(|p| p.into_inner()) = Some(give_up);
        }
        let mut total = SyncReport::default();
        for mut lane in self.lanes {
            // Each call is bounded, so a lane ends soon after `give_up`.
            let bound = grace + RPC_TIMEOUT * 3;
            match tokio::time::timeout(bound, &mut lane).await {
                Ok(Ok(report)) => {
                    total.rounds += report.rounds;
                    total.calls += report.calls;
                    total.violations.extend(report.violations);
                }
                Ok(Err(e)) => total.violations.push(format!("a lane failed: {e}")),
                Err(_) => {
                    lane.abort();
                    total
                        .violations
                        .push(format!("a lane did not stop within {bound:?}"));
                }
            }
        }
        total
    }
}

//! The lock workload beside the semaphore one, and its checker.
//!
//! # Workload
//!
//! Clients of their own (process numbers from [`FIRST_PROCESS`]), each with a lock lease it keeps
//! alive, take shared and exclusive locks on a small tree, [`PATHS`]: `t`, `t/a`, `t/a/x`, `t/b`,
//! and `u` beside it. A client's loop:
//! 1. without a lease believed alive: create one (the run's TTL) and start its keep-alive;
//! 2. 3%: revoke the lease (lease churn); 10%: read every lock (`ListLocks`);
//! 3. otherwise acquire a random path, shared or exclusive, waiting 0 (non-blocking) or
//!    0.3–3 s; when granted, 30% of the time acquire a second, different path with the same
//!    lease (an ancestor or a descendant of the first one as often as not: a lease never
//!    conflicts with itself), waiting 0 or 0.3 s; hold 20–400 ms (sometimes reading the locks
//!    meanwhile), then release what it holds, last taken first;
//! 4. any `unknown` acquire or release, or a lease found gone: abandon the lease (stop
//!    refreshing it and send one revoke, whatever its outcome), and start over with a new one.
//!
//! The lease rule is the semaphore workload's (the CLI's, [`conch_client::loss_after`]), and the
//! checker applies it to the history the same way (it shares the semaphore checker's lease and
//! hold logic, [`checker::lease_beliefs`] and [`checker::holds`]): a hold is *valid* from the
//! acknowledgement of its acquire until the first of the send of its release and the end of
//! belief in its lease.
//!
//! # Checks
//!
//! - **lock-conflict**: no two valid holds of different leases on the same path or on an
//!   ancestor and a descendant, at least one of them exclusive, overlap in time.
//! - **lock-fencing**: every grant carries a token; no token is granted twice; per path, a grant
//!   acknowledged before another was requested has the smaller token; and of two conflicting
//!   valid holds of a path, the one that ended before the other began has the smaller token (a
//!   waiting acquire granted at a release must get a larger token than the released hold).
//! - **lock-conflict-server**: no read lists conflicting holders, or a state that does not
//!   match its holders.
//! - **lock-lost-acquire** (no lost grant): a linearizable `ListLocks` lists, with its token
//!   and mode, every valid hold that began before the read was sent and ends after it was
//!   answered.
//! - **lock-phantom-hold**, **lock-lost-release**, **lock-lost-revoke**: every holder a read
//!   lists is explained by an acquire of that path by that lease, granted with that token and
//!   mode (or with an unknown outcome), with no release of it and no revoke of its lease
//!   acknowledged before the read.
//! - **lock-lost-lease**, **lock-lost-revoke** on lease reads (`ListLockLeases`), as for
//!   semaphore leases; **lock-orphan-hold**: a read lists no hold of a lease that an earlier
//!   lease read showed gone.
//!
//! The run adds (see [`super::run`]): final reads of the locks and the lock leases through
//! every node before the last revokes; after the drain, every node lists the same locks and
//! lock waiters, and none; and in the healed tail every path is granted at least once.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::net::NodeChannel as Channel;
use crate::rng::Rng;

use super::checker::{self, CheckResult, Hold, LeaseBelief};
use super::history::{
    CHECKER_PROCESS, LockHolderSeen, LockSeen, Micros, OkValue, Op, OpKind, Outcome, fmt_micros,
};
use super::workload::{ACQUIRE_RPC_SLACK, MAX_WAIT_MS, RPC_TIMEOUT, Shared};

/// The tree the clients lock.
pub const PATHS: [&str; 5] = ["t", "t/a", "t/a/x", "t/b", "u"];

/// Process number of the first lock client (the semaphore clients count from 0).
pub const FIRST_PROCESS: usize = 1000;

/// Random streams of the lock clients start here (far from the semaphore clients' and the
/// run's).
const RNG_STREAM: u64 = 1 << 32;

/// Whether an exclusive hold of one of these paths would conflict with any hold of the other:
/// the same path, or one an ancestor of the other.
pub fn overlapping(a: &str, b: &str) -> bool {
    a == b
        || b.strip_prefix(a).is_some_and(|rest| rest.starts_with('/'))
        || a.strip_prefix(b).is_some_and(|rest| rest.starts_with('/'))
}

/// Whether holds of two different leases conflict.
pub fn conflicting(a: &str, a_exclusive: bool, b: &str, b_exclusive: bool) -> bool {
    (a_exclusive || b_exclusive) && overlapping(a, b)
}

// ---------------------------------------------------------------------------------------------
// Workload
// ---------------------------------------------------------------------------------------------

/// What a client believes about its lock lease (the semaphore workload's rule).
struct Belief {
    deadline: Mutex<Instant>,
    lost: AtomicBool,
}

impl Belief {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn extend(&self, to: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        if to > *d {
            *d = to;
        }
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    fn valid(&self) -> bool {
        !self.lost.load(Ordering::SeqCst) && Instant::now() < self.deadline()
    }
}

/// A lock lease a client owns, kept alive until dropped.
pub struct LockLease {
    pub id: String,
    pub process: usize,
    belief: Arc<Belief>,
    keepalive: JoinHandle<()>,
}

impl LockLease {
    pub fn valid(&self) -> bool {
        self.belief.valid()
    }

    pub fn stop_keepalive(&self) {
        self.keepalive.abort();
    }
}

impl Drop for LockLease {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// What an acquire told the client.
enum Got {
    Acquired,
    /// Certainly not held (not acquired, not sent, refused).
    No,
    /// The lease is gone.
    Gone,
    /// May be held (or still queued).
    Unknown,
}

async fn create_lease(shared: &Arc<Shared>, process: usize, rng: &mut Rng) -> Option<LockLease> {
    let (node, channel) = shared.pick_node(rng);
    let ttl_s = shared.config.ttl.as_secs();
    let req = pb::CreateLockLeaseRequest {
        namespace_name: shared.config.namespace.clone(),
        process_id: format!("jepsen-l{process}"),
        ttl_seconds: ttl_s,
        ..Default::default()
    };
    let done = shared
        .call(
            process,
            node,
            OpKind::LockCreateLease { ttl_s },
            RPC_TIMEOUT,
            GrackleApiClient::new(channel).create_lock_lease(req),
            |r| OkValue::Lease {
                lease: r.lease.map(|l| l.lease_id).unwrap_or_default(),
            },
        )
        .await;
    let Outcome::Ok(OkValue::Lease { lease }) = done.outcome else {
        return None;
    };
    if lease.is_empty() {
        return None;
    }
    let belief = Arc::new(Belief {
        deadline: Mutex::new(shared.history.instant(done.invoke) + shared.config.loss_after()),
        lost: AtomicBool::new(false),
    });
    let keepalive = tokio::spawn(keep_alive(
        Arc::clone(shared),
        process,
        lease.clone(),
        Arc::clone(&belief),
        Rng::derive(rng.next_u64(), process as u64),
    ));
    if Instant::now() >= belief.deadline() {
        belief.lose();
    }
    Some(LockLease {
        id: lease,
        process,
        belief,
        keepalive,
    })
}

async fn keep_alive(
    shared: Arc<Shared>,
    process: usize,
    lease: String,
    belief: Arc<Belief>,
    mut rng: Rng,
) {
    let interval = shared.config.ttl / 4;
    let loss_after = shared.config.loss_after();
    let mut next = Instant::now() + interval;
    let (mut node, mut channel) = shared.pick_node(&mut rng);
    loop {
        tokio::time::sleep_until(next.min(belief.deadline())).await;
        let now = Instant::now();
        if now >= belief.deadline() {
            belief.lose();
            return;
        }
        let budget = (belief.deadline() - now).min(Duration::from_secs(1));
        let req = pb::RefreshLockLeaseRequest {
            namespace_name: shared.config.namespace.clone(),
            lease_id: lease.clone(),
            ..Default::default()
        };
        let done = shared
            .call(
                process,
                node,
                OpKind::LockRefresh {
                    lease: lease.clone(),
                },
                budget,
                GrackleApiClient::new(channel.clone()).refresh_lock_lease(req),
                |_| OkValue::Done,
            )
            .await;
        match done.outcome {
            Outcome::Ok(_) => {
                let sent = shared.history.instant(done.invoke);
                if shared.history.instant(done.complete) >= belief.deadline() {
                    belief.lose();
                    return;
                }
                belief.extend(sent + loss_after);
                next = sent + interval;
            }
            ref o if o.is_not_found() => {
                belief.lose();
                return;
            }
            _ => {
                (node, channel) = shared.pick_node(&mut rng);
                next = Instant::now() + Duration::from_millis(100);
            }
        }
    }
}

/// Sends one revoke of lock lease `lease`.
pub async fn revoke(shared: &Shared, process: usize, lease: &str, rng: &mut Rng) -> Outcome {
    let (node, channel) = shared.pick_node(rng);
    let req = pb::RevokeLockLeaseRequest {
        namespace_name: shared.config.namespace.clone(),
        lease_id: lease.to_string(),
    };
    shared
        .call(
            process,
            node,
            OpKind::LockRevoke {
                lease: lease.to_string(),
            },
            RPC_TIMEOUT,
            GrackleApiClient::new(channel).revoke_lock_lease(req),
            |_| OkValue::Done,
        )
        .await
        .outcome
}

async fn abandon(shared: &Shared, lease: LockLease, rng: &mut Rng) {
    lease.stop_keepalive();
    revoke(shared, lease.process, &lease.id, rng).await;
}

/// Every page of a listing (at most `max_pages`).
async fn pages<T, F, Fut>(max_pages: usize, mut page: F) -> Result<Vec<T>, tonic::Status>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, String), tonic::Status>>,
{
    let mut out = Vec::new();
    let mut token = String::new();
    for _ in 0..max_pages {
        let (items, next) = page(token).await?;
        out.extend(items);
        if next.is_empty() {
            break;
        }
        token = next;
    }
    Ok(out)
}

fn seen(lock: pb::Lock) -> LockSeen {
    LockSeen {
        path: lock.name,
        state: pb::LockState::try_from(lock.state)
            .map(|s| s.as_str_name().to_string())
            .unwrap_or_else(|_| format!("state {}", lock.state)),
        holders: lock
            .lock_holders
            .into_iter()
            .map(|h| LockHolderSeen {
                lease: h.lease_id,
                exclusive: h.exclusive,
                token: h.fencing_token,
            })
            .collect(),
    }
}

/// A linearizable `ListLocks` (all pages), recorded.
pub async fn read_locks(shared: &Shared, process: usize, node: u64, channel: Channel) -> Outcome {
    let ns = shared.config.namespace.clone();
    let request = async move {
        let client = GrackleApiClient::new(channel);
        let locks = pages(100, |pagination_token| {
            let mut client = client.clone();
            let req = pb::ListLocksRequest {
                namespace_name: ns.clone(),
                pagination_token,
                limit: 250,
            };
            async move {
                let page = client.list_locks(req).await?.into_inner();
                Ok((page.locks, page.next_pagination_token))
            }
        })
        .await?;
        Ok(tonic::Response::new(locks))
    };
    shared
        .call(
            process,
            node,
            OpKind::ReadLocks,
            RPC_TIMEOUT,
            request,
            |locks: Vec<pb::Lock>| OkValue::Locks {
                locks: locks.into_iter().map(seen).collect(),
            },
        )
        .await
        .outcome
}

/// A linearizable `ListLockLeases` (all pages), recorded.
pub async fn read_lock_leases(
    shared: &Shared,
    process: usize,
    node: u64,
    channel: Channel,
) -> Outcome {
    let ns = shared.config.namespace.clone();
    let request = async move {
        let client = GrackleApiClient::new(channel);
        let leases = pages(1000, |pagination_token| {
            let mut client = client.clone();
            let req = pb::ListLockLeasesRequest {
                namespace_name: ns.clone(),
                pagination_token,
                limit: 250,
                ..Default::default()
            };
            async move {
                let page = client.list_lock_leases(req).await?.into_inner();
                let ids = page.leases.into_iter().map(|l| l.lease_id).collect();
                Ok((ids, page.next_pagination_token))
            }
        })
        .await?;
        Ok(tonic::Response::new(leases))
    };
    shared
        .call(
            process,
            node,
            OpKind::ReadLockLeases,
            RPC_TIMEOUT * 2,
            request,
            |leases| OkValue::Leases { leases },
        )
        .await
        .outcome
}

/// The lock waiters a node lists (`ListLockWaiters`, all pages): (lease, path).
pub async fn lock_waiters(
    namespace: &str,
    channel: Channel,
) -> Result<Vec<(String, String)>, tonic::Status> {
    let client = ConchApiClient::new(channel);
    let read = pages(100, |pagination_token| {
        let mut client = client.clone();
        let req = conch_proto::conch::ListLockWaitersRequest {
            namespace_name: namespace.to_string(),
            lock_name: String::new(),
            pagination_token,
            limit: 250,
        };
        async move {
            let page = client.list_lock_waiters(req).await?.into_inner();
            let waiters = page
                .waiters
                .into_iter()
                .map(|w| (w.lease_id, w.lock_name))
                .collect();
            Ok((waiters, page.next_pagination_token))
        }
    });
    tokio::time::timeout(RPC_TIMEOUT, read)
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no reply"))?
}

async fn acquire(
    shared: &Shared,
    process: usize,
    rng: &mut Rng,
    lease: &str,
    path: &str,
    exclusive: bool,
    timeout_ms: u64,
) -> Got {
    let (node, channel) = shared.pick_node(rng);
    let req = pb::AcquireLockRequest {
        namespace_name: shared.config.namespace.clone(),
        lock_name: path.to_string(),
        exclusive,
        lease_id: lease.to_string(),
        timeout_ms,
        ..Default::default()
    };
    let outcome = shared
        .call(
            process,
            node,
            OpKind::AcquireLock {
                lease: lease.to_string(),
                path: path.to_string(),
                exclusive,
                timeout_ms,
            },
            Duration::from_millis(timeout_ms) + ACQUIRE_RPC_SLACK,
            GrackleApiClient::new(channel).acquire_lock(req),
            |r| {
                if r.outcome == pb::AcquireOutcome::Acquired as i32 {
                    OkValue::LockAcquired {
                        token: r.fencing_token,
                    }
                } else {
                    OkValue::LockNotAcquired {
                        outcome: pb::AcquireOutcome::try_from(r.outcome)
                            .map(|o| o.as_str_name().to_string())
                            .unwrap_or_else(|_| format!("outcome {}", r.outcome)),
                        reason: pb::ContentionReason::try_from(r.reason)
                            .map(|o| o.as_str_name().to_string())
                            .unwrap_or_else(|_| format!("reason {}", r.reason)),
                    }
                }
            },
        )
        .await
        .outcome;
    match outcome {
        Outcome::Ok(OkValue::LockAcquired { .. }) => Got::Acquired,
        ref o if o.is_not_found() => Got::Gone,
        Outcome::Ok(_) | Outcome::Fail { .. } => Got::No,
        Outcome::Unknown { .. } | Outcome::Pending => Got::Unknown,
    }
}

async fn release(
    shared: &Shared,
    process: usize,
    rng: &mut Rng,
    lease: &str,
    path: &str,
) -> Outcome {
    let (node, channel) = shared.pick_node(rng);
    let req = pb::ReleaseLockRequest {
        namespace_name: shared.config.namespace.clone(),
        lock_name: path.to_string(),
        lease_id: lease.to_string(),
    };
    shared
        .call(
            process,
            node,
            OpKind::ReleaseLock {
                lease: lease.to_string(),
                path: path.to_string(),
            },
            RPC_TIMEOUT,
            GrackleApiClient::new(channel).release_lock(req),
            |_| OkValue::Done,
        )
        .await
        .outcome
}

/// Releases; a release that could not be sent is retried while the lease is believed alive.
/// True when released and the lease can be used on.
async fn release_until_sent(
    shared: &Shared,
    process: usize,
    rng: &mut Rng,
    lease: &LockLease,
    path: &str,
) -> bool {
    loop {
        match release(shared, process, rng, &lease.id, path).await {
            Outcome::Ok(_) => return true,
            Outcome::Fail { code, .. } if code == "NotSent" && lease.valid() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => return false,
        }
    }
}

/// Holds for 20–400 ms, or until the lease counts as lost; true if still held.
async fn hold(shared: &Shared, process: usize, rng: &mut Rng, lease: &LockLease) -> bool {
    let hold = Duration::from_millis(rng.range(20, 400));
    let until = Instant::now() + hold;
    let read_at = rng.chance(0.3).then(|| Instant::now() + hold / 2);
    let mut read_done = false;
    while Instant::now() < until {
        if !lease.valid() {
            return false;
        }
        if let Some(at) = read_at
            && !read_done
            && Instant::now() >= at
        {
            read_done = true;
            let (node, channel) = shared.pick_node(rng);
            read_locks(shared, process, node, channel).await;
            continue;
        }
        let step = until
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(50));
        tokio::time::sleep(step).await;
    }
    lease.valid()
}

async fn pause(rng: &mut Rng, lo_ms: u64, hi_ms: u64) {
    tokio::time::sleep(Duration::from_millis(rng.range(lo_ms, hi_ms))).await;
}

fn random_path(rng: &mut Rng) -> &'static str {
    rng.pick(&PATHS).copied().unwrap_or("t")
}

/// One lock client until `stop`; returns its lease if still believed alive (it may hold locks
/// with it: the final reads look for them).
async fn run_client(
    shared: Arc<Shared>,
    process: usize,
    stop: watch::Receiver<bool>,
) -> Option<LockLease> {
    let mut rng = Rng::derive(shared.config.seed, RNG_STREAM + process as u64);
    let mut lease: Option<LockLease> = None;
    'client: while !*stop.borrow() {
        let current = match lease.take() {
            Some(current) if current.valid() => current,
            old => {
                if let Some(old) = old {
                    abandon(&shared, old, &mut rng).await;
                }
                lease = create_lease(&shared, process, &mut rng).await;
                if lease.is_none() {
                    pause(&mut rng, 100, 400).await;
                }
                continue;
            }
        };
        let roll = rng.below(100);
        if roll < 3 {
            abandon(&shared, current, &mut rng).await;
            continue;
        }
        if roll < 13 {
            let (node, channel) = shared.pick_node(&mut rng);
            read_locks(&shared, process, node, channel).await;
            lease = Some(current);
            pause(&mut rng, 0, 50).await;
            continue;
        }
        let first = random_path(&mut rng);
        let exclusive = rng.chance(0.5);
        let timeout_ms = *rng
            .pick(&[0, 0, 300, 1000, 2000, MAX_WAIT_MS])
            .unwrap_or(&0);
        match acquire(
            &shared,
            process,
            &mut rng,
            &current.id,
            first,
            exclusive,
            timeout_ms,
        )
        .await
        {
            Got::Acquired => {}
            Got::No => {
                lease = Some(current);
                pause(&mut rng, 0, 50).await;
                continue;
            }
            Got::Gone => {
                current.stop_keepalive();
                continue;
            }
            Got::Unknown => {
                abandon(&shared, current, &mut rng).await;
                continue;
            }
        }
        let mut held = vec![first];
        if rng.chance(0.3) {
            let second = random_path(&mut rng);
            if second != first {
                let exclusive = rng.chance(0.5);
                let timeout_ms = *rng.pick(&[0, 300]).unwrap_or(&0);
                match acquire(
                    &shared,
                    process,
                    &mut rng,
                    &current.id,
                    second,
                    exclusive,
                    timeout_ms,
                )
                .await
                {
                    Got::Acquired => held.push(second),
                    Got::No => {}
                    Got::Gone => {
                        current.stop_keepalive();
                        continue;
                    }
                    Got::Unknown => {
                        abandon(&shared, current, &mut rng).await;
                        continue;
                    }
                }
            }
        }
        if !hold(&shared, process, &mut rng, &current).await {
            // Lost the lease while holding: no longer a holder; start over.
            abandon(&shared, current, &mut rng).await;
            continue;
        }
        if *stop.borrow() {
            // Keep holding: the final reads must find these holds.
            lease = Some(current);
            break;
        }
        while let Some(path) = held.pop() {
            if !release_until_sent(&shared, process, &mut rng, &current, path).await {
                abandon(&shared, current, &mut rng).await;
                continue 'client;
            }
        }
        lease = Some(current);
        pause(&mut rng, 0, 50).await;
    }
    lease.filter(LockLease::valid)
}

/// The running lock clients.
pub struct LockWorkload {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Option<LockLease>>>,
}

impl LockWorkload {
    pub fn start(shared: &Arc<Shared>, clients: usize) -> LockWorkload {
        let (stop, stop_rx) = watch::channel(false);
        let tasks = (0..clients)
            .map(|c| {
                tokio::spawn(run_client(
                    Arc::clone(shared),
                    FIRST_PROCESS + c,
                    stop_rx.clone(),
                ))
            })
            .collect();
        LockWorkload { stop, tasks }
    }

    /// Tells the clients to stop without waiting for them (see [`LockWorkload::stop`]).
    pub fn signal_stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Asks every client to stop after its current operation and waits (at most `timeout`);
    /// returns the leases still alive. Stragglers are aborted.
    pub async fn stop(mut self, timeout: Duration) -> Vec<LockLease> {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + timeout;
        let mut leases = Vec::new();
        for (i, task) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(Some(lease))) => leases.push(lease),
                Ok(Ok(None)) => {}
                Ok(Err(e)) if e.is_panic() => {
                    eprintln!(
                        "jepsen: lock client l{} panicked (a harness bug): {e}",
                        FIRST_PROCESS + i
                    );
                }
                Ok(Err(_)) => {}
                Err(_) => abort.abort(),
            }
        }
        leases
    }
}

impl Drop for LockWorkload {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Every lock lease the history created and did not see revoked (or gone).
pub fn leases_to_revoke(ops: &[Op]) -> Vec<String> {
    let mut leases = BTreeMap::new();
    for op in ops {
        if let (OpKind::LockCreateLease { .. }, Outcome::Ok(OkValue::Lease { lease })) =
            (&op.kind, &op.outcome)
        {
            leases.insert(lease.clone(), true);
        }
    }
    for op in ops {
        if let OpKind::LockRevoke { lease } = &op.kind
            && (op.outcome.is_ok() || op.outcome.is_not_found())
        {
            leases.insert(lease.clone(), false);
        }
    }
    leases
        .into_iter()
        .filter_map(|(lease, live)| live.then_some(lease))
        .collect()
}

/// After the drain: every node lists the same locks and lock waiters, and none. Returns the
/// violations (check name, message). The lock reads are recorded in the history.
pub async fn check_final_state(
    shared: &Shared,
    channels: &BTreeMap<u64, Channel>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut views: BTreeMap<u64, String> = BTreeMap::new();
    for (&id, channel) in channels {
        let locks = read_locks(shared, CHECKER_PROCESS, id, channel.clone()).await;
        let waiters = lock_waiters(&shared.config.namespace, channel.clone()).await;
        let (locks, waiters) = match (locks, waiters) {
            (Outcome::Ok(OkValue::Locks { locks }), Ok(waiters)) => (locks, waiters),
            (locks, waiters) => {
                out.push((
                    "lock-drain",
                    format!(
                        "n{id} did not answer the final lock reads: locks {locks:?}, waiters {:?}",
                        waiters.err()
                    ),
                ));
                continue;
            }
        };
        if !locks.is_empty() || !waiters.is_empty() {
            out.push((
                "lock-drain",
                format!(
                    "n{id} still lists locks {locks:?} and lock waiters {waiters:?} after every lease was revoked and the drain"
                ),
            ));
        }
        views.insert(id, format!("locks {locks:?} waiters {waiters:?}"));
    }
    let distinct: BTreeSet<&String> = views.values().collect();
    if distinct.len() > 1 {
        out.push((
            "lock-agreement",
            format!("the nodes list different locks or lock waiters: {views:?}"),
        ));
    }
    out
}

/// Whether every path was granted at least once with the acknowledgement in `from..=to`; the
/// paths that were not.
pub fn paths_not_granted(ops: &[Op], from: Micros, to: Micros) -> Vec<&'static str> {
    PATHS
        .iter()
        .copied()
        .filter(|path| {
            !ops.iter().any(|op| {
                matches!(&op.kind, OpKind::AcquireLock { path: p, .. } if p == path)
                    && matches!(op.outcome, Outcome::Ok(OkValue::LockAcquired { .. }))
                    && op.complete.is_some_and(|c| c >= from && c <= to)
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Checker
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default)]
pub struct LockStats {
    pub grants: usize,
    pub hold_intervals: usize,
    pub reads_checked: usize,
    pub lease_reads_checked: usize,
    /// The most valid shared holds of one path at once.
    pub max_shared: usize,
}

/// The lock ops in the shape of the semaphore ones (a lock path as a semaphore, weight 1), so
/// that the semaphore checker's lease and hold logic applies unchanged.
fn shaped(op: &Op) -> Option<Op> {
    let kind = match &op.kind {
        OpKind::LockCreateLease { ttl_s } => OpKind::CreateLease { ttl_s: *ttl_s },
        OpKind::LockRefresh { lease } => OpKind::Refresh {
            lease: lease.clone(),
        },
        OpKind::LockRevoke { lease } => OpKind::Revoke {
            lease: lease.clone(),
        },
        OpKind::AcquireLock {
            lease,
            path,
            timeout_ms,
            ..
        } => OpKind::Acquire {
            lease: lease.clone(),
            sem: path.clone(),
            weight: 1,
            timeout_ms: *timeout_ms,
        },
        OpKind::ReleaseLock { lease, path } => OpKind::Release {
            lease: lease.clone(),
            sem: path.clone(),
        },
        _ => return None,
    };
    let outcome = match &op.outcome {
        Outcome::Ok(OkValue::LockAcquired { token }) => Outcome::Ok(OkValue::Acquired {
            token: *token,
            active_holds: 0,
            permits: 0,
        }),
        Outcome::Ok(OkValue::LockNotAcquired { outcome, .. }) => {
            Outcome::Ok(OkValue::NotAcquired {
                outcome: outcome.clone(),
                active_holds: 0,
                permits: 0,
            })
        }
        other => other.clone(),
    };
    Some(Op {
        kind,
        outcome,
        ..op.clone()
    })
}

/// A grant with its mode.
struct Grant<'a> {
    hold: &'a Hold,
    exclusive: bool,
}

impl Grant<'_> {
    fn path(&self) -> &str {
        &self.hold.sem
    }

    fn valid(&self) -> bool {
        self.hold.start < self.hold.end
    }

    fn describe(&self) -> String {
        format!(
            "{} {} of {} token={} held {}..{}",
            self.hold.lease,
            if self.exclusive {
                "exclusive"
            } else {
                "shared"
            },
            self.hold.sem,
            self.hold.token,
            fmt_micros(self.hold.start),
            fmt_micros(self.hold.end)
        )
    }
}

/// Runs every lock check on `ops` (the whole history; only lock ops are looked at).
pub fn check(ops: &[Op], loss_after: Duration) -> (CheckResult, LockStats) {
    let mut report = CheckResult::default();
    let mut stats = LockStats::default();
    let by_id: BTreeMap<usize, &Op> = ops.iter().map(|op| (op.id, op)).collect();
    let op = |id: usize| -> &Op { by_id[&id] };
    let lock_ops: Vec<Op> = ops.iter().filter_map(shaped).collect();
    let beliefs: BTreeMap<String, LeaseBelief> =
        checker::lease_beliefs(&lock_ops, checker::micros(loss_after));
    let holds = checker::holds(&lock_ops, &beliefs);
    let grants: Vec<Grant> = holds
        .iter()
        .map(|hold| Grant {
            hold,
            exclusive: matches!(
                op(hold.acquire).kind,
                OpKind::AcquireLock {
                    exclusive: true,
                    ..
                }
            ),
        })
        .collect();
    stats.grants = grants.len();
    let valid: Vec<&Grant> = grants.iter().filter(|g| g.valid()).collect();
    stats.hold_intervals = valid.len();

    // ---- conflicts between valid holds ----
    {
        let mut events: Vec<(Micros, u8, usize)> = Vec::new();
        for (i, g) in valid.iter().enumerate() {
            events.push((g.hold.start, 1, i));
            events.push((g.hold.end, 0, i)); // ends sort before starts at the same instant
        }
        events.sort();
        let mut active: BTreeSet<usize> = BTreeSet::new();
        let mut shared_on: BTreeMap<&str, usize> = BTreeMap::new();
        for (t, kind, i) in events {
            let g = valid[i];
            if kind == 0 {
                if active.remove(&i) && !g.exclusive {
                    *shared_on.entry(g.path()).or_default() -= 1;
                }
                continue;
            }
            for &j in &active {
                let other = valid[j];
                if other.hold.lease != g.hold.lease
                    && conflicting(other.path(), other.exclusive, g.path(), g.exclusive)
                {
                    let mut offending = vec![op(other.hold.acquire), op(g.hold.acquire)];
                    offending.extend(other.hold.release.map(op));
                    offending.extend(g.hold.release.map(op));
                    report.add(
                        "lock-conflict",
                        format!(
                            "at {} two leases believed they held conflicting locks: {}; {}",
                            fmt_micros(t),
                            other.describe(),
                            g.describe()
                        ),
                        offending,
                    );
                }
            }
            active.insert(i);
            if !g.exclusive {
                let n = shared_on.entry(g.path()).or_default();
                *n += 1;
                stats.max_shared = stats.max_shared.max(*n);
            }
        }
    }

    // ---- fencing ----
    let mut by_token: BTreeMap<u64, &Grant> = BTreeMap::new();
    for g in &grants {
        if g.hold.token == 0 {
            report.add(
                "lock-fencing",
                "ACQUIRED without a fencing token".into(),
                vec![op(g.hold.acquire)],
            );
            continue;
        }
        if let Some(other) = by_token.insert(g.hold.token, g) {
            report.add(
                "lock-fencing",
                format!("token {} granted twice", g.hold.token),
                vec![op(other.hold.acquire), op(g.hold.acquire)],
            );
        }
    }
    let mut per_path: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in &grants {
        per_path.entry(g.path()).or_default().push(g);
    }
    for (path, list) in &per_path {
        // Real-time order: acknowledged before the other was requested.
        let mut by_ack: Vec<&Grant> = list.clone();
        by_ack.sort_by_key(|g| g.hold.start);
        let mut by_invoke: Vec<&Grant> = list.clone();
        by_invoke.sort_by_key(|g| op(g.hold.acquire).invoke);
        let mut next = 0;
        let mut best: Option<&Grant> = None;
        for b in by_invoke {
            let invoke = op(b.hold.acquire).invoke;
            while next < by_ack.len() && by_ack[next].hold.start < invoke {
                if best.is_none_or(|x| by_ack[next].hold.token > x.hold.token) {
                    best = Some(by_ack[next]);
                }
                next += 1;
            }
            if let Some(a) = best
                && a.hold.token >= b.hold.token
            {
                report.add(
                    "lock-fencing",
                    format!(
                        "{path}: a grant with token {} was acknowledged before a grant with token {} was requested",
                        a.hold.token, b.hold.token
                    ),
                    vec![op(a.hold.acquire), op(b.hold.acquire)],
                );
            }
        }
        // Grant order of conflicting valid holds: the server granted the one that ended first
        // first (it could not grant the other before that one's hold ended, and a hold ends on
        // the server no sooner than its valid interval).
        let mut conflicting_valid: Vec<&Grant> =
            list.iter().copied().filter(|g| g.valid()).collect();
        conflicting_valid.sort_by_key(|g| g.hold.end);
        for b in &conflicting_valid {
            for a in &conflicting_valid {
                if a.hold.end > b.hold.start {
                    break;
                }
                if a.hold.lease == b.hold.lease || !(a.exclusive || b.exclusive) {
                    continue;
                }
                if a.hold.token >= b.hold.token {
                    report.add(
                        "lock-fencing",
                        format!(
                            "{path}: {} ended before {} began, yet its token is not smaller",
                            a.describe(),
                            b.describe()
                        ),
                        vec![op(a.hold.acquire), op(b.hold.acquire)],
                    );
                }
            }
        }
    }

    // ---- lock reads ----
    let mut acquires_of: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    let mut releases_of: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for o in ops {
        match &o.kind {
            OpKind::AcquireLock { lease, path, .. } => {
                acquires_of.entry((lease, path)).or_default().push(o)
            }
            OpKind::ReleaseLock { lease, path } => {
                releases_of.entry((lease, path)).or_default().push(o)
            }
            _ => {}
        }
    }
    // Lease reads that answered: (sent, answered, listed).
    let mut lease_reads: Vec<(&Op, BTreeSet<&str>)> = Vec::new();
    for read in ops {
        if let (OpKind::ReadLockLeases, Outcome::Ok(OkValue::Leases { leases })) =
            (&read.kind, &read.outcome)
        {
            lease_reads.push((read, leases.iter().map(String::as_str).collect()));
        }
    }
    for read in ops {
        let (OpKind::ReadLocks, Outcome::Ok(OkValue::Locks { locks })) =
            (&read.kind, &read.outcome)
        else {
            continue;
        };
        stats.reads_checked += 1;
        let (ri, rc) = (read.invoke, read.end());
        // (a) what the server shows is consistent in itself.
        let listed: Vec<(&str, &LockHolderSeen)> = locks
            .iter()
            .flat_map(|l| l.holders.iter().map(move |h| (l.path.as_str(), h)))
            .collect();
        for (i, (pa, a)) in listed.iter().enumerate() {
            for (pb, b) in &listed[i + 1..] {
                if a.lease != b.lease && conflicting(pa, a.exclusive, pb, b.exclusive) {
                    report.add(
                        "lock-conflict-server",
                        format!(
                            "a read lists conflicting holders: {} {} of {pa} (token {}) and {} {} of {pb} (token {})",
                            a.lease,
                            if a.exclusive { "exclusive" } else { "shared" },
                            a.token,
                            b.lease,
                            if b.exclusive { "exclusive" } else { "shared" },
                            b.token
                        ),
                        vec![read],
                    );
                }
            }
        }
        for lock in locks {
            let exclusive = lock.holders.iter().any(|h| h.exclusive);
            let expected = match (lock.holders.is_empty(), exclusive) {
                (true, _) => "LOCK_STATE_UNLOCKED",
                (false, true) => "LOCK_STATE_EXCLUSIVE_LOCKED",
                (false, false) => "LOCK_STATE_SHARED_LOCKED",
            };
            if lock.holders.is_empty() || lock.state != expected {
                report.add(
                    "lock-conflict-server",
                    format!(
                        "{} is listed as {} with holders {:?}",
                        lock.path, lock.state, lock.holders
                    ),
                    vec![read],
                );
            }
        }
        // (b) no lost grant: every hold still believed in is there, as granted.
        for g in &valid {
            if !(g.hold.start < ri && g.hold.end > rc) {
                continue;
            }
            let found = locks
                .iter()
                .filter(|l| l.path == g.path())
                .flat_map(|l| l.holders.iter())
                .find(|h| h.lease == g.hold.lease);
            match found {
                None => report.add(
                    "lock-lost-acquire",
                    format!(
                        "acknowledged hold missing from a later read: {}",
                        g.describe()
                    ),
                    vec![op(g.hold.acquire), read],
                ),
                Some(h) if h.token != g.hold.token || h.exclusive != g.exclusive => report.add(
                    "lock-lost-acquire",
                    format!(
                        "{}, but the read shows token {} {}",
                        g.describe(),
                        h.token,
                        if h.exclusive { "exclusive" } else { "shared" }
                    ),
                    vec![op(g.hold.acquire), read],
                ),
                Some(_) => {}
            }
        }
        // (c) everything listed is explained by the history.
        for (path, x) in &listed {
            if let Some(b) = beliefs.get(&x.lease)
                && let Some((at, revoke)) = b.revoked_at
                && at < ri
            {
                report.add(
                    "lock-lost-revoke",
                    format!(
                        "{} still holds {path} (token {}) after its revoke was acknowledged",
                        x.lease, x.token
                    ),
                    vec![op(revoke), read],
                );
                continue;
            }
            for (lease_read, leases) in &lease_reads {
                if lease_read.end() < ri
                    && beliefs
                        .get(&x.lease)
                        .is_some_and(|b| b.since < lease_read.invoke)
                    && !leases.contains(x.lease.as_str())
                {
                    report.add(
                        "lock-orphan-hold",
                        format!(
                            "{} holds {path} (token {}) after a lease read showed it gone",
                            x.lease, x.token
                        ),
                        vec![lease_read, read],
                    );
                    break;
                }
            }
            let acquires: Vec<&Op> = acquires_of
                .get(&(x.lease.as_str(), *path))
                .map(|v| v.iter().copied().filter(|a| a.invoke < rc).collect())
                .unwrap_or_default();
            if acquires.iter().any(|a| a.outcome.is_unknown()) {
                continue;
            }
            let granted = acquires.iter().find(|a| {
                matches!(a.outcome, Outcome::Ok(OkValue::LockAcquired { token }) if token == x.token)
            });
            let Some(granted) = granted else {
                let mut shown = acquires.clone();
                shown.push(read);
                report.add(
                    "lock-phantom-hold",
                    format!(
                        "{} holds {path} with token {} that no acquire of it was granted",
                        x.lease, x.token
                    ),
                    shown,
                );
                continue;
            };
            if let OpKind::AcquireLock { exclusive, .. } = &granted.kind
                && *exclusive != x.exclusive
            {
                report.add(
                    "lock-phantom-hold",
                    format!(
                        "{} holds {path} {}, acquired {}",
                        x.lease,
                        if x.exclusive { "exclusive" } else { "shared" },
                        if *exclusive { "exclusive" } else { "shared" }
                    ),
                    vec![granted, read],
                );
            }
            let released = releases_of.get(&(x.lease.as_str(), *path)).and_then(|v| {
                v.iter()
                    .find(|r| r.outcome.is_ok() && r.invoke >= granted.invoke && r.end() < ri)
            });
            if let Some(r) = released {
                report.add(
                    "lock-lost-release",
                    format!(
                        "{} still holds {path} (token {}) after its release was acknowledged",
                        x.lease, x.token
                    ),
                    vec![granted, r, read],
                );
            }
        }
    }

    // ---- lock lease reads ----
    for (read, listed) in &lease_reads {
        stats.lease_reads_checked += 1;
        let (ri, rc) = (read.invoke, read.end());
        for (lease, b) in &beliefs {
            if let Some((at, revoke)) = b.revoked_at
                && at < ri
                && listed.contains(lease.as_str())
            {
                report.add(
                    "lock-lost-revoke",
                    format!("lock lease {lease} is listed after its revoke was acknowledged"),
                    vec![op(revoke), read],
                );
            }
            if b.since < ri && b.until > rc && !listed.contains(lease.as_str()) {
                report.add(
                    "lock-lost-lease",
                    format!(
                        "lock lease {lease} is missing although refreshed in time (believed alive until {})",
                        fmt_micros(b.until)
                    ),
                    vec![op(b.create), read],
                );
            }
        }
    }

    (report, stats)
}

//! The workload: concurrent clients, each with a lease it keeps alive, acquiring and releasing
//! random weights on a few small semaphores, reading holders, and creating and revoking leases.
//! Every request goes to a random node (so followers forward) and is recorded in the
//! [`History`].
//!
//! A client's loop:
//! 1. without a lease believed alive: create one (TTL `ttl`) and start its keep-alive;
//! 2. 3%: revoke the lease (lease churn); 12%: read the holders of a random semaphore;
//! 3. otherwise acquire a random semaphore with weight 1..=min(2, permits), waiting 0 (non
//!    blocking) or 0.3–3 s; when granted, hold 20–400 ms (sometimes reading its own semaphore
//!    meanwhile), then release;
//! 4. any `unknown` acquire or release, or a lease found gone: abandon the lease (stop
//!    refreshing it and send one revoke, whatever its outcome), and start over with a new one.
//!
//! The lease rule is the CLI's ([`conch_client::loss_after`]): a client considers its lease
//! lost, and stops considering itself a holder, once no refresh has been acknowledged for
//! `ttl − min(max(1s, ttl/5), ttl/2)` after the *send* time of the last acknowledged one (or of
//! the create); a refresh answered `NotFound` loses it at once. The keep-alive refreshes every
//! `ttl/4` (1 s per attempt, retried on another node after a failure). The checker applies
//! the same rule to the history, so what it checks does not depend on the client's timing.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::net::NodeChannel as Channel;
use conch_proto::conch as cpb;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::rng::Rng;

use super::history::{History, HolderSeen, Micros, OkValue, OpKind, Outcome, classify};

/// Slack added to a blocking acquire's wait for the RPC deadline.
pub const ACQUIRE_RPC_SLACK: Duration = Duration::from_secs(5);
/// Deadline of the other RPCs.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait a client asks for.
pub const MAX_WAIT_MS: u64 = 3000;

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub namespace: String,
    /// (name, permits)
    pub semaphores: Vec<(String, u64)>,
    pub clients: usize,
    pub ttl: Duration,
    pub seed: u64,
}

impl WorkloadConfig {
    pub fn loss_after(&self) -> Duration {
        conch_client::loss_after(self.ttl)
    }

    pub fn permits(&self) -> BTreeMap<String, u64> {
        self.semaphores.iter().cloned().collect()
    }
}

pub struct Shared {
    pub history: Arc<History>,
    pub channels: Vec<(u64, Channel)>,
    pub config: WorkloadConfig,
}

/// What a client believes about its lease.
struct LeaseBelief {
    /// Past this instant the lease counts as lost.
    deadline: Mutex<Instant>,
    lost: AtomicBool,
}

impl LeaseBelief {
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

/// A lease a client owns, kept alive until dropped.
pub struct ClientLease {
    pub id: String,
    pub process: usize,
    belief: Arc<LeaseBelief>,
    keepalive: JoinHandle<()>,
}

impl ClientLease {
    pub fn valid(&self) -> bool {
        self.belief.valid()
    }

    /// Stops refreshing (the lease then expires on the server after its TTL unless revoked).
    pub fn stop_keepalive(&self) {
        self.keepalive.abort();
    }
}

impl Drop for ClientLease {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// One outcome of one recorded call.
pub struct Done {
    pub outcome: Outcome,
    pub invoke: Micros,
    pub complete: Micros,
}

impl Shared {
    pub fn pick_node(&self, rng: &mut Rng) -> (u64, Channel) {
        let i = rng.below(self.channels.len() as u64) as usize;
        self.channels[i].clone()
    }

    /// Sends one RPC, recording it as `kind` from `process` to `node`.
    pub async fn call<T, Fut>(
        &self,
        process: usize,
        node: u64,
        kind: OpKind,
        timeout: Duration,
        request: Fut,
        ok: impl FnOnce(T) -> OkValue,
    ) -> Done
    where
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let (id, invoke) = self.history.invoke(process, node, kind);
        let outcome = match tokio::time::timeout(timeout, request).await {
            Ok(Ok(reply)) => Outcome::Ok(ok(reply.into_inner())),
            Ok(Err(status)) => classify(&status),
            Err(_) => Outcome::Unknown {
                reason: format!("no reply within {timeout:?}"),
            },
        };
        let complete = self.history.complete(id, outcome.clone());
        Done {
            outcome,
            invoke,
            complete,
        }
    }

    pub async fn create_lease(
        self: &Arc<Self>,
        process: usize,
        rng: &mut Rng,
    ) -> Option<ClientLease> {
        let (node, channel) = self.pick_node(rng);
        let ttl_s = self.config.ttl.as_secs();
        let req = pb::CreateSemaphoreLeaseRequest {
            namespace_name: self.config.namespace.clone(),
            process_id: format!("jepsen-c{process}"),
            ttl_seconds: ttl_s,
            ..Default::default()
        };
        let done = self
            .call(
                process,
                node,
                OpKind::CreateLease { ttl_s },
                RPC_TIMEOUT,
                GrackleApiClient::new(channel).create_semaphore_lease(req),
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
        let belief = Arc::new(LeaseBelief {
            deadline: Mutex::new(self.history.instant(done.invoke) + self.config.loss_after()),
            lost: AtomicBool::new(false),
        });
        let keepalive = tokio::spawn(Arc::clone(self).keep_alive(
            process,
            lease.clone(),
            Arc::clone(&belief),
            Rng::derive(rng.next_u64(), process as u64),
        ));
        if Instant::now() >= belief.deadline() {
            belief.lose();
        }
        Some(ClientLease {
            id: lease,
            process,
            belief,
            keepalive,
        })
    }

    async fn keep_alive(
        self: Arc<Self>,
        process: usize,
        lease: String,
        belief: Arc<LeaseBelief>,
        mut rng: Rng,
    ) {
        let interval = self.config.ttl / 4;
        let loss_after = self.config.loss_after();
        let mut next = Instant::now() + interval;
        let (mut node, mut channel) = self.pick_node(&mut rng);
        loop {
            tokio::time::sleep_until(next.min(belief.deadline())).await;
            let now = Instant::now();
            if now >= belief.deadline() {
                belief.lose();
                return;
            }
            let budget = (belief.deadline() - now).min(Duration::from_secs(1));
            let req = pb::RefreshSemaphoreLeaseRequest {
                namespace_name: self.config.namespace.clone(),
                lease_id: lease.clone(),
                ..Default::default()
            };
            let done = self
                .call(
                    process,
                    node,
                    OpKind::Refresh {
                        lease: lease.clone(),
                    },
                    budget,
                    GrackleApiClient::new(channel.clone()).refresh_semaphore_lease(req),
                    |_| OkValue::Done,
                )
                .await;
            match done.outcome {
                Outcome::Ok(_) => {
                    let sent = self.history.instant(done.invoke);
                    if self.history.instant(done.complete) >= belief.deadline() {
                        // Acknowledged too late: the client had already given the lease up.
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
                    // Try another node soon.
                    (node, channel) = self.pick_node(&mut rng);
                    next = Instant::now() + Duration::from_millis(100);
                }
            }
        }
    }

    /// Stops refreshing `lease` and sends one revoke (its outcome does not matter to the
    /// client: an unrevoked lease expires after its TTL).
    pub async fn abandon(&self, lease: ClientLease, rng: &mut Rng) {
        lease.stop_keepalive();
        self.revoke(lease.process, &lease.id, rng).await;
    }

    pub async fn revoke(&self, process: usize, lease: &str, rng: &mut Rng) -> Outcome {
        let (node, channel) = self.pick_node(rng);
        let req = pb::RevokeSemaphoreLeaseRequest {
            namespace_name: self.config.namespace.clone(),
            lease_id: lease.to_string(),
        };
        self.call(
            process,
            node,
            OpKind::Revoke {
                lease: lease.to_string(),
            },
            RPC_TIMEOUT,
            GrackleApiClient::new(channel).revoke_semaphore_lease(req),
            |_| OkValue::Done,
        )
        .await
        .outcome
    }

    pub async fn read_holders(
        &self,
        process: usize,
        node: u64,
        channel: Channel,
        sem: &str,
    ) -> Outcome {
        let ns = self.config.namespace.clone();
        let sem_name = sem.to_string();
        let request = async move {
            let client = GrackleApiClient::new(channel);
            // Pages are bounded: a semaphore here has at most a few holders.
            let holders = all_pages(100, |pagination_token| {
                let mut client = client.clone();
                let req = pb::ListSemaphoreHoldersRequest {
                    namespace_name: ns.clone(),
                    semaphore_name: sem_name.clone(),
                    pagination_token,
                    limit: 250,
                };
                async move {
                    let page = client.list_semaphore_holders(req).await?.into_inner();
                    Ok((page.holders, page.next_pagination_token))
                }
            })
            .await?;
            Ok(tonic::Response::new(holders))
        };
        self.call(
            process,
            node,
            OpKind::ReadHolders {
                sem: sem.to_string(),
            },
            RPC_TIMEOUT,
            request,
            |holders: Vec<pb::SemaphoreHolder>| OkValue::Holders {
                holders: holders
                    .into_iter()
                    .map(|h| HolderSeen {
                        lease: h.lease_id,
                        weight: h.weight,
                        token: h.fencing_token,
                    })
                    .collect(),
            },
        )
        .await
        .outcome
    }

    pub async fn read_leases(&self, process: usize, node: u64, channel: Channel) -> Outcome {
        let ns = self.config.namespace.clone();
        let request = async move {
            let client = GrackleApiClient::new(channel);
            let leases = all_pages(1000, |pagination_token| {
                let mut client = client.clone();
                let req = pb::ListSemaphoreLeasesRequest {
                    namespace_name: ns.clone(),
                    pagination_token,
                    limit: 250,
                    ..Default::default()
                };
                async move {
                    let page = client.list_semaphore_leases(req).await?.into_inner();
                    let ids = page.leases.into_iter().map(|l| l.lease_id).collect();
                    Ok((ids, page.next_pagination_token))
                }
            })
            .await?;
            Ok(tonic::Response::new(leases))
        };
        self.call(
            process,
            node,
            OpKind::ReadLeases,
            RPC_TIMEOUT * 2,
            request,
            |leases| OkValue::Leases { leases },
        )
        .await
        .outcome
    }

    async fn acquire(
        &self,
        process: usize,
        rng: &mut Rng,
        lease: &str,
        sem: &str,
        weight: u64,
        timeout_ms: u64,
    ) -> Outcome {
        let (node, channel) = self.pick_node(rng);
        let req = pb::AcquireSemaphoreRequest {
            namespace_name: self.config.namespace.clone(),
            semaphore_name: sem.to_string(),
            lease_id: lease.to_string(),
            weight,
            timeout_ms,
            ..Default::default()
        };
        self.call(
            process,
            node,
            OpKind::Acquire {
                lease: lease.to_string(),
                sem: sem.to_string(),
                weight,
                timeout_ms,
            },
            Duration::from_millis(timeout_ms) + ACQUIRE_RPC_SLACK,
            GrackleApiClient::new(channel).acquire_semaphore(req),
            |r| {
                let (active_holds, permits) = r
                    .semaphore
                    .as_ref()
                    .map(|s| (s.active_holds, s.permits))
                    .unwrap_or_default();
                if r.outcome == pb::AcquireOutcome::Acquired as i32 {
                    OkValue::Acquired {
                        token: r.fencing_token,
                        active_holds,
                        permits,
                    }
                } else {
                    let outcome = pb::AcquireOutcome::try_from(r.outcome)
                        .map(|o| o.as_str_name().to_string())
                        .unwrap_or_else(|_| format!("outcome {}", r.outcome));
                    OkValue::NotAcquired {
                        outcome,
                        active_holds,
                        permits,
                    }
                }
            },
        )
        .await
        .outcome
    }

    /// All or none (`conch.v1 AcquireSemaphores`) of `members`, each `(semaphore, weight)`.
    async fn acquire_set(
        &self,
        process: usize,
        rng: &mut Rng,
        lease: &str,
        members: &[(String, u64)],
        timeout_ms: u64,
    ) -> Outcome {
        let (node, channel) = self.pick_node(rng);
        let req = cpb::AcquireSemaphoresRequest {
            namespace_name: self.config.namespace.clone(),
            lease_id: lease.to_string(),
            semaphores: members
                .iter()
                .map(|(sem, weight)| cpb::SetMember {
                    semaphore_name: sem.clone(),
                    weight: *weight,
                })
                .collect(),
            timeout_ms,
            ..Default::default()
        };
        self.call(
            process,
            node,
            OpKind::AcquireSet {
                lease: lease.to_string(),
                members: members.to_vec(),
                timeout_ms,
            },
            Duration::from_millis(timeout_ms) + ACQUIRE_RPC_SLACK,
            ConchApiClient::new(channel).acquire_semaphores(req),
            |r| {
                if r.outcome == pb::AcquireOutcome::Acquired as i32 {
                    OkValue::SetAcquired {
                        tokens: r.grants.iter().map(|g| g.fencing_token).collect(),
                    }
                } else {
                    let outcome = pb::AcquireOutcome::try_from(r.outcome)
                        .map(|o| o.as_str_name().to_string())
                        .unwrap_or_else(|_| format!("outcome {}", r.outcome));
                    OkValue::NotAcquired {
                        outcome,
                        active_holds: 0,
                        permits: 0,
                    }
                }
            },
        )
        .await
        .outcome
    }

    async fn release(&self, process: usize, rng: &mut Rng, lease: &str, sem: &str) -> Outcome {
        let (node, channel) = self.pick_node(rng);
        let req = pb::ReleaseSemaphoreRequest {
            namespace_name: self.config.namespace.clone(),
            semaphore_name: sem.to_string(),
            lease_id: lease.to_string(),
        };
        self.call(
            process,
            node,
            OpKind::Release {
                lease: lease.to_string(),
                sem: sem.to_string(),
            },
            RPC_TIMEOUT,
            GrackleApiClient::new(channel).release_semaphore(req),
            |r| {
                let (active_holds, permits) = r
                    .semaphore
                    .as_ref()
                    .map(|s| (s.active_holds, s.permits))
                    .unwrap_or_default();
                OkValue::Released {
                    active_holds,
                    permits,
                }
            },
        )
        .await
        .outcome
    }

    /// Holds for `hold`, or until the lease counts as lost. Returns whether it is still held.
    async fn hold(&self, process: usize, rng: &mut Rng, lease: &ClientLease, sem: &str) -> bool {
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
                let (node, channel) = self.pick_node(rng);
                self.read_holders(process, node, channel, sem).await;
                continue;
            }
            let step = until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
            tokio::time::sleep(step).await;
        }
        lease.valid()
    }

    /// One client until `stop`; returns its lease if it is still believed alive (it may hold a
    /// semaphore with it: the final check looks for that hold).
    pub async fn run_client(
        self: Arc<Self>,
        process: usize,
        stop: watch::Receiver<bool>,
    ) -> Option<ClientLease> {
        let mut rng = Rng::derive(self.config.seed, 1 + process as u64);
        let mut lease: Option<ClientLease> = None;
        while !*stop.borrow() {
            if !lease.as_ref().is_some_and(ClientLease::valid) {
                if let Some(old) = lease.take() {
                    self.abandon(old, &mut rng).await;
                }
                lease = self.create_lease(process, &mut rng).await;
                if lease.is_none() {
                    pause(&mut rng, 100, 400).await;
                }
                continue;
            }
            let Some(current) = lease.as_ref() else {
                continue;
            };
            let roll = rng.below(100);
            if roll < 3 {
                if let Some(old) = lease.take() {
                    self.abandon(old, &mut rng).await;
                }
                continue;
            }
            if roll < 15 {
                let (node, channel) = self.pick_node(&mut rng);
                let sem = self.random_sem(&mut rng).0;
                self.read_holders(process, node, channel, &sem).await;
                pause(&mut rng, 0, 50).await;
                continue;
            }
            let (sem, permits) = self.random_sem(&mut rng);
            let weight = rng.range(1, permits.min(2));
            let timeout_ms = *rng
                .pick(&[0, 0, 300, 1000, 2000, MAX_WAIT_MS])
                .unwrap_or(&0);
            let lease_id = current.id.clone();
            // One acquire in four takes two semaphores all or none (with a second one distinct
            // from the first), then releases both.
            let (other, other_permits) = self.random_sem(&mut rng);
            let set = (roll < 35 && other != sem).then(|| {
                let other_weight = rng.range(1, other_permits.min(2));
                vec![(sem.clone(), weight), (other, other_weight)]
            });
            let outcome = match &set {
                Some(members) => {
                    self.acquire_set(process, &mut rng, &lease_id, members, timeout_ms)
                        .await
                }
                None => {
                    self.acquire(process, &mut rng, &lease_id, &sem, weight, timeout_ms)
                        .await
                }
            };
            match outcome {
                Outcome::Ok(OkValue::SetAcquired { .. }) => {
                    let members = set.unwrap_or_default();
                    if !self.hold(process, &mut rng, current, &sem).await {
                        if let Some(old) = lease.take() {
                            self.abandon(old, &mut rng).await;
                        }
                        continue;
                    }
                    if *stop.borrow() {
                        break; // keep holding: the final read must find these holds
                    }
                    for (member, _) in &members {
                        if !self
                            .release_until_sent(process, &mut rng, current, member)
                            .await
                        {
                            if let Some(old) = lease.take() {
                                self.abandon(old, &mut rng).await;
                            }
                            break;
                        }
                    }
                }
                Outcome::Ok(OkValue::Acquired { .. }) => {
                    if !self.hold(process, &mut rng, current, &sem).await {
                        // Lost the lease (before the grant arrived or while holding): no
                        // longer a holder. Start over with a new lease.
                        if let Some(old) = lease.take() {
                            self.abandon(old, &mut rng).await;
                        }
                        continue;
                    }
                    if *stop.borrow() {
                        break; // keep holding: the final read must find this hold
                    }
                    if !self
                        .release_until_sent(process, &mut rng, current, &sem)
                        .await
                        && let Some(old) = lease.take()
                    {
                        self.abandon(old, &mut rng).await;
                    }
                }
                Outcome::Ok(_) => {}
                Outcome::Fail { code, .. } if code == "NotSent" => {}
                ref o if o.is_not_found() => {
                    // The lease is gone.
                    if let Some(old) = lease.take() {
                        old.stop_keepalive();
                    }
                }
                Outcome::Fail { .. } => {}
                Outcome::Unknown { .. } | Outcome::Pending => {
                    // The acquire may be granted (or still queued): drop the lease with
                    // whatever it may hold.
                    if let Some(old) = lease.take() {
                        self.abandon(old, &mut rng).await;
                    }
                }
            }
            pause(&mut rng, 0, 50).await;
        }
        lease.filter(ClientLease::valid)
    }

    /// Releases; a release that could not be sent is retried while the lease is believed
    /// alive. Returns true when released and the lease can be used on.
    async fn release_until_sent(
        &self,
        process: usize,
        rng: &mut Rng,
        lease: &ClientLease,
        sem: &str,
    ) -> bool {
        loop {
            match self.release(process, rng, &lease.id, sem).await {
                Outcome::Ok(_) => return true,
                Outcome::Fail { code, .. } if code == "NotSent" && lease.valid() => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => return false,
            }
        }
    }

    fn random_sem(&self, rng: &mut Rng) -> (String, u64) {
        rng.pick(&self.config.semaphores)
            .cloned()
            .unwrap_or_else(|| ("s0".into(), 1))
    }
}

async fn pause(rng: &mut Rng, lo_ms: u64, hi_ms: u64) {
    tokio::time::sleep(Duration::from_millis(rng.range(lo_ms, hi_ms))).await;
}

/// The running clients.
pub struct Workload {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Option<ClientLease>>>,
}

impl Workload {
    pub fn start(shared: &Arc<Shared>) -> Workload {
        let (stop, stop_rx) = watch::channel(false);
        let tasks = (0..shared.config.clients)
            .map(|c| tokio::spawn(Arc::clone(shared).run_client(c, stop_rx.clone())))
            .collect();
        Workload { stop, tasks }
    }

    /// Asks every client to stop after its current operation and waits (at most `timeout`)
    /// for them; returns the leases still alive. Stragglers are aborted (their pending
    /// operations stay unknown).
    pub async fn stop(mut self, timeout: Duration) -> Vec<ClientLease> {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + timeout;
        let mut leases = Vec::new();
        for (process, task) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(Some(lease))) => leases.push(lease),
                Ok(Ok(None)) => {}
                Ok(Err(e)) if e.is_panic() => {
                    eprintln!("jepsen: client c{process} panicked (a harness bug): {e}");
                }
                Ok(Err(_)) => {}
                Err(_) => abort.abort(),
            }
        }
        leases
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Every page of a listing, `max_pages` at most: `page(token)` fetches the page at `token`
/// (empty: the first) and returns its items and the next page's token (empty: the last).
async fn all_pages<T, F, Fut>(max_pages: usize, mut page: F) -> Result<Vec<T>, tonic::Status>
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

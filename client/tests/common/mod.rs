//! An in-process stand-in for a conch cluster, to test the client and the CLI without conchd.
//!
//! One shared, in-memory semaphore state (namespaces, semaphores, leases with TTLs, strict FIFO
//! waiters that re-attach by (semaphore, lease)) is served by N tonic servers, each behind a TCP
//! proxy that a test can cut (`sever`: connections dropped, new ones refused) or freeze
//! (`stall`: bytes stop flowing, like a SIGSTOPped node). It follows the server behaviour the
//! client relies on, not every corner of the Grackle API; the real thing is tested against
//! conchd in cluster-tests.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use conch_proto::conch::conch_admin_server::{ConchAdmin, ConchAdminServer};
use conch_proto::conch::conch_api_server::{ConchApi, ConchApiServer};
use conch_proto::conch::*;
use conch_proto::grackle::grackle_api_server::{GrackleApi, GrackleApiServer};
use conch_proto::grackle::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tonic::{Request, Response, Status};

type Res<T> = Result<Response<T>, Status>;

#[derive(Debug, Clone)]
struct Holder {
    lease: String,
    weight: u64,
    token: u64,
    metadata: HashMap<String, String>,
    locked_at: i64,
}

#[derive(Debug, Clone)]
struct Waiter {
    lease: String,
    weight: u64,
    deadline: Instant,
    metadata: HashMap<String, String>,
    queued_at: i64,
}

#[derive(Debug, Default)]
struct Sem {
    permits: u64,
    holders: Vec<Holder>,
    queue: VecDeque<Waiter>,
}

impl Sem {
    fn held(&self) -> u64 {
        self.holders.iter().map(|h| h.weight).sum()
    }
}

#[derive(Debug, Clone)]
struct LeaseRec {
    ns: String,
    ttl: Duration,
    expires: Instant,
    process_id: String,
}

#[derive(Debug, Default)]
pub struct State {
    namespaces: BTreeMap<String, ()>,
    sems: BTreeMap<(String, String), Sem>,
    leases: BTreeMap<String, LeaseRec>,
    next_token: u64,
    next_lease: u64,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl State {
    fn grant_pass(&mut self) {
        for sem in self.sems.values_mut() {
            while let Some(head) = sem.queue.front() {
                if sem.held() + head.weight > sem.permits {
                    break;
                }
                let w = sem.queue.pop_front().expect("front exists");
                self.next_token += 1;
                sem.holders.push(Holder {
                    lease: w.lease,
                    weight: w.weight,
                    token: self.next_token,
                    metadata: w.metadata,
                    locked_at: now_ns(),
                });
            }
        }
    }

    fn drop_lease(&mut self, id: &str) {
        self.leases.remove(id);
        for sem in self.sems.values_mut() {
            sem.holders.retain(|h| h.lease != id);
            sem.queue.retain(|w| w.lease != id);
        }
        self.grant_pass();
    }

    /// Expires due leases; true if anything changed.
    fn expire(&mut self) -> bool {
        let now = Instant::now();
        let due: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &due {
            self.drop_lease(id);
        }
        !due.is_empty()
    }

    fn semaphore(&self, ns: &str, name: &str) -> Option<Semaphore> {
        let s = self.sems.get(&(ns.to_string(), name.to_string()))?;
        Some(Semaphore {
            name: name.to_string(),
            permits: s.permits,
            active_holds: s.held(),
            active_holders_count: s.holders.len() as u64,
            waiters_count: s.queue.len() as u64,
            version: 1,
            ..Default::default()
        })
    }
}

pub struct Shared {
    state: Mutex<State>,
    notify: Notify,
    leader: Mutex<Option<String>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn changed(&self) {
        self.notify.notify_waiters();
    }
}

#[derive(Clone)]
struct Service {
    shared: Arc<Shared>,
    /// This node's proxy mode: a node that is down or stalled commits nothing, so the calls
    /// cut off with it never remove their waiters (as when a Raft leader crashes).
    mode: watch::Receiver<Mode>,
    node: usize,
    addr: String,
    requests: Arc<AtomicU64>,
}

impl Service {
    fn reply<T>(&self, msg: T) -> Res<T> {
        let mut r = Response::new(msg);
        if let Some(l) = self.shared.leader.lock().unwrap().clone() {
            r.metadata_mut().insert("conch-leader", l.parse().unwrap());
        }
        Ok(r)
    }
    fn count(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
    }
}

/// Removes a cancelled call's waiter unless a later call extended it.
struct CancelGuard {
    shared: Arc<Shared>,
    mode: watch::Receiver<Mode>,
    key: (String, String),
    lease: String,
    my_deadline: Instant,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.armed || *self.mode.borrow() != Mode::Up {
            return;
        }
        let mut st = self.shared.lock();
        if let Some(sem) = st.sems.get_mut(&self.key) {
            sem.queue
                .retain(|w| !(w.lease == self.lease && w.deadline <= self.my_deadline));
        }
        st.grant_pass();
        drop(st);
        self.shared.changed();
    }
}

#[tonic::async_trait]
impl GrackleApi for Service {
    async fn create_namespace(
        &self,
        r: Request<CreateNamespaceRequest>,
    ) -> Res<CreateNamespaceResponse> {
        self.count();
        let r = r.into_inner();
        let mut st = self.shared.lock();
        if st.namespaces.contains_key(&r.name) {
            return Err(Status::already_exists(format!("namespace {}", r.name)));
        }
        st.namespaces.insert(r.name.clone(), ());
        drop(st);
        self.reply(CreateNamespaceResponse {
            namespace: Some(Namespace {
                name: r.name,
                version: 1,
                ..Default::default()
            }),
        })
    }
    async fn list_namespaces(
        &self,
        _: Request<ListNamespacesRequest>,
    ) -> Res<ListNamespacesResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn get_namespace(&self, r: Request<GetNamespaceRequest>) -> Res<GetNamespaceResponse> {
        self.count();
        let r = r.into_inner();
        if !self
            .shared
            .lock()
            .namespaces
            .contains_key(&r.namespace_name)
        {
            return Err(Status::not_found(format!("namespace {}", r.namespace_name)));
        }
        self.reply(GetNamespaceResponse {
            namespace: Some(Namespace {
                name: r.namespace_name,
                version: 1,
                ..Default::default()
            }),
        })
    }
    async fn update_namespace(
        &self,
        _: Request<UpdateNamespaceRequest>,
    ) -> Res<UpdateNamespaceResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn delete_namespace(
        &self,
        r: Request<DeleteNamespaceRequest>,
    ) -> Res<DeleteNamespaceResponse> {
        self.count();
        let ns = r.into_inner().namespace_name;
        let mut st = self.shared.lock();
        st.namespaces.remove(&ns);
        st.sems.retain(|(n, _), _| *n != ns);
        st.leases.retain(|_, l| l.ns != ns);
        drop(st);
        self.shared.changed();
        self.reply(DeleteNamespaceResponse {})
    }
    async fn create_semaphore(
        &self,
        r: Request<CreateSemaphoreRequest>,
    ) -> Res<CreateSemaphoreResponse> {
        self.count();
        let r = r.into_inner();
        let mut st = self.shared.lock();
        if !st.namespaces.contains_key(&r.namespace_name) {
            return Err(Status::not_found(format!("namespace {}", r.namespace_name)));
        }
        let key = (r.namespace_name.clone(), r.semaphore_name.clone());
        if st.sems.contains_key(&key) {
            return Err(Status::already_exists(format!(
                "semaphore {}",
                r.semaphore_name
            )));
        }
        st.sems.insert(
            key,
            Sem {
                permits: r.permits,
                ..Default::default()
            },
        );
        let sem = st.semaphore(&r.namespace_name, &r.semaphore_name);
        drop(st);
        self.reply(CreateSemaphoreResponse { semaphore: sem })
    }
    async fn list_semaphores(
        &self,
        _: Request<ListSemaphoresRequest>,
    ) -> Res<ListSemaphoresResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn get_semaphore(&self, r: Request<GetSemaphoreRequest>) -> Res<GetSemaphoreResponse> {
        self.count();
        let r = r.into_inner();
        let st = self.shared.lock();
        match st.semaphore(&r.namespace_name, &r.semaphore_name) {
            Some(s) => {
                drop(st);
                self.reply(GetSemaphoreResponse { semaphore: Some(s) })
            }
            None => Err(Status::not_found(format!("semaphore {}", r.semaphore_name))),
        }
    }
    async fn acquire_semaphore(
        &self,
        r: Request<AcquireSemaphoreRequest>,
    ) -> Res<AcquireSemaphoreResponse> {
        self.count();
        let r = r.into_inner();
        let timeout = if r.timeout_ms > 0 {
            Duration::from_millis(r.timeout_ms)
        } else {
            Duration::from_secs(r.timeout_seconds.max(0) as u64)
        };
        let weight = r.weight.max(1);
        let key = (r.namespace_name.clone(), r.semaphore_name.clone());
        let lease = r.lease_id.clone();
        let acquired = |st: &State, token: u64| AcquireSemaphoreResponse {
            semaphore: st.semaphore(&key.0, &key.1),
            success: true,
            outcome: AcquireOutcome::Acquired as i32,
            fencing_token: token,
        };
        let not_acquired = |st: &State, outcome: AcquireOutcome| AcquireSemaphoreResponse {
            semaphore: st.semaphore(&key.0, &key.1),
            success: false,
            outcome: outcome as i32,
            fencing_token: 0,
        };
        let my_deadline = Instant::now() + timeout;
        {
            let mut st = self.shared.lock();
            st.expire();
            if !st.leases.contains_key(&lease) {
                return Err(Status::not_found(format!("lease {lease}")));
            }
            let Some(sem) = st.sems.get_mut(&key) else {
                return Err(Status::not_found(format!("semaphore {}", key.1)));
            };
            if weight > sem.permits {
                return Err(Status::invalid_argument("weight exceeds semaphore permits"));
            }
            if let Some(h) = sem.holders.iter_mut().find(|h| h.lease == lease) {
                h.weight = weight;
                let token = h.token;
                let resp = acquired(&st, token);
                drop(st);
                return self.reply(resp);
            }
            if timeout.is_zero() {
                let fits = sem.queue.is_empty() && sem.held() + weight <= sem.permits;
                if !fits {
                    let resp = not_acquired(&st, AcquireOutcome::Unavailable);
                    drop(st);
                    return self.reply(resp);
                }
            }
            if let Some(w) = sem.queue.iter_mut().find(|w| w.lease == lease) {
                w.deadline = w.deadline.max(my_deadline);
            } else {
                sem.queue.push_back(Waiter {
                    lease: lease.clone(),
                    weight,
                    deadline: my_deadline,
                    metadata: r.metadata.clone(),
                    queued_at: now_ns(),
                });
            }
            st.grant_pass();
        }
        self.shared.changed();
        let mut guard = CancelGuard {
            shared: self.shared.clone(),
            mode: self.mode.clone(),
            key: key.clone(),
            lease: lease.clone(),
            my_deadline,
            armed: true,
        };
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.shared.lock();
                let Some(sem) = st.sems.get_mut(&key) else {
                    guard.armed = false;
                    return Err(Status::not_found(format!("semaphore {}", key.1)));
                };
                if let Some(h) = sem.holders.iter().find(|h| h.lease == lease) {
                    guard.armed = false;
                    let token = h.token;
                    let resp = acquired(&st, token);
                    drop(st);
                    return self.reply(resp);
                }
                let Some(pos) = sem.queue.iter().position(|w| w.lease == lease) else {
                    guard.armed = false;
                    if !st.leases.contains_key(&lease) {
                        return Err(Status::not_found(format!("lease {lease}")));
                    }
                    let resp = not_acquired(&st, AcquireOutcome::TimedOut);
                    drop(st);
                    return self.reply(resp);
                };
                let now = Instant::now();
                if now >= my_deadline {
                    if sem.queue[pos].deadline <= now {
                        sem.queue.remove(pos);
                    }
                    guard.armed = false;
                    let outcome = if timeout.is_zero() {
                        AcquireOutcome::Unavailable
                    } else {
                        AcquireOutcome::TimedOut
                    };
                    let resp = not_acquired(&st, outcome);
                    drop(st);
                    return self.reply(resp);
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(my_deadline.into()) => {}
            }
        }
    }
    async fn release_semaphore(
        &self,
        r: Request<ReleaseSemaphoreRequest>,
    ) -> Res<ReleaseSemaphoreResponse> {
        self.count();
        let r = r.into_inner();
        let key = (r.namespace_name.clone(), r.semaphore_name.clone());
        let mut st = self.shared.lock();
        if !st.leases.contains_key(&r.lease_id) {
            return Err(Status::not_found(format!("lease {}", r.lease_id)));
        }
        let Some(sem) = st.sems.get_mut(&key) else {
            return Err(Status::not_found(format!("semaphore {}", key.1)));
        };
        sem.holders.retain(|h| h.lease != r.lease_id);
        st.grant_pass();
        let sem = st.semaphore(&key.0, &key.1);
        drop(st);
        self.shared.changed();
        self.reply(ReleaseSemaphoreResponse { semaphore: sem })
    }
    async fn update_semaphore(
        &self,
        _: Request<UpdateSemaphoreRequest>,
    ) -> Res<UpdateSemaphoreResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn delete_semaphore(
        &self,
        _: Request<DeleteSemaphoreRequest>,
    ) -> Res<DeleteSemaphoreResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn list_semaphore_holders(
        &self,
        r: Request<ListSemaphoreHoldersRequest>,
    ) -> Res<ListSemaphoreHoldersResponse> {
        self.count();
        let r = r.into_inner();
        let mut st = self.shared.lock();
        st.expire();
        let Some(sem) = st
            .sems
            .get(&(r.namespace_name.clone(), r.semaphore_name.clone()))
        else {
            return Err(Status::not_found(format!("semaphore {}", r.semaphore_name)));
        };
        let holders = sem
            .holders
            .iter()
            .map(|h| SemaphoreHolder {
                lease_id: h.lease.clone(),
                locked_at: h.locked_at,
                weight: h.weight,
                metadata: h.metadata.clone(),
                fencing_token: h.token,
            })
            .collect();
        drop(st);
        self.reply(ListSemaphoreHoldersResponse {
            holders,
            ..Default::default()
        })
    }
    async fn create_semaphore_lease(
        &self,
        r: Request<CreateSemaphoreLeaseRequest>,
    ) -> Res<CreateSemaphoreLeaseResponse> {
        self.count();
        let r = r.into_inner();
        if !(1..=300).contains(&r.ttl_seconds) {
            return Err(Status::invalid_argument("ttl_seconds must be 1-300"));
        }
        let mut st = self.shared.lock();
        if !st.namespaces.contains_key(&r.namespace_name) {
            return Err(Status::not_found(format!("namespace {}", r.namespace_name)));
        }
        st.next_lease += 1;
        let id = format!("ls_{:04}", st.next_lease);
        let ttl = Duration::from_secs(r.ttl_seconds);
        st.leases.insert(
            id.clone(),
            LeaseRec {
                ns: r.namespace_name.clone(),
                ttl,
                expires: Instant::now() + ttl,
                process_id: r.process_id.clone(),
            },
        );
        drop(st);
        self.reply(CreateSemaphoreLeaseResponse {
            lease: Some(Lease {
                lease_id: id,
                process_id: r.process_id,
                metadata: r.metadata,
                ttl_seconds: r.ttl_seconds,
                ..Default::default()
            }),
        })
    }
    async fn revoke_semaphore_lease(
        &self,
        r: Request<RevokeSemaphoreLeaseRequest>,
    ) -> Res<RevokeSemaphoreLeaseResponse> {
        self.count();
        let r = r.into_inner();
        let mut st = self.shared.lock();
        if !st.leases.contains_key(&r.lease_id) {
            return Err(Status::not_found(format!("lease {}", r.lease_id)));
        }
        st.drop_lease(&r.lease_id);
        drop(st);
        self.shared.changed();
        self.reply(RevokeSemaphoreLeaseResponse {})
    }
    async fn refresh_semaphore_lease(
        &self,
        r: Request<RefreshSemaphoreLeaseRequest>,
    ) -> Res<RefreshSemaphoreLeaseResponse> {
        self.count();
        let r = r.into_inner();
        let mut st = self.shared.lock();
        if st.expire() {
            self.shared.changed();
        }
        let Some(l) = st.leases.get_mut(&r.lease_id) else {
            return Err(Status::not_found(format!("lease {}", r.lease_id)));
        };
        if r.ttl_seconds > 0 {
            l.ttl = Duration::from_secs(r.ttl_seconds);
        }
        l.expires = Instant::now() + l.ttl;
        let lease = Lease {
            lease_id: r.lease_id.clone(),
            process_id: l.process_id.clone(),
            ttl_seconds: l.ttl.as_secs(),
            ..Default::default()
        };
        drop(st);
        self.reply(RefreshSemaphoreLeaseResponse { lease: Some(lease) })
    }
    async fn list_semaphore_leases(
        &self,
        _: Request<ListSemaphoreLeasesRequest>,
    ) -> Res<ListSemaphoreLeasesResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn get_semaphore_lease(
        &self,
        r: Request<GetSemaphoreLeaseRequest>,
    ) -> Res<GetSemaphoreLeaseResponse> {
        self.count();
        let r = r.into_inner();
        let st = self.shared.lock();
        let Some(l) = st.leases.get(&r.lease_id) else {
            return Err(Status::not_found(format!("lease {}", r.lease_id)));
        };
        let lease = Lease {
            lease_id: r.lease_id.clone(),
            process_id: l.process_id.clone(),
            ttl_seconds: l.ttl.as_secs(),
            ..Default::default()
        };
        drop(st);
        self.reply(GetSemaphoreLeaseResponse { lease: Some(lease) })
    }
}

#[tonic::async_trait]
impl ConchApi for Service {
    async fn list_semaphore_waiters(
        &self,
        r: Request<ListSemaphoreWaitersRequest>,
    ) -> Res<ListSemaphoreWaitersResponse> {
        self.count();
        let r = r.into_inner();
        let mut st = self.shared.lock();
        st.expire();
        let Some(sem) = st
            .sems
            .get(&(r.namespace_name.clone(), r.semaphore_name.clone()))
        else {
            return Err(Status::not_found(format!("semaphore {}", r.semaphore_name)));
        };
        let waiters = sem
            .queue
            .iter()
            .enumerate()
            .map(|(i, w)| SemaphoreWaiter {
                lease_id: w.lease.clone(),
                weight: w.weight,
                queued_at: w.queued_at,
                metadata: w.metadata.clone(),
                position: i as u64,
            })
            .collect();
        let semaphore = st.semaphore(&r.namespace_name, &r.semaphore_name);
        drop(st);
        self.reply(ListSemaphoreWaitersResponse {
            waiters,
            semaphore,
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl ConchAdmin for Service {
    async fn cluster_status(&self, _: Request<ClusterStatusRequest>) -> Res<ClusterStatusResponse> {
        self.count();
        self.reply(ClusterStatusResponse {
            node_id: self.node as u64 + 1,
            addr: self.addr.clone(),
            leader_id: 1,
            term: 2,
            state: if self.node == 0 { "Leader" } else { "Follower" }.to_string(),
            last_log_index: 10,
            commit_index: 10,
            applied_index: 10,
            members: vec![Member {
                id: 1,
                addr: self.addr.clone(),
                voter: true,
            }],
            ..Default::default()
        })
    }
    async fn add_learner(&self, _: Request<AddLearnerRequest>) -> Res<MembershipResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn change_membership(
        &self,
        _: Request<ChangeMembershipRequest>,
    ) -> Res<MembershipResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn transfer_leader(
        &self,
        _: Request<TransferLeaderRequest>,
    ) -> Res<TransferLeaderResponse> {
        Err(Status::unimplemented("mock"))
    }
    async fn trigger_snapshot(
        &self,
        _: Request<TriggerSnapshotRequest>,
    ) -> Res<TriggerSnapshotResponse> {
        Err(Status::unimplemented("mock"))
    }
}

/// What a proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Up,
    /// Existing connections are closed, new ones are closed at once.
    Down,
    /// Bytes stop flowing (like a paused process); connections stay open.
    Stall,
}

pub struct Node {
    /// The address clients use (the proxy's).
    pub addr: String,
    pub requests: Arc<AtomicU64>,
    mode: watch::Sender<Mode>,
}

pub struct MockCluster {
    pub shared: Arc<Shared>,
    pub nodes: Vec<Node>,
}

async fn proxy(listener: TcpListener, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            return;
        };
        let mut mode = mode.clone();
        tokio::spawn(async move {
            let m = *mode.borrow();
            match m {
                Mode::Down => return,
                Mode::Stall => {
                    let _ = mode.wait_for(|m| *m == Mode::Down).await;
                    return;
                }
                Mode::Up => {}
            }
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let changed = tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                m = async { mode.wait_for(|m| *m != Mode::Up).await.map(|r| *r) } => m,
            };
            if matches!(changed, Ok(Mode::Stall)) {
                let _ = mode.wait_for(|m| *m == Mode::Down).await;
            }
        });
    }
}

impl MockCluster {
    /// Starts `n` nodes serving one shared state, with namespace `conch` absent.
    pub async fn start(n: usize) -> MockCluster {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            leader: Mutex::new(None),
        });
        // Lease expiry ticker.
        let ticker = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let changed = ticker.lock().expire();
                if changed {
                    ticker.changed();
                }
            }
        });
        let mut nodes = Vec::new();
        for i in 0..n {
            let server_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let server_addr = server_listener.local_addr().unwrap();
            let proxy_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = proxy_listener.local_addr().unwrap().to_string();
            let requests = Arc::new(AtomicU64::new(0));
            let (mode, rx) = watch::channel(Mode::Up);
            let svc = Service {
                shared: shared.clone(),
                mode: rx.clone(),
                node: i,
                addr: addr.clone(),
                requests: requests.clone(),
            };
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(server_listener);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(GrackleApiServer::new(svc.clone()))
                    .add_service(ConchApiServer::new(svc.clone()))
                    .add_service(ConchAdminServer::new(svc))
                    .serve_with_incoming(incoming),
            );
            tokio::spawn(proxy(proxy_listener, server_addr, rx));
            nodes.push(Node {
                addr,
                requests,
                mode,
            });
        }
        MockCluster { shared, nodes }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    pub fn set_mode(&self, node: usize, mode: Mode) {
        self.nodes[node].mode.send_replace(mode);
    }

    /// Every response names node `i` as the leader (None: no hint).
    pub fn set_leader(&self, node: Option<usize>) {
        *self.shared.leader.lock().unwrap() = node.map(|i| self.nodes[i].addr.clone());
    }

    pub fn requests(&self, node: usize) -> u64 {
        self.nodes[node].requests.load(Ordering::SeqCst)
    }

    /// Lease ids queued on a semaphore, head first.
    pub fn queue(&self, ns: &str, sem: &str) -> Vec<String> {
        let st = self.shared.lock();
        st.sems
            .get(&(ns.to_string(), sem.to_string()))
            .map(|s| s.queue.iter().map(|w| w.lease.clone()).collect())
            .unwrap_or_default()
    }

    /// Lease ids holding a semaphore, in grant order.
    pub fn holders(&self, ns: &str, sem: &str) -> Vec<String> {
        let st = self.shared.lock();
        st.sems
            .get(&(ns.to_string(), sem.to_string()))
            .map(|s| s.holders.iter().map(|h| h.lease.clone()).collect())
            .unwrap_or_default()
    }

    pub fn lease_exists(&self, id: &str) -> bool {
        self.shared.lock().leases.contains_key(id)
    }

    pub fn lease_count(&self) -> usize {
        self.shared.lock().leases.len()
    }

    /// Revokes a lease behind the client's back.
    pub fn revoke(&self, id: &str) {
        self.shared.lock().drop_lease(id);
        self.shared.changed();
    }

    /// Creates a namespace and semaphore directly.
    pub fn semaphore(&self, ns: &str, sem: &str, permits: u64) {
        let mut st = self.shared.lock();
        st.namespaces.insert(ns.to_string(), ());
        st.sems.insert(
            (ns.to_string(), sem.to_string()),
            Sem {
                permits,
                ..Default::default()
            },
        );
    }
}

/// Polls `f` until it is true or `within` passes.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

//! Real conchd nodes, in-process, for the client and CLI tests.
//!
//! `Cluster::start(n)` runs `n` nodes of one cluster (ports and data directory chosen at run
//! time). Every node sits behind fault proxies a test can `sever` (connections dropped, new
//! ones refused, like a crashed node) or `stall` (bytes stop flowing, connections stay open,
//! like a SIGSTOPped node): one proxy for its clients, whose address the node advertises (so
//! leader hints name it too), and one per peer link, which is as broken as the worse of its two
//! ends. The client proxy counts the gRPC requests it carries.
//!
//! The test's own view of the cluster (`queue`, `holders`, `lease_count`, ...) goes straight
//! to the nodes' real listeners, past the proxies. Every node is stopped when the `Cluster` is
//! dropped, also when a test fails.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use conch_proto::conch::ClusterStatusRequest;
use conch_proto::conch::ListSemaphoreWaitersRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::*;
use conchd::config::{Config, Flags};
use conchd::server::{self, StartError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// How long a cluster may take to elect its first leader.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// What a proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Up,
    /// Bytes stop flowing (like a paused process); connections stay open.
    Stall,
    /// Existing connections are closed, new ones are closed at once.
    Down,
}

pub struct Node {
    /// The address clients use (the client proxy's; the node advertises it).
    pub addr: String,
    /// The node's own listener, past every proxy.
    real: SocketAddr,
    requests: Arc<AtomicU64>,
    mode: watch::Sender<Mode>,
    shutdown: Option<oneshot::Sender<()>>,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.mode.send_replace(Mode::Down);
            if let Some(tx) = node.shutdown.take() {
                let _ = tx.send(());
            }
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A free local port: bound, read and released. Another process may take it before the node
/// binds it; `Cluster::start` then tries again with new ports.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    listener.local_addr().expect("local address").port()
}

impl Cluster {
    /// Starts `n` nodes and waits until they agree on a leader. Namespaces are created by the
    /// tests (or by the client) as they need them.
    pub async fn start(n: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        for attempt in 0..5 {
            match Cluster::try_start(n, &dir.path().join(attempt.to_string())).await {
                Ok((nodes, tasks)) => {
                    let cluster = Cluster {
                        nodes,
                        tasks,
                        _dir: dir,
                    };
                    cluster.wait_ready().await;
                    return cluster;
                }
                Err(StartError::Bind { addr, source }) => {
                    eprintln!("port {addr} was taken ({source}); starting again on new ports");
                }
                Err(e) => panic!("start conchd: {e}"),
            }
        }
        panic!("could not find free ports for {n} nodes");
    }

    async fn try_start(
        n: usize,
        dir: &Path,
    ) -> Result<(Vec<Node>, Vec<JoinHandle<()>>), StartError> {
        let mut tasks = Vec::new();
        let modes: Vec<watch::Sender<Mode>> = (0..n).map(|_| watch::channel(Mode::Up).0).collect();
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let real: Vec<SocketAddr> = ports
            .iter()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
            .collect();

        let mut client_proxies = Vec::new();
        for i in 0..n {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
            let addr = listener.local_addr().expect("proxy address").to_string();
            let requests = Arc::new(AtomicU64::new(0));
            tasks.push(tokio::spawn(proxy(
                listener,
                real[i],
                modes[i].subscribe(),
                Some(requests.clone()),
            )));
            client_proxies.push((addr, requests));
        }
        let initial_cluster = client_proxies
            .iter()
            .enumerate()
            .map(|(i, (addr, _))| format!("{}={addr}", i + 1))
            .collect::<Vec<_>>()
            .join(",");

        let mut nodes = Vec::new();
        for i in 0..n {
            let mut routes = Vec::new();
            for j in (0..n).filter(|j| *j != i) {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
                let addr = listener.local_addr().expect("proxy address");
                let (link, link_mode) = watch::channel(Mode::Up);
                tasks.push(tokio::spawn(worse_of(
                    modes[i].subscribe(),
                    modes[j].subscribe(),
                    link,
                )));
                tasks.push(tokio::spawn(proxy(listener, real[j], link_mode, None)));
                routes.push(format!("{}={addr}", j + 1));
            }
            let data_dir = dir.join(format!("node{}", i + 1));
            let mut argv = vec![
                "conchd".to_string(),
                "--id".into(),
                (i + 1).to_string(),
                "--listen".into(),
                real[i].to_string(),
                "--advertise".into(),
                client_proxies[i].0.clone(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--initial-cluster".into(),
                initial_cluster.clone(),
            ];
            if !routes.is_empty() {
                argv.extend(["--peer-routes".into(), routes.join(",")]);
            }
            let flags = Flags::try_parse_from(&argv).expect("conchd flags");
            let config = Config::from_flags(flags).expect("conchd config");
            let running = match server::start(Arc::new(config)).await {
                Ok(running) => running,
                Err(e) => {
                    for t in &tasks {
                        t.abort();
                    }
                    for node in nodes {
                        drop(node);
                    }
                    return Err(e);
                }
            };
            let (shutdown, stop) = oneshot::channel::<()>();
            tasks.push(tokio::spawn(async move {
                let _ = server::serve(running, async move {
                    let _ = stop.await;
                })
                .await;
            }));
            nodes.push(Node {
                addr: client_proxies[i].0.clone(),
                real: real[i],
                requests: client_proxies[i].1.clone(),
                mode: modes[i].clone(),
                shutdown: Some(shutdown),
            });
        }
        Ok((nodes, tasks))
    }

    async fn wait_ready(&self) {
        let t0 = Instant::now();
        loop {
            let mut leaders = Vec::new();
            for i in 0..self.nodes.len() {
                leaders.push(self.status(i).await.map(|s| s.leader_id).unwrap_or(0));
            }
            if leaders[0] != 0 && leaders.iter().all(|l| *l == leaders[0]) {
                return;
            }
            assert!(
                t0.elapsed() < READY_WITHIN,
                "no leader agreed on within {READY_WITHIN:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The client addresses (the client proxies), in node order.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    pub fn set_mode(&self, node: usize, mode: Mode) {
        self.nodes[node].mode.send_replace(mode);
    }

    /// gRPC requests node `node` has received from clients.
    pub fn requests(&self, node: usize) -> u64 {
        self.nodes[node].requests.load(Ordering::SeqCst)
    }

    async fn channel(&self, node: usize) -> Option<Channel> {
        Channel::from_shared(format!("http://{}", self.nodes[node].real))
            .ok()?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .ok()
    }

    async fn status(&self, node: usize) -> Option<conch_proto::conch::ClusterStatusResponse> {
        let mut admin = ConchAdminClient::new(self.channel(node).await?);
        admin
            .cluster_status(ClusterStatusRequest::default())
            .await
            .ok()
            .map(|r| r.into_inner())
    }

    /// The index of the node that is leader now, as the nodes that answer report it.
    pub async fn leader(&self) -> usize {
        let t0 = Instant::now();
        loop {
            for i in 0..self.nodes.len() {
                if let Some(s) = self.status(i).await
                    && s.leader_id == s.node_id
                    && s.leader_id != 0
                {
                    return i;
                }
            }
            assert!(t0.elapsed() < READY_WITHIN, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs `f` against the leader's real listener (past the proxies), trying the other nodes
    /// while none answers. `NotFound` is an answer.
    async fn inspect<T, F, Fut>(&self, f: F) -> Result<T, tonic::Status>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let t0 = Instant::now();
        loop {
            let leader = self.leader().await;
            let order =
                std::iter::once(leader).chain((0..self.nodes.len()).filter(|i| *i != leader));
            let mut last = tonic::Status::unavailable("no node");
            for i in order {
                let Some(channel) = self.channel(i).await else {
                    continue;
                };
                match f(channel).await {
                    Err(s) if s.code() == tonic::Code::Unavailable => last = s,
                    other => return other,
                }
            }
            if t0.elapsed() > READY_WITHIN {
                return Err(last);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lease ids queued on a semaphore, head first (none if it does not exist).
    pub async fn queue(&self, ns: &str, sem: &str) -> Vec<String> {
        let req = ListSemaphoreWaitersRequest {
            namespace_name: ns.to_string(),
            semaphore_name: sem.to_string(),
            ..Default::default()
        };
        let r = self
            .inspect(|ch| {
                let req = req.clone();
                async move { ConchApiClient::new(ch).list_semaphore_waiters(req).await }
            })
            .await;
        match r {
            Ok(r) => r
                .into_inner()
                .waiters
                .into_iter()
                .map(|w| w.lease_id)
                .collect(),
            Err(s) if s.code() == tonic::Code::NotFound => Vec::new(),
            Err(s) => panic!("list waiters: {s}"),
        }
    }

    /// Lease ids holding a semaphore, in grant order (none if it does not exist).
    pub async fn holders(&self, ns: &str, sem: &str) -> Vec<String> {
        let req = ListSemaphoreHoldersRequest {
            namespace_name: ns.to_string(),
            semaphore_name: sem.to_string(),
            ..Default::default()
        };
        let r = self
            .inspect(|ch| {
                let req = req.clone();
                async move { GrackleApiClient::new(ch).list_semaphore_holders(req).await }
            })
            .await;
        match r {
            Ok(r) => r
                .into_inner()
                .holders
                .into_iter()
                .map(|h| h.lease_id)
                .collect(),
            Err(s) if s.code() == tonic::Code::NotFound => Vec::new(),
            Err(s) => panic!("list holders: {s}"),
        }
    }

    pub async fn lease_exists(&self, ns: &str, id: &str) -> bool {
        let req = GetSemaphoreLeaseRequest {
            namespace_name: ns.to_string(),
            lease_id: id.to_string(),
        };
        let r = self
            .inspect(|ch| {
                let req = req.clone();
                async move { GrackleApiClient::new(ch).get_semaphore_lease(req).await }
            })
            .await;
        match r {
            Ok(_) => true,
            Err(s) if s.code() == tonic::Code::NotFound => false,
            Err(s) => panic!("get lease: {s}"),
        }
    }

    /// Leases in namespace `ns` (0 if it does not exist).
    pub async fn lease_count(&self, ns: &str) -> usize {
        let mut count = 0;
        let mut token = String::new();
        loop {
            let req = ListSemaphoreLeasesRequest {
                namespace_name: ns.to_string(),
                pagination_token: token.clone(),
                limit: 250,
                ..Default::default()
            };
            let r = self
                .inspect(|ch| {
                    let req = req.clone();
                    async move { GrackleApiClient::new(ch).list_semaphore_leases(req).await }
                })
                .await;
            match r {
                Ok(r) => {
                    let r = r.into_inner();
                    count += r.leases.len();
                    if r.next_pagination_token.is_empty() || r.leases.is_empty() {
                        return count;
                    }
                    token = r.next_pagination_token;
                }
                Err(s) if s.code() == tonic::Code::NotFound => return count,
                Err(s) => panic!("list leases: {s}"),
            }
        }
    }

    /// Revokes a lease behind its client's back.
    pub async fn revoke(&self, ns: &str, id: &str) {
        let req = RevokeSemaphoreLeaseRequest {
            namespace_name: ns.to_string(),
            lease_id: id.to_string(),
        };
        self.inspect(|ch| {
            let req = req.clone();
            async move { GrackleApiClient::new(ch).revoke_semaphore_lease(req).await }
        })
        .await
        .expect("revoke lease");
    }

    /// Creates a namespace (if needed) and a semaphore.
    pub async fn semaphore(&self, ns: &str, sem: &str, permits: u64) {
        let req = CreateNamespaceRequest {
            name: ns.to_string(),
            ..Default::default()
        };
        let r = self
            .inspect(|ch| {
                let req = req.clone();
                async move { GrackleApiClient::new(ch).create_namespace(req).await }
            })
            .await;
        if let Err(s) = r
            && s.code() != tonic::Code::AlreadyExists
        {
            panic!("create namespace: {s}");
        }
        let req = CreateSemaphoreRequest {
            namespace_name: ns.to_string(),
            semaphore_name: sem.to_string(),
            permits,
            ..Default::default()
        };
        self.inspect(|ch| {
            let req = req.clone();
            async move { GrackleApiClient::new(ch).create_semaphore(req).await }
        })
        .await
        .expect("create semaphore");
    }
}

/// Keeps `out` at the worse of two nodes' modes (a link is as broken as its worse end).
async fn worse_of(
    mut a: watch::Receiver<Mode>,
    mut b: watch::Receiver<Mode>,
    out: watch::Sender<Mode>,
) {
    loop {
        let worse = (*a.borrow_and_update()).max(*b.borrow_and_update());
        out.send_replace(worse);
        tokio::select! {
            r = a.changed() => if r.is_err() { return },
            r = b.changed() => if r.is_err() { return },
        }
    }
}

async fn proxy(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    requests: Option<Arc<AtomicU64>>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            return;
        };
        let mut mode = mode.clone();
        let requests = requests.clone();
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
            let Ok(outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let (mut in_read, mut in_write) = inbound.into_split();
            let (mut out_read, mut out_write) = outbound.into_split();
            let upward = async {
                let mut counter = RequestCounter::default();
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = match in_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if let Some(requests) = &requests {
                        requests.fetch_add(counter.feed(&buf[..n]), Ordering::SeqCst);
                    }
                    if out_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            };
            let downward = tokio::io::copy(&mut out_read, &mut in_write);
            let changed = tokio::select! {
                _ = upward => return,
                _ = downward => return,
                m = async { mode.wait_for(|m| *m != Mode::Up).await.map(|r| *r) } => m,
            };
            if matches!(changed, Ok(Mode::Stall)) {
                let _ = mode.wait_for(|m| *m == Mode::Down).await;
            }
        });
    }
}

/// Counts the requests a client sends on an HTTP/2 connection: one HEADERS frame opens each
/// gRPC call (trailers are sent by the server only).
#[derive(Default)]
struct RequestCounter {
    preface_seen: usize,
    header: [u8; 9],
    header_len: usize,
    skip: usize,
}

const PREFACE_LEN: usize = 24;
const HEADERS: u8 = 0x1;

impl RequestCounter {
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut count = 0;
        while !bytes.is_empty() {
            if self.preface_seen < PREFACE_LEN {
                let take = (PREFACE_LEN - self.preface_seen).min(bytes.len());
                self.preface_seen += take;
                bytes = &bytes[take..];
            } else if self.skip > 0 {
                let take = self.skip.min(bytes.len());
                self.skip -= take;
                bytes = &bytes[take..];
            } else {
                let take = (9 - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[..take]);
                self.header_len += take;
                bytes = &bytes[take..];
                if self.header_len == 9 {
                    let h = self.header;
                    self.skip =
                        (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    if h[3] == HEADERS {
                        count += 1;
                    }
                    self.header_len = 0;
                }
            }
        }
        count
    }
}

/// Waits until `f` holds, or `within` passes; returns whether it held.
pub async fn eventually(within: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f().await
}

/// Waits until `path` exists (a child process writes it when it is ready), or `within` passes.
pub async fn file_appears(path: &Path, within: Duration) -> bool {
    eventually(within, async || path.exists()).await
}

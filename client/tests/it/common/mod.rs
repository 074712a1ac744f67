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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use conch_proto::conch::ClusterStatusRequest;
use conch_proto::conch::ListSemaphoreWaitersRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_proto::grackle::*;
use conch_testkit::{LinkMode, LinkProxy};
use conchd::config::{Config, Settings};
use conchd::server::{self, StartError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// How long a cluster may take to elect its first leader.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// What a proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mode {
    Up,
    /// Bytes stop flowing (like a paused process); connections stay open.
    Stall,
    /// Existing connections are closed, new ones are closed at once.
    Down,
}

pub(crate) struct Node {
    /// The address clients use (the client proxy's; the node advertises it).
    pub addr: String,
    /// The node's own listener, past every proxy.
    real: SocketAddr,
    /// In front of the node's client listener; counts the requests clients send.
    client_proxy: LinkProxy,
    shutdown: Option<oneshot::Sender<()>>,
}

pub(crate) struct Cluster {
    pub nodes: Vec<Node>,
    /// Each node's mode, as last set.
    modes: Mutex<Vec<Mode>>,
    /// One per directed peer link `(from, to)`, as broken as the worse of its two ends.
    links: BTreeMap<(usize, usize), LinkProxy>,
    tasks: Vec<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Dropping the proxies (with the cluster) closes every connection through them.
        for node in &mut self.nodes {
            if let Some(tx) = node.shutdown.take() {
                let _ = tx.send(());
            }
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What a proxy does in `mode`.
fn link_mode(mode: Mode) -> LinkMode {
    match mode {
        Mode::Up => LinkMode::Pass,
        Mode::Stall => LinkMode::Stall,
        Mode::Down => LinkMode::Refuse,
    }
}

impl Cluster {
    /// Starts `n` nodes and waits until they agree on a leader. Namespaces are created by the
    /// tests (or by the client) as they need them.
    pub(crate) async fn start(n: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (nodes, links, tasks) = match Cluster::try_start(n, dir.path()).await {
            Ok(started) => started,
            Err(e) => panic!("start conchd: {e}"),
        };
        let cluster = Cluster {
            nodes,
            modes: Mutex::new(vec![Mode::Up; n]),
            links,
            tasks,
            _dir: dir,
        };
        cluster.wait_ready().await;
        cluster
    }

    #[allow(clippy::type_complexity)]
    async fn try_start(
        n: usize,
        dir: &Path,
    ) -> Result<
        (
            Vec<Node>,
            BTreeMap<(usize, usize), LinkProxy>,
            Vec<JoinHandle<()>>,
        ),
        StartError,
    > {
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        // Every node's port is bound here and held until the node serves on it.
        let mut listeners = Vec::new();
        for _ in 0..n {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|error| StartError::Bind {
                    addr: "127.0.0.1:0".into(),
                    error,
                })?;
            listeners.push(Some(listener));
        }
        let real: Vec<SocketAddr> = listeners
            .iter()
            .flatten()
            .map(|l| l.local_addr().expect("a bound listener has an address"))
            .collect();
        let mut client_proxies = Vec::new();
        for addr in &real {
            let proxy = LinkProxy::start_counting(addr.to_string())
                .await
                .expect("client proxy");
            client_proxies.push(proxy);
        }
        let initial_cluster = client_proxies
            .iter()
            .enumerate()
            .map(|(i, proxy)| format!("{}={}", i + 1, proxy.addr))
            .collect::<Vec<_>>()
            .join(",");

        let mut links = BTreeMap::new();
        let mut nodes = Vec::new();
        for (i, client_proxy) in client_proxies.into_iter().enumerate() {
            let mut routes = Vec::new();
            for j in (0..n).filter(|j| *j != i) {
                let link = LinkProxy::start(real[j].to_string())
                    .await
                    .expect("peer link proxy");
                routes.push(format!("{}={}", j + 1, link.addr));
                links.insert((i, j), link);
            }
            let data_dir = dir.join(format!("node{}", i + 1));
            let settings = Settings {
                id: Some(i as u64 + 1),
                listen: Some(real[i].to_string()),
                advertise: Some(client_proxy.addr.to_string()),
                data_dir: Some(data_dir),
                initial_cluster: Some(initial_cluster.clone()),
                peer_routes: (!routes.is_empty()).then(|| routes.join(",")),
                metrics_listen: Some("off".into()),
                ..Settings::default()
            };
            let config = Config::from_settings(settings).expect("conchd config");
            let listener = listeners[i].take().expect("each node starts once");
            let running = match server::start_with_listener(Arc::new(config), listener).await {
                Ok(running) => running,
                Err(e) => {
                    for t in &tasks {
                        t.abort();
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
                addr: client_proxy.addr.to_string(),
                real: real[i],
                client_proxy,
                shutdown: Some(shutdown),
            });
        }
        Ok((nodes, links, tasks))
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
    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    /// Puts node `node` in `mode`: every peer link to or from it as broken as the worse of the
    /// link's two ends, then its client proxy (so a node cut off from its peers cannot commit
    /// what its clients' closed connections cancel).
    pub(crate) fn set_mode(&self, node: usize, mode: Mode) {
        let mut modes = self.modes.lock().unwrap_or_else(|e| e.into_inner());
        modes[node] = mode;
        for (&(from, to), link) in &self.links {
            if from == node || to == node {
                link.set(link_mode(modes[from].max(modes[to])));
            }
        }
        self.nodes[node].client_proxy.set(link_mode(mode));
    }

    /// gRPC requests node `node` has received from clients.
    pub(crate) fn requests(&self, node: usize) -> u64 {
        self.nodes[node].client_proxy.requests()
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
    pub(crate) async fn leader(&self) -> usize {
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
    async fn inspect<T>(
        &self,
        f: impl AsyncFn(Channel) -> Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, tonic::Status> {
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
                    other => return other.map(tonic::Response::into_inner),
                }
            }
            if t0.elapsed() > READY_WITHIN {
                return Err(last);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Like `inspect`, with `NotFound` as `None`; any other error fails the test, naming `what`.
    async fn inspect_found<T>(
        &self,
        what: &str,
        f: impl AsyncFn(Channel) -> Result<tonic::Response<T>, tonic::Status>,
    ) -> Option<T> {
        match self.inspect(f).await {
            Ok(r) => Some(r),
            Err(s) if s.code() == tonic::Code::NotFound => None,
            Err(s) => panic!("{what}: {s}"),
        }
    }

    /// Lease ids queued on a semaphore, head first (none if it does not exist).
    pub(crate) async fn queue(&self, ns: &str, sem: &str) -> Vec<String> {
        let req = ListSemaphoreWaitersRequest {
            namespace_name: ns.to_string(),
            semaphore_name: sem.to_string(),
            ..Default::default()
        };
        let r = self
            .inspect_found("list waiters", async |ch| {
                ConchApiClient::new(ch)
                    .list_semaphore_waiters(req.clone())
                    .await
            })
            .await;
        r.map(|r| r.waiters.into_iter().map(|w| w.lease_id).collect())
            .unwrap_or_default()
    }

    /// Lease ids holding a semaphore, in grant order (none if it does not exist).
    pub(crate) async fn holders(&self, ns: &str, sem: &str) -> Vec<String> {
        let req = ListSemaphoreHoldersRequest {
            namespace_name: ns.to_string(),
            semaphore_name: sem.to_string(),
            ..Default::default()
        };
        let r = self
            .inspect_found("list holders", async |ch| {
                GrackleApiClient::new(ch)
                    .list_semaphore_holders(req.clone())
                    .await
            })
            .await;
        r.map(|r| r.holders.into_iter().map(|h| h.lease_id).collect())
            .unwrap_or_default()
    }

    pub(crate) async fn lease_exists(&self, ns: &str, id: &str) -> bool {
        let req = GetSemaphoreLeaseRequest {
            namespace_name: ns.to_string(),
            lease_id: id.to_string(),
        };
        self.inspect_found("get lease", async |ch| {
            GrackleApiClient::new(ch)
                .get_semaphore_lease(req.clone())
                .await
        })
        .await
        .is_some()
    }

    /// Leases in namespace `ns` (0 if it does not exist).
    pub(crate) async fn lease_count(&self, ns: &str) -> usize {
        let mut count = 0;
        let mut token = String::new();
        loop {
            let req = ListSemaphoreLeasesRequest {
                namespace_name: ns.to_string(),
                pagination_token: token.clone(),
                limit: 250,
                ..Default::default()
            };
            let page = self
                .inspect_found("list leases", async |ch| {
                    GrackleApiClient::new(ch)
                        .list_semaphore_leases(req.clone())
                        .await
                })
                .await;
            let Some(page) = page else {
                return count;
            };
            count += page.leases.len();
            if page.next_pagination_token.is_empty() || page.leases.is_empty() {
                return count;
            }
            token = page.next_pagination_token;
        }
    }

    /// Waits until `n` leases are queued on a semaphore, failing the test after `within`.
    pub(crate) async fn await_queued(&self, ns: &str, sem: &str, n: usize, within: Duration) {
        assert!(
            eventually(within, async || self.queue(ns, sem).await.len() == n).await,
            "expected {n} waiters on {ns}/{sem}: {:?}",
            self.queue(ns, sem).await
        );
    }

    /// Waits until `n` leases hold a semaphore, failing the test after `within`.
    pub(crate) async fn await_holders(&self, ns: &str, sem: &str, n: usize, within: Duration) {
        assert!(
            eventually(within, async || self.holders(ns, sem).await.len() == n).await,
            "expected {n} holders of {ns}/{sem}: {:?}",
            self.holders(ns, sem).await
        );
    }

    /// Revokes a lease behind its client's back.
    pub(crate) async fn revoke(&self, ns: &str, id: &str) {
        let req = RevokeSemaphoreLeaseRequest {
            namespace_name: ns.to_string(),
            lease_id: id.to_string(),
        };
        self.inspect(async |ch| {
            GrackleApiClient::new(ch)
                .revoke_semaphore_lease(req.clone())
                .await
        })
        .await
        .expect("revoke lease");
    }

    /// Creates a namespace (if needed) and a semaphore.
    pub(crate) async fn semaphore(&self, ns: &str, sem: &str, permits: u64) {
        let req = CreateNamespaceRequest {
            name: ns.to_string(),
            ..Default::default()
        };
        let r = self
            .inspect(async |ch| {
                GrackleApiClient::new(ch)
                    .create_namespace(req.clone())
                    .await
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
        self.inspect(async |ch| {
            GrackleApiClient::new(ch)
                .create_semaphore(req.clone())
                .await
        })
        .await
        .expect("create semaphore");
    }
}

/// Waits until `f` holds, or `within` passes; returns whether it held.
pub(crate) async fn eventually(within: Duration, mut f: impl AsyncFnMut() -> bool) -> bool {
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
pub(crate) async fn file_appears(path: &Path, within: Duration) -> bool {
    eventually(within, async || path.exists()).await
}

//! Process-level test harness: real `conchd` processes on loopback ports chosen at run time.
//!
//! Every process a [`Cluster`] starts is killed when the cluster is dropped, also when a test
//! panics. Waits are conditions with deadlines, never fixed sleeps.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{ClusterStatusRequest, ClusterStatusResponse};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tonic::transport::{Channel, Endpoint};

/// Path of a workspace binary (`conchd`, `conch`), built next to the test executable.
/// `CONCHD_BIN` / `CONCH_BIN` override it.
pub fn binary(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase());
    if let Ok(path) = std::env::var(&var) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let mut dir = exe.parent().expect("deps dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// Polls `check` until it returns `Some`, or fails after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub struct NodeProc {
    pub id: u64,
    pub addr: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
}

impl NodeProc {
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// A cluster of real `conchd` processes.
pub struct Cluster {
    pub nodes: BTreeMap<u64, NodeProc>,
    initial_cluster: String,
    extra_args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` nodes and waits until they agree on a leader.
    pub async fn start(n: u64) -> anyhow::Result<Cluster> {
        Self::start_with(n, &[]).await
    }

    /// Ports are picked free and released before `conchd` binds them, so a parallel test can
    /// take one in between; a node that exits at startup makes the whole start try again with
    /// new ports.
    pub async fn start_with(n: u64, extra_args: &[&str]) -> anyhow::Result<Cluster> {
        let mut attempt = 1;
        loop {
            let mut cluster = Self::start_once(n, extra_args).await?;
            let started = cluster.wait_for_leader(Duration::from_secs(20)).await;
            let exited = cluster.exited_nodes();
            match (started, exited.is_empty()) {
                (Ok(_), true) => return Ok(cluster),
                (result, _) if attempt < 3 && !exited.is_empty() => {
                    eprintln!(
                        "cluster start attempt {attempt}: nodes {exited:?} exited ({result:?}); retrying with new ports"
                    );
                }
                (Ok(_), false) => anyhow::bail!("nodes {exited:?} exited at startup"),
                (Err(e), _) => {
                    return Err(e.context(format!("start {n} nodes: {}", cluster.logs_tail())));
                }
            }
            attempt += 1;
        }
    }

    /// Ids of nodes whose process has exited on its own.
    fn exited_nodes(&mut self) -> Vec<u64> {
        self.nodes
            .values_mut()
            .filter_map(|node| match node.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(_))) => Some(node.id),
                _ => None,
            })
            .collect()
    }

    /// The last lines of every node's log, for failure messages.
    pub fn logs_tail(&self) -> String {
        let mut out = String::new();
        for id in self.nodes.keys() {
            let log = self.log(*id);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            out.push_str(&format!("\n--- node {id} log (tail) ---\n{tail}"));
        }
        out
    }

    async fn start_once(n: u64, extra_args: &[&str]) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("conch-cluster-")
            .tempdir()
            .context("tempdir")?;
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            let addr = format!("127.0.0.1:{}", free_port());
            let data_dir = dir.path().join(format!("node{id}"));
            let log_path = dir.path().join(format!("node{id}.log"));
            nodes.insert(
                id,
                NodeProc {
                    id,
                    addr,
                    data_dir,
                    log_path,
                    child: None,
                },
            );
        }
        let initial_cluster = nodes
            .values()
            .map(|n| format!("{}={}", n.id, n.addr))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            nodes,
            initial_cluster,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            _dir: dir,
        };
        let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
        for id in ids {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let initial_cluster = self.initial_cluster.clone();
        let extra_args = self.extra_args.clone();
        let node = self.nodes.get_mut(&id).context("no such node")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .context("open node log")?;
        let child = Command::new(binary("conchd"))
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&node.addr)
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--initial-cluster")
            .arg(&initial_cluster)
            .arg("--log")
            .arg(std::env::var("CONCH_TEST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .args(&extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("clone log handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", binary("conchd").display()))?;
        node.child = Some(child);
        Ok(())
    }

    /// kill -9 of node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(node) = self.nodes.get_mut(&id)
            && let Some(mut child) = node.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts a killed node from its data directory.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id);
        self.spawn(id)
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`) to node `id`.
    pub fn signal(&self, id: u64, signal: i32) {
        if let Some(pid) = self.nodes.get(&id).and_then(NodeProc::pid) {
            // SAFETY: plain kill(2) on a child we own.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    pub fn addr(&self, id: u64) -> String {
        self.nodes
            .get(&id)
            .map(|n| n.addr.clone())
            .unwrap_or_default()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.addr.clone()).collect()
    }

    pub fn running_ids(&self) -> Vec<u64> {
        self.nodes
            .values()
            .filter(|n| n.is_running())
            .map(|n| n.id)
            .collect()
    }

    pub fn log(&self, id: u64) -> String {
        self.nodes
            .get(&id)
            .and_then(|n| std::fs::read_to_string(&n.log_path).ok())
            .unwrap_or_default()
    }

    pub async fn grackle(&self, id: u64) -> anyhow::Result<GrackleApiClient<Channel>> {
        Ok(GrackleApiClient::new(channel(&self.addr(id)).await?))
    }

    pub async fn admin(&self, id: u64) -> anyhow::Result<ConchAdminClient<Channel>> {
        Ok(ConchAdminClient::new(channel(&self.addr(id)).await?))
    }

    pub async fn status(&self, id: u64) -> anyhow::Result<ClusterStatusResponse> {
        let mut admin = self.admin(id).await?;
        Ok(admin
            .cluster_status(ClusterStatusRequest {})
            .await?
            .into_inner())
    }

    /// Waits until every running node names the same leader, itself running; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<u64> {
        let running = self.running_ids();
        wait_for("an agreed leader", timeout, || {
            let running = running.clone();
            async move {
                let mut leader = None;
                for id in &running {
                    let status = self.status(*id).await.ok()?;
                    if status.leader_id == 0 || !running.contains(&status.leader_id) {
                        return None;
                    }
                    match leader {
                        None => leader = Some(status.leader_id),
                        Some(l) if l != status.leader_id => return None,
                        Some(_) => {}
                    }
                }
                leader
            }
        })
        .await
    }

    /// Waits until all running nodes have applied the same index with the same state hash.
    pub async fn wait_for_agreement(&self, timeout: Duration) -> anyhow::Result<(u64, u64)> {
        let running = self.running_ids();
        wait_for(
            "all nodes at the same applied index and state hash",
            timeout,
            || {
                let running = running.clone();
                async move {
                    let mut seen = None;
                    for id in &running {
                        let status = self.status(*id).await.ok()?;
                        let here = (status.applied_index, status.state_hash);
                        match seen {
                            None => seen = Some(here),
                            Some(s) if s != here => return None,
                            Some(_) => {}
                        }
                    }
                    seen
                }
            },
        )
        .await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            // Resume paused nodes so the kill is delivered and reaped.
            self.signal(id, libc::SIGCONT);
            self.kill(id);
        }
    }
}

/// A channel to `addr` that is connected (fails fast if the node is down).
pub async fn channel(addr: &str) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(10));
    endpoint
        .connect()
        .await
        .with_context(|| format!("connect to {addr}"))
}

/// Small helpers over the Grackle API for tests.
pub mod ops {
    use conch_proto::grackle as pb;
    use conch_proto::grackle::grackle_api_client::GrackleApiClient;
    use tonic::transport::Channel;

    pub type Grackle = GrackleApiClient<Channel>;

    pub async fn namespace(c: &mut Grackle, name: &str) -> Result<pb::Namespace, tonic::Status> {
        let r = c
            .create_namespace(pb::CreateNamespaceRequest {
                name: name.into(),
                ..Default::default()
            })
            .await?;
        Ok(r.into_inner().namespace.unwrap_or_default())
    }

    pub async fn semaphore(
        c: &mut Grackle,
        ns: &str,
        name: &str,
        permits: u64,
    ) -> Result<pb::Semaphore, tonic::Status> {
        let r = c
            .create_semaphore(pb::CreateSemaphoreRequest {
                namespace_name: ns.into(),
                semaphore_name: name.into(),
                permits,
                ..Default::default()
            })
            .await?;
        Ok(r.into_inner().semaphore.unwrap_or_default())
    }

    pub async fn lease(
        c: &mut Grackle,
        ns: &str,
        ttl_seconds: u64,
    ) -> Result<String, tonic::Status> {
        let r = c
            .create_semaphore_lease(pb::CreateSemaphoreLeaseRequest {
                namespace_name: ns.into(),
                process_id: "test".into(),
                ttl_seconds,
                ..Default::default()
            })
            .await?;
        Ok(r.into_inner().lease.unwrap_or_default().lease_id)
    }

    pub async fn acquire(
        c: &mut Grackle,
        ns: &str,
        sem: &str,
        lease: &str,
        weight: u64,
        timeout_seconds: i32,
    ) -> Result<pb::AcquireSemaphoreResponse, tonic::Status> {
        let r = c
            .acquire_semaphore(pb::AcquireSemaphoreRequest {
                namespace_name: ns.into(),
                semaphore_name: sem.into(),
                lease_id: lease.into(),
                weight,
                timeout_seconds,
                ..Default::default()
            })
            .await?;
        Ok(r.into_inner())
    }

    pub async fn release(
        c: &mut Grackle,
        ns: &str,
        sem: &str,
        lease: &str,
    ) -> Result<pb::Semaphore, tonic::Status> {
        let r = c
            .release_semaphore(pb::ReleaseSemaphoreRequest {
                namespace_name: ns.into(),
                semaphore_name: sem.into(),
                lease_id: lease.into(),
            })
            .await?;
        Ok(r.into_inner().semaphore.unwrap_or_default())
    }

    pub async fn holders(
        c: &mut Grackle,
        ns: &str,
        sem: &str,
    ) -> Result<Vec<pb::SemaphoreHolder>, tonic::Status> {
        let r = c
            .list_semaphore_holders(pb::ListSemaphoreHoldersRequest {
                namespace_name: ns.into(),
                semaphore_name: sem.into(),
                ..Default::default()
            })
            .await?;
        Ok(r.into_inner().holders)
    }

    pub fn acquired(r: &pb::AcquireSemaphoreResponse) -> bool {
        r.outcome == pb::AcquireOutcome::Acquired as i32
    }
}

/// One `conchd` process started with explicit arguments; killed on drop.
pub struct Daemon {
    child: Option<Child>,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
}

impl Daemon {
    pub fn spawn(args: &[&str], cwd: &Path) -> anyhow::Result<Daemon> {
        let stdout_path = cwd.join(format!("conchd-{}.out", free_port()));
        let stderr_path = stdout_path.with_extension("err");
        let child = Command::new(binary("conchd"))
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path)?)
            .stderr(std::fs::File::create(&stderr_path)?)
            .spawn()
            .with_context(|| format!("spawn {}", binary("conchd").display()))?;
        Ok(Daemon {
            child: Some(child),
            stdout_path,
            stderr_path,
        })
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            // SAFETY: plain kill(2) on a child we own.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    /// Waits for the process to exit and returns its exit code (None if killed by a signal).
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Ok(status.code());
            }
            if self.child.is_none() {
                bail!("process already reaped");
            }
            if Instant::now() >= deadline {
                bail!(
                    "conchd did not exit within {timeout:?}; stderr: {}",
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

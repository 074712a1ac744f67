//! A cluster of real `conchd` processes on loopback ports chosen at run time.
//!
//! The harness binds every node's port itself and hands the listening socket to the node
//! ([`crate::sockets`]), so no node can lose its port to a parallel test; a restarted node gets
//! its old address bound again.
//!
//! Peer links are direct, or (for fault injection) each directed link `i → j` passes through
//! its own [`LinkProxy`]: node `i` is then started with `--peer-routes j=<proxy i→j>` for every
//! other `j`, so a test can cut, black-hole or slow any directed link. Clients talk to the
//! nodes directly.
//!
//! Everything is stopped on drop, also when a test fails: paused nodes are resumed and every
//! process is killed and reaped; every proxy task is aborted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use crate::net::NodeChannel as Channel;
use anyhow::Context;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{ClusterStatusRequest, ClusterStatusResponse};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_testkit::{LinkMode, LinkProxy};
use nix::sys::signal::Signal;

use crate::disk::SmallDisk;
use crate::net::{channel, lazy_channel};
use crate::pki::{HARNESS_CLIENT, Pki};
use crate::sockets::Port;
use crate::{conchd_command, send_signal, wait_for};

pub struct NodeProc {
    pub id: u64,
    pub addr: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    args: Vec<String>,
    /// The node's port until its first start hands it over.
    port: Option<Port>,
    /// Environment variables set for this node's process (e.g. a faked wall clock).
    env: Vec<(String, String)>,
    /// The conchd binary this node runs, when not this build's (e.g. a previous release).
    binary: Option<PathBuf>,
    child: Option<Child>,
    paused: bool,
}

impl NodeProc {
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// Environment variables for node `id` of a cluster whose directory is the path given.
pub type NodeEnv<'a> = dyn Fn(u64, &Path) -> Vec<(String, String)> + 'a;

/// Node arguments for a test whose calls must wait out elections it causes itself (leadership
/// transfers): a leadership transfer answers once the target leads, within the node's leader
/// wait. A transfer waits out the voters' leader lease and may campaign several times, which on
/// a machine busy with other tests can take longer than the default 3 s. These tests check who
/// leads, not how fast, so they get a bound no loaded machine reaches.
pub const PATIENT_LEADER_WAIT: [&str; 2] = ["--leader-wait-ms", "30000"];

/// Node arguments for a test that checks nobody campaigned, or what each node counted under one
/// leader: a machine busy with other tests can stall the nodes for longer than the default
/// election timeout and start an election the test did not cause. With this one a follower
/// campaigns only after 6-8 s without hearing from the leader.
pub const STEADY_LEADER: [&str; 2] = ["--election-timeout-ms", "2000"];

pub struct Cluster {
    pub nodes: BTreeMap<u64, NodeProc>,
    /// Each node's small data disk, when it has one (unmounted on drop, before `dir` goes).
    disks: BTreeMap<u64, SmallDisk>,
    /// One per directed peer link `(from, to)`; empty when the peers dial each other directly.
    proxies: BTreeMap<(u64, u64), LinkProxy>,
    channels: BTreeMap<u64, Channel>,
    dir: Option<tempfile::TempDir>,
    kept: Option<PathBuf>,
    /// The certificates of a TLS cluster (TLS, client certificates, peer mutual TLS).
    pub pki: Option<Pki>,
    /// Sent with the harness's own status calls (needed once access control is on).
    admin_token: Option<String>,
}

impl Cluster {
    /// Starts `n` nodes with direct peer links and waits until they agree on a leader.
    pub async fn start(n: u64) -> anyhow::Result<Cluster> {
        Self::start_with(n, &[]).await
    }

    /// Like [`Cluster::start`], with `extra_args` for every node.
    pub async fn start_with(n: u64, extra_args: &[&str]) -> anyhow::Result<Cluster> {
        Self::start_opts(n, extra_args, false).await
    }

    /// Like [`Cluster::start_with`]; with `tls`, a TLS cluster (see [`Cluster::launch_opts`]).
    pub async fn start_opts(n: u64, extra_args: &[&str], tls: bool) -> anyhow::Result<Cluster> {
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut cluster = Self::launch_opts(n, &extra_args, false, tls).await?;
        let started = cluster.wait_for_leader(Duration::from_secs(20)).await;
        let exited = cluster.exited_nodes();
        match (started, exited.is_empty()) {
            (Ok(_), true) => Ok(cluster),
            (Ok(_), false) => anyhow::bail!(
                "nodes {exited:?} exited at startup: {}",
                cluster.logs_tail()
            ),
            (Err(e), _) => Err(e.context(format!("start {n} nodes: {}", cluster.logs_tail()))),
        }
    }

    /// Starts `n` nodes without waiting for a leader; `extra_args` go to every node. With
    /// `proxied`, every directed peer link passes through a [`LinkProxy`]; without, the nodes
    /// dial each other directly (partitions then have no effect), e.g. to tell a proxy
    /// problem from a daemon problem.
    pub async fn launch(n: u64, extra_args: &[String], proxied: bool) -> anyhow::Result<Cluster> {
        Self::launch_with(n, extra_args, proxied, false, &|_, _| Vec::new()).await
    }

    /// Like [`Cluster::launch`]; with `tls`, certificates are made in the cluster's directory
    /// (`pki/`) and every node serves TLS, requires client certificates and speaks mutual TLS
    /// to its peers; every harness channel to the nodes then uses TLS.
    pub async fn launch_opts(
        n: u64,
        extra_args: &[String],
        proxied: bool,
        tls: bool,
    ) -> anyhow::Result<Cluster> {
        Self::launch_with(n, extra_args, proxied, tls, &|_, _| Vec::new()).await
    }

    /// Starts `n` nodes with direct peer links, each with the environment variables
    /// `env(id, cluster dir)` (kept across restarts), and waits until they agree on a leader.
    pub async fn start_with_env(
        n: u64,
        extra_args: &[&str],
        env: &NodeEnv<'_>,
    ) -> anyhow::Result<Cluster> {
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let cluster = Self::launch_with_env(n, &extra_args, false, env).await?;
        match cluster.wait_for_leader(Duration::from_secs(30)).await {
            Ok(_) => Ok(cluster),
            Err(e) => Err(e.context(format!("start {n} nodes: {}", cluster.logs_tail()))),
        }
    }

    /// Like [`Cluster::launch`], with per-node environment variables (see
    /// [`Cluster::start_with_env`]).
    pub async fn launch_with_env(
        n: u64,
        extra_args: &[String],
        proxied: bool,
        env: &NodeEnv<'_>,
    ) -> anyhow::Result<Cluster> {
        Self::launch_with(n, extra_args, proxied, false, env).await
    }

    /// Starts `n` nodes without waiting for a leader: [`Cluster::launch_opts`] with per-node
    /// environment variables.
    pub async fn launch_with(
        n: u64,
        extra_args: &[String],
        proxied: bool,
        tls: bool,
        env: &NodeEnv<'_>,
    ) -> anyhow::Result<Cluster> {
        Self::launch_on(n, extra_args, proxied, tls, env, None).await
    }

    /// Like [`Cluster::launch_with`]; with `disk_bytes`, every node's data directory is on a
    /// tmpfs of its own of that size ([`SmallDisk`], needs root), which
    /// [`Cluster::fill_disk`] fills up.
    pub async fn launch_on(
        n: u64,
        extra_args: &[String],
        proxied: bool,
        tls: bool,
        env: &NodeEnv<'_>,
        disk_bytes: Option<u64>,
    ) -> anyhow::Result<Cluster> {
        Self::launch_full(n, extra_args, proxied, tls, env, disk_bytes, None).await
    }

    /// [`Cluster::launch_on`], every node running the conchd at `binary` when given.
    #[allow(clippy::too_many_arguments)]
    pub async fn launch_full(
        n: u64,
        extra_args: &[String],
        proxied: bool,
        tls: bool,
        env: &NodeEnv<'_>,
        disk_bytes: Option<u64>,
        binary: Option<&Path>,
    ) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("conch-cluster-")
            .tempdir()
            .context("tempdir")?;
        let pki = if tls {
            let pki = Pki::create(&dir.path().join("pki"))?;
            for id in 1..=n {
                pki.node(id)?;
            }
            Some(pki)
        } else {
            None
        };
        let ids: Vec<u64> = (1..=n).collect();
        // Bound here and held until each node takes its own.
        let mut ports = BTreeMap::new();
        for &id in &ids {
            ports.insert(id, Port::bind()?);
        }
        let addrs: BTreeMap<u64, String> = ports
            .iter()
            .map(|(id, port)| (*id, port.addr().to_string()))
            .collect();
        let mut proxies = BTreeMap::new();
        if proxied {
            for &from in &ids {
                for &to in &ids {
                    if from != to {
                        let proxy = LinkProxy::start(addrs[&to].clone()).await?;
                        proxies.insert((from, to), proxy);
                    }
                }
            }
        }
        let initial_cluster = addrs
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = BTreeMap::new();
        let mut channels = BTreeMap::new();
        let mut disks = BTreeMap::new();
        for &id in &ids {
            let mut data_dir = dir.path().join(format!("node{id}"));
            if let Some(bytes) = disk_bytes {
                let disk = SmallDisk::mount(&dir.path().join(format!("disk{id}")), bytes)?;
                data_dir = disk.mount.join("data");
                disks.insert(id, disk);
            }
            let mut args: Vec<String> = vec![
                "--id".into(),
                id.to_string(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--initial-cluster".into(),
                initial_cluster.clone(),
            ];
            // The tests' log filter, unless the test gives its own.
            if !extra_args.iter().any(|a| a == "--log") {
                args.extend([
                    "--log".into(),
                    std::env::var("CONCH_TEST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
                ]);
            }
            if proxied {
                let routes = ids
                    .iter()
                    .filter(|&&to| to != id)
                    .map(|to| format!("{to}={}", proxies[&(id, *to)].addr))
                    .collect::<Vec<_>>()
                    .join(",");
                args.extend(["--peer-routes".into(), routes]);
            }
            args.extend(extra_args.iter().cloned());
            if let Some(pki) = &pki {
                args.extend(pki.node_args(id));
                crate::pki::register(&addrs[&id], pki.client_tls(HARNESS_CLIENT)?);
            }
            channels.insert(id, lazy_channel(&addrs[&id])?);
            nodes.insert(
                id,
                NodeProc {
                    id,
                    addr: addrs[&id].clone(),
                    data_dir,
                    log_path: dir.path().join(format!("node{id}.log")),
                    args,
                    port: ports.remove(&id),
                    env: env(id, dir.path()),
                    binary: None,
                    child: None,
                    paused: false,
                },
            );
        }
        let mut cluster = Cluster {
            nodes,
            disks,
            proxies,
            channels,
            dir: Some(dir),
            kept: None,
            pki,
            admin_token: None,
        };
        if let Some(binary) = binary {
            for node in cluster.nodes.values_mut() {
                node.binary = Some(binary.to_path_buf());
            }
        }
        for id in ids {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    /// Starts `n` nodes of the conchd at `binary` (e.g. a previous release) with direct peer
    /// links and `extra_args` for every node, without waiting for a leader.
    pub async fn launch_binary(
        n: u64,
        extra_args: &[String],
        binary: &Path,
    ) -> anyhow::Result<Cluster> {
        Self::launch_full(
            n,
            extra_args,
            false,
            false,
            &|_, _| Vec::new(),
            None,
            Some(binary),
        )
        .await
    }

    /// Which conchd node `id` runs from its next start: `Some(path)`, or this build's.
    pub fn set_binary(&mut self, id: u64, binary: Option<PathBuf>) {
        if let Some(node) = self.nodes.get_mut(&id) {
            node.binary = binary;
        }
    }

    /// Stops node `id` as an operator does: SIGTERM, then waits up to `timeout` for it to exit
    /// (kill -9 after that). Returns how it exited.
    pub async fn stop(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        self.signal(id, Signal::SIGCONT);
        self.signal(id, Signal::SIGTERM);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let node = self.nodes.get_mut(&id).context("no such node")?;
            let Some(child) = node.child.as_mut() else {
                anyhow::bail!("node {id} is not running");
            };
            if let Some(status) = child.try_wait().context("wait for the node")? {
                node.child = None;
                return Ok(status);
            }
            if std::time::Instant::now() >= deadline {
                self.kill(id);
                anyhow::bail!("node {id} did not exit within {timeout:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts a stopped node again from its data directory (with the binary it is set to run).
    pub fn start_node(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn(id)
    }

    pub fn dir(&self) -> &Path {
        match (&self.dir, &self.kept) {
            (Some(dir), _) => dir.path(),
            (None, Some(kept)) => kept,
            (None, None) => Path::new("."),
        }
    }

    /// Keeps the directory (node logs, data) after the run, e.g. to study a violation.
    pub fn keep_dir(&mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            self.kept = Some(dir.keep());
        }
        self.dir().to_path_buf()
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&id).context("no such node")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .context("open node log")?;
        let port = match node.port.take() {
            Some(port) => port,
            None => Port::bind_at(&node.addr)
                .with_context(|| format!("restart node {id} at its address"))?,
        };
        let mut command = match &node.binary {
            Some(binary) => crate::conchd_command_of(binary, &node.args),
            None => conchd_command(&node.args),
        };
        command
            .envs(node.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().context("clone log handle")?)
            .stderr(log);
        crate::sockets::pass(&mut command, vec![("client", port)])?;
        let child = crate::spawn(&mut command)?;
        node.child = Some(child);
        node.paused = false;
        Ok(())
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

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
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

    /// One lazily connecting channel per node (clone it freely).
    pub fn channels(&self) -> BTreeMap<u64, Channel> {
        self.channels.clone()
    }

    pub fn channel(&self, id: u64) -> Option<Channel> {
        self.channels.get(&id).cloned()
    }

    /// A Grackle client on a fresh connection to node `id` (fails if it is down).
    pub async fn grackle(&self, id: u64) -> anyhow::Result<GrackleApiClient<Channel>> {
        Ok(GrackleApiClient::new(channel(&self.addr(id)).await?))
    }

    /// An admin client on a fresh connection to node `id` (fails if it is down).
    pub async fn admin(&self, id: u64) -> anyhow::Result<ConchAdminClient<Channel>> {
        Ok(ConchAdminClient::new(channel(&self.addr(id)).await?))
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(NodeProc::is_running)
    }

    pub fn running_ids(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| self.is_running(*id))
            .collect()
    }

    /// Running and not paused.
    pub fn is_live(&self, id: u64) -> bool {
        self.nodes
            .get(&id)
            .is_some_and(|n| n.child.is_some() && !n.paused)
    }

    pub fn live_ids(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| self.is_live(*id))
            .collect()
    }

    /// kill -9 of node `id` (resumed first if paused, so the kill is delivered and reaped).
    pub fn kill(&mut self, id: u64) {
        self.signal(id, Signal::SIGCONT);
        if let Some(node) = self.nodes.get_mut(&id)
            && let Some(mut child) = node.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
            node.paused = false;
        }
    }

    /// Starts a killed node again from its data directory (a running node is killed first).
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id);
        self.spawn(id)
    }

    /// SIGSTOP.
    pub fn pause(&mut self, id: u64) {
        self.signal(id, Signal::SIGSTOP);
        if let Some(node) = self.nodes.get_mut(&id)
            && node.child.is_some()
        {
            node.paused = true;
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) {
        self.signal(id, Signal::SIGCONT);
        if let Some(node) = self.nodes.get_mut(&id) {
            node.paused = false;
        }
    }

    /// Sends `signal` (e.g. `Signal::SIGSTOP`) to node `id`, if it runs.
    pub fn signal(&self, id: u64, signal: Signal) {
        if let Some(pid) = self.nodes.get(&id).and_then(NodeProc::pid) {
            send_signal(pid, signal);
        }
    }

    /// Sets the directed link `from → to` (no effect without proxies).
    pub fn set_link(&self, from: u64, to: u64, mode: LinkMode) {
        if let Some(proxy) = self.proxies.get(&(from, to)) {
            proxy.set(mode);
        }
    }

    /// Every link between nodes of different groups gets `mode` (both directions); links
    /// inside a group pass. Nodes in no group keep their links as they are.
    pub fn partition(&self, groups: &[Vec<u64>], mode: LinkMode) {
        let group_of = |id: u64| groups.iter().position(|g| g.contains(&id));
        for (&(from, to), proxy) in &self.proxies {
            match (group_of(from), group_of(to)) {
                (Some(a), Some(b)) if a != b => proxy.set(mode),
                (Some(_), Some(_)) => proxy.set(LinkMode::Pass),
                _ => {}
            }
        }
    }

    /// Every link passes again.
    pub fn heal_network(&self) {
        for proxy in self.proxies.values() {
            proxy.set(LinkMode::Pass);
        }
    }

    /// Fills node `id`'s small data disk (see [`Cluster::launch_on`]) until it is full.
    pub fn fill_disk(&self, id: u64) -> anyhow::Result<u64> {
        self.disks
            .get(&id)
            .context("the node has no small disk")?
            .fill()
    }

    /// Frees every node's small data disk again.
    pub fn free_disks(&self) -> anyhow::Result<()> {
        for disk in self.disks.values() {
            disk.free()?;
        }
        Ok(())
    }

    /// Node `id`'s exit status if its process exited on its own (it stays reaped-pending until
    /// [`Cluster::restart_exited`] or a kill).
    pub fn exit_status(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        self.nodes
            .get_mut(&id)
            .and_then(|n| n.child.as_mut())
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Nodes whose process exited on its own (no kill by the harness), with their exit status,
    /// reaped; each is started again, as a supervisor would.
    pub fn restart_exited(&mut self) -> anyhow::Result<Vec<(u64, std::process::ExitStatus)>> {
        let mut exited = Vec::new();
        for node in self.nodes.values_mut() {
            if let Some(child) = node.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                node.child = None;
                node.paused = false;
                exited.push((node.id, status));
            }
        }
        for (id, _) in &exited {
            self.spawn(*id)?;
        }
        Ok(exited)
    }

    /// Every node running, none paused, every link passing.
    pub fn heal_all(&mut self) -> anyhow::Result<()> {
        self.heal_network();
        for id in self.ids() {
            if !self.is_running(id) {
                self.spawn(id)?;
            } else if self.nodes.get(&id).is_some_and(|n| n.paused) {
                self.resume(id);
            }
        }
        Ok(())
    }

    /// A cluster-admin token the harness sends with its status calls (for a cluster with access
    /// control on).
    pub fn set_admin_token(&mut self, token: &str) {
        self.admin_token = Some(token.to_string());
    }

    /// The node's own status (a local read; fails fast on a down or paused node).
    pub async fn status(&self, id: u64) -> anyhow::Result<ClusterStatusResponse> {
        let channel = self.channel(id).context("no such node")?;
        let mut admin = ConchAdminClient::new(channel);
        let mut request = tonic::Request::new(ClusterStatusRequest {});
        if let Some(token) = &self.admin_token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse()?);
        }
        let reply = tokio::time::timeout(Duration::from_secs(2), admin.cluster_status(request))
            .await
            .context("status timed out")??;
        Ok(reply.into_inner())
    }

    /// Statuses of every live node that answered.
    pub async fn statuses(&self) -> BTreeMap<u64, ClusterStatusResponse> {
        let ids = self.live_ids();
        let replies = futures::future::join_all(ids.iter().map(|id| self.status(*id))).await;
        ids.into_iter()
            .zip(replies)
            .filter_map(|(id, r)| r.ok().map(|s| (id, s)))
            .collect()
    }

    /// The leader named by the node(s) with the highest term, if any live node knows one.
    pub async fn leader(&self) -> Option<u64> {
        let statuses = self.statuses().await;
        statuses
            .values()
            .filter(|s| s.leader_id != 0)
            .max_by_key(|s| s.term)
            .map(|s| s.leader_id)
            .filter(|id| self.is_live(*id))
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

    /// Where node `id` serves `/metrics`, from the startup line of its latest start.
    pub fn metrics_addr(&self, id: u64) -> Option<String> {
        let log = self.log(id);
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("metrics on http://"))?;
        let rest = line.split("metrics on http://").nth(1)?;
        rest.strip_suffix("/metrics").map(str::to_string)
    }

    pub fn log(&self, id: u64) -> String {
        self.nodes
            .get(&id)
            .and_then(|n| std::fs::read_to_string(&n.log_path).ok())
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in self.ids() {
            self.kill(id);
            if self.pki.is_some() {
                crate::pki::unregister(&self.addr(id));
            }
        }
        // Proxies abort their tasks when dropped with the map.
    }
}

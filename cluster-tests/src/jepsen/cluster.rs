//! A cluster of real `conchd` processes whose peer links all pass through [`LinkProxy`]s.
//!
//! Node `i` is started with `--peer-routes j=<proxy i→j>` for every other `j`, so the test can
//! cut, black-hole or slow any directed link. Clients talk to the nodes directly.
//!
//! Everything is stopped on drop, also when a test fails: paused nodes are resumed and every
//! process is killed and reaped; every proxy task is aborted.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use cluster_tests::{binary, free_port};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{ClusterStatusRequest, ClusterStatusResponse};
use tonic::transport::{Channel, Endpoint};

use super::proxy::{LinkMode, LinkProxy};

pub struct JepsenNode {
    pub id: u64,
    pub addr: String,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    paused: bool,
}

pub struct JepsenCluster {
    pub nodes: BTreeMap<u64, JepsenNode>,
    proxies: BTreeMap<(u64, u64), LinkProxy>,
    channels: BTreeMap<u64, Channel>,
    dir: Option<tempfile::TempDir>,
    kept: Option<PathBuf>,
}

/// A lazily connecting channel to `addr`: a down node fails calls quickly, a restarted one is
/// reconnected to.
pub fn lazy_channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .connect_lazy())
}

impl JepsenCluster {
    /// Starts `n` nodes with a proxy on every directed peer link; `extra_args` go to every
    /// node. Does not wait for a leader.
    pub async fn start(n: u64, extra_args: &[String]) -> anyhow::Result<JepsenCluster> {
        Self::start_with(n, extra_args, true).await
    }

    /// Like [`JepsenCluster::start`]; with `proxied` false the nodes dial each other directly
    /// (no `--peer-routes`; partitions then have no effect), to tell a proxy problem from a
    /// daemon problem.
    pub async fn start_with(
        n: u64,
        extra_args: &[String],
        proxied: bool,
    ) -> anyhow::Result<JepsenCluster> {
        let dir = tempfile::Builder::new()
            .prefix("conch-jepsen-")
            .tempdir()
            .context("tempdir")?;
        let ids: Vec<u64> = (1..=n).collect();
        let addrs: BTreeMap<u64, String> = ids
            .iter()
            .map(|id| (*id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let mut proxies = BTreeMap::new();
        for &from in &ids {
            for &to in &ids {
                if from != to {
                    let proxy = LinkProxy::start(from, to, addrs[&to].clone()).await?;
                    proxies.insert((from, to), proxy);
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
        for &id in &ids {
            let routes = ids
                .iter()
                .filter(|&&to| to != id)
                .map(|to| format!("{to}={}", proxies[&(id, *to)].addr))
                .collect::<Vec<_>>()
                .join(",");
            let data_dir = dir.path().join(format!("node{id}"));
            let mut args: Vec<String> = vec![
                "--id".into(),
                id.to_string(),
                "--listen".into(),
                addrs[&id].clone(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--initial-cluster".into(),
                initial_cluster.clone(),
                "--log".into(),
                std::env::var("CONCH_TEST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
                "--peer-routes".into(),
                routes,
            ];
            if !proxied {
                args.truncate(args.len() - 2);
            }
            args.extend(extra_args.iter().cloned());
            channels.insert(id, lazy_channel(&addrs[&id])?);
            nodes.insert(
                id,
                JepsenNode {
                    id,
                    addr: addrs[&id].clone(),
                    data_dir,
                    log_path: dir.path().join(format!("node{id}.log")),
                    args,
                    child: None,
                    paused: false,
                },
            );
        }
        let mut cluster = JepsenCluster {
            nodes,
            proxies,
            channels,
            dir: Some(dir),
            kept: None,
        };
        for id in ids {
            cluster.spawn(id)?;
        }
        Ok(cluster)
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
        let mut command = Command::new(binary("conchd"));
        command
            .args(&node.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("clone log handle")?)
            .stderr(log);
        // SAFETY: prctl(2) is async-signal-safe; the closure touches nothing else. The node
        // then dies with the thread that started it even if this process is killed before
        // its destructors run (e.g. by `timeout`).
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("spawn {}", binary("conchd").display()))?;
        node.child = Some(child);
        node.paused = false;
        Ok(())
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

    /// One lazily connecting channel per node (clone it freely).
    pub fn channels(&self) -> BTreeMap<u64, Channel> {
        self.channels.clone()
    }

    pub fn channel(&self, id: u64) -> Option<Channel> {
        self.channels.get(&id).cloned()
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.child.is_some())
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

    /// kill -9.
    pub fn kill(&mut self, id: u64) {
        self.signal(id, libc::SIGCONT);
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

    pub fn pause(&mut self, id: u64) {
        self.signal(id, libc::SIGSTOP);
        if let Some(node) = self.nodes.get_mut(&id)
            && node.child.is_some()
        {
            node.paused = true;
        }
    }

    pub fn resume(&mut self, id: u64) {
        self.signal(id, libc::SIGCONT);
        if let Some(node) = self.nodes.get_mut(&id) {
            node.paused = false;
        }
    }

    fn signal(&self, id: u64, signal: i32) {
        if let Some(pid) = self
            .nodes
            .get(&id)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
        {
            // SAFETY: plain kill(2) on a child process we own and have not reaped.
            unsafe { libc::kill(pid as i32, signal) };
        }
    }

    /// Sets the directed link `from → to`.
    pub fn set_link(&self, from: u64, to: u64, mode: LinkMode) {
        if let Some(proxy) = self.proxies.get(&(from, to)) {
            proxy.set(mode);
        }
    }

    pub fn link(&self, from: u64, to: u64) -> Option<LinkMode> {
        self.proxies.get(&(from, to)).map(LinkProxy::mode)
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

    /// The node's own status (a local read; fails fast on a down or paused node).
    pub async fn status(&self, id: u64) -> anyhow::Result<ClusterStatusResponse> {
        let channel = self.channel(id).context("no such node")?;
        let mut admin = ConchAdminClient::new(channel);
        let reply = tokio::time::timeout(
            Duration::from_secs(1),
            admin.cluster_status(ClusterStatusRequest {}),
        )
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

    pub fn log(&self, id: u64) -> String {
        self.nodes
            .get(&id)
            .and_then(|n| std::fs::read_to_string(&n.log_path).ok())
            .unwrap_or_default()
    }
}

impl Drop for JepsenCluster {
    fn drop(&mut self) {
        for id in self.ids() {
            self.kill(id);
        }
        // Proxies abort their tasks when dropped with the map.
    }
}

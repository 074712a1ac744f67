//! The etcd baseline: a 3-node etcd cluster (Debian's `etcd-server` binary) on loopback ports
//! chosen at run time, and the `conch sema` recipe on it, so conch and etcd are measured in
//! the same run on the same machine.
//!
//! The recipe (one semaphore of `max` slots under a prefix):
//! 1. a session lease (`LeaseGrant`; W1 one per client, W1b one per cycle);
//! 2. create-if-absent of our key, bound to the lease: a `Txn` comparing the key's
//!    create-revision with 0, then a `Put`; the fencing token is the key's create-revision;
//! 3. rank: `Range` of the prefix sorted by create-revision; rank < max holds a slot;
//! 4. otherwise watch the key at rank − max for its deletion, and rank again;
//! 5. release: delete our key (W1b also revokes the lease).
//!
//! The binary is `$ETCD_BIN`, else `target/bench-tools/etcd` (`scripts/install-bench-deps.sh`
//! unpacks it from Debian's package without installing a service), else `etcd` on the PATH.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tonic::transport::Channel;

use super::stats::{Errors, Latencies, Row, round1};
use super::{Opts, Placement, secs};

#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::maintenance_client::MaintenanceClient;

/// Where the etcd binary is.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ETCD_BIN") {
        return PathBuf::from(path);
    }
    let vendored = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-tools/etcd");
    if vendored.exists() {
        return vendored;
    }
    PathBuf::from("etcd")
}

/// A 3-node etcd cluster on loopback; every process is killed on drop, and dies with the
/// thread that started it.
pub struct EtcdCluster {
    nodes: Vec<Child>,
    /// Client addresses (host:port), node 1 first.
    pub endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for child in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loopback port the kernel picked and that is free again. etcd binds its ports itself
/// (it takes no passed sockets), so another process may take the port before it does; a
/// benchmark run is not a test, and a member that cannot bind shows in `start`'s error.
fn unused_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl EtcdCluster {
    /// Starts `n` members with default durability (every write fsynced on a majority) and
    /// waits until they elect a leader.
    pub async fn start(n: usize) -> anyhow::Result<EtcdCluster> {
        let dir = tempfile::Builder::new()
            .prefix("conch-bench-etcd-")
            .tempdir()?;
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| Ok((unused_port()?, unused_port()?)))
            .collect::<anyhow::Result<_>>()?;
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("e{}", i + 1);
            let log = std::fs::File::create(dir.path().join(format!("{name}.log")))?;
            let mut command = Command::new(binary());
            crate::dies_with_spawner(&mut command);
            let child = command
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.path().join(&name))
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                ])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "conch-bench"])
                .args(["--log-level", "error"])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| {
                    format!(
                        "start {} (install it with scripts/install-bench-deps.sh or set ETCD_BIN)",
                        binary().display()
                    )
                })?;
            nodes.push(child);
        }
        let cluster = EtcdCluster {
            nodes,
            endpoints: ports
                .iter()
                .map(|(client, _)| format!("127.0.0.1:{client}"))
                .collect(),
            _dir: dir,
        };
        cluster.leader(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    /// The index (into `endpoints`) of the leader; waits up to `timeout` for one.
    pub async fn leader(&self, timeout: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            for (i, ep) in self.endpoints.iter().enumerate() {
                let Ok(channel) = connect(ep).await else {
                    continue;
                };
                let Ok(status) = MaintenanceClient::new(channel)
                    .status(pb::StatusRequest {})
                    .await
                else {
                    continue;
                };
                let status = status.into_inner();
                let me = status.header.map_or(0, |h| h.member_id);
                if status.leader != 0 && status.leader == me {
                    return Ok(i);
                }
            }
            if Instant::now() >= deadline {
                bail!("no etcd leader within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills member `i` (-9).
    pub fn kill(&mut self, i: usize) {
        if let Some(child) = self.nodes.get_mut(i) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(super) async fn connect(addr: &str) -> anyhow::Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .connect()
        .await?)
}

/// A connection with a deadline on every call, that moves to the next member when a call
/// fails, as etcd's own client balancer does.
struct Failing {
    endpoints: Vec<String>,
    at: usize,
    client: Option<SemaClient>,
    prefix: String,
    session: i64,
}

impl Failing {
    async fn client(&mut self) -> Result<&mut SemaClient, String> {
        if self.client.is_none() {
            let addr = &self.endpoints[self.at % self.endpoints.len()];
            let channel = Channel::from_shared(format!("http://{addr}"))
                .map_err(|e| e.to_string())?
                .connect_timeout(Duration::from_millis(300))
                .timeout(Duration::from_secs(1))
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| {
                    self.at += 1;
                    e.to_string()
                })?;
            self.client = Some(SemaClient {
                kv: KvClient::new(channel.clone()),
                lease: LeaseClient::new(channel),
                prefix: self.prefix.clone(),
                session: Some(self.session),
            });
        }
        self.client.as_mut().ok_or_else(|| "no client".to_string())
    }

    async fn cycle(&mut self) -> Result<i64, String> {
        let result = self.client().await?.cycle(1).await;
        if result.is_err() {
            self.client = None;
            self.at += 1;
        }
        result
    }
}

/// W3 on etcd: W1 at 8 clients starting on the leader, each call with a 1 s deadline and a
/// move to the next member on failure; kill -9 of the leader after the warm-up plus 5 s.
pub async fn w3(cluster: &mut EtcdCluster, opts: &Opts) -> anyhow::Result<Row> {
    use super::w1::{FAILOVER_AFTER_KILL, FAILOVER_BEFORE_KILL, FAILOVER_CLIENTS, failover_row};
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let mut clients = Vec::new();
    for i in 0..FAILOVER_CLIENTS {
        let channel = connect(&cluster.endpoints[leader]).await?;
        let mut first = SemaClient {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            prefix: format!("/conch/v1/sema/w3-{i}/1/"),
            session: None,
        };
        let session = first.grant().await.map_err(anyhow::Error::msg)?;
        clients.push(Failing {
            endpoints: cluster.endpoints.clone(),
            at: leader,
            client: None,
            prefix: first.prefix.clone(),
            session,
        });
    }
    let t0 = Instant::now();
    let pre_start = t0 + opts.warmup;
    let kill_at = pre_start + FAILOVER_BEFORE_KILL;
    let stop_at = kill_at + FAILOVER_AFTER_KILL;
    let mut tasks = Vec::new();
    for mut client in clients {
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut errors = Vec::new();
            while Instant::now() < stop_at {
                let started = Instant::now();
                match client.cycle().await {
                    Ok(_) => done.push((started, Instant::now())),
                    Err(e) => {
                        errors.push((Instant::now(), e));
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (done, errors)
        }));
    }
    tokio::time::sleep_until(kill_at.into()).await;
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let killed_at = Instant::now();
    cluster.kill(leader);
    tokio::time::sleep_until(stop_at.into()).await;
    let mut done = Vec::new();
    let mut errors = Errors::default();
    for task in tasks {
        let (d, errs) = task.await.context("client task")?;
        done.extend(d);
        for (at, e) in errs {
            if at >= killed_at {
                errors.add(e);
            }
        }
    }
    let mut row = failover_row(done, pre_start, killed_at, stop_at, errors);
    row.set("system", "etcd");
    Ok(row)
}

/// One client of the recipe: its own connection (to one member), its semaphore prefix.
struct SemaClient {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    prefix: String,
    /// W1: the client's session lease; W1b: a new one per cycle.
    session: Option<i64>,
}

pub(super) fn status_code(s: &tonic::Status) -> String {
    format!("{:?}", s.code())
}

/// The end of the range of every key under `prefix`.
pub(super) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

impl SemaClient {
    async fn grant(&mut self) -> Result<i64, String> {
        let r = self
            .lease
            .lease_grant(pb::LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .map_err(|s| status_code(&s))?
            .into_inner();
        if !r.error.is_empty() {
            return Err(r.error);
        }
        Ok(r.id)
    }

    /// One cycle: (W1b: lease,) create-if-absent, rank, (uncontended: held), delete,
    /// (W1b: revoke). Returns the fencing token (the key's create-revision).
    async fn cycle(&mut self, max: usize) -> Result<i64, String> {
        let lease = match self.session {
            Some(id) => id,
            None => self.grant().await?,
        };
        let key = format!("{}{lease:x}", self.prefix).into_bytes();
        self.create_if_absent(&key, lease).await?;
        let (rank, ranked) = self.rank(&key).await?;
        if rank >= max {
            return Err(format!("rank {rank} in an uncontended semaphore"));
        }
        let token = ranked.kvs[rank].create_revision;
        self.delete(key).await?;
        if self.session.is_none() {
            self.lease
                .lease_revoke(pb::LeaseRevokeRequest { id: lease })
                .await
                .map_err(|s| status_code(&s))?;
        }
        Ok(token)
    }
}

/// W1 / W1b on etcd: `clients` clients, each with its own semaphore (max 1) and connection,
/// placed on the leader or spread over the members.
pub async fn w1(
    cluster: &EtcdCluster,
    opts: &Opts,
    clients: usize,
    per_cycle_lease: bool,
    placement: Placement,
) -> anyhow::Result<Row> {
    let workload = if per_cycle_lease { "W1b" } else { "W1" };
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let mut sema_clients = Vec::with_capacity(clients);
    for i in 0..clients {
        let member = placement.node(i, cluster.endpoints.len(), leader);
        let channel = connect(&cluster.endpoints[member]).await?;
        let mut client = SemaClient {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel),
            prefix: format!(
                "/conch/v1/sema/{workload}-{clients}-{}-{i}/1/",
                placement.name()
            ),
            session: None,
        };
        if !per_cycle_lease {
            client.session = Some(client.grant().await.map_err(anyhow::Error::msg)?);
        }
        sema_clients.push(client);
    }

    let t0 = Instant::now();
    let window_start = t0 + opts.warmup;
    let window_end = window_start + opts.duration;
    let mut tasks = Vec::new();
    for mut client in sema_clients {
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut errors = Vec::new();
            while Instant::now() < window_end {
                let start = Instant::now();
                match client.cycle(1).await {
                    Ok(_) => done.push((Instant::now(), start.elapsed())),
                    Err(e) => {
                        errors.push(e);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (done, errors)
        }));
    }
    let mut latencies = Latencies::default();
    let mut errors = Errors::default();
    for task in tasks {
        let (done, errs) = task.await.context("client task")?;
        for (at, latency) in done {
            if at >= window_start && at <= window_end {
                latencies.push(latency);
            }
        }
        for e in errs {
            errors.add(e);
        }
    }
    let after = cluster.leader(Duration::from_secs(10)).await?;
    let cycles = latencies.len() as f64;
    let mut row = Row::new(workload, clients as u64);
    row.set("system", "etcd");
    row.set("placement", placement.name());
    row.set("cycles_per_s", round1(cycles / secs(opts.duration)));
    row.opt("p50_ms", latencies.pct_ms(50.0));
    row.opt("p99_ms", latencies.pct_ms(99.0));
    row.set("errors", errors.total());
    if errors.total() > 0 {
        row.set("error_kinds", errors.to_value());
    }
    row.set("leader_moved", after != leader);
    Ok(row)
}

/// W2 on etcd: one semaphore with `permits` 2 and 16 clients, each looping create-if-absent,
/// rank, (watch the key at rank − max for its deletion, rank again), hold, delete. Grants and
/// releases are paired as in conch's W2 (see `w2.rs`).
pub async fn w2(
    cluster: &EtcdCluster,
    opts: &Opts,
    hold_max_ms: u64,
    placement: Placement,
) -> anyhow::Result<Row> {
    use super::w2::{CLIENTS, Event, PERMITS, handoff_row};
    let leader = cluster.leader(Duration::from_secs(10)).await?;
    let prefix = format!(
        "/conch/v1/sema/w2-{hold_max_ms}-{}/{PERMITS}/",
        placement.name()
    );
    let mut clients = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        let member = placement.node(i, cluster.endpoints.len(), leader);
        let channel = connect(&cluster.endpoints[member]).await?;
        let mut client = SemaClient {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            prefix: prefix.clone(),
            session: None,
        };
        client.session = Some(client.grant().await.map_err(anyhow::Error::msg)?);
        clients.push((client, pb::watch_client::WatchClient::new(channel)));
    }
    let t0 = Instant::now();
    let window_start = t0 + opts.warmup;
    let window_end = window_start + opts.duration;
    let mut tasks = Vec::new();
    for (i, (mut client, mut watch)) in clients.into_iter().enumerate() {
        let seed = 0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1) ^ (hold_max_ms << 32);
        tasks.push(tokio::spawn(async move {
            let mut rng = crate::rng::Rng::new(seed);
            let mut events = Vec::new();
            let mut errors = Errors::default();
            while Instant::now() < window_end {
                match client.acquire_waiting(&mut watch, PERMITS as usize).await {
                    Ok(key) => {
                        events.push((Instant::now(), Event::Grant));
                        if hold_max_ms > 0 {
                            let hold = rng.range(0, hold_max_ms);
                            tokio::time::sleep(Duration::from_millis(hold)).await;
                        }
                        events.push((Instant::now(), Event::Release));
                        if let Err(e) = client.delete(key).await {
                            errors.add(e);
                        }
                    }
                    Err(e) => {
                        errors.add(e);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (events, errors)
        }));
    }
    let mut events = Vec::new();
    let mut errors = Errors::default();
    for task in tasks {
        let (e, errs) = task.await.context("client task")?;
        events.extend(e);
        errors.merge(errs);
    }
    let mut row = handoff_row(events, opts, window_start, window_end, hold_max_ms, errors);
    row.set("system", "etcd");
    row.set("placement", placement.name());
    Ok(row)
}

impl SemaClient {
    /// The recipe's acquire with waiting: create-if-absent, rank, and while the rank is not
    /// below `max`, watch the key at rank − max for its deletion and rank again. Returns our
    /// key.
    async fn acquire_waiting(
        &mut self,
        watch: &mut pb::watch_client::WatchClient<Channel>,
        max: usize,
    ) -> Result<Vec<u8>, String> {
        let lease = self.session.ok_or("no session lease")?;
        let key = format!("{}{lease:x}", self.prefix).into_bytes();
        self.create_if_absent(&key, lease).await?;
        loop {
            let (rank, ranked) = self.rank(&key).await?;
            if rank < max {
                return Ok(key);
            }
            let ahead = ranked.kvs[rank - max].key.clone();
            let revision = ranked.header.map_or(0, |h| h.revision);
            wait_deleted(watch, ahead, revision + 1).await?;
        }
    }

    /// Puts our key bound to `lease` unless it exists (a `Txn` on its create revision being 0).
    async fn create_if_absent(&mut self, key: &[u8], lease: i64) -> Result<(), String> {
        let put = pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Create as i32,
                key: key.to_vec(),
                target_union: Some(pb::compare::TargetUnion::CreateRevision(0)),
                range_end: Vec::new(),
            }],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: key.to_vec(),
                    value: b"{\"host\":\"bench\"}".to_vec(),
                    lease,
                    ..Default::default()
                })),
            }],
            failure: Vec::new(),
        };
        self.kv.txn(put).await.map_err(|s| status_code(&s))?;
        Ok(())
    }

    /// Our key's rank among the prefix's keys sorted by create revision, and the range.
    async fn rank(&mut self, key: &[u8]) -> Result<(usize, pb::RangeResponse), String> {
        let ranked = self
            .kv
            .range(pb::RangeRequest {
                key: self.prefix.clone().into_bytes(),
                range_end: prefix_end(&self.prefix),
                sort_order: pb::range_request::SortOrder::Ascend as i32,
                sort_target: pb::range_request::SortTarget::Create as i32,
                keys_only: true,
                ..Default::default()
            })
            .await
            .map_err(|s| status_code(&s))?
            .into_inner();
        let rank = ranked
            .kvs
            .iter()
            .position(|kv| kv.key == key)
            .ok_or("our key is missing from the range")?;
        Ok((rank, ranked))
    }

    async fn delete(&mut self, key: Vec<u8>) -> Result<(), String> {
        self.kv
            .delete_range(pb::DeleteRangeRequest {
                key,
                ..Default::default()
            })
            .await
            .map_err(|s| status_code(&s))?;
        Ok(())
    }
}

/// Watches `key` from `revision` until it is deleted (at once if it already was since).
pub(super) async fn wait_deleted(
    watch: &mut pb::watch_client::WatchClient<Channel>,
    key: Vec<u8>,
    revision: i64,
) -> Result<(), String> {
    use futures::StreamExt;
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key,
                start_revision: revision,
                filters: vec![pb::watch_create_request::FilterType::Noput as i32],
                ..Default::default()
            },
        )),
    };
    // The request side stays open until the watch ends; dropping the stream cancels it.
    let requests = futures::stream::iter([create]).chain(futures::stream::pending());
    let mut responses = watch
        .watch(requests)
        .await
        .map_err(|s| status_code(&s))?
        .into_inner();
    while let Some(response) = responses.next().await {
        let response = response.map_err(|s| status_code(&s))?;
        if response.canceled {
            return Err(format!("watch canceled: {}", response.cancel_reason));
        }
        if response
            .events
            .iter()
            .any(|e| e.r#type == pb::event::EventType::Delete as i32)
        {
            return Ok(());
        }
    }
    Err("watch ended".into())
}

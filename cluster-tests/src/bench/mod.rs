//! The benchmark workloads of `conch-bench`.
//!
//! Each workload gets a fresh 3-node release cluster on loopback (or the `--endpoints` given),
//! drives it from this one process, and returns one [`stats::Row`] per run. Timestamps that are
//! compared with each other (release sent, grant observed, kill) are all `Instant`s taken in
//! this process.

pub mod breakdown;
pub mod compare;
pub mod elect;
pub mod etcd;
pub mod etcd_locks;
pub mod locks;
pub mod loss;
pub mod stats;
pub mod sync;
pub mod w1;
pub mod w2;
pub mod w4;
pub mod w5;
pub mod w6;

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::conch::ClusterStatusResponse;
use conch_proto::grackle as pb;
use futures::StreamExt;
use tonic::Status;

use crate::Cluster;
use crate::net::{Failover, Grackle, connect, find_leader, is_failover};
use stats::Errors;

/// Settings shared by the workloads.
#[derive(Clone, Debug)]
pub struct Opts {
    pub duration: Duration,
    pub warmup: Duration,
    pub w4_leases: usize,
    pub w5_leases: usize,
    pub w5_semaphores: usize,
    pub w5_waiters: usize,
    /// Start the cluster with TLS, client certificates and peer mutual TLS.
    pub tls: bool,
    /// Access control on, every client sending a token (`--auth`).
    pub auth: bool,
    /// Client counts of W1's rows (`--clients`).
    pub w1_clients: Vec<usize>,
    /// Client counts of W1b's rows (`--clients`).
    pub w1b_clients: Vec<usize>,
    /// W1 also reports where each write's time goes (`--breakdown`).
    pub breakdown: bool,
    /// W6's settings (`--w6-*`).
    pub w6: w6::W6Opts,
}

/// Where the clients of a workload connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every client on the leader (conch clients follow the `conch-leader` hint).
    Leader,
    /// Clients dealt over all nodes, never following a leader hint: what a plain Grackle or
    /// etcd client does. See [`Placement::node`].
    Spread,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Leader => "leader",
            Placement::Spread => "spread",
        }
    }

    /// The node (index into the `n` endpoints) client `i` connects to when the leader is node
    /// `leader`. Spread deals the clients out starting at the node after the leader, so that
    /// with fewer clients than nodes every client is on a follower, in conch as in etcd,
    /// whichever node won the election; 64 clients on 3 nodes put 21 or 22 on each.
    pub fn node(self, i: usize, n: usize, leader: usize) -> usize {
        match self {
            Placement::Leader => leader,
            Placement::Spread => (leader + 1 + i) % n.max(1),
        }
    }
}

/// The position of the leader's address `addr` among `endpoints`.
pub fn leader_index(endpoints: &[String], addr: &str) -> anyhow::Result<usize> {
    endpoints.iter().position(|e| e == addr).ok_or_else(|| {
        anyhow::anyhow!(
            "the leader's address {addr} is not one of the endpoints {}",
            endpoints.join(",")
        )
    })
}

/// What a workload runs against: a cluster this process started, or given endpoints.
pub struct Target {
    pub cluster: Option<Cluster>,
    pub endpoints: Vec<String>,
    /// Namespace for this workload (unique per run against external endpoints).
    pub ns: String,
    /// With `--auth`: the bootstrap token file, which restarted nodes read again.
    _token_dir: Option<tempfile::TempDir>,
}

impl Target {
    /// A fresh 3-node cluster with default conchd settings, or the external endpoints. With
    /// `tls`, TLS + client certificates + peer mutual TLS; with `auth`, the fresh cluster has
    /// access control on and every client sends a token (external endpoints get the token of
    /// `CONCH_TOKEN`, if set).
    pub async fn new(
        endpoints: &Option<Vec<String>>,
        tag: &str,
        tls: bool,
        auth: bool,
    ) -> anyhow::Result<Target> {
        match endpoints {
            Some(endpoints) => {
                if let (true, Ok(token)) = (auth, std::env::var("CONCH_TOKEN")) {
                    // Set once per process; a second workload keeps the first.
                    let _ = crate::net::use_token(&token);
                }
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                let target = Target {
                    cluster: None,
                    endpoints: endpoints.clone(),
                    ns: format!("bench-{tag}-{stamp}"),
                    _token_dir: None,
                };
                target.create_namespace().await?;
                Ok(target)
            }
            None => {
                let conchd = crate::binary("conchd");
                if !conchd.exists() {
                    bail!(
                        "conchd not found at {}: build it with `cargo build --release -p conchd` or set CONCHD_BIN",
                        conchd.display()
                    );
                }
                let (token_dir, args) = match auth {
                    true => {
                        let (dir, args) = crate::auth::bootstrap_args()?;
                        (Some(dir), args)
                    }
                    false => (None, Vec::new()),
                };
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let cluster = Cluster::start_opts(3, &args, tls)
                    .await
                    .context("start a 3-node cluster")?;
                if auth {
                    crate::auth::wait_until_on(&cluster, Duration::from_secs(30)).await?;
                }
                let endpoints = cluster.endpoints();
                let target = Target {
                    cluster: Some(cluster),
                    endpoints,
                    ns: format!("bench-{tag}"),
                    _token_dir: token_dir,
                };
                target.create_namespace().await?;
                Ok(target)
            }
        }
    }

    async fn create_namespace(&self) -> anyhow::Result<()> {
        let leader = self.leader().await?;
        let mut conn = Failover::new(&self.endpoints, &leader.addr, Duration::from_secs(5));
        let request = pb::CreateNamespaceRequest {
            name: self.ns.clone(),
            ..Default::default()
        };
        let mut last = None;
        for _ in 0..5 {
            let request = request.clone();
            match conn
                .call(move |mut c| async move { c.create_namespace(request).await })
                .await
            {
                Ok(_) => return self.lift_quotas(&leader.addr).await,
                Err(s) if s.code() == tonic::Code::AlreadyExists => {
                    return self.lift_quotas(&leader.addr).await;
                }
                Err(s) if is_failover(s.code()) => last = Some(s),
                Err(s) => return Err(s).with_context(|| format!("create namespace {}", self.ns)),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last.unwrap_or_else(|| Status::unknown("no attempt")))
            .with_context(|| format!("create namespace {}", self.ns))
    }

    /// Raises the bench namespace's quotas and the state's budget to what the state can hold:
    /// W4 and W5 measure scale past the defaults. Against external endpoints whose token may not
    /// set quotas, says so and goes on with the quotas as they are.
    async fn lift_quotas(&self, leader: &str) -> anyhow::Result<()> {
        self.lift_quotas_of(leader, &self.ns).await
    }

    /// Like [`Target::lift_quotas`], for namespace `ns`.
    pub async fn lift_quotas_of(&self, leader: &str, ns: &str) -> anyhow::Result<()> {
        use conch_proto::conch::conch_quota_client::ConchQuotaClient;
        use conch_proto::conch::{
            NamespaceQuotas, SetNamespaceQuotasRequest, SetStateBudgetRequest,
        };
        const MAX_BYTES: u64 = 64 << 30;
        let channel = connect(leader, Duration::from_secs(5)).await?;
        let mut quota = ConchQuotaClient::new(channel);
        let lifted = async {
            quota
                .set_state_budget(SetStateBudgetRequest {
                    budget_bytes: MAX_BYTES,
                })
                .await?;
            quota
                .set_namespace_quotas(SetNamespaceQuotasRequest {
                    namespace_name: ns.to_string(),
                    quotas: Some(NamespaceQuotas {
                        semaphores: 1_000_000,
                        leases: 1_000_000,
                        entries: 100_000_000,
                        bytes: MAX_BYTES,
                        request_ids: 100_000,
                    }),
                })
                .await
        };
        match lifted.await {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::PermissionDenied && self.cluster.is_none() => {
                eprintln!(
                    "conch-bench: this token may not lift the quotas of {ns}: W4 and W5 may meet them"
                );
                Ok(())
            }
            Err(s) => Err(s).with_context(|| format!("lift the quotas of {ns}")),
        }
    }

    /// Status of the current leader, as the leader reports it (waits up to 10 s for one).
    pub async fn leader(&self) -> anyhow::Result<ClusterStatusResponse> {
        find_leader(&self.endpoints, Duration::from_secs(10)).await
    }

    /// Plain clients to `addr`, one channel (TCP connection) each.
    pub async fn clients(&self, addr: &str, n: usize) -> anyhow::Result<Vec<Grackle>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let channel = connect(addr, Duration::from_secs(1)).await?;
            out.push(Grackle::new(channel).max_decoding_message_size(16 * 1024 * 1024));
        }
        Ok(out)
    }

    pub fn cluster_mut(&mut self) -> anyhow::Result<&mut Cluster> {
        self.cluster
            .as_mut()
            .context("this workload needs a cluster started by conch-bench (no --endpoints)")
    }
}

/// Runs `f(i)` for `i` in `0..n`, at most `in_flight` at once; returns the results in order.
pub async fn batched<T, F, Fut>(n: usize, in_flight: usize, f: F) -> Vec<Result<T, Status>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    futures::stream::iter(0..n)
        .map(&f)
        .buffered(in_flight.max(1))
        .collect()
        .await
}

/// Creates `n` leases in `ns` with `ttl_seconds`, the `i`th with process id `process(i)`,
/// `in_flight` at a time over the clients of `pool`; fails (naming `what`) if any fails.
pub async fn create_leases(
    pool: &[Grackle],
    ns: &str,
    n: usize,
    in_flight: usize,
    ttl_seconds: u64,
    process: impl Fn(usize) -> String,
    what: &str,
) -> anyhow::Result<Vec<String>> {
    let results = batched(n, in_flight, |i| {
        let mut c = pool[i % pool.len()].clone();
        let req = pb::CreateSemaphoreLeaseRequest {
            namespace_name: ns.to_string(),
            process_id: process(i),
            ttl_seconds,
            ..Default::default()
        };
        async move {
            let r = c.create_semaphore_lease(req).await?.into_inner();
            Ok(r.lease.map(|l| l.lease_id).unwrap_or_default())
        }
    })
    .await;
    check_setup(what, results)
}

/// Fails with the first error of a setup batch, with the error tally.
pub fn check_setup<T>(what: &str, results: Vec<Result<T, Status>>) -> anyhow::Result<Vec<T>> {
    let mut errors = Errors::default();
    let mut first = None;
    let mut ok = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(s) => {
                errors.status(&s);
                first.get_or_insert(s);
            }
        }
    }
    if let Some(s) = first {
        bail!(
            "{what}: {} failed {:?}; first: {:?} {}",
            errors.total(),
            errors.0,
            s.code(),
            s.message()
        );
    }
    Ok(ok)
}

/// `VmRSS` of a process in MiB.
pub fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let line = text
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kb: f64 = line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()
        .context("parse VmRSS")?;
    Ok(stats::round1(kb / 1024.0))
}

/// Disk used by the files under `dir` (recursively), in bytes: the blocks allocated, as `du`
/// counts them (a sparse file counts what was written into it, not its length).
pub fn dir_bytes(dir: &Path) -> u64 {
    dir_sizes(dir).allocated
}

/// What the files under a directory take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirSizes {
    /// Blocks allocated on disk, in bytes (`du`).
    pub allocated: u64,
    /// The files' lengths added up (`du --apparent-size`); larger than `allocated` for sparse
    /// files such as the log's last segment.
    pub apparent: u64,
}

/// The sizes of the files under `dir`, recursively; 0 for a directory that cannot be read.
pub fn dir_sizes(dir: &Path) -> DirSizes {
    use std::os::unix::fs::MetadataExt;
    let mut total = DirSizes::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return total;
    };
    for entry in entries.flatten() {
        match entry.metadata() {
            Ok(m) if m.is_dir() => {
                let sub = dir_sizes(&entry.path());
                total.allocated += sub.allocated;
                total.apparent += sub.apparent;
            }
            Ok(m) => {
                total.allocated += m.blocks() * 512;
                total.apparent += m.len();
            }
            Err(_) => {}
        }
    }
    total
}

pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

pub fn ms_between(from: Instant, to: Instant) -> f64 {
    stats::round1(to.saturating_duration_since(from).as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_starts_after_the_leader_and_covers_every_node() {
        // One client: on a follower, wherever the leader is.
        for leader in 0..3 {
            assert_ne!(Placement::Spread.node(0, 3, leader), leader);
        }
        assert_eq!(Placement::Spread.node(0, 3, 2), 0);
        // 64 clients: 21 or 22 on each node.
        let mut per_node = [0usize; 3];
        for i in 0..64 {
            per_node[Placement::Spread.node(i, 3, 1)] += 1;
        }
        assert_eq!(per_node, [21, 21, 22]);
        assert_eq!(Placement::Leader.node(5, 3, 1), 1);
    }

    #[test]
    fn leader_index_names_a_leader_outside_the_endpoints() {
        let endpoints = vec!["127.0.0.1:1".to_string(), "127.0.0.1:2".to_string()];
        assert_eq!(leader_index(&endpoints, "127.0.0.1:2").ok(), Some(1));
        let err = leader_index(&endpoints, "10.0.0.1:7001")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("10.0.0.1:7001"), "{err}");
    }
}

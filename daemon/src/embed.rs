//! Running a conch node inside another program: the embedding API, and below it the start
//! `conchd` itself uses (`server`). Layer 10 of docs/design.md ("Module graph"), the top.
//!
//! [`NodeConfig`] describes a node in code (no flags, no `CONCH_*` environment variables, no
//! config file); [`ConchNode::start`] runs it exactly as `conchd` does (the same
//! [`server::start_with_listener`] and [`server::serve`]: same storage, same Raft, same port
//! serving clients and peers); [`ConchNode::client`] talks to it from the same process; and
//! [`ConchNode::shutdown`] stops it.
//!
//! # The in-process client
//!
//! [`LocalClient`] hands out the generated gRPC clients (`GrackleApiClient`, `ConchApiClient`,
//! `ConchAdminClient`, `ConchAuthClient`) over the node's own service implementations, called
//! as a `tower::Service` in this process: no socket, no HTTP/2, no TLS. Each call is still
//! encoded and decoded as a gRPC message and goes through the very handler a network client
//! reaches, so it has the same semantics, errors (`tonic::Status` codes and messages), limits
//! (validation, the 4 MiB request limit, access control with an `authorization: Bearer` header
//! when it is on) and forwarding (a follower's client reaches the leader through the peer
//! channel, as a follower's network clients do). What it does not have: the `conch-leader`
//! response header and the per-call metrics, which describe network clients.
//!
//! # Ownership
//!
//! The node owns its data directory while it runs: it locks `<data_dir>/LOCK`, and a second
//! node on the same directory, in this process or another, fails to start
//! ([`crate::data_dir::DataDirError::InUse`]). The lock is released once
//! [`ConchNode::shutdown`] returns. Every task runs on the caller's tokio runtime
//! (multi-threaded), which must outlive the node. The library never installs a log subscriber:
//! the embedding program's `tracing` subscriber receives conchd's events.
//!
//! # Shutdown
//!
//! [`ConchNode::shutdown`] stops serving (in-flight calls end first), stops Raft and returns
//! once the storage is closed: the data directory can then be opened again. Dropping a
//! [`ConchNode`] without it starts the same shutdown in the background and returns at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::conch_auth_client::ConchAuthClient;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::api;
use crate::config::{Config, ConfigError, Settings};
use crate::node::Node;
use server::StartError;

pub mod server;

/// Why an embedded node did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The configuration is invalid (the message names the equivalent `conchd` flag).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Binding, opening the data directory or starting Raft failed.
    #[error(transparent)]
    Start(#[from] StartError),
}

/// Where the node serves: an address to bind, or a listener the program bound itself.
#[derive(Debug)]
enum Listen {
    Addr(String),
    Bound(std::net::TcpListener),
}

/// An embedded node's settings, built in code. Validated by [`ConchNode::start`] with the same
/// rules (and defaults) as `conchd`'s flags; unlike `conchd`, metrics are off unless
/// [`NodeConfig::metrics_listen`] turns them on.
#[derive(Debug)]
pub struct NodeConfig {
    listen: Listen,
    settings: Settings,
    /// See [`NodeConfig::cluster_version_max`]; `None`: this build's newest.
    cluster_version_max: Option<u32>,
}

impl NodeConfig {
    /// A single-node cluster (node 1) serving on `listen` (port 0: any free port) with its data
    /// in `data_dir`.
    pub fn single(listen: impl Into<String>, data_dir: impl Into<PathBuf>) -> NodeConfig {
        NodeConfig::new(1, listen, data_dir)
    }

    /// Node `id` serving on `listen` with its data in `data_dir`; a member of a larger cluster
    /// once given [`NodeConfig::initial_cluster`] (or [`NodeConfig::join`]).
    pub fn new(id: u64, listen: impl Into<String>, data_dir: impl Into<PathBuf>) -> NodeConfig {
        NodeConfig {
            listen: Listen::Addr(listen.into()),
            settings: Settings {
                id: Some(id),
                data_dir: Some(data_dir.into()),
                metrics_listen: Some("off".into()),
                ..Settings::default()
            },
            cluster_version_max: None,
        }
    }

    /// Serve on a listener the program has bound (e.g. several nodes on port 0, whose
    /// addresses must all be known for [`NodeConfig::initial_cluster`] before any starts).
    pub fn listener(mut self, listener: std::net::TcpListener) -> NodeConfig {
        self.listen = Listen::Bound(listener);
        self
    }

    /// The address other nodes and clients reach this node at (default: the bound address).
    pub fn advertise(mut self, addr: impl Into<String>) -> NodeConfig {
        self.settings.advertise = Some(addr.into());
        self
    }

    /// The members to bootstrap an empty cluster with, by id; must include this node at its
    /// advertised address. Ignored once the data directory holds a cluster.
    pub fn initial_cluster<A: Into<String>>(
        mut self,
        members: impl IntoIterator<Item = (u64, A)>,
    ) -> NodeConfig {
        let text = members
            .into_iter()
            .map(|(id, addr)| format!("{id}={}", addr.into()))
            .collect::<Vec<_>>()
            .join(",");
        self.settings.initial_cluster = Some(text);
        self
    }

    /// Dial these peers at other addresses than their advertised ones.
    pub fn peer_routes<A: Into<String>>(
        mut self,
        routes: impl IntoIterator<Item = (u64, A)>,
    ) -> NodeConfig {
        let text = routes
            .into_iter()
            .map(|(id, addr)| format!("{id}={}", addr.into()))
            .collect::<Vec<_>>()
            .join(",");
        self.settings.peer_routes = Some(text);
        self
    }

    /// Never bootstrap: an empty node waits to be added to a running cluster.
    pub fn join(mut self) -> NodeConfig {
        self.settings.join = true;
        self
    }

    /// The cluster's name (`--cluster-name`): recorded in the data directory when the node
    /// bootstraps or first joins; a later start with another name is refused.
    pub fn cluster_name(mut self, name: impl Into<String>) -> NodeConfig {
        self.settings.cluster_name = Some(name.into());
        self
    }

    /// Serve TLS with this certificate chain and key (PEM files, re-read when they change).
    pub fn tls(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> NodeConfig {
        self.settings.tls_cert = Some(cert.into());
        self.settings.tls_key = Some(key.into());
        self
    }

    /// Serve the peer service on its own address (port 0: any free port, then also give
    /// [`NodeConfig::peer_advertise`]); the initial cluster then names peer addresses.
    pub fn peer_listen(mut self, addr: impl Into<String>) -> NodeConfig {
        self.settings.peer_listen = Some(addr.into());
        self
    }

    /// The address other nodes reach this node's peer service at (default: its peer listen
    /// address).
    pub fn peer_advertise(mut self, addr: impl Into<String>) -> NodeConfig {
        self.settings.peer_advertise = Some(addr.into());
        self
    }

    /// Peers prove they are members by this shared secret (a file holding at least 32
    /// characters, the same on every node). Access control needs this or [`NodeConfig::peer_ca`].
    pub fn peer_secret_file(mut self, path: impl Into<PathBuf>) -> NodeConfig {
        self.settings.peer_secret_file = Some(path.into());
        self
    }

    /// With [`NodeConfig::tls`]: require client certificates signed by this CA.
    pub fn client_ca(mut self, ca: impl Into<PathBuf>) -> NodeConfig {
        self.settings.client_ca = Some(ca.into());
        self
    }

    /// With [`NodeConfig::tls`]: mutual TLS between nodes, checked against this CA (required
    /// for a cluster of several nodes over TLS).
    pub fn peer_ca(mut self, ca: impl Into<PathBuf>) -> NodeConfig {
        self.settings.peer_ca = Some(ca.into());
        self
    }

    /// With [`NodeConfig::peer_ca`]: certificate revocation lists of the peer CA (PEM), re-read
    /// when the file changes.
    pub fn peer_crl(mut self, crl: impl Into<PathBuf>) -> NodeConfig {
        self.settings.peer_crl = Some(crl.into());
        self
    }

    /// Serve Prometheus metrics at `http://addr/metrics` (off by default when embedded).
    pub fn metrics_listen(mut self, addr: impl Into<String>) -> NodeConfig {
        self.settings.metrics_listen = Some(addr.into());
        self
    }

    /// Serve the read-only status page at `http://addr/ui/` (off by default), as `conchd
    /// --ui-listen` does.
    pub fn ui_listen(mut self, addr: impl Into<String>) -> NodeConfig {
        self.settings.ui_listen = Some(addr.into());
        self
    }

    /// Raft heartbeat interval (default 100 ms).
    pub fn heartbeat(mut self, interval: Duration) -> NodeConfig {
        self.settings.heartbeat_ms = Some(interval.as_millis() as u64);
        self
    }

    /// Minimum election timeout, at least 3 heartbeats (default 300 ms).
    pub fn election_timeout(mut self, timeout: Duration) -> NodeConfig {
        self.settings.election_timeout_ms = Some(timeout.as_millis() as u64);
        self
    }

    /// Snapshot (and compact the log) every this many entries (default 10 000).
    pub fn snapshot_every(mut self, entries: u64) -> NodeConfig {
        self.settings.snapshot_every = Some(entries);
        self
    }

    /// How long a call waits for a leader during an election (default 3 s).
    pub fn leader_wait(mut self, wait: Duration) -> NodeConfig {
        self.settings.leader_wait_ms = Some(wait.as_millis() as u64);
        self
    }

    /// Install the token in this file as the cluster's first cluster admin and turn access
    /// control on, once (give it to every node of a new cluster); the node answers no client
    /// call until that is committed. Needs [`NodeConfig::peer_secret_file`] or
    /// [`NodeConfig::peer_ca`].
    pub fn bootstrap_admin_token_file(mut self, path: impl Into<PathBuf>) -> NodeConfig {
        self.settings.bootstrap_admin_token_file = Some(path.into());
        self
    }

    /// The newest cluster version the node speaks (default, and at most: this build's newest;
    /// at least 1). A lower one makes the node behave, in what it says and what it follows, as
    /// a node of the release that speaks only up to it: it answers `ConchPeer.NodeInfo` and
    /// shows in its status and metrics that it speaks no more, a new cluster it bootstraps
    /// starts at that version, and it refuses log entries that raise the cluster version past
    /// it (it falls behind, as a node of that release could not decode them). This is for
    /// testing rolling upgrades inside one program (the simulator runs one node of a cluster
    /// this way and then "upgrades" it); `conchd` has no such flag.
    pub fn cluster_version_max(mut self, version: u32) -> NodeConfig {
        self.cluster_version_max = Some(version);
        self
    }

    /// Validates without binding anything: the configuration for a program that hands the node
    /// its connections itself ([`server::start_with_incoming`]) and connects it to the
    /// other nodes through `dial`. The listen address is only what the node says it listens
    /// on; a listener given with [`NodeConfig::listener`] is not used.
    #[doc(hidden)]
    pub fn into_config(self, dial: crate::net::transport::Dial) -> Result<Config, ConfigError> {
        let NodeConfig {
            listen,
            mut settings,
            cluster_version_max,
        } = self;
        if let Listen::Addr(text) = listen {
            settings.listen = Some(text);
        }
        let mut config = Config::from_settings(settings)?;
        config.dial = Some(dial);
        speak_at_most(&mut config, cluster_version_max)?;
        Ok(config)
    }

    /// Binds (unless bound already) and validates: the configuration as `conchd` would build it
    /// from the same flags, with the bound address as `--listen`.
    async fn bind(self) -> Result<(Config, tokio::net::TcpListener), EmbedError> {
        let NodeConfig {
            listen,
            mut settings,
            cluster_version_max,
        } = self;
        let listener = match listen {
            Listen::Addr(text) => tokio::net::TcpListener::bind(text.as_str())
                .await
                .map_err(|error| StartError::Bind { addr: text, error })?,
            Listen::Bound(listener) => {
                listener
                    .set_nonblocking(true)
                    .map_err(|error| StartError::Bind {
                        addr: local_addr_text(&listener),
                        error,
                    })?;
                tokio::net::TcpListener::from_std(listener).map_err(|error| StartError::Bind {
                    addr: "a listener of the program".into(),
                    error,
                })?
            }
        };
        let bound = listener.local_addr().map_err(|error| StartError::Bind {
            addr: "the bound listener".into(),
            error,
        })?;
        settings.listen = Some(bound.to_string());
        let mut config = Config::from_settings(settings)?;
        speak_at_most(&mut config, cluster_version_max)?;
        Ok((config, listener))
    }
}

/// Sets the newest cluster version `config`'s node speaks, when given; refuses one this build
/// does not speak.
fn speak_at_most(config: &mut Config, version: Option<u32>) -> Result<(), ConfigError> {
    use crate::state::version::{BASE, NEWEST};
    let Some(version) = version else {
        return Ok(());
    };
    if !(BASE..=NEWEST).contains(&version) {
        return Err(ConfigError::Invalid(format!(
            "cluster_version_max {version}: this build speaks cluster versions {BASE} to {NEWEST}"
        )));
    }
    config.cluster_version_max = version;
    Ok(())
}

fn local_addr_text(listener: &std::net::TcpListener) -> String {
    listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "a listener of the program".into())
}

/// A running node. Stop it with [`ConchNode::shutdown`]; dropping it stops it in the
/// background.
///
/// # Example
///
/// A single node on a free port, a semaphore taken and released through the in-process
/// client (this is `daemon/examples/embedded.rs`, run as a test):
///
#[doc = concat!("```\n", include_str!("../examples/embedded.rs"), "```")]
pub struct ConchNode {
    node: Arc<Node>,
    local_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    ui_addr: Option<SocketAddr>,
    client: LocalClient,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<Result<(), StartError>>>,
}

impl ConchNode {
    /// Binds, opens (or creates) the data directory, starts Raft (bootstrapping a new cluster
    /// if the directory is empty and this node is the lowest id of the initial cluster) and
    /// serves. Returns once the node serves; a leader may not be elected yet (calls wait for
    /// one, up to the leader wait).
    pub async fn start(config: NodeConfig) -> Result<ConchNode, EmbedError> {
        let (config, listener) = config.bind().await?;
        Ok(ConchNode::start_bound(Arc::new(config), listener).await?)
    }

    /// Runs a node from a [`Config`] built elsewhere (as `conchd` does from its flags): binds
    /// `config.listen`, then as [`ConchNode::start`].
    pub async fn start_config(config: Arc<Config>) -> Result<ConchNode, StartError> {
        let listener = server::bind(&config).await?;
        ConchNode::start_bound(config, listener).await
    }

    /// Like [`ConchNode::start_config`], on the listeners a service manager passed (see
    /// [`crate::net::listen_fds`]); a listener it did not pass is bound at its configured address.
    /// `config` should name the passed listeners' addresses (as `conchd` builds it).
    pub async fn start_inherited(
        config: Arc<Config>,
        inherited: crate::net::listen_fds::Inherited,
    ) -> Result<ConchNode, StartError> {
        let crate::net::listen_fds::Inherited {
            client,
            peer,
            metrics,
        } = inherited;
        let adopt = |listener: Option<std::net::TcpListener>,
                     bind_error: fn(String, std::io::Error) -> StartError| {
            listener
                .map(|l| {
                    let addr = local_addr_text(&l);
                    tokio::net::TcpListener::from_std(l).map_err(|error| bind_error(addr, error))
                })
                .transpose()
        };
        let client = adopt(client, |addr, error| StartError::Bind { addr, error })?;
        let peer = adopt(peer, |addr, error| StartError::BindPeer { addr, error })?;
        let metrics = adopt(metrics, |addr, error| StartError::BindMetrics {
            addr,
            error,
        })?;
        let listener = match client {
            Some(listener) => listener,
            None => tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|error| StartError::Bind {
                    addr: config.listen.to_string(),
                    error,
                })?,
        };
        ConchNode::start_bound_with(config, listener, peer, metrics).await
    }

    async fn start_bound(
        config: Arc<Config>,
        listener: tokio::net::TcpListener,
    ) -> Result<ConchNode, StartError> {
        ConchNode::start_bound_with(config, listener, None, None).await
    }

    async fn start_bound_with(
        config: Arc<Config>,
        listener: tokio::net::TcpListener,
        peer: Option<tokio::net::TcpListener>,
        metrics: Option<tokio::net::TcpListener>,
    ) -> Result<ConchNode, StartError> {
        // Asked before anything starts: nothing is left running when it fails.
        let local_addr = listener.local_addr().map_err(|error| StartError::Bind {
            addr: config.listen.to_string(),
            error,
        })?;
        let running = server::start_with_listeners(config, listener, peer, metrics).await?;
        let metrics_addr = running.metrics_addr();
        let ui_addr = running.ui_addr();
        let node = Arc::clone(&running.node);
        let (stop, stopped) = oneshot::channel::<()>();
        // Stops when told, and when the handle is dropped (the sender with it).
        let served = tokio::spawn(server::serve(running, async move {
            let _ = stopped.await;
        }));
        Ok(ConchNode {
            client: LocalClient::new(Arc::clone(&node)),
            node,
            local_addr,
            metrics_addr,
            ui_addr,
            stop: Some(stop),
            served: Some(served),
        })
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.node.id
    }

    /// The address the node serves clients and peers on (the bound port when asked for 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address other nodes and clients reach this node at.
    pub fn advertise(&self) -> &str {
        &self.node.config.advertise
    }

    /// Where `/metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Where the status page (`/ui/`) is served, if it is.
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        self.ui_addr
    }

    /// Re-reads the TLS certificate, key, CA and CRL files now, changed or not (they are also
    /// polled every few seconds). `None` when the node serves no TLS; otherwise whether a new
    /// set is in use, or why the files were refused (the previous set stays). The library
    /// installs no signal handler: a program wires this to SIGHUP itself, as `conchd` does.
    pub fn reload_tls(&self) -> Option<Result<bool, crate::tls::TlsError>> {
        self.node.config.tls.as_ref().map(|tls| tls.reload_now())
    }

    /// The in-process client of this node (cheap to clone).
    pub fn client(&self) -> LocalClient {
        self.client.clone()
    }

    /// The leader's id as this node sees it, if one is known.
    pub fn leader(&self) -> Option<u64> {
        self.node.leader().map(|l| l.id)
    }

    /// True while this node leads.
    pub fn is_leader(&self) -> bool {
        self.node.is_leader()
    }

    /// The node itself, for what the client does not offer (its Raft handle, metrics, state).
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Serves until `shutdown` resolves (or serving fails), then stops as
    /// [`ConchNode::shutdown`] does.
    pub async fn run_until(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), StartError> {
        let Some(mut served) = self.served.take() else {
            return Ok(());
        };
        let result = tokio::select! {
            result = &mut served => result,
            () = shutdown => {
                if let Some(stop) = self.stop.take() {
                    let _ = stop.send(());
                }
                served.await
            }
        };
        result.map_err(|e| StartError::Serve(format!("the serving task failed: {e}")))?
    }

    /// Stops serving (in-flight calls end first), stops Raft and closes the storage: when it
    /// returns, the data directory may be opened again.
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.run_until(std::future::ready(())).await
    }
}

impl Drop for ConchNode {
    fn drop(&mut self) {
        // The serving task sees the sender go and stops by itself; nothing here waits.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The gRPC services of one node, called in this process (see the module docs).
pub type LocalService = Routes;

/// An in-process client of one node: the generated gRPC clients over the node's own service
/// implementations, without a network hop. Cheap to clone; every clone talks to the same node.
#[derive(Clone)]
pub struct LocalClient {
    routes: Routes,
}

impl LocalClient {
    /// The client-facing services of `node`, limited and guarded as on its port.
    pub fn new(node: Arc<Node>) -> LocalClient {
        let routes = api::client_routes(&node).prepare();
        LocalClient { routes }
    }

    /// The services themselves, to build a client of your own on (e.g.
    /// `GrackleApiClient::with_interceptor(client.service(), ...)` adding a bearer token to
    /// every call when access control is on).
    pub fn service(&self) -> LocalService {
        self.routes.clone()
    }

    /// The Grackle semaphore API: namespaces, semaphores, leases, acquire and release.
    pub fn grackle(&self) -> GrackleApiClient<LocalService> {
        GrackleApiClient::new(self.routes.clone())
    }

    /// conch's extensions (waiters, batched calls, cluster status, ...).
    pub fn conch(&self) -> ConchApiClient<LocalService> {
        ConchApiClient::new(self.routes.clone())
    }

    /// Cluster administration (membership, snapshots, backup).
    pub fn admin(&self) -> ConchAdminClient<LocalService> {
        ConchAdminClient::new(self.routes.clone())
    }

    /// Access control: tokens and roles.
    pub fn auth(&self) -> ConchAuthClient<LocalService> {
        ConchAuthClient::new(self.routes.clone())
    }
}

/// Members as [`NodeConfig::initial_cluster`] takes them, from bound listeners in id order
/// (1, 2, ...): a helper for clusters on port 0.
pub fn members_of(listeners: &[std::net::TcpListener]) -> std::io::Result<BTreeMap<u64, String>> {
    listeners
        .iter()
        .zip(1u64..)
        .map(|(l, id)| Ok((id, l.local_addr()?.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::NodeConfig;
    use super::server::{Running, serve, start_with_listener};

    // `server::Running` is tested here, beside the configuration that builds it (the server
    // does not import this module).

    /// Generous: the machine running the tests may be busy.
    const WITHIN: Duration = Duration::from_secs(30);

    async fn started(dir: &std::path::Path) -> Running {
        let (config, listener) = NodeConfig::single("127.0.0.1:0", dir)
            .bind()
            .await
            .expect("bind a free port");
        start_with_listener(Arc::new(config), listener)
            .await
            .expect("start a single node")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_dropped_without_serving_stops_before_its_directory_is_released() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let running = started(dir.path()).await;
        let node = Arc::clone(&running.node);
        let mut raft = node.raft.metrics();
        assert!(node.tasks.running() > 0, "the node's tasks run");

        drop(running);

        // Raft's core ends: the channel its metrics come on closes.
        tokio::time::timeout(WITHIN, async { while raft.changed().await.is_ok() {} })
            .await
            .expect("Raft stopped after the node was dropped");
        // So does every task the node started.
        let deadline = Instant::now() + WITHIN;
        while node.tasks.running() > 0 {
            assert!(
                Instant::now() < deadline,
                "{} task(s) still run",
                node.tasks.running()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // And the directory's lock was let go: the same directory opens again.
        let deadline = Instant::now() + WITHIN;
        let again = loop {
            let (config, listener) = NodeConfig::single("127.0.0.1:0", dir.path())
                .bind()
                .await
                .expect("bind a free port");
            match start_with_listener(Arc::new(config), listener).await {
                Ok(running) => break running,
                Err(e) => assert!(Instant::now() < deadline, "reopen: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        serve(again, std::future::ready(()))
            .await
            .expect("the reopened node serves and stops");
    }
}

#[cfg(test)]
mod upgrade_tests;

//! Starting and stopping a node: bind, open storage, start Raft, bootstrap once, serve.
//!
//! Order matters:
//! 1. bind the listener first, so a taken port fails before anything touches the disk;
//! 2. open the data directory (see `data_dir.rs`): lock it first, then check it belongs to this
//!    node and cluster; the lock is held until [`serve`] returns (or the start fails);
//! 3. open the log store, then restore the newest snapshot into the applied state; refuse a
//!    directory whose latest membership leaves this node out (`DataDir::check_members`);
//! 4. start Raft (it replays committed entries after the snapshot);
//! 5. bootstrap only an empty node, only the lowest id of `--initial-cluster`, never with
//!    `--join` (that node waits to be added); every node started with
//!    `--bootstrap-admin-token-file` then sees that the admin token is installed (whoever
//!    proposes it first; the state takes it once), and answers no client call until it is;
//! 6. serve until shutdown (or until this node is removed from the cluster, see `removal.rs`),
//!    then stop Raft and flush.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, ServerState, SnapshotPolicy};

use crate::api;
use crate::config::Config;
use crate::data_dir::identity::ClusterId;
use crate::data_dir::{DataDir, DataDirError};
use crate::jobs::expiry;
use crate::net::transport::Listener;
use crate::node::Node;
use crate::raft::applied::AppliedState;
use crate::raft::early::EarlyReplication;
use crate::raft::log_store::LogStore;
use crate::raft::network::{PeerDialer, PeerNetwork};
use crate::raft::state_machine::StateMachine;
use crate::raft::{Raft, TypeConfig};
use crate::state::State;
use crate::support::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("listen on {addr}: {}", describe_bind_error(.error, "--listen"))]
    Bind {
        addr: String,
        // Not named `source`: the message says it already, once.
        error: std::io::Error,
    },
    #[error("peers: listen on {addr}: {}", describe_bind_error(.error, "--peer-listen"))]
    BindPeer { addr: String, error: std::io::Error },
    #[error("metrics: listen on {addr}: {}", describe_bind_error(.error, "--metrics-listen (or off)"))]
    BindMetrics { addr: String, error: std::io::Error },
    #[error("status page: listen on {addr}: {}", describe_bind_error(.error, "--ui-listen (or off)"))]
    BindUi { addr: String, error: std::io::Error },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error(transparent)]
    LogStore(#[from] crate::raft::log_store::OpenError),
    #[error(transparent)]
    StateMachine(#[from] crate::raft::state_machine::OpenError),
    #[error("raft configuration: {0}")]
    RaftConfig(String),
    #[error("start raft: {0}")]
    Raft(String),
    #[error("serve: {0}")]
    Serve(String),
    #[error("cluster id: {0}")]
    Identity(#[from] crate::data_dir::identity::IdentityError),
}

impl StartError {
    /// A refusal only the operator can resolve: `conchd` exits 64 on it (see `main.rs`).
    pub fn is_usage(&self) -> bool {
        matches!(self, StartError::DataDir(e) if e.is_usage())
    }

    /// The data directory belongs to a node removed from its cluster (see `removal.rs`).
    pub fn is_removed(&self) -> bool {
        matches!(self, StartError::DataDir(DataDirError::Removed { .. }))
    }
}

/// A node that has bound its port, opened its data directory and started Raft and its tasks.
///
/// Hand it to [`serve`], which serves until told to stop, then stops Raft and the node's tasks
/// and releases the data directory. Dropping it without serving stops the node too, in the
/// background on the current tokio runtime: Raft first, then every task the node started, and
/// only then is the data directory's lock released (so another start on the same directory
/// waits for the lock rather than writing beside a node that still runs).
#[must_use = "the node runs until it is stopped: pass it to `server::serve` (dropping it stops the node)"]
pub struct Running {
    pub node: Arc<Node>,
    /// Taken by [`serve`].
    listener: Option<Listener>,
    /// The peer service's own port (`--peer-listen`), if it has one.
    peer_listener: Option<tokio::net::TcpListener>,
    metrics_addr: Option<std::net::SocketAddr>,
    ui_addr: Option<std::net::SocketAddr>,
    /// Holds the data directory's lock until Raft has stopped: taken by [`serve`], or by the
    /// stop that [`Drop`] starts.
    data_dir: Option<DataDir>,
}

impl Running {
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self.listener.as_ref()? {
            Listener::Tcp(listener) => listener.local_addr().ok(),
            Listener::Incoming(_) => None,
        }
    }

    /// Where the peer service listens, when on a port of its own.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.peer_listener.as_ref()?.local_addr().ok()
    }

    /// Where `/metrics` is served, if anywhere.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Where the status page is served, if anywhere.
    pub fn ui_addr(&self) -> Option<std::net::SocketAddr> {
        self.ui_addr
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Served: `serve` stops the node itself.
        let Some(data_dir) = self.data_dir.take() else {
            return;
        };
        let node = Arc::clone(&self.node);
        let stop = async move {
            stop_node(&node).await;
            drop(data_dir);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(stop);
            }
            // Dropped outside any runtime: stop it on a thread of its own (Raft's handle and the
            // tasks' tracker are awaited from any runtime).
            Err(_) => {
                let stopped =
                    std::thread::Builder::new()
                        .name("conch-stop".into())
                        .spawn(move || {
                            match tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                            {
                                Ok(runtime) => runtime.block_on(stop),
                                Err(e) => {
                                    tracing::warn!(error = %e, "stop a dropped node: no runtime")
                                }
                            }
                        });
                if let Err(e) = stopped {
                    tracing::warn!(error = %e, "stop a dropped node: no thread");
                }
            }
        }
    }
}

/// Stops Raft, then every task the node started, and waits for them: nothing the node started
/// outlives this.
async fn stop_node(node: &Node) {
    if let Err(e) = node.raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    node.tasks.stop().await;
}

pub fn raft_config(config: &Config) -> Result<Arc<openraft::Config>, StartError> {
    let election_ms = config.election_timeout.as_millis() as u64;
    let raft_config = openraft::Config {
        cluster_name: "conch".into(),
        heartbeat_interval: config.heartbeat.as_millis() as u64,
        election_timeout_min: election_ms,
        election_timeout_max: election_ms * 2,
        install_snapshot_timeout: 10_000,
        max_payload_entries: 300,
        snapshot_max_chunk_size: 3 * 1024 * 1024,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
        replication_lag_threshold: config.snapshot_every * 2,
        // Keep at most one snapshot interval of log behind a snapshot: a node further behind
        // catches up from the snapshot.
        max_in_snapshot_log_to_keep: config.snapshot_every.min(1_000),
        purge_batch_size: config.snapshot_every.min(256),
        ..Default::default()
    };
    raft_config
        .validate()
        .map(Arc::new)
        .map_err(|e| StartError::RaftConfig(e.to_string()))
}

/// What to tell an operator whose port could not be bound.
fn describe_bind_error(e: &std::io::Error, flag: &str) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            format!(
                "the address is already in use (another conchd or another program listens \
                 there; stop it or choose another {flag})"
            )
        }
        std::io::ErrorKind::AddrNotAvailable => {
            format!("no interface of this machine has that address (check {flag})")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("permission denied (ports below 1024 need privileges; choose another {flag})")
        }
        _ => e.to_string(),
    }
}

/// Binds the port, opens the data directory and starts Raft and the node's tasks.
pub async fn start(config: Arc<Config>) -> Result<Running, StartError> {
    let listener = bind(&config).await?;
    start_with_listener(config, listener).await
}

/// Binds the client port `config.listen`.
pub(crate) async fn bind(config: &Config) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|error| StartError::Bind {
            addr: config.listen.to_string(),
            error,
        })
}

/// [`start`] on a port the caller has already bound (`config.listen` is then only what the
/// node says it listens on): lets an embedding program pick port 0 and learn every node's
/// address before any node starts.
pub async fn start_with_listener(
    config: Arc<Config>,
    listener: tokio::net::TcpListener,
) -> Result<Running, StartError> {
    start_with_listeners(config, listener, None, None).await
}

/// [`start`] serving the connections `incoming` hands over instead of a port, for a program
/// that carries the nodes' traffic itself (see `transport.rs`; `config.dial` then says how this
/// node reaches the others). There is no separate peer port, metrics port or status page.
pub async fn start_with_incoming(
    config: Arc<Config>,
    incoming: crate::net::transport::Incoming,
) -> Result<Running, StartError> {
    start_on(config, Listener::Incoming(incoming), None, None).await
}

/// [`start_with_listener`], also with the peer and metrics ports already bound when given
/// (sockets a service manager passed, see `listen_fds.rs`); those not given are bound at
/// `config.peer_listen` and `config.metrics_listen`.
pub async fn start_with_listeners(
    config: Arc<Config>,
    listener: tokio::net::TcpListener,
    peer: Option<tokio::net::TcpListener>,
    metrics: Option<tokio::net::TcpListener>,
) -> Result<Running, StartError> {
    start_on(config, Listener::Tcp(listener), peer, metrics).await
}

async fn start_on(
    config: Arc<Config>,
    listener: Listener,
    peer: Option<tokio::net::TcpListener>,
    metrics: Option<tokio::net::TcpListener>,
) -> Result<Running, StartError> {
    let peer_listener = match (peer, config.peer_listen) {
        (Some(listener), _) => Some(listener),
        (None, Some(addr)) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|error| {
            StartError::BindPeer {
                addr: addr.to_string(),
                error,
            }
        })?),
        (None, None) => None,
    };
    let metrics_listener = match (metrics, config.metrics_listen) {
        (Some(listener), _) => Some(listener),
        (None, Some(addr)) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|error| {
            StartError::BindMetrics {
                addr: addr.to_string(),
                error,
            }
        })?),
        (None, None) => None,
    };
    let ui_listener =
        match config.ui_listen {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|error| {
                StartError::BindUi {
                    addr: addr.to_string(),
                    error,
                }
            })?),
            None => None,
        };
    let data_dir = DataDir::open(
        &config.data_dir,
        config.id,
        config.cluster_name.as_deref(),
        config.adopt_data_dir,
    )?;

    if config.tls.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!(
            listen = %config.listen,
            "serving plaintext on a non-loopback address: anyone who can reach it can use the \
             cluster; set --tls-cert/--tls-key (and --client-ca, --peer-ca)"
        );
    }
    let peers_reach = config.peer_listen.unwrap_or(config.listen);
    if !config.peers_authenticate() && !peers_reach.ip().is_loopback() {
        tracing::warn!(
            listen = %peers_reach,
            "peers do not authenticate (no --peer-secret-file or --peer-ca): anyone who reaches \
             the peer service can change the cluster's state, and access control cannot be \
             turned on"
        );
    }
    let cluster_id =
        Arc::new(ClusterId::open(&config.data_dir)?.with_name(data_dir.cluster_name()));
    let metrics = Arc::new(Metrics::speaking(config.cluster_version_max));
    // sled locks its own file too: another process holding it (e.g. a conchd from before the
    // LOCK file) is said the same way.
    let mut log_store = LogStore::open(&config.data_dir).map_err(|e| match e.is_locked() {
        true => StartError::from(crate::data_dir::in_use(&config.data_dir)),
        false => StartError::from(e),
    })?;
    log_store.set_metrics(metrics.log.clone());
    let early = EarlyReplication::new(config.id, config.early_replication);
    log_store.set_early_replication(Arc::clone(&early));
    log_store.speak_at_most(config.cluster_version_max)?;
    let applied = AppliedState::with_metrics(State::new(), 0, metrics.apply.clone());
    let mut state_machine = StateMachine::open(&config.data_dir, Arc::clone(&applied))?;
    state_machine.set_metrics(metrics.snapshots.clone());
    log_store.check_snapshot_covers_purged(state_machine.last_applied())?;
    // The membership openraft will start from: the latest in the log, else the snapshot's.
    let membership =
        openraft::StorageHelper::<TypeConfig, _, _>::new(&mut log_store, &mut state_machine)
            .get_membership()
            .await
            .map_err(|e| StartError::Raft(format!("read the membership: {e}")))?;
    let effective = membership.effective();
    data_dir.check_members(effective.log_id().is_some().then(|| effective.membership()))?;
    // The last entry of the log at start: see `Node::read_index_as_leader`.
    let log_at_start = openraft::storage::RaftLogStorage::get_log_state(&mut log_store)
        .await
        .map_err(|e| StartError::Raft(format!("read the log's last entry: {e}")))?
        .last_log_id
        .map_or(0, |id| id.index);
    let network = PeerNetwork::new(
        Duration::from_millis(500),
        Arc::new(config.peer_routes.clone()),
        PeerDialer::of(&config, Arc::clone(&cluster_id)),
        Arc::clone(&metrics.trace),
    );
    let raft = Raft::new(
        config.id,
        raft_config(&config)?,
        network.clone(),
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| StartError::Raft(e.to_string()))?;

    crate::raft::early::campaign_after_restart(&raft, &early).await;

    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    let bootstrapper = config.initial_cluster.keys().next() == Some(&config.id);
    let bootstraps = !initialized && bootstrapper && !config.join;
    if !initialized && config.join {
        tracing::info!(
            "empty data directory and --join: not bootstrapping; waiting to be added with \
             `conch cluster add-learner {} {}`",
            config.id,
            config.advertise
        );
    }
    // The cluster version a new cluster this node bootstraps (or bootstrapped, and has not
    // raised yet) is to run at: recorded before bootstrapping, so that a restart carries on.
    let mut new_cluster = crate::api::upgrade::new_cluster_version(&config.data_dir)?;
    if bootstraps {
        new_cluster = (config.cluster_version_max > crate::state::version::BASE)
            .then_some(config.cluster_version_max);
        match new_cluster {
            Some(version) => crate::api::upgrade::record_new_cluster(&config.data_dir, version)?,
            None => crate::api::upgrade::forget_new_cluster(&config.data_dir),
        }
        let members: BTreeMap<u64, BasicNode> = config
            .initial_cluster
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        let id = cluster_id.create()?;
        tracing::info!(members = ?config.initial_cluster, cluster_id = %id, "bootstrapping a new cluster");
        if let Err(e) = raft.initialize(members).await {
            // Another start may have initialized it already; anything else is fatal.
            if !matches!(
                e,
                openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(
                    _
                ))
            ) {
                return Err(StartError::Raft(format!("initialize cluster: {e}")));
            }
        }
    }

    let node = Node::start(
        Arc::clone(&config),
        raft,
        applied,
        cluster_id,
        Arc::clone(&metrics),
        log_at_start,
    );
    node.tasks
        .spawn(early.run(network, node.raft.server_metrics()));
    let metrics_addr = match metrics_listener {
        Some(listener) => {
            let addr = listener.local_addr().ok();
            metrics.register_process();
            node.tasks
                .spawn(crate::http::metrics::serve(Arc::clone(&node), listener));
            addr
        }
        None => None,
    };
    let ui_addr = match ui_listener {
        Some(listener) => {
            let addr = listener.local_addr().ok();
            node.tasks
                .spawn(crate::http::ui::serve(Arc::clone(&node), listener));
            addr
        }
        None => None,
    };
    if let Some(tls) = &config.tls {
        node.tasks.spawn(crate::tls::watch(Arc::clone(tls)));
    }
    if let Some(version) = new_cluster {
        node.tasks.spawn(crate::api::upgrade::finalize_new_cluster(
            Arc::clone(&node),
            version,
        ));
    }
    node.tasks.spawn(expiry::run(Arc::clone(&node)));
    node.tasks.spawn(log_leader_changes(Arc::clone(&node)));
    node.tasks
        .spawn(crate::jobs::retire::watch(Arc::clone(&node)));
    if let Some(hash) = config.bootstrap_admin_token {
        node.tasks
            .spawn(api::auth::bootstrap(Arc::clone(&node), hash));
    }
    Ok(Running {
        node,
        listener: Some(listener),
        peer_listener,
        metrics_addr,
        ui_addr,
        data_dir: Some(data_dir),
    })
}

/// Logs every change of leader or term as this node sees it.
async fn log_leader_changes(node: Arc<Node>) {
    // Woken by the server metrics, which change only with the role, vote or membership (the
    // full metrics change at every step of every write); by the full metrics only while this
    // node leads and waits for a quorum to confirm it.
    // The leader and term are read from the server metrics themselves: openraft sends them
    // before the full metrics in each report, so the full metrics read right after a wake-up
    // may not carry the change yet. Only this node's own quorum acknowledgement, which the
    // server metrics lack, is read from the full metrics.
    let mut server = node.raft.server_metrics();
    let mut metrics = node.raft.metrics();
    let mut seen = (None, 0);
    loop {
        let (leader, term, leading) = {
            let s = server.borrow_and_update();
            let leading = s.current_leader == Some(node.id) && s.state == ServerState::Leader;
            (s.current_leader, s.vote.leader_id().term, leading)
        };
        let acked = metrics
            .borrow_and_update()
            .millis_since_quorum_ack
            .is_some();
        let known = match leader {
            Some(id) if id == node.id && !(leading && acked) => None,
            other => other,
        };
        let now = (known, term);
        let confirming = leading && known.is_none();
        if now != seen {
            match now.0 {
                Some(leader) => {
                    if seen.0 != Some(leader) {
                        node.metrics.leader_changes.inc();
                    }
                    tracing::info!(leader, term = now.1, "leader elected")
                }
                None => tracing::info!(term = now.1, "no leader"),
            }
            seen = now;
        }
        let closed = if confirming {
            metrics.changed().await.is_err()
        } else {
            server.changed().await.is_err()
        };
        if closed {
            return;
        }
    }
}

/// Serves until `shutdown` resolves, then stops Raft and the node's tasks, and releases the data
/// directory.
pub async fn serve(
    mut running: Running,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let node = Arc::clone(&running.node);
    let listener = running.listener.take();
    let peer_listener = running.peer_listener.take();
    let data_dir = running.data_dir.take();
    // Nothing left for its `Drop` to stop: this stops the node below.
    drop(running);
    let served = match listener {
        Some(listener) => api::serve(Arc::clone(&node), listener, peer_listener, shutdown)
            .await
            .map_err(|e| StartError::Serve(e.to_string())),
        None => Err(StartError::Serve("the node was served already".into())),
    };
    // Every task the node started ends before this returns: nothing it started outlives it.
    stop_node(&node).await;
    drop(data_dir);
    served
}

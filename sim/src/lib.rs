//! A cluster in a bottle: conch nodes, their clients and the network between them in one
//! thread, on simulated time, every choice drawn from one seed.
//!
//! What runs is the real node: [`conchd::server::start_with_incoming`] starts the same storage
//! (log store, snapshots, sled, in a scratch directory), the same openraft core, the same
//! request paths (batching, forwarding to the leader, read index, expiry, waits,
//! exactly-once) and the same gRPC services as `conchd`. What is simulated is everything a node
//! cannot choose:
//!
//! - **the network**: every connection, between nodes and from clients, is a `turmoil` TCP
//!   stream; faults partition nodes (both ways or one way), hold a node's messages, and change
//!   message latency;
//! - **time**: every host runs on a paused tokio clock that the simulation advances one tick at
//!   a time, so timeouts, leases and elections happen in simulated time; the wall clock a node
//!   reads ([`conchd::support::clock::set_wall_clock`]) is simulated too;
//! - **chance**: tokio's scheduler choices (`select!`), Raft's election timeouts, back-off
//!   jitter and lease ids all draw from the seed ([`conchd::sim_hooks::entropy`]);
//! - **crashes**: a crash drops a node's whole runtime wherever its tasks were waiting; a
//!   restart opens its data directory again, as after `kill -9`;
//! - **disks** ([`conchd::sim_hooks::disk_faults`]): a crash loses sled values the node had not
//!   flushed, a power loss also loses or tears writes it had not synced; a node's log syncs fail
//!   (`EIO` or `ENOSPC`), and the node stops as `conchd` exits on a storage failure, and starts
//!   again once the disk works; syncs can be slow;
//! - **wall clocks** (`clocks.rs`): stepped on every node or on one, or drifting on one;
//! - **membership** (`operator.rs`): a node is removed, then wiped and added back;
//! - **version skew** ([`Skew`]): one node starts as a node of the previous release would
//!   (speaking cluster version 1 only) in a cluster not yet finalized; mid-run the operator
//!   checks that finalizing is refused, upgrades the node (restarts it on its data speaking
//!   this build's newest version) and finalizes. No node may apply a cluster version the
//!   previous release's node does not speak while it is a member.
//!
//! The workload is the one the Jepsen-style run uses (`cluster_tests::jepsen`), and so is its
//! checker; at the end every node must agree on one applied index and state hash. The same
//! seed gives the same execution: [`SeedReport::history_hash`] is a hash of every operation
//! with its simulated times and every fault.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use cluster_tests::jepsen::checker::{self, CheckConfig};
use cluster_tests::jepsen::history::{CHECKER_PROCESS, History};
use cluster_tests::jepsen::locks::{self, LockWorkload};
use cluster_tests::jepsen::run;
use cluster_tests::jepsen::sync_workload::SyncWorkload;
use cluster_tests::jepsen::workload::{MAX_WAIT_MS, Shared, Workload, WorkloadConfig};
use cluster_tests::net::{NodeChannel, ProcessToken};
use conch_proto::conch::ClusterStatusRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conchd::net::transport::{Accepted, Conn, Dial};
pub use conchd::sim_hooks::regressions::Bug;
use sha2::{Digest, Sha256};
use tonic::transport::Endpoint;

mod clocks;
mod faults;
mod operator;

pub use faults::{Fault, FaultPlan, Kind, Kinds, Mix};

/// How long each wait group and barrier lane pauses between rounds.
const SYNC_PAUSE: Duration = Duration::from_millis(250);
/// Lock clients beside the semaphore clients.
const LOCK_CLIENTS: usize = 2;
/// The port every simulated node serves on.
const PORT: u16 = 7001;
/// The simulated wall clock starts here (2026-01-01T00:00:00Z), not at the host's time.
const EPOCH_SECS: u64 = 1_767_225_600;

/// What one seed runs.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    /// 3 or 5.
    pub nodes: u64,
    /// Simulated time the workload runs (faults stop after it; the checks follow).
    pub duration: Duration,
    /// Semaphore clients (the lock clients, and the wait group and barrier rounds, run beside
    /// them).
    pub clients: usize,
    /// Inject faults (off: a quiet run, for comparing against).
    pub faults: bool,
    /// Run the lock clients beside the semaphore clients.
    pub locks: bool,
    /// Run the wait group and barrier rounds beside them.
    pub sync: bool,
    /// Print every event (node logs at INFO and above, faults) with its simulated time.
    pub trace: bool,
    /// A bug conch once had, put back into the nodes for this run (see
    /// `conchd::sim_hooks::regressions`).
    pub bug: Option<Bug>,
    /// Which faults the seed draws from.
    pub mix: Mix,
    /// Of the full mix's faults, the kinds the seed keeps (all by default).
    pub only: Kinds,
    /// Version skew on or off; `None`: the seed decides (see [`Skew`]).
    pub skew: Option<bool>,
}

/// Where the stream that decides a seed's version skew sits among the seed's streams.
const SKEW_STREAM: u64 = u64::MAX - 9;

/// Under the full mix, one seed in this many runs with version skew unless told.
pub const SKEW_ONE_IN: u64 = 4;

/// A seed's version skew: node `node` starts speaking the previous release's cluster version
/// only (1), so the new cluster stays at that version; at `upgrade_at` the operator checks
/// that finalizing is refused, restarts the node on its data speaking this build's newest
/// version, and finalizes. Drawn from the seed (one full-mix seed in [`SKEW_ONE_IN`]), so a
/// printed seed replays with the same skew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skew {
    pub node: u64,
    pub upgrade_at: Duration,
}

impl SimOptions {
    /// This seed's version skew, if it runs with one.
    pub fn version_skew(&self) -> Option<Skew> {
        let mut rng = cluster_tests::rng::Rng::derive(self.seed, SKEW_STREAM);
        let drawn = rng.below(SKEW_ONE_IN) == 0 && self.mix == Mix::Full;
        if !self.skew.unwrap_or(drawn) {
            return None;
        }
        let node = 1 + rng.below(self.nodes);
        // Between 30 % and 60 % of the run: faults before and after it.
        let ms = self.duration.as_millis() as u64;
        let upgrade_at = Duration::from_millis(ms * 3 / 10 + rng.below(ms * 3 / 10 + 1));
        Some(Skew { node, upgrade_at })
    }
}

impl SimOptions {
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            nodes: 3,
            duration: Duration::from_secs(30),
            clients: 4,
            faults: true,
            locks: true,
            sync: true,
            trace: false,
            bug: None,
            mix: Mix::Full,
            only: Kinds::ALL,
            skew: None,
        }
    }

    /// The `conch-sim` arguments that run exactly this seed.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--seed".to_string(),
            self.seed.to_string(),
            "--nodes".into(),
            self.nodes.to_string(),
            "--duration".into(),
            format!("{}ms", self.duration.as_millis()),
            "--clients".into(),
            self.clients.to_string(),
        ];
        for (off, flag) in [
            (!self.faults, "--no-faults"),
            (!self.locks, "--no-locks"),
            (!self.sync, "--no-sync"),
        ] {
            if off {
                args.push(flag.into());
            }
        }
        if let Some(bug) = self.bug {
            args.extend(["--bug".to_string(), bug.name().to_string()]);
        }
        if self.mix != Mix::Full {
            args.extend(["--fault-mix".to_string(), self.mix.number().to_string()]);
        }
        if !self.only.is_all() {
            args.extend(["--only-faults".to_string(), self.only.names()]);
        }
        if let Some(on) = self.skew {
            args.extend(["--skew".to_string(), if on { "on" } else { "off" }.into()]);
        }
        args
    }

    /// The command that replays this seed, in the build profile this binary was built in: the
    /// debug and the release build schedule conch's tasks differently (their code runs at
    /// different speeds against the simulated clock's ticks), so a seed found by the debug
    /// build (`make test`) may pass in the release build (`make sim`), and the other way round.
    pub fn replay_command(&self) -> String {
        let profile = if cfg!(debug_assertions) {
            ""
        } else {
            " --release"
        };
        format!(
            "cargo run{profile} -p conch-sim -- {}",
            self.args().join(" ")
        )
    }
}

/// What one seed found.
#[derive(Clone, Debug)]
pub struct SeedReport {
    pub seed: u64,
    /// Each violation of the checker, the drain or the agreement, said in full.
    pub violations: Vec<String>,
    /// SHA-256 of every operation (kind, node, outcome, simulated times) and every fault.
    pub history_hash: String,
    pub ops: usize,
    /// The faults injected, in order, with their simulated times.
    pub faults: Vec<String>,
    /// Simulated time from the start to the last check.
    pub simulated: Duration,
    /// Semaphore and lock grants acknowledged `ACQUIRED` in the history.
    pub grants: usize,
    /// Wait group and barrier rounds completed.
    pub sync_rounds: usize,
    /// Every operation, one line each, in the order they were invoked.
    pub history: Vec<String>,
    /// With version skew, what the operator did for the upgrade, with simulated times.
    pub upgrade: Vec<String>,
}

impl SeedReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

fn node_ip(id: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, id as u8))
}

fn client_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1))
}

/// The operator's host (membership changes).
fn operator_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 2, 1))
}

fn node_addr(id: u64) -> String {
    format!("{}:{PORT}", node_ip(id))
}

thread_local! {
    /// Misrouted addresses (see [`Fault::Misroute`]): (dialing node, address dialed) → the
    /// address reached instead.
    static MISROUTES: std::cell::RefCell<std::collections::BTreeMap<(u64, String), String>> =
        const { std::cell::RefCell::new(std::collections::BTreeMap::new()) };
}

/// Connections from node `from` (0: a client) through the simulated network.
fn dial(from: u64) -> Dial {
    Dial::new(move |addr| {
        let addr = MISROUTES
            .with(|m| m.borrow().get(&(from, addr.clone())).cloned())
            .unwrap_or(addr);
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(addr).await?;
            Ok(Box::new(stream) as Box<dyn Conn>)
        })
    })
}

/// From now on node `from`'s connections to node `to` reach node `instead` (`None`: node `to`
/// again).
fn misroute(from: u64, to: u64, instead: Option<u64>) {
    MISROUTES.with(|m| {
        let mut m = m.borrow_mut();
        match instead {
            Some(instead) => m.insert((from, node_addr(to)), node_addr(instead)),
            None => m.remove(&(from, node_addr(to))),
        }
    });
}

/// A client channel to node `id` over the simulated network.
fn channel_to(id: u64) -> anyhow::Result<NodeChannel> {
    let dial = dial(0);
    let connector = tower::service_fn(move |uri: tonic::transport::Uri| {
        let dial = dial.clone();
        async move {
            let addr = uri
                .authority()
                .map(|a| a.to_string())
                .ok_or_else(|| std::io::Error::other("no host:port to dial"))?;
            dial.connect(addr).await.map(hyper_util::rt::TokioIo::new)
        }
    });
    let channel = Endpoint::from_shared(format!("http://{}", node_addr(id)))?
        .connect_timeout(Duration::from_secs(1))
        .connect_with_connector_lazy(connector);
    Ok(NodeChannel::new(channel, ProcessToken))
}

/// How long a restart waits, in real time, for the data directory of the node's previous run
/// to be let go.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// One node's software: start it on its data directory and serve until the simulation crashes
/// it (a restart runs this again on the same directory).
///
/// A crash drops the node's runtime at once, but sled's own thread lets go of the directory a
/// moment of real time later; the restart waits for that in real time (no simulated time
/// passes meanwhile, so the run stays the seed's).
async fn run_node(id: u64, nodes: u64, dir: PathBuf) -> anyhow::Result<()> {
    let waited = std::time::Instant::now();
    loop {
        match start_node(id, nodes, &dir).await {
            Err(e)
                if format!("{e:#}").contains("in use by another process")
                    && waited.elapsed() < RELEASE_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            other => return other,
        }
    }
}

async fn start_node(id: u64, nodes: u64, dir: &Path) -> anyhow::Result<()> {
    clocks::register_this_runtime(id);
    let mut config = conchd::NodeConfig::new(id, node_addr(id), dir);
    if operator::joins(id) {
        config = config.join();
    }
    if let Some(version) = operator::cluster_version_max(id) {
        config = config.cluster_version_max(version);
    }
    let config = config
        .initial_cluster((1..=nodes).map(|n| (n, node_addr(n))))
        .heartbeat(Duration::from_millis(100))
        .election_timeout(Duration::from_millis(500))
        .snapshot_every(500)
        .into_config(dial(id))
        .context("node configuration")?;
    let listener = turmoil::net::TcpListener::bind((IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT))
        .await
        .context("listen")?;
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, remote)| Accepted {
            local: stream.local_addr().ok(),
            remote: Some(remote),
            io: Box::new(stream),
        });
        Some((accepted, listener))
    });
    let running =
        match conchd::server::start_with_incoming(Arc::new(config), Box::pin(incoming)).await {
            Ok(running) => running,
            // A removed node refuses to start, as `conchd` does; it stays down until the
            // operator wipes it.
            Err(e) if e.is_removed() => {
                tracing::warn!("{e}");
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("start node {id}")),
        };
    // As `conchd` exits on a storage failure, the node stops; the fault's heal starts it again.
    let failed = conchd::raft::storage_fault::failed(id, running.node.raft.clone());
    let stop = async move {
        let said = failed.await;
        tracing::warn!("{said}");
    };
    conchd::server::serve(running, stop)
        .await
        .with_context(|| format!("node {id} stopped serving"))
}

/// Node `id`'s data directory under the run's scratch directory.
fn node_dir(scratch: &Path, id: u64) -> PathBuf {
    scratch.join(format!("n{id}"))
}

/// A scratch directory for the nodes' data: in memory (`/dev/shm`) where there is one, so a
/// sync costs nothing real.
fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("conch-sim-");
        b
    };
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return Ok(dir);
    }
    builder.tempdir()
}

/// Tokio numbers every task from one counter per process, and a dropped runtime (a crash, a
/// bounce) shuts its tasks down list by list, each task's list chosen by its number modulo a
/// small power of two. Which connection of a crashed node closes first, and so what its peers
/// see first, would then depend on how many tasks earlier seeds in this process spawned. Each
/// seed starts the count at a multiple of [`TASK_ID_ALIGN`], so a seed replays alone as it ran
/// in a batch. (One seed at a time per process: seeds run on threads side by side would share
/// the counter.)
fn align_task_ids() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("a runtime to align task ids")?;
    for _ in 0..TASK_ID_ALIGN {
        let id: u64 = rt
            .spawn(async {})
            .id()
            .to_string()
            .parse()
            .context("a tokio task id is a number")?;
        if id % TASK_ID_ALIGN == TASK_ID_ALIGN - 1 {
            return Ok(());
        }
    }
    anyhow::bail!("tokio task ids did not reach a multiple of {TASK_ID_ALIGN}")
}

/// A multiple of the number of task lists a current-thread runtime keeps (4 in tokio 1.x).
const TASK_ID_ALIGN: u64 = 64;

/// Runs one seed to the end and checks it.
pub fn run_seed(opts: &SimOptions) -> anyhow::Result<SeedReport> {
    anyhow::ensure!(
        opts.nodes == 3 || opts.nodes == 5,
        "--nodes must be 3 or 5, not {}",
        opts.nodes
    );
    align_task_ids()?;
    conchd::support::clock::set_wall_clock(clocks::wall_clock);
    conchd::sim_hooks::entropy::seed_thread(opts.seed);
    conchd::sim_hooks::blocking::run_inline_on_this_thread(true);
    conchd::sim_hooks::regressions::reintroduce_on_this_thread(opts.bug);
    conchd::support::self_check::check_on_this_thread();
    clocks::reset();
    operator::reset();
    let skew = opts.version_skew();
    if let Some(skew) = skew {
        operator::cap(skew.node);
    }
    MISROUTES.with(|m| m.borrow_mut().clear());
    let scratch = scratch_dir().context("create a scratch directory for the nodes' data")?;
    if opts.mix == Mix::Full {
        conchd::sim_hooks::disk_faults::track_unsynced_under(scratch.path());
    }
    let mut result = run_in(opts, scratch.path());
    conchd::sim_hooks::disk_faults::stop_tracking();
    let broken = conchd::support::self_check::take_found();
    let (upgrade, upgrade_violations) = operator::take_upgrade_report();
    if let Ok(report) = &mut result {
        report.violations.extend(
            broken
                .into_iter()
                .map(|b| format!("VIOLATION [invariants] {b}")),
        );
        report.violations.extend(upgrade_violations);
        report.upgrade = upgrade;
    }
    conchd::sim_hooks::entropy::unseed_thread();
    conchd::sim_hooks::blocking::run_inline_on_this_thread(false);
    conchd::sim_hooks::regressions::reintroduce_on_this_thread(None);
    result
}

/// Runs seeds `first`, `first + 1`, … (at most `max` of them) until one fails: that seed and
/// its report, or `None` when all passed.
pub fn first_failing_seed(
    template: &SimOptions,
    first: u64,
    max: u64,
) -> anyhow::Result<Option<SeedReport>> {
    for i in 0..max {
        let opts = SimOptions {
            seed: first.wrapping_add(i),
            ..template.clone()
        };
        let report = run_seed(&opts)?;
        if !report.passed() {
            return Ok(Some(report));
        }
    }
    Ok(None)
}

fn run_in(opts: &SimOptions, scratch: &Path) -> anyhow::Result<SeedReport> {
    let mut plan = FaultPlan::new(
        opts.seed,
        opts.nodes,
        opts.duration,
        opts.faults,
        opts.mix,
        opts.only,
    );
    let mut sim = turmoil::Builder::new()
        .rng_seed(opts.seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(opts.duration + Duration::from_secs(120))
        .min_message_latency(Duration::from_micros(100))
        .max_message_latency(plan.max_latency())
        .enable_random_order()
        .build();
    for id in 1..=opts.nodes {
        let dir = node_dir(scratch, id);
        let nodes = opts.nodes;
        sim.host(node_ip(id), move || {
            let dir = dir.clone();
            async move {
                run_node(id, nodes, dir)
                    .await
                    .map_err(|e| format!("{e:#}").into())
            }
        });
    }
    let outcome = Arc::new(Mutex::new(None));
    {
        let outcome = Arc::clone(&outcome);
        let opts = opts.clone();
        sim.client(client_ip(), async move {
            let found = drive_workload(&opts).await;
            operator::finish();
            *outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(found);
            Ok(())
        });
    }
    let skew = opts.version_skew();
    let mut upgrade_asked = false;
    if opts.mix == Mix::Full || skew.is_some() {
        let nodes = opts.nodes;
        sim.client(operator_ip(), async move {
            operator::run(nodes)
                .await
                .map_err(|e| format!("{e:#}").into())
        });
    }
    let mut faults = Vec::new();
    loop {
        let finished = sim.step().map_err(|e| anyhow::anyhow!("simulation: {e}"))?;
        if finished {
            break;
        }
        let now = sim.elapsed();
        if let Some(skew) = skew
            && !upgrade_asked
            && now >= skew.upgrade_at
        {
            operator::upgrade(skew.node);
            upgrade_asked = true;
        }
        if let Some(node) = operator::take_restart() {
            // The operator upgrades a node: its process stops and the new one starts on the
            // same directory.
            sim.bounce(node_ip(node));
            if opts.trace {
                println!(
                    "fault {:>9.3}s n{node} restarted speaking the newest cluster version",
                    now.as_secs_f64()
                );
            }
        }
        if let Some(node) = operator::take_wipe() {
            // The operator replaces a removed node: stopped, its directory wiped, started empty.
            sim.crash(node_ip(node));
            let dir = node_dir(scratch, node);
            conchd::sim_hooks::disk_faults::forget_under(&dir);
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("wipe n{node}'s data directory {}", dir.display()))?;
            operator::mark_joining(node);
            sim.bounce(node_ip(node));
            if opts.trace {
                println!(
                    "fault {:>9.3}s n{node} wiped and started empty",
                    now.as_secs_f64()
                );
            }
        }
        for event in plan.due(now) {
            let said = format!("{:>9.3}s {event}", now.as_secs_f64());
            if opts.trace {
                println!("fault {said}");
            }
            let lost = plan.apply(&event, &mut sim, scratch, now)?;
            if opts.trace {
                for lost in lost {
                    println!("fault {:>9.3}s {lost}", now.as_secs_f64());
                }
            }
            faults.push(said);
        }
    }
    let found = outcome
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .context("the workload ended without a result")?;
    let Found {
        ops,
        mut violations,
        sync_rounds,
    } = found?;
    let grants = ops.iter().filter(|op| op.acquired()).count();
    let history: Vec<String> = ops.iter().map(|op| op.to_string()).collect();
    let mut hash = Sha256::new();
    for line in &history {
        hash.update(line.as_bytes());
        hash.update(b"\n");
    }
    for fault in &faults {
        hash.update(fault.as_bytes());
    }
    let config = workload_config(opts);
    let result = checker::check(
        &ops,
        &CheckConfig {
            permits: config.permits(),
            loss_after: config.loss_after(),
        },
    );
    let (lock_result, _) = locks::check(&ops, config.loss_after());
    for result in [&result, &lock_result] {
        violations.extend(result.violations.iter().map(|v| v.to_string()));
        let counted: usize = result.per_check.values().sum();
        if counted > result.violations.len() {
            violations.push(format!(
                "{} more violations of the same checks (not shown)",
                counted - result.violations.len()
            ));
        }
    }
    Ok(SeedReport {
        seed: opts.seed,
        violations,
        history_hash: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        ops: ops.len(),
        faults,
        simulated: sim.elapsed(),
        grants,
        sync_rounds,
        history,
        upgrade: Vec::new(),
    })
}

fn workload_config(opts: &SimOptions) -> WorkloadConfig {
    WorkloadConfig {
        namespace: "sim".into(),
        semaphores: vec![("one".into(), 1), ("three".into(), 3)],
        clients: opts.clients,
        ttl: Duration::from_secs(5),
        seed: opts.seed,
    }
}

/// What the workload host saw.
struct Found {
    ops: Vec<cluster_tests::jepsen::history::Op>,
    violations: Vec<String>,
    sync_rounds: usize,
}

/// The client host: create the semaphores, run the workload for the run's duration, then read
/// every node, revoke every lease, and wait for the drain and for agreement.
async fn drive_workload(opts: &SimOptions) -> anyhow::Result<Found> {
    let config = workload_config(opts);
    let channels: Vec<(u64, NodeChannel)> = (1..=opts.nodes)
        .map(|id| channel_to(id).map(|c| (id, c)))
        .collect::<anyhow::Result<_>>()?;
    let history = Arc::new(History::new(tokio::time::Instant::now()));
    let mut violations = Vec::new();
    setup(&channels, &config).await?;
    let shared = Arc::new(Shared {
        history: Arc::clone(&history),
        channels: channels.clone(),
        config: config.clone(),
    });
    let workload = Workload::start(&shared);
    let lock_workload = LockWorkload::start(&shared, if opts.locks { LOCK_CLIENTS } else { 0 });
    let sync = opts.sync.then(|| {
        SyncWorkload::start_paced(&config.namespace, channels.clone(), opts.seed, SYNC_PAUSE)
    });
    tokio::time::sleep(opts.duration).await;
    // Faults are healed when the workload stops; a node being replaced is back once the
    // operator is done.
    let operator_bound = tokio::time::Instant::now() + Duration::from_secs(60);
    while !operator::idle() && tokio::time::Instant::now() < operator_bound {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !operator::idle() {
        violations.push(
            "VIOLATION [operator] a removed node was not a voter again, or the upgrade not \
             finalized, 60 s after the faults ended"
                .into(),
        );
    }
    let mut sync_rounds = 0;
    if let Some(sync) = sync {
        let sync = sync.stop(Duration::from_secs(30)).await;
        if sync.rounds == 0 {
            violations.push("VIOLATION [sync] no wait group or barrier round ran".into());
        }
        violations.extend(
            sync.violations
                .iter()
                .map(|v| format!("VIOLATION [sync] {v}")),
        );
        sync_rounds = sync.rounds;
    }
    let stop_bound = Duration::from_millis(MAX_WAIT_MS) + Duration::from_secs(10);
    lock_workload.signal_stop();
    let leases = workload.stop(stop_bound).await;
    let lock_leases = lock_workload.stop(stop_bound).await;
    // Reads through every node.
    for (id, channel) in &channels {
        for (sem, _) in &config.semaphores {
            shared
                .read_holders(CHECKER_PROCESS, *id, channel.clone(), sem)
                .await;
        }
        shared
            .read_leases(CHECKER_PROCESS, *id, channel.clone())
            .await;
        locks::read_lock_leases(&shared, CHECKER_PROCESS, *id, channel.clone()).await;
        locks::read_locks(&shared, CHECKER_PROCESS, *id, channel.clone()).await;
    }
    for lease in &leases {
        lease.stop_keepalive();
    }
    for lease in &lock_leases {
        lease.stop_keepalive();
    }
    drop((leases, lock_leases));
    let mut rng = cluster_tests::rng::Rng::derive(opts.seed, u64::MAX - 1);
    let ops = history.snapshot();
    for lease in run::leases_to_revoke(&ops) {
        for _ in 0..3 {
            let outcome = shared.revoke(CHECKER_PROCESS, &lease, &mut rng).await;
            if outcome.is_ok() || outcome.is_not_found() {
                break;
            }
        }
    }
    for lease in locks::leases_to_revoke(&ops) {
        for _ in 0..3 {
            let outcome = locks::revoke(&shared, CHECKER_PROCESS, &lease, &mut rng).await;
            if outcome.is_ok() || outcome.is_not_found() {
                break;
            }
        }
    }
    let drain_bound = config.ttl * 2 + Duration::from_secs(10);
    if let Err(last) = wait_statuses(&channels, drain_bound, |s| {
        s.iter()
            .all(|s| s.holders == 0 && s.waiters == 0 && s.leases == 0)
    })
    .await
    {
        violations.push(format!(
            "VIOLATION [drain] holders, waiters or leases left {} s after every lease was \
             revoked: {last}",
            drain_bound.as_secs()
        ));
    }
    if let Err(last) = wait_statuses(&channels, Duration::from_secs(20), |s| {
        s.len() == channels.len()
            && s.windows(2).all(|w| {
                (w[0].applied_index, w[0].state_hash) == (w[1].applied_index, w[1].state_hash)
            })
    })
    .await
    {
        violations.push(format!(
            "VIOLATION [agreement] nodes did not converge on one applied index and state \
             hash: {last}"
        ));
    }
    if opts.version_skew().is_some()
        && let Err(last) = wait_statuses(&channels, Duration::from_secs(20), |s| {
            s.len() == channels.len()
                && s.iter()
                    .all(|s| s.cluster_version == 2 && s.cluster_version_max == 2)
        })
        .await
    {
        violations.push(format!(
            "VIOLATION [upgrade] after the upgrade not every node speaks and runs at cluster \
             version 2: {last}"
        ));
    }
    let by_node = channels.iter().cloned().collect();
    for (name, message) in locks::check_final_state(&shared, &by_node).await {
        violations.push(format!("VIOLATION [{name}] {message}"));
    }
    Ok(Found {
        ops: history.snapshot(),
        violations,
        sync_rounds,
    })
}

/// Creates the namespace and semaphores through whichever node takes them first.
async fn setup(channels: &[(u64, NodeChannel)], config: &WorkloadConfig) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        for (_, channel) in channels {
            if run::create_objects(channel, &config.namespace, &config.semaphores).await {
                return Ok(());
            }
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the namespace and semaphores could not be created within 60 s of simulated time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

type Status = conch_proto::conch::ClusterStatusResponse;

/// Polls every node's status until `done` holds for the answers (in node order), or `bound`
/// passes; then the last answers, said.
async fn wait_statuses(
    channels: &[(u64, NodeChannel)],
    bound: Duration,
    done: impl Fn(&[Status]) -> bool,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let mut statuses = Vec::new();
        for (_, channel) in channels {
            let mut admin = ConchAdminClient::new(channel.clone());
            if let Ok(Ok(reply)) = tokio::time::timeout(
                Duration::from_secs(2),
                admin.cluster_status(ClusterStatusRequest {}),
            )
            .await
            {
                statuses.push(reply.into_inner());
            }
        }
        if done(&statuses) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(statuses
                .iter()
                .map(|s| {
                    format!(
                        "n{} applied {} hash {:016x} leases {} holders {} waiters {} cluster \
                         version {} (speaks {})",
                        s.node_id,
                        s.applied_index,
                        s.state_hash,
                        s.leases,
                        s.holders,
                        s.waiters,
                        s.cluster_version,
                        s.cluster_version_max
                    )
                })
                .collect::<Vec<_>>()
                .join("; "));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After aligning, the next task's number is a multiple of [`TASK_ID_ALIGN`], however many
    /// tasks ran before.
    #[test]
    fn a_seed_starts_numbering_tasks_at_a_multiple_of_the_alignment() -> anyhow::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        for before in [0, 1, 5, 63] {
            for _ in 0..before {
                rt.spawn(async {});
            }
            align_task_ids()?;
            let next: u64 = rt.spawn(async {}).id().to_string().parse()?;
            assert_eq!(next % TASK_ID_ALIGN, 0, "after {before} tasks: task {next}");
        }
        Ok(())
    }
}

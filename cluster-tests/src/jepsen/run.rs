//! One run: start a cluster behind proxies, run the workload and the nemesis for `duration`,
//! heal, let the workload run on healed for `tail`, stop it, then check.
//!
//! After the workload stops:
//! 1. **waiters give up**: within the longest wait plus a few seconds, no node has waiters left
//!    (every blocking acquire was granted, timed out or was given up when its call went away);
//! 2. **final reads**: holders of every semaphore and the lease list, through every node,
//!    recorded in the history and checked like any read (acknowledged holds and leases that are
//!    still believed alive must be there; revoked or released ones must not);
//! 3. **revoke all**: every lease the history knows was created (and not yet revoked) is
//!    revoked;
//! 4. **drain**: within 2 TTLs plus a few seconds every node shows zero holders, waiters and
//!    leases (leases whose create answer was lost expire on their own);
//! 5. **agreement**: every node reaches the same applied index with the same state hash;
//! 6. the history checks of [`checker`];
//! 7. **liveness**: after each heal, a write succeeds within `recovery_bound` (the largest
//!    election timeout, 1 s, plus 5 s) and every node serves a linearizable read within
//!    `recovery_bound + 5 s`; in the healed tail every semaphore grants at least once.
//!
//! The lock workload ([`super::locks`], on unless `lock_clients` is 0) runs beside the
//! semaphore one and stops with it; its locks and lock leases are read in step 2 and its leases
//! revoked in step 3, the drain covers its holders, waiters and leases, and after the agreement
//! every node must list the same locks and lock waiters, and none. Its history checks join
//! step 6, and in the healed tail every lock path must be granted at least once.
//!
//! How soon writes resume *during* a fault (failover) is measured and reported, not checked:
//! holds are 1–5 s, shorter than any fair bound.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::rng::Rng;
use crate::wait_for;
use anyhow::Context;
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use futures::StreamExt;
use tokio::time::Instant;

use super::checker::{self, CheckConfig, CheckResult, Violation};
use super::history::{CHECKER_PROCESS, History, Micros, OkValue, Op, OpKind, Outcome, fmt_micros};
use super::locks::{self, LockStats, LockWorkload};
use super::nemesis::{Fault, FaultRecord, Nemesis};
use super::workload::{MAX_WAIT_MS, Shared, Workload, WorkloadConfig};

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub nodes: u64,
    /// How long faults are injected while the workload runs.
    pub duration: Duration,
    pub seed: u64,
    pub clients: usize,
    pub semaphores: usize,
    pub ttl: Duration,
    /// Healed time with the workload still running, before it stops; at least
    /// [`MIN_TAIL_OVER_TTL`] more than `ttl` whatever is set here.
    pub tail: Duration,
    /// Most time from a heal to the first acknowledged write.
    pub recovery_bound: Duration,
    /// Keep the directory (node logs, history) even without violations.
    pub keep: bool,
    /// Print every fault as it happens.
    pub progress: bool,
    /// Fault names or cut modes left out of the nemesis menu (see `nemesis::MENU`).
    pub exclude: Vec<String>,
    /// TLS, client certificates and peer mutual TLS on every node.
    pub tls: bool,
    /// Turn access control on before the workload; every client then sends a token.
    pub auth: bool,
    /// `conch sema` holders beside the workload, and the `pause-client` fault (plain TCP
    /// without access control only; see `cli_holders`).
    pub cli_holders: bool,
    /// Fault names to inject in this order, round robin, instead of random draws (see
    /// `nemesis::MENU`); empty: random.
    pub cycle: Vec<String>,
    /// A caller that is not a member forges peer messages throughout (see `adversary`); the
    /// nodes then authenticate their peers (a peer secret, or node certificates with `tls`).
    pub adversary: bool,
    /// Lock clients beside the semaphore ones (see [`super::locks`]); 0: no lock workload.
    pub lock_clients: usize,
    /// Wait groups and barriers beside the semaphore workload (see `sync_workload`).
    pub sync: bool,
    /// A rolling upgrade during the faults: the cluster starts on this conchd (a previous
    /// release), one node moves to this build after each healed fault (SIGTERM, the same
    /// directory and flags), and the upgrade is finalized before the healed tail.
    pub upgrade_from: Option<std::path::PathBuf>,
}

/// Size of each node's data disk when `disk-full` is in the menu: far more than a run writes
/// (the log is purged at every snapshot), so only the filler fills it.
pub const DISK_BYTES: u64 = 256 << 20;

/// The healed tail lasts at least the TTL plus this. A client that abandoned its lease during a
/// fault may keep a semaphore whole for one TTL after the heal: its last refresh, held up by a
/// stalled link, is only stamped when the link heals. A tail of one TTL or less then ends before
/// the slot can come back, and "every semaphore grants in the tail" would fail for no fault of
/// the cluster (seen with 5 nodes, seed 2: the grant came 8 ms after a 4 s tail).
pub const MIN_TAIL_OVER_TTL: Duration = Duration::from_secs(4);

/// The final revoke of every lease gives up after this long (the drain check then reports
/// what is left).
const REVOKE_ALL_BOUND: Duration = Duration::from_secs(30);

/// conchd's default election timeout is 500..1000 ms.
pub const ELECTION_TIMEOUT_MAX: Duration = Duration::from_millis(1000);

impl RunOptions {
    pub fn new(nodes: u64, duration: Duration, seed: u64) -> RunOptions {
        RunOptions {
            nodes,
            duration,
            seed,
            clients: 16,
            semaphores: 3,
            ttl: Duration::from_secs(4),
            tail: Duration::from_secs(4),
            recovery_bound: ELECTION_TIMEOUT_MAX + Duration::from_secs(5),
            keep: false,
            progress: true,
            exclude: Vec::new(),
            tls: false,
            auth: false,
            cli_holders: true,
            cycle: Vec::new(),
            adversary: false,
            lock_clients: 8,
            sync: true,
            upgrade_from: None,
        }
    }
}

pub struct RunReport {
    pub seed: u64,
    pub nodes: u64,
    pub ops: usize,
    pub ok: usize,
    pub fail: usize,
    pub unknown: usize,
    pub faults: Vec<FaultRecord>,
    pub check: CheckResult,
    pub elapsed: Duration,
    /// Where node logs and the history were kept (on violations, or with `keep`).
    pub dir: Option<PathBuf>,
    pub snapshot_every: u64,
    pub permits: BTreeMap<String, u64>,
    pub exclude: Vec<String>,
    /// What the `conch sema` holders did, if they ran.
    pub cli: Option<super::cli_holders::Stats>,
    /// What the lock workload did, if it ran.
    pub locks: Option<LockSummary>,
}

/// The lock workload's share of a run.
#[derive(Clone, Debug, Default)]
pub struct LockSummary {
    pub clients: usize,
    pub ops: usize,
    pub ok: usize,
    pub fail: usize,
    pub unknown: usize,
    pub stats: LockStats,
}

impl RunReport {
    pub fn violations(&self) -> usize {
        self.check.total()
    }

    pub fn summary_line(&self) -> String {
        format!(
            "jepsen: ops={} ok={} fail={} unknown={} faults={} violations={}",
            self.ops,
            self.ok,
            self.fail,
            self.unknown,
            self.faults.len(),
            self.violations()
        )
    }

    /// Violations of the lock checks (those named `lock-…`).
    pub fn lock_violations(&self) -> usize {
        self.check
            .per_check
            .iter()
            .filter(|(name, _)| name.starts_with("lock-"))
            .map(|(_, n)| n)
            .sum()
    }

    /// `jepsen: locks: …`, when the lock workload ran: its ops (also counted in the summary
    /// line) and the violations of the lock checks (also counted there).
    pub fn lock_line(&self) -> Option<String> {
        let l = self.locks.as_ref()?;
        Some(format!(
            "jepsen: locks: clients={} ops={} ok={} fail={} unknown={} grants={} hold-intervals={} reads={} lease-reads={} max-shared={} violations={}",
            l.clients,
            l.ops,
            l.ok,
            l.fail,
            l.unknown,
            l.stats.grants,
            l.stats.hold_intervals,
            l.stats.reads_checked,
            l.stats.lease_reads_checked,
            l.stats.max_shared,
            self.lock_violations()
        ))
    }

    /// Recovery times per fault kind: how many, then max and mean of the time from the heal to
    /// the first write and to every node serving reads, and of the failover while it lasted.
    pub fn recovery_per_kind(&self) -> String {
        let mut kinds: BTreeMap<&str, Vec<&FaultRecord>> = BTreeMap::new();
        for f in &self.faults {
            kinds.entry(f.name).or_default().push(f);
        }
        let stat = |times: Vec<Option<Duration>>| {
            let n = times.len();
            let known: Vec<u128> = times.iter().flatten().map(|d| d.as_millis()).collect();
            match known.iter().max() {
                None => "-".to_string(),
                Some(max) => {
                    let never = n - known.len();
                    format!(
                        "max {max} mean {}{}",
                        known.iter().sum::<u128>() / known.len() as u128,
                        if never > 0 {
                            format!(" ({never} never)")
                        } else {
                            String::new()
                        }
                    )
                }
            }
        };
        let mut out = String::from(
            "jepsen: recovery per fault kind (ms; after the heal: first write, every node; writes during the fault):\n",
        );
        for (kind, faults) in kinds {
            out.push_str(&format!(
                "  {kind:<15} n={:<3} write {:<22} every node {:<22} during {}\n",
                faults.len(),
                stat(faults.iter().map(|f| f.first_write).collect()),
                stat(faults.iter().map(|f| f.all_nodes).collect()),
                stat(faults.iter().map(|f| f.during).collect()),
            ));
        }
        out
    }

    /// Everything but the summary line.
    pub fn details(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "jepsen: seed={} nodes={} semaphores={:?} snapshot-every={} excluded={:?} elapsed={:.1}s\n",
            self.seed,
            self.nodes,
            self.permits,
            self.snapshot_every,
            self.exclude,
            self.elapsed.as_secs_f64()
        ));
        out.push_str("jepsen: faults:\n");
        for f in &self.faults {
            out.push_str(&format!("  {f}\n"));
        }
        out.push_str(&self.recovery_per_kind());
        let times: Vec<u128> = self
            .faults
            .iter()
            .filter_map(|f| f.first_write.map(|d| d.as_millis()))
            .collect();
        if let Some(max) = times.iter().max() {
            out.push_str(&format!(
                "jepsen: recovery: first write max {max} ms, mean {} ms; every node max {} ms\n",
                times.iter().sum::<u128>() / times.len() as u128,
                self.faults
                    .iter()
                    .filter_map(|f| f.all_nodes.map(|d| d.as_millis()))
                    .max()
                    .unwrap_or(0)
            ));
        }
        let s = &self.check.stats;
        out.push_str(&format!(
            "jepsen: grants={} set-grants={} hold-intervals={} holder-reads={} lease-reads={} max-believed={:?}\n",
            s.grants,
            s.set_grants,
            s.hold_intervals,
            s.holder_reads_checked,
            s.lease_reads_checked,
            s.max_believed
        ));
        if let Some(cli) = &self.cli {
            out.push_str(&format!("jepsen: {cli}\n"));
        }
        for (check, n) in &self.check.per_check {
            out.push_str(&format!("jepsen: {check}: {n} violation(s)\n"));
        }
        for v in &self.check.violations {
            out.push_str(&v.to_string());
        }
        if let Some(dir) = &self.dir {
            out.push_str(&format!(
                "jepsen: node logs and history kept in {}\n",
                dir.display()
            ));
        }
        if let Some(line) = self.lock_line() {
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

fn say(progress: bool, start: std::time::Instant, text: impl AsRef<str>) {
    if progress {
        println!(
            "jepsen: t={:>7} {}",
            fmt_micros(start.elapsed().as_micros() as Micros),
            text.as_ref()
        );
    }
}

fn run_violation(check: &mut CheckResult, name: &'static str, message: String) {
    *check.per_check.entry(name).or_default() += 1;
    check.violations.push(Violation {
        check: name,
        message,
        ops: Vec::new(),
    });
}

pub async fn setup(
    cluster: &Cluster,
    namespace: &str,
    semaphores: &[(String, u64)],
) -> anyhow::Result<()> {
    let channels = cluster.channels();
    wait_for(
        "the namespace and semaphores to be created",
        Duration::from_secs(30),
        || {
            let channels = channels.clone();
            async move {
                for channel in channels.values() {
                    if create_objects(channel, namespace, semaphores).await {
                        return Some(());
                    }
                }
                None
            }
        },
    )
    .await
}

/// Creates the workload's namespace and semaphores through the node of `channel` (those that
/// exist already count as created); whether all of them exist, within 3 s.
pub async fn create_objects(
    channel: &crate::net::NodeChannel,
    namespace: &str,
    semaphores: &[(String, u64)],
) -> bool {
    let mut c = GrackleApiClient::new(channel.clone());
    let ok = async {
        let r = c
            .create_namespace(pb::CreateNamespaceRequest {
                name: namespace.into(),
                ..Default::default()
            })
            .await;
        if let Err(s) = r
            && s.code() != tonic::Code::AlreadyExists
        {
            return false;
        }
        for (sem, permits) in semaphores {
            let r = c
                .create_semaphore(pb::CreateSemaphoreRequest {
                    namespace_name: namespace.into(),
                    semaphore_name: sem.clone(),
                    permits: *permits,
                    ..Default::default()
                })
                .await;
            if let Err(s) = r
                && s.code() != tonic::Code::AlreadyExists
            {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(Duration::from_secs(3), ok)
        .await
        .unwrap_or(false)
}

fn status_line(
    cluster_statuses: &BTreeMap<u64, conch_proto::conch::ClusterStatusResponse>,
) -> String {
    cluster_statuses
        .iter()
        .map(|(id, s)| {
            format!(
                "n{id}: leader={} term={} applied={} hash={:016x} leases={} holders={} waiters={}",
                s.leader_id, s.term, s.applied_index, s.state_hash, s.leases, s.holders, s.waiters
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Waits (bounded) until every node answers a status that satisfies `done`.
async fn wait_statuses(
    cluster: &Cluster,
    timeout: Duration,
    done: impl Fn(&BTreeMap<u64, conch_proto::conch::ClusterStatusResponse>) -> bool,
) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = BTreeMap::new();
    while start.elapsed() < timeout {
        let statuses = cluster.statuses().await;
        if statuses.len() == cluster.ids().len() && done(&statuses) {
            return Ok(start.elapsed());
        }
        last = statuses;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(status_line(&last))
}

pub async fn run(opts: RunOptions) -> anyhow::Result<RunReport> {
    let start = std::time::Instant::now();
    let progress = opts.progress;
    let mut rng = Rng::derive(opts.seed, 0);
    let snapshot_every = *rng.pick(&[100u64, 1000, 10_000]).unwrap_or(&10_000);
    let namespace = "jepsen".to_string();
    let semaphores: Vec<(String, u64)> = (0..opts.semaphores)
        .map(|i| (format!("s{i}"), rng.range(2, 3)))
        .collect();
    let config = WorkloadConfig {
        namespace: namespace.clone(),
        semaphores: semaphores.clone(),
        clients: opts.clients,
        ttl: opts.ttl,
        seed: opts.seed,
    };
    let mut args = vec!["--snapshot-every".to_string(), snapshot_every.to_string()];
    // Kept until the run ends: restarted nodes read the token file again.
    let _token_dir = if opts.auth {
        let (dir, auth_args) = crate::auth::bootstrap_args()?;
        args.extend(auth_args);
        Some(dir)
    } else if opts.adversary && !opts.tls {
        let dir = tempfile::Builder::new()
            .prefix("conch-peer-secret-")
            .tempdir()?;
        args.extend(crate::auth::peer_secret_args(dir.path())?);
        Some(dir)
    } else {
        None
    };
    // Faults that need the machine's help are left out, with one line, when it cannot.
    let mut exclude = opts.exclude.clone();
    let wanted = |name: &str, exclude: &[String]| {
        !exclude.iter().any(|e| e == name)
            && (opts.cycle.is_empty() || opts.cycle.iter().any(|c| c == name))
    };
    let clocks = wanted("clock-step", &exclude)
        && {
            let ok = crate::faketime::available();
            if !ok {
                println!(
                    "jepsen: clock-step left out: libfaketime ({}) is not installed (scripts/install-test-deps.sh installs it)",
                    crate::faketime::LIB
                );
                exclude.push("clock-step".into());
            }
            ok
        };
    let disks = wanted("disk-full", &exclude) && {
        let mounted = crate::disk::mount_works();
        if let Err(e) = &mounted {
            println!("jepsen: disk-full left out: cannot mount a tmpfs here ({e:#})");
            exclude.push("disk-full".into());
        }
        mounted.is_ok()
    };
    let env = |id: u64, dir: &std::path::Path| {
        if clocks {
            crate::faketime::node_env(id, dir)
        } else {
            Vec::new()
        }
    };
    // A node whose port another process took in the moment between choosing it and binding it
    // exits at once: start the whole cluster again with new ports (never counted as a crash).
    let mut attempt = 1;
    let mut cluster = loop {
        let mut cluster = Cluster::launch_full(
            opts.nodes,
            &args,
            true,
            opts.tls,
            &env,
            disks.then_some(DISK_BYTES),
            opts.upgrade_from.as_deref(),
        )
        .await?;
        let leader = wait_for("a leader", Duration::from_secs(30), || async {
            cluster.leader().await
        })
        .await;
        let exited: Vec<u64> = cluster
            .ids()
            .into_iter()
            .filter(|&id| cluster.exit_status(id).is_some())
            .collect();
        if exited.is_empty() {
            leader?;
            break cluster;
        }
        anyhow::ensure!(
            attempt < 3,
            "nodes {exited:?} exited at startup: {}",
            cluster.logs_tail()
        );
        println!(
            "jepsen: nodes {exited:?} exited at startup (attempt {attempt}, e.g. a port taken); starting again with new ports"
        );
        attempt += 1;
    };
    say(
        progress,
        start,
        format!(
            "{} nodes up in {}; semaphores {semaphores:?}, snapshot every {snapshot_every} entries",
            opts.nodes,
            cluster.dir().display()
        ),
    );
    if opts.auth {
        crate::auth::wait_until_on(&cluster, Duration::from_secs(30)).await?;
        say(progress, start, "access control on");
    }
    setup(&cluster, &namespace, &semaphores).await?;

    let history = Arc::new(History::new(tokio::time::Instant::from_std(start)));
    let shared = Arc::new(Shared {
        history: Arc::clone(&history),
        channels: cluster.channels().into_iter().collect(),
        config: config.clone(),
    });
    let workload = Workload::start(&shared);
    say(progress, start, format!("{} clients started", opts.clients));
    let lock_workload =
        (opts.lock_clients > 0).then(|| LockWorkload::start(&shared, opts.lock_clients));
    if lock_workload.is_some() {
        say(
            progress,
            start,
            format!(
                "{} lock clients started on {:?}",
                opts.lock_clients,
                locks::PATHS
            ),
        );
    }
    let sync = opts.sync.then(|| {
        super::sync_workload::SyncWorkload::start(
            &namespace,
            cluster.channels().into_iter().collect(),
            opts.seed,
        )
    });
    let adversary = if opts.adversary {
        let cluster_id = cluster.status(cluster.ids()[0]).await?.cluster_id;
        let eku_less = match &cluster.pki {
            Some(pki) => {
                let (cert, key) = pki.no_eku()?;
                Some(pki.tls_as(&cert, &key)?)
            }
            None => None,
        };
        say(progress, start, "adversary forging peer messages");
        Some(super::adversary::Adversary::start(
            cluster.endpoints(),
            cluster.ids(),
            cluster_id,
            opts.seed,
            eku_less,
        ))
    } else {
        None
    };

    let (cli, said) = super::cli_holders::for_run(
        opts.cli_holders && !opts.tls && !opts.auth,
        &cluster.endpoints(),
        cluster.dir(),
        opts.seed,
        &mut exclude,
    );
    say(progress, start, said);
    let mut check = CheckResult::default();

    // ---- faults ----
    let mut nemesis = Nemesis::new(Rng::derive(opts.seed, u64::MAX), &namespace, &exclude)
        .with_cycle(&opts.cycle)
        .with_clocks(clocks);
    let mut faults = Vec::new();
    // With a rolling upgrade: the nodes still on the previous release, in the order they move.
    let mut upgrading: Vec<u64> = match opts.upgrade_from {
        Some(_) => cluster.ids(),
        None => Vec::new(),
    };
    let faults_until = Instant::now() + opts.duration;
    loop {
        let quiet = nemesis.quiet();
        if Instant::now() + quiet + Duration::from_secs(2) > faults_until {
            break;
        }
        tokio::time::sleep(quiet).await;
        let leader = cluster.leader().await;
        let (name, fault, hold, detail) = nemesis.choose(&cluster.ids(), leader);
        let remaining = faults_until.saturating_duration_since(Instant::now());
        let hold = hold.min(remaining.max(Duration::from_millis(500)));
        let fault_start = history.now();
        say(
            progress,
            start,
            format!("fault {name}: {detail} for {} ms", hold.as_millis()),
        );
        let fault_at = Instant::now();
        nemesis.apply(&mut cluster, &fault)?;
        if let (super::cli_holders::FAULT, Some(h)) = (name, &cli) {
            say(progress, start, h.pause_one());
        }
        let during = nemesis.during(&cluster, fault_at, fault_at + hold).await;
        tokio::time::sleep_until(fault_at + hold).await;
        let exited = nemesis.heal(&mut cluster)?;
        cli.iter().for_each(|h| h.resume_all());
        for (id, status) in exited {
            let expected = matches!(fault, Fault::DiskFull { node } if node == id)
                && status.code() == Some(crate::disk::CONCHD_EXIT_STORAGE);
            if expected {
                say(
                    progress,
                    start,
                    format!("n{id} had exited on the full disk ({status}); started again"),
                );
            } else {
                run_violation(
                    &mut check,
                    "crash",
                    format!(
                        "n{id} exited on its own ({status}) during {name} ({detail}); started again"
                    ),
                );
            }
        }
        let healed_at = Instant::now();
        let healed = history.now();
        let (first_write, all_nodes) = nemesis.recovery(&cluster, healed_at).await;
        let record = FaultRecord {
            name,
            detail,
            start: fault_start,
            healed,
            during,
            first_write,
            all_nodes,
        };
        say(
            progress,
            start,
            format!(
                "healed {name}: writes during the fault after {}; after the heal: write after {}, every node after {}",
                during
                    .map(|d| format!("{} ms", d.as_millis()))
                    .unwrap_or_else(|| "never".into()),
                first_write
                    .map(|d| format!("{} ms", d.as_millis()))
                    .unwrap_or_else(|| "never".into()),
                all_nodes
                    .map(|d| format!("{} ms", d.as_millis()))
                    .unwrap_or_else(|| "never".into())
            ),
        );
        faults.push(record);
        if let Some(id) = upgrading.first().copied() {
            upgrading.remove(0);
            say(progress, start, upgrade_node(&mut cluster, id).await?);
        }
    }
    for (id, status) in nemesis.heal(&mut cluster)? {
        run_violation(
            &mut check,
            "crash",
            format!("n{id} exited on its own ({status}) after the last heal; started again"),
        );
    }
    if opts.upgrade_from.is_some() {
        for id in std::mem::take(&mut upgrading) {
            say(progress, start, upgrade_node(&mut cluster, id).await?);
        }
        say(progress, start, finalize_upgrade(&cluster).await?);
    }

    // ---- healed tail ----
    let tail_start = history.now();
    tokio::time::sleep(opts.tail.max(opts.ttl + MIN_TAIL_OVER_TTL)).await;
    let tail_end = history.now();
    if let Some(adversary) = adversary {
        let report = adversary.stop().await;
        say(
            progress,
            start,
            format!(
                "adversary: {} forged calls, {} refused, {} unanswered (faults), {} accepted",
                report.sent,
                report.refused,
                report.unanswered,
                report.accepted.len()
            ),
        );
        for accepted in report.accepted {
            run_violation(&mut check, "adversary", accepted);
        }
        if report.refused == 0 {
            run_violation(
                &mut check,
                "adversary",
                format!("no forged call was refused ({} sent)", report.sent),
            );
        }
        if let Some(channel) = cluster.channels().into_values().next() {
            match super::adversary::planted(channel).await {
                Ok(planted) if planted.is_empty() => {}
                Ok(planted) => run_violation(
                    &mut check,
                    "adversary",
                    format!("forged namespaces were committed: {planted:?}"),
                ),
                Err(e) => run_violation(
                    &mut check,
                    "adversary",
                    format!("could not list namespaces to look for forged ones: {e}"),
                ),
            }
        }
    }
    if let Some(sync) = sync {
        let report = sync.stop(Duration::from_secs(30)).await;
        say(
            progress,
            start,
            format!(
                "wait groups and barriers: {} rounds, {} calls, {} violations",
                report.rounds,
                report.calls,
                report.violations.len()
            ),
        );
        if report.rounds == 0 {
            run_violation(&mut check, "sync", "no wait group round ran".into());
        }
        for v in report.violations {
            run_violation(&mut check, "sync", v);
        }
    }
    say(progress, start, "stopping the workload");
    let stop_bound = Duration::from_millis(MAX_WAIT_MS) + Duration::from_secs(10);
    if let Some(w) = &lock_workload {
        w.signal_stop();
    }
    let leases = workload.stop(stop_bound).await;
    let lock_leases = match lock_workload {
        Some(w) => w.stop(stop_bound).await,
        None => Vec::new(),
    };

    let cli = match cli {
        Some(h) => {
            let (violations, stats) = h.stop(Duration::from_secs(20)).await;
            say(progress, start, stats.to_string());
            for v in violations {
                run_violation(&mut check, "cli-holders", v);
            }
            Some(stats)
        }
        None => None,
    };
    // 1. waiters give up
    let waiters_bound = Duration::from_millis(MAX_WAIT_MS) + Duration::from_secs(5);
    if let Err(last) = wait_statuses(&cluster, waiters_bound, |s| {
        s.values().all(|s| s.waiters == 0)
    })
    .await
    {
        run_violation(
            &mut check,
            "drain",
            format!(
                "waiters still queued {} s after the workload stopped: {last}",
                waiters_bound.as_secs()
            ),
        );
    }
    // 2. final reads through every node (concurrent; each read is bounded)
    {
        let mut reads = Vec::new();
        for (id, channel) in cluster.channels() {
            for (sem, _) in &semaphores {
                let shared = Arc::clone(&shared);
                let channel = channel.clone();
                let sem = sem.clone();
                reads.push(tokio::spawn(async move {
                    shared
                        .read_holders(CHECKER_PROCESS, id, channel, &sem)
                        .await;
                }));
            }
            if opts.lock_clients > 0 {
                // Leases first: a lock held by a lease this read does not list is an orphan.
                let shared = Arc::clone(&shared);
                let channel = channel.clone();
                reads.push(tokio::spawn(async move {
                    locks::read_lock_leases(&shared, CHECKER_PROCESS, id, channel.clone()).await;
                    locks::read_locks(&shared, CHECKER_PROCESS, id, channel).await;
                }));
            }
            let shared = Arc::clone(&shared);
            reads.push(tokio::spawn(async move {
                shared.read_leases(CHECKER_PROCESS, id, channel).await;
            }));
        }
        for read in reads {
            let _ = read.await;
        }
    }
    // 3. revoke all (concurrent, at most a few attempts each, bounded overall)
    for lease in &leases {
        lease.stop_keepalive();
    }
    drop(leases);
    for lease in &lock_leases {
        lease.stop_keepalive();
    }
    drop(lock_leases);
    let to_revoke = leases_to_revoke(&history.snapshot());
    let locks_to_revoke = locks::leases_to_revoke(&history.snapshot());
    {
        use futures::FutureExt;
        let revokes = to_revoke.iter().enumerate().map(|(i, lease)| {
            let shared = Arc::clone(&shared);
            let mut rng = Rng::derive(opts.seed, u64::MAX - 1 - i as u64);
            async move {
                for _ in 0..3 {
                    let outcome = shared.revoke(CHECKER_PROCESS, lease, &mut rng).await;
                    if outcome.is_ok() || outcome.is_not_found() {
                        break;
                    }
                }
            }
            .boxed()
        });
        let lock_revokes = locks_to_revoke.iter().enumerate().map(|(i, lease)| {
            let shared = Arc::clone(&shared);
            let mut rng = Rng::derive(opts.seed, (u64::MAX >> 1) - i as u64);
            async move {
                for _ in 0..3 {
                    let outcome = locks::revoke(&shared, CHECKER_PROCESS, lease, &mut rng).await;
                    if outcome.is_ok() || outcome.is_not_found() {
                        break;
                    }
                }
            }
            .boxed()
        });
        let all = futures::stream::iter(revokes.chain(lock_revokes))
            .buffer_unordered(16)
            .collect::<Vec<()>>();
        if tokio::time::timeout(REVOKE_ALL_BOUND, all).await.is_err() {
            say(
                progress,
                start,
                "revoking every lease took too long; going on",
            );
        }
    }
    say(
        progress,
        start,
        format!(
            "revoked {} leases and {} lock leases; waiting for the drain",
            to_revoke.len(),
            locks_to_revoke.len()
        ),
    );
    // 4. drain
    let drain_bound = opts.ttl * 2 + Duration::from_secs(10);
    match wait_statuses(&cluster, drain_bound, |s| {
        s.values()
            .all(|s| s.holders == 0 && s.waiters == 0 && s.leases == 0)
    })
    .await
    {
        Ok(took) => say(
            progress,
            start,
            format!("drained in {} ms", took.as_millis()),
        ),
        Err(last) => run_violation(
            &mut check,
            "drain",
            format!(
                "holders, waiters or leases left {} s after every lease was revoked: {last}",
                drain_bound.as_secs()
            ),
        ),
    }
    // 5. agreement
    match wait_statuses(&cluster, Duration::from_secs(20), |s| {
        let mut it = s.values().map(|s| (s.applied_index, s.state_hash));
        let first = it.next();
        it.all(|x| Some(x) == first)
    })
    .await
    {
        Ok(_) => {
            let statuses = cluster.statuses().await;
            say(
                progress,
                start,
                format!("agreement: {}", status_line(&statuses)),
            );
        }
        Err(last) => run_violation(
            &mut check,
            "agreement",
            format!("nodes did not converge on one applied index and state hash: {last}"),
        ),
    }
    if opts.lock_clients > 0 {
        for (name, message) in locks::check_final_state(&shared, &cluster.channels()).await {
            run_violation(&mut check, name, message);
        }
    }

    // 6. history
    let ops = history.snapshot();
    let result = checker::check(
        &ops,
        &CheckConfig {
            permits: config.permits(),
            loss_after: config.loss_after(),
        },
    );
    for (name, n) in &result.per_check {
        *check.per_check.entry(name).or_default() += n;
    }
    check.violations.extend(result.violations);
    check.stats = result.stats;
    let lock_stats = (opts.lock_clients > 0).then(|| {
        let (result, stats) = locks::check(&ops, config.loss_after());
        for (name, n) in &result.per_check {
            *check.per_check.entry(name).or_default() += n;
        }
        check.violations.extend(result.violations);
        stats
    });

    // 7. liveness
    let all_nodes_bound = opts.recovery_bound + Duration::from_secs(5);
    for f in &faults {
        let bounds = [
            ("the first write took", f.first_write, opts.recovery_bound),
            (
                "some node served reads only after",
                f.all_nodes,
                all_nodes_bound,
            ),
        ];
        for (what, took, bound) in bounds {
            if took.is_some_and(|d| d <= bound) {
                continue;
            }
            run_violation(
                &mut check,
                "availability",
                format!(
                    "after healing {} ({}) at {}, {what} {} (bound {} ms)",
                    f.name,
                    f.detail,
                    fmt_micros(f.healed),
                    took.map(|d| format!("{} ms", d.as_millis()))
                        .unwrap_or_else(|| "forever".into()),
                    bound.as_millis()
                ),
            );
        }
    }
    for (sem, _) in &semaphores {
        let granted = ops.iter().any(|op| {
            op.acquired()
                && op.kind.sem() == Some(sem.as_str())
                && op
                    .complete
                    .is_some_and(|c| c >= tail_start && c <= tail_end)
        });
        if !granted {
            run_violation(
                &mut check,
                "liveness",
                format!(
                    "no grant of {sem} in the healed tail {}..{}",
                    fmt_micros(tail_start),
                    fmt_micros(tail_end)
                ),
            );
        }
    }

    if opts.lock_clients > 0 {
        for path in locks::paths_not_granted(&ops, tail_start, tail_end) {
            run_violation(
                &mut check,
                "lock-liveness",
                format!(
                    "no grant of lock {path} in the healed tail {}..{}",
                    fmt_micros(tail_start),
                    fmt_micros(tail_end)
                ),
            );
        }
    }
    let locks = lock_stats.map(|stats| {
        let mut summary = LockSummary {
            clients: opts.lock_clients,
            stats,
            ..LockSummary::default()
        };
        for op in ops.iter().filter(|op| op.kind.is_lock()) {
            summary.ops += 1;
            match op.outcome {
                Outcome::Ok(_) => summary.ok += 1,
                Outcome::Fail { .. } => summary.fail += 1,
                Outcome::Unknown { .. } | Outcome::Pending => summary.unknown += 1,
            }
        }
        summary
    });
    let (mut ok, mut fail, mut unknown) = (0, 0, 0);
    for op in &ops {
        match op.outcome {
            Outcome::Ok(_) => ok += 1,
            Outcome::Fail { .. } => fail += 1,
            Outcome::Unknown { .. } | Outcome::Pending => unknown += 1,
        }
    }
    let dir = if check.total() > 0 || opts.keep {
        let dir = cluster.keep_dir();
        write_history(&dir, &ops).context("write the history")?;
        Some(dir)
    } else {
        None
    };
    Ok(RunReport {
        seed: opts.seed,
        nodes: opts.nodes,
        ops: ops.len(),
        ok,
        fail,
        unknown,
        faults,
        check,
        elapsed: start.elapsed(),
        dir,
        snapshot_every,
        permits: config.permits(),
        exclude,
        cli,
        locks,
    })
}

/// Every lease the history created (or may have) and did not see revoked.
pub fn leases_to_revoke(ops: &[Op]) -> Vec<String> {
    let mut leases = BTreeMap::new();
    for op in ops {
        if let (OpKind::CreateLease { .. }, Outcome::Ok(OkValue::Lease { lease })) =
            (&op.kind, &op.outcome)
        {
            leases.insert(lease.clone(), true);
        }
    }
    for op in ops {
        if let OpKind::Revoke { lease } = &op.kind
            && (op.outcome.is_ok() || op.outcome.is_not_found())
        {
            leases.insert(lease.clone(), false);
        }
    }
    leases
        .into_iter()
        .filter_map(|(lease, live)| live.then_some(lease))
        .collect()
}

fn write_history(dir: &std::path::Path, ops: &[Op]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(dir.join("history.txt"))?);
    let mut sorted: Vec<&Op> = ops.iter().collect();
    sorted.sort_by_key(|op| (op.invoke, op.id));
    for op in sorted {
        writeln!(file, "{op}")?;
    }
    file.flush()
}

/// Moves node `id` to this build as an operator does: SIGTERM, then this build's conchd on the
/// same directory and flags. Returns what to say.
async fn upgrade_node(cluster: &mut Cluster, id: u64) -> anyhow::Result<String> {
    // A node the nemesis left stopped is simply started on the new binary.
    let stopped = match cluster.stop(id, Duration::from_secs(30)).await {
        Ok(status) => format!("stopped ({status})"),
        Err(e) => format!("not stopped: {e}"),
    };
    cluster.set_binary(id, None);
    cluster.start_node(id)?;
    Ok(format!("upgrade: n{id} {stopped}, started on this build"))
}

/// Finalizes the rolling upgrade, retrying while a leader is being elected or a member is
/// still starting. Returns what to say.
async fn finalize_upgrade(cluster: &Cluster) -> anyhow::Result<String> {
    use conch_proto::conch::FinalizeUpgradeRequest;
    let ids = cluster.ids();
    let mut last = String::new();
    for attempt in 0..60u32 {
        let id = ids[attempt as usize % ids.len()];
        match cluster.admin(id).await {
            Ok(mut admin) => match admin.finalize_upgrade(FinalizeUpgradeRequest {}).await {
                Ok(r) => {
                    let r = r.into_inner();
                    return Ok(format!(
                        "upgrade: finalized, cluster version {} -> {}",
                        r.previous_cluster_version, r.cluster_version
                    ));
                }
                Err(status) => last = status.message().to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the upgrade did not finalize within 30 s: {last}")
}

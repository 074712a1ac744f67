//! Upgrades: the cluster version of a new cluster, the data of release 0.1.0 opened by this
//! build (data directories and a backup, from `fixtures/0.1.0`, written by
//! `scripts/upgrade-fixtures.sh`), and a rolling upgrade from the previous release under load,
//! with a step back, that needs the previous release's binary (`make test-upgrade` builds it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{ClusterStatusRequest, ClusterStatusResponse, FinalizeUpgradeRequest};
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;

use cluster_tests::daemon::Daemon;
use cluster_tests::net::{channel, lazy_channel, use_token};
use cluster_tests::sockets::Port;
use cluster_tests::upgrade::{ADMIN_TOKEN, Fixture, populate, verify};
use cluster_tests::{Cluster, run_conch, wait_for};

const RELEASE: &str = env!("CARGO_PKG_VERSION");

async fn status(addr: &str) -> anyhow::Result<ClusterStatusResponse> {
    let mut admin = ConchAdminClient::new(channel(addr).await?);
    Ok(admin
        .cluster_status(ClusterStatusRequest {})
        .await?
        .into_inner())
}

/// Waits until every address answers with cluster version `version`.
async fn wait_for_version(addrs: &[String], version: u32) -> anyhow::Result<()> {
    for addr in addrs {
        wait_for(
            &format!("{addr} at cluster version {version}"),
            Duration::from_secs(60),
            || async {
                let s = status(addr).await.ok()?;
                (s.cluster_version == version).then_some(())
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_runs_at_the_newest_cluster_version_and_each_node_says_its_release()
-> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let addrs = cluster.endpoints();
    // The bootstrapping node raises it once every member answered: nothing to go back to.
    wait_for_version(&addrs, 2).await?;
    for addr in &addrs {
        let s = status(addr).await?;
        ensure!(
            s.release == RELEASE && s.cluster_version_max == 2 && s.data_format == 8,
            "{addr}: {s:?}"
        );
    }
    let endpoints = addrs.join(",");
    let (code, stdout, stderr) = run_conch(&endpoints, &["cluster", "finalize"], &[]).await?;
    ensure!(code == 0, "finalize: {code} {stderr}");
    ensure!(
        stdout.contains("cluster version 2 already: nothing to finalize")
            && stdout.contains(&format!(
                "node 3: conch {RELEASE} (speaks cluster version 2)"
            )),
        "{stdout}"
    );
    let (code, stdout, stderr) = run_conch(&endpoints, &["cluster", "status"], &[]).await?;
    ensure!(code == 0, "status: {code} {stderr}");
    ensure!(
        stdout.contains("RELEASE") && stdout.lines().any(|l| l == "cluster version: 2"),
        "{stdout}"
    );
    let metrics = cluster
        .metrics_addr(1)
        .context("node 1's metrics address")?;
    let scrape = cluster_tests::scrape::scrape(&metrics).await?;
    ensure!(scrape.value("conch_cluster_version") == 2.0);
    ensure!(
        scrape.value(&format!(
            "conch_build_info{{cluster_version_max=\"2\",data_format=\"8\",release=\"{RELEASE}\"}}"
        )) == 1.0,
        "build info missing"
    );
    let version = std::process::Command::new(cluster_tests::binary("conchd"))
        .arg("--version")
        .output()?;
    let version = String::from_utf8_lossy(&version.stdout);
    ensure!(
        version.starts_with(&format!("conchd {RELEASE} (commit "))
            && version.contains("data format 8 (reads 7 to 8); cluster version 2 (speaks 1 to 2)"),
        "{version}"
    );
    Ok(())
}

/// The node that bootstraps a new cluster raises its cluster version even when its process is
/// killed before it could: here it starts alone (no majority, so no raise), is killed, and
/// comes back with the others. Its log says a new cluster starts at the version, not that an
/// upgrade was made final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_reaches_the_newest_version_when_its_bootstrapping_node_restarts_first()
-> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let mut ports: BTreeMap<u64, Port> = (1..=3)
        .map(|id| Ok((id, Port::bind()?)))
        .collect::<anyhow::Result<_>>()?;
    let addrs: BTreeMap<u64, String> = ports
        .iter()
        .map(|(id, p)| (*id, p.addr().to_string()))
        .collect();
    let initial = addrs
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",");
    let spawn = |id: u64, port: Port| {
        let data_dir = work.path().join(format!("node{id}")).display().to_string();
        let id = id.to_string();
        let args = [
            "--id",
            &id,
            "--data-dir",
            &data_dir,
            "--initial-cluster",
            &initial,
            "--log",
            "info,openraft=warn",
        ];
        Daemon::spawn_on(port, &args, work.path())
    };
    let first = spawn(1, ports.remove(&1).context("node 1's port")?)?;
    let bootstrapped = wait_for("node 1 to bootstrap", Duration::from_secs(60), || async {
        let s = status(&addrs[&1]).await.ok()?;
        (s.members.len() == 3).then_some(s)
    })
    .await
    .with_context(|| first.stderr())?;
    ensure!(
        bootstrapped.cluster_version == 1 && bootstrapped.leader_id == 0,
        "alone, node 1 cannot raise the version yet: {bootstrapped:?}"
    );
    drop(first); // kill -9

    let mut nodes = BTreeMap::new();
    nodes.insert(1, spawn(1, Port::bind_at(&addrs[&1])?)?);
    for (id, port) in std::mem::take(&mut ports) {
        nodes.insert(id, spawn(id, port)?);
    }
    let logs = || {
        nodes
            .values()
            .map(|n| n.stderr())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let all: Vec<String> = addrs.values().cloned().collect();
    wait_for_version(&all, 2).await.with_context(logs)?;
    let node1 = nodes.get(&1).context("node 1")?;
    wait_for(
        "node 1's log line for the new cluster",
        Duration::from_secs(30),
        || async {
            node1
                .stderr()
                .contains("new cluster: it runs at cluster version 2")
                .then_some(())
        },
    )
    .await
    .with_context(logs)?;
    ensure!(
        !logs().contains("the upgrade is final"),
        "a new cluster is not an upgrade: {}",
        logs()
    );
    Ok(())
}

/// The fixtures of a kept release, in the repository.
fn fixtures(release: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(release)
}

/// This build's nodes on the data directories of `fixture`, unpacked in `work`, on new ports
/// (the peers are routed to them, as the directories know the old addresses).
fn start_on_fixture(
    fixture: &Fixture,
    work: &Path,
    secret_args: &[String],
) -> anyhow::Result<(BTreeMap<u64, Daemon>, Vec<String>)> {
    let ports: BTreeMap<u64, Port> = fixture
        .members
        .keys()
        .map(|id| Ok((*id, Port::bind()?)))
        .collect::<anyhow::Result<_>>()?;
    let addrs: BTreeMap<u64, String> = ports
        .iter()
        .map(|(id, p)| (*id, p.addr().to_string()))
        .collect();
    let mut nodes = BTreeMap::new();
    for (id, port) in ports {
        let routes = addrs
            .iter()
            .filter(|(other, _)| **other != id)
            .map(|(other, addr)| format!("{other}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut args: Vec<String> = vec![
            "--id".into(),
            id.to_string(),
            "--data-dir".into(),
            work.join(format!("node{id}")).display().to_string(),
            "--initial-cluster".into(),
            fixture.initial_cluster(),
            // The directories' membership names the fixture's addresses: advertise the old
            // one (so it matches) and reach the peers through their routes.
            "--advertise".into(),
            fixture.members[&id].clone(),
            "--peer-routes".into(),
            routes,
        ];
        args.extend(secret_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        nodes.insert(id, Daemon::spawn_on(port, &args, work)?);
    }
    Ok((nodes, addrs.into_values().collect()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directories_and_a_backup_of_0_1_0_open_with_every_object() -> anyhow::Result<()> {
    use_token(ADMIN_TOKEN)?;
    let dir = fixtures("0.1.0");
    let fixture = Fixture::load(&dir)?;
    ensure!(fixture.release == "0.1.0");
    let work = tempfile::tempdir()?;
    Fixture::unpack(&dir, work.path())?;
    let (secret_args, _) = Fixture::peer_secret_args(work.path(), &fixture.peer_secret)?;
    let (nodes, addrs) = start_on_fixture(&fixture, work.path(), &secret_args)?;
    let logs = || {
        nodes
            .values()
            .map(|n| n.stderr())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    wait_for("a leader", Duration::from_secs(60), || async {
        let s = status(&addrs[0]).await.ok()?;
        (s.leader_id != 0).then_some(())
    })
    .await
    .with_context(logs)?;
    // An upgraded cluster stays at 0.1.0's version (any node could still go back) until the
    // operator finalizes.
    wait_for_version(&addrs, 1).await.with_context(logs)?;
    verify(&addrs[0], &fixture.expected)
        .await
        .with_context(logs)?;

    let mut admin = ConchAdminClient::new(channel(&addrs[1]).await?);
    let done = admin
        .finalize_upgrade(FinalizeUpgradeRequest {})
        .await
        .context("finalize")?
        .into_inner();
    ensure!(
        (done.previous_cluster_version, done.cluster_version) == (1, 2) && done.nodes.len() == 3,
        "{done:?}"
    );
    wait_for_version(&addrs, 2).await.with_context(logs)?;
    for addr in &addrs {
        ensure!(status(addr).await?.data_format == 8);
    }
    drop(nodes);

    // The backup of 0.1.0 restores into a new one-node cluster with every object.
    let port = Port::bind()?;
    let addr = port.addr().to_string();
    let restored = work.path().join("restored");
    let backup = dir.join("backup.conch");
    let out = std::process::Command::new(cluster_tests::binary("conchd"))
        .arg("restore")
        .arg(&backup)
        .arg("--data-dir")
        .arg(&restored)
        .args(["--id", "1", "--initial-cluster", &format!("1={addr}")])
        .output()?;
    ensure!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args: Vec<String> = vec![
        "--id".into(),
        "1".into(),
        "--data-dir".into(),
        restored.display().to_string(),
        "--initial-cluster".into(),
        format!("1={addr}"),
    ];
    args.extend(secret_args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let node = Daemon::spawn_on(port, &args, work.path())?;
    wait_for(
        "the restored node to lead",
        Duration::from_secs(60),
        || async {
            let s = status(&addr).await.ok()?;
            (s.leader_id == 1).then_some(())
        },
    )
    .await
    .with_context(|| node.stderr())?;
    ensure!(
        status(&addr).await?.cluster_version == 1,
        "the backup's version"
    );
    verify(&addr, &fixture.expected)
        .await
        .with_context(|| node.stderr())?;
    Ok(())
}

/// The previous release's conchd, built by `make test-upgrade` (`scripts/release-binaries.sh`).
fn previous_conchd() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("CONCH_PREVIOUS_CONCHD").map(PathBuf::from);
    match path {
        Some(path) if path.is_file() => Ok(path),
        _ => bail!(
            "this test needs the previous release's conchd in CONCH_PREVIOUS_CONCHD: run it with \
             `make test-upgrade`, which builds that release from git (cached under target/)"
        ),
    }
}

/// Acquires and releases in a loop through one node until told to stop; returns its fencing
/// tokens in order and the calls that failed with anything but a stopping node (retried).
async fn load(addr: String, stop: Arc<AtomicBool>) -> anyhow::Result<(Vec<u64>, Vec<String>)> {
    let mut c = GrackleApiClient::new(lazy_channel(&addr)?);
    let sem = format!("load-{}", addr.replace([':', '.'], "-"));
    let mut tokens = Vec::new();
    let mut failures = Vec::new();
    let mut lease = None;
    while !stop.load(Ordering::Relaxed) {
        let step = async {
            if lease.is_none() {
                let r = c
                    .create_semaphore_lease(pb::CreateSemaphoreLeaseRequest {
                        namespace_name: "load".into(),
                        process_id: sem.clone(),
                        ttl_seconds: 60,
                        metadata: Default::default(),
                    })
                    .await?
                    .into_inner();
                lease = r.lease.map(|l| l.lease_id);
            }
            let lease_id = lease.clone().unwrap_or_default();
            let r = c
                .acquire_semaphore(pb::AcquireSemaphoreRequest {
                    namespace_name: "load".into(),
                    semaphore_name: sem.clone(),
                    lease_id: lease_id.clone(),
                    weight: 1,
                    timeout_seconds: 5,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if r.outcome == pb::AcquireOutcome::Acquired as i32 {
                tokens.push(r.fencing_token);
                c.release_semaphore(pb::ReleaseSemaphoreRequest {
                    namespace_name: "load".into(),
                    semaphore_name: sem.clone(),
                    lease_id,
                })
                .await?;
            }
            Ok::<(), tonic::Status>(())
        };
        match step.await {
            Ok(()) => {}
            // A node that stops answers UNAVAILABLE, or breaks the connection under a call
            // (a status tonic makes itself, with a transport error as its source): retried,
            // as the client library does.
            Err(s)
                if s.code() == tonic::Code::Unavailable
                    || (matches!(s.code(), tonic::Code::Cancelled | tonic::Code::Unknown)
                        && std::error::Error::source(&s).is_some()) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => failures.push(format!("{:?}: {}", s.code(), s.message())),
        }
    }
    Ok((tokens, failures))
}

/// Waits until node `id` runs `release` and has applied what the leader had committed when
/// the wait began.
async fn caught_up(cluster: &Cluster, id: u64, release: &str) -> anyhow::Result<()> {
    let addr = cluster.addr(id);
    let target = wait_for("a leader's commit index", Duration::from_secs(60), || {
        let cluster = &cluster;
        async move {
            let leader = cluster.leader().await?;
            status(&cluster.addr(leader))
                .await
                .ok()
                .map(|s| s.commit_index)
        }
    })
    .await?;
    wait_for(
        &format!("node {id} on {release}, caught up to {target}"),
        Duration::from_secs(60),
        || async {
            let s = status(&addr).await.ok()?;
            let runs = if s.release.is_empty() {
                "0.1.0"
            } else {
                s.release.as_str()
            };
            (runs == release && s.applied_index >= target && s.leader_id != 0).then_some(())
        },
    )
    .await
    .with_context(|| cluster.logs_tail())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_of_the_previous_release_upgrades_node_by_node_under_load_and_steps_back()
-> anyhow::Result<()> {
    let previous = previous_conchd()?;
    use_token(ADMIN_TOKEN)?;
    let secrets = tempfile::tempdir()?;
    let (args, _) = Fixture::secret_args(secrets.path())?;
    let mut cluster = Cluster::launch_binary(3, &args, &previous).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await?;
    cluster_tests::auth::wait_until_on(&cluster, Duration::from_secs(60)).await?;
    let (expected, waiting) = populate(&cluster.addr(leader)).await?;
    let mut g = GrackleApiClient::new(channel(&cluster.addr(leader)).await?);
    g.create_namespace(pb::CreateNamespaceRequest {
        name: "load".into(),
        ..Default::default()
    })
    .await?;
    for id in cluster.ids() {
        let sem = format!("load-{}", cluster.addr(id).replace([':', '.'], "-"));
        g.create_semaphore(pb::CreateSemaphoreRequest {
            namespace_name: "load".into(),
            semaphore_name: sem,
            permits: 1,
            ..Default::default()
        })
        .await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = cluster
        .ids()
        .into_iter()
        .map(|id| tokio::spawn(load(cluster.addr(id), Arc::clone(&stop))))
        .collect();

    // Node by node: SIGTERM, this build on the same directory and flags, caught up.
    for id in cluster.ids() {
        cluster.stop(id, Duration::from_secs(30)).await?;
        cluster.set_binary(id, None);
        cluster.start_node(id)?;
        caught_up(&cluster, id, RELEASE).await?;
        if id == 2 {
            // Mixed: finalizing is refused, naming the node still on the previous release.
            let mut admin = ConchAdminClient::new(channel(&cluster.addr(1)).await?);
            let refused = admin
                .finalize_upgrade(FinalizeUpgradeRequest {})
                .await
                .err()
                .context("finalize with a node of the previous release")?;
            ensure!(
                refused.code() == tonic::Code::FailedPrecondition
                    && refused.message().contains("node 3 runs conch 0.1.0"),
                "{refused:?}"
            );
        }
    }
    for addr in cluster.endpoints() {
        ensure!(
            status(&addr).await?.cluster_version == 1,
            "not finalized yet"
        );
    }
    // A step back before finalizing: node 2 on the previous release, then forward again.
    cluster.stop(2, Duration::from_secs(30)).await?;
    cluster.set_binary(2, Some(previous.clone()));
    cluster.start_node(2)?;
    caught_up(&cluster, 2, "0.1.0").await?;
    cluster.stop(2, Duration::from_secs(30)).await?;
    cluster.set_binary(2, None);
    cluster.start_node(2)?;
    caught_up(&cluster, 2, RELEASE).await?;

    let mut admin = ConchAdminClient::new(channel(&cluster.addr(3)).await?);
    let done = admin
        .finalize_upgrade(FinalizeUpgradeRequest {})
        .await?
        .into_inner();
    ensure!(done.cluster_version == 2, "{done:?}");
    wait_for_version(&cluster.endpoints(), 2).await?;

    stop.store(true, Ordering::Relaxed);
    let mut all_tokens = Vec::new();
    for client in clients {
        let (tokens, failures) = client.await??;
        ensure!(failures.is_empty(), "calls failed: {failures:?}");
        ensure!(!tokens.is_empty(), "a client made no progress");
        ensure!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens of one client not increasing: {tokens:?}"
        );
        all_tokens.extend(tokens);
    }
    let count = all_tokens.len();
    all_tokens.sort_unstable();
    all_tokens.dedup();
    ensure!(
        all_tokens.len() == count,
        "a fencing token was handed out twice"
    );
    verify(&cluster.addr(1), &expected).await?;
    waiting.abort();

    // After finalizing, the previous release refuses the directories in one line.
    cluster.stop(3, Duration::from_secs(30)).await?;
    let node3 = cluster.nodes.get(&3).context("node 3")?;
    // Run under tokio with kill-on-drop: a release that started serving instead of refusing
    // fails the test at the deadline and is not left running.
    let run = tokio::process::Command::new(&previous)
        .args(["--id", "3", "--data-dir"])
        .arg(&node3.data_dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .context("the previous release kept running on a finalized directory")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("a newer conch data format (8)"),
        "the previous release on a finalized directory: {stderr}"
    );
    Ok(())
}

//! Prometheus metrics of a live 3-node cluster: the counters move as the operations did, the
//! gauges agree with the state, and every metric the shipped alerts and dashboard use is
//! exported.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cluster_tests::scrape::{Scrape, scrape};
use cluster_tests::{Cluster, STEADY_LEADER, ops, wait_for};

const GRACKLE: &str = "/com.evrblk.grackle.v1beta.GrackleApi/";

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Sum of the series of `name` whose labels contain every one of `labels` (`key="value"`).
fn sum(s: &Scrape, name: &str, labels: &[&str]) -> f64 {
    s.series
        .iter()
        .filter(|(series, _)| {
            series
                .strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
                && labels.iter().all(|l| series.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

async fn scrape_node(cluster: &Cluster, id: u64) -> anyhow::Result<Scrape> {
    let addr = cluster
        .metrics_addr(id)
        .with_context(|| format!("node {id} printed no metrics address"))?;
    scrape(&addr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_as_the_operations_did() -> anyhow::Result<()> {
    // What each node counts depends on who leads: one leader through the test.
    let cluster = Cluster::start_with(3, &STEADY_LEADER).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("a follower")?;
    let before = scrape_node(&cluster, follower).await?;

    // Through the follower: every write is forwarded.
    let mut c = cluster.grackle(follower).await?;
    ops::namespace(&mut c, "m").await?;
    ops::semaphore(&mut c, "m", "s", 1).await?;
    ops::semaphore(&mut c, "m", "t", 1).await?;
    let a = ops::lease(&mut c, "m", 60).await?;
    let b = ops::lease(&mut c, "m", 60).await?;
    anyhow::ensure!(ops::acquired(
        &ops::acquire(&mut c, "m", "s", &a, 1, 0).await?
    ));
    // The 1 s lease takes its slot right after it is created, before it can expire.
    let short = ops::lease(&mut c, "m", 1).await?;
    anyhow::ensure!(ops::acquired(
        &ops::acquire(&mut c, "m", "t", &short, 1, 0).await?
    ));
    // B queues behind A, then gets the permit when A releases.
    let mut waiting = cluster.grackle(follower).await?;
    let b_wait = b.clone();
    let queued =
        tokio::spawn(async move { ops::acquire(&mut waiting, "m", "s", &b_wait, 1, 30).await });
    wait_for("B in the queue", Duration::from_secs(10), || async {
        let s = scrape_node(&cluster, follower).await.ok()?;
        (s.value("conch_waiters") == 1.0).then_some(())
    })
    .await?;
    ops::release(&mut c, "m", "s", &a).await?;
    let granted = queued.await??;
    anyhow::ensure!(ops::acquired(&granted), "B was granted: {granted:?}");
    // A call that fails: its code is counted.
    let missing = ops::acquire(&mut c, "m", "absent", &a, 1, 0).await;
    anyhow::ensure!(
        missing.as_ref().err().map(tonic::Status::code) == Some(tonic::Code::NotFound),
        "{missing:?}"
    );

    // Every node applies the same: 3 grants, the 1 s lease expires (nobody refreshes it).
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let ids = cluster.ids();
    let scrapes = wait_for(
        "every node to count 3 grants and 1 expiration",
        Duration::from_secs(20),
        || async {
            let mut all = Vec::new();
            for id in &ids {
                let s = scrape_node(&cluster, *id).await.ok()?;
                // The counters and the gauges are read from two places (what applying counted,
                // the applied state): wait until one scrape shows both after the expiry.
                if s.value("conch_grants_total") != 3.0
                    || s.value("conch_lease_expirations_total") != 1.0
                    || s.value("conch_leases") != 2.0
                    // The leader keeps writing (its lease clock ticks): wait for a scrape taken
                    // between an append and the next one.
                    || s.value("conch_raft_applied_index") != s.value("conch_raft_last_log_index")
                {
                    return None;
                }
                all.push((*id, s));
            }
            Some(all)
        },
    )
    .await?;

    for (id, s) in &scrapes {
        let is_leader = *id == leader;
        assert_eq!(
            s.value("conch_raft_is_leader"),
            f64::from(u8::from(is_leader)),
            "node {id}"
        );
        assert_eq!(s.value("conch_raft_leader_id"), leader as f64, "node {id}");
        assert!(s.value("conch_raft_term") >= 1.0, "node {id}");
        assert!(
            s.value("conch_raft_leader_changes_total") >= 1.0,
            "node {id}"
        );
        assert_eq!(s.value("conch_raft_voters"), 3.0, "node {id}");
        assert_eq!(s.value("conch_namespaces"), 1.0, "node {id}");
        assert_eq!(s.value("conch_semaphores"), 2.0, "node {id}");
        assert_eq!(
            s.value("conch_leases"),
            2.0,
            "node {id}: A and B, the short one expired"
        );
        assert_eq!(s.value("conch_holders"), 1.0, "node {id}: B");
        assert_eq!(s.value("conch_waiters"), 0.0, "node {id}");
        assert_eq!(
            s.value("conch_wait_to_grant_seconds_count"),
            1.0,
            "node {id}: B's wait"
        );
        assert!(
            s.value("conch_log_append_duration_seconds_count") > 0.0,
            "node {id}"
        );
        assert!(
            s.value("conch_log_fsync_duration_seconds_count") > 0.0,
            "node {id}"
        );
        assert_eq!(
            s.value("conch_raft_applied_index"),
            s.value("conch_raft_last_log_index"),
            "node {id}: nothing left to apply"
        );
        assert_eq!(s.value("conch_raft_apply_lag_entries"), 0.0, "node {id}");
        assert!(s.value("conch_raft_committed_index") >= 1.0, "node {id}");
        assert!(s.value("process_resident_memory_bytes") > 0.0, "node {id}");
        assert!(s.value("process_open_fds") > 0.0, "node {id}");
        if is_leader {
            assert!(s.value("conch_raft_proposals_total") >= 1.0);
            assert!(s.value("conch_raft_proposed_commands_total") >= 10.0);
            assert!(s.value("conch_raft_commands_per_entry_count") >= 1.0);
        } else {
            assert_eq!(
                s.value("conch_raft_proposals_total"),
                0.0,
                "a follower proposes nothing"
            );
        }
    }

    let after = &scrapes
        .iter()
        .find(|(id, _)| *id == follower)
        .context("the follower's scrape")?
        .1;
    let calls = |s: &Scrape, method: &str, code: &str| {
        sum(
            s,
            "conch_grpc_requests_total",
            &[
                &format!("method=\"{GRACKLE}{method}\""),
                &format!("code=\"{code}\""),
            ],
        )
    };
    assert_eq!(
        calls(after, "CreateSemaphoreLease", "OK") - calls(&before, "CreateSemaphoreLease", "OK"),
        3.0
    );
    assert_eq!(
        calls(after, "AcquireSemaphore", "OK") - calls(&before, "AcquireSemaphore", "OK"),
        3.0
    );
    assert_eq!(calls(after, "AcquireSemaphore", "NOT_FOUND"), 1.0);
    assert!(
        sum(
            after,
            "conch_grpc_request_duration_seconds_count",
            &[&format!("method=\"{GRACKLE}AcquireSemaphore\"")]
        ) >= 4.0
    );
    // 3 creates of namespace/semaphores, 3 leases, 3 acquires, 1 release, the failed acquire.
    let forwarded = sum(after, "conch_forwarded_total", &["kind=\"write\""])
        - sum(&before, "conch_forwarded_total", &["kind=\"write\""]);
    assert!(forwarded >= 11.0, "forwarded writes: {forwarded}");
    // They all went to the leader on the follower's forward stream: the leader counts its
    // opening (and at most the other follower's), and no unary Propose.
    let on_leader = &scrapes
        .iter()
        .find(|(id, _)| *id == leader)
        .context("the leader's scrape")?
        .1;
    let peer_calls = |method: &str| {
        sum(
            on_leader,
            "conch_grpc_requests_total",
            &[&format!("method=\"/conch.v1.ConchPeer/{method}\"")],
        )
    };
    let streams = peer_calls("ProposeStream");
    assert!(
        (1.0..=2.0).contains(&streams),
        "forward streams opened to the leader: {streams}"
    );
    assert_eq!(peer_calls("Propose"), 0.0, "unary forwards");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_use_only_exported_metrics() -> anyhow::Result<()> {
    let alerts = repo_file("deploy/prometheus/alerts.yml");
    let promtool = repo_file("target/test-tools/promtool");
    let checked = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&alerts)
        .output()
        .with_context(|| {
            format!(
                "run {} (scripts/install-test-deps.sh unpacks it; make test runs that)",
                promtool.display()
            )
        })?;
    assert!(
        checked.status.success(),
        "promtool check rules: {checked:?}"
    );

    // Every series a rule or panel names must be exported by some node of a cluster that has
    // served a call, forwarded one and built nothing else special.
    let cluster = Cluster::start(3).await?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    for id in cluster.ids() {
        let mut c = cluster.grackle(id).await?;
        ops::namespace(&mut c, &format!("n{id}")).await?;
    }
    let mut exported = Scrape::default();
    for id in cluster.ids() {
        exported
            .series
            .extend(scrape_node(&cluster, id).await?.series);
    }
    let mut used = BTreeSet::new();
    for file in [alerts, repo_file("deploy/grafana/conch.json")] {
        let text = std::fs::read_to_string(&file)?;
        used.extend(metric_names(&text));
    }
    assert!(used.len() >= 15, "found only {used:?}");
    for name in &used {
        assert!(
            exported.has_metric(name) || name == "up",
            "{name} is used by the alerts or dashboard but not exported"
        );
    }
    Ok(())
}

/// Names of conch and process metrics mentioned in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    for prefix in ["conch_", "process_"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix) {
            let start = from + at;
            let preceded_by_word = start > 0 && {
                let c = bytes[start - 1];
                c.is_ascii_alphanumeric() || c == b'_'
            };
            let end = text[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(text.len(), |n| start + n);
            if !preceded_by_word {
                names.insert(text[start..end].to_string());
            }
            from = end;
        }
    }
    names
}

/// A client port whose port + 100 (the default metrics port) is free now.
fn port_with_free_metrics_port() -> anyhow::Result<(cluster_tests::Port, u16)> {
    for _ in 0..100 {
        let port = cluster_tests::Port::bind()?;
        let client: u16 = port
            .addr()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("a port number")?;
        let Some(metrics) = client.checked_add(100) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", metrics)).is_ok() {
            return Ok((port, metrics));
        }
    }
    anyhow::bail!("no client port with a free port 100 above it in 100 tries")
}

/// Two nodes on one host, started with no metrics flag, both serve /metrics: the default
/// metrics address follows each node's client port (+100) instead of one fixed port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_on_one_host_get_their_own_default_metrics_ports() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut nodes = Vec::new();
    for name in ["a", "b"] {
        let (port, metrics) = port_with_free_metrics_port()?;
        let data = dir.path().join(name).display().to_string();
        let daemon = cluster_tests::Daemon::spawn_on_with_default_metrics(
            port,
            &["--data-dir", &data],
            dir.path(),
        )?;
        nodes.push((daemon, format!("127.0.0.1:{metrics}")));
    }
    for (daemon, metrics) in &mut nodes {
        let line = format!("metrics on http://{metrics}/metrics");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !daemon.stdout().contains(&line) {
            anyhow::ensure!(
                !daemon.has_exited(),
                "the node on {metrics} exited: {}",
                daemon.stderr()
            );
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no {line:?} within 20 s: {}",
                daemon.stdout()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let scraped = scrape(metrics).await?;
        anyhow::ensure!(
            scraped.has_metric("conch_raft_term"),
            "{metrics} serves conch's metrics"
        );
    }
    Ok(())
}

//! conchd as a user starts it: defaults, clean shutdown, and startup errors.

use std::time::Duration;

use cluster_tests::{Daemon, Port, channel, ops, wait_for};
use conch_proto::conch::TriggerSnapshotRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use nix::sys::signal::Signal;

async fn serving(addr: &str) -> anyhow::Result<GrackleApiClient<cluster_tests::net::NodeChannel>> {
    let channel = wait_for(
        "conchd to accept connections",
        Duration::from_secs(20),
        || async { channel(addr).await.ok() },
    )
    .await?;
    Ok(GrackleApiClient::new(channel))
}

/// Writes until the single node has elected itself and accepts the write.
async fn create_namespace_when_ready(
    client: &mut GrackleApiClient<cluster_tests::net::NodeChannel>,
    name: &str,
) -> anyhow::Result<()> {
    wait_for("the node to accept writes", Duration::from_secs(20), || {
        let mut client = client.clone();
        async move {
            match ops::namespace(&mut client, name).await {
                Ok(_) => Some(()),
                Err(status) if status.code() == tonic::Code::AlreadyExists => Some(()),
                Err(_) => None,
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conchd_without_cluster_flags_runs_one_node_with_data_in_the_working_directory()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = Port::bind()?;
    let addr = port.addr().to_string();
    let mut daemon = Daemon::spawn_on(port, &[], dir.path())?;
    let mut client = serving(&addr).await?;
    create_namespace_when_ready(&mut client, "hello").await?;

    let stdout = daemon.stdout();
    assert!(stdout.contains(&format!("listening on {addr}")), "{stdout}");
    let data_dir = std::fs::canonicalize(dir.path())?.join("conch-data");
    assert!(stdout.contains(&data_dir.display().to_string()), "{stdout}");
    assert!(data_dir.join("raft").is_dir());

    daemon.signal(Signal::SIGTERM);
    assert_eq!(
        daemon.wait_exit(Duration::from_secs(20)).await?,
        Some(0),
        "{}",
        daemon.stderr()
    );

    // Restarted from the same directory (and address), it still has the namespace.
    let mut daemon = Daemon::spawn_on(Port::bind_at(&addr)?, &[], dir.path())?;
    let client = serving(&addr).await?;
    let found = wait_for(
        "the namespace after restart",
        Duration::from_secs(20),
        || {
            let mut client = client.clone();
            async move {
                client
                    .get_namespace(conch_proto::grackle::GetNamespaceRequest {
                        namespace_name: "hello".into(),
                    })
                    .await
                    .ok()
            }
        },
    )
    .await?;
    assert_eq!(
        found.into_inner().namespace.unwrap_or_default().name,
        "hello"
    );
    daemon.signal(Signal::SIGINT);
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_fails_with_one_clear_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
    let code = daemon.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(code, Some(1));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("listen on {addr}")), "{stderr}");
    assert!(
        stderr.contains("already in use"),
        "says what is wrong: {stderr}"
    );
    assert_eq!(
        stderr.matches("in use").count(),
        1,
        "the cause is said once: {stderr}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_that_is_a_file_fails_with_one_clear_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x")?;
    let file_arg = file.display().to_string();
    let mut daemon = Daemon::spawn(
        &["--listen", "127.0.0.1:0", "--data-dir", &file_arg],
        dir.path(),
    )?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(1));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&file_arg), "names the path: {stderr}");
    assert!(stderr.contains("is a file, not a directory"), "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_exit_64() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut daemon = Daemon::spawn(&["--id", "abc"], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--id"), "names the flag: {stderr}");
    // A bad value from the environment names the variable it came from.
    let mut daemon = Daemon::spawn_with_env(&[], dir.path(), &[("CONCH_ID", "x")])?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("set by the environment variable CONCH_ID"),
        "names the variable: {stderr}"
    );
    // So does a value the configuration refuses after parsing it.
    let mut daemon =
        Daemon::spawn_with_env(&[], dir.path(), &[("CONCH_ADVERTISE", "0.0.0.0:7001")])?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("(set by the environment variable CONCH_ADVERTISE)"),
        "names the variable: {stderr}"
    );
    let mut daemon = Daemon::spawn(&["--no-such-flag"], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--no-such-flag"),
        "names the flag: {stderr}"
    );
    let mut daemon = Daemon::spawn(
        &["--initial-cluster", "1=127.0.0.1:1,1=127.0.0.1:2"],
        dir.path(),
    )?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    assert!(
        daemon.stderr().contains("names node 1 twice"),
        "{}",
        daemon.stderr()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_snapshot_refuses_to_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = Port::bind()?;
    let addr = port.addr().to_string();
    let mut daemon = Daemon::spawn_on(port, &[], dir.path())?;
    let mut client = serving(&addr).await?;
    create_namespace_when_ready(&mut client, "snap").await?;
    let mut admin = ConchAdminClient::new(channel(&addr).await?);
    admin
        .trigger_snapshot(TriggerSnapshotRequest::default())
        .await?;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(0));

    let snapshots = dir.path().join("conch-data").join("snapshots");
    let mut corrupted = 0;
    for entry in std::fs::read_dir(&snapshots)? {
        let path = entry?.path();
        let mut bytes = std::fs::read(&path)?;
        if bytes.len() > 40 {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xff;
            std::fs::write(&path, bytes)?;
            corrupted += 1;
        }
    }
    assert!(corrupted > 0, "no snapshot file in {}", snapshots.display());

    let mut daemon = Daemon::spawn_on(Port::bind()?, &[], dir.path())?;
    let code = daemon.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(code, Some(1));
    let stderr = daemon.stderr();
    assert!(stderr.contains("snapshot"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_raft_log_refuses_to_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let port = Port::bind()?;
    let addr = port.addr().to_string();
    let mut daemon = Daemon::spawn_on(port, &[], dir.path())?;
    let mut client = serving(&addr).await?;
    create_namespace_when_ready(&mut client, "kept").await?;
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(0));

    // Damage sled's data file throughout: its recovery drops what follows the first damage.
    let db = dir.path().join("conch-data").join("raft").join("db");
    let mut bytes = std::fs::read(&db)?;
    for offset in (100..bytes.len()).step_by(997) {
        bytes[offset] ^= 0x5a;
    }
    std::fs::write(&db, bytes)?;
    let mut daemon = Daemon::spawn_on(Port::bind()?, &[], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(1));
    let stderr = daemon.stderr();
    assert!(
        stderr.contains("raft log") && stderr.contains("corrupt"),
        "{stderr}"
    );

    // The log directory gone altogether: refused too, never a fresh empty node.
    std::fs::remove_dir_all(dir.path().join("conch-data").join("raft"))?;
    let mut daemon = Daemon::spawn_on(Port::bind()?, &[], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(1));
    assert!(daemon.stderr().contains("lost data"), "{}", daemon.stderr());
    Ok(())
}

/// Server reflection answers in both protocol versions (older grpcurl, Postman, evans and many IDE
/// plugins only speak v1alpha) and lists every API service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_v1_and_v1alpha() -> anyhow::Result<()> {
    use tonic_reflection::pb::{v1, v1alpha};
    let dir = tempfile::tempdir()?;
    let port = Port::bind()?;
    let addr = port.addr().to_string();
    let mut daemon = Daemon::spawn_on(port, &[], dir.path())?;
    serving(&addr).await?;
    let expected = [
        "com.evrblk.grackle.v1beta.GrackleApi",
        "conch.v1.ConchApi",
        "conch.v1.ConchAdmin",
        "grpc.health.v1.Health",
    ];

    let mut client =
        v1::server_reflection_client::ServerReflectionClient::new(channel(&addr).await?);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut replies = client
        .server_reflection_info(futures::stream::iter([request]))
        .await?
        .into_inner();
    let reply = replies
        .message()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no v1 reply"))?;
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        anyhow::bail!("v1: unexpected reply {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in expected {
        assert!(names.iter().any(|n| n == service), "v1 lists {names:?}");
    }

    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(channel(&addr).await?);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut replies = client
        .server_reflection_info(futures::stream::iter([request]))
        .await?
        .into_inner();
    let reply = replies
        .message()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no v1alpha reply"))?;
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        anyhow::bail!("v1alpha: unexpected reply {reply:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for service in expected {
        assert!(
            names.iter().any(|n| n == service),
            "v1alpha lists {names:?}"
        );
    }

    daemon.signal(Signal::SIGTERM);
    daemon.wait_exit(Duration::from_secs(20)).await?;
    Ok(())
}

/// `conchd --version` and `conch --version` name the version and the commit they were built from.
#[test]
fn versions_name_the_commit() -> anyhow::Result<()> {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    for program in ["conchd", "conch"] {
        let out = std::process::Command::new(cluster_tests::binary(program))
            .arg("--version")
            .output()?;
        assert!(out.status.success(), "{program} --version: {out:?}");
        let line = String::from_utf8(out.stdout)?;
        let expected_start = format!("{program} {} (commit ", env!("CARGO_PKG_VERSION"));
        // The first line names the release and commit (conchd adds its data format and
        // cluster version on the next).
        let first = line.lines().next().unwrap_or_default();
        let commit = first
            .trim()
            .strip_prefix(&expected_start)
            .and_then(|rest| rest.strip_suffix(')'))
            .ok_or_else(|| anyhow::anyhow!("{program} --version printed {line:?}"))?;
        match &head {
            Some(head) => assert_eq!(commit, head, "{program} --version: {line:?}"),
            None => assert!(!commit.is_empty(), "{program} --version: {line:?}"),
        }
    }
    Ok(())
}

/// Socket activation: the ports a service manager (here the test) bound are served, named by
/// `LISTEN_FDNAMES`, and the client port is the advertised address; `--listen` is not needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_sockets_are_served_and_the_client_one_is_advertised() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (client, metrics) = (Port::bind()?, Port::bind()?);
    let (addr, metrics_addr) = (client.addr().to_string(), metrics.addr().to_string());
    // Named out of order: the names decide, not the positions.
    let mut daemon = Daemon::spawn_with(
        &[],
        dir.path(),
        &[],
        vec![("metrics", metrics), ("client", client)],
    )?;
    let mut grackle = serving(&addr).await?;
    create_namespace_when_ready(&mut grackle, "activated").await?;
    let stdout = daemon.stdout();
    assert!(stdout.contains(&format!("listening on {addr}")), "{stdout}");
    assert!(
        stdout.contains(&format!("metrics on http://{metrics_addr}/metrics")),
        "{stdout}"
    );
    let mut admin = ConchAdminClient::new(channel(&addr).await?);
    let status = admin
        .cluster_status(conch_proto::conch::ClusterStatusRequest::default())
        .await?
        .into_inner();
    let addrs: Vec<&str> = status.members.iter().map(|m| m.addr.as_str()).collect();
    assert_eq!(addrs, [addr.as_str()], "{status:?}");
    let scraped = cluster_tests::scrape::scrape(&metrics_addr).await?;
    assert!(
        scraped.has_metric("conch_raft_committed_index"),
        "metrics on the passed port"
    );
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(0));
    Ok(())
}

/// Sockets that cannot be used are refused before anything starts, with exit 64 and a line
/// naming what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_passed_sockets_exit_64_naming_the_problem() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Meant for another process (the variables leaked from a parent).
    let mut daemon = Daemon::spawn_with_env(
        &["--listen", "127.0.0.1:0"],
        dir.path(),
        &[("LISTEN_FDS", "1"), ("LISTEN_PID", "1")],
    )?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    let stderr = daemon.stderr();
    assert!(
        stderr.contains("LISTEN_PID=\"1\" is not this process"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    // A name conchd does not know beside one it does (names that are all unknown, like
    // systemd's default of the unit's name, mean "by order").
    let sockets = vec![("client", Port::bind()?), ("admin", Port::bind()?)];
    let mut daemon = Daemon::spawn_with(&[], dir.path(), &[], sockets)?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
    let stderr = daemon.stderr();
    assert!(stderr.contains("socket name \"admin\""), "{stderr}");
    assert!(
        !dir.path().join("conch-data").exists(),
        "nothing was opened"
    );
    Ok(())
}

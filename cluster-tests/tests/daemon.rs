//! conchd as a user starts it: defaults, clean shutdown, and startup errors.

use std::time::Duration;

use cluster_tests::{Daemon, channel, free_port, ops, wait_for};
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
    let addr = format!("127.0.0.1:{}", free_port());
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
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

    // Restarted from the same directory, it still has the namespace.
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
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
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_exit_64() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut daemon = Daemon::spawn(&["--id", "abc"], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(64));
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
    let addr = format!("127.0.0.1:{}", free_port());
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
    let mut client = serving(&addr).await?;
    create_namespace_when_ready(&mut client, "snap").await?;
    let mut admin = ConchAdminClient::new(channel(&addr).await?);
    admin.trigger_snapshot(TriggerSnapshotRequest {}).await?;
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

    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
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
    let addr = format!("127.0.0.1:{}", free_port());
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
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
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(1));
    let stderr = daemon.stderr();
    assert!(
        stderr.contains("raft log") && stderr.contains("corrupt"),
        "{stderr}"
    );

    // The log directory gone altogether: refused too, never a fresh empty node.
    std::fs::remove_dir_all(dir.path().join("conch-data").join("raft"))?;
    let mut daemon = Daemon::spawn(&["--listen", &addr], dir.path())?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(1));
    assert!(daemon.stderr().contains("lost data"), "{}", daemon.stderr());
    Ok(())
}

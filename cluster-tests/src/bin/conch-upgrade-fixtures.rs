//! conch-upgrade-fixtures: writes the data of a release for later releases to open.
//!
//! Runs a 3-node cluster of the given conchd (a kept release, built by
//! `scripts/release-binaries.sh`) with access control on, writes state of every kind into it
//! (`cluster_tests::upgrade::populate`), takes a backup, stops the nodes with SIGTERM while a
//! blocking acquire still waits, and packs into `--out`:
//! - `data.tar.gz`: the three data directories (`node1`…`node3`), sparse files kept sparse
//! - `backup.conch`: the backup
//! - `fixture.json`: the members' addresses, the peer secret and what the state holds
//!
//! `scripts/upgrade-fixtures.sh` runs it for the previous release; the test that opens the
//! fixtures is `cluster-tests/tests/it/upgrade.rs`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, ensure};
use clap::Parser;
use conch_proto::conch::BackupRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;

use cluster_tests::Cluster;
use cluster_tests::net::{channel, use_token};
use cluster_tests::upgrade::{ADMIN_TOKEN, Fixture, populate};

/// Writes upgrade fixtures from a cluster of a kept release.
#[derive(Parser, Debug)]
#[command(name = "conch-upgrade-fixtures")]
struct Cli {
    /// The conchd binary of the release that writes the fixtures.
    #[arg(long)]
    conchd: PathBuf,
    /// The release it is (recorded in fixture.json).
    #[arg(long)]
    release: String,
    /// Where to write the fixtures (created).
    #[arg(long)]
    out: PathBuf,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conch-upgrade-fixtures: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    use_token(ADMIN_TOKEN)?;
    std::fs::create_dir_all(&cli.out).with_context(|| format!("create {}", cli.out.display()))?;
    let secrets = tempfile::tempdir()?;
    let (args, peer_secret) = Fixture::secret_args(secrets.path())?;
    let mut cluster = Cluster::launch_binary(3, &args, &cli.conchd).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await?;
    cluster_tests::auth::wait_until_on(&cluster, Duration::from_secs(60)).await?;
    let (expected, waiting) = populate(&cluster.addr(leader)).await?;

    let mut admin = ConchAdminClient::new(channel(&cluster.addr(leader)).await?);
    let mut stream = admin.backup(BackupRequest {}).await?.into_inner();
    let mut backup = Vec::new();
    while let Some(chunk) = stream.message().await? {
        backup.extend_from_slice(&chunk.data);
    }
    std::fs::write(cli.out.join("backup.conch"), &backup)?;

    for id in cluster.ids() {
        let status = cluster.stop(id, Duration::from_secs(30)).await?;
        ensure!(status.success(), "node {id} stopped with {status}");
    }
    waiting.abort();
    let fixture = Fixture {
        release: cli.release.clone(),
        members: cluster
            .ids()
            .into_iter()
            .map(|id| (id, cluster.addr(id)))
            .collect(),
        peer_secret,
        expected,
    };
    std::fs::write(
        cli.out.join("fixture.json"),
        serde_json::to_string_pretty(&fixture)? + "\n",
    )?;
    let tar = std::process::Command::new("tar")
        .arg("--sparse")
        .arg("-czf")
        .arg(cli.out.join("data.tar.gz"))
        .arg("-C")
        .arg(cluster.dir())
        .args(["node1", "node2", "node3"])
        .status()
        .context("run tar")?;
    ensure!(tar.success(), "tar: {tar}");
    println!(
        "fixtures of conch {} in {} ({} bytes of backup)",
        cli.release,
        cli.out.display(),
        backup.len()
    );
    Ok(())
}

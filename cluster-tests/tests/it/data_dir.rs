//! A data directory belongs to one node of one cluster, and one conchd uses it at a time: each
//! refusal is one line on stderr and exit 64, and leaves the directory as it was.

use std::path::Path;
use std::time::Duration;

use cluster_tests::{Cluster, Daemon, Port, wait_for};
use nix::sys::signal::Signal;

const LONG: Duration = Duration::from_secs(20);

/// `conchd --id <id> --data-dir <dir>` on a port of its own, with `extra` flags.
fn spawn_on(dir: &Path, cwd: &Path, id: u64, extra: &[&str]) -> anyhow::Result<Daemon> {
    let dir = dir.display().to_string();
    let id = id.to_string();
    let mut args = vec!["--id", &id, "--data-dir", &dir];
    args.extend_from_slice(extra);
    Daemon::spawn_on(Port::bind()?, &args, cwd)
}

/// Waits until the daemon has opened its directory and serves (its startup line).
async fn serving(daemon: &mut Daemon) -> anyhow::Result<()> {
    wait_for("conchd to serve", LONG, || {
        let started = daemon.stdout().contains("listening on");
        async move { started.then_some(()) }
    })
    .await?;
    anyhow::ensure!(!daemon.has_exited(), "conchd exited: {}", daemon.stderr());
    Ok(())
}

/// Waits for the daemon to exit 64 and returns its single stderr line.
async fn refused(daemon: &mut Daemon) -> anyhow::Result<String> {
    let code = daemon.wait_exit(LONG).await?;
    let stderr = daemon.stderr();
    anyhow::ensure!(code == Some(64), "exit {code:?}: {stderr}");
    anyhow::ensure!(stderr.trim().lines().count() == 1, "not one line: {stderr}");
    Ok(stderr.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_id_on_a_node_s_directory_is_refused() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let node1_dir = cluster.nodes[&1].data_dir.clone();
    cluster.kill(1);
    let listing = |dir: &Path| -> anyhow::Result<Vec<(String, u64)>> {
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "LOCK" {
                entries.push((name, entry.metadata()?.len()));
            }
        }
        entries.sort();
        Ok(entries)
    };
    let before = listing(&node1_dir)?;

    let mut wrong = spawn_on(&node1_dir, cluster.dir(), 2, &[])?;
    let line = refused(&mut wrong).await?;
    assert_eq!(
        line,
        format!(
            "conchd: data directory {} belongs to node 1, not --id 2 (start node 1 on it, or \
             give node 2 its own --data-dir)",
            node1_dir.display()
        )
    );
    assert_eq!(listing(&node1_dir)?, before, "the directory changed");

    // Node 1 itself starts on it again and rejoins.
    cluster.restart(1)?;
    cluster.wait_for_leader(LONG).await?;
    Ok(())
}

/// Stops node 1 and copies its data directory as `cp -a` would (its `LOCK` left out, as a copy
/// of a stopped node's directory has none held): the copy's path.
fn copy_of_stopped_node_1(cluster: &mut Cluster) -> anyhow::Result<std::path::PathBuf> {
    let node1_dir = cluster.nodes[&1].data_dir.clone();
    cluster.kill(1);
    let copy = cluster.dir().join("copy-of-node-1");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&node1_dir)
        .arg(&copy)
        .status()?;
    anyhow::ensure!(status.success(), "cp -a: {status}");
    let _ = std::fs::remove_file(copy.join("LOCK"));
    Ok(copy)
}

/// A copy of node 1's directory with its `node-id` removed, started as node 3, is refused
/// (it would join with node 1's log and vote); `--adopt-data-dir` is the operator's way to
/// take such a directory as the node's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_directory_without_its_node_id_is_refused() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let copy = copy_of_stopped_node_1(&mut cluster)?;
    std::fs::remove_file(copy.join("node-id"))?;

    let mut stripped = spawn_on(&copy, cluster.dir(), 3, &[])?;
    let line = refused(&mut stripped).await?;
    assert_eq!(
        line,
        format!(
            "conchd: data directory {} holds a node's state but no node-id file, so whose it is \
             cannot be checked (a copy of another node's directory must not join as node 3); if \
             it is node 3's own, start once with --adopt-data-dir",
            copy.display()
        )
    );
    anyhow::ensure!(!copy.join("node-id").exists(), "the refusal wrote node-id");

    // Node 1's own directory is untouched: it starts and rejoins.
    cluster.restart(1)?;
    cluster.wait_for_leader(LONG).await?;
    Ok(())
}

/// A copy of node 1's directory whose `node-id` was edited to 4, started as node 4, is refused:
/// its log's membership (1, 2, 3) leaves node 4 out, and node 4 did not create it. With
/// `--adopt-data-dir` it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_directory_whose_membership_leaves_the_node_out_is_refused() -> anyhow::Result<()>
{
    let mut cluster = Cluster::start(3).await?;
    let copy = copy_of_stopped_node_1(&mut cluster)?;
    std::fs::write(copy.join("node-id"), "4\n")?;

    // Refused once the log and snapshot are open (their opening may log a line before).
    let mut edited = spawn_on(&copy, cluster.dir(), 4, &[])?;
    let code = edited.wait_exit(LONG).await?;
    let stderr = edited.stderr();
    anyhow::ensure!(code == Some(64), "exit {code:?}: {stderr}");
    assert_eq!(
        stderr.trim().lines().last().unwrap_or_default(),
        format!(
            "conchd: data directory {} holds the log of a cluster whose members are 1, 2, 3: \
             node 4 is not one of them (a copy of another node's directory?); start with \
             --adopt-data-dir to use it anyway",
            copy.display()
        )
    );

    // The operator's word: it starts, saying so.
    let mut adopted = spawn_on(&copy, cluster.dir(), 4, &["--adopt-data-dir"])?;
    serving(&mut adopted).await?;
    anyhow::ensure!(
        adopted
            .stderr()
            .contains("--adopt-data-dir: starting on a data directory whose"),
        "no warning: {}",
        adopted.stderr()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_conchd_on_a_directory_in_use_names_the_first() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data_dir = tmp.path().join("data");
    let mut first = spawn_on(&data_dir, tmp.path(), 1, &[])?;
    serving(&mut first).await?;
    let pid = first.pid().unwrap_or_default();

    let mut second = spawn_on(&data_dir, tmp.path(), 1, &[])?;
    let line = refused(&mut second).await?;
    assert_eq!(
        line,
        format!(
            "conchd: data directory {} is in use by another conchd (pid {pid})",
            data_dir.display()
        )
    );

    // Once the first stops, the directory is free again.
    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait_exit(LONG).await?, Some(0), "{}", first.stderr());
    let mut third = spawn_on(&data_dir, tmp.path(), 1, &[])?;
    serving(&mut third).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cluster_name_on_a_directory_is_refused() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data_dir = tmp.path().join("data");
    let mut first = spawn_on(&data_dir, tmp.path(), 1, &["--cluster-name", "prod-a"])?;
    serving(&mut first).await?;
    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait_exit(LONG).await?, Some(0), "{}", first.stderr());

    let mut other = Daemon::spawn_with(
        &["--data-dir", &data_dir.display().to_string()],
        tmp.path(),
        &[("CONCH_CLUSTER_NAME", "prod-b")],
        vec![("client", Port::bind()?)],
    )?;
    let line = refused(&mut other).await?;
    assert_eq!(
        line,
        format!(
            "conchd: data directory {} belongs to cluster \"prod-a\" (node 1), not \
             --cluster-name \"prod-b\"",
            data_dir.display()
        )
    );

    // Without a name, or with the recorded one, it starts.
    let mut unnamed = spawn_on(&data_dir, tmp.path(), 1, &[])?;
    serving(&mut unnamed).await?;
    Ok(())
}

//! Backup and restore as an operator does them: `conch cluster backup` through a follower of a
//! 3-node cluster under load, `conchd restore` into three new data directories, and a new
//! cluster started from them on new ports.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use cluster_tests::net::{NodeChannel, lazy_channel, status};
use cluster_tests::ops::{self, Grackle};
use cluster_tests::{Cluster, Daemon, Port, binary, channel, wait_for};
use conch_proto::conch::ListSemaphoreWaitersRequest;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle::GetNamespaceRequest;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;

/// The held lease's TTL: after the restore it is held at least this long (no refresh).
const HOLDER_TTL_S: u64 = 20;

/// Runs `program args…` to the end (killed if the test is dropped): (exit code, stdout, stderr).
async fn run(program: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let (code, stdout, stderr) = run_env(program, args, &[]).await?;
    Ok((code, String::from_utf8_lossy(&stdout).into_owned(), stderr))
}

/// [`run`] with `env` set (and no token from the test's own environment); stdout as bytes.
async fn run_env(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<(i32, Vec<u8>, String)> {
    let mut command = tokio::process::Command::new(binary(program));
    command
        .args(args)
        .env_remove("CONCH_TOKEN")
        .env_remove("CONCH_TOKEN_FILE")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .with_context(|| format!("{program} {args:?} did not finish within 120 s"))??;
    Ok((
        output.status.code().unwrap_or(-1),
        output.stdout,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

async fn waiter_ids(channel: NodeChannel, ns: &str, sem: &str) -> Option<Vec<String>> {
    let mut api = ConchApiClient::new(channel);
    let r = api
        .list_semaphore_waiters(ListSemaphoreWaitersRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
            ..Default::default()
        })
        .await
        .ok()?;
    Some(
        r.into_inner()
            .waiters
            .into_iter()
            .map(|w| w.lease_id)
            .collect(),
    )
}

async fn holder_ids(c: &mut Grackle, ns: &str, sem: &str) -> Option<Vec<String>> {
    let holders = ops::holders(c, ns, sem).await.ok()?;
    Some(holders.into_iter().map(|h| h.lease_id).collect())
}

/// Every file under `dir` with its contents.
fn contents(dir: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for item in std::fs::read_dir(&d)? {
            let path = item?.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.insert(path.display().to_string(), std::fs::read(&path)?);
            }
        }
    }
    Ok(out)
}

/// `backup of log index N (term T), state hash H, S bytes: PATH` -> (N, H).
fn parse_backup_line(line: &str) -> anyhow::Result<(u64, u64)> {
    let index = line
        .strip_prefix("backup of log index ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no index in {line:?}"))?;
    let hash = line
        .split("state hash ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .with_context(|| format!("no state hash in {line:?}"))?;
    Ok((index, hash))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_through_a_follower_restores_into_a_new_cluster() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let old = Cluster::start(3).await?;
    let leader = old.wait_for_leader(Duration::from_secs(30)).await?;
    let follower = old
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("a follower")?;
    let old_cluster_id = old.status(leader).await?.cluster_id;
    ensure!(!old_cluster_id.is_empty());
    let mut c = old.grackle(leader).await?;

    // Light load: clients acquiring and releasing in a loop, through every node.
    ops::namespace(&mut c, "load").await?;
    ops::semaphore(&mut c, "load", "pool", 2).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for id in old.ids() {
        let mut client = GrackleApiClient::new(lazy_channel(&old.addr(id))?);
        let stop = Arc::clone(&stop);
        load.push(tokio::spawn(async move {
            let mut rounds = 0u64;
            let Ok(lease) = ops::lease(&mut client, "load", 60).await else {
                return rounds;
            };
            while !stop.load(Ordering::Relaxed) {
                if let Ok(r) = ops::acquire(&mut client, "load", "pool", &lease, 1, 5).await
                    && ops::acquired(&r)
                {
                    let _ = ops::release(&mut client, "load", "pool", &lease).await;
                    rounds += 1;
                }
            }
            rounds
        }));
    }

    // A held one-permit semaphore with two queued waiters (their calls stay open).
    let held = ops::held_by_one(&mut c, "app", "gate", HOLDER_TTL_S, 200).await?;
    let second = ops::lease(&mut c, "app", 200).await?;
    let mut waiting = Vec::new();
    for (n, lease) in [held.waiter.clone(), second.clone()]
        .into_iter()
        .enumerate()
    {
        let mut client = GrackleApiClient::new(lazy_channel(&old.addr(follower))?);
        waiting.push(tokio::spawn(async move {
            ops::acquire(&mut client, "app", "gate", &lease, 1, 250).await
        }));
        let ch = old.channel(leader).context("channel")?;
        wait_for(
            &format!("waiter {n} queued"),
            Duration::from_secs(20),
            || {
                let ch = ch.clone();
                async move {
                    waiter_ids(ch, "app", "gate")
                        .await
                        .filter(|w| w.len() == n + 1)
                }
            },
        )
        .await?;
    }
    // Acknowledged right before the backup: the backup must hold it.
    ops::namespace(&mut c, "last-before-backup").await?;

    let file = work.path().join("cluster.backup");
    let file_arg = file.display().to_string();
    let (code, stdout, stderr) = run(
        "conch",
        &[
            "--endpoints",
            &old.addr(follower),
            "cluster",
            "backup",
            &file_arg,
        ],
    )
    .await?;
    ensure!(code == 0, "backup failed ({code}): {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    ensure!(lines.len() == 1, "one line: {stdout}");
    ensure!(lines[0].ends_with(&file_arg), "names the file: {stdout}");
    let (backup_index, backup_hash) = parse_backup_line(lines[0])?;
    ensure!(
        lines[0].contains(&format!("{} bytes", std::fs::metadata(&file)?.len())),
        "names the size: {stdout}"
    );
    // Owner only, like a token: it holds the whole state.
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&file)?.permissions().mode() & 0o777
    };
    ensure!(mode == 0o600, "the backup is mode {mode:o}, not 600");

    stop.store(true, Ordering::Relaxed);
    for task in load {
        let rounds = task.await?;
        ensure!(rounds > 0, "a load client made no progress");
    }
    for task in waiting {
        task.abort();
    }
    drop(old);

    // A gzip-compressed backup (as `conch cluster backup - | gzip` makes one) says so, and
    // what to do, instead of calling itself damaged.
    let gz = work.path().join("cluster.backup.gz");
    let compressed = std::process::Command::new("gzip")
        .arg("-c")
        .arg(&file)
        .output()
        .context("gzip")?;
    ensure!(compressed.status.success(), "gzip: {compressed:?}");
    std::fs::write(&gz, &compressed.stdout)?;
    let (gz_arg, gz_dir) = (
        gz.display().to_string(),
        work.path().join("from-gz").display().to_string(),
    );
    let (code, _, stderr) = run(
        "conchd",
        &[
            "restore",
            &gz_arg,
            "--data-dir",
            &gz_dir,
            "--id",
            "1",
            "--initial-cluster",
            "1=127.0.0.1:7001",
        ],
    )
    .await?;
    ensure!(
        code == 64 && stderr.contains("gzip-compressed: decompress it first"),
        "restore of a gzipped backup: {code} {stderr}"
    );

    // New members on new ports, held until each node's first start.
    let ports: BTreeMap<u64, Port> = (1..=3)
        .map(|id| Ok((id, Port::bind()?)))
        .collect::<anyhow::Result<_>>()?;
    let addrs: BTreeMap<u64, String> = ports
        .iter()
        .map(|(id, port)| (*id, port.addr().to_string()))
        .collect();
    let ports = std::cell::RefCell::new(ports);
    let members = addrs
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",");
    let dir_of = |id: u64| work.path().join(format!("restored{id}"));
    // `conchd [before…] restore FILE --data-dir restoredID --id ID --initial-cluster …`.
    let restore = |before: &[&str], file: &str, id: u64| {
        let mut args: Vec<String> = before.iter().map(|a| a.to_string()).collect();
        let data_dir = dir_of(id).display().to_string();
        let id = id.to_string();
        args.extend(
            [
                "restore",
                file,
                "--data-dir",
                &data_dir,
                "--id",
                &id,
                "--initial-cluster",
                &members,
            ]
            .map(String::from),
        );
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run("conchd", &args).await
        }
    };

    // A damaged backup is refused, naming the checksum, and writes nothing.
    let mut damaged = std::fs::read(&file)?;
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x01;
    let damaged_file = work.path().join("damaged.backup");
    std::fs::write(&damaged_file, &damaged)?;
    let (code, _, stderr) = restore(&[], &damaged_file.display().to_string(), 1).await?;
    ensure!(code == 64, "damaged backup: exit {code}: {stderr}");
    ensure!(
        stderr.trim().lines().count() == 1 && stderr.contains("checksum"),
        "{stderr}"
    );
    ensure!(!dir_of(1).exists(), "a refused restore wrote something");

    // A serving flag before the subcommand is refused rather than silently dropped.
    let (code, _, stderr) = restore(&["--id", "2"], &file_arg, 1).await?;
    ensure!(code == 64, "flag before restore: exit {code}: {stderr}");
    ensure!(
        stderr.trim().lines().count() == 1 && stderr.contains("--id given before `restore`"),
        "{stderr}"
    );
    ensure!(!dir_of(1).exists(), "a refused restore wrote something");

    let mut new_cluster_id = String::new();
    for id in 1..=3u64 {
        let (code, stdout, stderr) = restore(&[], &file_arg, id).await?;
        ensure!(code == 0, "restore node {id} ({code}): {stderr}");
        ensure!(
            stdout.contains(&format!("restored log index {backup_index} ")),
            "{stdout}"
        );
        let id_here = stdout
            .trim()
            .rsplit(' ')
            .next()
            .unwrap_or_default()
            .to_string();
        if id == 1 {
            new_cluster_id = id_here;
        } else {
            ensure!(id_here == new_cluster_id, "cluster ids differ: {stdout}");
        }
    }
    ensure!(new_cluster_id.len() == 32 && new_cluster_id != old_cluster_id);

    // Restoring over a directory that is not empty is refused and changes nothing.
    let before = contents(&dir_of(1))?;
    let (code, _, stderr) = restore(&[], &file_arg, 1).await?;
    ensure!(code == 64, "non-empty directory: exit {code}: {stderr}");
    ensure!(
        stderr.trim().lines().count() == 1 && stderr.contains("not empty"),
        "{stderr}"
    );
    ensure!(
        contents(&dir_of(1))? == before,
        "the refused restore changed the directory"
    );

    let spawn = |id: u64| {
        let data_dir = dir_of(id).display().to_string();
        let port = ports.borrow_mut().remove(&id);
        let port = port.map_or_else(|| Port::bind_at(&addrs[&id]), Ok)?;
        Daemon::spawn_on(
            port,
            &[
                "--id",
                &id.to_string(),
                "--data-dir",
                &data_dir,
                "--initial-cluster",
                &members,
            ],
            work.path(),
        )
    };

    // Each restored node alone (no quorum, so nothing is written): the backup's state, at the
    // backup's index, in the new cluster.
    for id in 1..=3u64 {
        let node = spawn(id)?;
        let s = wait_for(
            &format!("restored node {id} to answer"),
            Duration::from_secs(30),
            || async { status(&addrs[&id]).await.ok() },
        )
        .await
        .with_context(|| node.stderr())?;
        ensure!(
            s.applied_index == backup_index && s.state_hash == backup_hash,
            "node {id}: applied {} hash {:016x}, backup {backup_index} {backup_hash:016x}",
            s.applied_index,
            s.state_hash
        );
        ensure!(
            s.cluster_id == new_cluster_id,
            "node {id}: {}",
            s.cluster_id
        );
        let voters: Vec<u64> = s.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
        ensure!(voters == vec![1, 2, 3], "members {:?}", s.members);
        drop(node);
    }

    // The new cluster.
    let launched = Instant::now();
    let nodes: Vec<Daemon> = (1..=3).map(spawn).collect::<anyhow::Result<_>>()?;
    let logs = || {
        nodes
            .iter()
            .map(|n| n.stderr())
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let new_leader = wait_for(
        "a leader in the new cluster",
        Duration::from_secs(60),
        || async {
            let s = status(&addrs[&1]).await.ok()?;
            (s.leader_id != 0).then_some(s.leader_id)
        },
    )
    .await
    .with_context(logs)?;
    for id in 1..=3u64 {
        let s = wait_for(
            &format!("node {id} of the new cluster"),
            Duration::from_secs(30),
            || async { status(&addrs[&id]).await.ok() },
        )
        .await?;
        ensure!(
            s.cluster_id == new_cluster_id,
            "node {id}: {}",
            s.cluster_id
        );
    }
    let mut c = GrackleApiClient::new(channel(&addrs[&new_leader]).await?);
    c.get_namespace(GetNamespaceRequest {
        namespace_name: "last-before-backup".into(),
    })
    .await
    .context("the write acknowledged before the backup")?;

    // The held lease is still held, the waiters queued in order; once the holder's TTL runs
    // out (no refresh), the slot goes to the head waiter.
    ensure!(
        holder_ids(&mut c, "app", "gate").await == Some(vec![held.holder.clone()]),
        "holder after restore: {:?}",
        holder_ids(&mut c, "app", "gate").await
    );
    let leader_channel = channel(&addrs[&new_leader]).await?;
    ensure!(
        waiter_ids(leader_channel.clone(), "app", "gate").await
            == Some(vec![held.waiter.clone(), second.clone()]),
        "waiters after restore"
    );
    wait_for(
        "the head waiter to be granted",
        Duration::from_secs(HOLDER_TTL_S * 3 + 30),
        || {
            let mut c = c.clone();
            let waiter = held.waiter.clone();
            async move { (holder_ids(&mut c, "app", "gate").await? == vec![waiter]).then_some(()) }
        },
    )
    .await
    .with_context(logs)?;
    let granted_after = launched.elapsed();
    if granted_after < Duration::from_secs(HOLDER_TTL_S) {
        bail!(
            "the restored lease lasted {granted_after:?} in the new cluster, less than its TTL \
             of {HOLDER_TTL_S} s"
        );
    }
    ensure!(
        waiter_ids(leader_channel, "app", "gate").await == Some(vec![second.clone()]),
        "the second waiter keeps its place"
    );

    // New work.
    ops::namespace(&mut c, "after-restore").await?;
    ops::semaphore(&mut c, "after-restore", "fresh", 1).await?;
    let lease = ops::lease(&mut c, "after-restore", 30).await?;
    let r = ops::acquire(&mut c, "after-restore", "fresh", &lease, 1, 5).await?;
    ensure!(ops::acquired(&r), "{r:?}");
    drop(nodes);
    Ok(())
}

/// With access control on, only a cluster-admin token takes a backup; `-` writes it to stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_cluster_admin_takes_a_backup() -> anyhow::Result<()> {
    const ADMIN: &str = "backup-admin-token-0123456789-abcdefghijk";
    let work = tempfile::tempdir()?;
    let token_file = work.path().join("admin.token");
    cluster_tests::auth::write_secret(&token_file, ADMIN)?;
    let token_path = token_file.display().to_string();
    let mut args = vec![
        "--bootstrap-admin-token-file".to_string(),
        token_path.clone(),
    ];
    args.extend(cluster_tests::auth::peer_secret_args(work.path())?);
    let mut cluster = Cluster::launch(1, &args, false).await?;
    cluster.set_admin_token(ADMIN);
    cluster.wait_for_leader(Duration::from_secs(30)).await?;
    let endpoint = cluster.addr(1);
    let admin_env = [
        ("CONCH_ENDPOINTS", endpoint.as_str()),
        ("CONCH_TOKEN_FILE", token_path.as_str()),
    ];
    wait_for(
        "access control to be on",
        Duration::from_secs(30),
        || async {
            let (code, out, _) = run_env("conch", &["auth", "status"], &admin_env)
                .await
                .ok()?;
            (code == 0 && String::from_utf8_lossy(&out).contains("access control is on"))
                .then_some(())
        },
    )
    .await?;
    for args in [
        &["auth", "role", "create", "ci"][..],
        &["auth", "role", "grant", "ci", "conch", "write"][..],
    ] {
        let (code, _, err) = run_env("conch", args, &admin_env).await?;
        ensure!(code == 0, "{args:?}: {code} {err}");
    }
    let (code, ci_token, err) = run_env(
        "conch",
        &["auth", "token", "create", "runner", "--role", "ci"],
        &admin_env,
    )
    .await?;
    ensure!(code == 0, "token create: {code} {err}");
    let ci_token = String::from_utf8_lossy(&ci_token).trim().to_string();

    let file = work.path().join("refused.backup");
    let file_arg = file.display().to_string();
    let backup = ["cluster", "backup", file_arg.as_str()];
    for env in [
        vec![
            ("CONCH_ENDPOINTS", endpoint.as_str()),
            ("CONCH_TOKEN", ci_token.as_str()),
        ],
        vec![("CONCH_ENDPOINTS", endpoint.as_str())],
    ] {
        let (code, _, err) = run_env("conch", &backup, &env).await?;
        ensure!(code == 77, "backup without cluster-admin: {code} {err}");
        ensure!(!file.exists(), "a refused backup left a file");
        let leftovers = std::fs::read_dir(work.path())?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .count();
        ensure!(leftovers == 0, "a refused backup left a temporary file");
    }

    let (code, bytes, err) = run_env("conch", &["cluster", "backup", "-"], &admin_env).await?;
    ensure!(code == 0, "backup to stdout: {code} {err}");
    let (verified, _) = conch_proto::backup::verify(&bytes)
        .map_err(|e| anyhow::anyhow!("stdout is not a valid backup: {e}"))?;
    let status = cluster.status(1).await?;
    ensure!(
        verified.header.applied_index >= 1 && verified.header.applied_index <= status.applied_index
    );
    ensure!(
        err.trim().lines().count() == 1
            && err.contains(&format!(
                "backup of log index {} ",
                verified.header.applied_index
            ))
            && err.trim().ends_with(": -"),
        "the summary goes to stderr: {err}"
    );
    Ok(())
}

//! The `conch` binary against real conchd nodes run in-process (tests/it/common), for what needs
//! the in-process harness: the child's environment, a slot lost to a cut link, a signal during
//! a wait, `--spread` across faked hosts, `--who` of holders with chosen metadata. Queueing and
//! FIFO order, the command's status and the no-slot exits against conchd processes are in
//! cluster-tests/tests/it/cli.rs, once.

use std::collections::HashMap;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::{Cluster, file_appears};
use conch_client::sema::{self, META_HOST, META_PID, META_SINCE, NAMESPACE};
use conch_client::{Client, Lease};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

fn conch(cluster: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_conch"));
    cmd.args(args)
        .env("CONCH_ENDPOINTS", cluster.endpoints().join(","))
        .env_remove("CONCH_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn run(cluster: &Cluster, args: &[&str]) -> Output {
    conch(cluster, args).output().await.expect("run conch")
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The output of `child` once it has exited (within 30 s: a bound on "it exits", with room for a
/// loaded machine).
async fn exited(child: Child) -> Output {
    tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("conch exited in time")
        .expect("conch output")
}

fn send(child: &Child, sig: Signal) {
    let pid = child.id().expect("running") as i32;
    kill(Pid::from_raw(pid), sig).expect("signal conch");
}

/// This machine's host name, as conch reports it.
fn hostname() -> String {
    gethostname::gethostname()
        .to_string_lossy()
        .trim()
        .to_string()
}

/// Holds `sem` (creating it with `permits`) through the library, with holder metadata.
async fn hold(cluster: &Cluster, sem: &str, permits: u64, host: &str, pid: u32) -> (Client, Lease) {
    let c = Client::connect(cluster.endpoints()).await.unwrap();
    c.ensure_semaphore(NAMESPACE, sem, permits).await.unwrap();
    let l = c
        .create_lease(NAMESPACE, "test", Duration::from_secs(10), HashMap::new())
        .await
        .unwrap();
    let meta = HashMap::from([
        (META_HOST.to_string(), host.to_string()),
        (META_PID.to_string(), pid.to_string()),
        (META_SINCE.to_string(), "2026-06-12T10:15:00Z".to_string()),
    ]);
    c.acquire(&l, NAMESPACE, sem, 1, None, meta)
        .await
        .unwrap()
        .unwrap()
        .forget();
    (c, l)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_with_rev_and_lease_and_its_status_comes_back() {
    let cluster = Cluster::start(1).await;
    let o = run(
        &cluster,
        &[
            "sema",
            "job",
            "--max",
            "1",
            "--",
            "sh",
            "-c",
            "echo rev=$CONCH_REV lease=$CONCH_LEASE; exit 3",
        ],
    )
    .await;
    assert_eq!(code(&o), 3, "stderr: {}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("rev=") && out.contains(" lease=ls_"),
        "{out}"
    );
    let rev: u64 = out["rev=".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rev > 0);
    // Released and revoked on the way out.
    assert!(cluster.holders(NAMESPACE, "job.1").await.is_empty());
    assert_eq!(cluster.lease_count(NAMESPACE).await, 0);

    // Fencing tokens increase from run to run.
    let o = run(
        &cluster,
        &[
            "sema",
            "job",
            "--max",
            "1",
            "--",
            "sh",
            "-c",
            "echo $CONCH_REV",
        ],
    )
    .await;
    let rev2: u64 = stdout(&o).trim().parse().unwrap();
    assert!(rev2 > rev);

    // Killed by a signal: 128 + signal.
    let o = run(
        &cluster,
        &[
            "sema",
            "job",
            "--max",
            "1",
            "--",
            "sh",
            "-c",
            "kill -TERM $$",
        ],
    )
    .await;
    assert_eq!(code(&o), 143);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_shows_holders_then_waiters_or_no_holder() {
    let cluster = Cluster::start(1).await;
    let o = run(&cluster, &["sema", "video-encode", "--max", "2", "--who"]).await;
    assert_eq!(
        code(&o),
        1,
        "nothing there yet: said, exit 1: {}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "video-encode[0/2] no holder\n");

    let (_c1, _l1) = hold(&cluster, "video-encode.2", 2, "node2", 4242).await;
    let (_c2, _l2) = hold(&cluster, "video-encode.2", 2, "node3", 991).await;
    let waiter = conch(
        &cluster,
        &["sema", "video-encode", "--max", "2", "--", "true"],
    )
    .spawn()
    .unwrap();
    cluster
        .await_queued(NAMESPACE, "video-encode.2", 1, Duration::from_secs(10))
        .await;

    let o = run(&cluster, &["sema", "video-encode", "--max", "2", "--who"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines: Vec<String> = stdout(&o).lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    // Columns are padded to the widest host and pid (this machine's name and pid are longer
    // than the seed's), so compare with spaces squeezed, then check the alignment.
    let squeezed: Vec<String> = lines
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        squeezed[0]
            .starts_with("video-encode[2/2] HELD node2 pid=4242 since=2026-06-12T10:15:00Z rev="),
        "{}",
        lines[0]
    );
    assert!(
        squeezed[1]
            .starts_with("video-encode[2/2] HELD node3 pid=991 since=2026-06-12T10:15:00Z rev="),
        "{}",
        lines[1]
    );
    let me = hostname();
    assert!(
        squeezed[2].starts_with(&format!("video-encode[2/2] WAIT {me} pid=")),
        "{}",
        lines[2]
    );
    assert!(lines[2].ends_with(" rev=-"), "{}", lines[2]);
    let since_col: Vec<Option<usize>> = lines.iter().map(|l| l.find("since=")).collect();
    assert!(
        since_col.iter().all(|c| *c == since_col[0]),
        "aligned: {lines:#?}"
    );

    let o = run(
        &cluster,
        &["sema", "video-encode", "--max", "2", "--who", "--json"],
    )
    .await;
    assert_eq!(code(&o), 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["name"], "video-encode");
    assert_eq!(v["max"], 2);
    assert_eq!(v["holders"].as_array().unwrap().len(), 2);
    assert_eq!(v["holders"][0]["host"], "node2");
    assert_eq!(v["holders"][0]["pid"], 4242);
    assert_eq!(v["waiters"][0]["host"], me.as_str());
    assert_eq!(v["waiters"][0]["position"], 0);
    assert!(
        v["waiters"][0]["lease_id"]
            .as_str()
            .unwrap()
            .starts_with("ls_")
    );

    // --max is part of the identity: another N is another semaphore.
    let o = run(&cluster, &["sema", "video-encode", "--max", "3", "--who"]).await;
    assert_eq!(
        code(&o),
        1,
        "answered, nobody holds video-encode.3: {}",
        stderr(&o)
    );
    drop(waiter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_stops_the_command_and_exits_79() {
    let cluster = Cluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'echo got-term; exit 0' TERM; echo started; touch {}; sleep 30 & wait",
        ready.display()
    );
    let child = conch(
        &cluster,
        &[
            "sema",
            "job",
            "--max",
            "1",
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .spawn()
    .unwrap();
    cluster
        .await_holders(NAMESPACE, "job.1", 1, Duration::from_secs(10))
        .await;
    assert!(
        file_appears(&ready, Duration::from_secs(10)).await,
        "the command set its trap"
    );
    let lease = cluster.holders(NAMESPACE, "job.1").await[0].clone();
    cluster.revoke(NAMESPACE, &lease).await;
    let o = exited(child).await;
    assert_eq!(code(&o), 79, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("got-term"),
        "the command got SIGTERM: {}",
        stdout(&o)
    );
    let err = stderr(&o);
    assert!(err.contains("conch: slot lost while running"), "{err}");

    // A command that ignores SIGTERM is killed after --kill-after.
    let child = conch(
        &cluster,
        &[
            "sema",
            "job",
            "--max",
            "1",
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; sleep 30",
        ],
    )
    .spawn()
    .unwrap();
    cluster
        .await_holders(NAMESPACE, "job.1", 1, Duration::from_secs(10))
        .await;
    let lease = cluster.holders(NAMESPACE, "job.1").await[0].clone();
    cluster.revoke(NAMESPACE, &lease).await;
    let o = exited(child).await;
    assert_eq!(code(&o), 79, "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_reach_the_command_and_interrupt_a_wait() {
    let cluster = Cluster::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    // The shell may take the signal only after it started `sleep` (it runs a trap once the
    // command in progress ends): the trap ends that sleep too, and the sleep holds none of the
    // test's pipes, so nothing outlives the script.
    let script = format!(
        "trap 'kill $! 2>/dev/null; exit 7' TERM; touch {}; sleep 30 >/dev/null 2>&1 & wait",
        ready.display()
    );
    let child = conch(
        &cluster,
        &["sema", "job", "--max", "1", "--", "sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    cluster
        .await_holders(NAMESPACE, "job.1", 1, Duration::from_secs(10))
        .await;
    assert!(
        file_appears(&ready, Duration::from_secs(10)).await,
        "the command set its trap"
    );
    send(&child, Signal::SIGTERM);
    let o = exited(child).await;
    assert_eq!(code(&o), 7, "{}", stderr(&o));
    assert!(cluster.holders(NAMESPACE, "job.1").await.is_empty());

    // Ctrl-C while waiting: 130, and neither waiter nor lease is left behind.
    let (_c, _l) = hold(&cluster, "job.1", 1, "node9", 1).await;
    let child = conch(&cluster, &["sema", "job", "--max", "1", "--", "true"])
        .spawn()
        .unwrap();
    cluster
        .await_queued(NAMESPACE, "job.1", 1, Duration::from_secs(10))
        .await;
    send(&child, Signal::SIGINT);
    let o = exited(child).await;
    assert_eq!(code(&o), 130, "{}", stderr(&o));
    assert!(cluster.queue(NAMESPACE, "job.1").await.is_empty());
    assert_eq!(
        cluster.lease_count(NAMESPACE).await,
        1,
        "only the holder's lease remains"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_allows_one_slot_per_host() {
    let cluster = Cluster::start(1).await;
    let first = conch(
        &cluster,
        &[
            "sema", "heavy", "--max", "2", "--spread", "--", "sleep", "3",
        ],
    )
    .spawn()
    .unwrap();
    cluster
        .await_holders(NAMESPACE, "heavy.2", 1, Duration::from_secs(10))
        .await;
    let o = run(
        &cluster,
        &[
            "sema",
            "heavy",
            "--max",
            "2",
            "--spread",
            "--nonblock",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(code(&o), 75, "same host refused: {}", stderr(&o));
    assert!(
        stderr(&o).contains("this host already holds one"),
        "{}",
        stderr(&o)
    );
    // Without --spread the second slot is free.
    let o = run(
        &cluster,
        &["sema", "heavy", "--max", "2", "--nonblock", "--", "true"],
    )
    .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = first.wait_with_output().await.unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let host_sem = sema::spread_semaphore_name("heavy", 2, &hostname()).unwrap();
    assert!(cluster.holders(NAMESPACE, &host_sem).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_map_to_documented_exit_codes() {
    let cluster = Cluster::start(1).await;
    let o = run(
        &cluster,
        &["sema", "job", "--max", "1", "--", "/nonexistent/cmd"],
    )
    .await;
    assert_eq!(code(&o), 127, "{}", stderr(&o));
    assert!(stderr(&o).starts_with("conch: cannot run /nonexistent/cmd"));
    assert_eq!(cluster.lease_count(NAMESPACE).await, 0);

    // Usage errors (64) and an unreachable cluster (69): cluster-tests/tests/it/cli.rs
    // (`usage_errors_exit_64_and_an_unreachable_cluster_69`).

    let o = run(&cluster, &["cluster", "status"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("NODE  ADDRESS"), "{out}");
    assert!(out.contains("Leader"), "{out}");
}

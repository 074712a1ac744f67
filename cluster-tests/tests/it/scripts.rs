//! The local-cluster script (`make cluster`) and the CLI's help, as a newcomer uses them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cluster_tests::{binary, wait_for};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("scripts")
        .join("cluster.sh")
}

fn run_script(args: &[&str], base: &str, dir: &Path) -> std::io::Result<Output> {
    Command::new("bash")
        .arg(script())
        .args(args)
        .arg(dir)
        .env("CONCHD_BIN", binary("conchd"))
        .env("CONCH_CLUSTER_PORT", base)
        .env("CONCH_METRICS_PORT", "0")
        .output()
}

/// Stops what the script started, also when the test fails half-way.
struct Stopper(PathBuf);

impl Drop for Stopper {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.0)
            .output();
    }
}

/// `n` loopback listeners on consecutive ports.
fn consecutive_ports(n: u16) -> anyhow::Result<Vec<std::net::TcpListener>> {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")?;
        let base = first.local_addr()?.port();
        let mut held = vec![first];
        for i in 1..n {
            match base
                .checked_add(i)
                .map(|port| std::net::TcpListener::bind(("127.0.0.1", port)))
            {
                Some(Ok(listener)) => held.push(listener),
                _ => break,
            }
        }
        if held.len() == usize::from(n) {
            return Ok(held);
        }
    }
    anyhow::bail!("no {n} consecutive free loopback ports")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_script_takes_its_ports_from_conch_cluster_port() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bad = run_script(&["start"], "70x1", dir.path())?;
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    assert!(text(&bad.stderr).contains("CONCH_CLUSTER_PORT"), "{bad:?}");

    // The script binds its ports itself (from CONCH_CLUSTER_PORT on): three consecutive ports
    // are held here and let go just before it starts, the one window left where another
    // process could take one.
    let held = consecutive_ports(3)?;
    let base = held[0].local_addr()?.port();
    drop(held);
    let _stop = Stopper(dir.path().to_path_buf());
    let started = run_script(&["start"], &base.to_string(), dir.path())?;
    let out = text(&started.stdout);
    assert!(started.status.success(), "{started:?}");
    let endpoints = format!(
        "127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        base,
        base + 1,
        base + 2
    );
    assert!(out.contains(&endpoints), "names the ports: {out}");
    // The hint names conch by its full path (it is not on PATH after a build).
    let conch = binary("conch");
    assert!(
        out.contains(&format!("{} cluster status", conch.display())),
        "{out}"
    );
    wait_for(
        "the three nodes to elect a leader",
        Duration::from_secs(30),
        || {
            let status = Command::new(&conch)
                .args(["cluster", "status", "--endpoints", &endpoints])
                .output();
            async move { status.ok().filter(|o| o.status.code() == Some(0)) }
        },
    )
    .await?;

    let stopped = run_script(&["stop"], &base.to_string(), dir.path())?;
    assert!(stopped.status.success(), "{stopped:?}");
    let down = Command::new(&conch)
        .args(["cluster", "status", "--endpoints", &endpoints])
        .output()?;
    assert_eq!(down.status.code(), Some(2), "every node stopped: {down:?}");
    Ok(())
}

#[test]
fn conch_help_says_cluster_also_changes_the_cluster() -> anyhow::Result<()> {
    let help = Command::new(binary("conch")).arg("--help").output()?;
    assert!(help.status.success());
    let line = text(&help.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with("cluster "))
        .map(str::to_string)
        .unwrap_or_default();
    assert!(line.contains("change"), "{line:?}");
    Ok(())
}

//! conchd as a service: the shipped example config starts a node, readiness and shutdown
//! reach a service manager's notification socket, and JSON logs are one object per line.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use cluster_tests::{Daemon, Port};
use nix::sys::signal::Signal;

/// Waits for the next datagram on `socket` (non-blocking socket, polled until `timeout`).
async fn next_datagram(socket: &UnixDatagram, timeout: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 4096];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) => return Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no notification within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_config_runs_a_node_that_notifies_its_service_manager() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path)?;
    socket.set_nonblocking(true)?;
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/conchd.toml");
    // Passed as the socket-activated unit passes it: the file's `listen` gives way to it.
    let port = Port::bind()?;
    let listen = port.addr().to_string();
    let data_dir = dir.path().join("data").display().to_string();
    let config_arg = config.display().to_string();
    // The file's settings, with the addresses and directory of this test.
    let mut daemon = Daemon::spawn_with(
        &[
            "--config",
            &config_arg,
            "--data-dir",
            &data_dir,
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
        dir.path(),
        &[("NOTIFY_SOCKET", &socket_path.display().to_string())],
        vec![("client", port)],
    )?;
    let pid = daemon.pid().context("conchd pid")?;

    let ready = next_datagram(&socket, Duration::from_secs(30))
        .await
        .with_context(|| format!("stderr: {}", daemon.stderr()))?;
    let lines: Vec<&str> = ready.lines().collect();
    assert!(lines.contains(&"READY=1"), "{ready}");
    assert!(
        lines.contains(&format!("MAINPID={pid}").as_str()),
        "{ready}"
    );
    assert!(
        ready.contains(&format!("STATUS=node 1 serving on {listen}")),
        "{ready}"
    );
    // Ready means the port answers.
    std::net::TcpStream::connect(&listen).context("connect after READY")?;

    daemon.signal(Signal::SIGTERM);
    let stopping = next_datagram(&socket, Duration::from_secs(30)).await?;
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping}");
    assert_eq!(daemon.wait_exit(Duration::from_secs(30)).await?, Some(0));

    let stderr = daemon.stderr();
    let mut objects = 0;
    for line in stderr.lines() {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("a log line that is not JSON: {line:?}"))?;
        assert!(
            value.get("level").is_some() && value.get("message").is_some(),
            "{line}"
        );
        assert!(value.get("timestamp").is_some(), "{line}");
        objects += 1;
    }
    assert!(objects >= 2, "the node logged its start and stop: {stderr}");
    assert!(
        stderr.contains("\"message\":\"SIGTERM: shutting down\""),
        "{stderr}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_port_fails_with_one_line_naming_the_flag() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let taken_addr = taken.local_addr()?.to_string();
    let mut daemon = Daemon::spawn(
        &["--listen", "127.0.0.1:0", "--metrics-listen", &taken_addr],
        dir.path(),
    )?;
    assert_eq!(daemon.wait_exit(Duration::from_secs(20)).await?, Some(1));
    let stderr = daemon.stderr();
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&taken_addr) && stderr.contains("--metrics-listen"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("conch-data").exists(),
        "nothing touched the disk before the ports were bound"
    );
    Ok(())
}

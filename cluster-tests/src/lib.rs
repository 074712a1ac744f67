//! Process-level harness of conch: real `conchd` processes on loopback ports chosen at run
//! time, and the tools built on it.
//!
//! - [`sockets`]: every node's port is bound by the test and handed to `conchd` as a passed
//!   socket (socket activation), so no port is ever free between choosing it and serving it;
//! - [`cluster`]: a cluster of `conchd` processes, its peer links optionally through fault
//!   proxies ([`conch_testkit::LinkProxy`]); [`daemon`]: one `conchd` started with explicit arguments;
//! - [`net`]: every channel to a node is built here, including the failover client;
//! - [`faketime`]: faked wall clocks; [`disk`]: small data disks that fill up;
//! - [`rng`]: the seeded random stream behind every replayable choice (`CONCH_SEED`);
//! - [`ops`]: small helpers over the Grackle API; [`proc`]: a process a test started (a
//!   `conch`), killed on drop with the process groups it made;
//! - [`jepsen`]: fault injection and the safety checker (`conch-jepsen`, `tests/it/jepsen.rs`);
//! - [`bench`]: the benchmark workloads (`conch-bench`).
//!
//! Every process started here is killed when its owner is dropped, also when a test panics,
//! and dies with the thread that started it if this process is killed before its destructors
//! run. Waits are conditions with deadlines, never fixed sleeps.

pub mod auth;
pub mod bench;
pub mod cluster;
pub mod daemon;
pub mod disk;
pub mod faketime;
pub mod jepsen;
pub mod net;
pub mod ops;
pub mod pki;
pub mod proc;
pub mod rng;
pub mod scrape;
pub mod sockets;
pub mod upgrade;

use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;

pub use cluster::{Cluster, NodeProc, PATIENT_LEADER_WAIT, STEADY_LEADER};
pub use daemon::Daemon;
pub use net::channel;
pub use sockets::Port;

/// Path of a workspace binary (`conchd`, `conch`), built next to the running executable.
/// `CONCHD_BIN` / `CONCH_BIN` override it.
pub fn binary(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase());
    if let Ok(path) = std::env::var(&var) {
        return PathBuf::from(path);
    }
    // target/<profile>/deps/<test> -> target/<profile>/<name>; a binary of this crate already
    // sits in target/<profile>.
    let mut dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from))
        .unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}

/// Nanoseconds since the Unix epoch `d` from now on this machine's wall clock (how Grackle
/// writes times such as a wait group's `expires_at`).
pub fn unix_nanos_in(d: Duration) -> i64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        + d;
    i64::try_from(t.as_nanos()).unwrap_or(i64::MAX)
}

/// Polls `check` until it returns `Some`, or fails after `timeout` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A `conchd` command with `args`, stdin closed, that dies with the thread that spawns it.
/// Its metrics go to a free port (tests run in parallel; a flag still wins).
fn conchd_command(args: &[String]) -> Command {
    conchd_command_of(&binary("conchd"), args)
}

/// Like `conchd_command`, for the conchd at `binary` (e.g. a previous release).
fn conchd_command_of(binary: &Path, args: &[String]) -> Command {
    let mut command = Command::new(binary);
    command
        .args(args)
        .stdin(Stdio::null())
        .env("CONCH_METRICS_LISTEN", "127.0.0.1:0");
    dies_with_spawner(&mut command);
    command
}

/// Runs the `conch` CLI against `endpoints` with `args` and only the `CONCH_*` credentials in
/// `env` (none inherited from this process), killed if it takes more than a minute; returns
/// (exit code, stdout, stderr).
pub async fn run_conch(
    endpoints: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<(i32, String, String)> {
    let mut command = tokio::process::Command::new(binary("conch"));
    command
        .args(args)
        .env("CONCH_ENDPOINTS", endpoints)
        .env_remove("CONCH_TOKEN")
        .env_remove("CONCH_TOKEN_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .context("conch timed out")??;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// Makes the process `command` starts die with the thread that spawns it, even if this
/// process is killed before its destructors run (e.g. by `timeout` or SIGTERM).
pub(crate) fn dies_with_spawner(command: &mut Command) {
    // SAFETY: prctl(2) is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            Ok(())
        });
    }
}

/// Spawns `command` (a [`conchd_command`]), naming the binary in the error.
fn spawn(command: &mut Command) -> anyhow::Result<std::process::Child> {
    command
        .spawn()
        .with_context(|| format!("spawn {}", binary("conchd").display()))
}

/// Sends `signal` (e.g. `Signal::SIGSTOP`) to the child process `pid`.
fn send_signal(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        // The child may have exited already: nothing to do then.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
    }
}

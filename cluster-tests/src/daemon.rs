//! One `conchd` process started with explicit arguments (flag and config checks, signals).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::sockets::Port;
use crate::{conchd_command, send_signal};

/// One `conchd` process started with explicit arguments; killed on drop.
pub struct Daemon {
    child: Option<Child>,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
}

impl Daemon {
    pub fn spawn(args: &[&str], cwd: &Path) -> anyhow::Result<Daemon> {
        Self::spawn_with_env(args, cwd, &[])
    }

    /// Like [`Daemon::spawn`], with extra environment variables.
    pub fn spawn_with_env(
        args: &[&str],
        cwd: &Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Daemon> {
        Self::spawn_with(args, cwd, env, Vec::new())
    }

    /// Like [`Daemon::spawn`], serving clients on `port`, which the test bound (passed as the
    /// `client` socket: no `--listen` needed).
    pub fn spawn_on(port: Port, args: &[&str], cwd: &Path) -> anyhow::Result<Daemon> {
        Self::spawn_with(args, cwd, &[], vec![("client", port)])
    }

    /// Like [`Daemon::spawn_with_env`], with listening sockets the test bound, by name
    /// (`client`, `peer`, `metrics`; see [`crate::sockets::pass`]).
    pub fn spawn_with(
        args: &[&str],
        cwd: &Path,
        env: &[(&str, &str)],
        sockets: Vec<(&'static str, Port)>,
    ) -> anyhow::Result<Daemon> {
        Self::spawn_inner(args, cwd, env, sockets, false)
    }

    /// Like [`Daemon::spawn_on`], with conchd's own default metrics address (the client port
    /// + 100) instead of the any-free-port the harness gives every other node.
    pub fn spawn_on_with_default_metrics(
        port: Port,
        args: &[&str],
        cwd: &Path,
    ) -> anyhow::Result<Daemon> {
        Self::spawn_inner(args, cwd, &[], vec![("client", port)], true)
    }

    fn spawn_inner(
        args: &[&str],
        cwd: &Path,
        env: &[(&str, &str)],
        sockets: Vec<(&'static str, Port)>,
        default_metrics: bool,
    ) -> anyhow::Result<Daemon> {
        static SPAWNED: AtomicU64 = AtomicU64::new(0);
        let n = SPAWNED.fetch_add(1, Ordering::Relaxed);
        let stdout_path = cwd.join(format!("conchd-{}-{n}.out", std::process::id()));
        let stderr_path = stdout_path.with_extension("err");
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut command = conchd_command(&args);
        if default_metrics {
            command.env_remove("CONCH_METRICS_LISTEN");
        }
        command
            .envs(env.iter().copied())
            .current_dir(cwd)
            .stdout(std::fs::File::create(&stdout_path)?)
            .stderr(std::fs::File::create(&stderr_path)?);
        crate::sockets::pass(&mut command, sockets)?;
        let child = crate::spawn(&mut command)?;
        Ok(Daemon {
            child: Some(child),
            stdout_path,
            stderr_path,
        })
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(child) = &self.child {
            send_signal(child.id(), signal);
        }
    }

    /// True once the process has exited (a port taken at startup, a crash).
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(Some(_))),
            None => true,
        }
    }

    /// Waits for the process to exit and returns its exit code (None if killed by a signal).
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Ok(status.code());
            }
            if self.child.is_none() {
                bail!("process already reaped");
            }
            if Instant::now() >= deadline {
                bail!(
                    "conchd did not exit within {timeout:?}; stderr: {}",
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

//! A process a test started (a `conch`, or a shell running one): in a process group of its
//! own, its output in files, and killed on drop together with the process groups of its
//! descendants (conch puts its command in a group of its own) and any group named to it, also
//! when the test fails.

use std::collections::HashSet;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// `(pid, ppid, pgrp)` of every process, from /proc.
pub fn process_table() -> Vec<(i32, i32, i32)> {
    let mut table = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 3 {
            continue;
        }
        if let (Ok(ppid), Ok(pgrp)) = (fields[1].parse(), fields[2].parse()) {
            table.push((pid, ppid, pgrp));
        }
    }
    table
}

/// The process groups of `root`'s descendants.
pub fn descendant_groups(root: i32) -> Vec<i32> {
    let table = process_table();
    let mut seen = HashSet::from([root]);
    let mut frontier = vec![root];
    let mut groups = Vec::new();
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid, pgrp) in &table {
            if ppid == parent && seen.insert(pid) {
                frontier.push(pid);
                if !groups.contains(&pgrp) {
                    groups.push(pgrp);
                }
            }
        }
    }
    groups
}

/// Sends `sig` to group `pgid`, never to this process's own group; a group already gone is
/// nothing to do.
pub fn kill_group(pgid: i32, sig: Signal) {
    if pgid > 1 && Pid::from_raw(pgid) != nix::unistd::getpgrp() {
        let _ = nix::sys::signal::killpg(Pid::from_raw(pgid), sig);
    }
}

pub fn signal_pid(pid: i32, sig: Signal) {
    if pid > 1 {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
    }
}

/// `true` while process `pid` exists (zombies included).
pub fn pid_alive(pid: i32) -> bool {
    pid > 1 && nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
}

/// `true` while any process is in group `pgid` (zombies included).
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1 && nix::sys::signal::killpg(Pid::from_raw(pgid), None).is_ok()
}

/// See the module documentation.
pub struct Proc {
    label: String,
    child: Child,
    status: Option<ExitStatus>,
    out: PathBuf,
    err: PathBuf,
    /// Further process groups to kill on drop (e.g. the orphaned command of a SIGKILLed conch).
    pub also_kill: Vec<i32>,
    /// A file in which the started program writes the id of a group to kill on drop.
    group_file: Option<PathBuf>,
}

impl Proc {
    /// Starts `command` in a group of its own, stdin from /dev/null, stdout and stderr into the
    /// files `out` and `err`. `label` names it in errors.
    pub fn spawn(
        mut command: Command,
        label: impl Into<String>,
        out: PathBuf,
        err: PathBuf,
    ) -> anyhow::Result<Proc> {
        let label = label.into();
        let child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .process_group(0)
            .spawn()
            .with_context(|| format!("spawn {label}"))?;
        Ok(Proc {
            label,
            child,
            status: None,
            out,
            err,
            also_kill: Vec::new(),
            group_file: None,
        })
    }

    /// On drop, also kills the group whose id the program wrote to `path` (if it did).
    pub fn kill_group_named_in(mut self, path: PathBuf) -> Proc {
        self.group_file = Some(path);
        self
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Sends `sig` to the process unless it was reaped.
    pub fn signal(&self, sig: Signal) {
        if self.status.is_none() {
            signal_pid(self.pid(), sig);
        }
    }

    /// Waits for the process to end.
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            if let Some(status) = self.child.try_wait()? {
                self.status = Some(status);
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} did not exit within {timeout:?}; stdout: {:?}; stderr: {:?}",
                    self.label,
                    self.stdout(),
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the process to exit and returns its exit code (an error if a signal killed it).
    pub async fn code(&mut self, timeout: Duration) -> anyhow::Result<i32> {
        let status = self.wait(timeout).await?;
        status.code().with_context(|| {
            format!(
                "{} was killed by signal {:?}; stderr: {:?}",
                self.label,
                status.signal(),
                self.stderr()
            )
        })
    }

    /// Exits with `code` within `timeout`, or fails with the output.
    pub async fn expect_code(&mut self, code: i32, timeout: Duration) -> anyhow::Result<()> {
        let got = self.code(timeout).await?;
        ensure!(
            got == code,
            "{} exited {got}, expected {code}; stdout: {:?}; stderr: {:?}",
            self.label,
            self.stdout(),
            self.stderr()
        );
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(pgid) = self
            .group_file
            .as_ref()
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            kill_group(pgid, Signal::SIGKILL);
        }
        if self.status.is_none() {
            // Not reaped yet, so the pid (and group id) cannot have been reused.
            let pid = self.pid();
            for g in descendant_groups(pid) {
                kill_group(g, Signal::SIGKILL);
            }
            kill_group(pid, Signal::SIGKILL);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for &g in &self.also_kill {
            if group_alive(g) {
                kill_group(g, Signal::SIGKILL);
            }
        }
    }
}

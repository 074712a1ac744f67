//! The child: its own process group, forwarded signals, and stopping the whole group.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

/// The signals conch catches (from the moment it starts) and forwards to the child's group.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers. From now on these signals no longer kill conch by default.
    pub(crate) fn install() -> io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }

    /// The next signal received. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.int.recv() => Signal::SIGINT,
            Some(()) = self.term.recv() => Signal::SIGTERM,
            Some(()) = self.hup.recv() => Signal::SIGHUP,
            Some(()) = self.quit.recv() => Signal::SIGQUIT,
            Some(()) = self.usr1.recv() => Signal::SIGUSR1,
            Some(()) = self.usr2.recv() => Signal::SIGUSR2,
            else => std::future::pending().await,
        }
    }
}

/// The variables conch reads its credentials from: the token, the file that holds it, and the
/// client certificate with its key. The command does not inherit them: what it runs (a script,
/// its logs, whatever it calls) has no business with conch's credentials.
pub(crate) const CREDENTIAL_VARS: &[&str] =
    &["CONCH_TOKEN", "CONCH_TOKEN_FILE", "CONCH_CERT", "CONCH_KEY"];

/// `argv` with conch's environment minus [`CREDENTIAL_VARS`], plus `env`.
fn command(argv: &[String], env: &[(&str, String)]) -> io::Result<Command> {
    let Some((program, args)) = argv.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    for var in CREDENTIAL_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Ok(cmd)
}

/// Starts `argv` in a new process group (its pgid is its pid) with `env` added and
/// [`CREDENTIAL_VARS`] removed.
///
/// The command dies with conch: on Linux it gets SIGKILL when the thread that started it ends
/// (`PR_SET_PDEATHSIG`). conch starts it from the one thread of its runtime, which lives as long
/// as conch, so a `kill -9` of conch (or its crash) does not leave the command running without
/// the slot. Processes the command starts itself are not covered here: the guard
/// (the `guard` module) sends SIGKILL to the rest of the group when conch dies, and processes in
/// groups of their own get no signal unless the command passes one on.
pub(crate) fn spawn(argv: &[String], env: &[(&str, String)]) -> io::Result<Child> {
    let mut cmd = command(argv, env)?;
    cmd.process_group(0).kill_on_drop(false);
    let conch = nix::unistd::getpid();
    // SAFETY: between fork and exec the closure only makes two system calls (prctl, getppid),
    // both async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // conch died before the setting took effect: do not run without it.
            if nix::unistd::getppid() != conch {
                return Err(io::Error::other("conch exited before the command started"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `sig` to every process of group `pgid`. A group that is gone is not an error.
pub(crate) fn signal_group(pgid: i32, sig: Signal) {
    if pgid <= 1 {
        return;
    }
    match killpg(Pid::from_raw(pgid), sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => {
            tracing::debug!(pgid, %sig, error = %err, "signalling the process group failed");
        }
    }
}

/// `true` while any process (zombies included) is in group `pgid`.
pub(crate) fn group_alive(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    // No signal: only checks for existence and permission.
    killpg(Pid::from_raw(pgid), None) != Err(Errno::ESRCH)
}

/// Stops the child's whole group: SIGTERM, then SIGKILL once `grace` has passed with anything
/// of the group still alive. Signals received meanwhile are still forwarded. Returns the
/// child's status.
pub(crate) async fn stop_group(
    child: &mut Child,
    pgid: i32,
    grace: Duration,
    signals: &mut Signals,
) -> io::Result<ExitStatus> {
    signal_group(pgid, Signal::SIGTERM);
    finish_stopping(child, pgid, grace, signals).await
}

/// The rest of [`stop_group`], for a group that was already sent SIGTERM: waits up to `grace`
/// for the child and its group, forwarding signals, then sends SIGKILL to what is left.
pub(crate) async fn finish_stopping(
    child: &mut Child,
    pgid: i32,
    grace: Duration,
    signals: &mut Signals,
) -> io::Result<ExitStatus> {
    let deadline = Instant::now() + grace;
    let mut status = None;
    // Wait for the child itself, forwarding signals.
    while status.is_none() && Instant::now() < deadline {
        tokio::select! {
            s = child.wait() => status = Some(s?),
            sig = signals.recv() => signal_group(pgid, sig),
            _ = tokio::time::sleep_until(deadline) => {}
        }
    }
    // Then for the rest of its group.
    while Instant::now() < deadline && group_alive(pgid) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if group_alive(pgid) {
        signal_group(pgid, Signal::SIGKILL);
    }
    match status {
        Some(s) => Ok(s),
        None => child.wait().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Processes of group `pgid` that are not zombies (from /proc).
    fn live_members(pgid: i32) -> usize {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return 0;
        };
        dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after ')'.
                let Some((_, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.len() > 2 && f[2] == pgid.to_string() && f[0] != "Z"
            })
            .count()
    }

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[tokio::test]
    async fn the_child_gets_its_own_group_and_the_environment() {
        let mut child = spawn(
            &argv(&[
                "sh",
                "-c",
                "read -r pid comm state ppid pgrp rest < /proc/$$/stat; \
                 test \"$CONCH_REV\" = 42 && test \"$pgrp\" = $$",
            ]),
            &[("CONCH_REV", "42".to_string())],
        )
        .unwrap();
        let status = child.wait().await.unwrap();
        assert!(status.success(), "{status:?}");
    }

    #[tokio::test]
    async fn stopping_a_group_that_ignores_sigterm_ends_in_sigkill() {
        let mut signals = Signals::install().unwrap();
        // A shell that ignores TERM, and a grandchild in the same group; it says when both are
        // in place.
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let script = format!(
            "trap '' TERM; sleep 30 & touch {}; wait; sleep 30",
            ready.display()
        );
        let mut child = spawn(&argv(&["sh", "-c", &script]), &[]).unwrap();
        let pgid = child.id().unwrap() as i32;
        let t0 = std::time::Instant::now();
        while !ready.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the shell set its trap"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = stop_group(&mut child, pgid, Duration::from_millis(500), &mut signals)
            .await
            .unwrap();
        // Killed, not ended by itself (its `sleep 30` would exit 0): the grace ran out on TERM.
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
        // Killed members may linger as zombies until whoever inherits them reaps them.
        let t1 = std::time::Instant::now();
        while live_members(pgid) > 0 && t1.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(live_members(pgid), 0, "the whole group is gone");
    }

    #[tokio::test]
    async fn stopping_a_cooperative_child_is_quick() {
        let mut signals = Signals::install().unwrap();
        let mut child = spawn(&argv(&["sleep", "30"]), &[]).unwrap();
        let pgid = child.id().unwrap() as i32;
        let status = stop_group(&mut child, pgid, Duration::from_secs(5), &mut signals)
            .await
            .unwrap();
        // Ended by TERM within its grace: not killed after it, not left to run out its sleep.
        assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
    }

    #[test]
    fn the_command_gets_its_variables_and_none_of_conchs_credentials() {
        let cmd = command(
            &argv(&["env"]),
            &[
                ("CONCH_REV", "42".to_string()),
                ("CONCH_LEASE", "ls_1".to_string()),
            ],
        )
        .unwrap();
        let envs: Vec<(String, Option<String>)> = cmd
            .as_std()
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        for var in ["CONCH_TOKEN", "CONCH_TOKEN_FILE", "CONCH_CERT", "CONCH_KEY"] {
            assert!(
                envs.contains(&(var.to_string(), None)),
                "{var} not removed: {envs:?}"
            );
        }
        assert!(envs.contains(&("CONCH_REV".to_string(), Some("42".to_string()))));
        assert!(envs.contains(&("CONCH_LEASE".to_string(), Some("ls_1".to_string()))));
    }

    #[test]
    fn an_empty_command_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(spawn(&[], &[]).is_err());
        });
    }
}

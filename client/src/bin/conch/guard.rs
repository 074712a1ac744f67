//! The guard: a small process beside the command that stops it when conch cannot.
//!
//! conch keeps its promise ("the command is being stopped before anyone else can be granted
//! its slot") by acting on a lost lease. A conch that does not run at all (SIGSTOP, Ctrl-Z, a
//! debugger) cannot act, so before starting the command it starts a guard: itself again
//! (`/proc/self/exe`, the hidden first argument [`SUBCOMMAND`]), a child of conch in a process
//! group of its own: not the command's (signals conch forwards to the command do not reach
//! it), nor conch's (a SIGSTOP or SIGKILL sent to conch's job does not reach it either). The
//! guard runs no async runtime and talks to conch over two pipes.
//!
//! What it cannot cover: a pause of the guard too (a frozen cgroup holding conch and the guard,
//! a stopped machine), and a SIGKILL of the guard itself.
//!
//! conch → guard (the guard's stdin), one line each:
//!
//! - `G <pgid> <deadline>`: the command's process group, and the deadline;
//! - `D <deadline>`: a new deadline, after every successful lease refresh;
//! - `S`: conch itself is stopping the command (it sent SIGTERM): the guard sends SIGKILL
//!   `--kill-after` later unless conch says `X` first, so a conch paused while stopping still
//!   ends it;
//! - `X`: conch is done with the command; exit.
//!
//! A deadline is absolute, in nanoseconds of `CLOCK_BOOTTIME` (monotonic, and it keeps
//! counting while the machine sleeps), so a message written late never moves it later. It is
//! [`guard_after`] past the last successful refresh: conch itself gives up at
//! `ttl − margin` ([`conch_client::loss_after`]), the server cannot expire the lease before
//! `ttl`, and the guard acts halfway between. A running conch therefore always acts first (one
//! SIGTERM, its own line), and a stopped one is overtaken at least `margin/2` (≥ 250 ms; 500 ms
//! from a 2 s TTL on) before the server could grant the slot to someone else.
//!
//! The guard:
//!
//! - deadline passed without renewal: writes `F` on its stdout (conch reads it when it runs
//!   again), sends SIGTERM to the group, SIGKILL `--kill-after` later, and exits;
//! - conch gone (its stdin reaches end of file, or its parent changed): SIGKILL to the group at
//!   once, and exits. It asks for SIGTERM as its parent-death signal, and catches it, so it
//!   dies with conch but kills the group first;
//! - the signals a terminal or a user may send (INT, QUIT, HUP, TERM, USR1, USR2, and the
//!   job-control stops TSTP, TTIN, TTOU) are blocked and read from a signalfd, so they leave
//!   the guard running: conch forwards what the command should get, and a conch stopped by
//!   Ctrl-Z is overtaken like any paused one.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::time::{ClockId, clock_gettime};

use crate::child::signal_group;

/// The hidden first argument that makes `conch` a guard.
pub(crate) const SUBCOMMAND: &str = "__guard";

/// The guard's longest sleep: it looks at the clock at least this often, so a machine that
/// slept (the poll timeout does not count that time) is noticed quickly.
const TICK: Duration = Duration::from_millis(250);

/// How long after the last successful refresh (sent at that instant) the guard stops the
/// command: `ttl` minus half the safety margin conch itself keeps ([`conch_client::loss_after`]).
pub(crate) fn guard_after(ttl: Duration) -> Duration {
    let margin = ttl.saturating_sub(conch_client::loss_after(ttl));
    ttl - margin / 2
}

/// Now on `CLOCK_BOOTTIME`, in nanoseconds.
fn boot_now_ns() -> i128 {
    match clock_gettime(ClockId::CLOCK_BOOTTIME) {
        Ok(t) => i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()),
        // Not on this kernel (it is, since Linux 2.6.39): the monotonic clock is the next best.
        Err(_) => match clock_gettime(ClockId::CLOCK_MONOTONIC) {
            Ok(t) => i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec()),
            Err(_) => 0,
        },
    }
}

/// `at` (an `Instant` of this process) on `CLOCK_BOOTTIME`.
fn boot_ns_at(at: Instant) -> i128 {
    let (boot, now) = (boot_now_ns(), Instant::now());
    if at >= now {
        boot + (at - now).as_nanos() as i128
    } else {
        boot - (now - at).as_nanos() as i128
    }
}

// ---------------------------------------------------------------------------------------------
// conch's side
// ---------------------------------------------------------------------------------------------

/// conch's handle on its guard.
pub(crate) struct Guard {
    process: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    ttl: Duration,
    /// The latest the command may run to, whatever the refreshes say (a hold limit).
    cap: Option<Instant>,
    fired: bool,
    /// The guard could not be told something (it is gone): said once.
    warned: bool,
}

impl Guard {
    /// Starts the guard for a command that will be stopped with `kill_after` of grace.
    pub(crate) fn start(ttl: Duration, kill_after: Duration) -> io::Result<Guard> {
        use std::os::unix::process::CommandExt;
        let mut process = Command::new("/proc/self/exe")
            .arg0("conch")
            .process_group(0)
            .arg(SUBCOMMAND)
            .arg(std::process::id().to_string())
            .arg(kill_after.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
            let _ = process.kill();
            let _ = process.wait();
            return Err(io::Error::other("no pipe to the guard"));
        };
        Ok(Guard {
            process,
            stdin: Some(stdin),
            stdout,
            ttl,
            cap: None,
            fired: false,
            warned: false,
        })
    }

    fn deadline(&self, refreshed: Instant) -> i128 {
        let by_lease = refreshed + guard_after(self.ttl);
        boot_ns_at(self.cap.map_or(by_lease, |cap| cap.min(by_lease)))
    }

    /// Makes `at` the latest deadline, whatever later refreshes say (before [`Guard::watch`]).
    pub(crate) fn cap(&mut self, at: Instant) {
        self.cap = Some(at);
    }

    fn send(&mut self, line: &str) {
        let Some(stdin) = self.stdin.as_mut() else {
            return;
        };
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            // A guard that stopped the command has exited: nothing to warn about.
            if !self.warned && !self.fired() {
                self.warned = true;
                eprintln!(
                    "conch: warning: the guard process is gone ({e}); a paused conch can no longer stop the command in time"
                );
            }
        }
    }

    /// Guards process group `pgid`, with the lease last refreshed at `refreshed`.
    pub(crate) fn watch(&mut self, pgid: i32, refreshed: Instant) {
        let line = format!("G {pgid} {}\n", self.deadline(refreshed));
        self.send(&line);
    }

    /// Moves the deadline after a refresh sent at `refreshed` succeeded.
    pub(crate) fn renew(&mut self, refreshed: Instant) {
        let line = format!("D {}\n", self.deadline(refreshed));
        self.send(&line);
    }

    /// conch is stopping the command itself (SIGTERM is about to be sent).
    pub(crate) fn stopping(&mut self) {
        self.send("S\n");
    }

    /// `true` once the guard has said that the deadline passed and it stopped the command.
    pub(crate) fn fired(&mut self) -> bool {
        if self.fired {
            return true;
        }
        let mut fds = [PollFd::new(self.stdout.as_fd(), PollFlags::POLLIN)];
        if matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0) {
            let mut buf = [0u8; 16];
            if let Ok(n) = self.stdout.read(&mut buf) {
                self.fired = buf[..n].contains(&b'F');
            }
        }
        self.fired
    }

    /// Tells the guard to exit and waits (briefly) until it has.
    pub(crate) async fn finish(mut self) {
        // A guard that stopped the command, or sent the SIGKILL after conch's own stop, has
        // exited already: not being able to tell it is then no news.
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"X\n");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match self.process.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => break,
                Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        // Stopped or stuck: it has nothing left to do.
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The guard process
// ---------------------------------------------------------------------------------------------

/// What the guard knows.
#[derive(Debug, Default, PartialEq)]
struct State {
    pgid: Option<i32>,
    deadline: Option<i128>,
    /// When to send SIGKILL (set once the group was sent SIGTERM, by conch or the guard).
    kill_at: Option<i128>,
}

/// What the guard does next.
#[derive(Debug, PartialEq)]
enum Step {
    Continue,
    /// Deadline passed: report, SIGTERM the group, SIGKILL at `kill_at`.
    Fire,
    /// SIGKILL the group and exit.
    KillAndExit,
    Exit,
}

impl State {
    /// Applies one line from conch.
    fn message(&mut self, line: &str, now: i128, kill_after: i128) -> Step {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["G", pgid, deadline] => {
                if let (Ok(pgid), Ok(deadline)) = (pgid.parse::<i32>(), deadline.parse())
                    && pgid > 1
                {
                    self.pgid = Some(pgid);
                    self.deadline = Some(deadline);
                }
            }
            ["D", deadline] => {
                if let Ok(deadline) = deadline.parse() {
                    self.deadline = Some(deadline);
                }
            }
            ["S"] => {
                self.kill_at.get_or_insert(now + kill_after);
            }
            ["X"] => return Step::Exit,
            _ => {}
        }
        Step::Continue
    }

    /// What time alone asks for at `now`.
    fn tick(&mut self, now: i128, kill_after: i128) -> Step {
        if self.pgid.is_none() {
            return Step::Continue;
        }
        match (self.kill_at, self.deadline) {
            (Some(kill_at), _) if now >= kill_at => Step::KillAndExit,
            (None, Some(deadline)) if now >= deadline => {
                self.kill_at = Some(now + kill_after);
                Step::Fire
            }
            _ => Step::Continue,
        }
    }

    /// How long the guard may sleep at `now`.
    fn sleep(&self, now: i128) -> Duration {
        let next = self
            .kill_at
            .or(self.deadline)
            .filter(|_| self.pgid.is_some());
        match next {
            Some(at) => Duration::from_nanos((at - now).clamp(0, TICK.as_nanos() as i128) as u64),
            None => TICK,
        }
    }
}

fn kill_group(state: &State, sig: Signal) {
    if let Some(pgid) = state.pgid {
        signal_group(pgid, sig);
    }
}

/// The guard's `main`: `conch __guard <conch pid> <kill-after ms>`.
pub(crate) fn main(args: &[OsString]) -> ExitCode {
    let parsed = match args {
        [pid, ms] => pid
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
            .zip(ms.to_str().and_then(|m| m.parse::<u64>().ok())),
        _ => None,
    };
    let Some((conch, kill_after_ms)) = parsed else {
        eprintln!("conch: {SUBCOMMAND} is started by `conch sema` itself");
        return ExitCode::from(crate::exit::USAGE);
    };
    match serve(conch, Duration::from_millis(kill_after_ms)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conch: guard: {e}");
            ExitCode::from(crate::exit::SOFTWARE)
        }
    }
}

fn serve(conch: i32, kill_after: Duration) -> io::Result<()> {
    let kill_after = kill_after.as_nanos() as i128;
    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
    let conch_alive = || nix::unistd::getppid().as_raw() == conch;
    if !conch_alive() {
        // conch is gone before the setting took effect; there is nothing to guard yet.
        return Ok(());
    }
    let mut mask = SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        mask.add(sig);
    }
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
    let mut input = std::fs::File::from(io::stdin().as_fd().try_clone_to_owned()?);
    let mut out = io::stdout();

    let mut state = State::default();
    let mut pending = Vec::new();
    loop {
        let timeout =
            PollTimeout::try_from(state.sleep(boot_now_ns())).unwrap_or(PollTimeout::ZERO);
        let (input_ready, signalled) = {
            let mut fds = [
                PollFd::new(input.as_fd(), PollFlags::POLLIN),
                PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
            let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if signalled {
            while let Ok(Some(_)) = signals.read_signal() {}
        }
        let mut conch_gone = !conch_alive();
        if input_ready && !conch_gone {
            let mut buf = [0u8; 512];
            match input.read(&mut buf) {
                Ok(0) => conch_gone = true,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => conch_gone = true,
            }
        }
        if conch_gone {
            kill_group(&state, Signal::SIGKILL);
            return Ok(());
        }
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if state.message(&line, boot_now_ns(), kill_after) == Step::Exit {
                return Ok(());
            }
        }
        match state.tick(boot_now_ns(), kill_after) {
            Step::Continue => {}
            Step::Fire => {
                // Said before the signal, so conch finds it once it sees its command end.
                let _ = out.write_all(b"F\n").and_then(|()| out.flush());
                kill_group(&state, Signal::SIGTERM);
            }
            Step::KillAndExit => {
                kill_group(&state, Signal::SIGKILL);
                return Ok(());
            }
            Step::Exit => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    #[test]
    fn the_guard_acts_between_conch_giving_up_and_the_ttl() {
        for secs in 1..=300 {
            let ttl = Duration::from_secs(secs);
            let g = guard_after(ttl);
            assert!(g > conch_client::loss_after(ttl), "{ttl:?}");
            assert!(g < ttl, "{ttl:?}");
            assert!(ttl - g >= Duration::from_millis(250), "{ttl:?}");
        }
        assert_eq!(
            guard_after(Duration::from_secs(3)),
            Duration::from_millis(2500)
        );
        assert_eq!(guard_after(Duration::from_secs(10)), Duration::from_secs(9));
    }

    #[test]
    fn a_deadline_not_renewed_fires_once_then_kills() {
        let mut s = State::default();
        // Nothing to guard yet: time alone does nothing.
        assert_eq!(s.tick(100 * S, S), Step::Continue);
        assert_eq!(s.message("G 4242 10000000000\n", 0, S), Step::Continue);
        assert_eq!(s.pgid, Some(4242));
        assert_eq!(s.tick(9 * S, S), Step::Continue);
        assert_eq!(s.message("D 20000000000", 9 * S, S), Step::Continue);
        assert_eq!(s.tick(19 * S, S), Step::Continue);
        assert_eq!(s.tick(20 * S, S), Step::Fire);
        assert_eq!(s.kill_at, Some(21 * S));
        // A late renewal does not undo the stop.
        s.message("D 90000000000", 20 * S, S);
        assert_eq!(s.tick(20 * S + 1, S), Step::Continue);
        assert_eq!(s.tick(21 * S, S), Step::KillAndExit);
    }

    #[test]
    fn conch_stopping_the_command_itself_means_only_a_later_sigkill() {
        let mut s = State::default();
        s.message("G 4242 6000000000", 0, S);
        s.message("S", 5 * S, 2 * S);
        assert_eq!(s.kill_at, Some(7 * S));
        // The deadline no longer matters: no second SIGTERM.
        assert_eq!(s.tick(6 * S, 2 * S), Step::Continue);
        assert_eq!(s.tick(7 * S, 2 * S), Step::KillAndExit);
        assert_eq!(s.message("X", 8 * S, 2 * S), Step::Exit);
    }

    #[test]
    fn garbage_changes_nothing() {
        let mut s = State::default();
        for line in [
            "", "G", "G 1 5", "G x 5", "G 10 y", "D", "D z", "Q 1", "G 10 5 6",
        ] {
            assert_eq!(s.message(line, 0, S), Step::Continue, "{line:?}");
        }
        assert_eq!(s, State::default());
    }

    #[test]
    fn the_guard_sleeps_until_its_next_deadline_but_never_long() {
        let mut s = State::default();
        assert_eq!(s.sleep(0), TICK);
        s.message("G 4242 100000000", 0, S);
        assert_eq!(s.sleep(0), Duration::from_millis(100));
        assert_eq!(s.sleep(S), Duration::ZERO);
        s.message("D 100000000000", 0, S);
        assert_eq!(s.sleep(0), TICK);
    }

    #[test]
    fn instants_map_onto_the_boot_clock() {
        let now = Instant::now();
        let a = boot_ns_at(now);
        let b = boot_ns_at(now + Duration::from_secs(5));
        let d = b - a;
        assert!((d - 5 * S).abs() < S / 10, "{d}");
    }
}

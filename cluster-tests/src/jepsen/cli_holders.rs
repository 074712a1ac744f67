//! `conch sema` holders beside the workload, and the `pause-client` fault.
//!
//! A few holders run the real `conch` binary against the run's cluster, over and over:
//! `conch sema <name> --max <max> --ttl 3s --wait 20s --kill-after 1s -- sh -c …`, two
//! semaphores (`cli1` with 1 slot, `cli2` with 2), three holders each. Each command appends to
//! one shared log (small `>>` appends, one `write` each, so the file's line order is the real
//! order of the writes):
//!
//! - `start <id>` first thing;
//! - `stop <id>` from its SIGTERM trap (then it exits), the moment it learns it is being
//!   stopped;
//! - `end <id>` when it finishes on its own (after 2–6 s, often longer than the TTL);
//! - and the harness appends `gone <id>` once that run's conch has exited (its command is gone
//!   by then: conch waits for it, and a command of a conch that dies is killed with it).
//!
//! `<id>` is `<semaphore>/<holder>/<run>`.
//!
//! **`pause-client`** sends SIGSTOP to one holder's `conch` process (its pid only; the holder
//! whose command started last, if any runs) for 4.5–6 s, longer than the TTL, then SIGCONT. conch cannot act
//! while stopped; its guard must stop the command before the lease can expire, and conch,
//! resumed, exits 79 with one line saying it was paused (counted as a "guard stop").
//!
//! **The check** (what the book promises: a command is *being stopped* before anyone else can
//! be granted its slot beyond capacity). A command counts as running from its `start` line to
//! the first of its `stop`, `end` or `gone` lines; walking the log in order, a `start` of a
//! semaphore that already has `max` commands running is a violation. The `--kill-after` window
//! is deliberately not counted: a command that got SIGTERM has been told to stop, and a new
//! holder may start while it is stopping (the book says so: commands must be idempotent or
//! crash-tolerant). The `stop` line is written a little after the SIGTERM was sent (the shell's
//! reaction time), while conch sends SIGTERM a full safety margin (≥ 1 s here) and a paused
//! conch's guard half of it (≥ 500 ms) before the server could expire the lease, so the check
//! is not weakened by that delay; a shell slower than that would show up as a violation.
//!
//! The holders need plain TCP without access control (the run's default); with `--tls` or
//! `--auth` they are not started and `pause-client` is left out of the menu.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::rng::Rng;

/// Starts the holders for a run if `enabled` (and the `conch` binary is there); otherwise
/// leaves [`FAULT`] out of the menu (`exclude`). Also returns a line saying which.
pub fn for_run(
    enabled: bool,
    endpoints: &[String],
    dir: &Path,
    seed: u64,
    exclude: &mut Vec<String>,
) -> (Option<CliHolders>, String) {
    let started = if enabled {
        CliHolders::start(&crate::binary("conch"), endpoints, dir, seed)
    } else {
        Err("off (TLS or access control, or not asked for)".into())
    };
    match started {
        Ok(h) => (Some(h), format!("{} conch sema holders started", h_count())),
        Err(why) => {
            exclude.push(FAULT.to_string());
            (None, format!("conch sema holders: {why}; {FAULT} left out"))
        }
    }
}

fn h_count() -> usize {
    SEMAPHORES.iter().map(|s| s.2).sum()
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "conch sema holders: runs={} exits={:?} pauses={} stopped-by-guard={}",
            self.runs, self.exits, self.pauses, self.guard_stops
        )
    }
}

/// The fault's name in the nemesis menu.
pub const FAULT: &str = "pause-client";

/// The holders' lease TTL.
pub const TTL: Duration = Duration::from_secs(3);

/// How long `pause-client` keeps a conch stopped (ms): longer than [`TTL`].
pub const PAUSE_MS: (u64, u64) = (4500, 6000);

/// The semaphores (CLI name, slots) and how many holders each has.
const SEMAPHORES: [(&str, u64, usize); 2] = [("cli1", 1, 3), ("cli2", 2, 3)];

/// The command each holder runs (`$LOG`, `$ID`, `$HOLD` from the environment).
const SCRIPT: &str = r#"echo "start $ID" >> "$LOG"; trap 'echo "stop $ID" >> "$LOG"; exit 0' TERM; sleep "$HOLD" & wait; echo "end $ID" >> "$LOG""#;

/// One holder's current conch, if any.
struct Slot {
    sem: &'static str,
    run: u64,
    child: Option<Child>,
    /// The conch this holder has stopped, to resume.
    paused: bool,
}

/// What the holders did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub runs: u64,
    /// conch exit codes (`-1`: killed by a signal) and how often.
    pub exits: BTreeMap<i32, u64>,
    /// Runs that ended with conch saying its slot was lost while it was paused.
    pub guard_stops: u64,
    pub pauses: u64,
}

pub struct CliHolders {
    log: PathBuf,
    stop: Arc<AtomicBool>,
    slots: Vec<Arc<Mutex<Slot>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stats: Arc<Mutex<Stats>>,
    rng: Mutex<Rng>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn append(log: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
    {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

impl CliHolders {
    /// Starts the holders against `endpoints`, with the log and their stderr in `dir`.
    /// `Err` names why they cannot run (no `conch` binary).
    pub fn start(
        conch: &Path,
        endpoints: &[String],
        dir: &Path,
        seed: u64,
    ) -> Result<CliHolders, String> {
        if !conch.is_file() {
            return Err(format!("no conch binary at {}", conch.display()));
        }
        let log = dir.join("cli-holders.log");
        File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let mut slots = Vec::new();
        let mut tasks = Vec::new();
        let mut n = 0u64;
        for (sem, max, holders) in SEMAPHORES {
            for _ in 0..holders {
                n += 1;
                let slot = Arc::new(Mutex::new(Slot {
                    sem,
                    run: 0,
                    child: None,
                    paused: false,
                }));
                slots.push(Arc::clone(&slot));
                let holder = Holder {
                    index: n,
                    max,
                    conch: conch.to_path_buf(),
                    endpoints: endpoints.join(","),
                    log: log.clone(),
                    stderr: dir.join(format!("cli-holder-{n}.err")),
                    stop: Arc::clone(&stop),
                    stats: Arc::clone(&stats),
                    slot,
                    rng: Rng::derive(seed, 1_000 + n),
                };
                tasks.push(tokio::spawn(holder.run()));
            }
        }
        Ok(CliHolders {
            log,
            stop,
            slots,
            tasks,
            stats,
            rng: Mutex::new(Rng::derive(seed, 999)),
        })
    }

    /// SIGSTOP to one holder's conch: the one whose command started last, if any runs now
    /// (it is the likeliest to outlive the lease), else any; what was done.
    pub fn pause_one(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let running = running_now(&text);
        let mut candidates: Vec<(usize, bool)> = Vec::new();
        // Where each candidate's command is in `running` (start order), if it runs.
        let mut order: Vec<Option<usize>> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let mut s = lock(slot);
            let sem = s.sem;
            let run = s.run;
            if let Some(child) = s.child.as_mut()
                && matches!(child.try_wait(), Ok(None))
                && !s.paused
            {
                let id = format!("{sem}/{}/{run}", i + 1);
                candidates.push((i, running.contains(&id)));
                order.push(running.iter().position(|r| *r == id));
            }
        }
        let latest = (0..candidates.len())
            .filter(|&c| order[c].is_some())
            .max_by_key(|&c| order[c]);
        let chosen = match latest {
            Some(c) => candidates.get(c),
            None => lock(&self.rng).pick(&candidates),
        };
        let Some(&(i, holds)) = chosen else {
            return "no conch holder running".into();
        };
        let mut s = lock(&self.slots[i]);
        let sem = s.sem;
        let Some(pid) = s.child.as_mut().and_then(|c| match c.try_wait() {
            // Not reaped: the pid is still this conch's.
            Ok(None) => Some(c.id() as i32),
            _ => None,
        }) else {
            return "no conch holder running".into();
        };
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        s.paused = true;
        lock(&self.stats).pauses += 1;
        format!(
            "SIGSTOP conch pid {pid} ({sem} holder {}, {})",
            i + 1,
            if holds { "holding" } else { "not holding" }
        )
    }

    /// SIGCONT to every conch [`CliHolders::pause_one`] stopped.
    pub fn resume_all(&self) {
        for slot in &self.slots {
            let mut s = lock(slot);
            if s.paused {
                s.paused = false;
                if let Some(child) = s.child.as_mut()
                    && matches!(child.try_wait(), Ok(None))
                {
                    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
                }
            }
        }
    }

    /// Stops the holders (SIGTERM to every conch: it forwards it to its command, which stops,
    /// and frees its slot), waits for them (SIGKILL after `bound`), and checks the log against
    /// the semaphores' capacities: the violations found, and what the holders did.
    pub async fn stop(mut self, bound: Duration) -> (Vec<String>, Stats) {
        self.stop.store(true, Ordering::SeqCst);
        self.resume_all();
        let term = |sig: Signal| {
            for slot in &self.slots {
                let mut s = lock(slot);
                if let Some(child) = s.child.as_mut()
                    && matches!(child.try_wait(), Ok(None))
                {
                    let _ = kill(Pid::from_raw(child.id() as i32), sig);
                }
            }
        };
        term(Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + bound;
        for task in &self.tasks {
            while !task.is_finished() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        term(Signal::SIGKILL);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        let capacities: BTreeMap<String, u64> = SEMAPHORES
            .iter()
            .map(|(s, max, _)| (s.to_string(), *max))
            .collect();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut violations = check_log(&text, &capacities);
        if !self.log.exists() {
            violations.push(format!("the holders' log {} is gone", self.log.display()));
        }
        let stats = lock(&self.stats).clone();
        (violations, stats)
    }
}

struct Holder {
    index: u64,
    max: u64,
    conch: PathBuf,
    endpoints: String,
    log: PathBuf,
    stderr: PathBuf,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<Stats>>,
    slot: Arc<Mutex<Slot>>,
    rng: Rng,
}

impl Holder {
    async fn run(mut self) {
        while !self.stop.load(Ordering::SeqCst) {
            let (sem, run) = {
                let mut s = lock(&self.slot);
                s.run += 1;
                (s.sem, s.run)
            };
            let id = format!("{sem}/{}/{run}", self.index);
            let hold = format!("{:.1}", self.rng.range(20, 60) as f64 / 10.0);
            let Ok(stderr) = File::create(&self.stderr) else {
                return;
            };
            let ttl = format!("{}s", TTL.as_secs());
            let max = self.max.to_string();
            let spawned = {
                use std::os::unix::process::CommandExt;
                Command::new(&self.conch)
                    .args(["sema", sem, "--max", &max, "--ttl", &ttl])
                    .args(["--wait", "20s", "--kill-after", "1s", "--", "sh", "-c"])
                    .arg(SCRIPT)
                    .env("CONCH_ENDPOINTS", &self.endpoints)
                    .env("LOG", &self.log)
                    .env("ID", &id)
                    .env("HOLD", &hold)
                    .env_remove("CONCH_LOG")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(stderr)
                    .process_group(0)
                    .spawn()
            };
            let Ok(child) = spawned else {
                return;
            };
            lock(&self.slot).child = Some(child);
            let status = loop {
                let done = {
                    let mut s = lock(&self.slot);
                    match s.child.as_mut().map(Child::try_wait) {
                        Some(Ok(Some(status))) => Some(Some(status)),
                        Some(Ok(None)) => None,
                        _ => Some(None),
                    }
                };
                if let Some(status) = done {
                    lock(&self.slot).child = None;
                    break status;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            append(&self.log, &format!("gone {id}"));
            let code = status.and_then(|s| s.code()).unwrap_or(-1);
            let said = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            {
                let mut st = lock(&self.stats);
                st.runs += 1;
                *st.exits.entry(code).or_default() += 1;
                if code == 79 && said.contains("paused") {
                    st.guard_stops += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(self.rng.range(20, 300))).await;
        }
    }
}

impl Drop for CliHolders {
    /// Whatever happened, no conch (nor its command, which dies with it) outlives the run.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for slot in &self.slots {
            let mut s = lock(slot);
            if let Some(mut child) = s.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The ids whose commands run at the end of `log` (started, and not stopped, ended or gone),
/// in the order they started.
fn running_now(log: &str) -> Vec<String> {
    let mut running: Vec<String> = Vec::new();
    for line in log.lines() {
        match line.split_once(' ') {
            Some(("start", id)) => running.push(id.to_string()),
            Some((_, id)) => running.retain(|r| r != id),
            None => {}
        }
    }
    running
}

/// The check of the module docs: every `start` of a semaphore that already had `max` commands
/// running (not yet told to stop) is a violation; so is a line that cannot be read.
pub fn check_log(log: &str, capacities: &BTreeMap<String, u64>) -> Vec<String> {
    let mut violations = Vec::new();
    let mut running: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for (n, line) in log.lines().enumerate() {
        let n = n + 1;
        let parsed = line
            .split_once(' ')
            .and_then(|(kind, id)| Some((kind, id, id.split('/').next()?)));
        let Some((kind, id, sem)) = parsed else {
            violations.push(format!("cli holders' log line {n} unreadable: {line:?}"));
            continue;
        };
        let Some(&max) = capacities.get(sem) else {
            violations.push(format!(
                "cli holders' log line {n}: unknown semaphore {line:?}"
            ));
            continue;
        };
        let now = running.entry(sem).or_default();
        match kind {
            "start" if done.contains(id) || now.contains(id) => {
                violations.push(format!("cli holders' log line {n}: {id} started twice"));
            }
            "start" => {
                if now.len() as u64 >= max {
                    violations.push(format!(
                        "cli holders' log line {n}: {id} started while {now:?} still ran without being told to stop ({sem} has {max} slot(s))"
                    ));
                }
                now.insert(id);
            }
            "stop" | "end" | "gone" => {
                now.remove(id);
                done.insert(id);
            }
            _ => violations.push(format!("cli holders' log line {n} unreadable: {line:?}")),
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> BTreeMap<String, u64> {
        BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 2)])
    }

    #[test]
    fn a_start_after_the_previous_was_told_to_stop_is_fine() {
        let log = "start a/1/1\nstop a/1/1\nstart a/2/1\ngone a/1/1\nend a/2/1\ngone a/2/1\n";
        assert_eq!(check_log(log, &caps()), Vec::<String>::new());
        let log = "start b/1/1\nstart b/2/1\nend b/1/1\nstart b/3/1\n";
        assert_eq!(check_log(log, &caps()), Vec::<String>::new());
    }

    #[test]
    fn a_start_beyond_capacity_is_found() {
        let v = check_log("start a/1/1\nstart a/2/1\nstop a/1/1\n", &caps());
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("line 2") && v[0].contains("a/1/1"), "{v:?}");
        let v = check_log("start b/1/1\nstart b/2/1\nstart b/3/1\n", &caps());
        assert_eq!(v.len(), 1, "{v:?}");
        // Semaphores are counted apart.
        assert!(check_log("start a/1/1\nstart b/2/1\n", &caps()).is_empty());
    }

    #[test]
    fn garbage_and_repeats_are_violations() {
        assert_eq!(check_log("hello\n", &caps()).len(), 1);
        assert_eq!(check_log("start z/1/1\n", &caps()).len(), 1);
        assert_eq!(
            check_log("start a/1/1\nend a/1/1\nstart a/1/1\n", &caps()).len(),
            1
        );
        assert_eq!(check_log("begin a/1/1\n", &caps()).len(), 1);
    }

    #[test]
    fn running_now_follows_the_log() {
        let log = "start a/1/1\nstart b/2/1\nstop a/1/1\nstart a/3/1\n";
        assert_eq!(running_now(log), ["b/2/1", "a/3/1"]);
    }
}

//! The `conch` CLI end to end: real `conch` processes against a real 3-node conchd cluster.
//!
//! The commands conch runs are small shell scripts that write what they see (timestamps from
//! `date +%s%N`, `$CONCH_REV`, `$CONCH_LEASE`, `$PPID`) to files in a per-test directory; the
//! tests read those files back. Commands that must hold their slot for a while wait for a
//! "gate" file the test creates, so no correctness check depends on a fixed sleep.
//!
//! Every process a test starts (a `conch`, or a shell running `conch`) runs in a process group
//! of its own and is killed on drop, together with the process groups of its descendants (conch
//! puts its command in a group of its own), also when the test fails.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use cluster_tests::proc::{Proc, group_alive, pid_alive, process_table};
use cluster_tests::{Cluster, binary, wait_for};
use conch_client::sema::META_PID;
use conch_proto::conch::ListSemaphoreWaitersRequest;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle as pb;
use nix::sys::signal::Signal;

/// How long any single conch run may take in these tests before it counts as hung.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a condition (a file written, a waiter queued) may take to show up.
const SHOW_UP: Duration = Duration::from_secs(20);

const EX_NO_SLOT: i32 = 75;
const EX_SLOT_LOST: i32 = 79;
const EX_HOLD_LIMIT: i32 = 80;
const EX_USAGE: i32 = 64;
const EX_UNAVAILABLE: i32 = 69;

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as i128
}

// ---------------------------------------------------------------------------------------------
// Fixture: a cluster and a scratch directory
// ---------------------------------------------------------------------------------------------

struct Fixture {
    cluster: Cluster,
    dir: tempfile::TempDir,
    spawned: std::cell::Cell<usize>,
    passed: std::cell::Cell<bool>,
}

impl Drop for Fixture {
    /// A test that did not reach [`Fixture::passed`] (an error or a panic) prints what the
    /// processes and the nodes said, before the scratch directories go.
    fn drop(&mut self) {
        if !self.passed.get() {
            eprintln!("{}", self.outputs_and_logs());
        }
    }
}

impl Fixture {
    async fn start() -> anyhow::Result<Fixture> {
        let cluster = Cluster::start(3).await?;
        let dir = tempfile::Builder::new().prefix("conch-cli-").tempdir()?;
        Ok(Fixture {
            cluster,
            dir,
            spawned: std::cell::Cell::new(0),
            passed: std::cell::Cell::new(false),
        })
    }

    /// Ends a test that passed.
    fn passed(&self) -> anyhow::Result<()> {
        self.passed.set(true);
        Ok(())
    }

    fn endpoints(&self) -> String {
        self.cluster.endpoints().join(",")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    fn touch(&self, name: &str) -> anyhow::Result<()> {
        std::fs::write(self.path(name), b"")?;
        Ok(())
    }

    /// Writes an executable script into the scratch directory.
    fn script(&self, name: &str, body: &str) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path(name);
        std::fs::write(&path, body)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }

    /// Starts `program args…` in the scratch directory, in a process group of its own, with
    /// `CONCH_ENDPOINTS` naming the cluster, `T` the scratch directory, conch on the `PATH`,
    /// and `env` added.
    fn spawn(&self, program: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Proc> {
        let n = self.spawned.get() + 1;
        self.spawned.set(n);
        let out = self.path(&format!("proc{n}.out"));
        let err = self.path(&format!("proc{n}.err"));
        let bin_dir = binary("conch")
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
        );
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("CONCH_ENDPOINTS", self.endpoints())
            .env("T", self.dir.path())
            .env("PATH", path)
            .env_remove("CONCH_LOG")
            .envs(env.iter().copied());
        let label = format!("[{n}] {} {}", program.display(), args.join(" "));
        Proc::spawn(cmd, label, out, err)
    }

    /// `conch args…`.
    fn conch(&self, args: &[&str]) -> anyhow::Result<Proc> {
        self.spawn(&binary("conch"), args, &[])
    }

    /// `conch args…` with `env` added (the command inherits it).
    fn conch_env(&self, env: &[(&str, &str)], args: &[&str]) -> anyhow::Result<Proc> {
        self.spawn(&binary("conch"), args, env)
    }

    /// `sh -c script`, with conch on the PATH.
    fn shell(&self, env: &[(&str, &str)], script: &str) -> anyhow::Result<Proc> {
        self.spawn(Path::new("sh"), &["-c", script], env)
    }

    /// Runs `conch args…` to the end: (exit code, stdout, stderr).
    async fn run(&self, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
        let mut p = self.conch(args)?;
        let code = p.code(EXIT_TIMEOUT).await?;
        Ok((code, p.stdout(), p.stderr()))
    }

    /// Waits until file `name` exists and `pred` holds for its contents; returns them.
    async fn wait_file(&self, name: &str, pred: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        let path = self.path(name);
        let r = wait_for(
            &format!("{} to be written", path.display()),
            SHOW_UP,
            || {
                let text = std::fs::read_to_string(&path).ok().filter(|t| pred(t));
                async move { text }
            },
        )
        .await;
        match r {
            Ok(text) => Ok(text),
            Err(e) => Err(e.context(format!(
                "{name} holds {:?}\n{}",
                self.read(name),
                self.diagnose().await
            ))),
        }
    }

    /// What the cluster looks like, for failure messages: every conch semaphore with its
    /// holders and waiters (from whichever node answers). The processes' output and the node
    /// logs are printed when the fixture of a failed test is dropped.
    async fn diagnose(&self) -> String {
        let mut out = String::new();
        for id in self.cluster.running_ids() {
            let Ok(mut g) = self.cluster.grackle(id).await else {
                continue;
            };
            let Ok(r) = g
                .list_semaphores(pb::ListSemaphoresRequest {
                    namespace_name: "conch".into(),
                    ..Default::default()
                })
                .await
            else {
                continue;
            };
            for sem in r.into_inner().semaphores {
                let holders = cluster_tests::ops::holders(&mut g, "conch", &sem.name)
                    .await
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.metadata.get(META_PID).cloned(), h.fencing_token))
                            .collect::<Vec<_>>()
                    });
                out += &format!(
                    "node {id}: conch/{} permits={} active={} holders(pid, rev)={holders:?} waiters(pid)={:?}\n",
                    sem.name,
                    sem.permits,
                    sem.active_holds,
                    self.waiter_pids(&sem.name).await
                );
            }
            break;
        }
        out
    }

    /// The output of every process started, and the last lines of every node's log.
    fn outputs_and_logs(&self) -> String {
        let mut out = String::new();
        for n in 1..=self.spawned.get() {
            let read = |ext: &str| {
                std::fs::read_to_string(self.path(&format!("proc{n}.{ext}"))).unwrap_or_default()
            };
            out += &format!(
                "proc {n}: stdout {:?} stderr {:?}\n",
                read("out"),
                read("err")
            );
        }
        for id in self.cluster.nodes.keys() {
            let log = self.cluster.log(*id);
            let lines: Vec<&str> = log.lines().collect();
            out += &format!("--- node {id} log (last 40 lines)\n");
            for l in &lines[lines.len().saturating_sub(40)..] {
                out += l;
                out.push('\n');
            }
        }
        out
    }

    /// The pids (conch's, from the waiter metadata) queued on `conch/<sem>`, in queue order,
    /// asked through the ConchApi extension of whichever node answers.
    async fn waiter_pids(&self, sem: &str) -> Option<Vec<i32>> {
        for addr in self.cluster.endpoints() {
            let Ok(channel) = cluster_tests::channel(&addr).await else {
                continue;
            };
            let mut api = ConchApiClient::new(channel);
            let request = ListSemaphoreWaitersRequest {
                namespace_name: "conch".into(),
                semaphore_name: sem.into(),
                ..Default::default()
            };
            if let Ok(r) = api.list_semaphore_waiters(request).await {
                return Some(
                    r.into_inner()
                        .waiters
                        .iter()
                        .map(|w| {
                            w.metadata
                                .get(META_PID)
                                .and_then(|p| p.parse().ok())
                                .unwrap_or(-1)
                        })
                        .collect(),
                );
            }
        }
        None
    }

    /// Waits until the queue of `conch/<sem>` is exactly `pids`, in this order.
    async fn wait_queue(&self, sem: &str, pids: &[i32]) -> anyhow::Result<()> {
        let r = wait_for(
            &format!("conch/{sem} to have waiters {pids:?}"),
            SHOW_UP,
            || async { (self.waiter_pids(sem).await.as_deref() == Some(pids)).then_some(()) },
        )
        .await;
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(e.context(self.diagnose().await)),
        }
    }
}

/// `conch` arguments: the words of `flags`, then `-- sh -c <body>`.
fn sh_c<'a>(flags: &'a str, body: &'a str) -> Vec<&'a str> {
    flags
        .split_whitespace()
        .chain(["--", "sh", "-c", body])
        .collect()
}

// ---------------------------------------------------------------------------------------------
// What the commands write
// ---------------------------------------------------------------------------------------------

/// `echo "start $ID <ns>" >> $T/<log>`.
fn log_start(log: &str) -> String {
    format!(r#"echo "start $ID $(date +%s%N)" >> "$T/{log}""#)
}

fn log_end(log: &str) -> String {
    format!(r#"echo "end $ID $(date +%s%N)" >> "$T/{log}""#)
}

/// Blocks until the file `$T/<name>` exists.
fn gate(name: &str) -> String {
    format!(r#"while [ ! -e "$T/{name}" ]; do sleep 0.02; done"#)
}

/// `echo "$PPID $CONCH_REV $CONCH_LEASE $(uname -n)" > $T/<file>`: what a command sees.
fn report(file: &str) -> String {
    format!(
        r#"echo "$PPID $CONCH_REV $CONCH_LEASE $(uname -n)" > "$T/{file}.tmp" && mv "$T/{file}.tmp" "$T/{file}""#
    )
}

#[derive(Debug, Clone, PartialEq)]
struct Event {
    start: bool,
    id: String,
    ns: i128,
}

fn events(text: &str) -> anyhow::Result<Vec<Event>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            ensure!(f.len() == 3, "bad event line {l:?}");
            Ok(Event {
                start: match f[0] {
                    "start" => true,
                    "end" => false,
                    other => bail!("bad event kind {other:?}"),
                },
                id: f[1].to_string(),
                ns: f[2]
                    .parse()
                    .with_context(|| format!("timestamp in {l:?}"))?,
            })
        })
        .collect()
}

/// The most commands running at once according to their start/end timestamps. At equal
/// timestamps a start counts before an end (an overlap is never hidden).
fn max_concurrency(evs: &[Event]) -> usize {
    let mut sorted = evs.to_vec();
    sorted.sort_by_key(|e| (e.ns, !e.start));
    let (mut now, mut max) = (0i64, 0i64);
    for e in &sorted {
        now += if e.start { 1 } else { -1 };
        max = max.max(now);
    }
    max as usize
}

/// Ids in the order their commands started (by timestamp).
fn start_order(evs: &[Event]) -> Vec<String> {
    let mut starts: Vec<&Event> = evs.iter().filter(|e| e.start).collect();
    starts.sort_by_key(|e| e.ns);
    starts.iter().map(|e| e.id.clone()).collect()
}

/// Every id started once and ended once, after it started.
fn check_complete(evs: &[Event], ids: &[&str]) -> anyhow::Result<()> {
    for id in ids {
        let s: Vec<&Event> = evs.iter().filter(|e| e.id == *id && e.start).collect();
        let e: Vec<&Event> = evs.iter().filter(|e| e.id == *id && !e.start).collect();
        ensure!(
            s.len() == 1 && e.len() == 1,
            "{id} should have started and ended once: {evs:?}"
        );
        ensure!(s[0].ns <= e[0].ns, "{id} ended before it started: {evs:?}");
    }
    ensure!(
        evs.len() == ids.len() * 2,
        "unexpected events (expected only {ids:?}): {evs:?}"
    );
    Ok(())
}

/// What a command reported through [`report`].
#[derive(Debug, Clone)]
struct Seen {
    conch_pid: i32,
    rev: u64,
    lease: String,
    host: String,
}

fn parse_seen(text: &str) -> anyhow::Result<Seen> {
    let f: Vec<&str> = text.split_whitespace().collect();
    ensure!(f.len() == 4, "bad report {text:?}");
    Ok(Seen {
        conch_pid: f[0].parse()?,
        rev: f[1]
            .parse()
            .with_context(|| format!("CONCH_REV in {text:?}"))?,
        lease: f[2].to_string(),
        host: f[3].to_string(),
    })
}

/// Seconds since the epoch of an RFC 3339 UTC time `YYYY-MM-DDTHH:MM:SS[.frac]Z`.
fn rfc3339_secs(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || !s.ends_with('Z') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let rest = &s[19..s.len() - 1];
    if !(rest.is_empty()
        || (rest.starts_with('.')
            && rest.len() > 1
            && rest[1..].bytes().all(|c| c.is_ascii_digit())))
    {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// One parsed `--who` line: `<name>[<active>/<max>] <STATE> <host> pid=<pid> since=<t> rev=<r>`.
#[derive(Debug, Clone, PartialEq)]
struct WhoLine {
    prefix: String,
    state: String,
    host: String,
    pid: i32,
    since: String,
    rev: String,
}

fn parse_who(stdout: &str) -> anyhow::Result<Vec<WhoLine>> {
    let lines: Vec<&str> = stdout.lines().collect();
    let mut parsed = Vec::new();
    for line in &lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        ensure!(f.len() == 6, "--who line {line:?} should have 6 fields");
        let field = |i: usize, key: &str| {
            f[i].strip_prefix(key)
                .with_context(|| format!("field {i} of {line:?} should start with {key:?}"))
        };
        parsed.push(WhoLine {
            prefix: f[0].to_string(),
            state: f[1].to_string(),
            host: f[2].to_string(),
            pid: field(3, "pid=")?.parse()?,
            since: field(4, "since=")?.to_string(),
            rev: field(5, "rev=")?.to_string(),
        });
    }
    // The exact layout: state padded to 5 columns, host and pid padded to the widest.
    let host_w = parsed.iter().map(|w| w.host.len()).max().unwrap_or(0);
    let pid_w = parsed
        .iter()
        .map(|w| w.pid.to_string().len())
        .max()
        .unwrap_or(0);
    for (line, w) in lines.iter().zip(&parsed) {
        let expected = format!(
            "{} {:<5} {:<host_w$} pid={:<pid_w$} since={} rev={}",
            w.prefix, w.state, w.host, w.pid, w.since, w.rev
        );
        ensure!(
            *line == expected,
            "--who line {line:?} is not in the documented layout {expected:?}"
        );
    }
    Ok(parsed)
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Two `--max 1` contenders started together both run, never at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_runs_two_contenders_one_after_the_other() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = format!("{}; sleep 0.3; {}", log_start("log"), log_end("log"));
    let mut a = f.conch_env(&[("ID", "a")], &sh_c("sema x --max 1", &body))?;
    let mut b = f.conch_env(&[("ID", "b")], &sh_c("sema x --max 1", &body))?;
    a.expect_code(0, EXIT_TIMEOUT).await?;
    b.expect_code(0, EXIT_TIMEOUT).await?;
    let evs = events(&f.read("log"))?;
    check_complete(&evs, &["a", "b"])?;
    assert_eq!(max_concurrency(&evs), 1, "the commands overlapped: {evs:?}");
    f.passed()
}

/// `--max 2`, five contenders queued one by one: at most two run at once, all five run, and
/// they start in queue (FIFO) order. Holders are released one at a time so that start order
/// is grant order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_contenders_share_two_slots_in_fifo_order() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let ids = ["1", "2", "3", "4", "5"];
    let body = format!(
        r#"{}; {}; {}; echo "$CONCH_REV" > "$T/rev.$ID""#,
        log_start("log"),
        gate("go.$ID"),
        log_end("log")
    );
    let starts =
        |n: usize| move |t: &str| t.lines().filter(|l| l.starts_with("start")).count() >= n;
    let mut procs = Vec::new();
    let mut queued = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let p = f.conch_env(&[("ID", id)], &sh_c("sema x --max 2", &body))?;
        if i < 2 {
            // A free slot: wait until the command runs.
            f.wait_file("log", starts(i + 1)).await?;
        } else {
            // No free slot: wait until it is queued behind the earlier ones.
            queued.push(p.pid());
            f.wait_queue("x.2", &queued).await?;
        }
        procs.push(p);
    }
    assert_eq!(start_order(&events(&f.read("log"))?), ["1", "2"]);

    // Release the holders one at a time, oldest first: each release lets exactly the head of
    // the queue in.
    for (k, id) in ids.iter().enumerate() {
        f.touch(&format!("go.{id}"))?;
        let expect_starts = (k + 3).min(ids.len());
        f.wait_file("log", starts(expect_starts)).await?;
    }
    for p in &mut procs {
        p.expect_code(0, EXIT_TIMEOUT).await?;
    }
    let evs = events(&f.read("log"))?;
    check_complete(&evs, &ids)?;
    assert_eq!(start_order(&evs), ids, "not FIFO: {evs:?}");
    assert_eq!(max_concurrency(&evs), 2, "{evs:?}");
    // Grants in queue order carry increasing fencing tokens.
    let revs: Vec<u64> = ids
        .iter()
        .map(|id| f.read(&format!("rev.{id}")).trim().parse())
        .collect::<Result<_, _>>()?;
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");
    f.passed()
}

/// While the lock is held, `--nonblock` exits 75 without waiting and `--wait 1s` after waiting
/// that second, queued meanwhile; neither runs its command nor leaves a waiter behind. (The
/// CLI's no-slot behaviour is tested here only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slot_exits_75_and_leaves_no_waiter() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let hold = format!("{}; {}", report("holder"), gate("go"));
    let mut holder = f.conch(&sh_c("sema x --max 1", &hold))?;
    let seen = parse_seen(&f.wait_file("holder", |_| true).await?)?;

    let ran = r#"echo ran >> "$T/ran""#;
    // (How soon it exits is the machine's business, not asserted.)
    let mut nb = f.conch(&sh_c("sema x --max 1 --nonblock", ran))?;
    nb.expect_code(EX_NO_SLOT, EXIT_TIMEOUT).await?;
    let err = nb.stderr();
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err:?}");
    assert!(err.starts_with("conch: no free slot"), "{err:?}");

    let t0 = Instant::now();
    let mut w = f.conch(&[
        "sema", "x", "--max", "1", "--wait", "1s", "--", "sh", "-c", ran,
    ])?;
    // While it waits, it is queued.
    f.wait_queue("x.1", &[w.pid()]).await?;
    w.expect_code(EX_NO_SLOT, EXIT_TIMEOUT).await?;
    let wait_took = t0.elapsed();
    // It waited the second it was given.
    assert!(
        wait_took >= Duration::from_millis(900),
        "--wait 1s took {wait_took:?}"
    );
    // A forever-waiter interrupted by SIGINT exits 128+SIGINT and leaves no waiter either.
    let mut w = f.conch(&sh_c("sema x --max 1", ran))?;
    f.wait_queue("x.1", &[w.pid()]).await?;
    w.signal(Signal::SIGINT);
    w.expect_code(128 + Signal::SIGINT as i32, EXIT_TIMEOUT)
        .await?;
    assert!(!f.path("ran").exists(), "a command ran without the slot");

    // The waiter is gone: only the holder shows.
    let (code, out, err) = f.run(&["sema", "x", "--max", "1", "--who"]).await?;
    assert_eq!(code, 0, "{out:?} {err:?}");
    let who = parse_who(&out)?;
    assert_eq!(who.len(), 1, "{out:?}");
    assert_eq!(
        (who[0].state.as_str(), who[0].pid),
        ("HELD", seen.conch_pid),
        "{out:?}"
    );
    assert_eq!(f.waiter_pids("x.1").await, Some(vec![]));

    // Once the holder is done, --nonblock gets the slot.
    f.touch("go")?;
    holder.expect_code(0, EXIT_TIMEOUT).await?;
    let mut nb = f.conch(&sh_c("sema x --max 1 --nonblock", ran))?;
    nb.expect_code(0, EXIT_TIMEOUT).await?;
    assert_eq!(f.read("ran"), "ran\n");
    f.passed()
}

/// conch exits with its command's status, and passes signals on to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_status_comes_back_and_signals_reach_it() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let (code, _, err) = f.run(&sh_c("sema x --max 1", "exit 7")).await?;
    assert_eq!(code, 7, "{err:?}");
    let (code, _, err) = f.run(&sh_c("sema x --max 1", "exit 0")).await?;
    assert_eq!(code, 0, "{err:?}");
    // Killed by a signal: 128 + N.
    let (code, _, err) = f.run(&sh_c("sema x --max 1", "kill -KILL $$")).await?;
    assert_eq!(code, 128 + Signal::SIGKILL as i32, "{err:?}");

    // A command that cannot be found: 127, as in shells; the slot is released.
    let (code, _, err) = f
        .run(&["sema", "x", "--max", "1", "--", "./no-such-command"])
        .await?;
    assert_eq!(code, 127, "{err:?}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    let (code, out, _) = f.run(&["sema", "x", "--max", "1", "--who"]).await?;
    assert_eq!(
        (code, out.as_str()),
        (1, "x[0/1] no holder\n"),
        "the slot was not released"
    );

    // SIGTERM to conch reaches the command, which traps it and exits 42.
    let body = r#"trap 'echo term > "$T/marker"; exit 42' TERM; echo $$ > "$T/ready"; while :; do sleep 0.05; done"#;
    let mut p = f.conch(&sh_c("sema x --max 1", body))?;
    f.wait_file("ready", |t| t.ends_with('\n')).await?;
    p.signal(Signal::SIGTERM);
    p.expect_code(42, EXIT_TIMEOUT).await?;
    assert_eq!(f.read("marker"), "term\n");

    // SIGINT to conch reaches a command that does not catch it: 128 + SIGINT.
    let body = r#"echo $$ > "$T/ready2"; exec sleep 30"#;
    let mut p = f.conch(&sh_c("sema x --max 1", body))?;
    let child: i32 = f
        .wait_file("ready2", |t| t.ends_with('\n'))
        .await?
        .trim()
        .parse()?;
    p.also_kill.push(child);
    p.signal(Signal::SIGINT);
    p.expect_code(128 + Signal::SIGINT as i32, EXIT_TIMEOUT)
        .await?;
    assert!(!pid_alive(child), "the command survived SIGINT");
    f.passed()
}

/// kill -9 of a holding conch: its command dies with it, and the slot comes back after the TTL,
/// not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_slot_comes_back_after_the_ttl() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body =
        r#"echo $$ > "$T/a.pid.tmp" && mv "$T/a.pid.tmp" "$T/a.pid"; while :; do sleep 0.05; done"#;
    let mut a = f.conch(&[
        "sema", "x", "--max", "1", "--ttl", "2s", "--", "sh", "-c", body,
    ])?;
    let a_child: i32 = f.wait_file("a.pid", |_| true).await?.trim().parse()?;
    // Should the command outlive conch (the behaviour under test fails), kill it at the end.
    a.also_kill.push(a_child);

    let got = r#"echo "$(date +%s%N)" > "$T/b""#;
    let mut b = f.conch(&[
        "sema", "x", "--max", "1", "--wait", "20s", "--", "sh", "-c", got,
    ])?;
    f.wait_queue("x.1", &[b.pid()]).await?;

    let killed_at = now_ns();
    a.signal(Signal::SIGKILL);
    let status = a.wait(EXIT_TIMEOUT).await?;
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    wait_for("the command to die with conch", SHOW_UP, || async {
        (!pid_alive(a_child)).then_some(())
    })
    .await?;
    let command_gone_at = now_ns();
    b.expect_code(0, EXIT_TIMEOUT).await?;
    let granted_at: i128 = f.read("b").trim().parse()?;
    let after = Duration::from_nanos((granted_at - killed_at).max(0) as u64);
    eprintln!("the slot came back {after:?} after kill -9 (TTL 2s)");
    // The last refresh was at most a refresh interval (< 1 s for a 2 s TTL) before the kill,
    // so the slot cannot come back sooner than 1 s after it (that it comes back at all is
    // b's exit 0 above).
    assert!(
        after >= Duration::from_secs(1),
        "the slot came back {after:?} after the kill (TTL 2s)"
    );
    eprintln!(
        "the command was seen gone {:?} after kill -9",
        Duration::from_nanos((command_gone_at - killed_at).max(0) as u64)
    );
    f.passed()
}

async fn delete_namespace(f: &Fixture, ns: &str) -> anyhow::Result<()> {
    let mut last = None;
    for id in f.cluster.running_ids() {
        let Ok(mut c) = f.cluster.grackle(id).await else {
            continue;
        };
        match c
            .delete_namespace(pb::DeleteNamespaceRequest {
                namespace_name: ns.into(),
            })
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    bail!("DeleteNamespace {ns} failed on every node: {last:?}")
}

/// A command that records SIGTERM (with a timestamp) and otherwise runs forever.
const TRAPPED: &str = r#"trap 'echo "term $(date +%s%N)" > "$T/marker.tmp"; mv "$T/marker.tmp" "$T/marker"; exit 3' TERM; echo $$ > "$T/ready.tmp"; mv "$T/ready.tmp" "$T/ready"; while :; do sleep 0.05; done"#;

/// The semaphore's namespace is deleted while the command runs: the lease is gone, conch
/// terminates the command and exits 79.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_namespace_stops_the_command_with_79() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    // The command's group also holds a process that ignores SIGTERM: it gets SIGKILL after
    // --kill-after.
    let body = format!(
        r#"sh -c 'trap "" TERM; echo $$ > "$T/stubborn"; while :; do sleep 0.05; done' & {TRAPPED}"#
    );
    let mut p = f.conch(&sh_c("sema x --max 1 --ttl 3s --kill-after 1s", &body))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);
    let stubborn: i32 = f
        .wait_file("stubborn", |t| t.ends_with('\n'))
        .await?
        .trim()
        .parse()?;

    let deleted = Instant::now();
    delete_namespace(&f, "conch").await?;
    p.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    let took = deleted.elapsed();
    eprintln!("conch exited 79 {took:?} after the namespace was deleted");
    assert!(
        took >= Duration::from_millis(900),
        "conch did not wait --kill-after (1s) for the stubborn process: {took:?}"
    );
    wait_for("the stubborn process to be killed", SHOW_UP, || async {
        (!pid_alive(stubborn)).then_some(())
    })
    .await?;
    assert!(
        f.read("marker").starts_with("term "),
        "the command did not get SIGTERM; stderr: {:?}",
        p.stderr()
    );
    let err = p.stderr();
    // The lease's refresh or the semaphore's check, whichever comes first, tells.
    assert!(
        err.contains("slot lost") || err.contains("semaphore conch/x.1 was deleted while held"),
        "stderr: {err:?}"
    );
    // One line says what happened; no revoke is attempted for a lease the server no longer has.
    let said: Vec<&str> = err.lines().filter(|l| l.starts_with("conch:")).collect();
    assert_eq!(said.len(), 1, "stderr: {err:?}");
    wait_for("the command's group to be gone", SHOW_UP, || async {
        (!group_alive(child)).then_some(())
    })
    .await?;
    f.passed()
}

/// DeleteSemaphore of `ns/sem`, through whichever node takes it.
async fn delete_semaphore(f: &Fixture, ns: &str, sem: &str) -> anyhow::Result<()> {
    let mut last = None;
    for id in f.cluster.running_ids() {
        let Ok(mut c) = f.cluster.grackle(id).await else {
            continue;
        };
        let request = pb::DeleteSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
        };
        match c.delete_semaphore(request).await {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    bail!("DeleteSemaphore {ns}/{sem} failed on every node: {last:?}")
}

/// UpdateSemaphore of `ns/sem` to `permits`, through whichever node takes it.
async fn set_permits(f: &Fixture, ns: &str, sem: &str, permits: u64) -> anyhow::Result<()> {
    let mut last = None;
    for id in f.cluster.running_ids() {
        let Ok(mut c) = f.cluster.grackle(id).await else {
            continue;
        };
        let get = pb::GetSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
        };
        let version = match c.get_semaphore(get).await {
            Ok(r) => r.into_inner().semaphore.map_or(0, |s| s.version),
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let update = pb::UpdateSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: sem.into(),
            permits,
            expected_version: version,
            ..Default::default()
        };
        match c.update_semaphore(update).await {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    bail!("UpdateSemaphore {ns}/{sem} failed on every node: {last:?}")
}

/// The lines conch itself wrote on stderr.
fn conch_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("conch:")).collect()
}

/// The semaphore is deleted under its holder (the lease lives on): conch learns it (pushed by
/// the cluster), terminates the command, gives the lease back and exits 79 with one line
/// saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_semaphore_stops_its_holder_with_79() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut p = f.conch(&sh_c("sema x --max 1 --ttl 3s --kill-after 1s", TRAPPED))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);

    delete_semaphore(&f, "conch", "x.1").await?;
    p.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    assert!(
        f.read("marker").starts_with("term "),
        "the command did not get SIGTERM; stderr: {:?}",
        p.stderr()
    );
    let err = p.stderr();
    // The pushed loss, or the check of the semaphore should it read first.
    let said = conch_lines(&err);
    assert!(
        said == [
            "conch: slot lost while running (semaphore deleted): semaphore conch/x.1 was deleted while held; stopping the command (SIGTERM, SIGKILL after 1s)"
        ] || said
            == [
                "conch: semaphore conch/x.1 was deleted while held; stopping the command (SIGTERM, SIGKILL after 1s)"
            ],
        "stderr: {err:?}"
    );
    wait_for("the command's group to be gone", SHOW_UP, || async {
        (!group_alive(child)).then_some(())
    })
    .await?;
    // The slot can be taken again at once: the lease was given back, not left to expire.
    let mut q = f.conch(&["sema", "x", "--max", "1", "--nonblock", "--", "true"])?;
    q.expect_code(0, EXIT_TIMEOUT).await?;
    f.passed()
}

/// The semaphore is given more permits while held (someone else's write token could let its
/// own holders in beside this one): conch stops the command and exits 79; a later run refuses
/// a semaphore whose permits are not its --max.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resized_semaphore_stops_its_holder_and_is_refused_afterwards() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut p = f.conch(&sh_c("sema x --max 1 --ttl 3s --kill-after 1s", TRAPPED))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);

    set_permits(&f, "conch", "x.1", 5).await?;
    p.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    assert!(f.read("marker").starts_with("term "), "{:?}", p.stderr());
    let err = p.stderr();
    assert_eq!(
        conch_lines(&err),
        [
            "conch: semaphore conch/x.1 permits changed from 1 to 5 while held; stopping the command (SIGTERM, SIGKILL after 1s)"
        ],
        "stderr: {err:?}"
    );

    let (code, _, err) = f
        .run(&["sema", "x", "--max", "1", "--nonblock", "--", "true"])
        .await?;
    assert_eq!(code, 70, "stderr: {err:?}");
    assert_eq!(conch_lines(&err).len(), 1, "stderr: {err:?}");
    assert!(err.contains("has 5 permits, not 1"), "stderr: {err:?}");
    f.passed()
}

/// `--max-hold`: conch stops the command before the server ends the hold (SIGTERM, SIGKILL a
/// grace later) and exits 80; the waiter behind it gets the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_limit_stops_the_command_with_80_and_hands_the_slot_on() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut p = f.conch(&sh_c(
        "sema x --max 1 --ttl 10s --kill-after 1s --max-hold 3s",
        TRAPPED,
    ))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);
    let mut q = f.conch(&["sema", "x", "--max", "1", "--", "true"])?;
    p.expect_code(EX_HOLD_LIMIT, EXIT_TIMEOUT).await?;
    assert!(
        f.read("marker").starts_with("term "),
        "the command did not get SIGTERM; stderr: {:?}",
        p.stderr()
    );
    let err = p.stderr();
    assert_eq!(
        conch_lines(&err),
        ["conch: slot reaches its hold limit; stopping the command (SIGTERM, SIGKILL after 500ms)"],
        "stderr: {err:?}"
    );
    q.expect_code(0, EXIT_TIMEOUT).await?;
    f.passed()
}

/// An election's semaphore deleted under its leader: the leader's command is stopped, exit 79.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_election_stops_its_leader_with_79() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut args = vec!["elect", "billing", "--ttl", "3s", "--kill-after", "1s"];
    args.extend(["--", "sh", "-c", TRAPPED]);
    let mut p = f.conch(&args)?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);

    delete_semaphore(&f, "conch", "billing.elect").await?;
    p.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    assert!(f.read("marker").starts_with("term "), "{:?}", p.stderr());
    let err = p.stderr();
    assert_eq!(conch_lines(&err).len(), 1, "stderr: {err:?}");
    assert!(
        err.contains("semaphore conch/billing.elect was deleted while held"),
        "stderr: {err:?}"
    );
    f.passed()
}

/// `--namespace`: the semaphore, its lease and the namespace itself (made on first use, here
/// where access control is off) live there; `--who` looks there; the default namespace does
/// not see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_namespace_holds_the_semaphore_its_leases_and_holders() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let hold = format!(
        r#"echo "$CONCH_LEASE" > "$T/lease.tmp"; mv "$T/lease.tmp" "$T/lease"; {}"#,
        gate("go")
    );
    let mut p = f.conch(&sh_c("sema x --namespace team-a --max 1", &hold))?;
    let lease = f.wait_file("lease", |t| t.ends_with('\n')).await?;
    let lease = lease.trim();

    // Held in team-a: --who there shows it (exit 0), the default namespace has nothing.
    let (code, out, err) = f
        .run(&["sema", "x", "--namespace", "team-a", "--max", "1", "--who"])
        .await?;
    assert_eq!(code, 0, "{out} {err}");
    let who = parse_who(&out)?;
    assert_eq!(who.len(), 1, "{out}");
    assert_eq!(who[0].state, "HELD", "{out}");
    let (code, out, _) = f.run(&["sema", "x", "--max", "1", "--who"]).await?;
    assert_eq!((code, out.as_str()), (1, "x[0/1] no holder\n"), "{out}");
    let mut json = f.conch_env(
        &[("CONCH_NAMESPACE", "team-a")],
        &["sema", "x", "--max", "1", "--who", "--json"],
    )?;
    json.expect_code(0, EXIT_TIMEOUT).await?;
    let v: serde_json::Value = serde_json::from_str(&json.stdout())?;
    assert_eq!(v["namespace"], "team-a", "{v}");
    assert_eq!(v["holders"][0]["lease_id"], lease, "{v}");

    // The lease and the holder are in team-a, through the API too.
    let mut g = f.cluster.grackle(f.cluster.running_ids()[0]).await?;
    let holders = cluster_tests::ops::holders(&mut g, "team-a", "x.1").await?;
    assert_eq!(
        holders
            .iter()
            .map(|h| h.lease_id.as_str())
            .collect::<Vec<_>>(),
        [lease]
    );
    let got = g
        .get_semaphore_lease(pb::GetSemaphoreLeaseRequest {
            namespace_name: "team-a".into(),
            lease_id: lease.into(),
        })
        .await;
    assert!(got.is_ok(), "lease {lease} not in team-a: {got:?}");

    // A bad namespace name is a usage error, in one line.
    let (code, _, err) = f
        .run(&["sema", "x", "--namespace", "team a", "--max", "1", "--who"])
        .await?;
    assert_eq!(code, EX_USAGE, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("namespace"), "{err}");

    f.touch("go")?;
    p.expect_code(0, EXIT_TIMEOUT).await?;
    f.passed()
}

/// Every node stopped: conch gives up before the lease could expire on the servers (TTL after
/// the last successful refresh), terminates the command and exits 79. Once the nodes are back,
/// the slot can be taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_stops_the_command_before_the_ttl() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let ttl = Duration::from_secs(3);
    let mut p = f.conch(&sh_c("sema x --max 1 --ttl 3s --kill-after 5s", TRAPPED))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);

    let ids = f.cluster.running_ids();
    for &id in &ids {
        f.cluster.signal(id, Signal::SIGSTOP);
    }
    // No refresh can succeed after this moment, so the servers' deadline is at most TTL later.
    let stopped_at = now_ns();
    let code = p.code(EXIT_TIMEOUT).await;
    for &id in &ids {
        f.cluster.signal(id, Signal::SIGCONT);
    }
    let code = code?;
    assert_eq!(code, EX_SLOT_LOST, "stderr: {:?}", p.stderr());
    let marker = f.read("marker");
    let termed_at: i128 = marker
        .strip_prefix("term ")
        .with_context(|| format!("the command did not get SIGTERM: {marker:?}"))?
        .trim()
        .parse()?;
    let after = termed_at - stopped_at;
    eprintln!(
        "the command got SIGTERM {:?} after all nodes stopped (TTL {ttl:?})",
        Duration::from_nanos(after.max(0) as u64)
    );
    assert!(after > 0, "the command was stopped before the nodes were");
    assert!(
        after < ttl.as_nanos() as i128,
        "the command got SIGTERM {:?} after the nodes stopped: not before the TTL ({ttl:?})",
        Duration::from_nanos(after as u64)
    );
    wait_for("the command's group to be gone", SHOW_UP, || async {
        (!group_alive(child)).then_some(())
    })
    .await?;

    // The cluster is back: the slot can be taken again (at the latest when the lease expires).
    f.cluster.wait_for_leader(SHOW_UP).await?;
    let mut q = f.conch(&["sema", "x", "--max", "1", "--wait", "20s", "--", "true"])?;
    q.expect_code(0, EXIT_TIMEOUT).await?;
    f.passed()
}

/// The guard processes of conch `conch_pid` (`conch __guard <conch pid> …`), from /proc.
fn guards_of(conch_pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pid = conch_pid.to_string();
    dir.flatten()
        .filter_map(|entry| {
            let n: i32 = entry.file_name().to_string_lossy().parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            args.windows(2)
                .any(|w| w[0] == b"__guard" && w[1] == pid.as_bytes())
                .then_some(n)
        })
        .filter(|&n| {
            // Zombies (not reaped yet) do not count as left behind.
            let stat = std::fs::read_to_string(format!("/proc/{n}/stat")).unwrap_or_default();
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .collect()
}

/// `(ppid, pgrp)` of process `pid`.
fn parent_and_group(pid: i32) -> Option<(i32, i32)> {
    process_table()
        .into_iter()
        .find(|&(p, _, _)| p == pid)
        .map(|(_, ppid, pgrp)| (ppid, pgrp))
}

/// A command that logs its start, logs its end when it gets SIGTERM (then exits), writes its pid
/// to `$T/<ready>` and otherwise runs forever.
fn until_terminated(log: &str, ready: &str) -> String {
    format!(
        r#"{}; trap '{}; exit 0' TERM; echo $$ > "$T/{ready}.tmp"; mv "$T/{ready}.tmp" "$T/{ready}"; while :; do sleep 0.05; done"#,
        log_start(log),
        log_end(log)
    )
}

/// conch stopped (SIGSTOP to its pid only) while its command runs: its guard stops the command
/// before the lease can expire, so the next holder's command starts only after the first was
/// told to stop; once conch runs again it says, in one line, that the slot was lost while it was
/// paused, and exits 79.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_conch_is_overtaken_by_its_guard() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let ttl = Duration::from_secs(3);
    let mut a = f.conch_env(
        &[("ID", "a")],
        &sh_c(
            "sema x --max 1 --ttl 3s --kill-after 2s",
            &until_terminated("log", "a.ready"),
        ),
    )?;
    let a_child: i32 = f.wait_file("a.ready", |_| true).await?.trim().parse()?;
    a.also_kill.push(a_child);
    let guards = guards_of(a.pid());
    ensure!(
        guards.len() == 1,
        "one guard beside the command: {guards:?}"
    );

    let b_body = format!("{}; {}", log_start("log"), log_end("log"));
    let mut b = f.conch_env(&[("ID", "b")], &sh_c("sema x --max 1 --wait 30s", &b_body))?;
    f.wait_queue("x.1", &[b.pid()]).await?;

    a.signal(Signal::SIGSTOP);
    // The last refresh was no later than this: the servers keep the lease at most TTL longer.
    let stopped_at = now_ns();
    let b_code = b.code(EXIT_TIMEOUT).await;
    // Whatever happened, let conch run again.
    a.signal(Signal::SIGCONT);
    ensure!(b_code? == 0, "b failed: {:?}", b.stderr());

    let evs = events(&f.read("log"))?;
    check_complete(&evs, &["a", "b"])?;
    assert_eq!(start_order(&evs), ["a", "b"]);
    assert_eq!(
        max_concurrency(&evs),
        1,
        "b started before a was told to stop: {evs:?}"
    );
    let a_end = evs.iter().find(|e| e.id == "a" && !e.start).map(|e| e.ns);
    let after = a_end.unwrap_or(0) - stopped_at;
    eprintln!(
        "the guard stopped the command {:?} after conch was paused (TTL {ttl:?})",
        Duration::from_nanos(after.max(0) as u64)
    );
    assert!(
        after > 0 && after < ttl.as_nanos() as i128,
        "the command got SIGTERM {after} ns after conch was paused: not within the TTL"
    );

    a.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    let err = a.stderr();
    let said: Vec<&str> = err.lines().filter(|l| l.starts_with("conch:")).collect();
    assert_eq!(said.len(), 1, "one line; stderr: {err:?}");
    assert!(said[0].contains("paused"), "stderr: {err:?}");
    wait_for("the command's group to be gone", SHOW_UP, || async {
        (!group_alive(a_child)).then_some(())
    })
    .await?;
    ensure!(guards_of(a.pid()).is_empty(), "the guard is gone");
    f.passed()
}

/// The guard runs beside the command, in a process group of its own (so signals sent to the
/// command's group do not reach it), and a normal run leaves no guard behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_run_leaves_no_guard_behind() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = format!(
        r#"trap 'touch "$T/usr1"' USR1; echo $$ > "$T/ready.tmp"; mv "$T/ready.tmp" "$T/ready"; {}; exit 7"#,
        gate("go")
    );
    // A TTL long enough that a stall of the shared disk under the parallel tests (replication
    // stalled for 2 s in one run) is not a lost slot, short enough that refreshes fit in 3 s.
    let mut p = f.conch(&sh_c("sema x --max 1 --ttl 5s", &body))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);
    let guards = guards_of(p.pid());
    ensure!(
        guards.len() == 1,
        "one guard beside the command: {guards:?}"
    );
    let (ppid, pgrp) = parent_and_group(guards[0]).context("the guard's /proc entry")?;
    assert_eq!(ppid, p.pid(), "the guard is conch's child");
    assert_eq!(pgrp, guards[0], "the guard is in a group of its own");
    // A few refreshes go by (each renews the guard) without anything being stopped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(pid_alive(child), "the command still runs");
    // A signal forwarded to the command does not reach the guard.
    p.signal(Signal::SIGUSR1);
    f.wait_file("usr1", |_| true).await?;
    ensure!(
        pid_alive(guards[0]),
        "the guard survived the forwarded signal"
    );
    f.touch("go")?;
    p.expect_code(7, EXIT_TIMEOUT).await?;
    ensure!(
        guards_of(p.pid()).is_empty(),
        "a guard was left behind: {:?}",
        guards_of(p.pid())
    );
    // (The shell may report its `sleep` killed by the forwarded signal; conch says nothing.)
    let err = p.stderr();
    assert!(!err.contains("conch:"), "stderr: {err:?}");

    // The same for a command that cannot be started.
    let mut q = f.conch(&["sema", "x", "--max", "1", "--", "/nonexistent/command"])?;
    q.expect_code(127, EXIT_TIMEOUT).await?;
    ensure!(guards_of(q.pid()).is_empty(), "a guard was left behind");
    f.passed()
}

/// kill -9 of conch: the command dies with it (parent-death signal), and the guard kills the
/// rest of the command's group at once, then goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_conch_takes_the_command_and_its_group_along() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = r#"sleep 1000 & echo $! > "$T/bg.tmp"; mv "$T/bg.tmp" "$T/bg"; echo $$ > "$T/ready.tmp"; mv "$T/ready.tmp" "$T/ready"; while :; do sleep 0.05; done"#;
    let mut p = f.conch(&sh_c("sema x --max 1 --ttl 5s", body))?;
    let child: i32 = f.wait_file("ready", |_| true).await?.trim().parse()?;
    let background: i32 = f.wait_file("bg", |_| true).await?.trim().parse()?;
    p.also_kill.push(child);
    let guards = guards_of(p.pid());
    ensure!(
        guards.len() == 1,
        "one guard beside the command: {guards:?}"
    );

    p.signal(Signal::SIGKILL);
    let status = p.wait(EXIT_TIMEOUT).await?;
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    wait_for("the command to die with conch", SHOW_UP, || async {
        (!pid_alive(child)).then_some(())
    })
    .await?;
    wait_for(
        "the command's background process to be killed",
        SHOW_UP,
        || async { (!pid_alive(background)).then_some(()) },
    )
    .await?;
    wait_for("the guard to exit", SHOW_UP, || async {
        guards_of(p.pid()).is_empty().then_some(())
    })
    .await?;
    f.passed()
}

/// `--who` and `--who --json` list holders (grant order) then waiters (queue order) with the
/// host, conch pid, start time and fencing token the commands themselves see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_shows_holders_and_waiters() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let started = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;

    // Nobody has used x[2] yet: exit 1, the semaphore is empty.
    let (code, out, err) = f.run(&["sema", "x", "--max", "2", "--who"]).await?;
    assert_eq!((code, out.as_str()), (1, "x[0/2] no holder\n"), "{err:?}");
    let (code, out, err) = f
        .run(&["sema", "x", "--max", "2", "--who", "--json"])
        .await?;
    assert_eq!(code, 1, "{err:?}");
    let v: serde_json::Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    assert_eq!(v["exists"], false, "{out}");
    assert_eq!(v["holders"], serde_json::json!([]), "{out}");

    let body = format!("{}; {}", report("seen.$ID"), gate("go"));
    let mut procs = Vec::new();
    for id in ["a", "b"] {
        procs.push(f.conch_env(&[("ID", id)], &sh_c("sema x --max 2", &body))?);
        f.wait_file(&format!("seen.{id}"), |_| true).await?;
    }
    let c = f.conch_env(&[("ID", "c")], &sh_c("sema x --max 2", &body))?;
    f.wait_queue("x.2", &[c.pid()]).await?;
    procs.push(c);
    let a = parse_seen(&f.read("seen.a"))?;
    let b = parse_seen(&f.read("seen.b"))?;
    assert_eq!(a.conch_pid, procs[0].pid());
    assert_eq!(b.conch_pid, procs[1].pid());
    assert!(a.rev > 0 && a.rev < b.rev, "{a:?} {b:?}");
    let host = a.host.clone();
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;

    let (code, out, err) = f.run(&["sema", "x", "--max", "2", "--who"]).await?;
    assert_eq!(code, 0, "{out:?} {err:?}");
    let who = parse_who(&out)?;
    let expected = [
        ("HELD", a.conch_pid, a.rev.to_string()),
        ("HELD", b.conch_pid, b.rev.to_string()),
        ("WAIT", procs[2].pid(), "-".to_string()),
    ];
    assert_eq!(who.len(), expected.len(), "{out}");
    for (w, (state, pid, rev)) in who.iter().zip(&expected) {
        assert_eq!(w.prefix, "x[2/2]", "{out}");
        assert_eq!(
            (w.state.as_str(), w.pid, &w.rev, &w.host),
            (*state, *pid, rev, &host),
            "{out}"
        );
        let since = rfc3339_secs(&w.since).with_context(|| format!("since= in {out}"))?;
        assert!(
            since >= started - 2 && since <= now + 2,
            "since={} is not when conch started ({out})",
            w.since
        );
    }

    let (code, out, err) = f
        .run(&["sema", "x", "--max", "2", "--who", "--json"])
        .await?;
    assert_eq!(code, 0, "{out:?} {err:?}");
    let v: serde_json::Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    assert_eq!(v["name"], "x", "{out}");
    assert_eq!(v["max"], 2, "{out}");
    assert_eq!(v["namespace"], "conch", "{out}");
    assert_eq!(v["semaphore"], "x.2", "{out}");
    assert_eq!(v["exists"], true, "{out}");
    assert_eq!(v["active_holds"], 2, "{out}");
    let holders = v["holders"].as_array().context("holders")?;
    assert_eq!(holders.len(), 2, "{out}");
    for (h, s) in holders.iter().zip([&a, &b]) {
        assert_eq!(h["host"], s.host.as_str(), "{out}");
        assert_eq!(h["pid"], s.conch_pid, "{out}");
        assert_eq!(h["rev"], s.rev, "{out}");
        assert_eq!(h["lease_id"], s.lease.as_str(), "{out}");
        assert!(
            h["since"].as_str().and_then(rfc3339_secs).is_some(),
            "{out}"
        );
    }
    let waiters = v["waiters"].as_array().context("waiters")?;
    assert_eq!(waiters.len(), 1, "{out}");
    assert_eq!(waiters[0]["pid"], procs[2].pid(), "{out}");
    assert_eq!(waiters[0]["host"], host.as_str(), "{out}");
    assert_eq!(waiters[0]["position"], 0, "{out}");
    assert!(
        waiters[0].get("rev").is_none(),
        "a waiter has no rev: {out}"
    );

    // (name, max) is the identity: x[1] is another, empty semaphore: --who says nobody holds
    // it, then says loudly that x is in use with --max 2, showing those holders and waiters.
    let (code, out, err) = f.run(&["sema", "x", "--max", "1", "--who"]).await?;
    assert_eq!(code, 1, "nobody holds x[1]: {out:?} {err:?}");
    let (first, rest) = out.split_once('\n').context("no lines")?;
    assert_eq!(first, "x[0/1] no holder", "{out}");
    let who = parse_who(rest)?;
    assert_eq!(who.len(), 3, "{out}");
    assert!(who.iter().all(|w| w.prefix == "x[2/2]"), "{out}");
    assert!(
        err.contains("x is also used with --max 2"),
        "stderr names the other capacity: {err:?}"
    );
    let (code, out, _) = f
        .run(&["sema", "x", "--max", "1", "--who", "--json"])
        .await?;
    assert_eq!(code, 1, "nobody holds x[1]");
    let v: serde_json::Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    assert_eq!(v["exists"], false, "{out}");
    let others = v["others"].as_array().context("others")?;
    assert_eq!(others.len(), 1, "{out}");
    assert_eq!(others[0]["max"], 2, "{out}");
    assert_eq!(others[0]["semaphore"], "x.2", "{out}");
    assert_eq!(
        others[0]["holders"].as_array().map(Vec::len),
        Some(2),
        "{out}"
    );
    assert_eq!(
        others[0]["waiters"].as_array().map(Vec::len),
        Some(1),
        "{out}"
    );

    // Everyone done: empty again, "no holder", exit 1.
    f.touch("go")?;
    for p in &mut procs {
        p.expect_code(0, EXIT_TIMEOUT).await?;
    }
    let (code, out, err) = f.run(&["sema", "x", "--max", "2", "--who"]).await?;
    assert_eq!((code, out.as_str()), (1, "x[0/2] no holder\n"), "{err:?}");
    let (code, out, _) = f
        .run(&["sema", "x", "--max", "2", "--who", "--json"])
        .await?;
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    assert_eq!(v["exists"], true, "{out}");
    assert_eq!(v["holders"], serde_json::json!([]), "{out}");
    assert_eq!(v["waiters"], serde_json::json!([]), "{out}");
    f.passed()
}

/// A `--spread` caller queued on its host's lock (its host already holds a slot) shows in
/// `--who` as a waiter, marked `(host lock)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_shows_spread_callers_waiting_on_their_host() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = format!("{}; {}", report("seen"), gate("go"));
    let mut first = f.conch(&sh_c("sema sp --max 2 --spread", &body))?;
    let seen = parse_seen(&f.wait_file("seen", |_| true).await?)?;
    let second = f.conch(&sh_c("sema sp --max 2 --spread", "true"))?;
    let lock = conch_client::sema::spread_semaphore_name("sp", 2, &seen.host)
        .map_err(anyhow::Error::msg)?;
    f.wait_queue(&lock, &[second.pid()]).await?;

    let (code, out, err) = f.run(&["sema", "sp", "--max", "2", "--who"]).await?;
    assert_eq!(code, 0, "{out:?} {err:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains(" HELD ") && lines[0].contains(&format!("pid={}", first.pid())),
        "{out}"
    );
    assert!(
        lines[1].contains(" WAIT ") && lines[1].contains(&format!("pid={}", second.pid())),
        "{out}"
    );
    assert!(lines[1].ends_with(" (host lock)"), "{out}");

    let (_, out, _) = f
        .run(&["sema", "sp", "--max", "2", "--who", "--json"])
        .await?;
    let v: serde_json::Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    let waiters = v["waiters"].as_array().context("waiters")?;
    assert_eq!(waiters.len(), 1, "{out}");
    assert_eq!(waiters[0]["pid"], second.pid(), "{out}");
    assert_eq!(waiters[0]["host_lock"], true, "{out}");

    f.touch("go")?;
    first.expect_code(0, EXIT_TIMEOUT).await?;
    let mut second = second;
    second.expect_code(0, EXIT_TIMEOUT).await?;
    f.passed()
}

/// `--max` takes the server's range: 1 to 2^32-1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_outside_the_servers_range_is_a_usage_error() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    for bad in ["0", "4294967296"] {
        let (code, _, err) = f.run(&["sema", "x", "--max", bad, "--who"]).await?;
        assert_eq!(code, EX_USAGE, "--max {bad}: {err:?}");
        assert!(err.contains("4294967295"), "the range is named: {err:?}");
    }
    let (code, _, err) = f
        .run(&[
            "sema",
            "x",
            "--max",
            "4294967295",
            "--nonblock",
            "--",
            "true",
        ])
        .await?;
    assert_eq!(code, 0, "the largest --max works: {err:?}");
    f.passed()
}

/// `CONCH_REV` strictly increases over sequential runs, across semaphores and whichever node
/// the run talks to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let addrs = f.cluster.endpoints();
    let body = r#"echo "$CONCH_REV $CONCH_LEASE" >> "$T/revs""#;
    let runs = [
        ("x", "1"),
        ("x", "1"),
        ("y", "3"),
        ("x", "1"),
        ("y", "3"),
        ("x", "2"),
    ];
    for (i, (name, max)) in runs.iter().enumerate() {
        // Each run talks to one node only, a different one each time.
        let endpoint = &addrs[i % addrs.len()];
        let flags = format!("sema {name} --max {max} --endpoints {endpoint}");
        let (code, _, err) = f.run(&sh_c(&flags, body)).await?;
        assert_eq!(code, 0, "run {i}: {err:?}");
    }
    let lines = f.read("revs");
    let seen: Vec<(u64, String)> = lines
        .lines()
        .map(|l| {
            let (rev, lease) = l.split_once(' ').context("rev and lease")?;
            Ok((rev.parse()?, lease.to_string()))
        })
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(seen.len(), runs.len(), "{lines}");
    assert!(seen[0].0 > 0, "{lines}");
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "fencing tokens do not strictly increase: {lines}"
    );
    let leases: HashSet<&String> = seen.iter().map(|(_, l)| l).collect();
    assert_eq!(
        leases.len(),
        runs.len(),
        "every run has a lease of its own: {lines}"
    );
    assert!(seen.iter().all(|(_, l)| !l.is_empty()), "{lines}");
    f.passed()
}

/// The seed's examples, typed into a shell as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_examples_work_as_written() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let example1 = r#"conch sema certs-renew --max 1 --nonblock -- ./renew.sh || echo "already running elsewhere""#;
    f.script(
        "renew.sh",
        "#!/bin/sh\necho \"renewed rev=$CONCH_REV\" >> \"$T/renew.log\"\n",
    )?;

    // Free: the script runs.
    let mut sh = f.shell(&[], example1)?;
    sh.expect_code(0, EXIT_TIMEOUT).await?;
    assert!(
        !sh.stdout().contains("already running elsewhere"),
        "{:?} {:?}",
        sh.stdout(),
        sh.stderr()
    );
    assert_eq!(f.read("renew.log").lines().count(), 1);
    assert!(f.read("renew.log").starts_with("renewed rev="));

    // Held elsewhere: the fallback runs, the script does not.
    let hold = format!(r#"touch "$T/held"; {}"#, gate("go.renew"));
    let mut holder = f.conch(&sh_c("sema certs-renew --max 1", &hold))?;
    f.wait_file("held", |_| true).await?;
    let mut sh = f.shell(&[], example1)?;
    sh.expect_code(0, EXIT_TIMEOUT).await?;
    assert_eq!(
        sh.stdout(),
        "already running elsewhere\n",
        "{:?}",
        sh.stderr()
    );
    assert_eq!(sh.stderr().lines().count(), 1, "{:?}", sh.stderr());
    assert_eq!(f.read("renew.log").lines().count(), 1);
    f.touch("go.renew")?;
    holder.expect_code(0, EXIT_TIMEOUT).await?;

    // At most 2 heavy jobs at once; --who shows them.
    let job = f.script(
        "run-job.sh",
        &format!(
            "#!/bin/sh\n{}\n{}\n{}\n",
            log_start("jobs.log"),
            gate("go.jobs"),
            log_end("jobs.log")
        ),
    )?;
    let example2 = format!("conch sema heavy-jobs --max 2 -- {}", job.display());
    let mut jobs = Vec::new();
    for id in ["1", "2"] {
        jobs.push(f.shell(&[("ID", id)], &example2)?);
    }
    f.wait_file("jobs.log", |t| t.lines().count() >= 2).await?;
    jobs.push(f.shell(&[("ID", "3")], &example2)?);
    wait_for("a third job to queue", SHOW_UP, || async {
        (f.waiter_pids("heavy-jobs.2").await?.len() == 1).then_some(())
    })
    .await?;

    let mut who = f.shell(&[], "conch sema heavy-jobs --max 2 --who")?;
    who.expect_code(0, EXIT_TIMEOUT).await?;
    let lines = parse_who(&who.stdout())?;
    let states: Vec<(&str, &str)> = lines
        .iter()
        .map(|w| (w.prefix.as_str(), w.state.as_str()))
        .collect();
    assert_eq!(
        states,
        [
            ("heavy-jobs[2/2]", "HELD"),
            ("heavy-jobs[2/2]", "HELD"),
            ("heavy-jobs[2/2]", "WAIT")
        ],
        "{}",
        who.stdout()
    );

    f.touch("go.jobs")?;
    for j in &mut jobs {
        j.expect_code(0, EXIT_TIMEOUT).await?;
    }
    let evs = events(&f.read("jobs.log"))?;
    check_complete(&evs, &["1", "2", "3"])?;
    assert!(max_concurrency(&evs) <= 2, "{evs:?}");

    // The help shows the examples.
    let mut help = f.shell(&[], "conch sema --help")?;
    help.expect_code(0, EXIT_TIMEOUT).await?;
    for example in [
        example1,
        "conch sema heavy-jobs --max 2 -- /usr/local/bin/run-job.sh",
        "conch sema heavy-jobs --max 2 --who",
    ] {
        assert!(help.stdout().contains(example), "--help lacks {example:?}");
    }
    f.passed()
}

/// Usage errors exit 64 and no node answering exits 69, each with one line on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_64_and_an_unreachable_cluster_69() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let run = |args: &[&str], endpoints: &str| {
        let out = std::process::Command::new(binary("conch"))
            .args(args)
            .env("CONCH_ENDPOINTS", endpoints)
            .env_remove("CONCH_LOG")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run conch");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for args in [
        &["sema", "x", "--", "true"][..],
        &["sema", "x", "--max", "0", "--", "true"],
        &[
            "sema",
            "x",
            "--max",
            "1",
            "--nonblock",
            "--wait",
            "1s",
            "--",
            "true",
        ],
        &["sema", "x", "--max", "1", "--json", "--", "true"],
        &["sema", "bad name", "--max", "1", "--", "true"],
    ] {
        let (code, err) = run(args, "127.0.0.1:1");
        assert_eq!(code, Some(EX_USAGE), "{args:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        assert!(err.starts_with("conch: "), "{args:?}: {err:?}");
    }
    // Nobody listens on these ports (held, not listening: connections are refused). That it
    // gives up at all, with 69, is the point; how fast is the client tests' business.
    let (_held1, nobody1) = cluster_tests::sockets::closed_port()?;
    let (_held2, nobody2) = cluster_tests::sockets::closed_port()?;
    let nobody = format!("{nobody1},{nobody2}");
    let (code, err) = run(&["sema", "x", "--max", "1", "--", "true"], &nobody);
    assert_eq!(code, Some(EX_UNAVAILABLE), "{err:?}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    let (code, err) = run(&["sema", "x", "--max", "1", "--who"], &nobody);
    assert_eq!(code, Some(EX_UNAVAILABLE), "{err:?}");
    assert_eq!(err.lines().count(), 1, "{err:?}");
    Ok(())
}

/// The helpers the tests rely on see what they must (no cluster needed).
#[test]
fn helpers_detect_overlap_and_read_the_documented_formats() {
    let evs = events("start a 10\nstart b 20\nend a 30\nend b 40\n").unwrap();
    assert_eq!(max_concurrency(&evs), 2);
    assert_eq!(start_order(&evs), ["a", "b"]);
    check_complete(&evs, &["a", "b"]).unwrap();
    let evs = events("start a 10\nend a 20\nstart b 20\nend b 40\n").unwrap();
    assert_eq!(max_concurrency(&evs), 2, "a tie counts as an overlap");
    let evs = events("start a 10\nend a 20\nstart b 21\nend b 40\n").unwrap();
    assert_eq!(max_concurrency(&evs), 1);
    assert!(check_complete(&evs, &["a"]).is_err());

    assert_eq!(rfc3339_secs("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(rfc3339_secs("2026-06-12T10:15:00Z"), Some(1_781_259_300));
    assert_eq!(rfc3339_secs("2026-06-12T10:15:00.25Z"), Some(1_781_259_300));
    assert_eq!(rfc3339_secs("2026-06-12 10:15:00"), None);

    let seed = "video-encode[2/2] HELD  node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812\n\
                video-encode[2/2] HELD  node3 pid=991  since=2026-06-12T10:15:04Z rev=8814\n\
                video-encode[2/2] WAIT  node1 pid=1207 since=2026-06-12T10:15:09Z rev=-\n";
    let who = parse_who(seed).unwrap();
    assert_eq!(who.len(), 3);
    assert_eq!(
        (who[1].state.as_str(), who[1].pid, who[1].rev.as_str()),
        ("HELD", 991, "8814")
    );
    assert_eq!((who[2].state.as_str(), who[2].rev.as_str()), ("WAIT", "-"));
    // Misaligned columns are not the documented layout.
    assert!(parse_who("x[1/1] HELD node2 pid=1 since=2026-06-12T10:15:00Z rev=3\n").is_err());
}

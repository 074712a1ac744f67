//! `conch elect` end to end: real `conch` candidates and observers against a real 3-node
//! conchd cluster; and the status line a waiting `conch` shows at a terminal (a pseudo-terminal
//! from util-linux `script`).
//!
//! Candidates run small shell scripts that append `start|end <id> <ns> <CONCH_REV>
//! <CONCH_LEADER_VALUE>` to a log in a per-test directory and hold leadership until the test
//! creates their "gate" file, so no correctness check depends on a fixed sleep. Every process
//! runs in a process group of its own and is killed on drop, with its command's group.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, ensure};
use cluster_tests::proc::Proc;
use cluster_tests::{Cluster, binary, wait_for};
use conch_proto::conch::ListSemaphoreWaitersRequest;
use conch_proto::conch::conch_api_client::ConchApiClient;
use nix::sys::signal::Signal;

/// How long anything the tests wait for may take on a loaded machine.
const SHOW_UP: Duration = Duration::from_secs(30);
const EX_SLOT_LOST: i32 = 79;

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

struct Fixture {
    cluster: Cluster,
    dir: tempfile::TempDir,
    spawned: std::cell::Cell<usize>,
    /// The nodes every `conch` talks to (default: all).
    endpoints: Option<String>,
}

impl Fixture {
    async fn start() -> anyhow::Result<Fixture> {
        Ok(Fixture {
            cluster: Cluster::start(3).await?,
            dir: tempfile::Builder::new().prefix("conch-elect-").tempdir()?,
            spawned: std::cell::Cell::new(0),
            endpoints: None,
        })
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

    /// `conch args…` with `T` the scratch directory and `ID` = `id`.
    fn conch(&self, id: &str, args: &[&str]) -> anyhow::Result<Proc> {
        let n = self.spawned.get() + 1;
        self.spawned.set(n);
        let out = self.path(&format!("proc{n}.out"));
        let err = self.path(&format!("proc{n}.err"));
        let mut cmd = Command::new(binary("conch"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env(
                "CONCH_ENDPOINTS",
                self.endpoints
                    .clone()
                    .unwrap_or_else(|| self.cluster.endpoints().join(",")),
            )
            .env("T", self.dir.path())
            .env("ID", id)
            .env_remove("CONCH_LOG");
        let label = format!("[{n}] conch {} (candidate {id})", args.join(" "));
        Ok(Proc::spawn(cmd, label, out, err)?.kill_group_named_in(self.path(&format!("{id}.pid"))))
    }

    /// A candidate `id` of election `x` that logs its start, holds until `$T/<id>.go` exists (or
    /// SIGTERM), and logs its end.
    fn candidate(&self, id: &str, flags: &str) -> anyhow::Result<Proc> {
        let body = r#"echo $$ > "$T/$ID.pid"
log() { echo "$1 $ID $(date +%s%N) $CONCH_REV $CONCH_LEADER_VALUE" >> "$T/log"; }
trap 'log end; exit 3' TERM
log start
while [ ! -e "$T/$ID.go" ]; do sleep 0.02; done
log end"#;
        let mut args: Vec<&str> = vec!["elect", "x", "--value", id];
        args.extend(flags.split_whitespace());
        args.extend(["--", "sh", "-c", body]);
        self.conch(id, &args)
    }

    async fn wait_file(&self, name: &str, pred: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        let path = self.path(name);
        wait_for(&format!("{name} to be written"), SHOW_UP, || {
            let text = std::fs::read_to_string(&path).ok().filter(|t| pred(t));
            async move { text }
        })
        .await
        .with_context(|| format!("{name} holds {:?}", self.read(name)))
    }

    /// The `--value`s queued in election `x`, in queue order (from whichever node answers).
    async fn candidates(&self) -> Option<Vec<String>> {
        for addr in self.cluster.endpoints() {
            let Ok(channel) = cluster_tests::channel(&addr).await else {
                continue;
            };
            let request = ListSemaphoreWaitersRequest {
                namespace_name: "conch".into(),
                semaphore_name: "x.elect".into(),
                ..Default::default()
            };
            if let Ok(r) = ConchApiClient::new(channel)
                .list_semaphore_waiters(request)
                .await
            {
                let waiters = r.into_inner().waiters;
                return Some(
                    waiters
                        .iter()
                        .map(|w| w.metadata.get("value").cloned().unwrap_or_default())
                        .collect(),
                );
            }
        }
        None
    }

    async fn wait_candidates(&self, ids: &[&str]) -> anyhow::Result<()> {
        wait_for(&format!("candidates {ids:?}"), SHOW_UP, || async {
            (self.candidates().await? == ids).then_some(())
        })
        .await
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Event {
    start: bool,
    id: String,
    ns: i128,
    rev: u64,
    value: String,
}

fn events(text: &str) -> anyhow::Result<Vec<Event>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            ensure!(f.len() == 5, "bad event line {l:?}");
            Ok(Event {
                start: f[0] == "start",
                id: f[1].to_string(),
                ns: f[2].parse()?,
                rev: f[3]
                    .parse()
                    .with_context(|| format!("CONCH_REV in {l:?}"))?,
                value: f[4].to_string(),
            })
        })
        .collect()
}

fn event<'a>(evs: &'a [Event], id: &str, start: bool) -> anyhow::Result<&'a Event> {
    evs.iter()
        .find(|e| e.id == id && e.start == start)
        .with_context(|| {
            format!(
                "no {} of {id} in {evs:?}",
                if start { "start" } else { "end" }
            )
        })
}

/// Each command ran alone: every start comes after the previous command's end.
fn one_at_a_time(evs: &[Event]) -> anyhow::Result<Vec<String>> {
    let mut sorted = evs.to_vec();
    sorted.sort_by_key(|e| (e.ns, !e.start));
    let mut running: Option<&Event> = None;
    let mut order = Vec::new();
    for e in &sorted {
        if e.start {
            ensure!(running.is_none(), "{e:?} started while {running:?} ran");
            running = Some(e);
            order.push(e.id.clone());
        } else {
            ensure!(running.map(|r| &r.id) == Some(&e.id), "unmatched end {e:?}");
            running = None;
        }
    }
    Ok(order)
}

/// The observer's records of who leads: (leader value or `None`, rev).
fn observed(stdout: &str) -> anyhow::Result<Vec<(Option<String>, Option<u64>)>> {
    Ok(records(stdout)?
        .iter()
        .filter(|v| v["event"] == "leader")
        .map(|v| (v["value"].as_str().map(String::from), v["rev"].as_u64()))
        .collect())
}

/// The observer's records, as JSON.
fn records(stdout: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).with_context(|| l.to_string())?;
            ensure!(v["time"].is_string(), "no time in {l}");
            Ok(v)
        })
        .collect()
}

/// The observer's departure records: (event, value of the leader that went, its rev, cause).
fn departures(stdout: &str) -> anyhow::Result<Vec<(String, String, u64, String)>> {
    Ok(records(stdout)?
        .iter()
        .filter(|v| v["event"] != "leader")
        .map(|v| {
            (
                v["event"].as_str().unwrap_or_default().to_string(),
                v["value"].as_str().unwrap_or_default().to_string(),
                v["rev"].as_u64().unwrap_or_default(),
                v["cause"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// Three candidates run one at a time in queue order, each with its value and a growing
/// fencing token; `--who` lists them in succession order and an observer sees every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_take_over_in_queue_order_and_an_observer_sees_each() -> anyhow::Result<()>
{
    let f = Fixture::start().await?;
    let observer = f.conch("obs", &["elect", "x", "--observe", "--json"])?;
    wait_for("the observer's first line", SHOW_UP, || async {
        (!observer.stdout().is_empty()).then_some(())
    })
    .await?;

    let mut a = f.candidate("a", "--ttl 5s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.candidate("b", "--ttl 5s")?;
    f.wait_candidates(&["b"]).await?;
    let mut c = f.candidate("c", "--ttl 5s")?;
    f.wait_candidates(&["b", "c"]).await?;

    let mut who = f.conch("who", &["elect", "x", "--who"])?;
    ensure!(who.code(SHOW_UP).await? == 0, "--who: {}", who.stderr());
    let lines: Vec<String> = who.stdout().lines().map(String::from).collect();
    ensure!(lines.len() == 3, "--who: {lines:?}");
    for (line, (state, value)) in
        lines
            .iter()
            .zip([("LEADER", "a"), ("CANDIDATE", "b"), ("CANDIDATE", "c")])
    {
        ensure!(
            line.starts_with(&format!("x {state:<9} value={value} ")),
            "--who line {line:?}"
        );
    }

    for (id, next) in [("a", Some("b")), ("b", Some("c")), ("c", None)] {
        f.touch(&format!("{id}.go"))?;
        if let Some(next) = next {
            f.wait_file("log", |t| t.contains(&format!("start {next}")))
                .await?;
        }
    }
    for p in [&mut a, &mut b, &mut c] {
        ensure!(p.code(SHOW_UP).await? == 0, "stderr {:?}", p.stderr());
    }
    let evs = events(&f.read("log"))?;
    ensure!(evs.len() == 6, "{evs:?}");
    assert_eq!(one_at_a_time(&evs)?, ["a", "b", "c"]);
    let revs: Vec<u64> = ["a", "b", "c"]
        .iter()
        .map(|id| event(&evs, id, true).map(|e| e.rev))
        .collect::<anyhow::Result<_>>()?;
    ensure!(revs.windows(2).all(|w| w[0] < w[1]), "revs {revs:?}");
    for e in &evs {
        ensure!(e.value == e.id, "CONCH_LEADER_VALUE in {e:?}");
    }

    // The observer saw nobody, a, b, c (each with its token), then nobody again.
    let seen = wait_for("the observer to see c go", SHOW_UP, || async {
        let seen = observed(&observer.stdout()).ok()?;
        (seen.len() >= 5 && seen.last() == Some(&(None, None))).then_some(seen)
    })
    .await
    .with_context(|| format!("observer stdout {:?}", observer.stdout()))?;
    let leaders: Vec<(Option<String>, Option<u64>)> =
        seen.iter().filter(|(v, _)| v.is_some()).cloned().collect();
    assert_eq!(
        leaders,
        [
            (Some("a".to_string()), Some(revs[0])),
            (Some("b".to_string()), Some(revs[1])),
            (Some("c".to_string()), Some(revs[2])),
        ],
        "observer stdout {:?}",
        observer.stdout()
    );
    assert_eq!(seen.first(), Some(&(None, None)));
    observer.signal(Signal::SIGTERM);
    Ok(())
}

/// kill -9 of the leader's conch: its command goes with it, and the next candidate leads within
/// the TTL plus a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_succeeded_within_the_ttl() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let ttl = Duration::from_secs(3);
    let a = f.candidate("a", "--ttl 3s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.candidate("b", "--ttl 3s")?;
    f.wait_candidates(&["b"]).await?;
    let killed_at = now_ns();
    a.signal(Signal::SIGKILL);
    let log = f.wait_file("log", |t| t.contains("start b")).await?;
    let b_start = event(&events(&log)?, "b", true)?.ns;
    let took = Duration::from_nanos((b_start - killed_at).max(0) as u64);
    eprintln!("b led {took:?} after a's conch was killed (TTL {ttl:?})");
    ensure!(
        took < ttl + Duration::from_secs(5),
        "b took {took:?} to take over"
    );
    f.touch("b.go")?;
    ensure!(b.code(SHOW_UP).await? == 0, "stderr {:?}", b.stderr());
    Ok(())
}

/// A leader whose conch is stopped (SIGSTOP) cannot refresh its lease: its guard stops the
/// command before the lease can expire, so the successor starts after the old command ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_ends_its_command_before_the_successor_starts() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut a = f.candidate("a", "--ttl 3s --kill-after 1s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.candidate("b", "--ttl 3s")?;
    f.wait_candidates(&["b"]).await?;
    a.signal(Signal::SIGSTOP);
    let waited = f.wait_file("log", |t| t.contains("start b")).await;
    a.signal(Signal::SIGCONT);
    let log = waited?;
    let evs = events(&log)?;
    let a_end = event(&evs, "a", false)?.ns;
    let b_start = event(&evs, "b", true)?.ns;
    ensure!(
        a_end < b_start,
        "b started {} ms before a's command ended: {evs:?}",
        (a_end - b_start) / 1_000_000
    );
    ensure!(a.code(SHOW_UP).await? == EX_SLOT_LOST, "a: {}", a.stderr());
    ensure!(
        a.stderr().contains("leadership lost"),
        "a: {:?}",
        a.stderr()
    );
    f.touch("b.go")?;
    ensure!(b.code(SHOW_UP).await? == 0, "stderr {:?}", b.stderr());
    Ok(())
}

/// The observer keeps following when the node it talks to (the Raft leader, where the client
/// goes first) is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_follows_across_a_node_failure() -> anyhow::Result<()> {
    let mut f = Fixture::start().await?;
    let mut a = f.candidate("a", "--ttl 5s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let observer = f.conch("obs", &["elect", "x", "--observe"])?;
    wait_for("the observer to see a", SHOW_UP, || async {
        observer.stdout().contains("leader=a ").then_some(())
    })
    .await?;
    let node = f.cluster.wait_for_leader(SHOW_UP).await?;
    f.cluster.kill(node);
    f.cluster.wait_for_leader(SHOW_UP).await?;
    f.touch("a.go")?;
    ensure!(a.code(SHOW_UP).await? == 0, "a: {}", a.stderr());
    let mut b = f.candidate("b", "--ttl 5s")?;
    wait_for("the observer to see b", SHOW_UP, || async {
        observer.stdout().contains("leader=b ").then_some(())
    })
    .await
    .with_context(|| {
        format!(
            "observer stdout {:?} stderr {:?}",
            observer.stdout(),
            observer.stderr()
        )
    })?;
    let lines: Vec<String> = observer.stdout().lines().map(String::from).collect();
    let a_at = lines.iter().position(|l| l.contains("leader=a "));
    let b_at = lines.iter().position(|l| l.contains("leader=b "));
    ensure!(a_at < b_at, "order: {lines:?}");
    f.touch("b.go")?;
    ensure!(b.code(SHOW_UP).await? == 0, "b: {}", b.stderr());
    Ok(())
}

/// At a terminal a waiting `conch sema` shows one status line (its place in the queue and who
/// holds the slot), redrawn in place and erased when the slot comes; off a terminal stderr stays
/// empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_at_a_terminal_shows_a_status_line_and_clears_it() -> anyhow::Result<()> {
    const ERASE: &str = "\r\x1b[2K";
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: util-linux script is not installed");
        return Ok(());
    }
    let f = Fixture::start().await?;
    let hold = r#"echo $$ > "$T/$ID.pid"; while [ ! -e "$T/$ID.go" ]; do sleep 0.02; done"#;
    let holder = f.conch("h", &["sema", "s", "--max", "1", "--", "sh", "-c", hold])?;
    f.wait_file("h.pid", |t| !t.trim().is_empty()).await?;

    let conch = binary("conch");
    let line = format!("{} sema s --max 1 --wait 60s -- true", conch.display());
    let n = f.spawned.get() + 1;
    f.spawned.set(n);
    let out = f.path("tty.out");
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &line, "/dev/null"])
        .current_dir(f.dir.path())
        .env("CONCH_ENDPOINTS", f.cluster.endpoints().join(","))
        .env("COLUMNS", "300")
        .env_remove("CONCH_LOG");
    let mut tty = Proc::spawn(
        cmd,
        format!("[{n}] script {line}"),
        out.clone(),
        f.path("tty.err"),
    )?;
    let holder_pid = holder.pid();
    let shown = wait_for("the status line", SHOW_UP, || async {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        (text.contains("next in line") && text.contains(&format!("pid {holder_pid} for")))
            .then_some(text)
    })
    .await
    .with_context(|| format!("tty output {:?}", std::fs::read_to_string(&out)))?;
    ensure!(
        shown.contains(ERASE) && shown.contains("conch: waiting "),
        "{shown:?}"
    );
    // Queued behind it, off a terminal.
    let mut plain = f.conch(
        "p",
        &["sema", "s", "--max", "1", "--wait", "60s", "--", "true"],
    )?;
    wait_for("the second waiter to queue", SHOW_UP, || async {
        let queued = f.cluster.endpoints().first().cloned()?;
        let channel = cluster_tests::channel(&queued).await.ok()?;
        let request = ListSemaphoreWaitersRequest {
            namespace_name: "conch".into(),
            semaphore_name: "s.1".into(),
            ..Default::default()
        };
        let r = ConchApiClient::new(channel)
            .list_semaphore_waiters(request)
            .await
            .ok()?;
        (r.into_inner().waiters.len() == 2).then_some(())
    })
    .await?;

    f.touch("h.go")?;
    ensure!(
        tty.code(SHOW_UP).await? == 0,
        "tty output {:?}",
        tty.stdout()
    );
    ensure!(
        plain.code(SHOW_UP).await? == 0,
        "stderr {:?}",
        plain.stderr()
    );
    let text = tty.stdout();
    eprintln!("what the terminal got: {text:?}");
    let cleared = text.rfind(ERASE).context("never erased")?;
    let last_drawn = text.rfind("conch: waiting").context("never drawn")?;
    ensure!(
        last_drawn < cleared && !text[cleared..].contains("waiting"),
        "the status line was left behind: {text:?}"
    );
    ensure!(
        plain.stderr().is_empty(),
        "off a terminal stderr changed: {:?}",
        plain.stderr()
    );
    drop(holder);
    Ok(())
}

/// SIGTERM to the leader's conch: its command is stopped (here it exits 3 on SIGTERM) and the
/// leadership given back at once; the next candidate starts after the old command ended, long
/// before the 300 s lease could expire. A command that ignores SIGTERM is killed after
/// `--kill-after`, and its successor still starts only after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_leader_stops_its_command_then_hands_over_at_once() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut a = f.candidate("a", "--ttl 300s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.conch(
        "b",
        &[
            "elect",
            "x",
            "--value",
            "b",
            "--ttl",
            "300s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            // Logs its start, ignores SIGTERM, and holds until killed.
            r#"echo "start b $(date +%s%N) $CONCH_REV $CONCH_LEADER_VALUE" >> "$T/log"
trap '' TERM
while :; do sleep 0.02; done"#,
        ],
    )?;
    f.wait_candidates(&["b"]).await?;
    let mut c = f.candidate("c", "--ttl 300s")?;
    f.wait_candidates(&["b", "c"]).await?;

    a.signal(Signal::SIGTERM);
    f.wait_file("log", |t| t.contains("start b")).await?;
    ensure!(a.code(SHOW_UP).await? == 3, "a: {}", a.stderr());
    ensure!(a.stderr().contains("SIGTERM"), "a: {:?}", a.stderr());

    b.signal(Signal::SIGTERM);
    f.wait_file("log", |t| t.contains("start c")).await?;
    let b_code = b.code(SHOW_UP).await?;
    ensure!(b_code == 128 + 9, "b exited {b_code}: {}", b.stderr());
    let evs = events(&f.read("log"))?;
    let b_start = event(&evs, "b", true)?;
    let c_start = event(&evs, "c", true)?;
    ensure!(
        event(&evs, "a", false)?.ns < b_start.ns,
        "b started before a's command ended: {evs:?}"
    );
    ensure!(b_start.rev < c_start.rev, "revs: {evs:?}");
    // b's command never logged an end: it was killed, and c started after b's conch saw it go.
    ensure!(!evs.iter().any(|e| e.id == "b" && !e.start), "{evs:?}");

    f.touch("c.go")?;
    ensure!(c.code(SHOW_UP).await? == 0, "c: {}", c.stderr());
    Ok(())
}

/// A candidate of higher priority takes over when it joins: the leader stops its command and
/// stands again; a candidate of lower priority ahead of it in the queue lets it lead first
/// without starting its command. Equal priorities keep queue order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_of_higher_priority_takes_over_when_it_joins() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    // a reads the queue every third of its 3 s TTL.
    let mut a = f.candidate("a", "--ttl 3s --priority 1")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.candidate("b", "--ttl 3s --priority 1")?;
    f.wait_candidates(&["b"]).await?;
    // Equal priority: b waits, a keeps leading.
    let mut who = f.conch("who", &["elect", "x", "--who"])?;
    ensure!(who.code(SHOW_UP).await? == 0, "--who: {}", who.stderr());
    ensure!(
        who.stdout().contains("priority=1"),
        "--who: {:?}",
        who.stdout()
    );

    let mut c = f.candidate("c", "--ttl 3s --priority 5")?;
    let log = f.wait_file("log", |t| t.contains("start c")).await?;
    let evs = events(&log)?;
    assert_eq!(one_at_a_time(&evs)?, ["a", "c"], "{evs:?}");
    ensure!(
        a.stderr().contains("candidate c (priority 5) is preferred"),
        "a: {:?}",
        a.stderr()
    );
    // a stands again: a and b both wait behind c.
    wait_for("a and b to wait behind c", SHOW_UP, || async {
        let mut waiting = f.candidates().await?;
        waiting.sort();
        (waiting == ["a", "b"]).then_some(())
    })
    .await?;

    for id in ["a", "b", "c"] {
        f.touch(&format!("{id}.go"))?;
    }
    for p in [&mut a, &mut b, &mut c] {
        ensure!(p.code(SHOW_UP).await? == 0, "stderr {:?}", p.stderr());
    }
    let evs = events(&f.read("log"))?;
    let order = one_at_a_time(&evs)?;
    ensure!(order[..2] == ["a", "c"] && order.len() == 4, "{order:?}");
    ensure!(
        order[2..].contains(&"a".to_string()) && order[2..].contains(&"b".to_string()),
        "{order:?}"
    );
    Ok(())
}

/// The observer says how each leader went: one resigns (its command exits), one is revoked by
/// an administrator with a reason, one's conch is killed so that its lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_observer_says_how_each_leader_went() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let observer = f.conch("obs", &["elect", "x", "--observe", "--json"])?;
    wait_for("the observer's first line", SHOW_UP, || async {
        (!observer.stdout().is_empty()).then_some(())
    })
    .await?;
    let mut a = f.candidate("a", "--ttl 3s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.candidate("b", "--ttl 3s")?;
    f.wait_candidates(&["b"]).await?;
    let c = f.candidate("c", "--ttl 3s")?;
    f.wait_candidates(&["b", "c"]).await?;
    let mut d = f.candidate("d", "--ttl 3s")?;
    f.wait_candidates(&["b", "c", "d"]).await?;

    // a resigns: its command ends, conch revokes its lease.
    f.touch("a.go")?;
    f.wait_file("log", |t| t.contains("start b")).await?;
    ensure!(a.code(SHOW_UP).await? == 0, "a: {}", a.stderr());
    // b is revoked by an administrator.
    wait_for("the observer to see b lead", SHOW_UP, || async {
        let seen = observed(&observer.stdout()).ok()?;
        seen.iter()
            .any(|(v, _)| v.as_deref() == Some("b"))
            .then_some(())
    })
    .await?;
    let mut revoke = f.conch(
        "admin",
        &["revoke", "elect", "x", "--reason", "moving the scheduler"],
    )?;
    ensure!(
        revoke.code(SHOW_UP).await? == 0,
        "revoke: {}",
        revoke.stderr()
    );
    f.wait_file("log", |t| t.contains("start c")).await?;
    ensure!(b.code(SHOW_UP).await? == 81, "b: {}", b.stderr());
    // c's conch and command are killed outright: its lease expires.
    wait_for("the observer to see c lead", SHOW_UP, || async {
        let seen = observed(&observer.stdout()).ok()?;
        seen.iter()
            .any(|(v, _)| v.as_deref() == Some("c"))
            .then_some(())
    })
    .await?;
    c.signal(Signal::SIGKILL);
    if let Ok(pid) = f.read("c.pid").trim().parse::<i32>() {
        cluster_tests::proc::signal_pid(pid, Signal::SIGKILL);
    }
    f.wait_file("log", |t| t.contains("start d")).await?;

    let gone = wait_for("three departures", SHOW_UP, || async {
        let gone = departures(&observer.stdout()).ok()?;
        (gone.len() >= 3).then_some(gone)
    })
    .await
    .with_context(|| format!("observer stdout {:?}", observer.stdout()))?;
    let events: Vec<(&str, &str)> = gone
        .iter()
        .map(|(e, v, _, _)| (e.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        events,
        [("resigned", "a"), ("revoked", "b"), ("expired", "c")],
        "observer stdout {:?}",
        observer.stdout()
    );
    ensure!(
        gone[1].3.contains("moving the scheduler"),
        "revoke cause {:?}",
        gone[1].3
    );
    ensure!(gone.iter().all(|g| g.2 > 0), "revs in {gone:?}");
    f.touch("d.go")?;
    ensure!(d.code(SHOW_UP).await? == 0, "d: {}", d.stderr());
    observer.signal(Signal::SIGTERM);
    Ok(())
}

/// Through a follower only, and across the Raft leader's death: a preferred candidate still
/// takes over when it joins, and SIGTERM to a leader still hands over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_work_through_a_follower_and_across_a_leader_kill() -> anyhow::Result<()> {
    let mut f = Fixture::start().await?;
    let leader = f.cluster.wait_for_leader(SHOW_UP).await?;
    let follower = f
        .cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader)
        .context("no follower")?;
    f.endpoints = Some(f.cluster.addr(follower));

    let mut a = f.candidate("a", "--ttl 3s")?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.candidate("b", "--ttl 3s")?;
    f.wait_candidates(&["b"]).await?;
    f.cluster.kill(leader);
    let mut c = f.candidate("c", "--ttl 3s --priority 2")?;
    let log = f.wait_file("log", |t| t.contains("start c")).await?;
    assert_eq!(one_at_a_time(&events(&log)?)?, ["a", "c"], "{log}");
    ensure!(a.stderr().contains("is preferred"), "a: {:?}", a.stderr());

    c.signal(Signal::SIGTERM);
    // The next of a and b (both queued again behind c) starts.
    let log = f
        .wait_file("log", |t| t.matches("start ").count() >= 3)
        .await?;
    ensure!(c.code(SHOW_UP).await? == 3, "c: {}", c.stderr());
    let evs = events(&log)?;
    let order = one_at_a_time(&evs)?;
    ensure!(order.len() == 3 && order[..2] == ["a", "c"], "{order:?}");
    for id in ["a", "b"] {
        f.touch(&format!("{id}.go"))?;
    }
    for p in [&mut a, &mut b] {
        ensure!(p.code(SHOW_UP).await? == 0, "stderr {:?}", p.stderr());
    }
    Ok(())
}

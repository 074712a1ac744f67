//! `conch lock` end to end: real `conch` processes against a real 3-node conchd cluster.
//!
//! The commands conch runs are small shell scripts that write what they see (`start`/`end`
//! lines with `date +%s%N` and `$CONCH_REV`) to files in a per-test directory. Commands that
//! must hold their lock for a while wait for a "gate" file the test creates, and the test waits
//! for conditions (a file written, an acquire queued) with deadlines, never for fixed times.
//!
//! Every process a test starts runs in a process group of its own and is killed on drop,
//! together with the groups of its descendants (conch puts its command in a group of its own).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use cluster_tests::proc::{Proc, pid_alive};
use cluster_tests::{Cluster, binary, wait_for};
use conch_client::Client;
use conch_client::sema::META_PID;

/// How long any single conch run may take before it counts as hung.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a condition (a file written, a waiter queued) may take to show up.
const SHOW_UP: Duration = Duration::from_secs(30);

const EX_NO_SLOT: i32 = 75;
const EX_SLOT_LOST: i32 = 79;
const NS: &str = "conch";

struct Fixture {
    cluster: Cluster,
    client: Client,
    dir: tempfile::TempDir,
    spawned: std::cell::Cell<usize>,
    passed: std::cell::Cell<bool>,
}

impl Drop for Fixture {
    /// A test that did not reach [`Fixture::passed`] prints what the processes said and the
    /// end of the nodes' logs.
    fn drop(&mut self) {
        if self.passed.get() {
            return;
        }
        for n in 1..=self.spawned.get() {
            let read = |ext: &str| {
                std::fs::read_to_string(self.path(&format!("proc{n}.{ext}"))).unwrap_or_default()
            };
            eprintln!(
                "proc {n}: stdout {:?} stderr {:?}",
                read("out"),
                read("err")
            );
        }
        eprintln!("{}", self.cluster.logs_tail());
    }
}

impl Fixture {
    async fn start() -> anyhow::Result<Fixture> {
        let cluster = Cluster::start(3).await?;
        let client = Client::connect(cluster.endpoints()).await?;
        let dir = tempfile::Builder::new().prefix("conch-lock-").tempdir()?;
        Ok(Fixture {
            cluster,
            client,
            dir,
            spawned: std::cell::Cell::new(0),
            passed: std::cell::Cell::new(false),
        })
    }

    fn passed(&self) -> anyhow::Result<()> {
        self.passed.set(true);
        Ok(())
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

    /// `conch args…` in the scratch directory with `CONCH_ENDPOINTS` naming the cluster, `T`
    /// the scratch directory, and `env` added (the command inherits them).
    fn conch(&self, env: &[(&str, &str)], args: &[&str]) -> anyhow::Result<Proc> {
        let n = self.spawned.get() + 1;
        self.spawned.set(n);
        let mut cmd = Command::new(binary("conch"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("CONCH_ENDPOINTS", self.cluster.endpoints().join(","))
            .env("T", self.dir.path())
            .env_remove("CONCH_LOG")
            .env_remove("CONCH_NAMESPACE")
            .envs(env.iter().copied());
        let label = format!("[{n}] conch {}", args.join(" "));
        Proc::spawn(
            cmd,
            label,
            self.path(&format!("proc{n}.out")),
            self.path(&format!("proc{n}.err")),
        )
    }

    /// Runs `conch args…` to the end: (exit code, stdout, stderr).
    async fn run(&self, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
        let mut p = self.conch(&[], args)?;
        let code = p.code(EXIT_TIMEOUT).await?;
        Ok((code, p.stdout(), p.stderr()))
    }

    /// Waits until file `name` exists and `pred` holds for its contents; returns them.
    async fn wait_file(&self, name: &str, pred: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        let path = self.path(name);
        wait_for(
            &format!("{} to be written", path.display()),
            SHOW_UP,
            || {
                let text = std::fs::read_to_string(&path).ok().filter(|t| pred(t));
                async move { text }
            },
        )
        .await
        .with_context(|| format!("{name} holds {:?}", self.read(name)))
    }

    /// The conch pids (from the waiter metadata) queued on `path`, its ancestors and
    /// descendants, in queue order.
    async fn waiter_pids(&self, path: &str) -> Option<Vec<i32>> {
        let waiters = self.client.list_lock_waiters(NS, path).await.ok()?;
        Some(
            waiters
                .iter()
                .map(|w| {
                    w.metadata
                        .get(META_PID)
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(-1)
                })
                .collect(),
        )
    }

    /// Waits until the acquires queued on `path` (and related paths) are exactly `pids`.
    async fn wait_queue(&self, path: &str, pids: &[i32]) -> anyhow::Result<()> {
        wait_for(
            &format!("lock {path} to have waiters {pids:?}"),
            SHOW_UP,
            || async { (self.waiter_pids(path).await.as_deref() == Some(pids)).then_some(()) },
        )
        .await
    }

    /// `conch lock <args> --who --json`, parsed; with its exit code.
    async fn who(&self, args: &[&str]) -> anyhow::Result<(i32, serde_json::Value)> {
        let mut full = vec!["lock"];
        full.extend_from_slice(args);
        full.extend(["--who", "--json"]);
        let (code, out, err) = self.run(&full).await?;
        let v = serde_json::from_str(&out)
            .with_context(|| format!("--who --json printed {out:?} (stderr {err:?})"))?;
        Ok((code, v))
    }
}

/// `conch` arguments: the words of `flags`, then `-- sh -c <body>`.
fn sh_c<'a>(flags: &'a str, body: &'a str) -> Vec<&'a str> {
    flags
        .split_whitespace()
        .chain(["--", "sh", "-c", body])
        .collect()
}

/// `echo "start $ID <ns> $CONCH_REV" >> $T/<log>`.
fn log_start(log: &str) -> String {
    format!(r#"echo "start $ID $(date +%s%N) $CONCH_REV" >> "$T/{log}""#)
}

fn log_end(log: &str) -> String {
    format!(r#"echo "end $ID $(date +%s%N) $CONCH_REV" >> "$T/{log}""#)
}

/// Blocks until the file `$T/<name>` exists.
fn gate(name: &str) -> String {
    format!(r#"while [ ! -e "$T/{name}" ]; do sleep 0.02; done"#)
}

/// Writes `$CONCH_REV $CONCH_LOCK $CONCH_LOCK_MODE $$ $CONCH_LEASE` to `$T/<file>`
/// (atomically).
fn report(file: &str) -> String {
    format!(
        r#"echo "$CONCH_REV $CONCH_LOCK $CONCH_LOCK_MODE $$ $CONCH_LEASE" > "$T/{file}.tmp" && mv "$T/{file}.tmp" "$T/{file}""#
    )
}

#[derive(Debug, Clone, PartialEq)]
struct Event {
    start: bool,
    id: String,
    ns: i128,
    rev: u64,
}

fn events(text: &str) -> anyhow::Result<Vec<Event>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            ensure!(f.len() == 4, "bad event line {l:?}");
            Ok(Event {
                start: match f[0] {
                    "start" => true,
                    "end" => false,
                    other => bail!("bad event kind {other:?}"),
                },
                id: f[1].to_string(),
                ns: f[2].parse().with_context(|| format!("time in {l:?}"))?,
                rev: f[3]
                    .parse()
                    .with_context(|| format!("CONCH_REV in {l:?}"))?,
            })
        })
        .collect()
}

/// Every id started once and ended once, after it started; returns the starts in time order.
fn check_serial(evs: &[Event], ids: &[&str]) -> anyhow::Result<Vec<Event>> {
    ensure!(evs.len() == ids.len() * 2, "unexpected events: {evs:?}");
    let mut sorted = evs.to_vec();
    // At equal timestamps a start counts before an end: an overlap is never hidden.
    sorted.sort_by_key(|e| (e.ns, !e.start));
    let mut running: Option<&Event> = None;
    for e in &sorted {
        match (e.start, running) {
            (true, None) => running = Some(e),
            (true, Some(r)) => bail!("{} started while {} ran: {sorted:?}", e.id, r.id),
            (false, Some(r)) if r.id == e.id => running = None,
            (false, _) => bail!("{} ended without running alone: {sorted:?}", e.id),
        }
    }
    for id in ids {
        ensure!(
            sorted.iter().filter(|e| e.id == *id && e.start).count() == 1,
            "{id} did not start exactly once: {sorted:?}"
        );
    }
    Ok(sorted.into_iter().filter(|e| e.start).collect())
}

fn pid_in(report: &str) -> anyhow::Result<i32> {
    report
        .split_whitespace()
        .nth(3)
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("no pid in {report:?}"))
}

/// Two exclusive runs on one path: the second queues behind the first (`--who --json` shows
/// the holder and the waiter), they never overlap, and the fencing token the command sees
/// increases from the first holder to the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_runs_on_one_path_never_overlap_and_their_tokens_increase() -> anyhow::Result<()>
{
    let f = Fixture::start().await?;
    let body = format!("{}; {}; {}", log_start("log"), gate("go"), log_end("log"));
    let mut a = f.conch(&[("ID", "a")], &sh_c("lock jobs/x", &body))?;
    f.wait_file("log", |t| t.contains("start a")).await?;
    let mut b = f.conch(&[("ID", "b")], &sh_c("lock jobs/x", &body))?;
    f.wait_queue("jobs/x", &[b.pid()]).await?;

    let (code, who) = f.who(&["jobs/x"]).await?;
    ensure!(code == 0, "--who exits 0 while the lock is held: {who}");
    ensure!(who["state"] == "exclusive", "{who}");
    let holders = who["holders"].as_array().context("holders")?;
    ensure!(holders.len() == 1, "one holder: {who}");
    ensure!(holders[0]["pid"] == a.pid(), "a holds: {who}");
    ensure!(holders[0]["mode"] == "exclusive", "{who}");
    ensure!(holders[0]["path"] == "jobs/x", "{who}");
    let waiters = who["waiters"].as_array().context("waiters")?;
    ensure!(
        waiters.len() == 1 && waiters[0]["pid"] == b.pid(),
        "b waits: {who}"
    );
    ensure!(who["blocked"]["reason"] == "peer", "{who}");
    // The text form says the same.
    let (code, text, _) = f.run(&["lock", "jobs/x", "--who"]).await?;
    ensure!(code == 0, "--who text exits 0: {text}");
    ensure!(
        text.lines()
            .next()
            .is_some_and(|l| l.starts_with("jobs/x HELD exclusive")
                && l.contains(&format!("pid={}", a.pid()))),
        "{text}"
    );
    ensure!(
        text.lines()
            .any(|l| l.contains("WAIT") && l.contains(&format!("pid={}", b.pid()))),
        "{text}"
    );

    f.touch("go")?;
    a.expect_code(0, EXIT_TIMEOUT).await?;
    b.expect_code(0, EXIT_TIMEOUT).await?;
    let starts = check_serial(&events(&f.read("log"))?, &["a", "b"])?;
    let ids: Vec<&str> = starts.iter().map(|e| e.id.as_str()).collect();
    ensure!(ids == ["a", "b"], "a ran first: {starts:?}");
    ensure!(
        starts[0].rev > 0 && starts[1].rev > starts[0].rev,
        "CONCH_REV increases between holders: {starts:?}"
    );
    let (code, out) = f.who(&["jobs/x"]).await?;
    ensure!(
        code == 0 && out["holders"] == serde_json::json!([]),
        "--who says nothing holds, and exits 0: {code} {out}"
    );
    f.passed()
}

/// Shared runs on one path and on an ancestor coexist: all three are running at once (each
/// waits for the others' start files, then for a gate). An exclusive run meanwhile waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_runs_coexist_and_hold_off_an_exclusive_one() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = |me: &str| {
        format!(
            "{}; {}; {}; {}; {}",
            report(me),
            gate("s1"),
            gate("s2"),
            gate("s3"),
            gate("go")
        )
    };
    let mut s1 = f.conch(&[], &sh_c("lock db/t --shared", &body("s1")))?;
    let mut s2 = f.conch(&[], &sh_c("lock db/t --shared", &body("s2")))?;
    let mut s3 = f.conch(&[], &sh_c("lock db --shared", &body("s3")))?;
    for s in ["s1", "s2", "s3"] {
        let seen = f.wait_file(s, |t| t.ends_with('\n')).await?;
        ensure!(seen.contains(" shared "), "CONCH_LOCK_MODE: {seen:?}");
    }
    ensure!(
        f.read("s3").contains(" db shared "),
        "CONCH_LOCK: {:?}",
        f.read("s3")
    );
    // Every shared command is running now (none ends before the gate opens); an exclusive
    // one on the ancestor waits for them.
    let mut x = f.conch(&[], &sh_c("lock db", &report("x")))?;
    f.wait_queue("db", &[x.pid()]).await?;
    ensure!(f.read("x").is_empty(), "the exclusive run waited");
    f.touch("go")?;
    for s in [&mut s1, &mut s2, &mut s3] {
        s.expect_code(0, EXIT_TIMEOUT).await?;
    }
    x.expect_code(0, EXIT_TIMEOUT).await?;
    let seen = f.read("x");
    ensure!(seen.contains(" db exclusive "), "{seen:?}");
    f.passed()
}

/// An exclusive run on `a` waits for a holder of `a/b`: `--nonblock` exits 75 naming the
/// reason and the blocking path, `--who --json` says the same, and a waiting run starts once
/// the holder is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_parent_waits_for_a_child_holder() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let child_body = format!("{}; {}", report("child"), gate("go"));
    let mut child = f.conch(&[], &sh_c("lock a/b", &child_body))?;
    f.wait_file("child", |t| t.ends_with('\n')).await?;

    let (code, out, err) = f.run(&["lock", "a", "--nonblock", "--", "true"]).await?;
    ensure!(
        code == EX_NO_SLOT,
        "--nonblock on a busy parent exits 75: {code} {out:?} {err:?}"
    );
    ensure!(
        err.contains("descendant") && err.contains("a/b"),
        "the message names the reason and the blocking path: {err:?}"
    );
    // A sibling is not in the way.
    let (code, _, err) = f.run(&["lock", "a/c", "--nonblock", "--", "true"]).await?;
    ensure!(code == 0, "a sibling is free: {err:?}");

    let mut parent = f.conch(&[], &sh_c("lock a", &report("parent")))?;
    f.wait_queue("a", &[parent.pid()]).await?;
    let (code, who) = f.who(&["a"]).await?;
    ensure!(code == 0, "something under a is held: {who}");
    ensure!(who["state"] == "unlocked", "a itself is not held: {who}");
    ensure!(who["blocked"]["reason"] == "descendant", "{who}");
    ensure!(
        who["blocked"]["blocking"] == serde_json::json!(["a/b"]),
        "{who}"
    );
    ensure!(who["holders"][0]["path"] == "a/b", "{who}");
    ensure!(who["waiters"][0]["pid"] == parent.pid(), "{who}");
    ensure!(who["waiters"][0]["path"] == "a", "{who}");
    ensure!(f.read("parent").is_empty(), "the parent waited");

    f.touch("go")?;
    child.expect_code(0, EXIT_TIMEOUT).await?;
    parent.expect_code(0, EXIT_TIMEOUT).await?;
    let rev = |name: &str| -> anyhow::Result<u64> {
        let text = f.read(name);
        text.split_whitespace()
            .next()
            .and_then(|r| r.parse().ok())
            .with_context(|| format!("no CONCH_REV in {name}: {text:?}"))
    };
    ensure!(
        rev("parent")? > rev("child")?,
        "tokens increase cluster-wide"
    );
    f.passed()
}

/// `DeleteLock` of a held path stops the holder: SIGTERM to its command, exit 79; the lock is
/// free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_held_lock_stops_the_holder_with_79() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = format!("{}; exec sleep 600", report("held"));
    let mut holder = f.conch(
        &[],
        &sh_c("lock ops/deploy --ttl 3s --kill-after 2s", &body),
    )?;
    let seen = f.wait_file("held", |t| t.ends_with('\n')).await?;
    let command = pid_in(&seen)?;
    ensure!(seen.contains(" ops/deploy exclusive "), "{seen:?}");

    f.client.delete_lock(NS, "ops/deploy").await?;
    holder.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    let err = holder.stderr();
    ensure!(
        err.contains("ops/deploy") && err.contains("dropped"),
        "conch says what happened: {err:?}"
    );
    wait_for("the command to be gone", SHOW_UP, || async {
        (!pid_alive(command)).then_some(())
    })
    .await?;
    let (code, _, err) = f
        .run(&["lock", "ops/deploy", "--nonblock", "--", "true"])
        .await?;
    ensure!(
        code == 0,
        "the lock is free after the holder stopped: {err:?}"
    );
    f.passed()
}

/// A lock lease revoked through the API stops the holder: its keep-alive learns the lease is
/// gone, conch stops the command and exits 79.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lock_lease_stops_the_holder_with_79() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let body = format!("{}; exec sleep 600", report("held"));
    let mut holder = f.conch(&[], &sh_c("lock q --ttl 3s --kill-after 2s", &body))?;
    let seen = f.wait_file("held", |t| t.ends_with('\n')).await?;
    let command = pid_in(&seen)?;
    let lease = seen
        .split_whitespace()
        .nth(4)
        .context("CONCH_LEASE in the report")?
        .to_string();
    ensure!(
        f.client
            .get_lease_of(conch_client::LeaseKind::Lock, NS, &lease)
            .await
            .is_ok(),
        "CONCH_LEASE names a lock lease: {seen:?}"
    );
    f.client
        .revoke_lease_of(conch_client::LeaseKind::Lock, NS, &lease)
        .await?;
    holder.expect_code(EX_SLOT_LOST, EXIT_TIMEOUT).await?;
    ensure!(
        holder.stderr().contains("lock lost while running"),
        "{:?}",
        holder.stderr()
    );
    wait_for("the command to be gone", SHOW_UP, || async {
        (!pid_alive(command)).then_some(())
    })
    .await?;
    f.passed()
}

/// A busy path refuses `--nonblock` naming the holder; a bad path is a usage error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonblock_on_a_held_path_and_bad_paths_are_refused() -> anyhow::Result<()> {
    let f = Fixture::start().await?;
    let mut a = f.conch(
        &[],
        &sh_c("lock p", &format!("{}; {}", report("a"), gate("go"))),
    )?;
    f.wait_file("a", |t| t.ends_with('\n')).await?;
    let (code, _, err) = f.run(&["lock", "p", "--nonblock", "--", "true"]).await?;
    ensure!(code == EX_NO_SLOT, "{code} {err:?}");
    ensure!(
        err.contains("lock p is busy") && err.contains(&format!("pid {}", a.pid())),
        "names the holder: {err:?}"
    );
    // Shared is refused too while an exclusive hold stands, and an ancestor exclusive as well.
    let (code, _, err) = f
        .run(&["lock", "p/q", "--shared", "-n", "--", "true"])
        .await?;
    ensure!(
        code == EX_NO_SLOT && err.contains("ancestor"),
        "{code} {err:?}"
    );
    f.touch("go")?;
    a.expect_code(0, EXIT_TIMEOUT).await?;
    let (code, _, err) = f.run(&["lock", "a//b", "--", "true"]).await?;
    ensure!(
        code == 64 && err.contains("empty segment"),
        "{code} {err:?}"
    );
    f.passed()
}

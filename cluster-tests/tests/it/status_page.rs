//! The status page (`conchd --ui-listen`) of a live 3-node cluster, read through a follower: its
//! JSON and HTML show the holders and the queue the cluster has; and in headless Chromium (the
//! Debian package `chromium`, which `scripts/install-test-deps.sh` installs) the page shows a
//! `conch sema` command's hold appear, move to the waiter when it ends, and go.
//!
//! The browser test keeps its screenshots under `target/status-page/` (`namespace.png`,
//! `overview.png`). Every process started here (nodes, `conch`, Chromium) runs in a process
//! group of its own and is killed on drop; every wait is a condition with a deadline.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use cluster_tests::proc::Proc;
use cluster_tests::{Cluster, binary, ops, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SHOW_UP: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A 3-node cluster whose every node serves the status page on a free loopback port.
async fn cluster() -> anyhow::Result<Cluster> {
    Cluster::start_with(3, &["--ui-listen", "127.0.0.1:0"]).await
}

/// Where node `id` serves the status page, from its startup line.
async fn ui_addr(cluster: &Cluster, id: u64) -> anyhow::Result<String> {
    wait_for(
        &format!("node {id} to print its status page address"),
        SHOW_UP,
        || async {
            let log = cluster.log(id);
            let line = log
                .lines()
                .rev()
                .find(|l| l.contains("status page on http://"))?;
            let rest = line.split("status page on http://").nth(1)?;
            rest.trim().strip_suffix("/ui/").map(str::to_string)
        },
    )
    .await
}

/// A follower of the elected leader.
async fn follower(cluster: &Cluster) -> anyhow::Result<u64> {
    let leader = cluster.wait_for_leader(SHOW_UP).await?;
    cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("a follower")
}

/// `GET path` at `addr` (HTTP/1.1), with `headers`: the status code and the body.
async fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<(u16, String)> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .context("GET timed out")?
        .with_context(|| format!("GET {addr}{path}"))?;
    let text = String::from_utf8(response).context("the response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("no end of HTTP headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

async fn get_json(addr: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let (status, body) = get(addr, path, &[]).await?;
    ensure!(status == 200, "GET {path}: {status} {body}");
    serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_the_holders_as_json_and_html() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let id = follower(&cluster).await?;
    let addr = ui_addr(&cluster, id).await?;

    // A holder and a waiter, written through the follower.
    let mut c = cluster.grackle(id).await?;
    ops::namespace(&mut c, "web").await?;
    ops::semaphore(&mut c, "web", "db", 1).await?;
    let holder = ops::lease(&mut c, "web", 60).await?;
    let waiter = ops::lease(&mut c, "web", 60).await?;
    ensure!(ops::acquired(
        &ops::acquire(&mut c, "web", "db", &holder, 1, 0).await?
    ));
    let mut queued = cluster.grackle(id).await?;
    let wait_lease = waiter.clone();
    let waiting =
        tokio::spawn(
            async move { ops::acquire(&mut queued, "web", "db", &wait_lease, 1, 60).await },
        );

    // The follower's page shows both as soon as the write is applied: its reads go through the
    // leader's read index.
    let page = wait_for("the waiter in the follower's JSON", SHOW_UP, || async {
        let page = get_json(&addr, "/ui/api/ns/web").await.ok()?;
        let sem = &page["semaphores"]["items"][0];
        (sem["queue"]["items"][0]["lease_id"] == waiter.as_str()).then_some(page)
    })
    .await?;
    let sem = &page["semaphores"]["items"][0];
    assert_eq!(sem["name"], "db");
    assert_eq!(sem["permits"], 1);
    assert_eq!(sem["holders"]["items"][0]["lease_id"], holder.as_str());
    assert!(sem["holders"]["items"][0]["fencing_token"].as_u64() > Some(0));
    assert_eq!(sem["queue"]["items"][0]["position"], 0);

    let overview = get_json(&addr, "/ui/api/").await?;
    let members = overview["cluster"]["members"]
        .as_array()
        .context("members")?;
    assert_eq!(members.len(), 3, "{overview}");
    let leader = cluster.leader().await.context("a leader")?;
    assert_eq!(overview["cluster"]["leader_id"], leader);
    // Where a client reaches the leader: its client address, the one `conch-leader` names.
    assert_eq!(
        overview["cluster"]["leader_addr"],
        cluster.addr(leader).as_str(),
        "{overview}"
    );
    assert_eq!(overview["cluster"]["node_id"], id);
    assert_eq!(
        overview["cluster"]["lag_known"], false,
        "a follower knows no lag"
    );
    assert_eq!(overview["namespaces"]["items"][0]["name"], "web");
    assert_eq!(overview["namespaces"]["items"][0]["holders"], 1);

    let (status, html) = get(&addr, "/ui/ns/web", &[]).await?;
    assert_eq!(status, 200, "{html}");
    assert!(
        html.contains("id=\"plaintext\""),
        "no TLS: the page says so"
    );
    assert!(html.contains("1/1 permits held"), "{html}");
    assert!(html.contains(&format!("<code>{holder}</code>")), "{html}");
    assert!(html.contains(&format!("<code>{waiter}</code>")), "{html}");
    let (status, part) = get(&addr, "/ui/part/ns/web", &[]).await?;
    assert_eq!(status, 200);
    assert!(!part.contains("<html"), "a part is the main part alone");
    assert!(part.contains(&format!("<code>{holder}</code>")));

    // The leader's overview knows every member's lag.
    let leader_addr = ui_addr(&cluster, leader).await?;
    let on_leader = get_json(&leader_addr, "/ui/api/").await?;
    assert_eq!(on_leader["cluster"]["lag_known"], true);
    assert!(
        on_leader["cluster"]["members"]
            .as_array()
            .is_some_and(|m| m.iter().all(|m| m["lag"].is_u64())),
        "{on_leader}"
    );

    let (status, body) = get(&addr, "/ui/api/ns/absent", &[]).await?;
    assert_eq!(status, 404, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(error["error"]["code"], "NOT_FOUND");

    ops::release(&mut c, "web", "db", &holder).await?;
    ensure!(ops::acquired(&waiting.await??), "the waiter was granted");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_access_control_the_page_needs_a_known_token() -> anyhow::Result<()> {
    let (secrets, mut args) = cluster_tests::auth::bootstrap_args()?;
    args.extend(["--ui-listen".to_string(), "127.0.0.1:0".to_string()]);
    let cluster = Cluster::launch(3, &args, false).await?;
    cluster_tests::auth::wait_until_on(&cluster, SHOW_UP).await?;
    let token = std::fs::read_to_string(secrets.path().join("admin.token"))?;
    let id = follower(&cluster).await?;
    let addr = ui_addr(&cluster, id).await?;
    // This process's channels send the admin token.
    let mut c = cluster.grackle(id).await?;
    ops::namespace(&mut c, "web").await?;

    let (status, body) = get(&addr, "/ui/api/", &[]).await?;
    assert_eq!(status, 401, "{body}");
    assert!(
        !body.contains("web"),
        "nothing is shown without a token: {body}"
    );
    let (status, body) = get(&addr, "/ui/api/ns/web", &[("Authorization", "Bearer nope")]).await?;
    assert_eq!(status, 401, "an unknown token: {body}");
    // The page itself loads, asking for a token.
    let (status, html) = get(&addr, "/ui/", &[]).await?;
    assert_eq!(status, 200);
    assert!(html.contains("id=\"token-form\""), "{html}");
    assert!(!html.contains("/ui/ns/web"), "{html}");

    let bearer = format!("Bearer {}", token.trim());
    let (status, body) = get(&addr, "/ui/api/", &[("Authorization", &bearer)]).await?;
    assert_eq!(status, 200, "{body}");
    let overview: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(overview["access_control"], true);
    assert_eq!(overview["namespaces"]["items"][0]["name"], "web");
    let (status, part) = get(&addr, "/ui/part/ns/web", &[("Authorization", &bearer)]).await?;
    assert_eq!(status, 200, "{part}");
    assert!(part.contains("Namespace web"), "{part}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// In a browser
// ---------------------------------------------------------------------------------------------

/// Headless Chromium runs, each in a process group of its own with a profile of its own.
struct Browser {
    dir: tempfile::TempDir,
    runs: usize,
}

impl Browser {
    fn new() -> anyhow::Result<Browser> {
        let found = Command::new("chromium")
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            bail!(
                "chromium is not installed: run scripts/install-test-deps.sh (Debian package \
                 'chromium')"
            );
        }
        Ok(Browser {
            dir: tempfile::Builder::new()
                .prefix("conch-browser-")
                .tempdir()?,
            runs: 0,
        })
    }

    /// Runs Chromium headless on `url` with `args`, to the end; its stdout.
    async fn run(&mut self, url: &str, args: &[&str]) -> anyhow::Result<String> {
        self.runs += 1;
        let n = self.runs;
        let profile = self.dir.path().join(format!("profile{n}"));
        let mut command = Command::new("chromium");
        command
            .args([
                "--headless",
                // Root has no user namespace sandbox here; the page is our own.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1400,1000",
                // Lets the page's script run its refreshes (virtual time stops while a fetch
                // is in flight).
                "--virtual-time-budget=5000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .arg(url);
        let out = self.dir.path().join(format!("run{n}.out"));
        let err = self.dir.path().join(format!("run{n}.err"));
        let mut proc = Proc::spawn(command, format!("chromium {url}"), out, err)?;
        let status = proc.wait(EXIT_TIMEOUT).await?;
        ensure!(
            status.success(),
            "chromium exited {status}: {}",
            proc.stderr()
        );
        Ok(proc.stdout())
    }

    /// The page's DOM once its script ran.
    async fn dom(&mut self, url: &str) -> anyhow::Result<String> {
        self.run(url, &["--dump-dom"]).await
    }

    async fn screenshot(&mut self, url: &str, path: &Path) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(path);
        self.run(url, &[&format!("--screenshot={}", path.display())])
            .await?;
        ensure!(
            std::fs::metadata(path).is_ok_and(|m| m.len() > 0),
            "no screenshot at {}",
            path.display()
        );
        Ok(())
    }
}

/// The workspace's target directory (this test runs from `target/<profile>/deps`).
fn artifacts() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let target = exe
        .ancestors()
        .nth(3)
        .context("the test binary lies in target/<profile>/deps")?;
    let dir = target.join("status-page");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The text of the `<main>` element of `dom`, once the script refreshed it at least once.
fn refreshed_main(dom: &str) -> Option<&str> {
    let start = dom.find("<main id=\"main\"")?;
    let main = &dom[start..];
    let head = &main[..main.find('>')?];
    if !head.contains("data-refreshed=\"") {
        return None;
    }
    Some(&main[..main.find("</main>")?])
}

/// Loads `url` in the browser until its refreshed main part satisfies `holds`.
async fn wait_dom(
    browser: &mut Browser,
    url: &str,
    what: &str,
    holds: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + SHOW_UP;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        let dom = browser.dom(url).await?;
        if refreshed_main(&dom).is_some_and(&holds) {
            return Ok(());
        }
        last = dom;
    }
    bail!("the page never showed {what}; last DOM: {last}")
}

/// The rows of table class `class` (holder or waiter) that show process id `pid`.
fn rows_with_pid(main: &str, class: &str, pid: i32) -> usize {
    main.split(&format!("<tr class=\"{class}\">"))
        .skip(1)
        .filter(|row| {
            let row = &row[..row.find("</tr>").unwrap_or(row.len())];
            row.contains(&format!("<td class=\"pid\">{pid}</td>"))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_a_browser_follows_a_conch_sema_command() -> anyhow::Result<()> {
    let mut browser = Browser::new()?;
    let cluster = cluster().await?;
    let id = follower(&cluster).await?;
    let addr = ui_addr(&cluster, id).await?;
    let scratch = tempfile::Builder::new().prefix("conch-ui-").tempdir()?;
    let conch = |n: usize, gate: &str| -> anyhow::Result<Proc> {
        let mut command = Command::new(binary("conch"));
        // Holds until the test creates its gate file.
        let hold = format!(
            "while [ ! -e {gate} ]; do sleep 0.05; done",
            gate = scratch.path().join(gate).display()
        );
        command
            .args(["sema", "deploy", "--max", "1", "--", "sh", "-c", &hold])
            .env("CONCH_ENDPOINTS", cluster.endpoints().join(","))
            .env_remove("CONCH_LOG");
        Proc::spawn(
            command,
            format!("conch sema #{n}"),
            scratch.path().join(format!("conch{n}.out")),
            scratch.path().join(format!("conch{n}.err")),
        )
    };
    // The page of the namespace `conch sema` uses, once the first command made its semaphore.
    let url = format!("http://{addr}/ui/ns/conch");

    let mut first = conch(1, "first.done")?;
    let first_pid = first.pid();
    wait_dom(&mut browser, &url, "the first command holding", |main| {
        rows_with_pid(main, "holder", first_pid) == 1
    })
    .await?;

    let mut second = conch(2, "second.done")?;
    let second_pid = second.pid();
    wait_dom(
        &mut browser,
        &url,
        "the second command waiting behind the first",
        |main| {
            rows_with_pid(main, "holder", first_pid) == 1
                && rows_with_pid(main, "waiter", second_pid) == 1
        },
    )
    .await?;
    let shots = artifacts()?;
    browser
        .screenshot(&url, &shots.join("namespace.png"))
        .await?;
    browser
        .screenshot(&format!("http://{addr}/ui/"), &shots.join("overview.png"))
        .await?;

    // The first ends: the hold moves to the second.
    std::fs::write(scratch.path().join("first.done"), b"")?;
    first.expect_code(0, EXIT_TIMEOUT).await?;
    wait_dom(
        &mut browser,
        &url,
        "the hold moving to the second command",
        |main| {
            rows_with_pid(main, "holder", second_pid) == 1
                && rows_with_pid(main, "holder", first_pid) == 0
                && !main.contains("<tr class=\"waiter\">")
        },
    )
    .await?;

    // The second ends: nobody holds.
    std::fs::write(scratch.path().join("second.done"), b"")?;
    second.expect_code(0, EXIT_TIMEOUT).await?;
    wait_dom(&mut browser, &url, "nobody holding", |main| {
        main.contains("Nobody holds it.") && !main.contains("<tr class=\"holder\">")
    })
    .await?;
    eprintln!("screenshots in {}", shots.display());
    Ok(())
}

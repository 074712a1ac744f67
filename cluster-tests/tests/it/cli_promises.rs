//! What the `conch` CLI promises a newcomer, tried as one would, against real conchd processes:
//! exit codes that name one cause each (a quota is not "busy", a TLS mistake is a configuration
//! error, a retried job report to a finished group is fine, an empty `CONCH_TOKEN_FILE=` is
//! unset), health that does not page for a refused caller, flags that keep their word
//! (`--max-hold`, `--wait` without a quorum, `--weight` on one semaphore, a mistyped `--max`
//! said out loud), list and delete of everything, and the HTTP probes of the metrics listener.
//!
//! Every process started here is killed on drop; every wait is a condition with a deadline.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, ensure};
use cluster_tests::daemon::Daemon;
use cluster_tests::pki::Pki;
use cluster_tests::proc::Proc;
use cluster_tests::sockets::Port;
use cluster_tests::{Cluster, binary, run_conch, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const EX_USAGE: i32 = 64;
const EX_REFUSED: i32 = 65;
const EX_UNAVAILABLE: i32 = 69;
const EX_NO_SLOT: i32 = 75;
const EX_CONFIG: i32 = 78;
const EX_HOLD_LIMIT: i32 = 80;
const EX_QUOTA: i32 = 82;
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const SHOW_UP: Duration = Duration::from_secs(30);

/// `conch args…` in the background, in `dir`, its output in files there; killed on drop.
fn conch_bg(dir: &Path, endpoints: &str, name: &str, args: &[&str]) -> anyhow::Result<Proc> {
    let mut command = std::process::Command::new(binary("conch"));
    command
        .args(args)
        .current_dir(dir)
        .env("CONCH_ENDPOINTS", endpoints)
        .env("T", dir)
        .env_remove("CONCH_TOKEN")
        .env_remove("CONCH_TOKEN_FILE");
    Proc::spawn(
        command,
        format!("conch {name}"),
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    )
}

async fn file_appears(path: &Path) -> anyhow::Result<String> {
    wait_for(
        &format!("{} to appear", path.display()),
        SHOW_UP,
        || async {
            std::fs::read_to_string(path)
                .ok()
                .filter(|s| s.ends_with('\n'))
        },
    )
    .await
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_name_one_cause_each() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    let ep = cluster.endpoints().join(",");
    let conch = |args: &'static [&'static str]| {
        let ep = ep.clone();
        async move { run_conch(&ep, args, &[]).await }
    };

    // A full quota is its own code, not 75 ("busy"): waiting does not help.
    let (code, _, err) = conch(&["namespace", "create", "q"]).await?;
    ensure!(code == 0, "{err}");
    let (code, _, err) = conch(&["namespace", "quota", "q", "--semaphores", "1"]).await?;
    ensure!(code == 0, "{err}");
    let (code, _, err) =
        conch(&["sema", "a", "--namespace", "q", "--max", "1", "--", "true"]).await?;
    ensure!(code == 0, "{err}");
    let (code, _, err) = conch(&[
        "sema",
        "b",
        "--namespace",
        "q",
        "--max",
        "1",
        "--nonblock",
        "--",
        "true",
    ])
    .await?;
    ensure!(
        code == EX_QUOTA,
        "a full quota exits {EX_QUOTA}: {code} {err}"
    );
    ensure!(err.contains("quota"), "names the quota: {err}");

    // Reporting a job again is a safe retry, also once the group completed.
    let (code, _, err) = conch(&[
        "wait-group",
        "create",
        "g",
        "--jobs",
        "1",
        "--expires-in",
        "1h",
    ])
    .await?;
    ensure!(code == 0, "{err}");
    let (code, out, err) = conch(&["wait-group", "done", "g", "j1"]).await?;
    ensure!(code == 0 && out.contains("completed"), "{code} {out} {err}");
    let (code, out, err) = conch(&["wait-group", "done", "g", "j1"]).await?;
    ensure!(
        code == 0 && out.contains("completed  1/1 jobs"),
        "the retry exits 0 and shows the group: {code} {out} {err}"
    );
    // A job the completed group never counted is refused.
    let (code, _, err) = conch(&["wait-group", "done", "g", "j2"]).await?;
    ensure!(
        code == EX_USAGE,
        "a new job for a finished group: {code} {err}"
    );
    // The shortest expiry Grackle allows is a minute.
    let (code, _, err) = conch(&[
        "wait-group",
        "create",
        "h",
        "--jobs",
        "1",
        "--expires-in",
        "30s",
    ])
    .await?;
    ensure!(code == EX_USAGE && err.contains("1m"), "{code} {err}");

    // An empty CONCH_TOKEN_FILE is unset.
    let (code, _, err) = run_conch(
        &ep,
        &["sema", "t", "--max", "1", "--", "true"],
        &[("CONCH_TOKEN_FILE", ""), ("CONCH_TOKEN", "")],
    )
    .await?;
    ensure!(code == 0, "CONCH_TOKEN_FILE= is unset: {code} {err}");

    // The command must follow `--`: the error says so.
    let (code, _, err) = conch(&["sema", "x", "--max", "1", "echo", "hi"]).await?;
    ensure!(code == EX_USAGE, "{code} {err}");
    ensure!(err.contains("goes after `--`"), "suggests --: {err}");
    ensure!(err.trim_end().lines().count() == 1, "one line: {err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mistakes_exit_78_and_a_refused_caller_is_no_outage() -> anyhow::Result<()> {
    let cluster = Cluster::start_opts(3, &[], true).await?;
    cluster.wait_for_leader(SHOW_UP).await?;
    let pki = cluster.pki.clone().context("a TLS cluster has a PKI")?;
    let dir = tempfile::tempdir()?;
    let other = Pki::create(&dir.path().join("other"))?;
    let ep = cluster.endpoints().join(",");
    let ca = pki.ca_cert().display().to_string();
    let (cert, key) = pki.client("ops")?;
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let good = [
        ("CONCH_CACERT", ca.as_str()),
        ("CONCH_CERT", cert.as_str()),
        ("CONCH_KEY", key.as_str()),
    ];
    let (code, out, err) = run_conch(&ep, &["cluster", "health"], &good).await?;
    ensure!(
        code == 0,
        "healthy with the right settings: {code} {out} {err}"
    );

    // The nodes' certificates checked against another CA.
    let other_ca = other.ca_cert().display().to_string();
    let (code, _, err) = run_conch(
        &ep,
        &["sema", "x", "--max", "1", "--", "true"],
        &[
            ("CONCH_CACERT", other_ca.as_str()),
            ("CONCH_CERT", cert.as_str()),
            ("CONCH_KEY", key.as_str()),
        ],
    )
    .await?;
    ensure!(code == EX_CONFIG, "another CA: {code} {err}");
    ensure!(err.contains("--cacert"), "says which setting: {err}");

    // An unusable CA file, and a certificate without a CA.
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello\n")?;
    let garbage = garbage.display().to_string();
    let (code, _, err) = run_conch(
        &ep,
        &["cluster", "health"],
        &[("CONCH_CACERT", garbage.as_str())],
    )
    .await?;
    ensure!(code == EX_CONFIG, "a garbage --cacert: {code} {err}");
    let (code, _, err) = run_conch(
        &ep,
        &["cluster", "health"],
        &[("CONCH_CERT", cert.as_str()), ("CONCH_KEY", key.as_str())],
    )
    .await?;
    ensure!(code == EX_CONFIG, "--cert without --cacert: {code} {err}");

    // A client certificate of another CA: health says the caller was refused, not that the
    // cluster is down (a monitoring check with a bad credential must not page).
    let (other_cert, other_key) = other.client("ops")?;
    let (other_cert, other_key) = (
        other_cert.display().to_string(),
        other_key.display().to_string(),
    );
    let (code, out, err) = run_conch(
        &ep,
        &["cluster", "health"],
        &[
            ("CONCH_CACERT", ca.as_str()),
            ("CONCH_CERT", other_cert.as_str()),
            ("CONCH_KEY", other_key.as_str()),
        ],
    )
    .await?;
    ensure!(
        code == EX_CONFIG,
        "a client certificate of another CA: {code} {out} {err}"
    );
    ensure!(
        err.contains("refused") && !out.contains("unhealthy"),
        "the caller was refused: {out} {err}"
    );

    // A revoked client certificate, once the nodes have the new revocation list.
    let revoked = run_conch(
        &ep,
        &[
            "certs",
            "revoke",
            "client",
            "ops",
            "--dir",
            &pki.ca_cert()
                .parent()
                .context("the PKI directory")?
                .display()
                .to_string(),
        ],
        &[],
    )
    .await?;
    ensure!(revoked.0 == 0, "revoke: {revoked:?}");
    for id in cluster.ids() {
        cluster.signal(id, nix::sys::signal::Signal::SIGHUP);
    }
    // While the nodes read the new list one after another, those that have not yet read it
    // may still show a quorum (healthy, or degraded with the others unreachable); once they
    // cannot, the caller's refusal is the answer, never an outage.
    let (code, out, err) = wait_for("the revoked certificate refused", SHOW_UP, || async {
        let said = run_conch(&ep, &["cluster", "health"], &good).await.ok()?;
        (said.0 != 0 && said.0 != 1).then_some(said)
    })
    .await?;
    ensure!(
        code == EX_CONFIG,
        "a revoked client certificate: {code} {out} {err}"
    );
    ensure!(
        err.contains("refused") && !out.contains("unhealthy"),
        "the caller was refused: {out} {err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_keep_their_word() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(SHOW_UP).await?;
    let dir = tempfile::tempdir()?;
    let t = dir.path();
    let ep = cluster.endpoints().join(",");

    // --weight on one semaphore: 2 of 3 permits taken; another 2 do not fit, 1 does.
    let mut weighted = conch_bg(
        t,
        &ep,
        "weighted",
        &[
            "sema",
            "w",
            "--max",
            "3",
            "--weight",
            "2",
            "--",
            "sh",
            "-c",
            "echo $$ > \"$T/w.ready\"; while [ ! -e \"$T/w.go\" ]; do sleep 0.05; done",
        ],
    )?;
    file_appears(&t.join("w.ready")).await?;
    let (code, out, err) =
        run_conch(&ep, &["sema", "w", "--max", "3", "--who", "--json"], &[]).await?;
    ensure!(code == 0, "someone holds: {code} {err}");
    let who: serde_json::Value = serde_json::from_str(&out).context(out.clone())?;
    ensure!(who["holders"][0]["weight"] == 2, "weight 2: {out}");
    let (code, _, err) = run_conch(
        &ep,
        &[
            "sema",
            "w",
            "--max",
            "3",
            "--weight",
            "2",
            "--nonblock",
            "--",
            "true",
        ],
        &[],
    )
    .await?;
    ensure!(code == EX_NO_SLOT, "2 more do not fit: {code} {err}");
    let (code, _, err) = run_conch(
        &ep,
        &["sema", "w", "--max", "3", "--nonblock", "--", "true"],
        &[],
    )
    .await?;
    ensure!(code == 0, "1 more fits: {code} {err}");

    // A mistyped --max is said out loud (and still runs: another semaphore on purpose).
    let (code, _, err) = run_conch(&ep, &["sema", "w", "--max", "1", "--", "true"], &[]).await?;
    ensure!(code == 0, "{code} {err}");
    ensure!(
        err.contains("w is also in use with --max 3 (1 holding, 0 waiting)"),
        "the warning names the other capacity: {err}"
    );
    std::fs::write(t.join("w.go"), b"")?;
    weighted.expect_code(0, EXIT_TIMEOUT).await?;

    // --max-hold 10s: the command gets at least 90% of it, then SIGTERM, exit 80. (Counted from
    // before conch started: the hold is counted from the grant, the command starts after it.)
    let started = now_ms();
    let mut held = conch_bg(
        t,
        &ep,
        "held",
        &[
            "sema",
            "h",
            "--max",
            "1",
            "--max-hold",
            "10s",
            "--",
            "sh",
            "-c",
            "trap 'echo $(date +%s%3N) > \"$T/h.term\"; exit 3' TERM; date +%s%3N > \"$T/h.start\"; while :; do sleep 0.05; done",
        ],
    )?;
    held.expect_code(EX_HOLD_LIMIT, EXIT_TIMEOUT).await?;
    let start: u128 = file_appears(&t.join("h.start")).await?.trim().parse()?;
    let term: u128 = file_appears(&t.join("h.term")).await?.trim().parse()?;
    ensure!(start >= started, "clock sanity");
    ensure!(
        term >= started + 9_000,
        "SIGTERM came {} ms after conch started, {} ms after the command did, of a 10 s hold; \
         stderr: {}",
        term.saturating_sub(started),
        term.saturating_sub(start),
        held.stderr()
    );

    // --wait bounds the wall time without a quorum: the answer names --wait, not the request
    // timeout (60 s here) that would otherwise run out first.
    let survivor = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("a follower")?;
    for id in cluster.ids() {
        if id != survivor {
            cluster.kill(id);
        }
    }
    let (code, _, err) = run_conch(
        &cluster.addr(survivor),
        &[
            "--timeout",
            "50s",
            "sema",
            "nq",
            "--max",
            "1",
            "--wait",
            "2s",
            "--",
            "true",
        ],
        &[],
    )
    .await?;
    ensure!(
        code == EX_UNAVAILABLE,
        "no quorum within --wait: {code} {err}"
    );
    ensure!(err.contains("within --wait 2s"), "names --wait: {err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_lists_and_deletes() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    let dir = tempfile::tempdir()?;
    let t = dir.path();
    let ep = cluster.endpoints().join(",");
    let conch = |args: Vec<&str>| {
        let ep = ep.clone();
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_conch(&ep, &args, &[]).await
        }
    };
    let json = |out: &str| -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(out).with_context(|| out.to_string())
    };

    // One of each, a lock held while it is listed.
    let mut lock = conch_bg(
        t,
        &ep,
        "lock",
        &[
            "lock",
            "db/orders",
            "--",
            "sh",
            "-c",
            "echo $$ > \"$T/l.ready\"; while [ ! -e \"$T/l.go\" ]; do sleep 0.05; done",
        ],
    )?;
    file_appears(&t.join("l.ready")).await?;
    for args in [
        vec!["sema", "s", "--max", "2", "--", "true"],
        vec!["wait-group", "create", "g", "--jobs", "2"],
        vec!["barrier", "create", "b", "--parties", "2"],
        vec!["namespace", "create", "team-a"],
    ] {
        let (code, _, err) = conch(args.clone()).await?;
        ensure!(code == 0, "{args:?}: {code} {err}");
    }

    let (code, out, err) = conch(vec!["list", "semaphores", "--json"]).await?;
    ensure!(code == 0, "{err}");
    let v = json(&out)?;
    ensure!(
        v.as_array()
            .is_some_and(|a| a.iter().any(|s| s["name"] == "s.2" && s["permits"] == 2)),
        "{out}"
    );
    let (code, out, _) = conch(vec!["list", "semaphores"]).await?;
    ensure!(
        code == 0 && out.starts_with("SEMAPHORE") && out.contains("s.2"),
        "{out}"
    );
    let (code, out, _) = conch(vec!["list", "locks", "--json"]).await?;
    let v = json(&out)?;
    ensure!(
        code == 0
            && v[0]["path"] == "db/orders"
            && v[0]["state"] == "exclusive"
            && v[0]["holders"] == 1,
        "{out}"
    );
    let (code, out, _) = conch(vec!["list", "wait-groups", "--json"]).await?;
    let v = json(&out)?;
    ensure!(
        code == 0 && v[0]["name"] == "g" && v[0]["counter"] == 2,
        "{out}"
    );
    let (code, out, _) = conch(vec!["list", "barriers", "--json"]).await?;
    let v = json(&out)?;
    ensure!(
        code == 0 && v[0]["name"] == "b" && v[0]["expected"] == 2,
        "{out}"
    );
    let (code, out, _) = conch(vec!["list", "namespaces", "--json"]).await?;
    let v = json(&out)?;
    ensure!(
        code == 0
            && v.as_array()
                .is_some_and(|a| a.iter().any(|n| n["name"] == "team-a")),
        "{out}"
    );

    // barrier status, as wait-group status has it.
    let (code, out, err) = conch(vec!["barrier", "status", "b", "--json"]).await?;
    ensure!(code == 0, "{err}");
    let v = json(&out)?;
    ensure!(v["expected"] == 2 && v["generation"] == 1, "{out}");

    // Delete each; the held lock's holder loses it (exit 79); a second delete is refused.
    for (args, said) in [
        (
            vec!["delete", "semaphore", "s", "--max", "2"],
            "deleted semaphore conch/s.2",
        ),
        (
            vec!["delete", "lock", "db/orders"],
            "deleted lock conch/db/orders",
        ),
        (
            vec!["delete", "wait-group", "g"],
            "deleted wait group conch/g",
        ),
        (vec!["delete", "barrier", "b"], "deleted barrier conch/b"),
        (
            vec!["delete", "namespace", "team-a"],
            "deleted namespace team-a",
        ),
    ] {
        let (code, out, err) = conch(args.clone()).await?;
        ensure!(
            code == 0 && out.contains(said),
            "{args:?}: {code} {out} {err}"
        );
    }
    lock.expect_code(79, EXIT_TIMEOUT).await?;
    for args in [
        vec!["delete", "semaphore", "s.2"],
        vec!["delete", "wait-group", "g"],
        vec!["delete", "barrier", "b"],
        vec!["delete", "namespace", "team-a"],
    ] {
        let (code, _, err) = conch(args.clone()).await?;
        ensure!(
            code == EX_REFUSED && err.contains("does not exist"),
            "{args:?} again: {code} {err}"
        );
    }
    let (code, out, _) = conch(vec!["list", "semaphores", "--json"]).await?;
    ensure!(
        code == 0
            && json(&out)?
                .as_array()
                .is_some_and(|a| a.iter().all(|s| s["name"] != "s.2")),
        "{out}"
    );
    Ok(())
}

/// `GET path` (HTTP/1.1) at `addr`: the status code and body.
async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .context("GET timed out")??;
    let text = String::from_utf8(response)?;
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// Three nodes started with conchd's own log filter: `/healthz` and `/readyz` on the metrics
/// listener answer as documented, and a clean start logs no warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_answer_and_a_clean_start_warns_of_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let clients = Port::bind_many(3)?;
    let metrics = Port::bind_many(3)?;
    let client_addrs: Vec<String> = clients.iter().map(|p| p.addr().to_string()).collect();
    let metrics_addrs: Vec<String> = metrics.iter().map(|p| p.addr().to_string()).collect();
    let members = client_addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes = Vec::new();
    for (i, (client, metric)) in clients.into_iter().zip(metrics).enumerate() {
        let id = (i + 1).to_string();
        let data = dir.path().join(format!("node{id}"));
        let data = data.display().to_string();
        nodes.push(Daemon::spawn_with(
            &[
                "--id",
                &id,
                "--data-dir",
                &data,
                "--initial-cluster",
                &members,
            ],
            dir.path(),
            &[],
            vec![("client", client), ("metrics", metric)],
        )?);
    }

    // Alive at once, ready once a leader is known and the log applied.
    let (status, body) = wait_for("node 1's /healthz", SHOW_UP, || async {
        http_get(&metrics_addrs[0], "/healthz").await.ok()
    })
    .await?;
    ensure!(status == 200 && body == "ok\n", "{status} {body:?}");
    for addr in &metrics_addrs {
        wait_for(&format!("{addr}/readyz 200"), SHOW_UP, || async {
            http_get(addr, "/readyz")
                .await
                .ok()
                .filter(|(s, _)| *s == 200)
        })
        .await?;
    }
    let (status, body) = http_get(&metrics_addrs[0], "/readyz").await?;
    ensure!(status == 200 && body == "ready\n", "{status} {body:?}");

    // A clean start, with the default log filter, said nothing at WARN.
    for node in &nodes {
        let log = node.stderr();
        let warned: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
        ensure!(warned.is_empty(), "warnings on a clean start: {warned:#?}");
    }

    // Node 1 alone: still alive, no longer ready, saying why.
    nodes.truncate(1);
    let (status, body) = wait_for("node 1's /readyz 503", SHOW_UP, || async {
        http_get(&metrics_addrs[0], "/readyz")
            .await
            .ok()
            .filter(|(s, _)| *s == 503)
    })
    .await?;
    ensure!(status == 503 && body.starts_with("not ready: "), "{body:?}");
    let (status, _) = http_get(&metrics_addrs[0], "/healthz").await?;
    ensure!(status == 200, "alive without a quorum");
    let (status, _) = http_get(&metrics_addrs[0], "/nosuch").await?;
    ensure!(status == 404);
    drop(client_addrs);
    Ok(())
}

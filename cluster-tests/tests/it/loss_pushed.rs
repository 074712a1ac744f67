//! Losses pushed to the holder (`conch.v1` `WatchLoss`) against a real 3-node cluster: the
//! call itself through a follower (the `watching` message, `NOT_FOUND` for a lease already
//! gone, one `lost` message per cause), and `conch sema` stopping its command the moment its
//! lease is revoked, with the cause on stderr and the slot handed to the next waiter, also
//! after the node serving the stream was killed or shut down.
//!
//! Nothing here depends on timing: the leases live 30 s or more (their refreshes are not what
//! tells), and every wait is on a condition with a deadline. Every process is killed on drop.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use cluster_tests::proc::{Proc, group_alive};
use cluster_tests::scrape::scrape;
use cluster_tests::{Cluster, binary, ops, wait_for};
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::conch::watch_loss_response::Message;
use conch_proto::conch::{
    LeaseWatching, LossCause, LossEvent, WatchLossRequest, WatchLossResponse, WatchedLeaseKind,
};
use conch_proto::grackle as pb;
use nix::sys::signal::Signal;
use tonic::Streaming;

const WAIT: Duration = Duration::from_secs(30);
const EX_SLOT_LOST: i32 = 79;
const NS: &str = "jobs";

async fn watch(
    cluster: &Cluster,
    node: u64,
    lease: &str,
    kind: WatchedLeaseKind,
) -> Result<Streaming<WatchLossResponse>, tonic::Status> {
    let channel = cluster_tests::channel(&cluster.addr(node))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let r = ConchApiClient::new(channel)
        .watch_loss(WatchLossRequest {
            namespace_name: NS.into(),
            lease_id: lease.into(),
            kind: kind.into(),
        })
        .await?;
    Ok(r.into_inner())
}

async fn next(stream: &mut Streaming<WatchLossResponse>) -> anyhow::Result<Option<Message>> {
    let m = tokio::time::timeout(WAIT, stream.message())
        .await
        .context("no message in time")??;
    Ok(m.and_then(|m| m.message))
}

async fn watching(stream: &mut Streaming<WatchLossResponse>) -> anyhow::Result<LeaseWatching> {
    match next(stream).await? {
        Some(Message::Watching(w)) => Ok(w),
        other => bail!("expected the watching message, got {other:?}"),
    }
}

/// The `lost` message, then the end of the stream.
async fn lost(stream: &mut Streaming<WatchLossResponse>) -> anyhow::Result<LossEvent> {
    let event = match next(stream).await? {
        Some(Message::Lost(e)) => e,
        other => bail!("expected a lost message, got {other:?}"),
    };
    ensure!(next(stream).await?.is_none(), "the stream ends after it");
    Ok(event)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cause_is_pushed_through_a_follower() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(WAIT).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("no follower")?;
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, NS).await?;
    for sem in ["db", "gone", "short"] {
        ops::semaphore(&mut c, NS, sem, 1).await?;
    }
    let sem_kind = WatchedLeaseKind::Semaphore;

    // Revoked: the follower says what the lease holds, then the loss.
    let a = ops::lease(&mut c, NS, 60).await?;
    let got = ops::acquire(&mut c, NS, "db", &a, 1, 0).await?;
    ensure!(ops::acquired(&got), "{got:?}");
    let mut s = watch(&cluster, follower, &a, sem_kind).await?;
    let w = watching(&mut s).await?;
    ensure!(w.node_id == follower, "{w:?}");
    ensure!(
        w.holds.len() == 1 && w.holds[0].semaphore_name == "db",
        "{w:?}"
    );
    ensure!(
        w.holds[0].fencing_token > 0 && w.holds[0].weight == 1,
        "{w:?}"
    );
    // The wrong kind, or a lease that is not there, is NOT_FOUND at once.
    let e = watch(&cluster, follower, &a, WatchedLeaseKind::Lock)
        .await
        .err()
        .context("a semaphore lease watched as a lock lease")?;
    ensure!(e.code() == tonic::Code::NotFound, "{e:?}");
    c.revoke_semaphore_lease(pb::RevokeSemaphoreLeaseRequest {
        namespace_name: NS.into(),
        lease_id: a.clone(),
    })
    .await?;
    let e = lost(&mut s).await?;
    ensure!(e.cause() == LossCause::Revoked, "{e:?}");
    ensure!(
        e.semaphore_name.is_empty() && e.lock_name.is_empty(),
        "{e:?}"
    );
    ensure!(
        e.reason.contains(&a) && e.reason.contains("revoked"),
        "{e:?}"
    );
    let e = watch(&cluster, follower, &a, sem_kind)
        .await
        .err()
        .context("a revoked lease")?;
    ensure!(e.code() == tonic::Code::NotFound, "{e:?}");

    // The semaphore deleted under its holder.
    let b = ops::lease(&mut c, NS, 60).await?;
    ensure!(ops::acquired(
        &ops::acquire(&mut c, NS, "gone", &b, 1, 0).await?
    ));
    let mut s = watch(&cluster, follower, &b, sem_kind).await?;
    watching(&mut s).await?;
    c.delete_semaphore(pb::DeleteSemaphoreRequest {
        namespace_name: NS.into(),
        semaphore_name: "gone".into(),
    })
    .await?;
    let e = lost(&mut s).await?;
    ensure!(e.cause() == LossCause::SemaphoreDeleted, "{e:?}");
    ensure!(e.semaphore_name == "gone", "{e:?}");

    // A hold limit ends the hold while the lease lives on.
    let d = ops::lease(&mut c, NS, 60).await?;
    let got = c
        .acquire_semaphore(pb::AcquireSemaphoreRequest {
            namespace_name: NS.into(),
            semaphore_name: "short".into(),
            lease_id: d.clone(),
            weight: 1,
            max_hold_ms: 2_000,
            ..Default::default()
        })
        .await?
        .into_inner();
    ensure!(ops::acquired(&got), "{got:?}");
    let mut s = watch(&cluster, follower, &d, sem_kind).await?;
    let w = watching(&mut s).await?;
    if !w.holds.is_empty() {
        let e = lost(&mut s).await?;
        ensure!(e.cause() == LossCause::HoldLimit, "{e:?}");
        ensure!(e.semaphore_name == "short", "{e:?}");
    }

    // A lock deleted under its holder, watched as a lock lease.
    let l = c
        .create_lock_lease(pb::CreateLockLeaseRequest {
            namespace_name: NS.into(),
            process_id: "test".into(),
            ttl_seconds: 60,
            ..Default::default()
        })
        .await?
        .into_inner()
        .lease
        .unwrap_or_default()
        .lease_id;
    c.acquire_lock(pb::AcquireLockRequest {
        namespace_name: NS.into(),
        lock_name: "a/b".into(),
        exclusive: true,
        lease_id: l.clone(),
        ..Default::default()
    })
    .await?;
    let mut s = watch(&cluster, follower, &l, WatchedLeaseKind::Lock).await?;
    let w = watching(&mut s).await?;
    ensure!(w.holds.len() == 1 && w.holds[0].lock_name == "a/b", "{w:?}");
    ensure!(w.holds[0].exclusive, "{w:?}");
    c.delete_lock(pb::DeleteLockRequest {
        namespace_name: NS.into(),
        lock_name: "a/b".into(),
    })
    .await?;
    let e = lost(&mut s).await?;
    ensure!(e.cause() == LossCause::LockDeleted, "{e:?}");
    ensure!(e.lock_name == "a/b", "{e:?}");

    // The namespace deleted: every lease in it is lost.
    let mut s = watch(&cluster, follower, &d, sem_kind).await?;
    watching(&mut s).await?;
    c.delete_namespace(pb::DeleteNamespaceRequest {
        namespace_name: NS.into(),
    })
    .await?;
    let e = lost(&mut s).await?;
    ensure!(e.cause() == LossCause::NamespaceDeleted, "{e:?}");

    // A bad kind is refused by name.
    let channel = cluster_tests::channel(&cluster.addr(follower)).await?;
    let e = ConchApiClient::new(channel)
        .watch_loss(WatchLossRequest {
            namespace_name: NS.into(),
            lease_id: d.clone(),
            kind: 9,
        })
        .await
        .err()
        .context("kind 9")?;
    ensure!(
        e.code() == tonic::Code::InvalidArgument && e.message().contains("kind"),
        "{e:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// conch sema
// ---------------------------------------------------------------------------------------------

struct Fixture {
    cluster: Cluster,
    dir: tempfile::TempDir,
    spawned: std::cell::Cell<usize>,
}

impl Fixture {
    async fn start() -> anyhow::Result<Fixture> {
        Ok(Fixture {
            cluster: Cluster::start(3).await?,
            dir: tempfile::Builder::new().prefix("conch-loss-").tempdir()?,
            spawned: std::cell::Cell::new(0),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// `conch args…` in the scratch directory (`T`), in a group of its own, killed on drop.
    fn conch(&self, args: &[&str]) -> anyhow::Result<Proc> {
        let n = self.spawned.get() + 1;
        self.spawned.set(n);
        let mut cmd = Command::new(binary("conch"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("CONCH_ENDPOINTS", self.cluster.endpoints().join(","))
            .env("T", self.dir.path())
            .env_remove("CONCH_LOG");
        let label = format!("[{n}] conch {}", args.join(" "));
        Proc::spawn(
            cmd,
            label,
            self.path(&format!("proc{n}.out")),
            self.path(&format!("proc{n}.err")),
        )
    }

    async fn wait_file(&self, name: &str) -> anyhow::Result<String> {
        let path = self.path(name);
        wait_for(&format!("{name} to be written"), WAIT, || {
            let text = std::fs::read_to_string(&path)
                .ok()
                .filter(|t| t.ends_with('\n'));
            async move { text }
        })
        .await
    }

    /// RevokeSemaphoreLease through whichever running node takes it.
    async fn revoke(&self, ns: &str, lease: &str) -> anyhow::Result<()> {
        let mut last = None;
        for id in self.cluster.running_ids() {
            let Ok(mut c) = self.cluster.grackle(id).await else {
                continue;
            };
            let request = pb::RevokeSemaphoreLeaseRequest {
                namespace_name: ns.into(),
                lease_id: lease.into(),
            };
            match c.revoke_semaphore_lease(request).await {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        bail!("RevokeSemaphoreLease failed on every node: {last:?}")
    }

    /// Waits until some running node serves a waiting call (the loss watch counts as one).
    async fn watched(&self) -> anyhow::Result<u64> {
        wait_for("a node to serve the loss watch", WAIT, || async {
            for id in self.cluster.running_ids() {
                let Some(addr) = self.cluster.metrics_addr(id) else {
                    continue;
                };
                let Ok(s) = scrape(&addr).await else {
                    continue;
                };
                if s.get("conch_waiting_calls").unwrap_or(0.0) >= 1.0 {
                    return Some(id);
                }
            }
            None
        })
        .await
    }
}

/// A command that writes its lease and pid, records SIGTERM, and otherwise runs forever.
const HOLDER: &str = r#"trap 'echo term > "$T/marker"; exit 3' TERM; echo "$CONCH_LEASE $$" > "$T/held.tmp"; mv "$T/held.tmp" "$T/held"; while :; do sleep 0.05; done"#;

fn held(text: &str) -> anyhow::Result<(String, i32)> {
    let mut f = text.split_whitespace();
    let lease = f.next().context("lease")?.to_string();
    let pid = f.next().context("pid")?.parse()?;
    Ok((lease, pid))
}

/// The holder is stopped with 79 and says why; the waiter behind it gets the slot.
async fn stopped_and_handed_on(
    f: &Fixture,
    holder: &mut Proc,
    waiter: &mut Proc,
    pid: i32,
) -> anyhow::Result<()> {
    holder.expect_code(EX_SLOT_LOST, WAIT).await?;
    ensure!(f.read("marker").starts_with("term"), "{}", holder.stderr());
    let err = holder.stderr();
    let said: Vec<&str> = err.lines().filter(|l| l.starts_with("conch:")).collect();
    ensure!(said.len() == 1, "one line says why: {err:?}");
    eprintln!("the holder said: {}", said[0]);
    ensure!(
        said[0].starts_with("conch: slot lost while running (revoked): lease ")
            && said[0].contains(" was revoked; stopping the command"),
        "the cause is printed: {err:?}"
    );
    wait_for("the command's group to be gone", WAIT, || async {
        (!group_alive(pid)).then_some(())
    })
    .await?;
    f.wait_file("second").await?;
    waiter.expect_code(0, WAIT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_stops_conch_sema_and_the_next_waiter_gets_the_slot() -> anyhow::Result<()>
{
    let f = Fixture::start().await?;
    let mut p = f.conch(&[
        "sema",
        "x",
        "--max",
        "1",
        "--ttl",
        "60s",
        "--kill-after",
        "1s",
        "--",
        "sh",
        "-c",
        HOLDER,
    ])?;
    let (lease, pid) = held(&f.wait_file("held").await?)?;
    p.also_kill.push(pid);
    f.watched().await?;
    let mut q = f.conch(&[
        "sema",
        "x",
        "--max",
        "1",
        "--",
        "sh",
        "-c",
        r#"echo got > "$T/second""#,
    ])?;
    f.revoke("conch", &lease).await?;
    stopped_and_handed_on(&f, &mut p, &mut q, pid).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_moves_to_another_node_when_the_leader_is_killed() -> anyhow::Result<()> {
    let mut f = Fixture::start().await?;
    let leader = f.cluster.wait_for_leader(WAIT).await?;
    let mut p = f.conch(&[
        "sema",
        "x",
        "--max",
        "1",
        "--ttl",
        "60s",
        "--kill-after",
        "1s",
        "--",
        "sh",
        "-c",
        HOLDER,
    ])?;
    let (lease, pid) = held(&f.wait_file("held").await?)?;
    p.also_kill.push(pid);
    // The node serving the watch is the leader (the client follows the leader hint); it is
    // killed, and the watch comes back on another node.
    let serving = f.watched().await?;
    ensure!(
        serving == leader,
        "the watch is on node {serving}, the leader is {leader}"
    );
    f.cluster.kill(serving);
    f.cluster.wait_for_leader(WAIT).await?;
    let again = f.watched().await?;
    ensure!(again != serving, "node {serving} was killed");
    let mut q = f.conch(&[
        "sema",
        "x",
        "--max",
        "1",
        "--",
        "sh",
        "-c",
        r#"echo got > "$T/second""#,
    ])?;
    f.revoke("conch", &lease).await?;
    stopped_and_handed_on(&f, &mut p, &mut q, pid).await
}

/// A node shutting down (SIGTERM) ends the streams it serves without a loss; conch watches
/// again through another node and still learns the revoke there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_shutting_down_ends_the_watch_and_conch_watches_elsewhere() -> anyhow::Result<()> {
    let mut f = Fixture::start().await?;
    f.cluster.wait_for_leader(WAIT).await?;
    let mut p = f.conch(&[
        "sema",
        "x",
        "--max",
        "1",
        "--ttl",
        "60s",
        "--kill-after",
        "1s",
        "--",
        "sh",
        "-c",
        HOLDER,
    ])?;
    let (lease, pid) = held(&f.wait_file("held").await?)?;
    p.also_kill.push(pid);
    let serving = f.watched().await?;
    f.cluster.signal(serving, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + WAIT;
    while f.cluster.exit_status(serving).is_none() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "node {serving} did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f.cluster.kill(serving);
    f.cluster.wait_for_leader(WAIT).await?;
    let again = f.watched().await?;
    ensure!(again != serving, "node {serving} stopped");
    ensure!(
        p.stderr().lines().all(|l| !l.starts_with("conch:")),
        "a node going away is no loss: {}",
        p.stderr()
    );
    let mut q = f.conch(&[
        "sema",
        "x",
        "--max",
        "1",
        "--",
        "sh",
        "-c",
        r#"echo got > "$T/second""#,
    ])?;
    f.revoke("conch", &lease).await?;
    stopped_and_handed_on(&f, &mut p, &mut q, pid).await
}

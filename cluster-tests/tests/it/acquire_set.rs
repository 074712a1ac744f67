//! All-or-none acquires over the wire (`conch.v1.ConchApi/AcquireSemaphores`) and through
//! `conch sema --and`: two callers wanting `{a, b}` and `{b, a}` both get them (no deadlock); a
//! single acquire behind a waiting set waits for it; through a follower; and across a leader kill
//! the set is held all or none.
//!
//! Every wait is on a condition with a deadline (waiters listed, files written, calls answered);
//! server-side waits are long, so a grant that did not come from the release under test would
//! leave the call waiting past the test's own deadline.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use cluster_tests::proc::Proc;
use cluster_tests::{Cluster, binary, ops, wait_for};
use conch_proto::conch as cpb;
use conch_proto::conch::conch_api_client::ConchApiClient;
use conch_proto::grackle as pb;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);
const NS: &str = "jobs";
/// A blocked call's server-side wait: far longer than any test step.
const SET_TIMEOUT_MS: u64 = 120_000;

type Answer = Result<cpb::AcquireSemaphoresResponse, tonic::Status>;

/// Starts `AcquireSemaphores` of `members` (each with weight 1) for `lease` through `addr`.
fn acquire_set(addr: String, lease: &str, members: &[&str], timeout_ms: u64) -> JoinHandle<Answer> {
    let request = cpb::AcquireSemaphoresRequest {
        namespace_name: NS.into(),
        lease_id: lease.into(),
        semaphores: members
            .iter()
            .map(|m| cpb::SetMember {
                semaphore_name: (*m).into(),
                weight: 1,
            })
            .collect(),
        timeout_ms,
        ..Default::default()
    };
    tokio::spawn(async move {
        let channel = cluster_tests::channel(&addr)
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        ConchApiClient::new(channel)
            .acquire_semaphores(request)
            .await
            .map(tonic::Response::into_inner)
    })
}

/// Starts a single blocking `AcquireSemaphore` of `sem` for `lease` through `addr`.
fn acquire_one(
    addr: String,
    lease: &str,
    sem: &str,
) -> JoinHandle<anyhow::Result<pb::AcquireSemaphoreResponse>> {
    let (lease, sem) = (lease.to_string(), sem.to_string());
    tokio::spawn(async move {
        let mut g =
            pb::grackle_api_client::GrackleApiClient::new(cluster_tests::channel(&addr).await?);
        Ok(ops::acquire(&mut g, NS, &sem, &lease, 1, 120).await?)
    })
}

/// The lease ids waiting on `sem`, in queue order, read through `addr`.
async fn waiters(addr: &str, sem: &str) -> Option<Vec<String>> {
    let channel = cluster_tests::channel(addr).await.ok()?;
    let r = ConchApiClient::new(channel)
        .list_semaphore_waiters(cpb::ListSemaphoreWaitersRequest {
            namespace_name: NS.into(),
            semaphore_name: sem.into(),
            ..Default::default()
        })
        .await
        .ok()?;
    Some(
        r.into_inner()
            .waiters
            .into_iter()
            .map(|w| w.lease_id)
            .collect(),
    )
}

/// Waits until the queue of `sem` (read through `addr`) is exactly `expected`.
async fn wait_queue(addr: &str, sem: &str, expected: &[&str]) -> anyhow::Result<()> {
    wait_for(
        &format!("queue of {sem} to be {expected:?}"),
        WAIT,
        || async {
            waiters(addr, sem)
                .await
                .filter(|w| w == expected)
                .map(|_| ())
        },
    )
    .await
}

/// `(holder lease, fencing token)` of every holder of `sem`, read through `c`.
async fn holders(c: &mut ops::Grackle, sem: &str) -> anyhow::Result<Vec<(String, u64)>> {
    Ok(ops::holders(c, NS, sem)
        .await?
        .into_iter()
        .map(|h| (h.lease_id, h.fencing_token))
        .collect())
}

/// A finished call's answer.
async fn answer<T>(call: JoinHandle<T>) -> anyhow::Result<T> {
    tokio::time::timeout(WAIT, call)
        .await
        .context("the call did not answer in time")?
        .context("the call's task failed")
}

fn acquired(r: &cpb::AcquireSemaphoresResponse) -> bool {
    r.outcome == pb::AcquireOutcome::Acquired as i32
}

/// A cluster of 3 with namespace `jobs` and 1-permit semaphores `a` and `b`; the node id of a
/// follower and a Grackle client on it.
async fn setup() -> anyhow::Result<(Cluster, u64, ops::Grackle)> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(WAIT).await?;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("no follower")?;
    let mut c = cluster.grackle(follower).await?;
    ops::namespace(&mut c, NS).await?;
    ops::semaphore(&mut c, NS, "a", 1).await?;
    ops::semaphore(&mut c, NS, "b", 1).await?;
    Ok((cluster, follower, c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_both_finish_and_a_single_acquire_waits_behind_the_set()
-> anyhow::Result<()> {
    let (cluster, follower, mut c) = setup().await?;
    let addr = cluster.addr(follower);
    let (h, x, y, z) = (
        ops::lease(&mut c, NS, 60).await?,
        ops::lease(&mut c, NS, 60).await?,
        ops::lease(&mut c, NS, 60).await?,
        ops::lease(&mut c, NS, 60).await?,
    );
    ensure!(ops::acquired(
        &ops::acquire(&mut c, NS, "a", &h, 1, 0).await?
    ));

    // x wants {a, b}, y wants {b, a}: both queue, holding nothing (b is free, yet x does not
    // take it alone).
    let x_call = acquire_set(addr.clone(), &x, &["a", "b"], SET_TIMEOUT_MS);
    wait_queue(&addr, "b", &[&x]).await?;
    let y_call = acquire_set(addr.clone(), &y, &["b", "a"], SET_TIMEOUT_MS);
    wait_queue(&addr, "a", &[&x, &y]).await?;
    ensure!(
        holders(&mut c, "b").await?.is_empty(),
        "b is taken by no part of a set"
    );
    // A single acquire of b arriving later waits behind both, although b has room.
    let z_call = acquire_one(addr.clone(), &z, "b");
    wait_queue(&addr, "b", &[&x, &y, &z]).await?;

    // a comes free: x gets both at once.
    ops::release(&mut c, NS, "a", &h).await?;
    let x_answer = answer(x_call).await??;
    ensure!(acquired(&x_answer), "{x_answer:?}");
    let tokens: Vec<u64> = x_answer.grants.iter().map(|g| g.fencing_token).collect();
    ensure!(
        holders(&mut c, "a").await? == vec![(x.clone(), tokens[0])]
            && holders(&mut c, "b").await? == vec![(x.clone(), tokens[1])],
        "x holds both with the tokens it was answered: {x_answer:?}"
    );
    wait_queue(&addr, "b", &[&y, &z]).await?;

    // x is done: y gets both; z still waits for b.
    ops::release(&mut c, NS, "a", &x).await?;
    ops::release(&mut c, NS, "b", &x).await?;
    let y_answer = answer(y_call).await??;
    ensure!(acquired(&y_answer), "{y_answer:?}");
    ensure!(
        y_answer
            .grants
            .iter()
            .map(|g| g.semaphore_name.as_str())
            .collect::<Vec<_>>()
            == ["b", "a"],
        "grants in the order of the request: {y_answer:?}"
    );
    wait_queue(&addr, "b", &[&z]).await?;
    ops::release(&mut c, NS, "b", &y).await?;
    let z_answer = answer(z_call).await??;
    ensure!(ops::acquired(&z_answer), "{z_answer:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_refused_with_invalid_argument() -> anyhow::Result<()> {
    let (cluster, follower, mut c) = setup().await?;
    let lease = ops::lease(&mut c, NS, 60).await?;
    let addr = cluster.addr(follower);
    let dup = answer(acquire_set(addr.clone(), &lease, &["a", "a"], 0)).await?;
    let status = dup.err().context("a duplicate member is refused")?;
    ensure!(status.code() == tonic::Code::InvalidArgument, "{status:?}");
    ensure!(
        status.message().contains("semaphore a is named twice"),
        "{status:?}"
    );
    let one = answer(acquire_set(addr, &lease, &["a"], 0)).await?;
    ensure!(one.err().map(|s| s.code()) == Some(tonic::Code::InvalidArgument));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_member_fails_the_waiting_set_and_frees_the_other_queue() -> anyhow::Result<()> {
    let (cluster, follower, mut c) = setup().await?;
    let addr = cluster.addr(follower);
    let (h, x, z) = (
        ops::lease(&mut c, NS, 60).await?,
        ops::lease(&mut c, NS, 60).await?,
        ops::lease(&mut c, NS, 60).await?,
    );
    ensure!(ops::acquired(
        &ops::acquire(&mut c, NS, "b", &h, 1, 0).await?
    ));
    let x_call = acquire_set(addr.clone(), &x, &["a", "b"], SET_TIMEOUT_MS);
    wait_queue(&addr, "a", &[&x]).await?;
    let z_call = acquire_one(addr.clone(), &z, "a");
    wait_queue(&addr, "a", &[&x, &z]).await?;
    c.delete_semaphore(pb::DeleteSemaphoreRequest {
        namespace_name: NS.into(),
        semaphore_name: "b".into(),
    })
    .await?;
    let status = answer(x_call)
        .await?
        .err()
        .context("the set's call fails")?;
    ensure!(status.code() == tonic::Code::NotFound, "{status:?}");
    ensure!(
        status.message().contains("set a, b was deleted"),
        "{status:?}"
    );
    // The set left a's queue whole: the single acquire behind it gets a.
    let z_answer = answer(z_call).await??;
    ensure!(ops::acquired(&z_answer), "{z_answer:?}");
    ensure!(holders(&mut c, "a").await?.iter().all(|(l, _)| *l == z));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_stays_all_or_none_across_a_leader_kill() -> anyhow::Result<()> {
    let (mut cluster, follower, mut c) = setup().await?;
    let addr = cluster.addr(follower);
    let (h, x) = (
        ops::lease(&mut c, NS, 60).await?,
        ops::lease(&mut c, NS, 60).await?,
    );
    ensure!(ops::acquired(
        &ops::acquire(&mut c, NS, "b", &h, 1, 0).await?
    ));
    let x_call = acquire_set(addr.clone(), &x, &["a", "b"], SET_TIMEOUT_MS);
    wait_queue(&addr, "a", &[&x]).await?;

    let leader = cluster.wait_for_leader(WAIT).await?;
    cluster.kill(leader);
    let new_leader = wait_for("a new leader", WAIT, || async {
        cluster.leader().await.filter(|id| *id != leader)
    })
    .await?;
    // Under the new leader the set still waits whole: a is free, yet not taken.
    let mut on_leader = cluster.grackle(new_leader).await?;
    ensure!(holders(&mut on_leader, "a").await?.is_empty());
    wait_queue(&cluster.addr(new_leader), "b", &[&x]).await?;

    // b comes free: the call still waiting on the follower gets both.
    wait_for("the release of b under the new leader", WAIT, || {
        let mut c = c.clone();
        let h = h.clone();
        async move { ops::release(&mut c, NS, "b", &h).await.ok() }
    })
    .await?;
    let x_answer = answer(x_call).await??;
    ensure!(acquired(&x_answer), "{x_answer:?}");
    for id in cluster.running_ids() {
        let mut g = cluster.grackle(id).await?;
        let both = wait_for(
            &format!("node {id} to show x holding a and b"),
            WAIT,
            || {
                let mut g = g.clone();
                let x = x.clone();
                async move {
                    let a = holders(&mut g, "a").await.ok()?;
                    let b = holders(&mut g, "b").await.ok()?;
                    (a.iter().any(|(l, _)| *l == x) && b.iter().any(|(l, _)| *l == x)).then_some(())
                }
            },
        )
        .await;
        both?;
        ensure!(ops::holders(&mut g, NS, "a").await?.len() == 1);
    }
    Ok(())
}

/// `conch sema … -- sh -c 'echo …'`, as a process killed on drop.
fn conch(cluster: &Cluster, dir: &Path, n: usize, args: &[&str]) -> anyhow::Result<Proc> {
    let mut cmd = std::process::Command::new(binary("conch"));
    cmd.args(args)
        .current_dir(dir)
        .env("CONCH_ENDPOINTS", cluster.endpoints().join(","))
        .env("T", dir)
        .env_remove("CONCH_LOG");
    Proc::spawn(
        cmd,
        format!("[{n}] conch {}", args.join(" ")),
        dir.join(format!("proc{n}.out")),
        dir.join(format!("proc{n}.err")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conch_sema_and_runs_opposite_orders_to_the_end_with_every_token() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    cluster.wait_for_leader(WAIT).await?;
    let dir = tempfile::Builder::new().prefix("conch-set-").tempdir()?;
    // Each run holds a little while, so the runs overlap and queue behind one another.
    let script = "echo \"$CONCH_REV $CONCH_REVS\" >> \"$T/revs\"; sleep 0.2";
    let mut runs = Vec::new();
    for (n, (first, second)) in [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
        .into_iter()
        .enumerate()
    {
        runs.push(conch(
            &cluster,
            dir.path(),
            n,
            &[
                "sema", first, "--max", "1", "--and", second, "--max", "2", "--weight", "2",
                "--wait", "60s", "--", "sh", "-c", script,
            ],
        )?);
    }
    for run in &mut runs {
        let code = run.code(Duration::from_secs(60)).await?;
        ensure!(code == 0, "exit {code}: {}", run.stderr());
    }
    let revs = std::fs::read_to_string(dir.path().join("revs"))?;
    let lines: Vec<&str> = revs.lines().collect();
    ensure!(lines.len() == 4, "{revs}");
    for line in lines {
        // `<rev> first=<rev>,second=<token>`: CONCH_REV is the first member's.
        let (rev, all) = line.split_once(' ').context("two fields")?;
        let members: Vec<(&str, &str)> = all.split(',').filter_map(|m| m.split_once('=')).collect();
        ensure!(members.len() == 2, "{line}");
        ensure!(members[0].1 == rev, "{line}");
        ensure!(
            matches!((members[0].0, members[1].0), ("a", "b") | ("b", "a")),
            "{line}"
        );
    }
    Ok(())
}

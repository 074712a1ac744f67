//! Operating a cluster: leader hints on every response, `conch cluster status` exit codes,
//! `conch cluster snapshot` per node, and how fast a dead cluster is reported.

use std::time::{Duration, Instant};

use cluster_tests::Cluster;
use conch_proto::grackle as pb;

const EX_UNAVAILABLE: i32 = 69;

/// Runs `conch` against `endpoints`; returns (code, stdout, stderr).
async fn conch(endpoints: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    cluster_tests::run_conch(endpoints, args, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_responses_name_the_leader_too() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let leader_addr = cluster.addr(leader);
    for id in cluster.ids() {
        let mut c = cluster.grackle(id).await?;
        let missing = c
            .get_namespace(pb::GetNamespaceRequest {
                namespace_name: "no-such-namespace".into(),
            })
            .await
            .expect_err("missing namespace");
        assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
        let hint = missing
            .metadata()
            .get("conch-leader")
            .and_then(|v| v.to_str().ok());
        assert_eq!(hint, Some(leader_addr.as_str()), "node {id}: {missing:?}");

        let invalid = c
            .create_namespace(pb::CreateNamespaceRequest {
                name: "no spaces allowed!".into(),
                ..Default::default()
            })
            .await
            .expect_err("invalid name");
        assert_eq!(invalid.code(), tonic::Code::InvalidArgument, "{invalid:?}");
        let hint = invalid
            .metadata()
            .get("conch-leader")
            .and_then(|v| v.to_str().ok());
        assert_eq!(hint, Some(leader_addr.as_str()), "node {id}: {invalid:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_exits_like_a_health_check() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let endpoints = cluster.endpoints().join(",");
    let (code, out, err) = conch(&endpoints, &["cluster", "status"]).await?;
    assert_eq!(code, 0, "{out}{err}");

    // One follower down, the leader answers: degraded.
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|&i| i != leader).collect();
    cluster.kill(followers[0]);
    let (code, out, err) = conch(&endpoints, &["cluster", "status"]).await?;
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("unreachable"), "{out}");

    // The leader down too: the last node answers, but it is not the leader.
    cluster.kill(leader);
    let (code, out, err) = conch(&endpoints, &["cluster", "status"]).await?;
    assert_eq!(code, 2, "{out}{err}");

    // Nobody answers.
    cluster.kill(followers[1]);
    let (code, out, err) = conch(&endpoints, &["cluster", "status"]).await?;
    assert_eq!(code, 2, "{out}{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_snapshot_names_the_node_and_reaches_any_member() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let followers: Vec<u64> = cluster.ids().into_iter().filter(|&i| i != leader).collect();
    let via = cluster.addr(followers[0]);

    // Default: the leader, named, although a follower answered.
    let (code, out, err) = conch(&via, &["cluster", "snapshot"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with(&format!("node {leader}: snapshot at log index ")),
        "{out}"
    );
    assert_eq!(out.lines().count(), 1, "{out}");

    // Another follower, through the first one.
    let target = followers[1];
    let (code, out, err) = conch(
        &via,
        &["cluster", "snapshot", "--node", &target.to_string()],
    )
    .await?;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with(&format!("node {target}: snapshot at log index ")),
        "{out}"
    );
    assert!(cluster.status(target).await?.snapshot_index > 0);

    // Every member, one line each.
    let (code, out, err) = conch(&via, &["cluster", "snapshot", "--all"]).await?;
    assert_eq!(code, 0, "{out}{err}");
    let mut named: Vec<u64> = out
        .lines()
        .filter_map(|l| l.strip_prefix("node ")?.split(':').next()?.parse().ok())
        .collect();
    named.sort();
    assert_eq!(named, cluster.ids(), "{out}");
    for id in cluster.ids() {
        assert!(cluster.status(id).await?.snapshot_index > 0, "node {id}");
    }

    // Not a member: an error naming it.
    let (code, out, err) = conch(&via, &["cluster", "snapshot", "--node", "42"]).await?;
    assert_eq!(code, 64, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("node 42 is not a member"),
        "{out}{err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cluster_is_reported_within_about_one_timeout() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let endpoints = cluster.endpoints().join(",");
    for id in cluster.ids() {
        cluster.pause(id);
    }
    // The default timeout is 5 s per attempt: one after the other, three endpoints would take
    // 15 s; tried at once, about 5 s.
    let t0 = Instant::now();
    let (code, out, err) =
        conch(&endpoints, &["sema", "stopped", "--max", "1", "--", "true"]).await?;
    let took = t0.elapsed();
    assert_eq!(code, EX_UNAVAILABLE, "{out}{err}");
    assert!(took < Duration::from_secs(12), "took {took:?}: {err}");
    Ok(())
}

/// Runs `conch cluster health` until its exit status is `code`; returns its output.
async fn health_until(endpoints: &str, args: &[&str], code: i32) -> anyhow::Result<String> {
    health_until_output(endpoints, args, code, |_| true).await
}

/// Runs `conch cluster health ARGS` until it exits `code` with an output `wanted` accepts.
async fn health_until_output(
    endpoints: &str,
    args: &[&str],
    code: i32,
    wanted: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let mut all = vec!["cluster", "health"];
    all.extend_from_slice(args);
    cluster_tests::wait_for(
        &format!("conch cluster health to exit {code}"),
        Duration::from_secs(30),
        || async {
            let (got, out, _) = conch(endpoints, &all).await.ok()?;
            (got == code && wanted(&out)).then_some(out)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_health_judges_from_the_leaders_view() -> anyhow::Result<()> {
    let mut cluster = Cluster::launch(3, &[], true).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    cluster.wait_for_agreement(Duration::from_secs(20)).await?;
    let endpoints = cluster.endpoints().join(",");

    let out = health_until(&endpoints, &[], 0).await?;
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with(&format!("healthy: leader {leader}, term "))
            && out.contains("3/3 voters up"),
        "{out}"
    );
    let out = health_until(&endpoints, &["--json"], 0).await?;
    let json: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(json["status"], "healthy", "{out}");
    assert_eq!(json["leader"], leader, "{out}");

    // The leader cut off from the others: they elect a new one in a higher term, and the old
    // leader, still answering, does not count as a second leader.
    cluster.partition(
        &[
            vec![leader],
            cluster.ids().into_iter().filter(|&i| i != leader).collect(),
        ],
        conch_testkit::LinkMode::Refuse,
    );
    // Until the others have elected, the old leader's term is still the newest with a leader,
    // and a candidate among the others shows as disagreeing with it: wait for the new leader.
    let new_leader_named = |out: &str| {
        serde_json::from_str::<serde_json::Value>(out.trim())
            .is_ok_and(|json| json["leader"].as_u64().is_some_and(|l| l != leader))
    };
    let out = health_until_output(&endpoints, &["--json"], 1, new_leader_named).await?;
    let json: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(json["status"], "degraded", "{out}");
    assert_eq!(json["disagreeing"], serde_json::json!([leader]), "{out}");

    // Only the old leader left: it still says it leads, but no majority follows it.
    for id in cluster.ids().into_iter().filter(|&i| i != leader) {
        cluster.kill(id);
    }
    let out = health_until(&endpoints, &[], 2).await?;
    assert!(out.starts_with("unhealthy: "), "{out}");

    cluster.kill(leader);
    let out = health_until(&endpoints, &[], 2).await?;
    assert!(out.starts_with("unhealthy: no node answered"), "{out}");
    Ok(())
}

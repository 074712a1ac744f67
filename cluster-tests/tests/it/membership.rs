//! Membership changes that cannot hurt the cluster: a `--join` node waits to be added and catches
//! up without disturbing the leader; removal takes learners too and names a stranger; a new
//! learner's address must answer as an empty node or one of this cluster; a removed node stops
//! instead of campaigning.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use cluster_tests::{Cluster, Daemon, PATIENT_LEADER_WAIT, STEADY_LEADER, ops, wait_for};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{
    AddLearnerRequest, ClusterStatusRequest, ClusterStatusResponse, TransferLeaderRequest,
};
use conch_proto::grackle as pb;

/// Starts node `id` on a port of its own with its own data directory under `dir`.
fn spawn_node(dir: &Path, id: u64, extra: &[&str]) -> anyhow::Result<(Daemon, String)> {
    let port = cluster_tests::Port::bind()?;
    let addr = port.addr().to_string();
    let data_dir = dir.join(format!("node{id}"));
    let data_dir = data_dir.to_string_lossy();
    let id = id.to_string();
    let mut args = vec!["--id", &id, "--data-dir", &data_dir];
    args.extend_from_slice(extra);
    let daemon = Daemon::spawn_on(port, &args, dir)?;
    Ok((daemon, addr))
}

/// The status of the node at `addr`, once it answers.
async fn status_of(addr: &str) -> Option<ClusterStatusResponse> {
    let channel = cluster_tests::channel(addr).await.ok()?;
    let reply = tokio::time::timeout(
        Duration::from_secs(2),
        ConchAdminClient::new(channel).cluster_status(ClusterStatusRequest {}),
    )
    .await
    .ok()?
    .ok()?;
    Some(reply.into_inner())
}

async fn conch(endpoint: &str, args: &[&str]) -> anyhow::Result<Output> {
    let output = tokio::process::Command::new(cluster_tests::binary("conch"))
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await?;
    Ok(output)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn member_ids(status: &ClusterStatusResponse) -> Vec<(u64, bool)> {
    status.members.iter().map(|m| (m.id, m.voter)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_node_waits_is_added_and_catches_up_without_disturbing_the_leader()
-> anyhow::Result<()> {
    let cluster = Cluster::start_with(3, &STEADY_LEADER).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let follower = cluster
        .running_ids()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(1);
    let endpoint = cluster.addr(follower);
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, "before-join").await?;
    let before = cluster.status(leader).await?;

    // Alone, with an empty data directory and no --initial-cluster: it would be the lowest id of
    // its own one-node cluster, but --join keeps it from bootstrapping.
    let dir = tempfile::tempdir()?;
    let (node4, addr4) = spawn_node(dir.path(), 4, &["--join"])?;
    let waiting = wait_for("node 4 to answer", Duration::from_secs(20), || {
        status_of(&addr4)
    })
    .await?;
    assert_eq!(waiting.cluster_id, "", "a --join node has no cluster id");
    assert_eq!(waiting.leader_id, 0, "{waiting:?}");
    wait_for(
        "node 4 to log that it waits to be added",
        Duration::from_secs(20),
        || {
            let logs = format!("{}{}", node4.stdout(), node4.stderr());
            async move { logs.contains("not bootstrapping").then_some(()) }
        },
    )
    .await?;

    let added = conch(&endpoint, &["cluster", "add-learner", "4", &addr4]).await?;
    assert!(
        added.status.success(),
        "{} {}",
        text(&added.stdout),
        text(&added.stderr)
    );
    assert!(
        text(&added.stdout).contains(&format!("  4  {addr4}  learner")),
        "{}",
        text(&added.stdout)
    );
    let promoted = conch(&endpoint, &["cluster", "promote", "4"]).await?;
    assert!(promoted.status.success(), "{}", text(&promoted.stderr));
    assert_eq!(
        text(&promoted.stdout)
            .lines()
            .filter(|l| l.ends_with("voter"))
            .count(),
        4,
        "{}",
        text(&promoted.stdout)
    );

    // Node 4 has the old data, and the cluster's id.
    let mut c4 =
        pb::grackle_api_client::GrackleApiClient::new(cluster_tests::channel(&addr4).await?);
    let names: Vec<String> = c4
        .list_namespaces(pb::ListNamespacesRequest::default())
        .await?
        .into_inner()
        .namespaces
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["before-join".to_string()]);
    let joined = status_of(&addr4).await.unwrap_or_default();
    assert_eq!(joined.cluster_id, before.cluster_id);

    // A learner is removed; node 4 stays.
    let (_node5, addr5) = spawn_node(dir.path(), 5, &["--join"])?;
    wait_for("node 5 to answer", Duration::from_secs(20), || {
        status_of(&addr5)
    })
    .await?;
    let added = conch(&endpoint, &["cluster", "add-learner", "5", &addr5]).await?;
    assert!(added.status.success(), "{}", text(&added.stderr));
    let removed = conch(&endpoint, &["cluster", "remove", "5"]).await?;
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    assert!(
        !text(&removed.stdout).contains("  5  "),
        "{}",
        text(&removed.stdout)
    );
    let after = cluster.status(leader).await?;
    assert_eq!(
        member_ids(&after),
        vec![(1, true), (2, true), (3, true), (4, true)]
    );

    // A node that is not a member: one line naming it, exit 64, nothing changed.
    let stranger = conch(&endpoint, &["cluster", "remove", "42"]).await?;
    assert_eq!(
        stranger.status.code(),
        Some(64),
        "{}",
        text(&stranger.stderr)
    );
    let stderr = text(&stranger.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("node 42 is not a member"), "{stderr}");
    assert_eq!(
        member_ids(&cluster.status(leader).await?),
        member_ids(&after)
    );

    // Nothing of this disturbed the leader.
    let now = cluster.status(leader).await?;
    assert_eq!(
        (now.leader_id, now.term),
        (before.leader_id, before.term),
        "the leader or its term changed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_learner_refuses_addresses_that_are_not_empty_or_of_this_cluster() -> anyhow::Result<()>
{
    let cluster = Cluster::start_with(3, &STEADY_LEADER).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let before = cluster.status(leader).await?;
    let mut admin = cluster.admin(leader).await?;
    let dir = tempfile::tempdir()?;

    // Started without --join and without --initial-cluster: it bootstraps its own cluster.
    let (_other, other_addr) = spawn_node(dir.path(), 6, &[])?;
    let other = wait_for(
        "node 6 to lead its own cluster",
        Duration::from_secs(20),
        || async {
            status_of(&other_addr)
                .await
                .filter(|s| s.leader_id == 6 && !s.cluster_id.is_empty())
        },
    )
    .await?;
    assert_ne!(other.cluster_id, before.cluster_id);
    let refused = admin
        .add_learner(AddLearnerRequest {
            node_id: 6,
            addr: other_addr.clone(),
        })
        .await
        .expect_err("a node of another cluster");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("another cluster"), "{refused:?}");
    let cli = conch(
        &cluster.addr(leader),
        &["cluster", "add-learner", "6", &other_addr],
    )
    .await?;
    assert_eq!(cli.status.code(), Some(64), "{}", text(&cli.stderr));
    assert_eq!(
        text(&cli.stderr).lines().count(),
        1,
        "{}",
        text(&cli.stderr)
    );
    assert!(
        text(&cli.stderr).contains("another cluster")
            && text(&cli.stderr).contains("failed precondition"),
        "{}",
        text(&cli.stderr)
    );

    // Nothing listening (and nothing can start listening there during the test).
    let (_held, nowhere) = cluster_tests::sockets::closed_port()?;
    let refused = admin
        .add_learner(AddLearnerRequest {
            node_id: 7,
            addr: nowhere.clone(),
        })
        .await
        .expect_err("nothing listening");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("nothing answer"), "{refused:?}");
    // The CLI says the same status and exits as the book's table (The conch CLI) gives it (64).
    let cli = conch(
        &cluster.addr(leader),
        &["cluster", "add-learner", "7", &nowhere],
    )
    .await?;
    let said = text(&cli.stderr);
    assert_eq!(cli.status.code(), Some(64), "{said}");
    assert!(
        said.contains("failed precondition") && said.contains("nothing answer"),
        "{said}"
    );

    // An empty node, but not the one named.
    let (_node8, addr8) = spawn_node(dir.path(), 8, &["--join"])?;
    wait_for("node 8 to answer", Duration::from_secs(20), || {
        status_of(&addr8)
    })
    .await?;
    let refused = admin
        .add_learner(AddLearnerRequest {
            node_id: 9,
            addr: addr8.clone(),
        })
        .await
        .expect_err("another node id");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("node 8, not node 9"),
        "{refused:?}"
    );
    let cli = conch(
        &cluster.addr(leader),
        &["cluster", "add-learner", "9", &addr8],
    )
    .await?;
    let said = text(&cli.stderr);
    assert_eq!(cli.status.code(), Some(64), "{said}");
    assert!(
        said.contains("failed precondition") && said.contains("node 8, not node 9"),
        "{said}"
    );

    // Nothing changed, and the leader was not disturbed.
    let now = cluster.status(leader).await?;
    assert_eq!(member_ids(&now), member_ids(&before));
    assert_eq!((now.leader_id, now.term), (before.leader_id, before.term));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_stops_and_the_cluster_keeps_its_term() -> anyhow::Result<()> {
    let mut cluster =
        Cluster::start_with(3, &[PATIENT_LEADER_WAIT, STEADY_LEADER].concat()).await?;
    let mut leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    if leader == 3 {
        // Node 3 is the one removed: let another node lead, so that removing it needs no
        // election.
        cluster
            .admin(3)
            .await?
            .transfer_leader(TransferLeaderRequest { to_node_id: 1 })
            .await?;
        leader = wait_for("node 1 to lead", Duration::from_secs(20), || async {
            let statuses = [cluster.status(1).await.ok()?, cluster.status(2).await.ok()?];
            statuses.iter().all(|s| s.leader_id == 1).then_some(1)
        })
        .await?;
    }
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, "before-removal").await?;

    let removed = conch(&cluster.addr(leader), &["cluster", "remove", "3"]).await?;
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    assert!(
        !text(&removed.stdout).contains("  3  "),
        "{}",
        text(&removed.stdout)
    );
    let before = cluster.status(leader).await?;
    assert_eq!(member_ids(&before), vec![(1, true), (2, true)]);

    // Node 3 hears of its removal, says so in one line, and exits with its own status.
    let line = "this node was removed from the cluster (membership now {voters: [1, 2], \
                learners: []}); it stops taking part: stop it, or wipe its data directory and \
                add it again";
    wait_for("node 3 to log its removal", Duration::from_secs(20), || {
        let logged = cluster.log(3).contains(line);
        async move { logged.then_some(()) }
    })
    .await?;
    let status = wait_for("node 3 to exit", Duration::from_secs(20), || {
        let status = cluster.exit_status(3);
        async move { status }
    })
    .await?;
    assert_eq!(status.code(), Some(78), "{}", cluster.logs_tail());

    // The others go on in the same term with the same leader: nobody campaigned.
    for name in ["after-removal-1", "after-removal-2", "after-removal-3"] {
        ops::namespace(&mut c, name).await?;
    }
    let agreed = wait_for(
        "nodes 1 and 2 to apply the writes",
        Duration::from_secs(20),
        || async {
            let one = cluster.status(1).await.ok()?;
            let two = cluster.status(2).await.ok()?;
            (one.applied_index == two.applied_index && one.applied_index > before.applied_index)
                .then_some((one, two))
        },
    )
    .await?;
    for now in [agreed.0, agreed.1] {
        assert_eq!(
            (now.leader_id, now.term),
            (before.leader_id, before.term),
            "node {}: the leader or its term changed",
            now.node_id
        );
    }

    // Started again, node 3 refuses its directory in one line, with the same status.
    cluster.restart(3)?;
    let status = wait_for("node 3 to refuse to start", Duration::from_secs(20), || {
        let status = cluster.exit_status(3);
        async move { status }
    })
    .await?;
    assert_eq!(status.code(), Some(78), "{}", cluster.logs_tail());
    let log = cluster.log(3);
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("belongs to node 3, which was removed from its cluster"),
        "{last}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_removes_itself_stops_once_it_has_applied_its_removal() -> anyhow::Result<()>
{
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let others: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();

    let removed = conch(
        &cluster.addr(leader),
        &["cluster", "remove", &leader.to_string()],
    )
    .await?;
    assert!(removed.status.success(), "{}", text(&removed.stderr));

    wait_for(
        "the old leader to log its removal",
        Duration::from_secs(20),
        || {
            let logged = cluster
                .log(leader)
                .contains("this node was removed from the cluster");
            async move { logged.then_some(()) }
        },
    )
    .await?;
    let status = wait_for("the old leader to exit", Duration::from_secs(20), || {
        let status = cluster.exit_status(leader);
        async move { status }
    })
    .await?;
    assert_eq!(status.code(), Some(78), "{}", cluster.logs_tail());

    // The other two elect a leader between them and keep serving.
    let now = wait_for("a new leader", Duration::from_secs(20), || async {
        let a = cluster.status(others[0]).await.ok()?;
        let b = cluster.status(others[1]).await.ok()?;
        (a.leader_id != 0 && a.leader_id == b.leader_id && others.contains(&a.leader_id))
            .then_some(a)
    })
    .await?;
    let voters: Vec<(u64, bool)> = others.iter().map(|id| (*id, true)).collect();
    assert_eq!(member_ids(&now), voters);
    let mut c = cluster.grackle(now.leader_id).await?;
    ops::namespace(&mut c, "after-the-leader-left").await?;
    Ok(())
}

/// A leadership transfer answers once the target leads, with its term, through whichever node
/// is asked; `conch cluster transfer-leader` prints who leads and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_transfer_answers_once_the_target_leads() -> anyhow::Result<()> {
    let cluster = Cluster::start_with(3, &PATIENT_LEADER_WAIT).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let term_before = cluster.status(leader).await?.term;
    let to = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .ok_or_else(|| anyhow::anyhow!("a follower"))?;
    // Asked of the current leader: it forwards to the target, which answers once it leads.
    let answer = cluster
        .admin(leader)
        .await?
        .transfer_leader(TransferLeaderRequest { to_node_id: to })
        .await?
        .into_inner();
    anyhow::ensure!(
        answer.leader_id == to && answer.term > term_before,
        "{answer:?} (term before {term_before})"
    );
    let status = cluster.status(to).await?;
    anyhow::ensure!(
        status.leader_id == to && status.term >= answer.term,
        "right after the answer the target leads: {status:?}"
    );
    // The CLI through another node.
    let back = cluster
        .ids()
        .into_iter()
        .find(|id| *id != to)
        .ok_or_else(|| anyhow::anyhow!("another node"))?;
    let id = back.to_string();
    let output = conch(&cluster.addr(back), &["cluster", "transfer-leader", &id]).await?;
    anyhow::ensure!(
        output.status.success() && text(&output.stdout).contains(&format!("node {back} leads")),
        "{output:?}"
    );
    // A node that is not a member: refused, naming it, and nobody campaigns.
    let output = conch(&cluster.addr(back), &["cluster", "transfer-leader", "9"]).await?;
    anyhow::ensure!(
        !output.status.success() && text(&output.stderr).contains("node 9 is not a member"),
        "{output:?}"
    );
    Ok(())
}

/// Back-to-back transfers in a five-node cluster, each to a node that leads only since the one
/// before (inside every voter's leader lease), end with the asked node leading each time, as a
/// rolling restart does it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_transfers_in_five_nodes_each_reach_their_target() -> anyhow::Result<()> {
    let cluster = Cluster::start_with(5, &PATIENT_LEADER_WAIT).await?;
    let first = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let mut term = cluster.status(first).await?.term;
    let order: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != first)
        .collect();
    for to in order.into_iter().chain([first]) {
        let answer = cluster
            .admin(first)
            .await?
            .transfer_leader(TransferLeaderRequest { to_node_id: to })
            .await?
            .into_inner();
        anyhow::ensure!(
            answer.leader_id == to && answer.term > term,
            "transfer to {to}: {answer:?} (term before {term})"
        );
        term = answer.term;
    }
    Ok(())
}

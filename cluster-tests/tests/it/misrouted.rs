//! A peer address that leads to the wrong member: node 1 is told node 3 lives at node 2's
//! address. Raft counts a reply as the vote or acknowledgement of the node the request was
//! sent to, so node 2 must refuse what was meant for node 3 (else one real node would count
//! twice towards a quorum); the cluster still elects a leader and commits through the links
//! that are right.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use cluster_tests::ops;
use cluster_tests::{Daemon, Port, wait_for};
use conch_proto::conch::ClusterStatusRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;

const REFUSAL: &str = "this is node 2, not node 3";

/// Nodes 2 and 3, then node 1 (the one that bootstraps and so campaigns first), which reaches
/// "node 3" at node 2's address. Returned in id order with their addresses.
fn launch(dir: &Path) -> anyhow::Result<(Vec<Daemon>, Vec<String>)> {
    let mut ports: Vec<Option<Port>> = Port::bind_many(3)?.into_iter().map(Some).collect();
    let addrs: Vec<String> = ports
        .iter()
        .flatten()
        .map(|p| p.addr().to_string())
        .collect();
    let initial = (1..=3)
        .map(|id| format!("{id}={}", addrs[id - 1]))
        .collect::<Vec<_>>()
        .join(",");
    let wrong = format!("3={}", addrs[1]);
    let mut nodes: Vec<(usize, Daemon)> = Vec::new();
    for id in [2usize, 3, 1] {
        let data = dir.join(format!("node{id}")).display().to_string();
        let id_text = id.to_string();
        let mut args = vec![
            "--id",
            &id_text,
            "--data-dir",
            &data,
            "--initial-cluster",
            &initial,
        ];
        if id == 1 {
            args.extend(["--peer-routes", &wrong]);
        }
        let port = ports[id - 1].take().expect("each node starts once");
        nodes.push((id, Daemon::spawn_on(port, &args, dir)?));
    }
    nodes.sort_by_key(|(id, _)| *id);
    Ok((nodes.into_iter().map(|(_, d)| d).collect(), addrs))
}

fn logs(nodes: &[Daemon]) -> String {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| format!("node {} log:\n{}", i + 1, n.stderr()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_message_meant_for_another_node_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut nodes, addrs) = launch(dir.path())?;
    // A node that exits (a crash, a port in use) ends the wait at once, with every log.
    let refused = wait_for(
        "node 2 to refuse a message meant for node 3, or a node to exit",
        Duration::from_secs(60),
        || {
            let seen = nodes[1].stderr().contains(REFUSAL);
            let exited = nodes.iter_mut().any(Daemon::has_exited);
            async move { (seen || exited).then_some(seen) }
        },
    )
    .await
    .with_context(|| logs(&nodes))?;
    anyhow::ensure!(refused, "a node exited; {}", logs(&nodes));

    // The right links still make a cluster: a leader, and a write that commits.
    let leader = wait_for("a leader", Duration::from_secs(60), || async {
        for addr in &addrs {
            let Ok(channel) = cluster_tests::channel(addr).await else {
                continue;
            };
            if let Ok(status) = ConchAdminClient::new(channel)
                .cluster_status(ClusterStatusRequest {})
                .await
                && status.get_ref().leader_id != 0
            {
                return Some(status.get_ref().leader_id);
            }
        }
        None
    })
    .await?;
    let addr = &addrs[leader as usize - 1];
    let c = ops::Grackle::new(cluster_tests::channel(addr).await?);
    wait_for("a write to commit", Duration::from_secs(60), || {
        let mut c = c.clone();
        async move { ops::namespace(&mut c, "misrouted").await.ok() }
    })
    .await?;
    Ok(())
}

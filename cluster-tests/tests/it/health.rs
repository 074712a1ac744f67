//! gRPC health as a load balancer sees it: SERVING while a node knows a leader, NOT_SERVING once
//! it has none.

use std::time::Duration;

use cluster_tests::{Cluster, wait_for};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

async fn status_of(cluster: &Cluster, id: u64, service: &str) -> Option<ServingStatus> {
    let channel = cluster.channel(id)?;
    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    request.set_timeout(Duration::from_secs(2));
    let reply = client.check(request).await.ok()?.into_inner();
    ServingStatus::try_from(reply.status).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_leader_is_not_serving() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    for id in cluster.running_ids() {
        for service in ["", "com.evrblk.grackle.v1beta.GrackleApi"] {
            wait_for(
                "every node to report SERVING",
                Duration::from_secs(20),
                || async {
                    (status_of(&cluster, id, service).await == Some(ServingStatus::Serving))
                        .then_some(())
                },
            )
            .await?;
        }
    }
    // Keep one follower; without a majority it loses its leader and is taken out of rotation.
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let ids = cluster.running_ids();
    let survivor = ids
        .iter()
        .copied()
        .find(|id| *id != leader)
        .unwrap_or(leader);
    for id in ids {
        if id != survivor {
            cluster.kill(id);
        }
    }
    wait_for(
        "the survivor to report NOT_SERVING",
        Duration::from_secs(30),
        || async {
            (status_of(&cluster, survivor, "").await == Some(ServingStatus::NotServing))
                .then_some(())
        },
    )
    .await?;
    assert_eq!(
        status_of(&cluster, survivor, "com.evrblk.grackle.v1beta.GrackleApi").await,
        Some(ServingStatus::NotServing)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_serves() -> anyhow::Result<()> {
    let cluster = Cluster::start(1).await?;
    wait_for(
        "the node to report SERVING",
        Duration::from_secs(20),
        || async {
            (status_of(&cluster, 1, "").await == Some(ServingStatus::Serving)).then_some(())
        },
    )
    .await?;
    // And keeps serving past the cut-off bound (twice the 300 ms election timeout): its quorum
    // is itself.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        status_of(&cluster, 1, "").await,
        Some(ServingStatus::Serving)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_majority_is_not_serving() -> anyhow::Result<()> {
    let cluster = Cluster::launch(3, &[], true).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    wait_for(
        "the leader to report SERVING",
        Duration::from_secs(20),
        || async {
            (status_of(&cluster, leader, "").await == Some(ServingStatus::Serving)).then_some(())
        },
    )
    .await?;
    let others: Vec<u64> = cluster.ids().into_iter().filter(|&i| i != leader).collect();
    cluster.partition(
        &[vec![leader], others.clone()],
        conch_testkit::LinkMode::Refuse,
    );
    wait_for(
        "the cut-off leader to report NOT_SERVING",
        Duration::from_secs(30),
        || async {
            (status_of(&cluster, leader, "").await == Some(ServingStatus::NotServing)).then_some(())
        },
    )
    .await?;
    // The majority elected another leader and serves.
    for id in others {
        wait_for(
            "the majority to report SERVING",
            Duration::from_secs(30),
            || async {
                (status_of(&cluster, id, "").await == Some(ServingStatus::Serving)).then_some(())
            },
        )
        .await?;
    }
    cluster.heal_network();
    Ok(())
}

//! One client holding many connections and waiting calls does not take a cluster down: the
//! nodes keep electing and serving (see the book, Operations, "One client cannot take a node").

use std::time::Duration;

use anyhow::Context;
use cluster_tests::scrape::scrape;
use cluster_tests::{Cluster, ops, wait_for};
use conch_proto::conch::WaitHolderChangeRequest;
use conch_proto::conch::conch_api_client::ConchApiClient;
use tonic::transport::Endpoint;

const NS: &str = "flood";
const IDLE_CONNECTIONS: usize = 5_000;
const WATCH_CONNECTIONS: usize = 50;
const WATCHES_PER_CONNECTION: usize = 100;

/// The sum over the running nodes of one metric series.
async fn total(cluster: &Cluster, series: &str) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for id in cluster.running_ids() {
        let addr = cluster.metrics_addr(id).context("metrics address")?;
        sum += scrape(&addr).await?.value(series);
    }
    Ok(sum)
}

/// An acquire and a release of `work` through node `id`.
async fn serve_through(cluster: &Cluster, id: u64) -> anyhow::Result<()> {
    let mut c = cluster.grackle(id).await?;
    let lease = ops::lease(&mut c, NS, 30).await?;
    let acquired = ops::acquire(&mut c, NS, "work", &lease, 1, 10).await?;
    anyhow::ensure!(ops::acquired(&acquired), "node {id}: {acquired:?}");
    ops::release(&mut c, NS, "work", &lease).await?;
    Ok(())
}

/// 5 000 idle connections (from ten addresses) to one follower and 5 000 holder watches spread over the three nodes:
/// every node still serves, and when the leader is killed the others elect a new one (the
/// loaded follower among them) and serve through the loaded follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_watchers_do_not_stop_a_cluster() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let loaded = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .context("a follower")?;
    let mut c = cluster.grackle(leader).await?;
    ops::namespace(&mut c, NS).await?;
    ops::semaphore(&mut c, NS, "quiet", 1).await?;
    ops::semaphore(&mut c, NS, "work", 1).await?;

    // From ten addresses, each under its share (--max-connections-per-address); the node closes
    // them once idle.
    let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
    let target: std::net::SocketAddr = cluster.addr(loaded).parse()?;
    for i in 0..IDLE_CONNECTIONS {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::from((
            [127, 0, 0, 2 + (i % 10) as u8],
            0,
        )))?;
        idle.push(socket.connect(target).await?);
    }
    // Watches of a semaphore nobody holds, on connections of their own (no client timeout):
    // each waits until its 60 s are up.
    let mut watches = tokio::task::JoinSet::new();
    let ids = cluster.ids();
    for i in 0..WATCH_CONNECTIONS {
        let addr = cluster.addr(ids[i % ids.len()]);
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        for _ in 0..WATCHES_PER_CONNECTION {
            let mut api = ConchApiClient::new(channel.clone());
            watches.spawn(async move {
                api.wait_holder_change(WaitHolderChangeRequest {
                    namespace_name: NS.into(),
                    semaphore_name: "quiet".into(),
                    known_token: 0,
                    timeout_ms: 60_000,
                })
                .await
            });
        }
    }
    let watching = (WATCH_CONNECTIONS * WATCHES_PER_CONNECTION) as f64;
    wait_for("every watch to wait", Duration::from_secs(60), || async {
        let now = total(&cluster, "conch_waiting_calls").await.ok()?;
        (now == watching).then_some(())
    })
    .await?;

    for id in cluster.ids() {
        serve_through(&cluster, id).await?;
    }
    // A change elsewhere woke no watch: they all still wait.
    anyhow::ensure!(
        total(&cluster, "conch_waiting_calls").await? == watching,
        "a watch ended early"
    );
    // No connection was refused for want of room: only idle ones were closed.
    for reason in ["per_address", "full", "evicted"] {
        let series =
            format!("conch_connections_refused_total{{listener=\"client\",reason=\"{reason}\"}}");
        anyhow::ensure!(total(&cluster, &series).await? == 0.0, "{series}");
    }

    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await?;
    anyhow::ensure!(new_leader != leader);
    serve_through(&cluster, loaded).await?;
    drop(idle);
    watches.abort_all();
    Ok(())
}

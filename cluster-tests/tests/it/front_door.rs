//! A stranger cannot hold a node's port shut (see the README, "One client cannot take a node"):
//! many idle connections from one source address are refused past that address's share and
//! closed once idle, while a client with a token on another address keeps being served, each
//! call on a connection of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use cluster_tests::Cluster;
use cluster_tests::scrape::scrape;
use conch_proto::conch::ClusterStatusRequest;
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use tokio::io::AsyncReadExt;

/// The per-address share the node is started with.
const PER_ADDRESS: usize = 200;
/// Connections the stranger keeps trying to hold at once: more than its share.
const STRANGER_CONNECTIONS: usize = 300;
/// Times each of them is opened again after the node closed it, at most.
const REOPENS: usize = 30;
const LONG: Duration = Duration::from_secs(90);
/// How long the client with a token may take to connect.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// One series of `conch_connections_refused_total` on node `id`.
async fn refused(cluster: &Cluster, id: u64, listener: &str, reason: &str) -> anyhow::Result<f64> {
    let addr = cluster.metrics_addr(id).context("metrics address")?;
    Ok(scrape(&addr).await?.value(&format!(
        "conch_connections_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
    )))
}

/// A TCP connection to `target` from `source` that sends nothing; waits until the node closes
/// it (or `stop`). Whether the node closed it.
async fn idle_connection(source: &str, target: std::net::SocketAddr, stop: &AtomicBool) -> bool {
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
        return false;
    };
    let Ok(bind) = format!("{source}:0").parse() else {
        return false;
    };
    if socket.bind(bind).is_err() {
        return false;
    }
    let Ok(mut stream) = socket.connect(target).await else {
        return false;
    };
    let mut buf = [0u8; 64];
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        // Re-checks `stop` every second; a read of 0 bytes or an error: the node closed it.
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Err(_) => continue,
            Ok(Ok(n)) if n > 0 => continue,
            Ok(_) => return true,
        }
    }
}

/// A cluster status from node `id` on a new connection, with the token. The connection may
/// take as long as a client's usual connect timeout (5 s): on two cores the stranger's 300
/// reconnecting tasks share the CPU with the node, and the node's answer is what is tested.
async fn served(cluster: &Cluster, id: u64) -> anyhow::Result<()> {
    let channel = cluster_tests::net::connect(&cluster.addr(id), CONNECT_WITHIN).await?;
    let mut request = tonic::Request::new(ClusterStatusRequest {});
    request.set_timeout(Duration::from_secs(10));
    ConchAdminClient::new(channel)
        .cluster_status(request)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_strangers_from_one_address_do_not_keep_a_client_with_a_token_out()
-> anyhow::Result<()> {
    let (_secrets, mut args) = cluster_tests::auth::bootstrap_args()?;
    args.extend([
        "--max-connections-per-address".to_string(),
        PER_ADDRESS.to_string(),
    ]);
    let cluster = Cluster::launch(3, &args, false).await?;
    cluster.wait_for_leader(LONG).await?;
    cluster_tests::auth::wait_until_on(&cluster, LONG).await?;
    let id = cluster.ids()[0];
    let addr = cluster.addr(id);
    let target: std::net::SocketAddr = addr.parse().context("client address")?;

    // The stranger: from 127.0.0.2, more idle connections than its share, each opened again
    // when the node closes it, until told to stop or out of reopens.
    let stop = Arc::new(AtomicBool::new(false));
    let closed_by_node = Arc::new(AtomicU64::new(0));
    let mut stranger = tokio::task::JoinSet::new();
    for _ in 0..STRANGER_CONNECTIONS {
        let (stop, closed_by_node) = (Arc::clone(&stop), Arc::clone(&closed_by_node));
        stranger.spawn(async move {
            for _ in 0..REOPENS {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                if idle_connection("127.0.0.2", target, &stop).await {
                    closed_by_node.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }

    // The client (127.0.0.1, a token) is served on every call, each on a new connection, until
    // the node has refused the stranger's connections past its share and closed idle ones.
    let (mut calls, mut failed) = (0u64, Vec::new());
    let deadline = std::time::Instant::now() + LONG;
    let outcome = loop {
        calls += 1;
        if let Err(e) = served(&cluster, id).await {
            failed.push(e.to_string());
        }
        let per_address = refused(&cluster, id, "client", "per_address").await?;
        let idle = refused(&cluster, id, "client", "idle").await?;
        if per_address > 0.0 && idle > 0.0 && calls >= 20 {
            break Ok((per_address, idle));
        }
        if std::time::Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "timed out after {LONG:?} waiting for refusals past the share ({per_address}) \
                 and idle closes ({idle})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Ordering::SeqCst);
    while stranger.join_next().await.is_some() {}
    let (per_address, idle) = outcome?;
    anyhow::ensure!(
        failed.is_empty(),
        "{} of {calls} calls with a token failed: {failed:?}",
        failed.len()
    );
    anyhow::ensure!(
        closed_by_node.load(Ordering::SeqCst) > 0,
        "the node closed none of the stranger's connections"
    );
    // Every refusal is counted once under its reason; none was a known caller's.
    anyhow::ensure!(refused(&cluster, id, "client", "full").await? == 0.0);
    eprintln!("{calls} calls served; refused {per_address} past the share, closed {idle} idle");
    // The cluster still writes.
    let mut c = cluster.grackle(id).await?;
    cluster_tests::ops::namespace(&mut c, "after-flood").await?;
    Ok(())
}

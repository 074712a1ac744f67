//! A node that stops goes away. An embedded 3-node cluster is started, used and stopped many
//! times in one process; afterwards no node is alive (a weak reference does not upgrade), no
//! task it started is running, no file or socket it opened is open, and memory is flat.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use conchd::proto::grackle::CreateNamespaceRequest;
use conchd::{ConchNode, NodeConfig};

const ROUNDS: usize = 60;
/// The round after which open files, tasks and memory must stay flat.
const BASELINE_ROUND: usize = 24;
/// Generous: the machine running the tests may be busy.
const WITHIN: Duration = Duration::from_secs(30);

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|entries| entries.count())
        .unwrap_or(0)
}

unsafe extern "C" {
    /// glibc: returns free memory at the top of every heap to the operating system.
    fn malloc_trim(pad: usize) -> i32;
}

/// Resident memory after the allocator has handed back what it holds free, so the figure
/// follows live memory rather than the allocator's caches.
fn rss_bytes() -> u64 {
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        malloc_trim(0);
    }
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Starts a 3-node cluster in `dirs`, waits for a leader and commits one write through a
/// follower; returns the nodes.
async fn cluster(dirs: &[tempfile::TempDir], round: usize) -> Vec<ConchNode> {
    let listeners: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let members = conchd::embed::members_of(&listeners).expect("addresses");
    let mut nodes = Vec::new();
    for (id, (listener, dir)) in (1u64..).zip(listeners.into_iter().zip(dirs)) {
        let config = NodeConfig::new(id, "127.0.0.1:0", dir.path())
            .listener(listener)
            .initial_cluster(members.clone())
            .leader_wait(WITHIN);
        nodes.push(ConchNode::start(config).await.expect("start"));
    }
    let deadline = Instant::now() + WITHIN;
    let leader = loop {
        if let Some(leader) = nodes.iter().find(|n| n.is_leader()) {
            break leader.id();
        }
        assert!(Instant::now() < deadline, "round {round}: no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let follower = nodes.iter().find(|n| n.id() != leader).expect("a follower");
    follower
        .client()
        .grackle()
        .create_namespace(CreateNamespaceRequest {
            name: format!("round-{round}"),
            ..Default::default()
        })
        .await
        .expect("a write through a follower");
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_cluster_leaves_nothing_behind() {
    let runtime = tokio::runtime::Handle::current().metrics();
    let mut baseline = None;
    for round in 0..ROUNDS {
        let dirs: Vec<tempfile::TempDir> = (0..3)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let nodes = cluster(&dirs, round).await;
        let alive: Vec<Weak<conchd::node::Node>> =
            nodes.iter().map(|n| Arc::downgrade(n.node())).collect();
        for node in nodes {
            tokio::time::timeout(WITHIN, node.shutdown())
                .await
                .expect("shutdown returns")
                .expect("clean shutdown");
        }
        // Once shutdown has returned, nothing holds a node.
        for (i, weak) in alive.iter().enumerate() {
            assert!(
                weak.upgrade().is_none(),
                "round {round}: node {} is still alive after its shutdown returned",
                i + 1
            );
        }
        // And its data directory can be opened again at once.
        drop(dirs);
        if round == BASELINE_ROUND {
            // By now everything lazily created once (thread pools, caches) exists, and the
            // allocator's free lists have grown to what a round needs (that warm-up alone is
            // some 30 MiB over the first rounds, and levels off).
            baseline = Some((open_fds(), runtime.num_alive_tasks(), rss_bytes()));
        }
    }
    let (fds, tasks, rss) = baseline.expect("a baseline");
    assert!(
        open_fds() <= fds,
        "open files and sockets grew from {fds} to {} over {} rounds",
        open_fds(),
        ROUNDS - BASELINE_ROUND - 1
    );
    assert!(
        runtime.num_alive_tasks() <= tasks,
        "tasks grew from {tasks} to {}",
        runtime.num_alive_tasks()
    );
    // Flat: within 32 MiB over the rounds after the baseline, where a leaked node costs several
    // MiB.
    let grown = rss_bytes().saturating_sub(rss);
    assert!(
        grown < 32 << 20,
        "resident memory grew by {} KiB over {} rounds",
        grown / 1024,
        ROUNDS - BASELINE_ROUND - 1
    );
}

//! Nodes embedded in this test process through the library API: ports chosen at run time,
//! calls through the in-process client, a cluster that loses a node.

use std::time::{Duration, Instant};

use conchd::proto::grackle::grackle_api_client::GrackleApiClient;
use conchd::proto::grackle::{
    AcquireOutcome, AcquireSemaphoreRequest, CreateNamespaceRequest, CreateSemaphoreLeaseRequest,
    CreateSemaphoreRequest, GetSemaphoreRequest, ReleaseSemaphoreRequest,
};
use conchd::{ConchNode, LocalClient, NodeConfig};

/// Generous: the machine running the tests may be busy.
const WITHIN: Duration = Duration::from_secs(30);

async fn namespace(client: &LocalClient, name: &str) {
    client
        .grackle()
        .create_namespace(CreateNamespaceRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .expect("create namespace");
}

async fn semaphore(client: &LocalClient, ns: &str, name: &str, permits: u64) {
    client
        .grackle()
        .create_semaphore(CreateSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: name.into(),
            permits,
            ..Default::default()
        })
        .await
        .expect("create semaphore");
}

async fn lease(client: &LocalClient, ns: &str) -> String {
    client
        .grackle()
        .create_semaphore_lease(CreateSemaphoreLeaseRequest {
            namespace_name: ns.into(),
            process_id: "embedded-test".into(),
            ttl_seconds: 300,
            ..Default::default()
        })
        .await
        .expect("create lease")
        .into_inner()
        .lease
        .expect("a lease")
        .lease_id
}

/// Acquires one permit without waiting; the fencing token when granted.
async fn acquire(client: &LocalClient, ns: &str, name: &str, lease_id: &str) -> Option<u64> {
    let reply = client
        .grackle()
        .acquire_semaphore(AcquireSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: name.into(),
            lease_id: lease_id.into(),
            weight: 1,
            ..Default::default()
        })
        .await
        .expect("acquire")
        .into_inner();
    (reply.outcome() == AcquireOutcome::Acquired).then_some(reply.fencing_token)
}

async fn holds(client: &LocalClient, ns: &str, name: &str) -> u64 {
    client
        .grackle()
        .get_semaphore(GetSemaphoreRequest {
            namespace_name: ns.into(),
            semaphore_name: name.into(),
        })
        .await
        .expect("get semaphore")
        .into_inner()
        .semaphore
        .expect("a semaphore")
        .active_holds
}

/// Waits until every node in `nodes` names the same leader, one of them; returns its id.
async fn agreed_leader(nodes: &[&ConchNode]) -> u64 {
    let deadline = Instant::now() + WITHIN;
    loop {
        let seen: Vec<Option<u64>> = nodes.iter().map(|n| n.leader()).collect();
        if let Some(Some(leader)) = seen.first()
            && seen.iter().all(|s| *s == Some(*leader))
            && nodes.iter().any(|n| n.id() == *leader && n.is_leader())
        {
            return *leader;
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader within {WITHIN:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_on_port_zero_serves_both_clients_and_restarts_on_its_data() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let node = ConchNode::start(NodeConfig::single("127.0.0.1:0", dir.path()))
        .await
        .expect("start");
    let addr = node.local_addr();
    assert_ne!(addr.port(), 0, "the bound port is reported");
    assert_eq!(node.advertise(), addr.to_string());
    assert_eq!(node.metrics_addr(), None, "metrics are off when embedded");

    // The node owns its data directory: a second one on it is refused, naming this process.
    let second = ConchNode::start(NodeConfig::single("127.0.0.1:0", dir.path())).await;
    let Err(refused) = second else {
        panic!("a second node opened a data directory in use");
    };
    let pid = std::process::id();
    assert!(
        refused
            .to_string()
            .ends_with(&format!("is in use by another conchd (pid {pid})")),
        "{refused}"
    );

    let local = node.client();
    namespace(&local, "ns").await;
    semaphore(&local, "ns", "s", 1).await;
    let lease_id = lease(&local, "ns").await;
    let token = acquire(&local, "ns", "s", &lease_id).await;
    assert!(token.is_some(), "the free permit is granted");

    // A network client on the bound port sees the same state, and gets the same errors.
    let mut remote = GrackleApiClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let seen = remote
        .get_semaphore(GetSemaphoreRequest {
            namespace_name: "ns".into(),
            semaphore_name: "s".into(),
        })
        .await
        .expect("get over the network")
        .into_inner();
    assert_eq!(seen.semaphore.map(|s| s.active_holds), Some(1));
    let missing = || GetSemaphoreRequest {
        namespace_name: "ns".into(),
        semaphore_name: "missing".into(),
    };
    let over_network = remote.get_semaphore(missing()).await.expect_err("missing");
    let in_process = local
        .grackle()
        .get_semaphore(missing())
        .await
        .expect_err("missing");
    assert_eq!(in_process.code(), tonic::Code::NotFound);
    assert_eq!(in_process.code(), over_network.code());
    assert_eq!(in_process.message(), over_network.message());
    let bad = || CreateNamespaceRequest {
        name: "not a valid name!".into(),
        ..Default::default()
    };
    let over_network = remote.create_namespace(bad()).await.expect_err("invalid");
    let in_process = local
        .grackle()
        .create_namespace(bad())
        .await
        .expect_err("invalid");
    assert_eq!(in_process.code(), tonic::Code::InvalidArgument);
    assert_eq!(in_process.code(), over_network.code());
    assert_eq!(in_process.message(), over_network.message());
    // The request size limit holds in-process too, refused the same way.
    let huge = CreateNamespaceRequest {
        name: "huge".into(),
        description: "x".repeat(5 * 1024 * 1024),
        ..Default::default()
    };
    let over_network = remote
        .create_namespace(huge.clone())
        .await
        .expect_err("too large");
    let in_process = local
        .grackle()
        .create_namespace(huge)
        .await
        .expect_err("too large");
    assert_eq!(in_process.code(), over_network.code());
    assert_eq!(in_process.message(), over_network.message());
    assert!(in_process.message().contains("too large"), "{in_process:?}");
    drop(remote);

    tokio::time::timeout(WITHIN, node.shutdown())
        .await
        .expect("shutdown returns")
        .expect("clean shutdown");

    // The storage is closed: the same directory opens again, with the held permit in it.
    let node = ConchNode::start(NodeConfig::single("127.0.0.1:0", dir.path()))
        .await
        .expect("restart on the same data directory");
    let local = node.client();
    assert_eq!(holds(&local, "ns", "s").await, 1);
    local
        .grackle()
        .release_semaphore(ReleaseSemaphoreRequest {
            namespace_name: "ns".into(),
            semaphore_name: "s".into(),
            lease_id,
        })
        .await
        .expect("release after the restart");
    assert_eq!(holds(&local, "ns", "s").await, 0);
    tokio::time::timeout(WITHIN, node.shutdown())
        .await
        .expect("shutdown returns")
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_embedded_nodes_keep_serving_after_the_leader_is_dropped() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let listeners: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0"))
        .collect();
    let members = conchd::embed::members_of(&listeners).expect("bound addresses");
    let mut nodes = Vec::new();
    for (listener, id) in listeners.into_iter().zip(1u64..) {
        let config = NodeConfig::new(id, "127.0.0.1:0", dir.path().join(format!("node{id}")))
            .listener(listener)
            .initial_cluster(members.clone());
        nodes.push(Some(ConchNode::start(config).await.expect("start node")));
    }
    let all: Vec<&ConchNode> = nodes.iter().flatten().collect();
    let leader = agreed_leader(&all).await;

    // A follower's in-process client: its writes reach the leader.
    let follower = all
        .iter()
        .find(|n| n.id() != leader)
        .expect("a follower")
        .client();
    namespace(&follower, "ns").await;
    semaphore(&follower, "ns", "held", 1).await;
    let holder = lease(&follower, "ns").await;
    let token = acquire(&follower, "ns", "held", &holder)
        .await
        .expect("the free permit is granted");
    drop(all);

    // Kill the leader: drop its handle without shutting it down (the drop only tells the
    // serving task to stop; the node going away shows in the new leader below).
    let killed = nodes[leader as usize - 1]
        .take()
        .expect("the leader's handle");
    drop(killed);

    let left: Vec<&ConchNode> = nodes.iter().flatten().collect();
    assert_eq!(left.len(), 2);
    let new_leader = agreed_leader(&left).await;
    assert_ne!(new_leader, leader, "a node that is gone cannot lead");

    // Every remaining node's in-process client still writes, and the held permit survived.
    for (i, node) in left.iter().enumerate() {
        let client = node.client();
        assert_eq!(holds(&client, "ns", "held").await, 1);
        let other = lease(&client, "ns").await;
        assert_eq!(
            acquire(&client, "ns", "held", &other).await,
            None,
            "the permit is still held"
        );
        let name = format!("after{i}");
        semaphore(&client, "ns", &name, 1).await;
        let granted = acquire(&client, "ns", &name, &other)
            .await
            .expect("a new semaphore's permit is granted");
        assert!(granted > token, "fencing tokens keep growing");
    }

    for node in nodes.into_iter().flatten() {
        tokio::time::timeout(WITHIN, node.shutdown())
            .await
            .expect("shutdown returns")
            .expect("clean shutdown");
    }
}

/// A self-signed certificate for 127.0.0.1 and its key, written to `dir`.
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("sign");
    let (cert_path, key_path) = (dir.join("node.crt"), dir.join("node.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    conchd::base::private_file::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path, cert.pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_serves_tls_clients_and_the_in_process_client() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (cert, key, pem) = self_signed(dir.path());

    // A bad setting is refused before anything starts, naming the conchd flag.
    let refused = ConchNode::start(
        NodeConfig::single("127.0.0.1:0", dir.path().join("data")).client_ca(&cert),
    )
    .await
    .err()
    .expect("client_ca without tls is refused");
    assert!(
        matches!(refused, conchd::EmbedError::Config(_)),
        "{refused}"
    );
    assert!(refused.to_string().contains("--client-ca"), "{refused}");

    let node = ConchNode::start(
        NodeConfig::single("127.0.0.1:0", dir.path().join("data")).tls(&cert, &key),
    )
    .await
    .expect("start with TLS");
    let local = node.client();
    namespace(&local, "ns").await;

    let addr = node.local_addr();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        .domain_name("127.0.0.1");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect()
        .await
        .expect("connect over TLS");
    let seen = GrackleApiClient::new(channel)
        .get_namespace(conchd::proto::grackle::GetNamespaceRequest {
            namespace_name: "ns".into(),
        })
        .await
        .expect("get over TLS");
    assert_eq!(
        seen.into_inner().namespace.map(|n| n.name).as_deref(),
        Some("ns")
    );

    // Plaintext is not served.
    let plaintext = async {
        GrackleApiClient::connect(format!("http://{addr}"))
            .await
            .map_err(|e| e.to_string())?
            .get_namespace(conchd::proto::grackle::GetNamespaceRequest {
                namespace_name: "ns".into(),
            })
            .await
            .map_err(|e| e.to_string())
    };
    let plaintext = tokio::time::timeout(WITHIN, plaintext)
        .await
        .expect("a plaintext call ends");
    assert!(plaintext.is_err(), "a plaintext call was answered");

    tokio::time::timeout(WITHIN, node.shutdown())
        .await
        .expect("shutdown returns")
        .expect("clean shutdown");
}

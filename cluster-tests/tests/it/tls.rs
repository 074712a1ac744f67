//! Transport security and cluster identity, with real conchd processes and certificates made at
//! test time: clients without TLS or with the wrong CA are refused, a node with another CA's
//! certificate cannot join or disturb a cluster, only node certificates reach the peer service
//! and a revoked one is cut off, a node whose certificate names another id cannot join,
//! certificates rotate under load without a lost request, and two clusters cannot exchange peer
//! messages.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use std::path::{Path, PathBuf};

use cluster_tests::pki::{HARNESS_CLIENT, Pki};
use cluster_tests::{Cluster, Daemon, Port, ops, wait_for};
use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::conch_peer_client::ConchPeerClient;
use conch_proto::conch::{AddLearnerRequest, ClusterStatusRequest, PeerMessage};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::Channel;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const LONG: Duration = Duration::from_secs(60);

/// ClusterStatus of `addr` over a new connection built from `endpoint`.
async fn status_with(endpoint: Endpoint) -> Result<(), String> {
    let channel = endpoint
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut admin = ConchAdminClient::new(channel);
    tokio::time::timeout(
        Duration::from_secs(5),
        admin.cluster_status(ClusterStatusRequest {}),
    )
    .await
    .map_err(|_| "timed out".to_string())?
    .map(|_| ())
    .map_err(|s| format!("{s:?}"))
}

fn tls_endpoint(addr: &str, tls: ClientTlsConfig) -> Endpoint {
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("valid uri")
        .tls_config(tls)
        .expect("valid tls config")
}

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_tls_or_with_another_ca_are_refused() -> anyhow::Result<()> {
    let cluster = Cluster::start_opts(3, &[], true).await?;
    let pki = cluster.pki.clone().expect("a TLS cluster has a PKI");
    let addr = cluster.addr(1);

    // The harness's own TLS client works, and every node reports the same cluster id.
    let statuses = cluster.statuses().await;
    assert_eq!(statuses.len(), 3, "{}", cluster.logs_tail());
    let id = &statuses[&1].cluster_id;
    assert_eq!(id.len(), 32, "cluster id {id:?}");
    wait_for("every node to adopt the cluster id", LONG, || async {
        let statuses = cluster.statuses().await;
        (statuses.len() == 3 && statuses.values().all(|s| s.cluster_id == *id)).then_some(())
    })
    .await?;

    // Plaintext against a TLS node.
    let plain = Endpoint::from_shared(format!("http://{addr}"))?;
    let err = status_with(plain)
        .await
        .expect_err("plaintext must be refused");
    eprintln!("plaintext: {err}");

    // TLS without a client certificate, while the node requires one.
    let no_cert =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&pki.ca_cert())));
    let err = status_with(tls_endpoint(&addr, no_cert))
        .await
        .expect_err("no client certificate must be refused");
    eprintln!("no client certificate: {err}");

    // A client of another CA: its certificate is refused, and it does not trust the node.
    let other_dir = tempfile::tempdir()?;
    let other = Pki::create(&other_dir.path().join("other"))?;
    let err = status_with(tls_endpoint(&addr, other.client_tls("intruder")?))
        .await
        .expect_err("another CA's client must be refused");
    eprintln!("other CA: {err}");

    // A client trusting the right CA but presenting another CA's certificate.
    let (cert, key) = other.client("intruder2")?;
    let mixed = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&pki.ca_cert())))
        .identity(Identity::from_pem(read(&cert), read(&key)));
    let err = status_with(tls_endpoint(&addr, mixed))
        .await
        .expect_err("a certificate of another CA must be refused");
    eprintln!("certificate of another CA: {err}");
    let log = cluster.log(1);
    assert!(log.contains("TLS handshake refused"), "{log}");

    // A client certificate is not a node certificate: the peer service refuses it.
    let channel = tls_endpoint(&addr, pki.client_tls("ops")?)
        .connect()
        .await?;
    let mut peer = ConchPeerClient::new(channel);
    let mut request = tonic::Request::new(PeerMessage { payload: vec![] });
    request
        .metadata_mut()
        .insert("conch-cluster-id", id.parse()?);
    let status = peer.vote(request).await.expect_err("not a node");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");

    // The client library over TLS: writes through any node.
    let config = conch_client::ClientConfig {
        tls: Some(pki.conch_client_tls("ops")?),
        ..Default::default()
    };
    let client = conch_client::Client::connect_with(cluster.endpoints(), config).await?;
    client.ensure_namespace("tls").await?;
    client.ensure_semaphore("tls", "s", 1).await?;

    // The client library in plaintext against TLS nodes: a clear error.
    let config = conch_client::ClientConfig {
        retry_for: Duration::from_millis(500),
        ..Default::default()
    };
    let client = conch_client::Client::connect_with([addr.clone()], config).await?;
    let err = client.get_namespace("tls").await.expect_err("plaintext");
    assert!(err.to_string().contains("serves TLS"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_cas_certificate_cannot_join_or_disturb() -> anyhow::Result<()> {
    let cluster = Cluster::start_opts(3, &[], true).await?;
    let pki = cluster.pki.clone().expect("PKI");
    let leader = cluster.wait_for_leader(LONG).await?;
    let mut grackle = cluster.grackle(leader).await?;
    ops::namespace(&mut grackle, "before").await?;
    let (index, hash) = cluster.wait_for_agreement(LONG).await?;
    let term = cluster.status(leader).await?.term;

    // An impostor with a certificate of another CA, trusting the cluster's CA, claiming to be
    // node 1 of a cluster made of itself and nodes 2 and 3: it bootstraps and campaigns.
    let dir = tempfile::tempdir()?;
    let other = Pki::create(&dir.path().join("other"))?;
    let (cert, key) = other.node(1)?;
    let impostor_port = Port::bind()?;
    let impostor_addr = impostor_port.addr().to_string();
    let initial = format!(
        "1={impostor_addr},2={},3={}",
        cluster.addr(2),
        cluster.addr(3)
    );
    let ca = pki.ca_cert().display().to_string();
    let data = dir.path().join("impostor");
    let args = [
        "--id",
        "1",
        "--data-dir",
        &data.display().to_string(),
        "--initial-cluster",
        &initial,
        "--tls-cert",
        &cert.display().to_string(),
        "--tls-key",
        &key.display().to_string(),
        "--client-ca",
        &ca,
        "--peer-ca",
        &ca,
    ]
    .map(String::from);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let impostor = Daemon::spawn_on(impostor_port, &args, dir.path())?;

    // Wait until nodes 2 and 3 have refused it several times (it retries every election).
    // Counted in the metrics (the log says it at most every 10 s).
    let refused =
        |id: u64| {
            let addr = cluster.metrics_addr(id);
            async move {
                let scraped = cluster_tests::scrape::scrape(&addr?).await.ok()?;
                Some(scraped.value(
                    "conch_connections_refused_total{listener=\"client\",reason=\"handshake\"}",
                ))
            }
        };
    wait_for("the good nodes to refuse the impostor", LONG, || async {
        let (two, three) = (refused(2).await?, refused(3).await?);
        (two >= 3.0 && three >= 3.0).then_some(())
    })
    .await?;

    // The good nodes kept their leader, term and state.
    let statuses = cluster.statuses().await;
    assert_eq!(statuses.len(), 3, "{}", cluster.logs_tail());
    for (id, s) in &statuses {
        assert_eq!(s.leader_id, leader, "node {id}");
        assert_eq!(s.term, term, "node {id}: the impostor moved the term");
        assert_eq!(s.applied_index, index, "node {id}");
        assert_eq!(s.state_hash, hash, "node {id}");
        assert!(
            s.members.iter().all(|m| m.addr != impostor_addr),
            "node {id}: {:?}",
            s.members
        );
    }
    assert!(
        impostor.stderr().contains("bootstrapping a new cluster"),
        "{}",
        impostor.stderr()
    );
    // And keep serving.
    ops::namespace(&mut grackle, "after").await?;
    cluster.wait_for_agreement(LONG).await?;
    Ok(())
}

/// Runs `conch certs ARGS` and returns its stdout; a failure is an error with its stderr.
async fn conch_certs(args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(cluster_tests::binary("conch"))
        .arg("certs")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "conch certs {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A peer client of node `addr` presenting `cert`; `Err` if the connection fails.
async fn peer_as(
    pki: &Pki,
    addr: &str,
    cert: &Path,
    key: &Path,
) -> Result<ConchPeerClient<Channel>, String> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&pki.ca_cert())))
        .identity(Identity::from_pem(read(cert), read(key)));
    let channel = tls_endpoint(addr, tls)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    Ok(ConchPeerClient::new(channel))
}

/// `conch.v1.ConchPeer/ReadIndex` as a member of cluster `cluster_id` would call it.
async fn read_index(
    peer: &mut ConchPeerClient<Channel>,
    cluster_id: &str,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(PeerMessage { payload: vec![] });
    request.metadata_mut().insert(
        "conch-cluster-id",
        cluster_id
            .parse()
            .map_err(|_| tonic::Status::internal("cluster id"))?,
    );
    match tokio::time::timeout(Duration::from_secs(5), peer.read_index(request)).await {
        Ok(reply) => reply.map(|_| ()),
        Err(_) => Err(tonic::Status::deadline_exceeded("read index timed out")),
    }
}

/// Whether the peer service admits the connection as a node's: an append-entries request with a
/// malformed payload gets past admission to the decoder (`INVALID_ARGUMENT`), even from a node
/// that is no member (only votes, proposals and read-index requests need membership).
async fn admitted(
    peer: &mut ConchPeerClient<Channel>,
    cluster_id: &str,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(PeerMessage {
        payload: vec![0xff],
    });
    request.metadata_mut().insert(
        "conch-cluster-id",
        cluster_id
            .parse()
            .map_err(|_| tonic::Status::internal("cluster id"))?,
    );
    match tokio::time::timeout(Duration::from_secs(5), peer.append_entries(request)).await {
        Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => Ok(()),
        Ok(Err(status)) => Err(status),
        Ok(Ok(_)) => Err(tonic::Status::internal("a malformed message was answered")),
        Err(_) => Err(tonic::Status::deadline_exceeded("append entries timed out")),
    }
}

/// The streaming peer calls.
#[derive(Clone, Copy, Debug)]
enum PeerStream {
    /// `AppendEntriesStream`: the leader's AppendEntries to a follower.
    Appends,
    /// `ProposeStream`: a follower's forwarded batches to the leader.
    Forwards,
}

/// A `conch.v1.ConchPeer/AppendEntriesStream` call as a member of cluster `cluster_id` would
/// open it, whose request messages are sent into the returned sender.
async fn open_append_stream(
    peer: &mut ConchPeerClient<Channel>,
    cluster_id: &str,
) -> Result<
    (
        futures::channel::mpsc::UnboundedSender<PeerMessage>,
        tonic::Streaming<PeerMessage>,
    ),
    tonic::Status,
> {
    open_stream(peer, cluster_id, PeerStream::Appends).await
}

/// A streaming peer call (`which`) as a member of cluster `cluster_id` would open it, whose
/// request messages are sent into the returned sender.
async fn open_stream(
    peer: &mut ConchPeerClient<Channel>,
    cluster_id: &str,
    which: PeerStream,
) -> Result<
    (
        futures::channel::mpsc::UnboundedSender<PeerMessage>,
        tonic::Streaming<PeerMessage>,
    ),
    tonic::Status,
> {
    let (requests, outgoing) = futures::channel::mpsc::unbounded();
    let mut request = tonic::Request::new(outgoing);
    request.metadata_mut().insert(
        "conch-cluster-id",
        cluster_id
            .parse()
            .map_err(|_| tonic::Status::internal("cluster id"))?,
    );
    let opened = async {
        match which {
            PeerStream::Appends => peer.append_entries_stream(request).await,
            PeerStream::Forwards => peer.propose_stream(request).await,
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), opened).await {
        Ok(replies) => Ok((requests, replies?.into_inner())),
        Err(_) => Err(tonic::Status::deadline_exceeded(
            "opening the stream timed out",
        )),
    }
}

/// Sends a malformed AppendEntries on an open stream: `Ok` when it got past admission to the
/// decoder (`INVALID_ARGUMENT`, which ends the stream), else the status the stream ended with.
async fn admitted_on(
    (requests, replies): &mut (
        futures::channel::mpsc::UnboundedSender<PeerMessage>,
        tonic::Streaming<PeerMessage>,
    ),
) -> Result<(), tonic::Status> {
    requests
        .unbounded_send(PeerMessage {
            payload: vec![0xff],
        })
        .map_err(|_| tonic::Status::internal("the stream's requests are closed"))?;
    match tokio::time::timeout(Duration::from_secs(5), replies.message()).await {
        Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => Ok(()),
        Ok(Err(status)) => Err(status),
        Ok(Ok(Some(_))) => Err(tonic::Status::internal("a malformed message was answered")),
        Ok(Ok(None)) => Err(tonic::Status::internal("the stream ended without a reply")),
        Err(_) => Err(tonic::Status::deadline_exceeded("append entries timed out")),
    }
}

/// Whether the AppendEntries stream admits the connection as a node's (see [`admitted`]).
async fn admitted_streamed(
    peer: &mut ConchPeerClient<Channel>,
    cluster_id: &str,
) -> Result<(), tonic::Status> {
    admitted_on(&mut open_append_stream(peer, cluster_id).await?).await
}

/// Whether a peer call to `addr` presenting `cert` is refused, at the handshake or by the peer
/// service: `Ok(how)` when it is.
async fn refused_as(
    pki: &Pki,
    addr: &str,
    (cert, key): (&Path, &Path),
    cluster_id: &str,
) -> Result<String, String> {
    let mut peer = match peer_as(pki, addr, cert, key).await {
        Ok(peer) => peer,
        Err(e) => return Ok(format!("handshake: {e}")),
    };
    match read_index(&mut peer, cluster_id).await {
        Ok(()) => Err(format!("{addr} served a peer call to {}", cert.display())),
        Err(status) => Ok(format!("{:?}: {}", status.code(), status.message())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_node_certificates_reach_the_peer_service_and_a_revoked_one_is_cut_off()
-> anyhow::Result<()> {
    let cluster = Cluster::start_opts(3, &[], true).await?;
    let pki = cluster.pki.clone().expect("a TLS cluster has a PKI");
    let dir = pki.dir.display().to_string();
    let cluster_id = wait_for("every node to adopt the cluster id", LONG, || async {
        let statuses = cluster.statuses().await;
        let id = statuses.get(&1)?.cluster_id.clone();
        (statuses.len() == 3 && !id.is_empty() && statuses.values().all(|s| s.cluster_id == id))
            .then_some(id)
    })
    .await?;
    let ids = cluster.ids();

    // (a) A CA-signed certificate without extended key usage, and (b) a client certificate:
    // both pass the handshake (they chain to the CA), and the peer service refuses them on
    // every node, saying nothing about the cluster.
    let no_eku = pki.no_eku()?;
    conch_certs(&["client", &dir, "--name", "intruder"]).await?;
    let client = (
        pki.dir.join("client-intruder.crt"),
        pki.dir.join("client-intruder.key"),
    );
    for (what, (cert, key)) in [("no extended key usage", &no_eku), ("client", &client)] {
        for &id in &ids {
            let mut peer = peer_as(&pki, &cluster.addr(id), cert, key)
                .await
                .map_err(anyhow::Error::msg)?;
            let status = read_index(&mut peer, &cluster_id).await.expect_err(what);
            let streamed = admitted_streamed(&mut peer, &cluster_id)
                .await
                .expect_err(what);
            let forwards = open_stream(&mut peer, &cluster_id, PeerStream::Forwards)
                .await
                .map(|_| ())
                .expect_err(what);
            for status in [status, streamed, forwards] {
                assert_eq!(
                    status.code(),
                    tonic::Code::PermissionDenied,
                    "{what} at node {id}: {status:?}"
                );
                assert!(
                    status.message().contains("answers only members")
                        && !status.message().contains(&cluster_id),
                    "{what}: {status:?}"
                );
            }
        }
    }

    // (c) A node certificate (for node 4, no member) gets past the peer service's admission
    // until it is revoked (though as no member it may not read, propose or open a forward
    // stream); the nodes re-read the revocation list and refuse it, on the connections opened
    // before and on new ones, and on an AppendEntries stream opened before, at its next
    // message.
    let issued = conch_certs(&["node", &dir, "--id", "4", "--host", "127.0.0.1"]).await?;
    assert!(issued.contains("valid until"), "{issued}");
    let node4 = (pki.dir.join("node4.crt"), pki.dir.join("node4.key"));
    let mut before = Vec::new();
    for &id in &ids {
        let mut peer = peer_as(&pki, &cluster.addr(id), &node4.0, &node4.1)
            .await
            .map_err(anyhow::Error::msg)?;
        admitted(&mut peer, &cluster_id).await?;
        admitted_streamed(&mut peer, &cluster_id).await?;
        let open = open_append_stream(&mut peer, &cluster_id).await?;
        let stranger = read_index(&mut peer, &cluster_id)
            .await
            .expect_err("no member reads");
        let forwarder = open_stream(&mut peer, &cluster_id, PeerStream::Forwards)
            .await
            .map(|_| ())
            .expect_err("no member forwards");
        for stranger in [stranger, forwarder] {
            assert!(
                stranger.code() == tonic::Code::PermissionDenied
                    && stranger.message().contains("node 4 is not a member"),
                "{stranger:?}"
            );
        }
        before.push((id, peer, open));
    }
    let revoked = conch_certs(&["revoke", "node", "4", "--dir", &dir]).await?;
    assert!(revoked.contains("--peer-crl"), "{revoked}");
    for (id, peer, open) in &mut before {
        let status = wait_for(
            &format!("node {id} to refuse the revoked certificate"),
            LONG,
            || {
                let mut peer = peer.clone();
                let cluster_id = cluster_id.clone();
                async move { admitted(&mut peer, &cluster_id).await.err() }
            },
        )
        .await?;
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "node {id}: {status:?}"
        );
        let streamed = admitted_on(open)
            .await
            .expect_err("a revoked node's open stream carries nothing more");
        assert_eq!(
            streamed.code(),
            tonic::Code::PermissionDenied,
            "node {id}: {streamed:?}"
        );
        let how = refused_as(&pki, &cluster.addr(*id), (&node4.0, &node4.1), &cluster_id)
            .await
            .map_err(anyhow::Error::msg)?;
        eprintln!("revoked, new connection to node {id}: {how}");
        wait_for(
            &format!("node {id} to log the refused handshake"),
            LONG,
            || async {
                cluster
                    .log(*id)
                    .contains("invalid peer certificate: Revoked")
                    .then_some(())
            },
        )
        .await?;
    }

    // The members' own certificates are untouched: the cluster still commits and serves.
    let leader = cluster.wait_for_leader(LONG).await?;
    let mut grackle = cluster.grackle(leader).await?;
    ops::namespace(&mut grackle, "after-revocation").await?;
    cluster.wait_for_agreement(LONG).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_certificate_names_another_id_cannot_join() -> anyhow::Result<()> {
    let cluster = Cluster::start_opts(3, &[], true).await?;
    let pki = cluster.pki.clone().expect("PKI");
    let leader = cluster.wait_for_leader(LONG).await?;
    let dir = tempfile::tempdir()?;
    let port4 = std::cell::RefCell::new(Some(Port::bind()?));
    let addr4 = port4.borrow().as_ref().expect("bound").addr().to_string();
    let ca = pki.ca_cert().display().to_string();
    let crl = pki.crl().display().to_string();
    let spawn4 = |(cert, key): (PathBuf, PathBuf), data: &str| {
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let data = dir.path().join(data).display().to_string();
        let args = [
            "--id",
            "4",
            "--data-dir",
            &data,
            "--join",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--client-ca",
            &ca,
            "--peer-ca",
            &ca,
            "--peer-crl",
            &crl,
        ];
        // The held port for the first node 4, its address bound again for the second.
        let port = port4.borrow_mut().take();
        Daemon::spawn_on(
            port.map_or_else(|| Port::bind_at(&addr4), Ok)?,
            &args,
            dir.path(),
        )
    };
    cluster_tests::pki::register(&addr4, pki.client_tls(HARNESS_CLIENT)?);
    let answers = || async { cluster_tests::net::status(&addr4).await.ok() };

    // Node 4 runs with node 5's certificate (valid, same CA): the leader's check of the new
    // learner dials node 4 and refuses the certificate, naming the node it expected.
    let impostor = spawn4(pki.node(5)?, "impostor")?;
    let status = wait_for(
        "node 4 (with node 5's certificate) to answer",
        LONG,
        answers,
    )
    .await?;
    assert_eq!(status.node_id, 4);
    let mut admin = cluster.admin(leader).await?;
    let refused = admin
        .add_learner(AddLearnerRequest {
            node_id: 4,
            addr: addr4.clone(),
        })
        .await
        .expect_err("node 5's certificate at node 4's address");
    assert!(
        refused.message().contains("not adding node 4"),
        "{refused:?}"
    );
    let log = cluster.log(leader);
    assert!(
        log.contains("expected a node certificate of node 4: it names node 5"),
        "{log}"
    );
    for (id, s) in cluster.statuses().await {
        assert!(s.members.iter().all(|m| m.id != 4), "node {id}: {s:?}");
    }
    drop(impostor);

    // The same node with its own certificate is added and catches up.
    let node4 = spawn4(pki.node(4)?, "node4")?;
    wait_for("node 4 to answer", LONG, answers).await?;
    admin
        .add_learner(AddLearnerRequest {
            node_id: 4,
            addr: addr4.clone(),
        })
        .await?;
    wait_for("node 4 to be a member", LONG, || async {
        let status = cluster.status(leader).await.ok()?;
        status.members.iter().any(|m| m.id == 4).then_some(())
    })
    .await?;
    drop(node4);
    cluster_tests::pki::unregister(&addr4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_reached_through_proxies_are_known_by_their_node_certificates() -> anyhow::Result<()>
{
    // Every peer link passes through a proxy of its own (--peer-routes): a node dials an
    // address that is not its peer's, and checks the certificate for the node it dials.
    let cluster = Cluster::launch_opts(3, &[], true, true).await?;
    let leader = cluster.wait_for_leader(LONG).await?;
    let mut grackle = cluster.grackle(leader).await?;
    ops::namespace(&mut grackle, "through-proxies").await?;
    cluster.wait_for_agreement(LONG).await?;
    for id in cluster.ids() {
        let log = cluster.log(id);
        assert!(!log.contains("refused the certificate"), "node {id}: {log}");
    }
    Ok(())
}

/// The leaf certificate node `addr` presents to a new connection.
async fn served_certificate(pki: &Pki, addr: &str) -> anyhow::Result<CertificateDer<'static>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.ca_cert())? {
        roots.add(cert?)?;
    }
    let (cert, key) = (
        pki.dir.join(format!("client-{HARNESS_CLIENT}.crt")),
        pki.dir.join(format!("client-{HARNESS_CLIENT}.key")),
    );
    let chain = CertificateDer::pem_file_iter(&cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&key)?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1")?, tcp)
        .await?;
    let (_, session) = tls.get_ref();
    let leaf = session
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no server certificate"))?;
    Ok(leaf.into_owned())
}

fn file_certificate(path: &std::path::Path) -> anyhow::Result<CertificateDer<'static>> {
    Ok(CertificateDer::from_pem_file(path)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_rotation_under_load_loses_no_request() -> anyhow::Result<()> {
    let cluster = Arc::new(Cluster::start_opts(3, &[], true).await?);
    let pki = cluster.pki.clone().expect("PKI");
    let leader = cluster.wait_for_leader(LONG).await?;
    let mut grackle = cluster.grackle(leader).await?;
    ops::namespace(&mut grackle, "rot").await?;
    ops::semaphore(&mut grackle, "rot", "s", 1).await?;
    let lease = ops::lease(&mut grackle, "rot", 60).await?;

    // A client loops acquire/release, opening a new connection (to each node in turn) every
    // few requests, until told to stop. Every request must succeed.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let load = {
        let (cluster, stop, done) = (Arc::clone(&cluster), Arc::clone(&stop), Arc::clone(&done));
        tokio::spawn(async move {
            let ids = cluster.ids();
            let mut grackle = cluster.grackle(ids[0]).await?;
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) && i < 100_000 {
                if i.is_multiple_of(5) {
                    grackle = cluster.grackle(ids[(i / 5) % ids.len()]).await?;
                }
                let r = ops::acquire(&mut grackle, "rot", "s", &lease, 1, 0).await?;
                anyhow::ensure!(ops::acquired(&r), "request {i}: not acquired: {r:?}");
                ops::release(&mut grackle, "rot", "s", &lease).await?;
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        })
    };
    wait_for("load to start", LONG, || async {
        (done.load(Ordering::Relaxed) >= 20).then_some(())
    })
    .await?;

    let mut before = Vec::new();
    for id in cluster.ids() {
        before.push(served_certificate(&pki, &cluster.addr(id)).await?);
    }

    // A broken certificate file is refused and the old certificate stays in use.
    let node1_cert = pki.dir.join("node1.crt");
    let good = std::fs::read(&node1_cert)?;
    std::fs::write(&node1_cert, "not a certificate\n")?;
    wait_for("node 1 to refuse the broken file", LONG, || async {
        cluster
            .log(1)
            .contains("new TLS files refused")
            .then_some(())
    })
    .await?;
    assert_eq!(served_certificate(&pki, &cluster.addr(1)).await?, before[0]);
    std::fs::write(&node1_cert, good)?;

    // Re-issue every node's certificate and key (new keys), twice, under load; node 3 also
    // gets a SIGHUP.
    for round in 0..2 {
        let at = done.load(Ordering::Relaxed);
        for id in cluster.ids() {
            pki.node(id)?;
        }
        cluster.signal(3, nix::sys::signal::Signal::SIGHUP);
        for id in cluster.ids() {
            let expected = file_certificate(&pki.dir.join(format!("node{id}.crt")))?;
            wait_for(
                &format!("node {id} to serve its new certificate"),
                LONG,
                || {
                    let (pki, addr, expected) = (&pki, cluster.addr(id), expected.clone());
                    async move {
                        let served = served_certificate(pki, &addr).await.ok()?;
                        (served == expected).then_some(())
                    }
                },
            )
            .await?;
        }
        wait_for("requests after the rotation", LONG, || async {
            (done.load(Ordering::Relaxed) >= at + 20).then_some(())
        })
        .await
        .map_err(|e| e.context(format!("round {round}")))?;
    }
    for (i, id) in cluster.ids().iter().enumerate() {
        assert_ne!(
            served_certificate(&pki, &cluster.addr(*id)).await?,
            before[i]
        );
    }

    stop.store(true, Ordering::Relaxed);
    load.await??;
    eprintln!("{} requests, none failed", done.load(Ordering::Relaxed));
    // Peers reconnect with the new certificates too: the cluster still commits.
    let (_, _) = cluster.wait_for_agreement(LONG).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_messages_from_another_cluster_are_refused() -> anyhow::Result<()> {
    let a = Cluster::start(3).await?;
    let a_leader = a.wait_for_leader(LONG).await?;
    let mut grackle = a.grackle(a_leader).await?;
    ops::namespace(&mut grackle, "a").await?;
    let (a_index, a_hash) = a.wait_for_agreement(LONG).await?;
    let a_id = a.status(1).await?.cluster_id;
    assert_eq!(a_id.len(), 32);

    // Cluster B's nodes reach "node 2" at cluster A's node 2: same ids, crossing addresses.
    let route = format!("2={}", a.addr(2));
    let b = Cluster::launch(3, &["--peer-routes".into(), route], false).await?;
    let b_id = wait_for("cluster B to elect a leader", LONG, || async {
        let statuses = b.statuses().await;
        statuses
            .values()
            .find(|s| s.leader_id != 0 && !s.cluster_id.is_empty())
            .map(|s| s.cluster_id.clone())
    })
    .await?;
    assert_ne!(a_id, b_id);
    let expected =
        format!("peer message from cluster {b_id}, but this node belongs to cluster {a_id}");
    wait_for("A's node 2 to refuse B's messages", LONG, || async {
        a.log(2).contains(&expected).then_some(())
    })
    .await?;

    // A's state did not move; its nodes still agree.
    for (id, s) in a.statuses().await {
        assert_eq!(s.cluster_id, a_id, "node {id}");
        assert_eq!(s.state_hash, a_hash, "node {id}");
        assert_eq!(s.applied_index, a_index, "node {id}");
    }

    // A hand-made peer message: without an id, or with another one, it is refused before it is
    // read; with the right id it is read (and this payload is malformed).
    let channel = cluster_tests::channel(&a.addr(1)).await?;
    let mut peer = ConchPeerClient::new(channel);
    let message = |id: Option<&str>| {
        let mut request = tonic::Request::new(PeerMessage {
            payload: vec![0xff],
        });
        if let Some(id) = id {
            request
                .metadata_mut()
                .insert("conch-cluster-id", id.parse().expect("ascii"));
        }
        request
    };
    let none = peer.vote(message(None)).await.expect_err("no id");
    assert_eq!(none.code(), tonic::Code::FailedPrecondition, "{none:?}");
    let other = peer.vote(message(Some(&b_id))).await.expect_err("other id");
    assert_eq!(other.code(), tonic::Code::FailedPrecondition, "{other:?}");
    // The refusal names neither cluster.
    assert!(
        !other.message().contains(&b_id) && !other.message().contains(&a_id),
        "{other:?}"
    );
    let same = peer
        .vote(message(Some(&a_id)))
        .await
        .expect_err("malformed");
    assert_eq!(same.code(), tonic::Code::InvalidArgument, "{same:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_settings_exit_64_with_one_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::create(&dir.path().join("pki"))?;
    let (cert, key) = pki.node(1)?;
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let missing = dir.path().join("missing.pem").display().to_string();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello\n")?;
    let garbage = garbage.display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--tls-cert", &cert], "--tls-cert needs --tls-key"),
        (vec!["--tls-key", &key], "--tls-key needs --tls-cert"),
        (vec!["--peer-ca", &cert], "--peer-ca needs --tls-cert"),
        (
            vec!["--tls-cert", &missing, "--tls-key", &key],
            "read --tls-cert",
        ),
        (
            vec!["--tls-cert", &garbage, "--tls-key", &key],
            "--tls-cert",
        ),
        (vec!["--tls-cert", &cert, "--tls-key", &cert], "--tls-key"),
        (
            vec![
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--client-ca",
                &garbage,
            ],
            "--client-ca",
        ),
        (
            vec![
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--initial-cluster",
                "1=127.0.0.1:7001,2=127.0.0.1:7002",
            ],
            "needs --peer-ca",
        ),
    ];
    for (args, expected) in cases {
        let mut daemon = Daemon::spawn(&args, dir.path())?;
        assert_eq!(
            daemon.wait_exit(Duration::from_secs(20)).await?,
            Some(64),
            "{args:?}: {}",
            daemon.stderr()
        );
        let stderr = daemon.stderr();
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    }
    Ok(())
}

/// A TLS node exports when its first certificate expires (the node certificates `conch certs`
/// makes, 730 days from now; the CA lives longer), for the alert that says to rotate in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_node_exports_when_its_first_certificate_expires() -> anyhow::Result<()> {
    use anyhow::Context;
    let cluster = Cluster::start_opts(1, &[], true).await?;
    let addr = cluster
        .metrics_addr(1)
        .context("node 1's metrics address")?;
    let scraped = cluster_tests::scrape::scrape(&addr).await?;
    let expiry = scraped.value("conch_tls_cert_expiry_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let leaf_end = now + f64::from(conch_client::certs::LEAF_DAYS) * 86_400.0;
    anyhow::ensure!(
        (expiry - leaf_end).abs() < 86_400.0,
        "expiry {expiry}, the node certificate ends about {leaf_end}"
    );
    Ok(())
}

//! Only a member speaks as a member: the peer service against callers that are not nodes of the
//! cluster, access control that cannot exist without peer authentication, a bootstrap that
//! cannot be skipped by stopping the first node early, a separate peer port, and writes
//! authorized by the state they apply to.
//!
//! Every refused write is checked for leaving the state alone (state hash and applied index of
//! every node unchanged, access control still on).

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use cluster_tests::jepsen::adversary::{auth_disable_proposal, create_namespace_proposal};
use cluster_tests::net::{NodeChannel as Channel, lazy_channel};
use cluster_tests::{Cluster, Daemon, Port, wait_for};
use conch_proto::conch::conch_auth_client::ConchAuthClient;
use conch_proto::conch::conch_peer_client::ConchPeerClient;
use conch_proto::conch::{
    AuthEnableRequest, AuthStatusRequest, PeerMessage, RoleCreateRequest, RoleGrantRequest,
    TokenCreateRequest, TokenRevokeRequest,
};
use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use nix::sys::signal::Signal;
use tonic::{Code, Request};

const SHOW_UP: Duration = Duration::from_secs(30);
const EX_USAGE: i32 = 64;
const ADMIN: &str = "peer-identity-admin-0123456789-abcdefghij";

/// `message` with `authorization: Bearer <token>` when a token is given.
fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("ascii token");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// Writes the admin token and a peer secret into `dir`; returns the conchd flags for both.
fn secured(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let token = dir.join("admin.token");
    cluster_tests::auth::write_secret(&token, ADMIN)?;
    let mut args = vec![
        "--bootstrap-admin-token-file".to_string(),
        token.display().to_string(),
    ];
    args.extend(cluster_tests::auth::peer_secret_args(dir)?);
    Ok(args)
}

/// `n` ports held by the test, and their addresses.
fn ports(n: usize) -> anyhow::Result<(Vec<Option<Port>>, Vec<String>)> {
    let ports = Port::bind_many(n)?;
    let addrs = ports.iter().map(|p| p.addr().to_string()).collect();
    Ok((ports.into_iter().map(Some).collect(), addrs))
}

/// The held port `i` on its first use; its address bound again after (a restart).
fn port(ports: &mut [Option<Port>], addrs: &[String], i: usize) -> anyhow::Result<Port> {
    match ports[i].take() {
        Some(port) => Ok(port),
        None => Port::bind_at(&addrs[i]),
    }
}

/// `1=addr1,2=addr2,…`, as `--initial-cluster` takes them.
fn members_of(addrs: &[String]) -> String {
    addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",")
}

/// The flags of node `id`, its data in `node<id>` under the working directory, metrics off,
/// then `extra`.
fn node_args(id: usize, members: &str, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--id",
        &id.to_string(),
        "--data-dir",
        &format!("node{id}"),
        "--initial-cluster",
        members,
        "--metrics-listen",
        "off",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().cloned());
    args
}

/// Starts a node on the sockets given (`client`, `peer`).
fn spawn(
    sockets: Vec<(&'static str, Port)>,
    args: &[String],
    dir: &std::path::Path,
) -> anyhow::Result<Daemon> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::spawn_with(&args, dir, &[], sockets)
}

async fn auth_enabled(channel: Channel) -> anyhow::Result<bool> {
    let mut auth = ConchAuthClient::new(channel);
    let status = auth
        .auth_status(with_token(AuthStatusRequest {}, Some(ADMIN)))
        .await?;
    Ok(status.into_inner().enabled)
}

fn peer_request(payload: Vec<u8>, headers: &[(&'static str, &str)]) -> Request<PeerMessage> {
    let mut request = Request::new(PeerMessage { payload });
    for (key, value) in headers {
        request
            .metadata_mut()
            .insert(*key, value.parse().expect("ascii header"));
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_control_without_peer_authentication_cannot_exist() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let token = dir.path().join("admin.token");
    cluster_tests::auth::write_secret(&token, ADMIN)?;
    let token_path = token.display().to_string();
    let mut daemon = Daemon::spawn_on(
        Port::bind()?,
        &[
            "--data-dir",
            "data",
            "--metrics-listen",
            "off",
            "--bootstrap-admin-token-file",
            &token_path,
        ],
        dir.path(),
    )?;
    let code = daemon.wait_exit(SHOW_UP).await?;
    let stderr = daemon.stderr();
    ensure!(code == Some(EX_USAGE), "exit {code:?}: {stderr}");
    ensure!(
        stderr.contains("needs peer authentication") && stderr.trim().lines().count() == 1,
        "one line naming the problem: {stderr}"
    );

    // A cluster without peer authentication refuses to turn access control on.
    let cluster = Cluster::start(1).await?;
    let mut auth = ConchAuthClient::new(cluster.channel(1).context("node 1")?);
    auth.role_create(RoleCreateRequest {
        name: "root".into(),
        cluster_admin: true,
    })
    .await?;
    let admin = auth
        .token_create(TokenCreateRequest {
            name: "admin".into(),
            role: "root".into(),
        })
        .await?
        .into_inner()
        .secret;
    let refused = auth
        .auth_enable(with_token(AuthEnableRequest {}, Some(&admin)))
        .await
        .expect_err("refused");
    ensure!(
        refused.code() == Code::FailedPrecondition
            && refused.message().contains("peer authentication"),
        "{refused:?}"
    );
    let status = auth.auth_status(AuthStatusRequest {}).await?.into_inner();
    ensure!(!status.enabled, "access control stays off");

    // And what that means: anyone who reaches its peer service (and reads the cluster id off
    // `conch cluster status`) commits what they like.
    let cluster_id = cluster.status(1).await?.cluster_id;
    let mut peer = ConchPeerClient::new(cluster.channel(1).context("node 1")?);
    peer.propose(peer_request(
        create_namespace_proposal("forged"),
        &[("conch-cluster-id", &cluster_id)],
    ))
    .await?;
    GrackleApiClient::new(cluster.channel(1).context("node 1")?)
        .get_namespace(pb::GetNamespaceRequest {
            namespace_name: "forged".into(),
        })
        .await
        .context("the forged namespace exists")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_service_answers_only_members() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let mut cluster = Cluster::launch(3, &secured(work.path())?, false).await?;
    cluster.set_admin_token(ADMIN);
    cluster.wait_for_leader(SHOW_UP).await?;
    let ch = cluster.channel(1).context("node 1")?;
    wait_for("access control to be on", SHOW_UP, || {
        let ch = ch.clone();
        async move { auth_enabled(ch).await.ok()?.then_some(()) }
    })
    .await?;
    let cluster_id = std::fs::read_to_string(cluster.dir().join("node1").join("cluster-id"))?
        .trim()
        .to_string();
    ensure!(cluster_id.len() == 32, "cluster id {cluster_id:?}");
    let before = cluster.wait_for_agreement(SHOW_UP).await?;

    let probes: Vec<(&str, Vec<(&'static str, &str)>)> = vec![
        ("no credentials", vec![]),
        (
            "the cluster id and a node id",
            vec![("conch-cluster-id", &cluster_id), ("conch-peer-id", "2")],
        ),
        (
            "a wrong peer secret",
            vec![
                ("conch-cluster-id", &cluster_id),
                ("conch-peer-id", "2"),
                ("conch-peer-secret", "0123456789abcdef0123456789abcdef"),
            ],
        ),
    ];
    for id in cluster.ids() {
        let mut peer = ConchPeerClient::new(cluster.channel(id).context("node")?);
        for (what, headers) in &probes {
            // The forward stream's request: an id, then `Propose`'s payload.
            let mut streamed = 1u64.to_le_bytes().to_vec();
            streamed.extend(auth_disable_proposal());
            let stream =
                peer_request(streamed, headers).map(|message| futures::stream::iter([message]));
            for (call, result) in [
                (
                    "ReadIndex",
                    peer.read_index(peer_request(Vec::new(), headers))
                        .await
                        .map(|reply| format!("{reply:?}")),
                ),
                (
                    "Propose [AuthDisable]",
                    peer.propose(peer_request(auth_disable_proposal(), headers))
                        .await
                        .map(|reply| format!("{reply:?}")),
                ),
                (
                    "ProposeStream [AuthDisable]",
                    peer.propose_stream(stream)
                        .await
                        .map(|_| "a stream".to_string()),
                ),
            ] {
                let status = match result {
                    Ok(reply) => bail!("node {id}: {call} with {what} answered: {reply:?}"),
                    Err(status) => status,
                };
                ensure!(
                    status.code() == Code::PermissionDenied,
                    "node {id}: {call} with {what}: {status:?}"
                );
                for secret in [cluster_id.as_str(), &cluster.addr(1), &cluster.addr(2)] {
                    ensure!(
                        !status.message().contains(secret),
                        "node {id}: the refusal names {secret}: {}",
                        status.message()
                    );
                }
            }
        }
    }
    let after = cluster.wait_for_agreement(SHOW_UP).await?;
    ensure!(before == after, "state changed: {before:?} -> {after:?}");
    ensure!(
        auth_enabled(cluster.channel(2).context("node 2")?).await?,
        "access control stays on"
    );
    Ok(())
}

/// Stops node 1 (started alone with the token file) at several moments of its first start, then
/// starts all three: access control is on every time, and the bootstrap token works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bootstrap_completes_whenever_the_first_node_was_stopped() -> anyhow::Result<()> {
    for (signal, after_ms) in [
        (Signal::SIGKILL, 50),
        (Signal::SIGKILL, 300),
        (Signal::SIGKILL, 3000),
        (Signal::SIGTERM, 50),
        (Signal::SIGTERM, 300),
        (Signal::SIGTERM, 3000),
    ] {
        let work = tempfile::tempdir()?;
        let auth_args = secured(work.path())?;
        let (mut ports, addrs) = ports(3)?;
        let members = members_of(&addrs);
        let mut start = |i: usize| {
            spawn(
                vec![("client", port(&mut ports, &addrs, i)?)],
                &node_args(i + 1, &members, &auth_args),
                work.path(),
            )
        };
        {
            let mut first = start(0)?;
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            first.signal(signal);
            first.wait_exit(SHOW_UP).await?;
        }
        let _nodes = [start(0)?, start(1)?, start(2)?];
        let case = format!("{signal:?} after {after_ms} ms");
        for addr in &addrs {
            let ch = lazy_channel(addr)?;
            wait_for(
                &format!("{case}: access control on at {addr}"),
                SHOW_UP,
                || {
                    let ch = ch.clone();
                    async move { auth_enabled(ch).await.ok()?.then_some(()) }
                },
            )
            .await?;
        }
        // Without the token a write is refused; with it, it is served.
        let mut grackle = GrackleApiClient::new(lazy_channel(&addrs[1])?);
        let create = |name: &str| pb::CreateNamespaceRequest {
            name: name.into(),
            ..Default::default()
        };
        let refused = grackle
            .create_namespace(create("anonymous"))
            .await
            .expect_err("refused");
        ensure!(
            refused.code() == Code::Unauthenticated,
            "{case}: {refused:?}"
        );
        grackle
            .create_namespace(with_token(create("admin"), Some(ADMIN)))
            .await
            .with_context(|| format!("{case}: the bootstrap token writes"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_on_their_own_port() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let secret = cluster_tests::auth::peer_secret_args(work.path())?;
    let (mut client_ports, client) = ports(3)?;
    let (mut peer_ports, peer) = ports(3)?;
    let members = members_of(&peer);
    let mut nodes = Vec::new();
    for i in 0..3 {
        // The peer socket alone turns the peer port on (no --peer-listen needed).
        let sockets = vec![
            ("client", port(&mut client_ports, &client, i)?),
            ("peer", port(&mut peer_ports, &peer, i)?),
        ];
        nodes.push(spawn(
            sockets,
            &node_args(i + 1, &members, &secret),
            work.path(),
        )?);
    }
    // Writes through every node's client port; each answer names the leader's client port.
    for (i, addr) in client.iter().enumerate() {
        let mut grackle = GrackleApiClient::new(lazy_channel(addr)?);
        let name = format!("ns{i}");
        let response = wait_for(&format!("a write through {addr}"), SHOW_UP, || {
            let mut grackle = grackle.clone();
            let name = name.clone();
            async move {
                grackle
                    .create_namespace(pb::CreateNamespaceRequest {
                        name,
                        ..Default::default()
                    })
                    .await
                    .ok()
            }
        })
        .await?;
        let leader = response
            .metadata()
            .get("conch-leader")
            .and_then(|v| v.to_str().ok())
            .context("a leader hint")?
            .to_string();
        ensure!(
            client.contains(&leader),
            "the hint {leader} is a client address ({client:?})"
        );
        grackle
            .get_namespace(pb::GetNamespaceRequest {
                namespace_name: format!("ns{i}"),
            })
            .await?;
    }
    // The client port does not serve the peer service; the peer port does not serve Grackle.
    let mut on_client = ConchPeerClient::new(lazy_channel(&client[0])?);
    let status = on_client
        .read_index(PeerMessage {
            payload: Vec::new(),
        })
        .await
        .expect_err("no peer service");
    ensure!(status.code() == Code::Unimplemented, "{status:?}");
    let mut on_peer = GrackleApiClient::new(lazy_channel(&peer[0])?);
    let status = on_peer
        .get_namespace(pb::GetNamespaceRequest {
            namespace_name: "ns0".into(),
        })
        .await
        .expect_err("no Grackle API");
    ensure!(status.code() == Code::Unimplemented, "{status:?}");
    drop(nodes);
    Ok(())
}

/// A token revoked on the leader cannot write through a follower that has not applied the
/// revocation: the follower's own check lets it through, the state machine refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_cannot_write_through_a_lagging_follower() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    // Node 3 never campaigns during the test: it must stay a follower while cut off.
    let env = |id: u64, _: &std::path::Path| {
        if id == 3 {
            vec![(
                "CONCH_ELECTION_TIMEOUT_MS".to_string(),
                "120000".to_string(),
            )]
        } else {
            Vec::new()
        }
    };
    let mut cluster = Cluster::launch_with(3, &secured(work.path())?, true, false, &env).await?;
    cluster.set_admin_token(ADMIN);
    let leader = cluster.wait_for_leader(SHOW_UP).await?;
    ensure!(leader != 3, "node 3 does not campaign");
    let ch = cluster.channel(1).context("node 1")?;
    wait_for("access control to be on", SHOW_UP, || {
        let ch = ch.clone();
        async move { auth_enabled(ch).await.ok()?.then_some(()) }
    })
    .await?;

    // An app token with write on namespace x.
    let mut admin = GrackleApiClient::new(cluster.channel(leader).context("leader")?);
    admin
        .create_namespace(with_token(
            pb::CreateNamespaceRequest {
                name: "x".into(),
                ..Default::default()
            },
            Some(ADMIN),
        ))
        .await?;
    let mut auth = ConchAuthClient::new(cluster.channel(leader).context("leader")?);
    auth.role_create(with_token(
        RoleCreateRequest {
            name: "app".into(),
            cluster_admin: false,
        },
        Some(ADMIN),
    ))
    .await?;
    auth.role_grant(with_token(
        RoleGrantRequest {
            role: "app".into(),
            namespace: "x".into(),
            permission: "write".into(),
        },
        Some(ADMIN),
    ))
    .await?;
    let created = auth
        .token_create(with_token(
            TokenCreateRequest {
                name: "app".into(),
                role: "app".into(),
            },
            Some(ADMIN),
        ))
        .await?
        .into_inner();
    let app = created.secret.as_str();
    let app_id = created.token.context("token")?.id;
    let lease = pb::CreateSemaphoreLeaseRequest {
        namespace_name: "x".into(),
        process_id: "app".into(),
        ttl_seconds: 60,
        ..Default::default()
    };
    let mut through_3 = GrackleApiClient::new(cluster.channel(3).context("node 3")?);
    wait_for("the app token to work through node 3", SHOW_UP, || {
        let mut through_3 = through_3.clone();
        let lease = lease.clone();
        async move {
            through_3
                .create_semaphore_lease(with_token(lease, Some(app)))
                .await
                .ok()
        }
    })
    .await?;

    // Node 3 stops hearing from the leader, then the leader revokes the token.
    for from in [1, 2] {
        cluster.set_link(from, 3, conch_testkit::LinkMode::Blackhole);
    }
    auth.token_revoke(with_token(TokenRevokeRequest { id: app_id }, Some(ADMIN)))
        .await?;
    let forwarded = |scrape: &cluster_tests::scrape::Scrape| {
        scrape.value("conch_forwarded_total{kind=\"write\"}")
    };
    let metrics = cluster.metrics_addr(3).context("node 3 serves metrics")?;
    let forwarded_before = forwarded(&cluster_tests::scrape::scrape(&metrics).await?);
    let refused = through_3
        .create_semaphore_lease(with_token(lease.clone(), Some(app)))
        .await
        .expect_err("the revoked token is refused");
    ensure!(
        refused.code() == Code::Unauthenticated,
        "refused where it applies: {refused:?}"
    );
    let forwarded_after = forwarded(&cluster_tests::scrape::scrape(&metrics).await?);
    ensure!(
        forwarded_after > forwarded_before,
        "node 3 had not applied the revocation: it passed the call on \
         ({forwarded_before} -> {forwarded_after})"
    );
    cluster.heal_network();
    let leases = admin
        .list_semaphore_leases(with_token(
            pb::ListSemaphoreLeasesRequest {
                namespace_name: "x".into(),
                ..Default::default()
            },
            Some(ADMIN),
        ))
        .await?
        .into_inner()
        .leases;
    ensure!(leases.len() == 1, "only the first lease exists: {leases:?}");
    Ok(())
}

/// Runs `conch` with `args` against `endpoint` and the admin token; returns (code, stdout,
/// stderr).
async fn conch_as_admin(endpoint: &str, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    cluster_tests::run_conch(endpoint, args, &[("CONCH_TOKEN", ADMIN)]).await
}

/// Access control turned off after the bootstrap, on a node started with the token file: an
/// error at every start, shown by `conch auth status` and `conch cluster health`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_with_access_control_off_is_reported() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let mut cluster = Cluster::launch(1, &secured(work.path())?, false).await?;
    cluster.set_admin_token(ADMIN);
    cluster.wait_for_leader(SHOW_UP).await?;
    let endpoint = cluster.addr(1);
    let ch = cluster.channel(1).context("node 1")?;
    wait_for("access control to be on", SHOW_UP, || {
        let ch = ch.clone();
        async move { auth_enabled(ch).await.ok()?.then_some(()) }
    })
    .await?;
    let (code, out, err) = conch_as_admin(&endpoint, &["auth", "disable"]).await?;
    ensure!(code == 0, "auth disable: {code} {out} {err}");
    cluster.kill(1);
    cluster.restart(1)?;
    cluster.wait_for_leader(SHOW_UP).await?;
    wait_for("the error line at start", SHOW_UP, || async {
        cluster
            .log(1)
            .lines()
            .any(|l| l.contains("ERROR") && l.contains("access control off"))
            .then_some(())
    })
    .await?;
    let (code, out, err) = conch_as_admin(&endpoint, &["auth", "status"]).await?;
    ensure!(
        code == 0 && out.contains("access control is off") && out.contains("problem:"),
        "auth status: {code} {out} {err}"
    );
    let (code, out, err) = conch_as_admin(&endpoint, &["cluster", "health"]).await?;
    ensure!(
        code == 1 && out.contains("degraded") && out.contains("--bootstrap-admin-token-file"),
        "cluster health: {code} {out} {err}"
    );
    Ok(())
}

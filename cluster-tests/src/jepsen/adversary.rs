//! A caller that is not a member, beside the workload: throughout the run it sends every node's
//! peer service forged messages, the way an attacker who reaches the port would: proposals of a
//! namespace of its own (`adversary-<n>`) and of `AuthDisable`, alone and on the streams
//! followers forward writes on (`ProposeStream`), read-index requests, votes, and log entries on
//! the leader's replication stream (`AppendEntriesStream`), carrying the real cluster id and a member's node id, with a wrong peer secret, and (on a TLS
//! cluster) over a connection with the harness's client certificate instead of a node's.
//!
//! It only runs against a cluster whose peers authenticate (a peer secret or node certificates):
//! without that, anyone who reaches the peer service is a member by definition. Every forged call
//! must be refused, and at the end no `adversary-` namespace may exist; either is a violation.

use std::time::Duration;

use conch_proto::conch::PeerMessage;
use conch_proto::conch::conch_peer_client::ConchPeerClient;
use conch_proto::grackle::ListNamespacesRequest;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::Request;
use tonic::transport::ClientTlsConfig;

use crate::net::{NodeChannel, lazy_channel, lazy_channel_with};
use crate::rng::Rng;

/// The prefix of the namespaces the adversary tries to create.
pub const PREFIX: &str = "adversary-";
/// Between two forged calls.
const PACE: Duration = Duration::from_millis(40);

/// What the adversary did, and what it got away with.
#[derive(Debug, Default)]
pub struct AdversaryReport {
    pub sent: u64,
    pub refused: u64,
    /// Calls that failed for another reason (a node down, a partition): neither accepted nor
    /// refused.
    pub unanswered: u64,
    /// Forged calls a node answered as if they came from a member.
    pub accepted: Vec<String>,
}

pub struct Adversary {
    stop: watch::Sender<bool>,
    task: JoinHandle<AdversaryReport>,
}

/// The forgeries, in turn.
#[derive(Clone, Copy, Debug)]
enum Forgery {
    ProposeNamespace,
    ProposeAuthDisable,
    ReadIndex,
    Vote,
    /// A namespace proposal as the first message of a forwarding stream.
    ProposeStream,
    /// Bytes as the first message of a replication stream.
    AppendEntriesStream,
}

const FORGERIES: [Forgery; 6] = [
    Forgery::ProposeNamespace,
    Forgery::ProposeAuthDisable,
    Forgery::ReadIndex,
    Forgery::Vote,
    Forgery::ProposeStream,
    Forgery::AppendEntriesStream,
];

/// bincode of `Vec<Cmd>` holding one command: a u64 length, the variant's u32 index, its fields.
fn one_cmd(variant: u32, fields: &[u8]) -> Vec<u8> {
    let mut payload = 1u64.to_le_bytes().to_vec();
    payload.extend(variant.to_le_bytes());
    payload.extend(fields);
    payload
}

fn bincode_str(text: &str) -> Vec<u8> {
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(text.as_bytes());
    bytes
}

/// A forged `ConchPeer/Propose` payload: `CreateNamespace { name, "", {} }`.
pub fn create_namespace_proposal(name: &str) -> Vec<u8> {
    const CREATE_NAMESPACE: u32 = 0;
    let mut fields = bincode_str(name);
    fields.extend(0u64.to_le_bytes()); // description
    fields.extend(0u64.to_le_bytes()); // metadata
    one_cmd(CREATE_NAMESPACE, &fields)
}

/// A forged `ConchPeer/Propose` payload: `AuthDisable`.
pub fn auth_disable_proposal() -> Vec<u8> {
    const AUTH_DISABLE: u32 = 16;
    one_cmd(AUTH_DISABLE, &[])
}

fn payload(forgery: Forgery, n: u64) -> Vec<u8> {
    match forgery {
        Forgery::ProposeNamespace | Forgery::ProposeStream => {
            create_namespace_proposal(&format!("{PREFIX}{n}"))
        }
        Forgery::ProposeAuthDisable => auth_disable_proposal(),
        // Whatever the bytes, an unauthenticated vote or entry must not reach Raft.
        Forgery::ReadIndex | Forgery::Vote | Forgery::AppendEntriesStream => {
            n.to_le_bytes().to_vec()
        }
    }
}

impl Adversary {
    /// Starts forging against `addrs` (the nodes' client addresses) of the cluster `cluster_id`
    /// whose members are `ids`. With `eku_less` (a TLS cluster), every other call goes over a
    /// connection presenting that certificate: one of the cluster's CA without extended key
    /// usage, as many CAs issue them.
    pub fn start(
        addrs: Vec<String>,
        ids: Vec<u64>,
        cluster_id: String,
        seed: u64,
        eku_less: Option<ClientTlsConfig>,
    ) -> Adversary {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut rng = Rng::derive(seed, u64::MAX - 7);
            let mut report = AdversaryReport::default();
            let mut channels: Vec<(String, Option<NodeChannel>)> = addrs
                .iter()
                .map(|addr| (addr.clone(), lazy_channel(addr).ok()))
                .collect();
            if let Some(tls) = &eku_less {
                channels.extend(addrs.iter().map(|addr| {
                    let channel = lazy_channel_with(addr, tls.clone()).ok();
                    (
                        format!("{addr} (a certificate without extended key usage)"),
                        channel,
                    )
                }));
            }
            let mut n = 0u64;
            while !*stopped.borrow() {
                n += 1;
                let Some((addr, Some(channel))) = rng.pick(&channels).cloned() else {
                    break;
                };
                let forgery = FORGERIES[(n % FORGERIES.len() as u64) as usize];
                let posing_as = rng.pick(&ids).copied().unwrap_or(1);
                let message = PeerMessage {
                    payload: payload(forgery, n),
                };
                let headers = [
                    ("conch-cluster-id", cluster_id.clone()),
                    ("conch-peer-id", posing_as.to_string()),
                    ("conch-peer-secret", format!("{:064x}", u128::from(n))),
                ];
                let mut peer = ConchPeerClient::new(channel);
                let answer = match forgery {
                    Forgery::ProposeNamespace | Forgery::ProposeAuthDisable => {
                        peer.propose(forged(message, &headers)).await.map(|_| ())
                    }
                    Forgery::ReadIndex => {
                        peer.read_index(forged(message, &headers)).await.map(|_| ())
                    }
                    Forgery::Vote => peer.vote(forged(message, &headers)).await.map(|_| ()),
                    // A stream is refused when it opens; one that opens is accepted.
                    Forgery::ProposeStream => {
                        let stream = futures::stream::iter([message]);
                        peer.propose_stream(forged(stream, &headers))
                            .await
                            .map(|_| ())
                    }
                    Forgery::AppendEntriesStream => {
                        let stream = futures::stream::iter([message]);
                        peer.append_entries_stream(forged(stream, &headers))
                            .await
                            .map(|_| ())
                    }
                };
                report.sent += 1;
                match answer {
                    Ok(()) => report.accepted.push(format!(
                        "{addr} answered a forged {forgery:?} (as node {posing_as})"
                    )),
                    Err(status) if status.code() == tonic::Code::PermissionDenied => {
                        report.refused += 1
                    }
                    Err(_) => report.unanswered += 1,
                }
                tokio::select! {
                    _ = tokio::time::sleep(PACE) => {}
                    _ = stopped.changed() => {}
                }
            }
            report
        });
        Adversary { stop, task }
    }

    /// Stops forging; returns the report.
    pub async fn stop(self) -> AdversaryReport {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// `message` with the forger's `headers`, and a timeout.
fn forged<T>(message: T, headers: &[(&'static str, String)]) -> Request<T> {
    let mut request = Request::new(message);
    for (key, value) in headers {
        if let Ok(value) = value.parse() {
            request.metadata_mut().insert(*key, value);
        }
    }
    request.set_timeout(Duration::from_secs(2));
    request
}

/// The `adversary-` namespaces that exist, read through `channel`.
pub async fn planted(channel: NodeChannel) -> Result<Vec<String>, tonic::Status> {
    let mut grackle = GrackleApiClient::new(channel);
    let mut found = Vec::new();
    let mut token = String::new();
    loop {
        let page = grackle
            .list_namespaces(ListNamespacesRequest {
                pagination_token: token,
                limit: 250,
            })
            .await?
            .into_inner();
        found.extend(
            page.namespaces
                .into_iter()
                .map(|ns| ns.name)
                .filter(|name| name.starts_with(PREFIX)),
        );
        if page.next_pagination_token.is_empty() {
            return Ok(found);
        }
        token = page.next_pagination_token;
    }
}

//! A fake transport for the tests of routing, hedging and retries.
//!
//! Each node is an in-process gRPC server (the standard health service) reached over an
//! in-memory connection, and behaves as the test says: refuses connections (stopped), never
//! connects (frozen, black-holed), answers after a delay, or answers "no leader" with a hint.
//! Every dial and every call a node receives is recorded with the time it happened on tokio's
//! clock, so a test run with paused time asserts the exact order, count and (virtual) time of
//! the client's attempts, without depending on how fast the machine is.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::time::Instant;
use tonic::codegen::tokio_stream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::client::{CallOptions, Client, ClientConfig, LEADER_METADATA_KEY, request};

/// How a fake node behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Behaviour {
    /// Connections are refused (a stopped node).
    Refuse,
    /// Connections are never made (a frozen node, a black hole).
    Silent,
    /// Answers each call after `delay`.
    Answer { delay: Duration },
    /// Answers "no leader" (`Unavailable` from the server), naming `leader` if given.
    NoLeader { leader: Option<String> },
}

/// What a node saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// The client opened a connection to it (or tried to).
    Dial(String),
    /// A call reached it.
    Call(String),
}

/// Fake nodes and what happened to them.
pub(crate) struct Fake {
    order: Vec<String>,
    behaviours: Mutex<BTreeMap<String, Behaviour>>,
    events: Mutex<Vec<(Duration, Event)>>,
    start: Instant,
}

impl Fake {
    /// Nodes named `addr` (`host:port`), configured in this order.
    pub(crate) fn new(nodes: &[(&str, Behaviour)]) -> Arc<Fake> {
        Arc::new(Fake {
            order: nodes.iter().map(|(a, _)| a.to_string()).collect(),
            behaviours: Mutex::new(
                nodes
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.clone()))
                    .collect(),
            ),
            events: Mutex::new(Vec::new()),
            start: Instant::now(),
        })
    }

    /// Another node, not among the configured endpoints (e.g. a leader only hints name).
    pub(crate) fn add(&self, addr: &str, behaviour: Behaviour) {
        self.behaviours
            .lock()
            .unwrap()
            .insert(addr.to_string(), behaviour);
    }

    /// A client of the configured nodes.
    pub(crate) fn client(self: &Arc<Self>, config: ClientConfig) -> Client {
        let fake = Arc::clone(self);
        Client::connect_dialing(
            &self.order,
            config,
            Arc::new(move |ep, _| Ok(fake.channel(&ep.addr))),
        )
        .expect("valid fake endpoints")
    }

    /// Everything that happened, with its time since the fake was made.
    pub(crate) fn events(&self) -> Vec<(Duration, Event)> {
        self.events.lock().unwrap().clone()
    }

    /// Only the calls: (time, node).
    pub(crate) fn calls(&self) -> Vec<(Duration, String)> {
        self.events()
            .into_iter()
            .filter_map(|(t, e)| match e {
                Event::Call(node) => Some((t, node)),
                Event::Dial(_) => None,
            })
            .collect()
    }

    /// Time since the fake was made.
    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    fn record(&self, event: Event) {
        let at = self.start.elapsed();
        self.events.lock().unwrap().push((at, event));
    }

    fn behaviour(&self, addr: &str) -> Behaviour {
        self.behaviours
            .lock()
            .unwrap()
            .get(addr)
            .cloned()
            .unwrap_or(Behaviour::Refuse)
    }

    fn channel(self: &Arc<Self>, addr: &str) -> Channel {
        let fake = Arc::clone(self);
        let addr = addr.to_string();
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("a valid uri")
            .connect_with_connector_lazy(tower::service_fn(move |_| {
                Arc::clone(&fake).dial(addr.clone())
            }))
    }

    async fn dial(self: Arc<Self>, addr: String) -> io::Result<TokioIo<DuplexStream>> {
        self.record(Event::Dial(addr.clone()));
        match self.behaviour(&addr) {
            Behaviour::Refuse => Err(io::ErrorKind::ConnectionRefused.into()),
            Behaviour::Silent => std::future::pending().await,
            Behaviour::Answer { .. } | Behaviour::NoLeader { .. } => {
                let (client, server) = tokio::io::duplex(64 * 1024);
                let node = Node { fake: self, addr };
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .add_service(HealthServer::new(node))
                        .serve_with_incoming(tokio_stream::once(Ok::<_, io::Error>(server))),
                );
                Ok(TokioIo::new(client))
            }
        }
    }
}

/// One fake node's server.
struct Node {
    fake: Arc<Fake>,
    addr: String,
}

/// The response metadata key naming the node that answered.
const NODE_KEY: &str = "x-fake-node";

#[tonic::async_trait]
impl Health for Node {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.fake.record(Event::Call(self.addr.clone()));
        match self.fake.behaviour(&self.addr) {
            Behaviour::Answer { delay } => {
                tokio::time::sleep(delay).await;
                let mut response = Response::new(HealthCheckResponse { status: 1 });
                let node = self.addr.parse().expect("ascii");
                response.metadata_mut().insert(NODE_KEY, node);
                Ok(response)
            }
            Behaviour::NoLeader { leader } => {
                let mut status = Status::unavailable("no leader");
                if let Some(leader) = leader {
                    let leader = leader.parse().expect("ascii");
                    status.metadata_mut().insert(LEADER_METADATA_KEY, leader);
                }
                Err(status)
            }
            // The connection was made while it answered; it stops answering now.
            Behaviour::Refuse | Behaviour::Silent => std::future::pending().await,
        }
    }

    type WatchStream = tokio_stream::Empty<Result<HealthCheckResponse, Status>>;

    async fn watch(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

/// One call through [`Client::call`], as every wrapped RPC makes it: the node that answered.
pub(crate) async fn check(client: &Client, opts: CallOptions) -> crate::Result<String> {
    client
        .call("check", opts, |channel, timeout| async move {
            let response = HealthClient::new(channel)
                .check(request(HealthCheckRequest::default(), timeout))
                .await?;
            let (metadata, _, extensions) = response.into_parts();
            let node = metadata
                .get(NODE_KEY)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            Ok(Response::from_parts(metadata, node, extensions))
        })
        .await
}

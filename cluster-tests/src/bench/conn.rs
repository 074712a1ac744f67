//! A benchmark client connection: talks to the leader directly and fails over between the
//! endpoints.
//!
//! - Every call has a client-side deadline; a call past it is dropped (the server sees the
//!   stream reset) and answered `DeadlineExceeded`.
//! - A response whose `conch-leader` metadata names another node moves the next calls there.
//! - On `Unavailable`, a transport error or a deadline, the next call goes to the next endpoint.

use std::future::Future;
use std::time::Duration;

use conch_proto::conch::conch_admin_client::ConchAdminClient;
use conch_proto::conch::{ClusterStatusRequest, ClusterStatusResponse};
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Response, Status};

/// Response metadata naming the leader's address.
pub const LEADER_HEADER: &str = "conch-leader";

pub type Grackle = GrackleApiClient<Channel>;

/// Opens a channel to `addr`, failing within `connect_timeout` when nothing listens there.
pub async fn connect(addr: &str, connect_timeout: Duration) -> Result<Channel, Status> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Status::invalid_argument(format!("bad endpoint {addr}: {e}")))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("connect to {addr}: {e}")))
}

/// `ClusterStatus` of the node at `addr`.
pub async fn status(addr: &str) -> Result<ClusterStatusResponse, Status> {
    let channel = connect(addr, Duration::from_millis(500)).await?;
    let mut admin = ConchAdminClient::new(channel);
    let call = admin.cluster_status(ClusterStatusRequest {});
    match tokio::time::timeout(Duration::from_secs(2), call).await {
        Ok(r) => Ok(r?.into_inner()),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "cluster status of {addr}"
        ))),
    }
}

/// Whether an error means "try another node".
pub fn is_failover(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

pub struct Conn {
    endpoints: Vec<String>,
    addr: String,
    client: Option<Grackle>,
    deadline: Duration,
    /// Leader moves seen through the `conch-leader` hint.
    pub redirects: u64,
}

impl Conn {
    /// A connection that starts at `start` (usually the leader) and fails over among `endpoints`.
    pub fn new(endpoints: &[String], start: &str, deadline: Duration) -> Conn {
        Conn {
            endpoints: endpoints.to_vec(),
            addr: start.to_string(),
            client: None,
            deadline,
            redirects: 0,
        }
    }

    async fn client(&mut self) -> Result<Grackle, Status> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let channel = connect(&self.addr, Duration::from_millis(300)).await?;
        let client = GrackleApiClient::new(channel).max_decoding_message_size(16 * 1024 * 1024);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Moves to the endpoint after the current one.
    fn rotate(&mut self) {
        let n = self.endpoints.len();
        if n == 0 {
            return;
        }
        let next = match self.endpoints.iter().position(|e| *e == self.addr) {
            Some(i) => (i + 1) % n,
            None => 0,
        };
        self.addr = self.endpoints[next].clone();
        self.client = None;
    }

    /// Runs one RPC built by `f` against the current node.
    pub async fn call<T, F, Fut>(&mut self, f: F) -> Result<T, Status>
    where
        F: FnOnce(Grackle) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let client = match self.client().await {
            Ok(c) => c,
            Err(status) => {
                self.rotate();
                return Err(status);
            }
        };
        let result = match tokio::time::timeout(self.deadline, f(client)).await {
            Ok(result) => result,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer from {} within {:?}",
                self.addr, self.deadline
            ))),
        };
        match result {
            Ok(response) => {
                let hint = response
                    .metadata()
                    .get(LEADER_HEADER)
                    .and_then(|v| v.to_str().ok());
                if let Some(hint) = hint
                    && hint != self.addr
                    && !hint.is_empty()
                {
                    self.addr = hint.to_string();
                    self.client = None;
                    self.redirects += 1;
                }
                Ok(response.into_inner())
            }
            Err(status) => {
                if is_failover(status.code()) {
                    self.rotate();
                }
                Err(status)
            }
        }
    }
}

//! Layer 8 of docs/design.md ("Module graph"): the gRPC services. The Grackle API, conch's
//! extensions, admin and access control, the peer service, health and reflection, all on one
//! port; and rolling upgrades (`upgrade`: what each member runs, raising the cluster version),
//! served by them.

use std::sync::Arc;

use conch_proto::conch::conch_admin_server::ConchAdminServer;
use conch_proto::conch::conch_api_server::ConchApiServer;
use conch_proto::conch::conch_auth_server::ConchAuthServer;
use conch_proto::conch::conch_peer_server::ConchPeerServer;
use conch_proto::conch::conch_quota_server::ConchQuotaServer;
use conch_proto::grackle::grackle_api_server::GrackleApiServer;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::data_dir::identity::CLUSTER_ID_HEADER;
use crate::net::connections::Gate;
use crate::node::Node;
use crate::raft::network::PEER_MESSAGE_MAX_BYTES;

pub(crate) mod acquire_route;
pub(crate) mod acquire_set;
pub(crate) mod admission;
pub(crate) mod auth;
pub(crate) mod backup;
pub(crate) mod conch;
pub(crate) mod convert;
pub(crate) mod grackle;
pub(crate) mod health;
pub(crate) mod holder_watch;
pub(crate) mod membership;
pub(crate) mod peer;
pub(crate) mod quota;
pub(crate) mod request_id;
pub(crate) mod responses;
pub(crate) mod slots;
pub(crate) mod status;
pub(crate) mod sync;
pub(crate) mod upgrade;
pub(crate) mod watch_loss;

/// Largest client request accepted; tonic refuses anything bigger with OUT_OF_RANGE ("decoded
/// message length too large") before a handler sees it.
pub(crate) const CLIENT_MESSAGE_MAX_BYTES: usize = 4 * 1024 * 1024;

pub(crate) use conch_proto::wire::LEADER_HEADER;

/// The client-facing services, limited and guarded as clients meet them: the Grackle API,
/// conch's extensions, administration and access control. The one list that the node's port and
/// the in-process client (`embed::LocalClient`) both serve. Once this node was removed from the
/// cluster, every call is answered UNAVAILABLE saying so (see `removal.rs`).
pub(crate) fn client_routes(node: &Arc<Node>) -> Routes {
    client_services(node).0
}

/// [`client_routes`], and the blocking acquire's route sharing their count of waiting calls,
/// which the node's port serves ahead of them (`acquire_route::ShortcutLayer`).
fn client_services(node: &Arc<Node>) -> (Routes, acquire_route::AcquireRoute) {
    // One count of waiting calls per principal for every service whose calls wait.
    let waiting = Arc::new(admission::Waiting::new(node.metrics.waiting_calls.clone()));
    let grackle_service = Arc::new(grackle::GrackleService::new(
        Arc::clone(node),
        Arc::clone(&waiting),
    ));
    let grackle = GrackleApiServer::from_arc(Arc::clone(&grackle_service))
        .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES);
    let grackle = InterceptedService::new(grackle, unless_removed(node));
    let conch_api = ConchApiServer::new(conch::ConchApiService::new(Arc::clone(node), waiting))
        .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES);
    let conch_api = InterceptedService::new(conch_api, unless_removed(node));
    let auth = ConchAuthServer::new(auth::AuthService::new(Arc::clone(node)))
        .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES);
    let auth = InterceptedService::new(auth, unless_removed(node));
    let quota = ConchQuotaServer::new(quota::QuotaService::new(Arc::clone(node)))
        .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES);
    let quota = InterceptedService::new(quota, unless_removed(node));
    let routes = Routes::new(grackle)
        .add_service(conch_api)
        .add_service(admin_service(node))
        .add_service(auth)
        .add_service(quota);
    // The blocking acquire by its own route, which a waiting call costs less in
    // (`acquire_route.rs`); an exact path is matched before the service's other methods.
    let acquire = acquire_route::AcquireRoute::new(grackle_service, Arc::clone(node));
    let routes = Routes::from(
        routes
            .into_axum_router()
            .route_service(acquire_route::PATH, acquire.clone()),
    );
    (routes, acquire)
}

/// Administration, for clients and for admin calls other nodes forward here (those carry their
/// sender's cluster id, and another cluster's is refused; the caller's token is checked as for
/// any client).
#[allow(clippy::type_complexity)] // an interceptor closure has no nameable type
fn admin_service(
    node: &Arc<Node>,
) -> InterceptedService<
    ConchAdminServer<conch::AdminService>,
    impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone + use<>,
> {
    let admin = ConchAdminServer::new(conch::AdminService::new(Arc::clone(node)))
        .max_decoding_message_size(CLIENT_MESSAGE_MAX_BYTES);
    let admin_node = Arc::clone(node);
    let mut removed = unless_removed(node);
    InterceptedService::new(admin, move |request: tonic::Request<()>| {
        let request = removed(request)?;
        if request.metadata().contains_key(CLUSTER_ID_HEADER) {
            admin_node
                .cluster_id
                .check(request.metadata())
                .map_err(|e| status::ApiError::ClusterMismatch(e.to_string()))?;
        }
        Ok(request)
    })
}

/// An interceptor refusing every call (UNAVAILABLE) once `node` was removed from the cluster.
fn unless_removed(
    node: &Arc<Node>,
) -> impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone + use<> {
    let node = Arc::clone(node);
    move |request| match node.removal.error(node.id) {
        Some(error) => Err(status::ApiError::Node(error).into()),
        None => Ok(request),
    }
}

/// The node-to-node service, admitted only for members (see `peer::admit`).
#[allow(clippy::type_complexity)] // an interceptor closure has no nameable type
fn peer_service(
    node: &Arc<Node>,
) -> InterceptedService<
    ConchPeerServer<peer::PeerService>,
    impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone + use<>,
> {
    let peer = ConchPeerServer::new(peer::PeerService::new(Arc::clone(node)))
        .max_decoding_message_size(PEER_MESSAGE_MAX_BYTES)
        .max_encoding_message_size(PEER_MESSAGE_MAX_BYTES);
    let peer_node = Arc::clone(node);
    InterceptedService::new(peer, move |mut request: tonic::Request<()>| {
        let sender = peer::admit(&peer_node, &request)?;
        request.extensions_mut().insert(sender);
        Ok(request)
    })
}

/// Serves until `shutdown` resolves: every service on `listener`, or, with a separate
/// `peer_listener` (`--peer-listen`), the client services there and the peer service (with
/// administration, which other nodes forward admin calls to) on the peer listener.
pub(crate) async fn serve(
    node: Arc<Node>,
    listener: crate::net::transport::Listener,
    peer_listener: Option<tokio::net::TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    use futures::FutureExt;
    // Calls that wait (blocking acquires, holder watches) end as the node begins to stop, so
    // the drain of in-flight calls below is short.
    let tasks = node.tasks.clone();
    let shutdown = async move {
        shutdown.await;
        tasks.drain();
    }
    .shared();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    node.tasks
        .spawn(health::follow(Arc::clone(&node), health_reporter));
    // Reflection in both versions: older grpcurl, Postman, evans and many IDE plugins only
    // speak v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(conch_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .inspect_err(|e| tracing::warn!(error = %e, "gRPC reflection v1 unavailable"))
        .ok();
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .inspect_err(|e| tracing::warn!(error = %e, "gRPC reflection v1alpha unavailable"))
        .ok();
    let builder = |gate: &Arc<Gate>, acquire: Option<acquire_route::AcquireRoute>| {
        Server::builder()
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
            .max_concurrent_streams(Some(admission::MAX_STREAMS_PER_CONNECTION))
            // Calls a client cancels before the server took them (a node paused or busy, its
            // callers timing out) are reset streams waiting to be accepted; past h2's default of
            // 20 the whole connection is closed, failing every call on it as RESOURCE_EXHAUSTED.
            // Allow as many as a connection may have streams.
            .http2_max_pending_accept_reset_streams(Some(
                admission::MAX_STREAMS_PER_CONNECTION as usize,
            ))
            // Each call holds its connection open and may show who is calling (connections.rs).
            .layer(slots::SlotLayer::new(Arc::clone(&node), Arc::clone(gate)))
            // Every call is counted; every client-facing response names the leader, errors too.
            .layer(responses::ResponseLayer::new(Arc::clone(&node)))
            .layer(acquire_route::ShortcutLayer::new(acquire))
    };
    let shared_port = peer_listener.is_none();
    let client_gate = node.connection_gate("client");
    let (routes, acquire) = client_services(&node);
    let clients = builder(&client_gate, Some(acquire))
        .add_routes(routes)
        .add_service(health_service.clone())
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        .add_optional_service(shared_port.then(|| peer_service(&node)));
    let Some(peer_listener) = peer_listener else {
        return serve_on(&node, clients, client_gate, listener, shutdown).await;
    };
    let peer_gate = node.connection_gate("peer");
    let peers = builder(&peer_gate, None)
        .add_service(peer_service(&node))
        .add_service(admin_service(&node))
        .add_service(health_service);
    let (served, peers_served) = tokio::join!(
        serve_on(&node, clients, client_gate, listener, shutdown.clone()),
        serve_on(
            &node,
            peers,
            peer_gate,
            crate::net::transport::Listener::Tcp(peer_listener),
            shutdown
        ),
    );
    served.and(peers_served)
}

type ClientRouter = tonic::transport::server::Router<
    tower::layer::util::Stack<
        acquire_route::ShortcutLayer,
        tower::layer::util::Stack<
            responses::ResponseLayer,
            tower::layer::util::Stack<slots::SlotLayer, tower::layer::util::Identity>,
        >,
    >,
>;

async fn serve_on(
    node: &Node,
    router: ClientRouter,
    gate: Arc<Gate>,
    listener: crate::net::transport::Listener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let listener = match listener {
        crate::net::transport::Listener::Tcp(listener) => listener,
        crate::net::transport::Listener::Incoming(incoming) => {
            let incoming = crate::net::connections::guard(incoming, gate);
            return router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await;
        }
    };
    if let Some(tls) = &node.config.tls {
        let incoming = crate::tls::incoming(listener, Arc::clone(tls), gate, &node.tasks);
        return router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
    }
    // Accepted sockets get TCP_NODELAY here: with a custom listener tonic ignores
    // `Server::tcp_nodelay`, and Nagle's algorithm with delayed ACKs stalls replies by ~40 ms.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let incoming = crate::net::connections::guard(incoming, gate);
    router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

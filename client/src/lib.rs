//! Rust client for conch, the self-hosted coordination daemon.
//!
//! A conch cluster is 1, 3 or 5 `conchd` nodes that replicate Grackle-style semaphores through
//! Raft; any node answers (hierarchical read/write locks too, see [`lock`]). This crate gives
//! you:
//!
//! - [`Client`]: a list of endpoints with failover, the leader hint (`conch-leader` response
//!   metadata) to skip the follower hop, deadlines on every call, retries of what is safe to
//!   retry, and typed wrappers of the RPCs ([`Client::call`] and the raw generated clients for
//!   the rest);
//! - [`Lease`]: a semaphore or lock lease that refreshes itself in the background and tells its owner
//!   at once when it is lost — *before* the server could give its permits to someone else;
//! - [`Client::acquire`]: waits in the server's FIFO queue for permits, keeping its place
//!   across RPC timeouts and node failover, and returns a [`Guard`] with the fencing token;
//!   [`Client::acquire_lock`] does the same for a lock path, shared or exclusive, and says
//!   what blocks it when it does not get it ([`Blocked`]);
//! - [`Client::lease_lost`]: completes as soon as the cluster ends a lease or one of its holds
//!   (expired, revoked, hold limit, semaphore, lock or namespace deleted), pushed by a node
//!   over a stream that fails over like every call ([`loss`]);
//! - [`sema`]: the naming scheme of `conch sema` (namespace `conch` by default, semaphore
//!   `<name>.<max>`);
//! - [`BearerToken`]: for a cluster with access control on, set [`ClientConfig::token`] and every
//!   call carries `authorization: Bearer <token>` (added by a tonic interceptor).
//!
//! Invariants this crate keeps:
//! - a lease is reported lost no later than [`loss_after`]`(ttl)` = `ttl − min(max(1s, ttl/5),
//!   ttl/2)` after the send time of its last successful refresh (the one function the keep-alive
//!   uses; for TTLs under 2 s the margin is half the TTL), and a lost lease never comes back;
//! - while an acquire waits, some in-flight RPC always covers the waiter's server-side
//!   deadline (unless every node is unreachable), so the waiter keeps its queue position;
//! - only RPCs that are safe to repeat are retried (see [`client`] for the
//!   single caveat: a create whose reply was lost).
//!
//! # Example
//!
//! ```no_run
//! use std::collections::HashMap;
//! use std::time::Duration;
//!
//! use conch_client::{Client, sema};
//!
//! # async fn demo() -> Result<(), conch_client::Error> {
//! let client = Client::connect(["node1:7001", "node2:7001", "node3:7001"]).await?;
//! let semaphore = sema::semaphore_name("nightly-report", 1).expect("valid name");
//! client.ensure_semaphore(sema::NAMESPACE, &semaphore, 1).await?;
//!
//! let lease = client
//!     .create_lease(sema::NAMESPACE, "reporter/pid-1", Duration::from_secs(10), HashMap::new())
//!     .await?;
//! match client
//!     .acquire(&lease, sema::NAMESPACE, &semaphore, 1, None, HashMap::new())
//!     .await?
//! {
//!     Some(guard) => {
//!         tokio::select! {
//!             _ = run_report(guard.fencing_token()) => {}
//!             loss = lease.lost() => eprintln!("slot lost: {loss}"),
//!         }
//!         guard.release().await?;
//!     }
//!     None => unreachable!("a wait without a bound ends with a grant or an error"),
//! }
//! lease.revoke().await?;
//! # Ok(()) }
//! # async fn run_report(_fencing_token: u64) {}
//! ```

#![warn(missing_docs)]

pub mod acquire;
pub mod audit;
mod backoff;
#[cfg(feature = "certs")]
pub mod certs;
pub mod client;
mod duration;
pub mod elect;
mod endpoint;
mod error;
#[cfg(test)]
mod fake;
pub mod lease;
mod lease_kind;
pub mod lock;
pub mod loss;
pub mod private_file;
pub mod request_id;
#[cfg(test)]
mod routing_tests;
pub mod sema;
pub mod sync;
mod tls;
mod token;

pub use acquire::{Guard, Held};
pub use backoff::Backoff;
pub use client::{CallOptions, Client, ClientConfig, LEADER_METADATA_KEY, Waiters, request};
pub use duration::format_duration;
pub use endpoint::{DEFAULT_ENDPOINT, DEFAULT_PORT, EndpointAddr, parse_endpoint, parse_endpoints};
pub use error::{Error, LeaseLoss, Result};
pub use lease::{Lease, LeaseKind, LeaseState, loss_after, refresh_interval};
pub use lock::{Blocked, LockOutcome};
pub use loss::Lost;
pub use request_id::{REQUEST_ID_METADATA_KEY, new_request_id, request_with_id};
pub use tls::ClientTls;
pub use token::{AUTHORIZATION, BearerToken, NodeChannel, TokenInterceptor};

/// The generated protobuf/gRPC code (`grackle` and `conch` packages), re-exported.
pub use conch_proto as proto;

//! What one client may hold of a node: connections, streams per connection, and calls that
//! wait (blocking acquires, holder watches). A node keeps serving its peers and other clients
//! however many idle connections or waiting calls one client opens.
//!
//! - **Connections**: see `connections.rs`: per source address and per listener, with room
//!   kept for callers that proved who they are, and idle connections closed.
//! - **Streams**: at most [`MAX_STREAMS_PER_CONNECTION`] concurrent calls per HTTP/2
//!   connection; a client sending more waits for a stream (HTTP/2 flow control), nobody else
//!   does.
//! - **Waiting calls**: at most [`MAX_WAITING_PER_PRINCIPAL`] calls that wait, per principal
//!   and node; the principal is the call's token, or without one the client's IP address. One
//!   more is refused with `RESOURCE_EXHAUSTED` before anything is proposed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tonic::Request;

use super::status::ApiError;
use crate::state::Error;

pub(crate) const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
pub(crate) const MAX_WAITING_PER_PRINCIPAL: usize = 10_000;

/// Who a waiting call counts against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Principal {
    Token([u8; 32]),
    Address(IpAddr),
    Unknown,
}

impl Principal {
    /// The caller's token (as [`Caller`](super::auth::Caller) read it), or else the address
    /// `request` came from.
    pub(crate) fn of<T>(caller: &super::auth::Caller, request: &Request<T>) -> Principal {
        Principal::new(caller.token(), request.remote_addr())
    }

    /// `token` if there is one, else `remote`'s address.
    pub(crate) fn new(token: Option<[u8; 32]>, remote: Option<std::net::SocketAddr>) -> Principal {
        match (token, remote) {
            (Some(token), _) => Principal::Token(token),
            (None, Some(addr)) => Principal::Address(addr.ip()),
            (None, None) => Principal::Unknown,
        }
    }
}

/// Counts the waiting calls of each principal.
pub(crate) struct Waiting {
    by_principal: Mutex<HashMap<Principal, usize>>,
    /// All of them, for metrics.
    total: prometheus::IntGauge,
}

/// One waiting call; dropping it ends its count.
pub(crate) struct WaitPermit {
    waiting: Arc<Waiting>,
    principal: Principal,
}

impl Waiting {
    /// Counting into `total` too (`conch_waiting_calls`).
    pub(crate) fn new(total: prometheus::IntGauge) -> Waiting {
        Waiting {
            by_principal: Mutex::default(),
            total,
        }
    }

    /// Counts one more waiting call of `principal`, or refuses it past the limit.
    pub(crate) fn enter(self: &Arc<Self>, principal: Principal) -> Result<WaitPermit, ApiError> {
        self.enter_with_limit(principal, MAX_WAITING_PER_PRINCIPAL)
    }

    fn enter_with_limit(
        self: &Arc<Self>,
        principal: Principal,
        limit: usize,
    ) -> Result<WaitPermit, ApiError> {
        let mut map = self.by_principal.lock().unwrap_or_else(|p| p.into_inner());
        let count = map.entry(principal.clone()).or_insert(0);
        if *count >= limit {
            return Err(ApiError::from(Error::exhausted(format!(
                "{limit} calls of this {} already wait on this node; end some, or spread them \
                 over other nodes",
                match principal {
                    Principal::Token(_) => "token",
                    _ => "client address",
                }
            ))));
        }
        *count += 1;
        self.total.inc();
        Ok(WaitPermit {
            waiting: Arc::clone(self),
            principal,
        })
    }

    #[cfg(test)]
    fn count(&self, principal: &Principal) -> usize {
        let map = self.by_principal.lock().unwrap_or_else(|p| p.into_inner());
        map.get(principal).copied().unwrap_or(0)
    }
}

impl Drop for WaitPermit {
    fn drop(&mut self) {
        let mut map = self
            .waiting
            .by_principal
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = map.get_mut(&self.principal) {
            self.waiting.total.dec();
            *count = count.saturating_sub(1);
            if *count == 0 {
                map.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_calls_are_counted_per_principal_and_given_back() {
        let waiting = Arc::new(Waiting::new(
            prometheus::IntGauge::new("w", "w").expect("gauge"),
        ));
        let a = Principal::Token([1; 32]);
        let b = Principal::Address(IpAddr::from([127, 0, 0, 1]));
        let first = waiting.enter_with_limit(a.clone(), 2).ok();
        let second = waiting.enter_with_limit(a.clone(), 2).ok();
        assert!(first.is_some() && second.is_some());
        let refused = waiting
            .enter_with_limit(a.clone(), 2)
            .err()
            .map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|m| m.contains("2 calls of this token")),
            "{refused:?}"
        );
        // Another principal is not affected.
        let other = waiting.enter_with_limit(b.clone(), 2);
        assert!(other.is_ok());
        drop(first);
        assert_eq!(waiting.count(&a), 1);
        assert!(waiting.enter_with_limit(a.clone(), 2).is_ok());
        drop((second, other));
        assert_eq!((waiting.count(&a), waiting.count(&b)), (0, 0));
    }
}

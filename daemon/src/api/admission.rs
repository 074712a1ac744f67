//! What one client may hold of a node: connections, streams per connection, and calls that
//! wait (blocking acquires, holder watches). A node keeps serving its peers and other clients
//! however many idle connections or waiting calls one client opens.
//!
//! - **Connections**: at most [`MAX_CONNECTIONS`] accepted connections per listener; one more
//!   is closed at once (counted, and logged at most every 10 s). Peers dial long-lived
//!   connections, so with a shared port a flood can keep a *new* peer connection out; the
//!   production layout gives peers their own port (`--peer-listen`).
//! - **Streams**: at most [`MAX_STREAMS_PER_CONNECTION`] concurrent calls per HTTP/2
//!   connection; a client sending more waits for a stream (HTTP/2 flow control), nobody else
//!   does.
//! - **Waiting calls**: at most [`MAX_WAITING_PER_PRINCIPAL`] calls that wait, per principal
//!   and node; the principal is the call's token, or without one the client's IP address. One
//!   more is refused with `RESOURCE_EXHAUSTED` before anything is proposed.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Request;
use tonic::transport::server::Connected;

use super::status::ApiError;
use crate::log_limit::LogLimit;
use crate::state::Error;

pub const MAX_CONNECTIONS: usize = 10_000;
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
pub const MAX_WAITING_PER_PRINCIPAL: usize = 10_000;

/// Who a waiting call counts against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Principal {
    Token([u8; 32]),
    Address(IpAddr),
    Unknown,
}

impl Principal {
    /// The caller's token (as [`Caller`](super::auth::Caller) read it), or else the address
    /// `request` came from.
    pub fn of<T>(caller: &super::auth::Caller, request: &Request<T>) -> Principal {
        Principal::new(caller.token(), request.remote_addr())
    }

    /// `token` if there is one, else `remote`'s address.
    pub fn new(token: Option<[u8; 32]>, remote: Option<std::net::SocketAddr>) -> Principal {
        match (token, remote) {
            (Some(token), _) => Principal::Token(token),
            (None, Some(addr)) => Principal::Address(addr.ip()),
            (None, None) => Principal::Unknown,
        }
    }
}

/// Counts the waiting calls of each principal.
pub struct Waiting {
    by_principal: Mutex<HashMap<Principal, usize>>,
    /// All of them, for metrics.
    total: prometheus::IntGauge,
}

/// One waiting call; dropping it ends its count.
pub struct WaitPermit {
    waiting: Arc<Waiting>,
    principal: Principal,
}

impl Waiting {
    /// Counting into `total` too (`conch_waiting_calls`).
    pub fn new(total: prometheus::IntGauge) -> Waiting {
        Waiting {
            by_principal: Mutex::default(),
            total,
        }
    }

    /// Counts one more waiting call of `principal`, or refuses it past the limit.
    pub fn enter(self: &Arc<Self>, principal: Principal) -> Result<WaitPermit, ApiError> {
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

/// An accepted connection, holding its place under the connection limit while it lives.
pub struct Limited<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

/// `incoming` with at most `max` connections open at once: one past it is closed at once and
/// counted in `refused`.
pub fn limit_connections<S, IO>(
    incoming: S,
    max: usize,
    refused: prometheus::IntCounter,
) -> impl Stream<Item = io::Result<Limited<IO>>>
where
    S: Stream<Item = io::Result<IO>>,
{
    let open = Arc::new(Semaphore::new(max));
    let log = Arc::new(LogLimit::new(std::time::Duration::from_secs(10)));
    incoming.filter_map(move |accepted| {
        let (open, log, refused) = (Arc::clone(&open), Arc::clone(&log), refused.clone());
        async move {
            match accepted {
                Err(e) => Some(Err(e)),
                Ok(io) => match open.try_acquire_owned() {
                    Ok(permit) => Some(Ok(Limited {
                        io,
                        _permit: permit,
                    })),
                    Err(_) => {
                        refused.inc();
                        if log.due() {
                            tracing::warn!(
                                max,
                                "connection limit reached: new connections are closed at once"
                            );
                        }
                        None
                    }
                },
            }
        }
    })
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Limited<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

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

    #[tokio::test]
    async fn a_connection_past_the_limit_is_closed_and_a_closed_one_makes_room() {
        let (tx, rx) =
            tokio::sync::mpsc::unbounded_channel::<io::Result<tokio::io::DuplexStream>>();
        let refused = prometheus::IntCounter::new("r", "r").expect("counter");
        let mut limited = Box::pin(limit_connections(tokio_stream_from(rx), 1, refused.clone()));
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let (c, _c_peer) = tokio::io::duplex(64);
        tx.send(Ok(a)).ok();
        let first = limited.next().await;
        assert!(matches!(first, Some(Ok(_))));
        // The second, while the first is open, is closed at once and never served.
        tx.send(Ok(b)).ok();
        assert!(limited.next().now_or_never().is_none(), "nothing served");
        assert_eq!(refused.get(), 1);
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        assert_eq!(b_peer.read(&mut buf).await.ok(), Some(0), "b was closed");
        // Once the first closes, the next one is served.
        drop(first);
        assert_eq!(
            a_peer.read(&mut buf).await.ok(),
            Some(0),
            "a was closed by its drop"
        );
        tx.send(Ok(c)).ok();
        let third = limited.next().await;
        assert!(
            matches!(third, Some(Ok(_))),
            "room again once the first closed"
        );
    }

    fn tokio_stream_from<T>(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<T>,
    ) -> impl Stream<Item = T> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}

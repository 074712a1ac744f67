//! Connections that do not come from the operating system's TCP: how a program running nodes
//! in one process (the simulator in `sim/`) carries their gRPC traffic over a network of its
//! own. A node given a [`Dial`] (in `Config::dial`, `config.rs`) makes every call to
//! another node through it, and `server::start_with_incoming` serves the connections
//! a stream hands it. Nothing else changes: the same services, the same peer admission, the
//! same limits. TLS does not apply to these connections (the simulated network is plaintext).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A byte stream both ways, as a TCP connection is.
pub trait Conn: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Conn for T {}

/// What a dial returns.
pub(crate) type Dialed = Pin<Box<dyn Future<Output = io::Result<Box<dyn Conn>>> + Send>>;

/// Opens a connection to `host:port`.
#[derive(Clone)]
pub struct Dial(Arc<dyn Fn(String) -> Dialed + Send + Sync>);

impl Dial {
    pub fn new(dial: impl Fn(String) -> Dialed + Send + Sync + 'static) -> Dial {
        Dial(Arc::new(dial))
    }

    pub fn connect(&self, addr: String) -> Dialed {
        (self.0)(addr)
    }
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dial(..)")
    }
}

/// A connection a node accepted, with the addresses its peer calls see.
pub struct Accepted {
    pub io: Box<dyn Conn>,
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
}

/// The connections a node serves, in the order they arrive.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<Accepted>> + Send>>;

/// Where a node takes its client (and, sharing the port, peer) connections from.
pub(crate) enum Listener {
    Tcp(tokio::net::TcpListener),
    /// Connections handed over by the program running the node.
    Incoming(Incoming),
}

impl Connected for Accepted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
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
}

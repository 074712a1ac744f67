//! A fault-injecting TCP proxy for one directed peer link (node `from` → node `to`).
//!
//! Node `from` is started with `--peer-routes to=<proxy>`, so every connection it opens to
//! `to` (Raft append/vote/snapshot, forwarded client writes, read-index requests) passes here.
//! The replies to those requests flow back through the same connection; `to`'s own requests to
//! `from` use the opposite link's proxy.
//!
//! Modes:
//! - [`LinkMode::Pass`]: bytes are forwarded as they come;
//! - [`LinkMode::Delay`]: every chunk is delivered `d` after it was read (order kept);
//! - [`LinkMode::Refuse`]: open connections are closed at once, new ones are accepted and
//!   closed immediately (the dialer sees a reset / closed connection);
//! - [`LinkMode::Blackhole`]: nothing is forwarded any more: open connections stall (bytes are
//!   held, not delivered) and new ones are accepted but never answered; when the mode changes
//!   again, every stalled connection is closed (what was held is dropped, as a long partition
//!   would have killed the TCP connection anyway);
//! - [`LinkMode::Stall`]: like a black hole, but when the link passes again everything held is
//!   delivered and stalled connections carry on (a short partition that TCP retransmission
//!   rides out: requests sent during the partition arrive after it).
//! - [`LinkMode::SwallowReplies`]: a connection opened while it is set carries what the dialer
//!   sends to the node, drops everything the node answers, and is closed `d` after it opened:
//!   the request is served, the dialer never learns its outcome and sees a broken connection.
//!   Open connections are closed when it is set, so the dialer's next request opens one.
//!
//! Every task belongs to the proxy: dropping [`LinkProxy`] stops the listener and every
//! connection.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    Pass,
    Delay(Duration),
    Refuse,
    Blackhole,
    Stall,
    SwallowReplies(Duration),
}

pub struct LinkProxy {
    pub addr: SocketAddr,
    mode: watch::Sender<LinkMode>,
    task: JoinHandle<()>,
}

impl LinkProxy {
    /// Listens on a fresh loopback port and forwards to `upstream` (the address of the node
    /// the link leads to).
    pub async fn start(upstream: String) -> anyhow::Result<LinkProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a proxy port")?;
        let addr = listener.local_addr().context("proxy address")?;
        let (mode, mode_rx) = watch::channel(LinkMode::Pass);
        let task = tokio::spawn(accept_loop(listener, upstream, mode_rx));
        Ok(LinkProxy { addr, mode, task })
    }

    pub fn set(&self, mode: LinkMode) {
        self.mode.send_if_modified(|m| {
            let changed = *m != mode;
            *m = mode;
            changed
        });
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: String, mode: watch::Receiver<LinkMode>) {
    // Connection tasks live in this set: aborting the accept loop drops the set, which aborts
    // every connection task.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((socket, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = socket.set_nodelay(true);
                conns.spawn(connection(socket, upstream.clone(), mode.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(client: TcpStream, upstream: String, mut mode: watch::Receiver<LinkMode>) {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            LinkMode::Refuse => return,
            LinkMode::Blackhole => {
                // Hold the connection without answering until the partition ends, then close it.
                let _ = mode.changed().await;
                return;
            }
            LinkMode::Stall => {
                // Hold it, and connect through once the link passes again.
                if mode.changed().await.is_err() {
                    return;
                }
            }
            LinkMode::SwallowReplies(after) => {
                return swallow_replies(client, upstream, after).await;
            }
            LinkMode::Pass | LinkMode::Delay(_) => break,
        }
    }
    let server = match tokio::time::timeout(
        Duration::from_secs(1),
        TcpStream::connect(upstream.as_str()),
    )
    .await
    {
        Ok(Ok(server)) => server,
        _ => return, // node down: the dialer sees its connection closed
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone());
    let down = pump(server_read, client_write, mode.clone());
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = refused(mode) => {}
    }
    // Dropping both halves of both sockets closes the connection on both sides.
}

/// Resolves when the link switches to `Refuse` or `SwallowReplies` (close open connections at
/// once).
async fn refused(mut mode: watch::Receiver<LinkMode>) {
    loop {
        if matches!(
            *mode.borrow_and_update(),
            LinkMode::Refuse | LinkMode::SwallowReplies(_)
        ) {
            return;
        }
        if mode.changed().await.is_err() {
            return;
        }
    }
}

/// Waits until the link passes traffic and returns the delay to apply. Returns `None` when the
/// connection must close: the link refuses, or it went through a black hole.
async fn gate(mode: &mut watch::Receiver<LinkMode>) -> Option<Duration> {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            LinkMode::Pass | LinkMode::SwallowReplies(_) => return Some(Duration::ZERO),
            LinkMode::Delay(d) => return Some(d),
            LinkMode::Refuse => return None,
            LinkMode::Blackhole => {
                let _ = mode.changed().await;
                return None;
            }
            LinkMode::Stall => {
                if mode.changed().await.is_err() {
                    return None;
                }
            }
        }
    }
}

/// Copies one direction, delaying each chunk by the link's delay at the time it was read.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mode: watch::Receiver<LinkMode>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_mode = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Some(delay) = gate(&mut read_mode).await else {
                return;
            };
            tokio::select! {
                read = from.read(&mut buf) => {
                    match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    }
                }
                changed = read_mode.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Re-check the mode before reading on.
                }
            }
        }
    };
    let mut write_mode = mode;
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if gate(&mut write_mode).await.is_none() {
                return;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    // The connection ends when either side is done; the caller's select drops the rest.
    tokio::join!(reader, writer);
}

/// Forwards what the dialer sends, drops every reply, and closes the connection `after` it
/// opened.
async fn swallow_replies(client: TcpStream, upstream: String, after: Duration) {
    let Ok(Ok(server)) = tokio::time::timeout(
        Duration::from_secs(1),
        TcpStream::connect(upstream.as_str()),
    )
    .await
    else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut client_read, _client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = client_read.read(&mut buf).await {
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(1..) = server_read.read(&mut buf).await {}
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = tokio::time::sleep(after) => {}
    }
}

//! A fault-injecting TCP proxy for one link: every connection accepted on its loopback port is
//! forwarded to one upstream address.
//!
//! For a directed peer link (node `from` → node `to`), node `from` is started with
//! `--peer-routes to=<proxy>`, so every connection it opens to `to` (Raft append/vote/snapshot,
//! forwarded client writes, read-index requests) passes here. The replies to those requests
//! flow back through the same connection; `to`'s own requests to `from` use the opposite
//! link's proxy. In front of a node's client listener (the node advertises the proxy), a
//! [counting](LinkProxy::start_counting) proxy also counts the gRPC requests clients send.
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
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
    requests: Option<Arc<AtomicU64>>,
    task: JoinHandle<()>,
}

impl LinkProxy {
    /// Listens on a fresh loopback port and forwards to `upstream` (the address of the node
    /// the link leads to).
    pub async fn start(upstream: String) -> anyhow::Result<LinkProxy> {
        Self::launch(upstream, None).await
    }

    /// Like [`LinkProxy::start`], and counts the gRPC requests sent through it
    /// ([`LinkProxy::requests`]).
    pub async fn start_counting(upstream: String) -> anyhow::Result<LinkProxy> {
        Self::launch(upstream, Some(Arc::new(AtomicU64::new(0)))).await
    }

    async fn launch(
        upstream: String,
        requests: Option<Arc<AtomicU64>>,
    ) -> anyhow::Result<LinkProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a proxy port")?;
        let addr = listener.local_addr().context("proxy address")?;
        let (mode, mode_rx) = watch::channel(LinkMode::Pass);
        let task = tokio::spawn(accept_loop(listener, upstream, mode_rx, requests.clone()));
        Ok(LinkProxy {
            addr,
            mode,
            requests,
            task,
        })
    }

    /// gRPC requests sent through the proxy so far (always 0 unless it was started with
    /// [`LinkProxy::start_counting`]). A request is counted when its first bytes have been
    /// read, before they are forwarded.
    pub fn requests(&self) -> u64 {
        self.requests
            .as_ref()
            .map_or(0, |r| r.load(Ordering::SeqCst))
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

async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    mode: watch::Receiver<LinkMode>,
    requests: Option<Arc<AtomicU64>>,
) {
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
                conns.spawn(connection(socket, upstream.clone(), mode.clone(), requests.clone()));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: String,
    mut mode: watch::Receiver<LinkMode>,
    requests: Option<Arc<AtomicU64>>,
) {
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
    let counter = requests.map(|total| (RequestCounter::default(), total));
    let up = pump(client_read, server_write, mode.clone(), counter);
    let down = pump(server_read, client_write, mode.clone(), None);
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

/// Copies one direction, delaying each chunk by the link's delay at the time it was read. With
/// a `counter`, the requests read are added to its total.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mode: watch::Receiver<LinkMode>,
    mut counter: Option<(RequestCounter, Arc<AtomicU64>)>,
) {
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
                            if let Some((counter, total)) = &mut counter {
                                total.fetch_add(counter.feed(&buf[..n]), Ordering::SeqCst);
                            }
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
            // Passing bytes go on at once: a timer, even one already due, would hold them
            // until the timer's next tick.
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
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

/// Counts the requests a client sends on an HTTP/2 connection: one HEADERS frame opens each
/// gRPC call (trailers are sent by the server only). Fed the client's bytes in order, in
/// chunks of any size.
#[derive(Default)]
struct RequestCounter {
    preface_seen: usize,
    header: [u8; FRAME_HEADER_LEN],
    header_len: usize,
    skip: usize,
}

/// The client connection preface (`PRI * HTTP/2.0...`) that precedes the first frame.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;

impl RequestCounter {
    /// Reads on through `bytes` and returns how many requests started in them.
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut count = 0;
        while !bytes.is_empty() {
            if self.preface_seen < PREFACE_LEN {
                let take = (PREFACE_LEN - self.preface_seen).min(bytes.len());
                self.preface_seen += take;
                bytes = &bytes[take..];
            } else if self.skip > 0 {
                let take = self.skip.min(bytes.len());
                self.skip -= take;
                bytes = &bytes[take..];
            } else {
                let take = (FRAME_HEADER_LEN - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[..take]);
                self.header_len += take;
                bytes = &bytes[take..];
                if self.header_len == FRAME_HEADER_LEN {
                    let h = self.header;
                    // 24-bit payload length, then the frame type.
                    self.skip =
                        (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    if h[3] == HEADERS {
                        count += 1;
                    }
                    self.header_len = 0;
                }
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame header: 24-bit length, type, flags, stream id.
    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn counts_headers_frames_in_any_chunking() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, &[0; 12])); // SETTINGS
        bytes.extend(frame(HEADERS, &[HEADERS; 40])); // payload bytes look like headers
        bytes.extend(frame(0x0, &[0; 300])); // DATA
        bytes.extend(frame(HEADERS, &[7; 5]));
        for chunk in [1, 2, 7, 9, 64, bytes.len()] {
            let mut counter = RequestCounter::default();
            let total: u64 = bytes.chunks(chunk).map(|c| counter.feed(c)).sum();
            assert_eq!(total, 2, "chunks of {chunk}");
        }
    }
}

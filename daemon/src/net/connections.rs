//! Connection slots a stranger cannot keep, on every listener of a node (client, peer, metrics,
//! status page).
//!
//! Each listener has a [`Gate`]. A connection is admitted when it is accepted, before any TLS
//! handshake, and is a *stranger* until a call on it shows who is calling; it is then *known*:
//! - a call with a token the node knows (or any call while access control is off), a peer call
//!   with the peer secret, or a connection whose TLS handshake verified a client or node
//!   certificate, makes a gRPC connection known. The HTTP/1.1 listeners (metrics, status page)
//!   know nobody.
//!
//! What a gate allows:
//! - **per source address**: at most `per_address` open connections from one IP address
//!   (`--max-connections-per-address`); one more is closed at once;
//! - **per listener**: at most [`MAX_CONNECTIONS`], of which strangers may hold all but
//!   [`RESERVED_FOR_KNOWN`]. A new connection that finds the strangers' room full closes the
//!   oldest stranger instead of being refused, so however many strangers connect, a caller who
//!   connects and proves itself within moments gets in. A new connection is refused only when
//!   known callers hold every other slot;
//! - **idle**: a connection with no open call is closed after [`STRANGER_IDLE`] while a
//!   stranger (so a TCP connection that sends nothing, a TLS handshake that never ends, an
//!   HTTP/2 preface that never comes, all hold a slot that long at most), and after
//!   [`KNOWN_IDLE`] once known. A call that waits (a blocking acquire, a watch) is an open call
//!   and is never cut for idleness; HTTP/2 keepalive pings find dead clients under it.
//!
//! Each connection closed by these rules is counted in `conch_connections_refused_total`,
//! labelled by listener and reason, and logged at most every 10 s per listener (a refused TLS
//! handshake is counted here and logged by the TLS module with its reason).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::base::log_limit::LogLimit;

/// Most connections one listener keeps open.
pub(crate) const MAX_CONNECTIONS: usize = 10_000;
/// Slots of [`MAX_CONNECTIONS`] strangers never hold.
pub(crate) const RESERVED_FOR_KNOWN: usize = 1_000;
/// Default of `--max-connections-per-address`: many clients on one host fit; one host cannot
/// hold a listener.
pub(crate) const DEFAULT_PER_ADDRESS: usize = 1_000;
/// How long a stranger's connection stays open without a call.
pub(crate) const STRANGER_IDLE: Duration = Duration::from_secs(10);
/// How long a known caller's connection stays open without a call.
pub(crate) const KNOWN_IDLE: Duration = Duration::from_secs(300);
/// How often idle connections are looked for.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Why a gate closed a connection (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Refused at once: its address had `per_address` connections open.
    PerAddress,
    /// Refused at once: known callers held every slot.
    Full,
    /// A stranger closed to make room for a new connection.
    Evicted,
    /// Closed after its idle time with no call.
    Idle,
    /// Its TLS handshake failed or timed out.
    Handshake,
}

impl Reason {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Reason::PerAddress => "per_address",
            Reason::Full => "full",
            Reason::Evicted => "evicted",
            Reason::Idle => "idle",
            Reason::Handshake => "handshake",
        }
    }
}

/// What a gate allows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub max: usize,
    pub reserved: usize,
    pub per_address: usize,
    pub stranger_idle: Duration,
    pub known_idle: Duration,
}

impl Limits {
    /// The node's limits with `per_address` connections per source address.
    pub(crate) fn with_per_address(per_address: usize) -> Limits {
        Limits {
            max: MAX_CONNECTIONS,
            reserved: RESERVED_FOR_KNOWN,
            per_address,
            stranger_idle: STRANGER_IDLE,
            known_idle: KNOWN_IDLE,
        }
    }
}

/// One open connection as its gate sees it.
pub(crate) struct Conn {
    id: u64,
    remote: Option<SocketAddr>,
    known: AtomicBool,
    open_calls: AtomicUsize,
    last_activity: Mutex<Instant>,
    closed: AtomicBool,
    wakers: Mutex<[Option<Waker>; 2]>,
}

impl Conn {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|p| p.into_inner()));
        for waker in wakers.into_iter().flatten() {
            waker.wake();
        }
    }

    fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    pub(crate) fn is_known(&self) -> bool {
        self.known.load(Ordering::Relaxed)
    }

    /// Counts a call as open until the returned guard drops.
    pub(crate) fn call(self: &Arc<Self>) -> CallGuard {
        self.open_calls.fetch_add(1, Ordering::SeqCst);
        self.touch();
        CallGuard(Arc::clone(self))
    }

    /// Whether it was closed by its gate; if not, `cx` is woken when it is (slot 0 reading,
    /// 1 writing).
    fn poll_closed(&self, slot: usize, cx: &Context<'_>) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return true;
        }
        let mut wakers = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
        if !wakers[slot]
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            wakers[slot] = Some(cx.waker().clone());
        }
        drop(wakers);
        self.closed.load(Ordering::SeqCst)
    }
}

/// One open call on a connection; dropping it ends the call.
pub(crate) struct CallGuard(Arc<Conn>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.open_calls.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

#[derive(Default)]
struct Slots {
    next_id: u64,
    open: HashMap<u64, Arc<Conn>>,
    /// Strangers by id, so by age.
    strangers: BTreeSet<u64>,
    by_address: HashMap<IpAddr, usize>,
    by_remote: HashMap<SocketAddr, u64>,
}

impl Slots {
    /// Forgets `id`; whether it was there.
    fn remove(&mut self, id: u64) -> Option<Arc<Conn>> {
        let conn = self.open.remove(&id)?;
        self.strangers.remove(&id);
        if let Some(remote) = conn.remote {
            if let Some(n) = self.by_address.get_mut(&remote.ip()) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.by_address.remove(&remote.ip());
                }
            }
            if self.by_remote.get(&remote) == Some(&id) {
                self.by_remote.remove(&remote);
            }
        }
        Some(conn)
    }
}

/// The connection slots of one listener.
pub(crate) struct Gate {
    listener: &'static str,
    limits: Limits,
    slots: Mutex<Slots>,
    refused: prometheus::IntCounterVec,
    log: LogLimit,
}

impl Gate {
    /// The gate of `listener` (the metric's `listener` label), counting into `refused`
    /// (labels `listener`, `reason`).
    pub(crate) fn new(
        listener: &'static str,
        limits: Limits,
        refused: prometheus::IntCounterVec,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            listener,
            limits,
            slots: Mutex::default(),
            refused,
            log: LogLimit::new(Duration::from_secs(10)),
        })
    }

    /// Closes idle connections every second while the gate is in use, on `tasks`.
    pub(crate) fn reap_on(self: &Arc<Self>, tasks: &crate::base::tasks::Tasks) {
        let gate = Arc::downgrade(self);
        tasks.spawn(reap_loop(gate));
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts and (at most every 10 s) logs a connection closed for `reason`.
    pub(crate) fn count(&self, reason: Reason, remote: Option<SocketAddr>) {
        self.refused
            .with_label_values(&[self.listener, reason.label()])
            .inc();
        // A refused TLS handshake is logged where it happens, with the reason.
        if reason != Reason::Handshake && self.log.due() {
            let remote = remote.map(|r| r.ip().to_string()).unwrap_or_default();
            let why = match reason {
                Reason::PerAddress => format!(
                    "its address has {} open (--max-connections-per-address)",
                    self.limits.per_address
                ),
                Reason::Full => format!(
                    "callers that proved who they are hold all {} slots",
                    self.limits.max
                ),
                Reason::Evicted => "a stranger's, to make room for a new connection".into(),
                Reason::Idle => "idle with no open call".into(),
                Reason::Handshake => "TLS handshake refused or timed out".into(),
            };
            tracing::warn!(
                listener = self.listener,
                %remote,
                "closed a connection: {why} (logged at most every 10 s; all are counted in \
                 conch_connections_refused_total)"
            );
        }
    }

    /// Admits a connection from `remote`, or says why not (counted already).
    pub(crate) fn admit(self: &Arc<Self>, remote: Option<SocketAddr>) -> Result<Admitted, Reason> {
        let limits = self.limits;
        let mut evicted = None;
        let admitted = {
            let mut slots = self.slots();
            let from_address =
                remote.map_or(0, |r| slots.by_address.get(&r.ip()).copied().unwrap_or(0));
            if from_address >= limits.per_address {
                Err(Reason::PerAddress)
            } else {
                let strangers_max = limits.max.saturating_sub(limits.reserved).max(1);
                if (slots.strangers.len() >= strangers_max || slots.open.len() >= limits.max)
                    && let Some(oldest) = slots.strangers.first().copied()
                {
                    evicted = slots.remove(oldest);
                }
                if slots.open.len() >= limits.max {
                    Err(Reason::Full)
                } else {
                    slots.next_id += 1;
                    let id = slots.next_id;
                    let conn = Arc::new(Conn {
                        id,
                        remote,
                        known: AtomicBool::new(false),
                        open_calls: AtomicUsize::new(0),
                        last_activity: Mutex::new(Instant::now()),
                        closed: AtomicBool::new(false),
                        wakers: Mutex::default(),
                    });
                    slots.open.insert(id, Arc::clone(&conn));
                    slots.strangers.insert(id);
                    if let Some(remote) = remote {
                        *slots.by_address.entry(remote.ip()).or_insert(0) += 1;
                        slots.by_remote.insert(remote, id);
                    }
                    Ok(Admitted {
                        conn,
                        gate: Arc::clone(self),
                    })
                }
            }
        };
        if let Some(evicted) = evicted {
            evicted.close();
            self.count(Reason::Evicted, evicted.remote);
        }
        if let Err(reason) = &admitted {
            self.count(*reason, remote);
        }
        admitted
    }

    /// The open connection from `remote`.
    pub(crate) fn conn_from(&self, remote: SocketAddr) -> Option<Arc<Conn>> {
        let slots = self.slots();
        let id = slots.by_remote.get(&remote)?;
        slots.open.get(id).cloned()
    }

    /// Marks `conn` as a known caller's: it leaves the strangers.
    pub(crate) fn know(&self, conn: &Conn) {
        if conn.known.swap(true, Ordering::SeqCst) {
            return;
        }
        self.slots().strangers.remove(&conn.id);
    }

    /// Closes the connections idle past their time; how many.
    pub(crate) fn reap(&self, now: Instant) -> usize {
        let idle: Vec<Arc<Conn>> = {
            let mut slots = self.slots();
            let ids: Vec<u64> = slots
                .open
                .values()
                .filter(|c| {
                    let limit = if c.is_known() {
                        self.limits.known_idle
                    } else {
                        self.limits.stranger_idle
                    };
                    let last = *c.last_activity.lock().unwrap_or_else(|p| p.into_inner());
                    c.open_calls.load(Ordering::SeqCst) == 0
                        && now.saturating_duration_since(last) >= limit
                })
                .map(|c| c.id)
                .collect();
            ids.into_iter().filter_map(|id| slots.remove(id)).collect()
        };
        for conn in &idle {
            conn.close();
            self.count(Reason::Idle, conn.remote);
        }
        idle.len()
    }

    #[cfg(test)]
    fn open(&self) -> (usize, usize) {
        let slots = self.slots();
        (slots.open.len(), slots.strangers.len())
    }
}

async fn reap_loop(gate: Weak<Gate>) {
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let Some(gate) = gate.upgrade() else {
            return;
        };
        gate.reap(Instant::now());
    }
}

/// A connection's place in its gate, given back when dropped.
pub(crate) struct Admitted {
    conn: Arc<Conn>,
    gate: Arc<Gate>,
}

impl Admitted {
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// `io`, closed when the gate closes this connection.
    pub(crate) fn wrap<IO>(self, io: IO) -> Guarded<IO> {
        Guarded { io, slot: self }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.gate.slots().remove(self.conn.id);
    }
}

/// An accepted connection holding its slot while it lives; it fails its reads and writes once
/// its gate closes it.
pub(crate) struct Guarded<IO> {
    io: IO,
    slot: Admitted,
}

impl<IO> Guarded<IO> {
    fn closed_error() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionAborted, "closed by the node")
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.slot.conn.poll_closed(0, cx) {
            return Poll::Ready(Err(Self::closed_error()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.slot.conn.poll_closed(1, cx) {
            return Poll::Ready(Err(Self::closed_error()));
        }
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
        if self.slot.conn.poll_closed(1, cx) {
            return Poll::Ready(Err(Self::closed_error()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The connections of `incoming` that `gate` admits, each guarded.
pub(crate) fn guard<S, IO>(
    incoming: S,
    gate: Arc<Gate>,
) -> impl futures::Stream<Item = io::Result<Guarded<IO>>>
where
    S: futures::Stream<Item = io::Result<IO>>,
    IO: Connected<ConnectInfo = TcpConnectInfo>,
{
    use futures::StreamExt;
    incoming.filter_map(move |accepted| {
        let admitted = accepted.map(|io| {
            let remote = io.connect_info().remote_addr();
            gate.admit(remote).map(|slot| slot.wrap(io))
        });
        std::future::ready(match admitted {
            Err(e) => Some(Err(e)),
            Ok(Ok(guarded)) => Some(Ok(guarded)),
            Ok(Err(_)) => None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(max: usize, reserved: usize, per_address: usize) -> Arc<Gate> {
        let refused = prometheus::IntCounterVec::new(
            prometheus::Opts::new("r", "r"),
            &["listener", "reason"],
        )
        .expect("counter");
        Gate::new(
            "client",
            Limits {
                max,
                reserved,
                per_address,
                stranger_idle: Duration::from_secs(10),
                known_idle: Duration::from_secs(300),
            },
            refused,
        )
    }

    fn from(ip: [u8; 4], port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from((ip, port)))
    }

    fn refused(gate: &Gate, reason: Reason) -> u64 {
        gate.refused
            .with_label_values(&["client", reason.label()])
            .get()
    }

    #[test]
    fn one_address_holds_at_most_its_share_and_others_still_get_in() {
        let gate = gate(100, 10, 3);
        let held: Vec<_> = (0..3)
            .map(|p| gate.admit(from([127, 0, 0, 2], p)).ok())
            .collect();
        assert!(held.iter().all(Option::is_some));
        assert_eq!(
            gate.admit(from([127, 0, 0, 2], 9)).err(),
            Some(Reason::PerAddress)
        );
        assert_eq!(refused(&gate, Reason::PerAddress), 1);
        assert!(gate.admit(from([127, 0, 0, 1], 1)).is_ok());
        drop(held);
        assert_eq!(gate.open(), (0, 0), "every slot given back");
        assert!(gate.admit(from([127, 0, 0, 2], 9)).is_ok());
    }

    #[test]
    fn a_new_connection_closes_the_oldest_stranger_but_never_a_known_caller() {
        let gate = gate(4, 1, 100);
        let known = gate.admit(from([10, 0, 0, 1], 1)).expect("admitted");
        gate.know(known.conn());
        let strangers: Vec<_> = (0..3)
            .map(|p| gate.admit(from([10, 0, 0, 2], p)).expect("admitted"))
            .collect();
        assert_eq!(gate.open(), (4, 3));
        // The strangers' room (3) is full: the next one takes the oldest stranger's slot.
        let newest = gate.admit(from([10, 0, 0, 3], 1)).expect("admitted");
        assert!(strangers[0].conn().closed.load(Ordering::SeqCst));
        assert!(!strangers[1].conn().closed.load(Ordering::SeqCst));
        assert!(!known.conn().closed.load(Ordering::SeqCst));
        assert_eq!(refused(&gate, Reason::Evicted), 1);
        // Once every slot is a known caller's, a new connection is refused.
        for s in &strangers[1..] {
            gate.know(s.conn());
        }
        gate.know(newest.conn());
        assert_eq!(gate.admit(from([10, 0, 0, 4], 1)).err(), Some(Reason::Full));
        assert!(!newest.conn().closed.load(Ordering::SeqCst));
    }

    #[test]
    fn idle_strangers_go_soon_known_callers_later_and_open_calls_never() {
        let gate = gate(100, 10, 100);
        let stranger = gate.admit(from([10, 0, 0, 2], 1)).expect("admitted");
        let known = gate.admit(from([10, 0, 0, 1], 1)).expect("admitted");
        gate.know(known.conn());
        let busy = gate.admit(from([10, 0, 0, 3], 1)).expect("admitted");
        let call = busy.conn().call();
        let now = Instant::now();
        assert_eq!(gate.reap(now), 0);
        assert_eq!(gate.reap(now + Duration::from_secs(11)), 1);
        assert!(stranger.conn().closed.load(Ordering::SeqCst));
        assert!(!known.conn().closed.load(Ordering::SeqCst));
        assert!(!busy.conn().closed.load(Ordering::SeqCst), "a call is open");
        assert_eq!(gate.reap(now + Duration::from_secs(301)), 1);
        assert!(known.conn().closed.load(Ordering::SeqCst));
        assert!(!busy.conn().closed.load(Ordering::SeqCst));
        drop(call);
        assert_eq!(gate.reap(Instant::now() + Duration::from_secs(11)), 1);
        assert_eq!(refused(&gate, Reason::Idle), 3);
    }

    #[tokio::test]
    async fn a_closed_connection_fails_its_pending_read() {
        use tokio::io::AsyncReadExt;
        let gate = gate(100, 10, 100);
        let (io, _peer) = tokio::io::duplex(64);
        let slot = gate.admit(from([10, 0, 0, 2], 1)).expect("admitted");
        let mut guarded = slot.wrap(io);
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            guarded.read(&mut buf).await.map_err(|e| e.kind())
        });
        tokio::task::yield_now().await;
        gate.reap(Instant::now() + Duration::from_secs(11));
        let read = reading.await.ok();
        assert_eq!(read, Some(Err(io::ErrorKind::ConnectionAborted)));
        assert_eq!(gate.open(), (0, 0));
    }
}

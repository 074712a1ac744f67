//! A follower's forwarded batches on one long-lived `ConchPeer.ProposeStream` call to the
//! leader, instead of one unary `ConchPeer.Propose` call each.
//!
//! Several batches are in flight at once, so every request carries an id ([`ForwardRequest`])
//! and every reply names the id it answers ([`ForwardReply`]); replies come in whatever order
//! the leader commits the batches. What a forward's caller learns keeps the unary call's rule
//! (see `forward_failure` in `node.rs`): a batch is tried again elsewhere only when the leader
//! certainly did not take it. Here that is a batch that never went out because no stream could
//! be opened ([`ForwardFailure::NotSent`]), or one the leader answered not-leader (an `Err` in
//! its reply). Once a batch went out on a stream, a stream that breaks, ends, or goes without an
//! answer for the forward's time leaves its outcome unknown ([`ForwardFailure::Unknown`]), and
//! that of every other batch in flight on it: they are all answered so at once, and the next
//! forward opens a new stream.
//!
//! One stream is kept, to the leader the last forward went to: a forward to another leader (or
//! to the same leader once this node learned its cluster's id or name, which the call's headers
//! carry) opens a stream to it and lets the old one go (the batches still on it get their
//! answers; then its requests end, and the leader ends it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use conch_proto::conch::PeerMessage;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::base::error::NodeError;
use crate::base::tasks::Tasks;
use crate::raft::NodeId;
use crate::raft::network::{Identity, PeerChannel, decode, encode, peer_client, request_stream};
use crate::state::{Cmd, Reply};

/// What the leader answers a forwarded batch: its replies and the entry's index, or why not
/// (a unary `Propose` reply's payload is the same).
pub(crate) type Proposed = Result<(Vec<Reply>, u64), NodeError>;

/// One forwarded batch on the stream: `Propose`'s payload with an id. Sent as
/// `ForwardRequest<&[Cmd]>`, read as `ForwardRequest<Vec<Cmd>>` (the same bytes).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ForwardRequest<C> {
    pub id: u64,
    pub cmds: C,
}

/// The leader's answer to the forward `id`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ForwardReply {
    pub id: u64,
    pub result: Proposed,
}

/// Why a forward got no answer from the leader over the stream.
#[derive(Debug)]
pub(crate) enum ForwardFailure {
    /// The leader does not serve `ProposeStream` (a node of the previous version): nothing was
    /// sent; forward with `Propose`.
    Unsupported,
    /// No stream could be opened, so nothing was sent: the status the opening failed with.
    NotSent(tonic::Status),
    /// The batch went out and no answer came back: the leader may have committed it.
    Unknown(String),
}

/// Where a forward goes: the leader's id, the address dialed, and the identity this node's
/// headers carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub id: NodeId,
    pub addr: String,
    pub identity: Identity,
}

/// Attempts at sending one batch on a fresh stream that closed before it went out.
const SEND_ATTEMPTS: usize = 3;

/// A node's forward stream: at most one open, to the leader of the last forward.
pub(crate) struct Forwarder {
    tasks: Tasks,
    next_id: AtomicU64,
    current: Mutex<Option<Arc<Slot>>>,
    opened: AtomicU64,
    /// The leader (id, address dialed, term) that answered the stream `UNIMPLEMENTED`: it is
    /// sent unary `Propose` calls until another node leads, or it leads a later term (it may
    /// have been upgraded and restarted meanwhile).
    unary: Mutex<Option<(NodeId, String, u64)>>,
}

/// The stream to one target, opened on the first forward to it (one opening at a time).
struct Slot {
    target: Target,
    stream: tokio::sync::Mutex<Option<Arc<ForwardStream>>>,
}

/// One open `ProposeStream` call.
struct ForwardStream {
    requests: mpsc::UnboundedSender<PeerMessage>,
    pending: Arc<Pending>,
}

/// The forwards sent on one stream and not answered yet.
#[derive(Default)]
struct Pending {
    state: Mutex<PendingState>,
    /// Told when the stream is given up: its reader stops, which cancels the call.
    given_up: Notify,
}

#[derive(Default)]
struct PendingState {
    /// Why the stream ended, once it has: nothing more is sent on it.
    ended: Option<String>,
    /// By id, in order: a stream's end answers them in the order they were sent, the same in
    /// every run (the simulator replays a run exactly).
    waiting: BTreeMap<u64, oneshot::Sender<Result<Proposed, String>>>,
}

impl Pending {
    /// Awaits the answer to `id`; `None` once the stream has ended (then send nothing on it).
    fn register(&self, id: u64) -> Option<oneshot::Receiver<Result<Proposed, String>>> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.ended.is_some() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        state.waiting.insert(id, tx);
        Some(rx)
    }

    /// Forgets `id`, which was not sent.
    fn forget(&self, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.waiting.remove(&id);
    }

    /// Hands the leader's answer to the forward it names. An id nobody awaits (its forward gave
    /// up) is dropped.
    fn answer(&self, reply: ForwardReply) {
        let waiting = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.waiting.remove(&reply.id)
        };
        if let Some(waiting) = waiting {
            let _ = waiting.send(Ok(reply.result));
        }
    }

    /// The stream ended (`why`): every forward still in flight on it learns its outcome is
    /// unknown, and nothing more is sent on it.
    fn end(&self, why: &str) {
        let waiting = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.ended.get_or_insert_with(|| why.to_string());
            std::mem::take(&mut state.waiting)
        };
        for (_, waiting) in waiting {
            let _ = waiting.send(Err(why.to_string()));
        }
        self.given_up.notify_one();
    }

    fn ended(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.ended.is_some()
    }
}

impl Forwarder {
    pub(crate) fn new(tasks: Tasks) -> Forwarder {
        Forwarder {
            tasks,
            next_id: AtomicU64::new(1),
            current: Mutex::new(None),
            opened: AtomicU64::new(0),
            unary: Mutex::new(None),
        }
    }

    /// Whether forwards to `target` while it leads `term` go as unary `Propose` calls.
    pub(crate) fn unary(&self, target: &Target, term: u64) -> bool {
        let unary = self.unary.lock().unwrap_or_else(|p| p.into_inner());
        unary
            .as_ref()
            .is_some_and(|(id, addr, t)| *id == target.id && *addr == target.addr && *t == term)
    }

    /// `target`, leading `term`, does not serve the stream: forward to it with `Propose`.
    pub(crate) fn use_unary(&self, target: &Target, term: u64) {
        let mut unary = self.unary.lock().unwrap_or_else(|p| p.into_inner());
        *unary = Some((target.id, target.addr.clone(), term));
    }

    /// How many streams this node has opened (to any leader). (the tests read it)
    #[cfg(test)]
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Forwards `cmds` to `target` over the stream to it (opened on `channel` when none is
    /// open), waiting for the answer until `deadline`.
    pub(crate) async fn forward(
        &self,
        target: &Target,
        channel: PeerChannel,
        cmds: &[Cmd],
        deadline: tokio::time::Instant,
    ) -> Result<Proposed, ForwardFailure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let payload = encode(&ForwardRequest { id, cmds })
            .map_err(|e| ForwardFailure::NotSent(tonic::Status::internal(e.to_string())))?;
        let mut message = PeerMessage { payload };
        let slot = self.slot(target);
        let mut attempts = 0;
        let (stream, answer) = loop {
            let opened = tokio::time::timeout_at(deadline, self.stream(&slot, &channel)).await;
            let stream = match opened {
                Ok(opened) => opened?,
                Err(_) => {
                    return Err(ForwardFailure::NotSent(tonic::Status::deadline_exceeded(
                        "no forward stream opened in time",
                    )));
                }
            };
            if let Some(answer) = stream.pending.register(id) {
                match stream.requests.send(message) {
                    Ok(()) => break (stream, answer),
                    Err(unsent) => {
                        // The call is gone (its requests are no longer read): nothing was
                        // queued.
                        message = unsent.0;
                        stream.pending.forget(id);
                        stream.pending.end("the forward stream closed");
                    }
                }
            }
            attempts += 1;
            if attempts >= SEND_ATTEMPTS {
                return Err(ForwardFailure::NotSent(tonic::Status::unavailable(
                    "the forward stream closed before the batch went out",
                )));
            }
        };
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(Ok(proposed))) => Ok(proposed),
            Ok(Ok(Err(why))) => Err(ForwardFailure::Unknown(why)),
            Ok(Err(_)) => Err(ForwardFailure::Unknown(
                "the forward stream closed".to_string(),
            )),
            Err(_) => {
                // A leader that stopped answering (paused, partitioned): every batch on this
                // stream waits in vain, and new ones must not join them.
                let why = "the leader did not answer in time";
                stream.pending.end(why);
                Err(ForwardFailure::Unknown(why.to_string()))
            }
        }
    }

    /// The slot for `target`: the current one, or a new one that replaces it (the old stream is
    /// let go once the forwards on it are answered).
    fn slot(&self, target: &Target) -> Arc<Slot> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some(slot) if slot.target == *target => Arc::clone(slot),
            _ => {
                let slot = Arc::new(Slot {
                    target: target.clone(),
                    stream: tokio::sync::Mutex::new(None),
                });
                *current = Some(Arc::clone(&slot));
                slot
            }
        }
    }

    /// The open stream of `slot`, or a new one.
    async fn stream(
        &self,
        slot: &Slot,
        channel: &PeerChannel,
    ) -> Result<Arc<ForwardStream>, ForwardFailure> {
        let mut stream = slot.stream.lock().await;
        if let Some(open) = stream.as_ref().filter(|s| !s.pending.ended()) {
            return Ok(Arc::clone(open));
        }
        *stream = None;
        let open = Arc::new(self.open(channel.clone()).await?);
        *stream = Some(Arc::clone(&open));
        Ok(open)
    }

    /// Opens a `ProposeStream` call. Resolves once the leader answered the opening; nothing is
    /// sent on the call before, so a failed opening sent no batch.
    async fn open(&self, channel: PeerChannel) -> Result<ForwardStream, ForwardFailure> {
        let (requests, outgoing) = request_stream();
        let mut client = peer_client(channel);
        let replies = match client.propose_stream(tonic::Request::new(outgoing)).await {
            Ok(replies) => replies.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return Err(ForwardFailure::Unsupported);
            }
            Err(status) => return Err(ForwardFailure::NotSent(status)),
        };
        self.opened.fetch_add(1, Ordering::Relaxed);
        let pending = Arc::new(Pending::default());
        self.tasks
            .spawn(read_replies(replies, Arc::clone(&pending)));
        Ok(ForwardStream { requests, pending })
    }
}

/// Reads the leader's replies and hands each to the forward it names, until the stream ends
/// or is given up; then every forward still waiting on it learns its outcome is unknown.
async fn read_replies(mut replies: tonic::Streaming<PeerMessage>, pending: Arc<Pending>) {
    let why = loop {
        let message = tokio::select! {
            () = pending.given_up.notified() => return,
            message = replies.message() => message,
        };
        match message {
            Ok(Some(message)) => match decode::<ForwardReply>(&message.payload) {
                Ok(reply) => pending.answer(reply),
                Err(e) => break format!("the leader's reply could not be read: {e}"),
            },
            Ok(None) => break "the leader ended the forward stream".to_string(),
            Err(status) => break format!("the forward stream failed: {}", status.message()),
        }
    };
    pending.end(&why);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use conch_proto::conch::conch_peer_server::{ConchPeer, ConchPeerServer};
    use tokio::sync::watch;
    use tonic::{Request, Response, Status, Streaming};

    use super::*;
    use crate::data_dir::identity::{ClusterId, PeerStamp, WithClusterId};

    /// How the test leader treats `ProposeStream`.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Leads {
        /// Answers once `hold` batches arrived, the last first: a batch of n commands is
        /// answered with index n.
        Answers { hold: usize },
        /// Answers every batch "not the leader".
        NotLeader,
        /// Its first stream fails once `hold` batches arrived, answering none; later streams
        /// answer at once.
        BreaksFirst { hold: usize },
        /// Takes every batch and answers none.
        Silent,
        /// Refuses the opening with this code.
        Refuses(tonic::Code),
    }

    struct TestLeader {
        leads: Leads,
        opened: Arc<AtomicUsize>,
        /// Every batch received (its command count), in order.
        received: watch::Sender<Vec<usize>>,
    }

    type Replies =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<PeerMessage, Status>> + Send>>;

    fn reply_to(request: &ForwardRequest<Vec<Cmd>>, not_leader: bool) -> PeerMessage {
        let result = if not_leader {
            Err(NodeError::NotLeader { node: 2 })
        } else {
            Ok((Vec::new(), request.cmds.len() as u64))
        };
        let reply = ForwardReply {
            id: request.id,
            result,
        };
        PeerMessage {
            payload: encode(&reply).unwrap_or_default(),
        }
    }

    #[tonic::async_trait]
    impl ConchPeer for TestLeader {
        async fn append_entries(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("append_entries"))
        }

        type AppendEntriesStreamStream = Replies;

        async fn append_entries_stream(
            &self,
            _: Request<Streaming<PeerMessage>>,
        ) -> Result<Response<Replies>, Status> {
            Err(Status::unimplemented("append_entries_stream"))
        }

        async fn vote(&self, _: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("vote"))
        }

        async fn install_snapshot(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("install_snapshot"))
        }

        async fn propose(&self, _: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("propose"))
        }

        type ProposeStreamStream = Replies;

        async fn propose_stream(
            &self,
            request: Request<Streaming<PeerMessage>>,
        ) -> Result<Response<Replies>, Status> {
            let first = self.opened.fetch_add(1, Ordering::SeqCst) == 0;
            if let Leads::Refuses(code) = self.leads {
                return Err(Status::new(code, "refused"));
            }
            let leads = self.leads;
            let received = self.received.clone();
            let mut inbound = request.into_inner();
            let (replies, outgoing) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok(Some(message)) = inbound.message().await {
                    let Ok(request) = decode::<ForwardRequest<Vec<Cmd>>>(&message.payload) else {
                        let _ = replies.send(Err(Status::invalid_argument("malformed")));
                        return;
                    };
                    received.send_modify(|r| r.push(request.cmds.len()));
                    let hold = match leads {
                        Leads::Answers { hold } => hold,
                        Leads::BreaksFirst { hold } if first => {
                            held.push(request);
                            if held.len() == hold {
                                let _ = replies.send(Err(Status::unavailable("broken")));
                                return;
                            }
                            continue;
                        }
                        Leads::NotLeader => {
                            let _ = replies.send(Ok(reply_to(&request, true)));
                            continue;
                        }
                        Leads::Silent => continue,
                        _ => 1,
                    };
                    held.push(request);
                    if held.len() == hold {
                        for request in held.drain(..).rev() {
                            let _ = replies.send(Ok(reply_to(&request, false)));
                        }
                    }
                }
            });
            let outgoing = futures::stream::unfold(outgoing, |mut outgoing| async move {
                outgoing.recv().await.map(|reply| (reply, outgoing))
            });
            Ok(Response::new(Box::pin(outgoing)))
        }

        async fn read_index(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("read_index"))
        }

        async fn removed(&self, _: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("removed"))
        }

        async fn node_info(
            &self,
            _: Request<PeerMessage>,
        ) -> Result<Response<PeerMessage>, Status> {
            Err(Status::unimplemented("node_info"))
        }
    }

    struct Served {
        forwarder: Forwarder,
        target: Target,
        channel: PeerChannel,
        opened: Arc<AtomicUsize>,
        received: watch::Receiver<Vec<usize>>,
        _dir: tempfile::TempDir,
    }

    /// A forwarder on loopback to a [`TestLeader`] (node 2), or to a port nobody serves.
    async fn serve(leads: Option<Leads>) -> anyhow::Result<Served> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let opened = Arc::new(AtomicUsize::new(0));
        let (received_tx, received) = watch::channel(Vec::new());
        match leads {
            Some(leads) => {
                let leader = TestLeader {
                    leads,
                    opened: Arc::clone(&opened),
                    received: received_tx,
                };
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .add_service(ConchPeerServer::new(leader))
                        .serve_with_incoming(incoming),
                );
            }
            None => drop(listener),
        }
        let dir = tempfile::tempdir()?;
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(5));
        let channel = WithClusterId::new(
            endpoint.connect_lazy(),
            Arc::new(ClusterId::open(dir.path())?),
            Arc::new(PeerStamp::new(1, None, "127.0.0.1:1")),
        );
        Ok(Served {
            forwarder: Forwarder::new(Tasks::new()),
            target: Target {
                id: 2,
                addr,
                identity: (None, None),
            },
            channel,
            opened,
            received,
            _dir: dir,
        })
    }

    fn batch(n: usize) -> Vec<Cmd> {
        vec![Cmd::ExtendLeases; n]
    }

    fn patient() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(30)
    }

    impl Served {
        async fn forward(&self, n: usize) -> Result<Proposed, ForwardFailure> {
            self.forwarder
                .forward(&self.target, self.channel.clone(), &batch(n), patient())
                .await
        }

        /// Waits until the leader has received `n` batches in all.
        async fn received(&self, n: usize) -> anyhow::Result<()> {
            let mut received = self.received.clone();
            tokio::time::timeout(Duration::from_secs(30), received.wait_for(|r| r.len() >= n))
                .await??;
            Ok(())
        }
    }

    fn index(answer: Result<Proposed, ForwardFailure>) -> anyhow::Result<u64> {
        match answer {
            Ok(Ok((_, index))) => Ok(index),
            other => anyhow::bail!("not an answer: {other:?}"),
        }
    }

    fn unknown(answer: Result<Proposed, ForwardFailure>) -> anyhow::Result<String> {
        match answer {
            Err(ForwardFailure::Unknown(why)) => Ok(why),
            other => anyhow::bail!("not an unknown outcome: {other:?}"),
        }
    }

    #[tokio::test]
    async fn concurrent_forwards_share_one_stream_and_each_gets_its_own_answer()
    -> anyhow::Result<()> {
        let served = serve(Some(Leads::Answers { hold: 3 })).await?;
        // Answered last-first: each forward still gets the answer to its own batch.
        let (a, b, c) = tokio::join!(served.forward(1), served.forward(2), served.forward(3));
        assert_eq!((index(a)?, index(b)?, index(c)?), (1, 2, 3));
        assert_eq!(served.opened.load(Ordering::SeqCst), 1);
        assert_eq!(served.forwarder.opened(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_broken_stream_answers_every_batch_on_it_unknown_and_the_next_opens_another()
    -> anyhow::Result<()> {
        let served = serve(Some(Leads::BreaksFirst { hold: 3 })).await?;
        let (a, b, c) = tokio::join!(served.forward(1), served.forward(2), served.forward(3));
        for answer in [a, b, c] {
            let why = unknown(answer)?;
            assert!(why.contains("broken"), "{why}");
        }
        assert_eq!(index(served.forward(4).await)?, 4);
        assert_eq!(served.opened.load(Ordering::SeqCst), 2);
        let mut received = served.received.borrow().clone();
        received.sort_unstable();
        assert_eq!(received, [1, 2, 3, 4]);
        Ok(())
    }

    #[tokio::test]
    async fn a_leader_that_does_not_answer_in_time_leaves_every_batch_on_the_stream_unknown()
    -> anyhow::Result<()> {
        let served = Arc::new(serve(Some(Leads::Silent)).await?);
        let waiting = {
            let served = Arc::clone(&served);
            tokio::spawn(async move { served.forward(1).await })
        };
        served.received(1).await?;
        let hurried = tokio::time::Instant::now() + Duration::from_millis(200);
        let timed_out = served
            .forwarder
            .forward(&served.target, served.channel.clone(), &batch(2), hurried)
            .await;
        let why = unknown(timed_out)?;
        // The batch forwarded before, whose own deadline is far off, is answered with it.
        assert_eq!(unknown(waiting.await?)?, why);
        assert!(why.contains("did not answer in time"), "{why}");
        // The next batch goes out on a new stream.
        let later = tokio::time::Instant::now() + Duration::from_secs(2);
        let next = served
            .forwarder
            .forward(&served.target, served.channel.clone(), &batch(3), later)
            .await;
        unknown(next)?;
        assert_eq!(served.opened.load(Ordering::SeqCst), 2);
        Ok(())
    }

    #[tokio::test]
    async fn a_refused_opening_or_no_connection_sends_nothing() -> anyhow::Result<()> {
        for code in [tonic::Code::Unavailable, tonic::Code::PermissionDenied] {
            let served = serve(Some(Leads::Refuses(code))).await?;
            match served.forward(1).await {
                Err(ForwardFailure::NotSent(status)) => assert_eq!(status.code(), code),
                other => anyhow::bail!("{code:?}: {other:?}"),
            }
            assert!(served.received.borrow().is_empty());
            assert_eq!(served.forwarder.opened(), 0);
        }
        let nobody = serve(None).await?;
        match nobody.forward(1).await {
            Err(ForwardFailure::NotSent(status)) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}")
            }
            other => anyhow::bail!("no leader there: {other:?}"),
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_leader_without_the_stream_is_reported_once_per_forward() -> anyhow::Result<()> {
        let served = serve(Some(Leads::Refuses(tonic::Code::Unimplemented))).await?;
        assert!(matches!(
            served.forward(1).await,
            Err(ForwardFailure::Unsupported)
        ));
        assert!(!served.forwarder.unary(&served.target, 7));
        served.forwarder.use_unary(&served.target, 7);
        assert!(served.forwarder.unary(&served.target, 7));
        // The same node leading a later term is asked for the stream again.
        assert!(!served.forwarder.unary(&served.target, 8));
        Ok(())
    }

    #[tokio::test]
    async fn a_not_leader_answer_is_the_batchs_alone() -> anyhow::Result<()> {
        let served = serve(Some(Leads::NotLeader)).await?;
        for n in 1..=2 {
            match served.forward(n).await {
                Ok(Err(NodeError::NotLeader { node: 2 })) => {}
                other => anyhow::bail!("not a refusal: {other:?}"),
            }
        }
        assert_eq!(
            served.opened.load(Ordering::SeqCst),
            1,
            "the stream stays open"
        );
        Ok(())
    }

    #[test]
    fn a_request_is_read_as_it_was_sent() -> anyhow::Result<()> {
        let cmds = batch(3);
        let sent = encode(&ForwardRequest {
            id: 9,
            cmds: cmds.as_slice(),
        })?;
        let read: ForwardRequest<Vec<Cmd>> = decode(&sent)?;
        assert_eq!(read.id, 9);
        assert_eq!(read.cmds.len(), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_forward_to_another_leader_opens_a_stream_to_it() -> anyhow::Result<()> {
        let first = serve(Some(Leads::Answers { hold: 1 })).await?;
        let second = serve(Some(Leads::Answers { hold: 1 })).await?;
        let forwarder = &first.forwarder;
        for (served, n) in [(&first, 1), (&second, 2), (&first, 3)] {
            let answer = forwarder
                .forward(&served.target, served.channel.clone(), &batch(n), patient())
                .await;
            assert_eq!(index(answer)?, n as u64);
        }
        assert_eq!(first.opened.load(Ordering::SeqCst), 2);
        assert_eq!(second.opened.load(Ordering::SeqCst), 1);
        assert_eq!(forwarder.opened(), 3);
        Ok(())
    }
}

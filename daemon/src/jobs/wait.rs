//! The blocking wait of a queued acquire, in one place: the wait itself, giving up through the
//! log, and giving up with a linger when the caller goes away. The registry of waiting callers
//! that the apply path feeds is `waiters.rs`.
//!
//! Every node applies every entry, so a caller waits on the node it is connected to, and a grant
//! wakes exactly the callers waiting for that (semaphore, lease). The applied state is the
//! truth; events only wake a waiting call. See `docs/design.md` (Blocking waits).
//!
//! Invariants:
//! - a wait registered before its acquire is proposed never misses the event that ends it
//! - events are delivered before the state that produced them can be read: a caller that reads
//!   a state finds every event up to it already in its ticket (the apply path delivers under the
//!   state lock)
//! - a wait that ends without an answer from the state (deadline passed locally, node cannot
//!   catch up) asks the log with `GiveUp`, whose reply says whether a grant came first; a grant
//!   committed before the give-up is reported, never leaked

use std::sync::Arc;
use std::time::Duration;

use crate::base::error::NodeError;
use crate::callers::waiters::{WaitEvent, WaitKey, WaitOutcome, WaitTicket, Wake};
use crate::node::Node;
use crate::state::{Cmd, Error, GiveUpReply, NANOS_PER_SEC, Nanos, Outcome, WaitEnd, lock_path};

/// How long after its deadline a waiting call gives up on its own if the leader's clock has not
/// timed the waiter out (e.g. no leader).
const WAIT_GRACE: Duration = Duration::from_millis(500);

/// How long the waiter of a call that went away (cancelled, connection broken) keeps its place,
/// so a client that re-attaches through another connection does not lose its queue position.
const ABANDONED_WAIT_LINGER_NS: Nanos = 5 * NANOS_PER_SEC;

/// Why a wait ended without an answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WaitError {
    /// The waiter's lease or semaphore went away, or the give-up was refused.
    #[error(transparent)]
    State(#[from] Error),
    /// The give-up could not be committed.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// A wait's grant: its fencing token and how long the hold may last from the grant on, at
/// most (0: no hold limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Granted {
    pub token: u64,
    pub hold_ns: Nanos,
}

/// Waits for a queued acquire to end: `Some` grant when granted, `None` when it timed out or
/// gave up. `index` is the log index of the acquire that queued: until this node has applied
/// it, its state knows nothing of the waiter, so it is not read before then. A node that cannot
/// catch up before the deadline asks the log instead (GiveUp answers whether the grant came
/// first). If the returned future is dropped (the caller went away), the waiter lingers briefly
/// in case the client re-attaches, then leaves the queue.
pub(crate) async fn wait_for_grant(
    node: &Arc<Node>,
    ticket: &mut WaitTicket,
    deadline_ns: Nanos,
    index: u64,
) -> Result<Option<Granted>, WaitError> {
    // The waiter's names as the registry holds them: shared, never copied for the wait.
    let key = Arc::clone(ticket.key());
    let mut give_up = GiveUpOnDrop {
        node: Arc::clone(node),
        key: Some(Arc::clone(&key)),
        deadline_ns,
    };
    // The deadline is on the lease clock: what is left of it is measured from this node's
    // applied state (at or after the acquire's entry once caught up) and waited out on the
    // monotonic clock, never compared with a wall clock.
    let clock_ns = node.applied.read(|state| state.clock_ns());
    let remaining =
        Duration::from_nanos(u64::try_from(deadline_ns.saturating_sub(clock_ns)).unwrap_or(0));
    let local_deadline = tokio::time::Instant::now() + remaining + WAIT_GRACE;
    // The node's timer and stop signal serve every wait: this call keeps only its ticket.
    let tasks = node.tasks.clone();
    if let Some(timer) = node
        .applied
        .wait_timer(async move { tasks.stopping().await })
    {
        node.tasks.spawn(timer);
    }
    // Boxed whole, like the give-up below: a waiting call's future keeps only the wait's own
    // state, not the catching up's.
    let caught_up = if crate::sim_hooks::regressions::active(
        crate::sim_hooks::regressions::Bug::PhantomHold,
    ) {
        Ok(())
    } else {
        let catch_up = Box::pin(async {
            tokio::select! {
                caught_up = tokio::time::timeout_at(local_deadline, node.applied.wait_applied(index)) => Some(caught_up),
                () = node.tasks.stopping() => None,
            }
        });
        match catch_up.await {
            Some(caught_up) => caught_up,
            None => return Err(stopping().into()),
        }
    };
    if caught_up.is_err() {
        give_up.disarm();
        return Box::pin(give_up_now(node, &key, deadline_ns, ticket, index)).await;
    }
    ticket.arm(local_deadline);
    // Events from before this acquire's entry concern an earlier wait of the same lease.
    let mut last = None;
    let note = |event: WaitEvent, last: &mut Option<WaitOutcome>| {
        if event.index >= index || event.outcome == WaitOutcome::Recheck {
            *last = Some(event.outcome);
        }
    };
    loop {
        let queued = node
            .applied
            .read(|s| s.waiter(&key.ns, &key.sem, &key.lease).is_some());
        // Every event up to the state just read is already in the ticket.
        while let Some(event) = ticket.try_next() {
            note(event, &mut last);
        }
        if !queued {
            give_up.disarm();
            return ended(node, &key, last);
        }
        match ticket.next().await {
            Wake::Event(event) => note(event, &mut last),
            Wake::DeadlinePassed => {
                give_up.disarm();
                return Box::pin(give_up_now(node, &key, deadline_ns, ticket, index)).await;
            }
            // The node stops: the caller re-attaches through another node and keeps its place
            // (the waiter stays queued until its lease or its deadline ends it).
            Wake::Stopping => {
                give_up.disarm();
                return Err(stopping().into());
            }
        }
    }
}

/// Waits for a queued all-or-none acquire (`state/set.rs`) to end: `Some` grant per member
/// (in the order of `keys`) when granted, `None` when it timed out or gave up. `keys[0]` is the
/// set's primary member: the wait and its give-up name the set by it (a give-up naming a member
/// ends the whole set), and every member was granted in the entry that granted it. The other
/// members' grants come from their own tickets (registered, like the primary's, before the
/// acquire was proposed), or, for a state replaced by a snapshot, from the holder table.
pub(crate) async fn wait_for_set_grant(
    node: &Arc<Node>,
    keys: &[WaitKey],
    mut tickets: Vec<WaitTicket>,
    deadline_ns: Nanos,
    index: u64,
) -> Result<Option<Vec<Granted>>, WaitError> {
    let (Some(primary), false) = (keys.first(), tickets.is_empty()) else {
        return Ok(None);
    };
    let mut first = tickets.remove(0);
    debug_assert_eq!(**first.key(), *primary);
    let waited = wait_for_grant(node, &mut first, deadline_ns, index).await;
    let granted = match waited {
        Ok(Some(granted)) => granted,
        Ok(None) => return Ok(None),
        // The wait names the set by its first member; any member's deletion ends it.
        Err(WaitError::State(e)) if e.message.contains("was deleted while waiting") => {
            let names: Vec<&str> = keys.iter().map(|k| k.sem.as_str()).collect();
            return Err(Error::not_found(format!(
                "a semaphore of the set {} was deleted while waiting",
                names.join(", ")
            ))
            .into());
        }
        Err(e) => return Err(e),
    };
    // Every event of the entry that granted the set was delivered before its state can be read;
    // a grant answered by the leader (a give-up's reply) may not be applied here yet, so a member
    // not found is looked for again as this node applies more, for a while.
    node.applied.read(|_| ());
    let catch_up = tokio::time::Instant::now() + GIVE_UP_APPLY_WAIT;
    let mut applied = node.applied.subscribe_applied();
    let mut grants = vec![granted];
    for (key, ticket) in keys.iter().skip(1).zip(tickets.iter_mut()) {
        let mut grant = None;
        loop {
            while let Some(event) = ticket.try_next() {
                if let (true, WaitOutcome::Granted { token, hold_ns, .. }) =
                    (event.index >= index, event.outcome)
                {
                    grant = Some(Granted { token, hold_ns });
                }
            }
            // The holder table only once this node has applied the set acquire itself: the
            // lease held no member then (a set takes only semaphores it does not hold), so a
            // hold found from there on is the set's. Before it, the table may still show a
            // hold the lease released before asking (the release answered by the leader, not
            // yet applied here), with that hold's old token.
            let grant = grant.or_else(|| {
                (node.applied.applied_index() >= index)
                    .then(|| {
                        node.applied
                            .read(|s| s.holder(&key.ns, &key.sem, &key.lease))
                    })
                    .flatten()
                    .map(|h| Granted {
                        token: h.token,
                        hold_ns: h.hold_left_ns,
                    })
            });
            if let Some(grant) = grant {
                grants.push(grant);
                break;
            }
            if !matches!(
                tokio::time::timeout_at(catch_up, applied.changed()).await,
                Ok(Ok(()))
            ) {
                return Err(Error::not_found(format!(
                    "the hold of semaphore {} by lease {} ended before its grant was reported",
                    key.sem, key.lease
                ))
                .into());
            }
        }
    }
    Ok(Some(grants))
}

fn stopping() -> NodeError {
    NodeError::Unavailable(
        "this node is shutting down; retry through another node (the wait keeps its place)".into(),
    )
}

/// How long a give-up that committed waits for this node to apply it, to read the events
/// before it (a node that committed it is normally there within milliseconds).
const GIVE_UP_APPLY_WAIT: Duration = Duration::from_secs(5);

/// Ends this call's wait through the log: the answer says whether the grant came first. A grant
/// that came first and was undone before the give-up (the lease expired or was revoked while
/// this node was cut off) is still the answer: it was granted, and the caller learns of the
/// lease from its refresh. So the events up to the give-up, in `ticket` from the acquire's
/// entry `index` on, are read once this node has applied it.
async fn give_up_now(
    node: &Node,
    key: &WaitKey,
    deadline_ns: Nanos,
    ticket: &mut WaitTicket,
    index: u64,
) -> Result<Option<Granted>, WaitError> {
    let cmd = Cmd::GiveUp {
        ns: key.ns.clone(),
        sem: key.sem.clone(),
        lease: key.lease.clone(),
        deadline_ns,
        linger_ns: 0,
    };
    cmd.validate()?;
    let (reply, at) = node.write_one_at(cmd).await?;
    if let Outcome::GiveUp(GiveUpReply::Granted { token, hold_ns }) = reply? {
        return Ok(Some(Granted { token, hold_ns }));
    }
    let applied = tokio::time::timeout(GIVE_UP_APPLY_WAIT, node.applied.wait_applied(at)).await;
    let mut granted = None;
    while let Some(event) = ticket.try_next() {
        if let (true, WaitOutcome::Granted { token, hold_ns, .. }) =
            (event.index >= index, event.outcome)
        {
            granted = Some(Granted { token, hold_ns });
        }
    }
    if granted.is_none() && applied.is_err() {
        tracing::warn!(
            object = %key.sem,
            lease = %key.lease,
            "a give-up committed but this node did not apply it in time: answered as timed out"
        );
    }
    Ok(granted)
}

/// How a wait that left the queue ended.
fn ended(
    node: &Node,
    key: &WaitKey,
    last: Option<WaitOutcome>,
) -> Result<Option<Granted>, WaitError> {
    match last {
        Some(WaitOutcome::Granted { token, hold_ns, .. }) => Ok(Some(Granted { token, hold_ns })),
        Some(WaitOutcome::Ended(WaitEnd::LeaseGone)) => Err(Error::not_found(format!(
            "lease {} expired or was revoked while waiting for {}",
            key.lease,
            waited_for(&key.sem)
        ))
        .into()),
        Some(WaitOutcome::Ended(WaitEnd::SemaphoreGone)) => {
            Err(Error::not_found(match lock_path(&key.sem) {
                Some(path) => format!("the namespace of lock {path} was deleted while waiting"),
                None => format!("semaphore {} was deleted while waiting", key.sem),
            })
            .into())
        }
        Some(WaitOutcome::Ended(WaitEnd::TimedOut | WaitEnd::GaveUp)) => Ok(None),
        // No event seen (state replaced by a snapshot): the holder table decides.
        Some(WaitOutcome::Recheck) | None => Ok(node
            .applied
            .read(|s| s.holder(&key.ns, &key.sem, &key.lease))
            .map(|h| Granted {
                token: h.token,
                hold_ns: h.hold_left_ns,
            })),
    }
}

/// How messages name what a wait is for: a semaphore, or a lock (by its wait object).
fn waited_for(object: &str) -> String {
    match lock_path(object) {
        Some(path) => format!("lock {path}"),
        None => format!("semaphore {object}"),
    }
}

/// Gives up a wait when the waiting call goes away (client cancelled or disconnected): the
/// waiter lingers briefly in case the client re-attaches, then leaves the queue.
struct GiveUpOnDrop {
    node: Arc<Node>,
    key: Option<Arc<WaitKey>>,
    deadline_ns: Nanos,
}

impl GiveUpOnDrop {
    fn disarm(&mut self) {
        self.key = None;
    }
}

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let node = Arc::clone(&self.node);
        let cmd = Cmd::GiveUp {
            ns: key.ns.clone(),
            sem: key.sem.clone(),
            lease: key.lease.clone(),
            deadline_ns: self.deadline_ns,
            linger_ns: ABANDONED_WAIT_LINGER_NS,
        };
        let tasks = node.tasks.clone();
        tasks.spawn(async move {
            if let Err(e) = node.write_one(cmd).await {
                tracing::warn!(error = %e, "give up an abandoned wait");
            }
        });
    }
}

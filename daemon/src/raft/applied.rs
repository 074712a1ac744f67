//! The applied state machine, shared between the Raft apply path and the API.
//!
//! Raft applies committed batches here; API handlers read from here, and the waits of queued
//! acquires (`wait.rs`) are woken from here by the events each batch produces. Holder watches
//! (`WaitHolderChange`) are woken only by a batch that changed their semaphore's holders, so a
//! watcher costs nothing while other semaphores change.
//!
//! Invariants:
//! - `applied_index` only moves forward, except when a snapshot replaces the state
//! - a batch's events reach the wait registry before the state that produced them can be read
//! - the log position (index, term) of the last entry applied changes only under the state's
//!   write lock, so a reader holding the read lock sees the position of exactly the state it
//!   reads ([`AppliedState::read_at`])

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;

use crate::base::write_trace::Mark;
use crate::callers::waiters::{Registry, WaitKey, WaitTicket};
use crate::callers::watches::{
    Full, HolderWatch, LossWatch, MAX_LOSS_WATCHES, Seen, SyncWatch, Watches, tick,
};
use crate::state::{Batch, Event, Reply, SnapshotError, State, SyncKind};
use crate::support::metrics::ApplyMetrics;

/// The in-memory state machine plus its applied index and the registry of waiting callers.
pub struct AppliedState {
    state: RwLock<State>,
    applied_index: watch::Sender<u64>,
    waits: Registry,
    metrics: ApplyMetrics,
    /// The term of the entry about to be applied (see [`AppliedState::note_term`]).
    next_term: AtomicU64,
    /// (index, term) of the last entry applied; written only under the state's write lock.
    position: RwLock<(u64, u64)>,
    /// Callers waiting for a semaphore's holders to change (`watches.rs`).
    holder_watches: Watches<(String, String), u64>,
    /// Waits on wait groups and barriers.
    sync_watches: Watches<(SyncKind, String, String), u64>,
    /// Holders watching their lease for a loss.
    loss_watches: Watches<(String, String), Seen>,
    /// The state's hash and the position it was taken at (see [`AppliedState::state_hash`]).
    hashed: Mutex<Option<((u64, u64), u64)>>,
}

impl AppliedState {
    pub fn new(state: State, applied_index: u64) -> Arc<Self> {
        Self::with_metrics(state, applied_index, ApplyMetrics::default())
    }

    /// Like [`AppliedState::new`], counting what each batch does in `metrics`.
    pub(crate) fn with_metrics(
        state: State,
        applied_index: u64,
        metrics: ApplyMetrics,
    ) -> Arc<Self> {
        Arc::new(AppliedState {
            state: RwLock::new(state),
            applied_index: watch::Sender::new(applied_index),
            waits: Registry::default(),
            metrics,
            next_term: AtomicU64::new(0),
            position: RwLock::new((applied_index, 0)),
            holder_watches: Watches::default(),
            sync_watches: Watches::default(),
            loss_watches: Watches::with_limit(MAX_LOSS_WATCHES),
            hashed: Mutex::new(None),
        })
    }

    /// The term of the next entry (or snapshot) applied: the storage layer says it first.
    pub(crate) fn note_term(&self, term: u64) {
        self.next_term.store(term, Ordering::Release);
    }

    /// Records the position of what the locked state now holds. Call under the write lock.
    fn set_position(&self, index: u64) {
        let term = self.next_term.load(Ordering::Acquire);
        *self.position.write().unwrap_or_else(|p| p.into_inner()) = (index, term);
    }

    /// Applies one committed batch at log `index` and wakes the callers its events concern.
    pub fn apply(&self, index: u64, batch: &Batch) -> Vec<Reply> {
        self.metrics.trace.stamp(index, Mark::ApplyStart);
        let mut events = Vec::new();
        let mut state = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let replies = state.apply_batch(batch, &mut events);
        crate::support::self_check::after_apply(index, &state);
        self.set_position(index);
        // Still under the state lock: nobody reads this state before its events are queued.
        if !events.is_empty() {
            self.wake_watches(&events);
            self.waits.deliver(index, events);
        }
        let tally = state.take_tally();
        drop(state);
        if !self.holder_watches.is_empty() {
            for semaphore in &tally.holders_changed {
                self.holder_watches.update(semaphore, tick);
            }
        }
        self.count(batch, &tally);
        self.applied_index.send_replace(index);
        self.metrics.trace.stamp(index, Mark::ApplyDone);
        replies
    }

    /// Wakes the wait group and barrier watches of the objects `events` finish, trip or delete,
    /// and hands each loss to the watches of its lease.
    fn wake_watches(&self, events: &[Event]) {
        if self.sync_watches.is_empty() && self.loss_watches.is_empty() {
            return;
        }
        for event in events {
            match event {
                Event::Synced { ns, kind, name } => {
                    self.sync_watches
                        .update(&(*kind, ns.clone(), name.clone()), tick);
                }
                Event::Lost {
                    ns,
                    lease,
                    object,
                    cause,
                } => {
                    self.loss_watches
                        .update(&(ns.clone(), lease.clone()), |seen| {
                            seen.first_loss(object, *cause)
                        });
                }
                _ => {}
            }
        }
    }

    fn count(&self, batch: &Batch, tally: &crate::state::Tally) {
        let m = &self.metrics;
        m.entries.inc();
        m.commands.inc_by(batch.cmds.len() as u64);
        m.grants.inc_by(tally.grants);
        m.lease_expirations.inc_by(tally.expirations);
        for wait in &tally.waits_ns {
            m.wait_seconds.observe(*wait as f64 / 1e9);
        }
    }

    /// Records that a non-batch entry (blank, membership) at `index` was applied.
    pub(crate) fn mark_applied(&self, index: u64) {
        let state = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.set_position(index);
        drop(state);
        self.applied_index.send_replace(index);
    }

    /// Replaces the whole state (snapshot install or restore).
    pub fn replace(&self, state: State, index: u64) {
        let mut current = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *current = state;
        self.set_position(index);
        *self.hashed.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.waits.recheck_all(index);
        self.sync_watches.update_all(tick);
        self.loss_watches.update_all(Seen::recheck);
        drop(current);
        self.holder_watches.update_all(tick);
        self.applied_index.send_replace(index);
    }

    /// Runs `read` against the current state.
    pub fn read<T>(&self, read: impl FnOnce(&State) -> T) -> T {
        let state = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        read(&state)
    }

    /// Runs `read` against the current state, with the (index, term) of the last entry that
    /// state includes.
    pub fn read_at<T>(&self, read: impl FnOnce(&State) -> T) -> (T, u64, u64) {
        let state = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (index, term) = *self.position.read().unwrap_or_else(|p| p.into_inner());
        (read(&state), index, term)
    }

    /// The applied state's hash ([`State::hash`]) and the index of the last entry applied to
    /// it. The hash encodes the whole state, which takes time in proportion to its size while
    /// the state's read lock holds applies back, so it is computed at most once per applied
    /// position and kept: status polls of a quiet cluster cost nothing, and concurrent ones
    /// wait for one computation instead of each making their own. Blocks: call it on a blocking
    /// thread, not on the async runtime.
    pub fn state_hash(&self) -> (u64, u64) {
        let state = self
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let position = *self.position.read().unwrap_or_else(|p| p.into_inner());
        // Lock order: the state, then this.
        let mut hashed = self.hashed.lock().unwrap_or_else(|p| p.into_inner());
        let hash = match *hashed {
            Some((at, hash)) if at == position => hash,
            _ => {
                let hash = state.hash();
                *hashed = Some((position, hash));
                hash
            }
        };
        (hash, position.0)
    }

    /// Encodes the current state for a snapshot, with the data format it is encoded in.
    pub(crate) fn encode_snapshot(&self) -> Result<(Vec<u8>, u32), SnapshotError> {
        self.read(|state| Ok((state.encode_snapshot()?, state.data_format())))
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied_index.borrow()
    }

    /// Watches the holders of `ns/sem`. Watch before reading them, so no change between the
    /// read and the wait is missed.
    pub(crate) fn watch_holders(&self, ns: &str, sem: &str) -> HolderWatch {
        self.holder_watches.watch((ns.to_string(), sem.to_string()))
    }

    /// Watches a wait group or barrier: woken by the entries that finish, trip or delete it.
    /// Watch before reading it, so no change between the read and the wait is missed.
    pub(crate) fn watch_sync(&self, kind: SyncKind, ns: &str, name: &str) -> SyncWatch {
        self.sync_watches
            .watch((kind, ns.to_string(), name.to_string()))
    }

    /// Watches lease `lease` of `ns` for a loss: woken by the entries that end the lease or
    /// one of its holds. Watch before reading the lease, so no loss in between is missed.
    /// Refused when the node keeps its limit of such watches.
    pub fn watch_loss(&self, ns: &str, lease: &str) -> Result<LossWatch, Full> {
        self.loss_watches
            .watch_within_limit((ns.to_string(), lease.to_string()))
    }

    /// Watches the applied index.
    pub(crate) fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    /// Resolves once the applied index is at least `index`.
    pub(crate) async fn wait_applied(&self, index: u64) {
        let mut rx = self.applied_index.subscribe();
        // The sender lives as long as `self`, so `wait_for` cannot fail while we borrow it.
        let _ = rx.wait_for(|applied| *applied >= index).await;
    }

    /// Subscribes to the events of the wait `key` until the ticket is dropped. Register before
    /// proposing the acquire.
    pub(crate) fn register_wait(&self, key: WaitKey) -> WaitTicket {
        self.waits.register(key)
    }

    /// The task keeping the clock of this node's waits until `stopping` resolves, the first
    /// time it is asked for (see `waiters.rs`).
    pub(crate) fn wait_timer<S>(
        &self,
        stopping: S,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static + use<S>>
    where
        S: std::future::Future<Output = ()> + Send + 'static,
    {
        self.waits.timer(stopping)
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::state::{Cmd, Metadata, Outcome};

    fn batch(cmds: Vec<Cmd>) -> Batch {
        Batch {
            now_ns: 1,
            cmds,
            wall_ns: 1,
        }
    }

    fn semaphore(name: &str) -> Cmd {
        Cmd::CreateSemaphore {
            ns: "n".into(),
            name: name.into(),
            description: String::new(),
            permits: 1,
            metadata: Metadata::new(),
            max_hold_ns: 0,
        }
    }

    /// The hash is the state's, is taken again once an entry changed the state or a snapshot
    /// replaced it, and is reused while the position stays (a cached hash would otherwise go
    /// stale; a recomputed one would cost a status poll the whole state every time).
    #[test]
    fn the_state_hash_follows_the_applied_position() {
        let applied = AppliedState::new(State::new(), 0);
        let (empty, at) = applied.state_hash();
        assert_eq!((empty, at), (applied.read(State::hash), 0));
        let create_ns = Cmd::CreateNamespace {
            name: "n".into(),
            description: String::new(),
            metadata: Metadata::new(),
        };
        applied.apply(1, &batch(vec![create_ns]));
        let (one, at) = applied.state_hash();
        assert_eq!(at, 1);
        assert_ne!(one, empty, "an applied entry changes the hash");
        assert_eq!(one, applied.read(State::hash));
        // Reused at the same position: the cache holds what was computed for it.
        assert_eq!(*applied.hashed.lock().expect("lock"), Some(((1, 0), one)));
        assert_eq!(applied.state_hash(), (one, 1));
        // An entry that leaves the state as it is moves the position; the hash stays.
        applied.mark_applied(2);
        assert_eq!(applied.state_hash(), (one, 2));
        // A snapshot replacing the state at the same position is hashed anew.
        applied.replace(State::new(), 2);
        assert_eq!(applied.state_hash(), (empty, 2));
        applied.apply(3, &batch(vec![semaphore("s")]));
        assert_eq!(applied.state_hash(), (applied.read(State::hash), 3));
    }

    /// A holder watch wakes for a change of its semaphore's holders and for nothing else:
    /// neither other semaphores' holders nor entries that leave its holders as they are.
    #[test]
    fn a_holder_watch_wakes_only_for_its_semaphore() {
        let applied = AppliedState::new(State::new(), 0);
        let create_ns = Cmd::CreateNamespace {
            name: "n".into(),
            description: String::new(),
            metadata: Metadata::new(),
        };
        let lease = Cmd::CreateLease {
            ns: "n".into(),
            kind: crate::state::LeaseKind::Semaphore,
            process_id: String::new(),
            ttl_s: 60,
            metadata: Metadata::new(),
            secret: 1,
        };
        let replies = applied.apply(
            1,
            &batch(vec![create_ns, semaphore("a"), semaphore("b"), lease]),
        );
        let Some(Ok(Outcome::Lease(lease))) = replies.last() else {
            panic!("{replies:?}")
        };
        let acquire = |sem: &str| Cmd::Acquire {
            ns: "n".into(),
            sem: sem.into(),
            lease: lease.lease_id.clone(),
            weight: 1,
            wait_ns: 0,
            metadata: Metadata::new(),
            max_hold_ns: 0,
        };
        let mut watch = applied.watch_holders("n", "a");
        assert!(
            watch.changed().now_or_never().is_none(),
            "nothing changed yet"
        );
        applied.apply(2, &batch(vec![acquire("b"), semaphore("c")]));
        assert!(
            watch.changed().now_or_never().is_none(),
            "b and c are not watched"
        );
        applied.apply(3, &batch(vec![acquire("a")]));
        assert!(watch.changed().now_or_never().is_some(), "a's holder came");
        assert!(watch.changed().now_or_never().is_none(), "seen once");
        // The last watch of a semaphore gone, nothing is kept for it.
        drop(watch);
        assert!(applied.holder_watches.is_empty());
    }

    /// A loss watch gets the loss of its own lease from the applied entry, and nothing from
    /// entries that change other leases or leave its lease as it is.
    #[test]
    fn a_loss_watch_gets_its_leases_loss_from_the_apply_path() {
        let applied = AppliedState::new(State::new(), 0);
        let create_ns = Cmd::CreateNamespace {
            name: "n".into(),
            description: String::new(),
            metadata: Metadata::new(),
        };
        let lease = |secret| Cmd::CreateLease {
            ns: "n".into(),
            kind: crate::state::LeaseKind::Semaphore,
            process_id: String::new(),
            ttl_s: 60,
            metadata: Metadata::new(),
            secret,
        };
        let replies = applied.apply(1, &batch(vec![create_ns, lease(1), lease(2)]));
        let ids: Vec<String> = replies
            .iter()
            .filter_map(|r| match r {
                Ok(Outcome::Lease(l)) => Some(l.lease_id.clone()),
                _ => None,
            })
            .collect();
        let [a, b] = ids.as_slice() else {
            panic!("{replies:?}")
        };
        let mut watch = applied.watch_loss("n", a).expect("room");
        let revoke = |lease: &String| Cmd::RevokeLease {
            ns: "n".into(),
            kind: crate::state::LeaseKind::Semaphore,
            lease: lease.clone(),
        };
        applied.apply(2, &batch(vec![semaphore("s"), revoke(b)]));
        assert!(watch.changed().now_or_never().is_none(), "b is not watched");
        applied.apply(3, &batch(vec![revoke(a)]));
        let seen = watch.changed().now_or_never().expect("a was revoked");
        assert_eq!(
            seen.loss.map(|l| l.cause),
            Some(crate::state::LossCause::Revoked)
        );
    }
}

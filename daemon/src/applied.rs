//! The applied state machine, shared between the Raft apply path and the API.
//!
//! Raft applies committed batches here; API handlers read from here and wait here for the grant
//! of a queued acquire. Every node applies every entry, so a caller waits on the node it is
//! connected to, and a grant wakes exactly the callers waiting for that (semaphore, lease).
//!
//! Invariants:
//! - `applied_index` only moves forward, except when a snapshot replaces the state
//! - a wait registered before its acquire is proposed never misses the event that ends it
//! - events are delivered before the state that produced them can be read: a caller that reads
//!   a state finds every event up to it already in its ticket

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{mpsc, watch};

use crate::state::{Batch, Event, Reply, SnapshotError, State, WaitEnd};

/// Identifies a waiter: (namespace, semaphore, lease).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WaitKey {
    pub ns: String,
    pub sem: String,
    pub lease: String,
}

/// How a registered wait ended, as applied on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    Granted {
        token: u64,
        weight: u64,
    },
    Ended(WaitEnd),
    /// The state was replaced wholesale (snapshot install): look at it again.
    Recheck,
}

/// An event about a wait, stamped with the log index that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitEvent {
    pub index: u64,
    pub outcome: WaitOutcome,
}

type WaitSenders = Vec<(u64, mpsc::UnboundedSender<WaitEvent>)>;

/// The in-memory state machine plus its applied index and the registry of waiting callers.
pub struct AppliedState {
    state: RwLock<State>,
    applied_index: watch::Sender<u64>,
    waits: Mutex<HashMap<WaitKey, WaitSenders>>,
    next_wait_id: AtomicU64,
}

impl AppliedState {
    pub fn new(state: State, applied_index: u64) -> Arc<Self> {
        Arc::new(AppliedState {
            state: RwLock::new(state),
            applied_index: watch::Sender::new(applied_index),
            waits: Mutex::new(HashMap::new()),
            next_wait_id: AtomicU64::new(1),
        })
    }

    /// Applies one committed batch at log `index` and wakes the callers its events concern.
    pub fn apply(&self, index: u64, batch: &Batch) -> Vec<Reply> {
        let mut events = Vec::new();
        let mut state = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let replies = state.apply_batch(batch, &mut events);
        // Still under the state lock: nobody reads this state before its events are queued.
        if !events.is_empty() {
            self.deliver(index, events);
        }
        drop(state);
        self.applied_index.send_replace(index);
        replies
    }

    /// Records that a non-batch entry (blank, membership) at `index` was applied.
    pub fn mark_applied(&self, index: u64) {
        self.applied_index.send_replace(index);
    }

    /// Replaces the whole state (snapshot install or restore).
    pub fn replace(&self, state: State, index: u64) {
        let mut current = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *current = state;
        // Events between the old and the new state were never seen here: tell every waiting
        // caller to look at the new state.
        for (_, tx) in self.lock_waits().values().flatten() {
            let _ = tx.send(WaitEvent {
                index,
                outcome: WaitOutcome::Recheck,
            });
        }
        drop(current);
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

    /// Encodes the current state for a snapshot.
    pub fn encode_snapshot(&self) -> Result<Vec<u8>, SnapshotError> {
        self.read(State::encode_snapshot)
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied_index.borrow()
    }

    /// Watches the applied index.
    pub fn subscribe_applied(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    /// Resolves once the applied index is at least `index`.
    pub async fn wait_applied(&self, index: u64) {
        let mut rx = self.applied_index.subscribe();
        // The sender lives as long as `self`, so `wait_for` cannot fail while we borrow it.
        let _ = rx.wait_for(|applied| *applied >= index).await;
    }

    /// Subscribes to the events of the wait `key` until the ticket is dropped. Register before
    /// proposing the acquire.
    pub fn register_wait(self: &Arc<Self>, key: WaitKey) -> WaitTicket {
        let id = self.next_wait_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock_waits()
            .entry(key.clone())
            .or_default()
            .push((id, tx));
        WaitTicket {
            applied: Arc::clone(self),
            key,
            id,
            rx,
        }
    }

    fn lock_waits(&self) -> std::sync::MutexGuard<'_, HashMap<WaitKey, WaitSenders>> {
        self.waits
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn deliver(&self, index: u64, events: Vec<Event>) {
        let waits = self.lock_waits();
        if waits.is_empty() {
            return;
        }
        for event in events {
            let (key, outcome) = match event {
                Event::Granted {
                    ns,
                    sem,
                    lease,
                    token,
                    weight,
                } => (
                    WaitKey { ns, sem, lease },
                    WaitOutcome::Granted { token, weight },
                ),
                Event::WaitEnded {
                    ns,
                    sem,
                    lease,
                    reason,
                } => (WaitKey { ns, sem, lease }, WaitOutcome::Ended(reason)),
            };
            for (_, tx) in waits.get(&key).into_iter().flatten() {
                let _ = tx.send(WaitEvent { index, outcome });
            }
        }
    }
}

/// A subscription to one wait's events; dropping it deregisters.
pub struct WaitTicket {
    applied: Arc<AppliedState>,
    key: WaitKey,
    id: u64,
    rx: mpsc::UnboundedReceiver<WaitEvent>,
}

impl WaitTicket {
    /// The next event, waiting for one.
    pub async fn next(&mut self) -> Option<WaitEvent> {
        self.rx.recv().await
    }

    /// The next event already delivered, if any.
    pub fn try_next(&mut self) -> Option<WaitEvent> {
        self.rx.try_recv().ok()
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        let mut waits = self.applied.lock_waits();
        if let Some(senders) = waits.get_mut(&self.key) {
            senders.retain(|(id, _)| *id != self.id);
            if senders.is_empty() {
                waits.remove(&self.key);
            }
        }
    }
}

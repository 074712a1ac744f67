//! The applied state machine, shared between the Raft apply path and the API.
//!
//! Raft applies committed batches here; API handlers read from here and wait here for the grant
//! of a queued acquire. Every node applies every entry, so a caller waits on the node it is
//! connected to, and a grant wakes exactly the callers waiting for that (semaphore, lease).
//!
//! Invariants:
//! - `applied_index` only moves forward, except when a snapshot replaces the state
//! - a wait registered before its acquire is proposed never misses the event that ends it

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{oneshot, watch};

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

type WaitSenders = Vec<(u64, oneshot::Sender<WaitOutcome>)>;

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
        let replies = {
            let mut state = self
                .state
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state.apply_batch(batch, &mut events)
        };
        self.applied_index.send_replace(index);
        if !events.is_empty() {
            self.deliver(events);
        }
        replies
    }

    /// Records that a non-batch entry (blank, membership) at `index` was applied.
    pub fn mark_applied(&self, index: u64) {
        self.applied_index.send_replace(index);
    }

    /// Replaces the whole state (snapshot install or restore).
    pub fn replace(&self, state: State, index: u64) {
        {
            let mut current = self
                .state
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            *current = state;
        }
        self.applied_index.send_replace(index);
        // Events between the old and the new state were never seen here: wake every waiting
        // caller to look at the new state.
        let waits = std::mem::take(&mut *self.lock_waits());
        for (_, tx) in waits.into_values().flatten() {
            let _ = tx.send(WaitOutcome::Recheck);
        }
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

    /// Registers interest in how the wait `key` ends. Register before proposing the acquire.
    pub fn register_wait(self: &Arc<Self>, key: WaitKey) -> WaitTicket {
        let id = self.next_wait_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
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

    /// Number of callers currently waiting on this node.
    pub fn waiting_callers(&self) -> usize {
        self.lock_waits().values().map(Vec::len).sum()
    }

    fn lock_waits(&self) -> std::sync::MutexGuard<'_, HashMap<WaitKey, WaitSenders>> {
        self.waits
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn deliver(&self, events: Vec<Event>) {
        let mut waits = self.lock_waits();
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
            if let Some(senders) = waits.remove(&key) {
                for (_, tx) in senders {
                    let _ = tx.send(outcome);
                }
            }
        }
    }
}

/// A registered wait; dropping it deregisters.
pub struct WaitTicket {
    applied: Arc<AppliedState>,
    key: WaitKey,
    id: u64,
    rx: oneshot::Receiver<WaitOutcome>,
}

impl WaitTicket {
    pub fn key(&self) -> &WaitKey {
        &self.key
    }

    /// Resolves when an applied command ends the wait.
    pub async fn outcome(&mut self) -> Option<WaitOutcome> {
        (&mut self.rx).await.ok()
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

//! The applied state machine, shared between the Raft apply path and the API.
//!
//! Raft applies committed batches here; API handlers read from here, and the waits of queued
//! acquires (`wait.rs`) are woken from here by the events each batch produces.
//!
//! Invariants:
//! - `applied_index` only moves forward, except when a snapshot replaces the state
//! - a batch's events reach the wait registry before the state that produced them can be read
//! - the log position (index, term) of the last entry applied changes only under the state's
//!   write lock, so a reader holding the read lock sees the position of exactly the state it
//!   reads ([`AppliedState::read_at`])

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use crate::metrics::ApplyMetrics;
use crate::state::{Batch, Reply, SnapshotError, State};
use crate::waiters::{Registry, WaitKey, WaitTicket};

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
}

impl AppliedState {
    pub fn new(state: State, applied_index: u64) -> Arc<Self> {
        Self::with_metrics(state, applied_index, ApplyMetrics::default())
    }

    /// Like [`AppliedState::new`], counting what each batch does in `metrics`.
    pub fn with_metrics(state: State, applied_index: u64, metrics: ApplyMetrics) -> Arc<Self> {
        Arc::new(AppliedState {
            state: RwLock::new(state),
            applied_index: watch::Sender::new(applied_index),
            waits: Registry::default(),
            metrics,
            next_term: AtomicU64::new(0),
            position: RwLock::new((applied_index, 0)),
        })
    }

    /// The term of the next entry (or snapshot) applied: the storage layer says it first.
    pub fn note_term(&self, term: u64) {
        self.next_term.store(term, Ordering::Release);
    }

    /// Records the position of what the locked state now holds. Call under the write lock.
    fn set_position(&self, index: u64) {
        let term = self.next_term.load(Ordering::Acquire);
        *self.position.write().unwrap_or_else(|p| p.into_inner()) = (index, term);
    }

    /// Applies one committed batch at log `index` and wakes the callers its events concern.
    pub fn apply(&self, index: u64, batch: &Batch) -> Vec<Reply> {
        let mut events = Vec::new();
        let mut state = self
            .state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let replies = state.apply_batch(batch, &mut events);
        self.set_position(index);
        // Still under the state lock: nobody reads this state before its events are queued.
        if !events.is_empty() {
            self.waits.deliver(index, events);
        }
        let tally = state.take_tally();
        drop(state);
        self.count(batch, &tally);
        self.applied_index.send_replace(index);
        replies
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
    pub fn mark_applied(&self, index: u64) {
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
        self.waits.recheck_all(index);
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
    pub fn register_wait(&self, key: WaitKey) -> WaitTicket {
        self.waits.register(key)
    }
}

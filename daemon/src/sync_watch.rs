//! The callers waiting on a wait group or a barrier on this node (`WaitForWaitGroup`,
//! `WaitAtBarrier`), woken by the applied entries that concern their object.
//!
//! The state machine emits [`Event::Synced`] in the entry that completes, expires or deletes a
//! wait group, or trips or deletes a barrier (and for each of them when their namespace goes).
//! The apply path hands every batch's events here before the state that produced them can be
//! read; each watch of a named object gets a tick, and its caller reads the object again. A
//! snapshot install ticks every watch. Nothing polls and no timer fires besides each call's
//! own deadline, so a thousand waiters on one barrier are released by the one entry that
//! tripped it, and waiters on quiet objects cost nothing per entry.
//!
//! Invariants:
//! - a watch sees every tick for its object delivered between its creation and its drop
//! - a dropped watch deregisters; no key is left without a watch

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::state::{Event, SyncKind};

/// (kind, namespace, name).
type Key = (SyncKind, String, String);

#[derive(Clone, Default)]
pub struct SyncWatches {
    by_object: Arc<Mutex<BTreeMap<Key, watch::Sender<u64>>>>,
}

impl SyncWatches {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Key, watch::Sender<u64>>> {
        self.by_object.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches one object. Watch before reading it, so no change in between is missed.
    pub fn watch(&self, kind: SyncKind, ns: &str, name: &str) -> SyncWatch {
        let key = (kind, ns.to_string(), name.to_string());
        let receiver = self
            .lock()
            .entry(key.clone())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        SyncWatch {
            watches: self.clone(),
            key,
            receiver: Some(receiver),
        }
    }

    /// Ticks the watches of the objects `events` name.
    pub fn notify(&self, events: &[Event]) {
        let map = self.lock();
        if map.is_empty() {
            return;
        }
        for event in events {
            if let Event::Synced { ns, kind, name } = event
                && let Some(sender) = map.get(&(*kind, ns.clone(), name.clone()))
            {
                sender.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Ticks every watch (the state was replaced).
    pub fn all_changed(&self) {
        for sender in self.lock().values() {
            sender.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A watch on one wait group or barrier; dropping it ends the watch.
pub struct SyncWatch {
    watches: SyncWatches,
    key: Key,
    receiver: Option<watch::Receiver<u64>>,
}

impl SyncWatch {
    /// Resolves at the next tick after the last call (or after the watch began).
    pub async fn changed(&mut self) {
        if let Some(receiver) = self.receiver.as_mut() {
            // The sender stays in the map while this receiver exists.
            let _ = receiver.changed().await;
        }
    }
}

impl Drop for SyncWatch {
    fn drop(&mut self) {
        let mut map = self.watches.lock();
        drop(self.receiver.take());
        if map.get(&self.key).is_some_and(|s| s.receiver_count() == 0) {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn synced(kind: SyncKind, name: &str) -> Event {
        Event::Synced {
            ns: "n".into(),
            kind,
            name: name.into(),
        }
    }

    #[test]
    fn a_watch_wakes_for_its_object_only_and_deregisters_when_dropped() {
        let watches = SyncWatches::default();
        let mut a1 = watches.watch(SyncKind::Barrier, "n", "a");
        let mut a2 = watches.watch(SyncKind::Barrier, "n", "a");
        let mut wg = watches.watch(SyncKind::WaitGroup, "n", "a");
        assert!(a1.changed().now_or_never().is_none());
        watches.notify(&[
            synced(SyncKind::Barrier, "b"),
            synced(SyncKind::WaitGroup, "x"),
        ]);
        assert!(a1.changed().now_or_never().is_none(), "another object");
        assert!(
            wg.changed().now_or_never().is_none(),
            "same name, other kind"
        );
        watches.notify(&[synced(SyncKind::Barrier, "a")]);
        assert!(a1.changed().now_or_never().is_some());
        assert!(a2.changed().now_or_never().is_some(), "every waiter of it");
        assert!(a1.changed().now_or_never().is_none(), "seen once");
        watches.all_changed();
        assert!(wg.changed().now_or_never().is_some());
        drop((a1, a2, wg));
        assert_eq!(watches.len(), 0);
    }
}

//! The holders watching their own lease for a loss on this node (`WatchLoss`), woken by the
//! applied entries that end the lease or one of its holds.
//!
//! The state machine emits [`Event::Lost`] in the entry that expires or revokes a lease, ends a
//! hold at its hold limit, deletes a semaphore or lock that was held, or deletes a namespace.
//! The apply path hands every batch's events here before the state that produced them can be
//! read; the watches of that (namespace, lease) get the loss. Watches are kept in a map by
//! lease: an entry that loses nothing costs nothing here, and a loss costs one map lookup,
//! however many leases are watched. A snapshot install tells every watch to read its lease
//! again (the events between the old and the new state were never seen here).
//!
//! At most `limit` watches live at once on a node ([`MAX_LOSS_WATCHES`] by default); one more is
//! refused ([`Full`]), and the caller keeps its refresh-based self-fencing.
//!
//! Invariants:
//! - a watch sees the first loss of its lease delivered between its creation and its drop
//! - a dropped watch deregisters; no key is left without a watch, and the count matches

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::state::{Event, LossCause};

/// How many loss watches one node keeps at most.
pub const MAX_LOSS_WATCHES: usize = 10_000;

/// (namespace, lease id).
type Key = (String, String);

/// A loss as a watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    /// The semaphore or lock object whose hold ended; empty: the whole lease.
    pub object: String,
    pub cause: LossCause,
}

/// What a watch has seen so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The first loss delivered, if any.
    pub loss: Option<Loss>,
    /// How many times the state was replaced: read the lease again.
    pub rechecks: u64,
}

/// The node already keeps its limit of loss watches.
#[derive(Debug, PartialEq, Eq)]
pub struct Full {
    pub limit: usize,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    count: usize,
    by_lease: BTreeMap<Key, Vec<(u64, watch::Sender<Seen>)>>,
}

#[derive(Clone)]
pub struct LossWatches {
    inner: Arc<Mutex<Inner>>,
    limit: usize,
}

impl Default for LossWatches {
    fn default() -> Self {
        LossWatches::with_limit(MAX_LOSS_WATCHES)
    }
}

impl LossWatches {
    /// At most `limit` watches at once.
    pub fn with_limit(limit: usize) -> Self {
        LossWatches {
            inner: Arc::default(),
            limit,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches lease `lease` of `ns`. Watch before reading the lease, so no loss between the
    /// read and the wait is missed.
    pub fn watch(&self, ns: &str, lease: &str) -> Result<LossWatch, Full> {
        let mut inner = self.lock();
        if inner.count >= self.limit {
            return Err(Full { limit: self.limit });
        }
        inner.count += 1;
        inner.next_id = inner.next_id.wrapping_add(1);
        let id = inner.next_id;
        let key = (ns.to_string(), lease.to_string());
        let (sender, receiver) = watch::channel(Seen::default());
        inner
            .by_lease
            .entry(key.clone())
            .or_default()
            .push((id, sender));
        Ok(LossWatch {
            watches: self.clone(),
            key,
            id,
            receiver,
        })
    }

    /// Hands the losses among `events` to the watches of their leases.
    pub fn notify(&self, events: &[Event]) {
        let inner = self.lock();
        if inner.by_lease.is_empty() {
            return;
        }
        for event in events {
            let Event::Lost {
                ns,
                lease,
                object,
                cause,
            } = event
            else {
                continue;
            };
            let Some(watches) = inner.by_lease.get(&(ns.clone(), lease.clone())) else {
                continue;
            };
            for (_, sender) in watches {
                sender.send_if_modified(|seen| {
                    if seen.loss.is_some() {
                        return false;
                    }
                    seen.loss = Some(Loss {
                        object: object.clone(),
                        cause: *cause,
                    });
                    true
                });
            }
        }
    }

    /// Tells every watch to read its lease again (the state was replaced).
    pub fn all_changed(&self) {
        for (_, sender) in self.lock().by_lease.values().flatten() {
            sender.send_modify(|seen| seen.rechecks = seen.rechecks.wrapping_add(1));
        }
    }

    /// How many watches live now.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.lock().count
    }
}

/// A watch on one lease; dropping it ends the watch.
pub struct LossWatch {
    watches: LossWatches,
    key: Key,
    id: u64,
    receiver: watch::Receiver<Seen>,
}

impl LossWatch {
    /// Resolves at the next loss or recheck after the last call, with what was seen.
    pub async fn changed(&mut self) -> Seen {
        // The sender lives in the map while this watch exists.
        let _ = self.receiver.changed().await;
        self.receiver.borrow_and_update().clone()
    }

    /// What was seen so far, without waiting.
    pub fn seen(&mut self) -> Seen {
        self.receiver.borrow_and_update().clone()
    }
}

impl Drop for LossWatch {
    fn drop(&mut self) {
        let mut inner = self.watches.lock();
        inner.count = inner.count.saturating_sub(1);
        if let Some(watches) = inner.by_lease.get_mut(&self.key) {
            watches.retain(|(id, _)| *id != self.id);
            if watches.is_empty() {
                inner.by_lease.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn lost(lease: &str, object: &str, cause: LossCause) -> Event {
        Event::Lost {
            ns: "n".into(),
            lease: lease.into(),
            object: object.into(),
            cause,
        }
    }

    #[test]
    fn a_watch_gets_the_first_loss_of_its_lease_only() {
        let watches = LossWatches::default();
        let mut watch = watches.watch("n", "a").expect("room");
        assert!(watch.changed().now_or_never().is_none(), "nothing lost yet");
        watches.notify(&[lost("b", "", LossCause::Revoked)]);
        assert!(watch.changed().now_or_never().is_none(), "b is not watched");
        watches.notify(&[
            lost("a", "s", LossCause::HoldLimit),
            lost("a", "", LossCause::Expired),
        ]);
        let seen = watch.changed().now_or_never().expect("a lost a hold");
        assert_eq!(
            seen.loss,
            Some(Loss {
                object: "s".into(),
                cause: LossCause::HoldLimit
            })
        );
        watches.notify(&[lost("a", "", LossCause::Revoked)]);
        assert!(
            watch.changed().now_or_never().is_none(),
            "the first loss stays"
        );
    }

    #[test]
    fn a_replaced_state_asks_every_watch_to_look_again() {
        let watches = LossWatches::default();
        let mut watch = watches.watch("n", "a").expect("room");
        watches.all_changed();
        let seen = watch.changed().now_or_never().expect("recheck");
        assert_eq!(seen.rechecks, 1);
        assert_eq!(seen.loss, None);
    }

    #[test]
    fn watches_beyond_the_limit_are_refused_and_dropped_ones_free_room() {
        let watches = LossWatches::with_limit(2);
        let a = watches.watch("n", "a").expect("room");
        let a2 = watches.watch("n", "a").expect("room");
        assert_eq!(watches.watch("n", "b").err(), Some(Full { limit: 2 }));
        drop(a);
        let b = watches.watch("n", "b").expect("room again");
        assert_eq!(watches.count(), 2);
        drop((a2, b));
        assert_eq!(watches.count(), 0);
        assert!(watches.lock().by_lease.is_empty(), "nothing kept");
    }
}

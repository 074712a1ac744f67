//! Who on this node waits for what an applied entry changes, by key: the one registry behind
//! the watches of a semaphore's holders (`WaitHolderChange`), of a wait group or barrier
//! (`WaitForWaitGroup`, `WaitAtBarrier`) and of a lease's loss (`WatchLoss`).
//!
//! A watch registers under its key before the caller reads the state, so nothing applied
//! between the read and the wait is missed. The apply path (`applied.rs`) decides which keys
//! an entry concerns and updates the value each of their watches sees: a tick counter for the
//! holder and sync watches, the first loss for a loss watch ([`Seen`]). Watches are kept in a
//! map by key, so an entry that concerns nobody costs a map lookup at most, however many
//! watches live. A snapshot install updates every watch ([`Watches::update_all`]): the entries
//! between the old and the new state were never seen here.
//!
//! Both this registry and the queued acquires' (`waiters.rs`, where each ticket receives every
//! event about its waiter in log order, with a deadline and the node's stop, where a watch here
//! sees only the latest value) keep their callers in a [`Keyed`]: who waits, by key, each under
//! an id that its drop removes.
//!
//! Invariants:
//! - a watch sees every update of its key made between its creation and its drop
//! - a dropped watch deregisters; no key is left without a watch, and the count matches
//! - at most `limit` watches live at once; one more is refused ([`Full`])

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::state::{LossCause, SyncKind};

/// A watch on one semaphore's holders, by (namespace, semaphore): ticks at each applied batch
/// that changed them.
pub(crate) type HolderWatch = Watch<(String, String), u64>;
/// A watch on one wait group or barrier, by (kind, namespace, name): ticks at each entry that
/// completes, expires, trips or deletes it.
pub(crate) type SyncWatch = Watch<(SyncKind, String, String), u64>;
/// A watch on one lease for a loss, by (namespace, lease id).
pub(crate) type LossWatch = Watch<(String, String), Seen>;

/// How many loss watches one node keeps at most.
pub(crate) const MAX_LOSS_WATCHES: usize = 10_000;

/// The registry already keeps its limit of watches.
#[derive(Debug, PartialEq, Eq)]
pub struct Full {
    pub limit: usize,
}

/// Callers by key: each registered under an id, with what reaches it (`S`: a channel, a
/// mailbox). The one map behind every registry of waiting callers on a node.
pub(crate) struct Keyed<K, S> {
    next_id: u64,
    by_key: BTreeMap<K, Vec<(u64, S)>>,
}

impl<K, S> Default for Keyed<K, S> {
    fn default() -> Self {
        Keyed {
            next_id: 0,
            by_key: BTreeMap::new(),
        }
    }
}

impl<K: Ord, S> Keyed<K, S> {
    /// Registers `reach` under `key`; the id [`Keyed::remove`] takes.
    pub(crate) fn insert(&mut self, key: K, reach: S) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        // Room for one: a key rarely has a second caller (a vector's first push would make
        // room for four).
        self.by_key
            .entry(key)
            .or_insert_with(|| Vec::with_capacity(1))
            .push((self.next_id, reach));
        self.next_id
    }

    /// Removes the caller `id` of `key`, and the key once it has none.
    pub(crate) fn remove<Q: Ord + ?Sized>(&mut self, key: &Q, id: u64)
    where
        K: Borrow<Q>,
    {
        if let Some(callers) = self.by_key.get_mut(key) {
            callers.retain(|(caller, _)| *caller != id);
            if callers.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// The key as stored, if any caller waits under it (to share its names).
    pub(crate) fn stored_key<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&K>
    where
        K: Borrow<Q>,
    {
        self.by_key.get_key_value(key).map(|(stored, _)| stored)
    }

    /// What reaches each caller of `key`.
    pub(crate) fn of<Q: Ord + ?Sized>(&self, key: &Q) -> impl Iterator<Item = &S>
    where
        K: Borrow<Q>,
    {
        self.by_key.get(key).into_iter().flatten().map(|(_, s)| s)
    }

    /// What reaches every caller.
    pub(crate) fn all(&self) -> impl Iterator<Item = &S> {
        self.by_key.values().flatten().map(|(_, s)| s)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// How many callers `key` has.
    #[cfg(test)]
    pub(crate) fn callers_of<Q: Ord + ?Sized>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
    {
        self.by_key.get(key).map_or(0, Vec::len)
    }
}

struct Inner<K, V> {
    count: usize,
    keyed: Keyed<K, watch::Sender<V>>,
}

/// The watches of one kind, by key; each sees a value of type `V` (starting at its default).
pub(crate) struct Watches<K, V> {
    inner: Arc<Mutex<Inner<K, V>>>,
    limit: usize,
}

impl<K, V> Clone for Watches<K, V> {
    fn clone(&self) -> Self {
        Watches {
            inner: Arc::clone(&self.inner),
            limit: self.limit,
        }
    }
}

impl<K: Ord + Clone, V: Clone + Default> Default for Watches<K, V> {
    fn default() -> Self {
        Watches::with_limit(usize::MAX)
    }
}

impl<K: Ord + Clone, V: Clone + Default> Watches<K, V> {
    /// At most `limit` watches at once.
    pub(crate) fn with_limit(limit: usize) -> Self {
        Watches {
            inner: Arc::new(Mutex::new(Inner {
                count: 0,
                keyed: Keyed::default(),
            })),
            limit,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `key`, unless the registry keeps its limit of watches already. Watch before
    /// reading what the key names, so no change in between is missed.
    pub(crate) fn watch_within_limit(&self, key: K) -> Result<Watch<K, V>, Full> {
        let mut inner = self.lock();
        if inner.count >= self.limit {
            return Err(Full { limit: self.limit });
        }
        Ok(self.register(&mut inner, key))
    }

    /// Watches `key` whatever the limit (for a registry that has none).
    pub(crate) fn watch(&self, key: K) -> Watch<K, V> {
        let mut inner = self.lock();
        self.register(&mut inner, key)
    }

    fn register(&self, inner: &mut Inner<K, V>, key: K) -> Watch<K, V> {
        inner.count += 1;
        let (sender, receiver) = watch::channel(V::default());
        let id = inner.keyed.insert(key.clone(), sender);
        Watch {
            watches: self.clone(),
            key,
            id,
            receiver,
        }
    }

    /// Whether no watch lives (the apply path then skips building keys).
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().keyed.is_empty()
    }

    /// Changes the value each watch of `key` sees; `change` says whether it changed it (a
    /// watch is woken only then).
    pub(crate) fn update(&self, key: &K, mut change: impl FnMut(&mut V) -> bool) {
        for sender in self.lock().keyed.of(key) {
            sender.send_if_modified(&mut change);
        }
    }

    /// Changes the value every watch sees (the state was replaced).
    pub(crate) fn update_all(&self, mut change: impl FnMut(&mut V) -> bool) {
        for sender in self.lock().keyed.all() {
            sender.send_if_modified(&mut change);
        }
    }

    /// How many watches live now.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.lock().count
    }
}

/// Adds one to a tick counter: the change of a holder or sync watch.
pub(crate) fn tick(n: &mut u64) -> bool {
    *n = n.wrapping_add(1);
    true
}

/// A watch on one key; dropping it ends the watch.
pub struct Watch<K: Ord + Clone, V> {
    watches: Watches<K, V>,
    key: K,
    id: u64,
    receiver: watch::Receiver<V>,
}

impl<K: Ord + Clone, V: Clone> Watch<K, V> {
    /// Resolves at the next update after the last call (or after the watch began), with the
    /// value then seen.
    pub async fn changed(&mut self) -> V {
        // The sender lives in the registry while this watch exists.
        let _ = self.receiver.changed().await;
        self.receiver.borrow_and_update().clone()
    }

    /// What was seen so far, without waiting.
    pub fn seen(&mut self) -> V {
        self.receiver.borrow_and_update().clone()
    }
}

impl<K: Ord + Clone, V> Drop for Watch<K, V> {
    fn drop(&mut self) {
        let mut inner = self.watches.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.count = inner.count.saturating_sub(1);
        inner.keyed.remove(&self.key, self.id);
    }
}

/// A loss as a loss watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loss {
    /// The semaphore or lock object whose hold ended; empty: the whole lease.
    pub object: String,
    pub cause: LossCause,
}

/// What a loss watch has seen so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The first loss delivered, if any.
    pub loss: Option<Loss>,
    /// How many times the state was replaced: read the lease again.
    pub rechecks: u64,
}

impl Seen {
    /// Records the loss of `object` (empty: the whole lease) for `cause` unless one was seen
    /// already (a watch reports the first).
    pub fn first_loss(&mut self, object: &str, cause: LossCause) -> bool {
        if self.loss.is_some() {
            return false;
        }
        self.loss = Some(Loss {
            object: object.to_string(),
            cause,
        });
        true
    }

    /// Asks the watch to read its lease again.
    pub fn recheck(&mut self) -> bool {
        self.rechecks = self.rechecks.wrapping_add(1);
        true
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    type Ticks = Watches<&'static str, u64>;

    #[test]
    fn keyed_callers_come_and_go_by_id_and_a_key_goes_with_its_last() {
        let mut keyed = Keyed::<String, char>::default();
        let a = keyed.insert("k".into(), 'a');
        let b = keyed.insert("k".into(), 'b');
        let c = keyed.insert("other".into(), 'c');
        assert_ne!(a, b);
        assert_eq!(
            keyed.of("k").collect::<String>(),
            "ab",
            "looked up borrowed"
        );
        assert_eq!(keyed.all().count(), 3);
        keyed.remove("k", a);
        assert_eq!(keyed.of("k").collect::<String>(), "b");
        keyed.remove("k", a);
        assert_eq!(keyed.callers_of("k"), 1, "an id is removed once");
        keyed.remove("k", b);
        assert!(
            keyed.stored_key("k").is_none(),
            "the key went with its last caller"
        );
        keyed.remove("other", c);
        assert!(keyed.is_empty());
    }

    #[test]
    fn a_watch_wakes_for_its_key_only_and_every_watch_of_it_wakes() {
        let watches = Ticks::default();
        let mut a1 = watches.watch("a");
        let mut a2 = watches.watch("a");
        let mut b = watches.watch("b");
        assert!(a1.changed().now_or_never().is_none(), "nothing yet");
        watches.update(&"c", tick);
        assert!(a1.changed().now_or_never().is_none(), "another key");
        watches.update(&"a", tick);
        assert_eq!(a1.changed().now_or_never(), Some(1));
        assert_eq!(a2.changed().now_or_never(), Some(1), "every watch of it");
        assert!(a1.changed().now_or_never().is_none(), "seen once");
        assert!(b.changed().now_or_never().is_none());
        watches.update_all(tick);
        assert_eq!(b.changed().now_or_never(), Some(1));
        assert_eq!(a2.changed().now_or_never(), Some(2));
    }

    #[test]
    fn a_change_that_changes_nothing_wakes_nobody() {
        let watches = Watches::<&str, Seen>::default();
        let mut watch = watches.watch("lease");
        let first = Loss {
            object: "s".into(),
            cause: LossCause::HoldLimit,
        };
        watches.update(&"lease", |seen| seen.first_loss(&first.object, first.cause));
        assert_eq!(
            watch.changed().now_or_never().and_then(|s| s.loss),
            Some(first.clone())
        );
        let later = Loss {
            object: String::new(),
            cause: LossCause::Revoked,
        };
        watches.update(&"lease", |seen| seen.first_loss(&later.object, later.cause));
        assert!(
            watch.changed().now_or_never().is_none(),
            "the first loss stays"
        );
        watches.update_all(Seen::recheck);
        let seen = watch.changed().now_or_never().expect("recheck");
        assert_eq!((seen.loss, seen.rechecks), (Some(first), 1));
    }

    #[test]
    fn watches_beyond_the_limit_are_refused_and_dropped_ones_free_room_and_keys() {
        let watches = Watches::<&str, u64>::with_limit(2);
        let a = watches.watch_within_limit("a").expect("room");
        let a2 = watches.watch_within_limit("a").expect("room");
        assert_eq!(
            watches.watch_within_limit("b").err(),
            Some(Full { limit: 2 })
        );
        drop(a);
        let b = watches.watch_within_limit("b").expect("room again");
        assert_eq!(watches.count(), 2);
        drop((a2, b));
        assert_eq!(watches.count(), 0);
        assert!(watches.is_empty(), "no key kept without a watch");
    }
}

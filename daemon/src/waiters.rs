//! The callers waiting on this node, by the waiter they wait for: registered by the waiting
//! call (`wait.rs`) before it proposes its acquire, fed by the apply path (`applied.rs`) with
//! the events of every applied entry.
//!
//! Invariants:
//! - a ticket receives every event about its waiter delivered between its registration and its
//!   drop, in log order
//! - a dropped ticket is deregistered; no key is left without a ticket

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::state::{Event, Nanos, WaitEnd};

/// Identifies a waiter: (namespace, semaphore, lease).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
        hold_ns: Nanos,
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

/// Where the events of one ticket wait to be read: a queue and a wake-up. A waiting call costs
/// this one small allocation (an unbounded channel would cost a block of 32 events and its
/// cache-padded ends, about 1.5 kB, for the one or two events a wait ever receives).
#[derive(Default)]
struct Mailbox {
    events: Mutex<VecDeque<WaitEvent>>,
    /// Holds a wake-up for a reader that is not waiting yet, so none is lost.
    ready: Notify,
}

impl Mailbox {
    fn post(&self, event: WaitEvent) {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push_back(event);
        self.ready.notify_one();
    }

    fn take(&self) -> Option<WaitEvent> {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop_front()
    }
}

type WaitSenders = Vec<(u64, Arc<Mailbox>)>;

#[derive(Default)]
struct Waits {
    /// Keyed by the same `Arc` its tickets hold: a waiting call's names are stored once.
    by_key: BTreeMap<Arc<WaitKey>, WaitSenders>,
    next_id: u64,
}

/// The callers waiting on this node, by the waiter they wait for.
#[derive(Clone, Default)]
pub struct Registry {
    waits: Arc<Mutex<Waits>>,
}

impl Registry {
    /// Subscribes to the events of the wait `key` until the ticket is dropped. Register before
    /// proposing the acquire.
    pub fn register(&self, key: WaitKey) -> WaitTicket {
        let mailbox = Arc::new(Mailbox::default());
        let (id, key) = {
            let mut waits = self.lock();
            waits.next_id += 1;
            let id = waits.next_id;
            // A second wait for the same waiter shares the first one's names.
            let key = match waits.by_key.get_key_value(&key) {
                Some((shared, _)) => Arc::clone(shared),
                None => Arc::new(key),
            };
            waits
                .by_key
                .entry(Arc::clone(&key))
                .or_default()
                .push((id, Arc::clone(&mailbox)));
            (id, key)
        };
        WaitTicket {
            registry: self.clone(),
            key,
            id,
            mailbox,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Waits> {
        self.waits
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Hands the events of the entry at `index` to the callers they concern. The apply path
    /// calls this while it still holds the state lock.
    pub fn deliver(&self, index: u64, events: Vec<Event>) {
        let waits = self.lock();
        if waits.by_key.is_empty() {
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
                    hold_ns,
                } => (
                    WaitKey { ns, sem, lease },
                    WaitOutcome::Granted {
                        token,
                        weight,
                        hold_ns,
                    },
                ),
                Event::WaitEnded {
                    ns,
                    sem,
                    lease,
                    reason,
                } => (WaitKey { ns, sem, lease }, WaitOutcome::Ended(reason)),
                // Wait group and barrier waits are woken by `sync_watch.rs`.
                Event::Synced { .. } => continue,
                // Losses reach the holders watching them through `loss_watch.rs`.
                Event::Lost { .. } => continue,
            };
            for (_, mailbox) in waits.by_key.get(&key).into_iter().flatten() {
                mailbox.post(WaitEvent { index, outcome });
            }
        }
    }

    /// Tells every waiting caller to look at the state again: it was replaced at `index`, and
    /// the events between the old and the new state were never seen here.
    pub fn recheck_all(&self, index: u64) {
        for (_, mailbox) in self.lock().by_key.values().flatten() {
            mailbox.post(WaitEvent {
                index,
                outcome: WaitOutcome::Recheck,
            });
        }
    }
}

/// A subscription to one wait's events; dropping it deregisters.
pub struct WaitTicket {
    registry: Registry,
    key: Arc<WaitKey>,
    id: u64,
    mailbox: Arc<Mailbox>,
}

impl WaitTicket {
    /// The waiter this ticket follows (shared with the registry, not a copy).
    pub fn key(&self) -> &Arc<WaitKey> {
        &self.key
    }

    /// The next event, waiting for one (events keep coming while the ticket is registered, so
    /// this waits as long as it takes).
    pub async fn next(&mut self) -> WaitEvent {
        loop {
            if let Some(event) = self.mailbox.take() {
                return event;
            }
            self.mailbox.ready.notified().await;
        }
    }

    /// The next event already delivered, if any.
    pub fn try_next(&mut self) -> Option<WaitEvent> {
        self.mailbox.take()
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        let mut waits = self.registry.lock();
        if let Some(senders) = waits.by_key.get_mut(&*self.key) {
            senders.retain(|(id, _)| *id != self.id);
            if senders.is_empty() {
                waits.by_key.remove(&*self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(lease: &str) -> WaitKey {
        WaitKey {
            ns: "ns".into(),
            sem: "sem".into(),
            lease: lease.into(),
        }
    }

    fn granted(lease: &str, token: u64) -> Event {
        Event::Granted {
            ns: "ns".into(),
            sem: "sem".into(),
            lease: lease.into(),
            token,
            weight: 1,
            hold_ns: 0,
        }
    }

    #[test]
    fn events_reach_exactly_the_tickets_of_their_waiter() {
        let registry = Registry::default();
        let mut a1 = registry.register(key("a"));
        let mut a2 = registry.register(key("a"));
        let mut b = registry.register(key("b"));
        registry.deliver(7, vec![granted("a", 3)]);
        let expected = WaitEvent {
            index: 7,
            outcome: WaitOutcome::Granted {
                token: 3,
                weight: 1,
                hold_ns: 0,
            },
        };
        assert_eq!(a1.try_next(), Some(expected));
        assert_eq!(a2.try_next(), Some(expected));
        assert_eq!(b.try_next(), None);

        registry.recheck_all(9);
        let recheck = WaitEvent {
            index: 9,
            outcome: WaitOutcome::Recheck,
        };
        assert_eq!(b.try_next(), Some(recheck));
        assert_eq!(a1.try_next(), Some(recheck));
    }

    #[tokio::test]
    async fn a_waiting_ticket_wakes_for_each_event_in_order() {
        let registry = Registry::default();
        let mut ticket = registry.register(key("a"));
        let reader = tokio::spawn(async move {
            let first = ticket.next().await;
            let second = ticket.next().await;
            (first, second)
        });
        tokio::task::yield_now().await;
        registry.deliver(4, vec![granted("a", 1)]);
        registry.recheck_all(5);
        let (first, second) = reader.await.expect("reader");
        assert_eq!(first.index, 4);
        assert_eq!(
            first.outcome,
            WaitOutcome::Granted {
                token: 1,
                weight: 1,
                hold_ns: 0,
            }
        );
        assert_eq!(
            second,
            WaitEvent {
                index: 5,
                outcome: WaitOutcome::Recheck
            }
        );
        assert!(registry.lock().by_key.is_empty());
    }

    #[test]
    fn tickets_of_one_waiter_share_its_names_with_the_registry() {
        let registry = Registry::default();
        let first = registry.register(key("a"));
        let second = registry.register(key("a"));
        assert!(Arc::ptr_eq(first.key(), second.key()));
        let (stored, _) = registry
            .lock()
            .by_key
            .get_key_value(&key("a"))
            .map(|(k, v)| (Arc::clone(k), v.len()))
            .expect("registered");
        assert!(Arc::ptr_eq(&stored, first.key()));
        // One allocation of the names, owned by the registry, both tickets and this test.
        assert_eq!(Arc::strong_count(&stored), 4);
    }

    #[test]
    fn a_dropped_ticket_deregisters_and_others_stay() {
        let registry = Registry::default();
        let first = registry.register(key("a"));
        let mut second = registry.register(key("a"));
        drop(first);
        assert_eq!(registry.lock().by_key.get(&key("a")).map(Vec::len), Some(1));
        registry.deliver(2, vec![granted("a", 5)]);
        assert!(second.try_next().is_some());
        drop(second);
        assert!(registry.lock().by_key.is_empty());
    }
}

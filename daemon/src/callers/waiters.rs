//! The callers waiting on this node, by the waiter they wait for: registered by the waiting
//! call (`wait.rs`) before it proposes its acquire, fed by the apply path (`applied.rs`) with
//! the events of every applied entry.
//!
//! Its tickets are kept by waiter in the same keyed map as the node's watches
//! (`watches::Keyed`); what a ticket adds is a mailbox of every event in log order, where a
//! watch sees only the latest value.
//!
//! The registry also keeps the clock and the stop signal of every wait: one timer task per
//! node wakes each ticket whose local deadline passed, and the node's stop wakes every ticket,
//! so a waiting call keeps only its mailbox (a timer and a stop signal of its own cost about
//! 200 bytes of its future, for each of thousands of waiting calls).
//!
//! Invariants:
//! - a ticket receives every event about its waiter delivered between its registration and its
//!   drop, in log order
//! - a dropped ticket is deregistered and its deadline disarmed; no key is left without a
//!   ticket
//! - a ticket armed with a deadline is woken once the deadline passed (on tokio's clock), and
//!   every ticket is woken once the node stops, armed before or after

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::callers::watches::Keyed;
use crate::state::{Event, Nanos, WaitEnd};

/// Identifies a waiter: (namespace, semaphore, lease).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct WaitKey {
    pub ns: String,
    pub sem: String,
    pub lease: String,
}

/// How a registered wait ended, as applied on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
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
pub(crate) struct WaitEvent {
    pub index: u64,
    pub outcome: WaitOutcome,
}

/// What woke a waiting ticket: an event about its waiter, its deadline, or the node's stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    Event(WaitEvent),
    /// The deadline the ticket was armed with passed (see [`WaitTicket::arm`]).
    DeadlinePassed,
    /// The node begins to stop.
    Stopping,
}

/// [`Mailbox::flags`]: the ticket's deadline passed.
const DEADLINE_PASSED: u8 = 1;
/// [`Mailbox::flags`]: the node begins to stop.
const STOPPING: u8 = 2;

/// Where the events of one ticket wait to be read: a queue and a wake-up. A waiting call costs
/// this one small allocation (an unbounded channel would cost a block of 32 events and its
/// cache-padded ends, about 1.5 kB, for the one or two events a wait ever receives).
#[derive(Default)]
struct Mailbox {
    events: Mutex<VecDeque<WaitEvent>>,
    /// [`DEADLINE_PASSED`] and [`STOPPING`]; once set, they stay.
    flags: AtomicU8,
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

    fn raise(&self, flag: u8) {
        self.flags.fetch_or(flag, Ordering::AcqRel);
        self.ready.notify_one();
    }

    fn take(&self) -> Option<WaitEvent> {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop_front()
    }
}

#[derive(Default)]
struct Waits {
    /// The tickets' mailboxes, by the same `Arc` the tickets hold: a waiting call's names are
    /// stored once.
    tickets: Keyed<Arc<WaitKey>, Arc<Mailbox>>,
    /// The armed deadlines, earliest first, by (deadline, ticket id).
    deadlines: BTreeMap<(Instant, u64), Arc<Mailbox>>,
    /// The node began to stop: every ticket, present and future, is told.
    stopping: bool,
}

impl Waits {
    /// Wakes the tickets whose deadline is at or before `now`; returns the next deadline.
    fn fire_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                return Some(entry.key().0);
            }
            entry.remove().raise(DEADLINE_PASSED);
        }
        None
    }
}

/// The callers waiting on this node, by the waiter they wait for.
#[derive(Clone, Default)]
pub(crate) struct Registry {
    waits: Arc<Mutex<Waits>>,
    /// Wakes the timer task when a deadline is armed.
    armed: Arc<Notify>,
    /// Whether the timer task was handed out ([`Registry::timer`]).
    timer_started: Arc<AtomicBool>,
}

impl Registry {
    /// Subscribes to the events of the wait `key` until the ticket is dropped. Register before
    /// proposing the acquire.
    pub(crate) fn register(&self, key: WaitKey) -> WaitTicket {
        let mailbox = Arc::new(Mailbox::default());
        let (id, key) = {
            let mut waits = self.lock();
            // A second wait for the same waiter shares the first one's names.
            let key = match waits.tickets.stored_key(&key) {
                Some(shared) => Arc::clone(shared),
                None => Arc::new(key),
            };
            let id = waits.tickets.insert(Arc::clone(&key), Arc::clone(&mailbox));
            (id, key)
        };
        WaitTicket {
            registry: self.clone(),
            key,
            id,
            mailbox,
            armed: None,
        }
    }

    /// The task that keeps the clock of every wait and tells them when the node stops (once
    /// `stopping` resolves); `None` if it was handed out before. Run it once per node, before
    /// any ticket is armed.
    pub(crate) fn timer<S>(
        &self,
        stopping: S,
    ) -> Option<impl Future<Output = ()> + Send + 'static + use<S>>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        if self.timer_started.swap(true, Ordering::AcqRel) {
            return None;
        }
        let (waits, armed) = (Arc::clone(&self.waits), Arc::clone(&self.armed));
        Some(async move {
            // However the task ends (the node stops, or the task is dropped with the runtime),
            // every ticket is told.
            let _stop_all = StopAll(Arc::clone(&waits));
            tokio::pin!(stopping);
            loop {
                let next = lock(&waits).fire_due(Instant::now());
                let sleep = async move {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = sleep => {}
                    () = armed.notified() => {}
                    () = &mut stopping => break,
                }
            }
        })
    }

    fn lock(&self) -> MutexGuard<'_, Waits> {
        lock(&self.waits)
    }

    /// Hands the events of the entry at `index` to the callers they concern. The apply path
    /// calls this while it still holds the state lock.
    pub(crate) fn deliver(&self, index: u64, events: Vec<Event>) {
        let waits = self.lock();
        if waits.tickets.is_empty() {
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
                // Wait group and barrier waits, and losses, reach their watches (`watches.rs`).
                Event::Synced { .. } | Event::Lost { .. } => continue,
            };
            for mailbox in waits.tickets.of(&key) {
                mailbox.post(WaitEvent { index, outcome });
            }
        }
    }

    /// Tells every waiting caller to look at the state again: it was replaced at `index`, and
    /// the events between the old and the new state were never seen here.
    pub(crate) fn recheck_all(&self, index: u64) {
        for mailbox in self.lock().tickets.all() {
            mailbox.post(WaitEvent {
                index,
                outcome: WaitOutcome::Recheck,
            });
        }
    }
}

/// Tells every ticket, present and future, that the node stops.
struct StopAll(Arc<Mutex<Waits>>);

impl Drop for StopAll {
    fn drop(&mut self) {
        let mut waits = lock(&self.0);
        waits.stopping = true;
        waits.deadlines.clear();
        for mailbox in waits.tickets.all() {
            mailbox.raise(STOPPING);
        }
    }
}

fn lock(waits: &Mutex<Waits>) -> MutexGuard<'_, Waits> {
    waits
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A subscription to one wait's events; dropping it deregisters.
pub(crate) struct WaitTicket {
    registry: Registry,
    key: Arc<WaitKey>,
    id: u64,
    mailbox: Arc<Mailbox>,
    /// The deadline this ticket is armed with, if any.
    armed: Option<Instant>,
}

impl WaitTicket {
    /// The waiter this ticket follows (shared with the registry, not a copy).
    pub(crate) fn key(&self) -> &Arc<WaitKey> {
        &self.key
    }

    /// Arms the ticket's deadline on the registry's timer (replacing one armed before): once
    /// `at` passed, [`WaitTicket::next`] answers [`Wake::DeadlinePassed`]. A ticket of a node
    /// that stopped is told so at once.
    pub(crate) fn arm(&mut self, at: Instant) {
        let mut waits = self.registry.lock();
        if waits.stopping {
            self.mailbox.raise(STOPPING);
            return;
        }
        if let Some(old) = self.armed.replace(at) {
            waits.deadlines.remove(&(old, self.id));
        }
        waits
            .deadlines
            .insert((at, self.id), Arc::clone(&self.mailbox));
        drop(waits);
        self.registry.armed.notify_one();
    }

    /// The next event, waiting for one; or, with no event left, the deadline or the node's
    /// stop once either came (events keep coming while the ticket is registered, so this
    /// waits as long as it takes).
    pub(crate) async fn next(&mut self) -> Wake {
        loop {
            if let Some(event) = self.mailbox.take() {
                return Wake::Event(event);
            }
            let flags = self.mailbox.flags.load(Ordering::Acquire);
            if flags & STOPPING != 0 {
                return Wake::Stopping;
            }
            if flags & DEADLINE_PASSED != 0 {
                return Wake::DeadlinePassed;
            }
            self.mailbox.ready.notified().await;
        }
    }

    /// The next event already delivered, if any.
    pub(crate) fn try_next(&mut self) -> Option<WaitEvent> {
        self.mailbox.take()
    }
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        let mut waits = self.registry.lock();
        if let Some(at) = self.armed {
            waits.deadlines.remove(&(at, self.id));
        }
        waits.tickets.remove(&*self.key, self.id);
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
            match (first, second) {
                (Wake::Event(first), Wake::Event(second)) => (first, second),
                other => panic!("expected two events, got {other:?}"),
            }
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
        assert!(registry.lock().tickets.is_empty());
    }

    #[test]
    fn tickets_of_one_waiter_share_its_names_with_the_registry() {
        let registry = Registry::default();
        let first = registry.register(key("a"));
        let second = registry.register(key("a"));
        assert!(Arc::ptr_eq(first.key(), second.key()));
        let stored = registry
            .lock()
            .tickets
            .stored_key(&key("a"))
            .map(Arc::clone)
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
        assert_eq!(registry.lock().tickets.callers_of(&key("a")), 1);
        registry.deliver(2, vec![granted("a", 5)]);
        assert!(second.try_next().is_some());
        drop(second);
        assert!(registry.lock().tickets.is_empty());
    }

    use std::time::Duration;

    use futures::FutureExt;
    use tokio::sync::oneshot;

    /// Lets the timer task run after the clock moved.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// The timer, running until the returned sender is dropped or sent to.
    fn start_timer(registry: &Registry) -> oneshot::Sender<()> {
        let (stop, stopped) = oneshot::channel::<()>();
        let timer = registry
            .timer(async move {
                let _ = stopped.await;
            })
            .expect("the first timer");
        tokio::spawn(timer);
        stop
    }

    fn woken(ticket: &mut WaitTicket) -> Option<Wake> {
        ticket.next().now_or_never()
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_wake_their_tickets_in_deadline_order() {
        let registry = Registry::default();
        let _stop = start_timer(&registry);
        assert!(registry.timer(std::future::pending()).is_none());
        let start = Instant::now();
        let mut late = registry.register(key("late"));
        let mut early = registry.register(key("early"));
        let mut middle = registry.register(key("middle"));
        late.arm(start + Duration::from_secs(30));
        early.arm(start + Duration::from_secs(10));
        middle.arm(start + Duration::from_secs(20));
        settle().await;
        assert_eq!(woken(&mut early), None);

        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        assert_eq!(woken(&mut early), Some(Wake::DeadlinePassed));
        assert_eq!(woken(&mut middle), None);
        assert_eq!(woken(&mut late), None);

        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        assert_eq!(woken(&mut middle), Some(Wake::DeadlinePassed));
        assert_eq!(woken(&mut late), None);

        // An event delivered after the deadline is still read first.
        registry.deliver(3, vec![granted("late", 9)]);
        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        assert!(matches!(woken(&mut late), Some(Wake::Event(e)) if e.index == 3));
        assert_eq!(woken(&mut late), Some(Wake::DeadlinePassed));
        assert!(registry.lock().deadlines.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_or_rearmed_ticket_leaves_no_deadline_behind() {
        let registry = Registry::default();
        let _stop = start_timer(&registry);
        let start = Instant::now();
        let mut kept = registry.register(key("kept"));
        let mut dropped = registry.register(key("dropped"));
        dropped.arm(start + Duration::from_secs(5));
        kept.arm(start + Duration::from_secs(5));
        // Armed again later: only the later deadline counts.
        kept.arm(start + Duration::from_secs(15));
        drop(dropped);
        assert_eq!(registry.lock().deadlines.len(), 1);

        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        assert_eq!(woken(&mut kept), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        assert_eq!(woken(&mut kept), Some(Wake::DeadlinePassed));
        drop(kept);
        assert!(registry.lock().deadlines.is_empty());
        assert!(registry.lock().tickets.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_node_stopping_wakes_every_ticket_present_and_future() {
        let registry = Registry::default();
        let stop = start_timer(&registry);
        let start = Instant::now();
        let mut armed = registry.register(key("armed"));
        armed.arm(start + Duration::from_secs(60));
        let mut unarmed = registry.register(key("unarmed"));
        let reader = tokio::spawn(async move { armed.next().await });
        settle().await;
        assert!(!reader.is_finished());

        stop.send(()).expect("the timer runs");
        settle().await;
        assert_eq!(reader.await.expect("reader"), Wake::Stopping);
        assert_eq!(woken(&mut unarmed), Some(Wake::Stopping));
        // A wait armed after the stop is told at once, and its deadline is not kept.
        let mut later = registry.register(key("later"));
        later.arm(start + Duration::from_secs(60));
        assert_eq!(woken(&mut later), Some(Wake::Stopping));
        assert!(registry.lock().deadlines.is_empty());
    }
}

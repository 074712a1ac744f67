//! The wall clock each simulated node reads ([`conchd::support::clock::set_wall_clock`]): the
//! simulation's time since its epoch, plus the steps made on every node, plus the node's own
//! steps and the time its drift gained or lost.
//!
//! A node is known by the tokio runtime it runs on: each start of a node runs in a runtime of
//! its own, registered by [`register_this_runtime`]. A reading outside any node (the workload's
//! clients) sees only the steps made on every node.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const NS_PER_S: i64 = 1_000_000_000;

thread_local! {
    static CLOCKS: RefCell<Clocks> = RefCell::new(Clocks::default());
}

#[derive(Default)]
struct Clocks {
    /// Steps every node saw, in ns.
    everywhere_ns: i64,
    nodes: BTreeMap<u64, NodeClock>,
    runtimes: HashMap<tokio::runtime::Id, u64>,
}

#[derive(Clone, Copy, Default)]
struct NodeClock {
    /// The node's own steps, and the time gained or lost in drifts that ended, in ns.
    offset_ns: i64,
    /// A drift under way: since when (simulated time), and how fast, in parts per million.
    drift: Option<(Duration, i64)>,
}

impl NodeClock {
    fn gained_ns(&self, now: Duration) -> i64 {
        match self.drift {
            Some((since, ppm)) => {
                let ran = now.saturating_sub(since).as_nanos() as i128;
                i64::try_from(ran * i128::from(ppm) / 1_000_000).unwrap_or(0)
            }
            None => 0,
        }
    }
}

/// Starts this thread's simulation with every clock on time.
pub(crate) fn reset() {
    CLOCKS.with(|c| *c.borrow_mut() = Clocks::default());
}

/// The runtime the caller runs on is node `node`'s.
pub(crate) fn register_this_runtime(node: u64) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        CLOCKS.with(|c| c.borrow_mut().runtimes.insert(handle.id(), node));
    }
}

/// Steps node `node`'s wall clock (`None`: every node's) by `seconds`.
pub(crate) fn step(node: Option<u64>, seconds: i64) {
    let ns = seconds.saturating_mul(NS_PER_S);
    CLOCKS.with(|c| {
        let mut c = c.borrow_mut();
        match node {
            Some(node) => {
                let clock = c.nodes.entry(node).or_default();
                clock.offset_ns = clock.offset_ns.saturating_add(ns);
            }
            None => c.everywhere_ns = c.everywhere_ns.saturating_add(ns),
        }
    });
}

/// From simulated time `now` on, node `node`'s wall clock runs `ppm` parts per million fast
/// (negative: slow; 0: on time again, keeping what the drift so far gained or lost).
pub(crate) fn drift(node: u64, ppm: i64, now: Duration) {
    CLOCKS.with(|c| {
        let mut c = c.borrow_mut();
        let clock = c.nodes.entry(node).or_default();
        clock.offset_ns = clock.offset_ns.saturating_add(clock.gained_ns(now));
        clock.drift = (ppm != 0).then_some((now, ppm));
    });
}

/// The wall clock the caller reads, in ns since the Unix epoch; `None` outside a simulation.
pub(crate) fn wall_clock() -> Option<i64> {
    let since = turmoil::since_epoch()?;
    let now = turmoil::sim_elapsed().unwrap_or_default();
    let ns = i64::try_from(since.as_nanos()).unwrap_or(i64::MAX);
    let runtime = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
    CLOCKS.with(|c| {
        let c = c.borrow();
        let own = runtime
            .and_then(|id| c.runtimes.get(&id))
            .and_then(|node| c.nodes.get(node))
            .map_or(0, |clock| {
                clock.offset_ns.saturating_add(clock.gained_ns(now))
            });
        Some(ns.saturating_add(c.everywhere_ns).saturating_add(own))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drift_gains_while_it_lasts_and_the_gain_stays() {
        let clock = NodeClock {
            drift: Some((Duration::from_secs(10), 100_000)),
            ..NodeClock::default()
        };
        assert_eq!(clock.gained_ns(Duration::from_secs(20)), NS_PER_S);
        reset();
        drift(2, 100_000, Duration::from_secs(10));
        drift(2, 0, Duration::from_secs(20));
        step(Some(2), -3);
        CLOCKS.with(|c| {
            let c = c.borrow();
            let clock = c.nodes[&2];
            assert_eq!(clock.offset_ns, NS_PER_S - 3 * NS_PER_S);
            assert_eq!(clock.gained_ns(Duration::from_secs(99)), 0, "drift ended");
            assert!(!c.nodes.contains_key(&1), "other nodes untouched");
        });
        reset();
    }
}

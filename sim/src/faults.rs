//! The faults of one seed, planned before the run: one at a time, each after a quiet spell and
//! healed after it has held, so a majority can always make progress between faults.

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use cluster_tests::rng::Rng;

use crate::node_ip;

/// Where the plan's random stream sits among the seed's streams (clients take 0..).
const PLAN_STREAM: u64 = u64::MAX - 7;
/// No fault in the first seconds: the cluster elects its first leader and the workload sets up.
const WARM_UP: Duration = Duration::from_secs(2);

/// One fault, as started and as healed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The node cannot reach the other nodes nor they it (clients still reach it).
    Isolate { node: u64 },
    /// Messages from one node to another are lost; the other way works.
    OneWay { from: u64, to: u64 },
    /// The address one node uses for another leads to a third node, or back to itself (a port
    /// taken over after a restart, a stale address): the node restarts to dial afresh, and
    /// again at the heal.
    Misroute { from: u64, to: u64, instead: u64 },
    /// The node's process dies wherever it was; healed by starting it on the same directory.
    Crash { node: u64 },
    /// Every node dies at once; healed by starting them all.
    CrashAll,
    /// The node's log syncs fail (an I/O error, or the disk full): its next append fails and
    /// the node stops, as `conchd` exits on a storage failure; healed by starting it again on
    /// the same directory once the disk works, as a supervisor would.
    Disk { node: u64, full: bool },
    /// Messages between the node and the other nodes are held back, then delivered at once.
    Hold { node: u64 },
    /// Every message to and from the node, its clients' too, is held back, then delivered at
    /// once: what the rest of the cluster sees of a paused process (the node's own timers keep
    /// running, as a paused process's clock does).
    Pause { node: u64 },
    /// Every message takes up to this long.
    Slow { max_latency: Duration },
    /// The simulated wall clock every node reads jumps by this many seconds (either way).
    WallStep { seconds: i64 },
}

/// A planned change of the simulated world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Start(Fault),
    Heal(Fault),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Isolate { node } => write!(f, "isolate n{node}"),
            Fault::OneWay { from, to } => write!(f, "drop n{from} -> n{to}"),
            Fault::Misroute { from, to, instead } => {
                write!(f, "n{from}'s address for n{to} leads to n{instead}")
            }
            Fault::Crash { node } => write!(f, "crash n{node}"),
            Fault::CrashAll => write!(f, "crash every node"),
            Fault::Disk { node, full: true } => write!(f, "n{node}'s disk is full"),
            Fault::Disk { node, full: false } => write!(f, "n{node}'s disk fails its syncs"),
            Fault::Hold { node } => write!(f, "hold n{node}'s messages"),
            Fault::Pause { node } => write!(f, "pause n{node}"),
            Fault::Slow { max_latency } => {
                write!(f, "messages take up to {} ms", max_latency.as_millis())
            }
            Fault::WallStep { seconds } => write!(f, "wall clock steps {seconds:+} s"),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Start(fault) => write!(f, "start: {fault}"),
            Event::Heal(fault) => write!(f, "heal: {fault}"),
        }
    }
}

/// The faults of one seed, in time order.
pub struct FaultPlan {
    events: Vec<(Duration, Event)>,
    next: usize,
    nodes: u64,
    base_latency: Duration,
}

impl FaultPlan {
    pub fn new(seed: u64, nodes: u64, duration: Duration, enabled: bool) -> FaultPlan {
        let mut rng = Rng::derive(seed, PLAN_STREAM);
        let base_latency = Duration::from_micros(200 + rng.below(2_000));
        let mut events = Vec::new();
        let mut at = WARM_UP;
        let end = duration.saturating_sub(Duration::from_secs(1));
        loop {
            at += Duration::from_millis(300 + rng.below(2_700));
            let hold = Duration::from_millis(300 + rng.below(4_700));
            if !enabled || at + hold > end {
                break;
            }
            let fault = choose(&mut rng, nodes);
            events.push((at, Event::Start(fault.clone())));
            if !matches!(fault, Fault::WallStep { .. }) {
                events.push((at + hold, Event::Heal(fault)));
            }
            at += hold;
        }
        FaultPlan {
            events,
            next: 0,
            nodes,
            base_latency,
        }
    }

    /// The most a message takes when no fault slows the network.
    pub fn max_latency(&self) -> Duration {
        self.base_latency
    }

    /// The events due at `now` (each once), with what they need to be applied.
    pub fn due(&mut self, now: Duration) -> Vec<Due> {
        let mut due = Vec::new();
        while let Some((at, event)) = self.events.get(self.next)
            && *at <= now
        {
            due.push(Due {
                event: event.clone(),
                nodes: self.nodes,
                base_latency: self.base_latency,
            });
            self.next += 1;
        }
        due
    }
}

fn choose(rng: &mut Rng, nodes: u64) -> Fault {
    let node = 1 + rng.below(nodes);
    match rng.below(100) {
        0..=17 => Fault::Isolate { node },
        18..=27 => {
            let to = 1 + (node + rng.below(nodes - 1)) % nodes;
            Fault::OneWay { from: node, to }
        }
        28..=42 => Fault::Crash { node },
        43..=49 => Fault::Disk {
            node,
            full: rng.below(2) == 0,
        },
        50..=54 => Fault::CrashAll,
        55..=66 => {
            let to = 1 + (node + rng.below(nodes - 1)) % nodes;
            // Back to the node itself two times in three: the case where a node can count its
            // own vote twice.
            let instead = match rng.below(3) {
                0 | 1 => node,
                _ => (1..=nodes)
                    .filter(|n| *n != node && *n != to)
                    .nth(rng.below(nodes - 2) as usize)
                    .unwrap_or(node),
            };
            Fault::Misroute {
                from: node,
                to,
                instead,
            }
        }
        67..=72 => Fault::Hold { node },
        73..=78 => Fault::Pause { node },
        79..=86 => Fault::Slow {
            max_latency: Duration::from_millis(20 + rng.below(400)),
        },
        _ => {
            let magnitude = 1 + rng.below(3_600) as i64;
            let seconds = if rng.below(2) == 0 {
                magnitude
            } else {
                -magnitude
            };
            Fault::WallStep { seconds }
        }
    }
}

/// An event to apply now.
pub struct Due {
    event: Event,
    nodes: u64,
    base_latency: Duration,
}

impl fmt::Display for Due {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.event.fmt(f)
    }
}

impl Due {
    /// Applies the event to `sim`; the nodes' data directories are under `scratch`.
    pub fn apply(
        &self,
        sim: &mut turmoil::Sim<'_>,
        wall_step: &'static std::thread::LocalKey<Cell<i64>>,
        scratch: &std::path::Path,
    ) {
        let others = |node: u64| (1..=self.nodes).filter(move |n| *n != node);
        match &self.event {
            Event::Start(fault) => match fault {
                Fault::Isolate { node } => {
                    for other in others(*node) {
                        sim.partition(node_ip(*node), node_ip(other));
                    }
                }
                Fault::OneWay { from, to } => sim.partition_oneway(node_ip(*from), node_ip(*to)),
                Fault::Misroute { from, to, instead } => {
                    crate::misroute(*from, *to, Some(*instead));
                    sim.bounce(node_ip(*from));
                }
                Fault::Crash { node } => sim.crash(node_ip(*node)),
                Fault::CrashAll => {
                    for node in 1..=self.nodes {
                        sim.crash(node_ip(node));
                    }
                }
                Fault::Disk { node, full } => {
                    let fault = match full {
                        true => conchd::disk_faults::DiskFault::Full,
                        false => conchd::disk_faults::DiskFault::Io,
                    };
                    conchd::disk_faults::fail_syncs_under(
                        &crate::node_dir(scratch, *node),
                        Some(fault),
                    );
                }
                Fault::Hold { node } => {
                    for other in others(*node) {
                        sim.hold(node_ip(*node), node_ip(other));
                    }
                }
                Fault::Pause { node } => {
                    for other in others(*node) {
                        sim.hold(node_ip(*node), node_ip(other));
                    }
                    sim.hold(node_ip(*node), crate::client_ip());
                }
                Fault::Slow { max_latency } => sim.set_max_message_latency(*max_latency),
                Fault::WallStep { seconds } => {
                    wall_step.with(|s| s.set(s.get().saturating_add(seconds * 1_000_000_000)));
                }
            },
            Event::Heal(fault) => match fault {
                Fault::Isolate { node } => {
                    for other in others(*node) {
                        sim.repair(node_ip(*node), node_ip(other));
                    }
                }
                Fault::OneWay { from, to } => sim.repair_oneway(node_ip(*from), node_ip(*to)),
                Fault::Misroute { from, to, .. } => {
                    crate::misroute(*from, *to, None);
                    sim.bounce(node_ip(*from));
                }
                Fault::Crash { node } => sim.bounce(node_ip(*node)),
                Fault::Disk { node, .. } => {
                    conchd::disk_faults::fail_syncs_under(&crate::node_dir(scratch, *node), None);
                    sim.bounce(node_ip(*node));
                }
                Fault::CrashAll => {
                    for node in 1..=self.nodes {
                        sim.bounce(node_ip(node));
                    }
                }
                Fault::Hold { node } => {
                    for other in others(*node) {
                        sim.release(node_ip(*node), node_ip(other));
                    }
                }
                Fault::Pause { node } => {
                    for other in others(*node) {
                        sim.release(node_ip(*node), node_ip(other));
                    }
                    sim.release(node_ip(*node), crate::client_ip());
                }
                Fault::Slow { .. } => sim.set_max_message_latency(self.base_latency),
                Fault::WallStep { .. } => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_plans_the_same_faults_every_time_and_heals_each() {
        let plan = |seed| FaultPlan::new(seed, 3, Duration::from_secs(60), true).events;
        assert_eq!(plan(7), plan(7));
        assert_ne!(plan(7), plan(8));
        let events = plan(7);
        assert!(events.len() >= 10, "a minute holds many faults: {events:?}");
        let mut open: Option<&Fault> = None;
        for (_, event) in &events {
            match event {
                Event::Start(f) => {
                    assert!(open.is_none(), "one fault at a time: {events:?}");
                    if !matches!(f, Fault::WallStep { .. }) {
                        open = Some(f);
                    }
                }
                Event::Heal(f) => {
                    assert_eq!(open, Some(f), "a heal closes the open fault");
                    open = None;
                }
            }
        }
        assert!(open.is_none(), "every fault is healed before the run ends");
        assert!(events.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
        assert!(
            FaultPlan::new(7, 3, Duration::from_secs(60), false)
                .events
                .is_empty()
        );
    }
}

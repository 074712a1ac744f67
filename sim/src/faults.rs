//! The faults of one seed, planned before the run: one at a time, each after a quiet spell and
//! healed after it has held, so a majority can always make progress between faults.
//!
//! Two mixes of faults exist. The first ([`Mix::First`]) is the one the simulator started with:
//! its seeds keep their executions, so a seed found with it still replays. The second
//! ([`Mix::Full`], the default) adds what a crash and a power loss take from a disk, slow
//! disks, and clocks that step or drift on one node.

use std::fmt;
use std::time::Duration;

use cluster_tests::rng::Rng;

use crate::node_ip;

/// Where the plan's random stream sits among the seed's streams (clients take 0..).
const PLAN_STREAM: u64 = u64::MAX - 7;

/// Which faults a seed draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// The network faults, crashes that lose nothing the page cache holds, failing and full
    /// disks, and wall-clock steps on every node at once.
    First,
    /// All of the first, plus: a crash loses sled values written since its last flush, a power
    /// loss (one node or all) also loses or tears unsynced writes, a disk that failed is power
    /// cycled, slow disks, wall clocks that step or drift on one node, and nodes replaced
    /// through membership changes.
    Full,
}

impl Mix {
    /// The number `conch-sim --fault-mix` takes.
    pub fn number(self) -> u8 {
        match self {
            Mix::First => 1,
            Mix::Full => 2,
        }
    }

    pub fn from_number(n: u8) -> Option<Mix> {
        match n {
            1 => Some(Mix::First),
            2 => Some(Mix::Full),
            _ => None,
        }
    }
}
/// A kind of fault, by the name `conch-sim --only-faults` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Isolate,
    OneWay,
    Misroute,
    Crash,
    PowerLoss,
    PowerLossAll,
    SlowDisk,
    ClockStep,
    ClockDrift,
    Replace,
    CrashAll,
    Disk,
    Hold,
    Pause,
    Slow,
    WallStep,
}

impl Kind {
    pub const ALL: [Kind; 16] = [
        Kind::Isolate,
        Kind::OneWay,
        Kind::Misroute,
        Kind::Crash,
        Kind::PowerLoss,
        Kind::PowerLossAll,
        Kind::SlowDisk,
        Kind::ClockStep,
        Kind::ClockDrift,
        Kind::Replace,
        Kind::CrashAll,
        Kind::Disk,
        Kind::Hold,
        Kind::Pause,
        Kind::Slow,
        Kind::WallStep,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Isolate => "isolate",
            Kind::OneWay => "one-way",
            Kind::Misroute => "misroute",
            Kind::Crash => "crash",
            Kind::PowerLoss => "power-loss",
            Kind::PowerLossAll => "power-loss-all",
            Kind::SlowDisk => "slow-disk",
            Kind::ClockStep => "clock-step",
            Kind::ClockDrift => "clock-drift",
            Kind::Replace => "replace",
            Kind::CrashAll => "crash-all",
            Kind::Disk => "disk",
            Kind::Hold => "hold",
            Kind::Pause => "pause",
            Kind::Slow => "slow",
            Kind::WallStep => "wall-step",
        }
    }

    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// The kinds of fault a seed may draw. The full mix draws its faults as always and keeps only
/// those of these kinds, so a run aimed at one kind meets it at every fault instead of at one
/// fault in ten or twenty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kinds(u32);

impl Kinds {
    /// Every kind: the mix as it is.
    pub const ALL: Kinds = Kinds(u32::MAX);

    pub fn of(kinds: &[Kind]) -> Kinds {
        Kinds(kinds.iter().fold(0, |set, k| set | k.bit()))
    }

    pub fn contains(self, kind: Kind) -> bool {
        self.0 & kind.bit() != 0
    }

    pub fn is_all(self) -> bool {
        Kind::ALL.into_iter().all(|k| self.contains(k))
    }

    /// The names, comma-separated, as `--only-faults` takes them.
    pub fn names(self) -> String {
        let names: Vec<&str> = Kind::ALL
            .into_iter()
            .filter(|k| self.contains(*k))
            .map(Kind::name)
            .collect();
        names.join(",")
    }
}

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
    /// In the full mix it loses sled values it had not flushed, or some of them.
    Crash { node: u64 },
    /// The node's machine loses power: its process dies, and writes it had not synced are
    /// lost, torn or kept (in order, up to a point); healed by starting it again.
    PowerLoss { node: u64 },
    /// Every machine loses power at once.
    PowerLossAll,
    /// Every log sync of the node takes this long first.
    SlowDisk { node: u64, delay: Duration },
    /// The wall clock the node reads jumps by this many seconds (either way).
    ClockStep { node: u64, seconds: i64 },
    /// The wall clock the node reads runs fast or slow by this many parts per million until
    /// healed (the time it gained or lost stays).
    ClockDrift { node: u64, ppm: i64 },
    /// An operator takes the node out of the cluster (`ChangeMembership` with `remove`); healed
    /// by wiping its data directory, starting it empty, adding it as a learner and making it a
    /// voter again. The next faults may come while that is under way.
    Replace { node: u64 },
    /// Every node dies at once; healed by starting them all.
    CrashAll,
    /// The node's log syncs fail (an I/O error, or the disk full): its next append fails and
    /// the node stops, as `conchd` exits on a storage failure; healed by starting it again on
    /// the same directory once the disk works, as a supervisor would. In the full mix the heal
    /// power cycles the machine first, so the failed append's unsynced write may be torn.
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
            Fault::PowerLoss { node } => write!(f, "n{node} loses power"),
            Fault::PowerLossAll => write!(f, "every node loses power"),
            Fault::SlowDisk { node, delay } => {
                write!(f, "n{node}'s syncs take {} ms", delay.as_millis())
            }
            Fault::ClockStep { node, seconds } => {
                write!(f, "n{node}'s wall clock steps {seconds:+} s")
            }
            Fault::ClockDrift { node, ppm } => write!(f, "n{node}'s wall clock drifts {ppm:+} ppm"),
            Fault::Replace { node } => write!(f, "n{node} is removed, then wiped and added back"),
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
    mix: Mix,
    /// Draws what each crash and power loss takes away.
    losses: Rng,
}

/// Where the stream that decides what crashes take away sits among the seed's streams.
const LOSS_STREAM: u64 = u64::MAX - 8;

impl FaultPlan {
    /// The plan of `seed`: faults drawn from `mix`, keeping only those of the kinds in `only`
    /// (a set with none of the full mix's kinds is given no fault).
    pub fn new(
        seed: u64,
        nodes: u64,
        duration: Duration,
        enabled: bool,
        mix: Mix,
        only: Kinds,
    ) -> FaultPlan {
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
            let fault = match mix {
                Mix::First => choose_first(&mut rng, nodes),
                Mix::Full if only.is_all() => choose(&mut rng, nodes),
                Mix::Full => match choose_only(&mut rng, nodes, only) {
                    Some(fault) => fault,
                    None => break,
                },
            };
            events.push((at, Event::Start(fault.clone())));
            if !fault.is_instant() {
                events.push((at + hold, Event::Heal(fault)));
            }
            at += hold;
        }
        FaultPlan {
            events,
            next: 0,
            nodes,
            base_latency,
            mix,
            losses: Rng::derive(seed, LOSS_STREAM),
        }
    }

    /// The most a message takes when no fault slows the network.
    pub fn max_latency(&self) -> Duration {
        self.base_latency
    }

    /// The events due at `now` (each once).
    pub fn due(&mut self, now: Duration) -> Vec<Event> {
        let mut due = Vec::new();
        while let Some((at, event)) = self.events.get(self.next)
            && *at <= now
        {
            due.push(event.clone());
            self.next += 1;
        }
        due
    }
}

impl Fault {
    /// A fault that is over once made (a clock step): it has no heal.
    fn is_instant(&self) -> bool {
        matches!(self, Fault::WallStep { .. } | Fault::ClockStep { .. })
    }
}

/// The full mix (see [`Mix::Full`]).
fn choose(rng: &mut Rng, nodes: u64) -> Fault {
    let node = 1 + rng.below(nodes);
    let seconds = |rng: &mut Rng| {
        let magnitude = 1 + rng.below(3_600) as i64;
        if rng.below(2) == 0 {
            magnitude
        } else {
            -magnitude
        }
    };
    match rng.below(100) {
        0..=9 => Fault::Isolate { node },
        10..=12 => Fault::Replace { node },
        13..=20 => Fault::OneWay {
            from: node,
            to: other_node(rng, nodes, node),
        },
        21..=31 => Fault::Crash { node },
        32..=37 => Fault::Disk {
            node,
            full: rng.below(2) == 0,
        },
        38..=41 => Fault::CrashAll,
        42..=48 => Fault::PowerLoss { node },
        49..=52 => Fault::PowerLossAll,
        53..=61 => misroute(rng, nodes, node),
        62..=66 => Fault::Hold { node },
        67..=71 => Fault::Pause { node },
        72..=78 => Fault::Slow {
            max_latency: Duration::from_millis(20 + rng.below(400)),
        },
        79..=84 => Fault::SlowDisk {
            node,
            delay: Duration::from_millis(5 + rng.below(195)),
        },
        85..=89 => Fault::ClockStep {
            node,
            seconds: seconds(rng),
        },
        90..=94 => {
            // Up to 20 %: far beyond a real oscillator, to make drift matter within a seed.
            let magnitude = 1 + rng.below(200_000) as i64;
            let ppm = if rng.below(2) == 0 {
                magnitude
            } else {
                -magnitude
            };
            Fault::ClockDrift { node, ppm }
        }
        _ => Fault::WallStep {
            seconds: seconds(rng),
        },
    }
}

/// A fault of the full mix of one of the kinds in `only`: the mix's draws until one is (none
/// if no kind of the mix is in `only`). Any one kind comes up within a few hundred draws.
fn choose_only(rng: &mut Rng, nodes: u64, only: Kinds) -> Option<Fault> {
    if !Kind::ALL.into_iter().any(|k| only.contains(k)) {
        return None;
    }
    loop {
        let fault = choose(rng, nodes);
        if only.contains(fault.kind()) {
            return Some(fault);
        }
    }
}

impl Fault {
    pub fn kind(&self) -> Kind {
        match self {
            Fault::Isolate { .. } => Kind::Isolate,
            Fault::OneWay { .. } => Kind::OneWay,
            Fault::Misroute { .. } => Kind::Misroute,
            Fault::Crash { .. } => Kind::Crash,
            Fault::PowerLoss { .. } => Kind::PowerLoss,
            Fault::PowerLossAll => Kind::PowerLossAll,
            Fault::SlowDisk { .. } => Kind::SlowDisk,
            Fault::ClockStep { .. } => Kind::ClockStep,
            Fault::ClockDrift { .. } => Kind::ClockDrift,
            Fault::Replace { .. } => Kind::Replace,
            Fault::CrashAll => Kind::CrashAll,
            Fault::Disk { .. } => Kind::Disk,
            Fault::Hold { .. } => Kind::Hold,
            Fault::Pause { .. } => Kind::Pause,
            Fault::Slow { .. } => Kind::Slow,
            Fault::WallStep { .. } => Kind::WallStep,
        }
    }
}

/// Another node than `node`, drawn.
fn other_node(rng: &mut Rng, nodes: u64, node: u64) -> u64 {
    1 + (node + rng.below(nodes - 1)) % nodes
}

/// Node `node`'s address for another node leads to a third one, or back to itself.
fn misroute(rng: &mut Rng, nodes: u64, node: u64) -> Fault {
    let to = other_node(rng, nodes, node);
    // Back to the node itself two times in three: the case where a node can count its own vote
    // twice.
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

/// The first mix (see [`Mix::First`]); its draws must never change, or its seeds would replay
/// something else.
fn choose_first(rng: &mut Rng, nodes: u64) -> Fault {
    let node = 1 + rng.below(nodes);
    match rng.below(100) {
        0..=17 => Fault::Isolate { node },
        18..=27 => Fault::OneWay {
            from: node,
            to: other_node(rng, nodes, node),
        },
        28..=42 => Fault::Crash { node },
        43..=49 => Fault::Disk {
            node,
            full: rng.below(2) == 0,
        },
        50..=54 => Fault::CrashAll,
        55..=66 => misroute(rng, nodes, node),
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

impl FaultPlan {
    /// Applies `event` to `sim`; the nodes' data directories are under `scratch`. A node's
    /// wall clock is read at simulated time `now`. Returns what crashes took from disks, said,
    /// for the trace.
    pub fn apply(
        &mut self,
        event: &Event,
        sim: &mut turmoil::Sim<'_>,
        scratch: &std::path::Path,
        now: Duration,
    ) -> anyhow::Result<Vec<String>> {
        let mut lost = Vec::new();
        let nodes = self.nodes;
        let others = move |node: u64| (1..=nodes).filter(move |n| *n != node);
        let dir = |node: u64| crate::node_dir(scratch, node);
        match event {
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
                Fault::Crash { node } => lost.extend(self.crash(sim, scratch, *node, false)?),
                Fault::CrashAll => {
                    for node in 1..=nodes {
                        lost.extend(self.crash(sim, scratch, node, false)?);
                    }
                }
                Fault::PowerLoss { node } => lost.extend(self.crash(sim, scratch, *node, true)?),
                Fault::PowerLossAll => {
                    for node in 1..=nodes {
                        lost.extend(self.crash(sim, scratch, node, true)?);
                    }
                }
                Fault::Disk { node, full } => {
                    let fault = match full {
                        true => conchd::sim_hooks::disk_faults::DiskFault::Full,
                        false => conchd::sim_hooks::disk_faults::DiskFault::Io,
                    };
                    conchd::sim_hooks::disk_faults::fail_syncs_under(&dir(*node), Some(fault));
                }
                Fault::SlowDisk { node, delay } => {
                    conchd::sim_hooks::disk_faults::slow_syncs_under(&dir(*node), Some(*delay));
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
                Fault::WallStep { seconds } => crate::clocks::step(None, *seconds),
                Fault::ClockStep { node, seconds } => crate::clocks::step(Some(*node), *seconds),
                Fault::ClockDrift { node, ppm } => crate::clocks::drift(*node, *ppm, now),
                Fault::Replace { node } => crate::operator::remove(*node),
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
                Fault::Crash { node } | Fault::PowerLoss { node } => sim.bounce(node_ip(*node)),
                Fault::Disk { node, .. } => {
                    conchd::sim_hooks::disk_faults::fail_syncs_under(&dir(*node), None);
                    if self.mix == Mix::Full {
                        // The node stopped on its own; its machine is power cycled.
                        lost.extend(self.crash(sim, scratch, *node, true)?);
                    }
                    sim.bounce(node_ip(*node));
                }
                Fault::CrashAll | Fault::PowerLossAll => {
                    for node in 1..=nodes {
                        sim.bounce(node_ip(node));
                    }
                }
                Fault::SlowDisk { node, .. } => {
                    conchd::sim_hooks::disk_faults::slow_syncs_under(&dir(*node), None);
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
                Fault::ClockDrift { node, .. } => crate::clocks::drift(*node, 0, now),
                Fault::Replace { node } => crate::operator::add_back(*node),
                Fault::WallStep { .. } | Fault::ClockStep { .. } => {}
            },
        }
        Ok(lost)
    }

    /// Stops node `node` wherever it was. In the full mix the crash takes what it would take
    /// from the node's disk (`power`: the machine's power too), said; in the first, nothing.
    fn crash(
        &mut self,
        sim: &mut turmoil::Sim<'_>,
        scratch: &std::path::Path,
        node: u64,
        power: bool,
    ) -> anyhow::Result<Option<String>> {
        sim.crash(node_ip(node));
        if self.mix == Mix::First {
            return Ok(None);
        }
        let dir = crate::node_dir(scratch, node);
        let losses = &mut self.losses;
        let mut pick = |below: u64| losses.below(below);
        let lost = if power {
            conchd::sim_hooks::disk_faults::lose_power(&dir, &mut pick).map_err(|e| {
                anyhow::anyhow!("undo n{node}'s unsynced writes in {}: {e}", dir.display())
            })?
        } else {
            conchd::sim_hooks::disk_faults::lose_on_crash(&dir, &mut pick)
        };
        Ok(Some(format!(
            "n{node} lost {} unflushed values and {} unsynced writes, tore {}, kept {}",
            lost.values, lost.writes, lost.torn, lost.kept
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_plans_the_same_faults_every_time_and_heals_each() {
        let plan = |seed| {
            FaultPlan::new(
                seed,
                3,
                Duration::from_secs(60),
                true,
                Mix::Full,
                Kinds::ALL,
            )
            .events
        };
        assert_eq!(plan(7), plan(7));
        assert_ne!(plan(7), plan(8));
        let events = plan(7);
        assert!(events.len() >= 10, "a minute holds many faults: {events:?}");
        let mut open: Option<&Fault> = None;
        for (_, event) in &events {
            match event {
                Event::Start(f) => {
                    assert!(open.is_none(), "one fault at a time: {events:?}");
                    if !f.is_instant() {
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
            FaultPlan::new(7, 3, Duration::from_secs(60), false, Mix::Full, Kinds::ALL)
                .events
                .is_empty()
        );
    }

    #[test]
    fn the_full_mix_draws_every_kind_within_a_few_seeds() {
        let mut first_seed = std::collections::BTreeMap::new();
        for seed in 1..=40 {
            for (_, event) in FaultPlan::new(
                seed,
                3,
                Duration::from_secs(30),
                true,
                Mix::Full,
                Kinds::ALL,
            )
            .events
            {
                if let Event::Start(fault) = event {
                    first_seed.entry(fault.kind()).or_insert(seed);
                }
            }
        }
        println!("first seed drawing each kind: {first_seed:?}");
        assert_eq!(first_seed.len(), 16, "every kind drawn: {first_seed:?}");
    }

    #[test]
    fn a_plan_aimed_at_some_kinds_draws_only_those_and_the_full_plan_is_unchanged() {
        let only = Kinds::of(&[Kind::PowerLossAll, Kind::Misroute]);
        let starts = |only| {
            FaultPlan::new(5, 3, Duration::from_secs(30), true, Mix::Full, only)
                .events
                .into_iter()
                .filter_map(|(_, e)| match e {
                    Event::Start(f) => Some(f.kind()),
                    Event::Heal(_) => None,
                })
                .collect::<Vec<_>>()
        };
        let aimed = starts(only);
        assert!(
            aimed.len() >= 5,
            "an aimed plan still has a fault every few seconds: {aimed:?}"
        );
        assert!(aimed.iter().all(|k| only.contains(*k)), "{aimed:?}");
        assert!(aimed.contains(&Kind::PowerLossAll) && aimed.contains(&Kind::Misroute));
        assert_eq!(starts(only), aimed, "the same seed plans the same faults");
        assert_eq!(starts(Kinds::ALL), starts(Kinds::of(&Kind::ALL)));
        assert!(starts(Kinds::of(&[])).is_empty());
    }

    #[test]
    fn kinds_are_named_as_the_command_line_takes_them() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(Kind::from_name("powerloss"), None);
        assert_eq!(
            Kinds::of(&[Kind::Misroute, Kind::PowerLossAll]).names(),
            "misroute,power-loss-all"
        );
        assert!(Kinds::ALL.is_all() && !Kinds::of(&[Kind::Crash]).is_all());
    }
}

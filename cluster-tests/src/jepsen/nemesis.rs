//! The nemesis: a seeded sequence of faults, one at a time, while the workload runs.
//!
//! Menu (weights; `bridge` only with 5 nodes):
//! - `kill` (12): kill -9 of a random node, restarted after 1–3 s;
//! - `kill-leader` (14): the same for the leader;
//! - `kill-all` (4): kill -9 of every node, all restarted after 0.5–1.5 s (durability of
//!   everything acknowledged);
//! - `pause-leader` (12): SIGSTOP of the leader for 2–4 s (at least twice the largest election
//!   timeout, so it loses leadership), then SIGCONT;
//! - `pause-follower` (6): the same for a follower;
//! - `isolate-leader` (14): every link to and from the leader cut, 2–5 s;
//! - `split` (12): a random minority cut from the majority, 2–5 s;
//! - `one-way-leader` (8): only the leader's outgoing links cut (it still hears the others);
//! - `slow` (6): every link delays each chunk by 20–200 ms for 2–4 s;
//! - `bridge` (8, 5 nodes): two pairs that cannot see each other, and one node that sees both;
//! - `pause-client` (8): SIGSTOP of one `conch sema` holder's conch for longer than its TTL
//!   (see [`super::cli_holders`]; the run does it, the nodes are untouched).
//!
//! A cut link is, at random, `refuse` (connections reset), `blackhole` (nothing delivered,
//! connections dropped at the heal) or `stall` (nothing delivered until the heal, then
//! everything: what TCP does across a short partition). Any fault name or cut mode can be
//! excluded from the menu.
//!
//! After each heal the nemesis measures recovery: the time until a write (a namespace create)
//! succeeds through some node, and until every node answers a linearizable read.

use std::time::Duration;

use conch_proto::grackle as pb;
use conch_proto::grackle::grackle_api_client::GrackleApiClient;
use conch_testkit::LinkMode;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::rng::Rng;

use super::history::{Micros, fmt_micros};

/// Recovery probes give up after this long (the bound itself is checked by the run).
const PROBE_GIVE_UP: Duration = Duration::from_secs(30);
const PROBE_ATTEMPT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub enum Fault {
    Kill {
        nodes: Vec<u64>,
    },
    Pause {
        node: u64,
    },
    Partition {
        groups: Vec<Vec<u64>>,
        mode: LinkMode,
    },
    OneWay {
        node: u64,
        mode: LinkMode,
    },
    Bridge {
        left: Vec<u64>,
        bridge: u64,
        right: Vec<u64>,
        mode: LinkMode,
    },
    Slow {
        delay: Duration,
    },
    PauseClient,
}

#[derive(Clone, Debug)]
pub struct FaultRecord {
    pub name: &'static str,
    pub detail: String,
    pub start: Micros,
    pub healed: Micros,
    /// From the fault to the first acknowledged write while it lasted (failover), if any.
    pub during: Option<Duration>,
    /// From the heal to the first acknowledged write (any node).
    pub first_write: Option<Duration>,
    /// From the heal until every node answered a linearizable read.
    pub all_nodes: Option<Duration>,
}

impl std::fmt::Display for FaultRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Option<Duration>| {
            d.map(|d| format!("{} ms", d.as_millis()))
                .unwrap_or_else(|| "never".into())
        };
        write!(
            f,
            "{:<15} {:<34} {:>8} .. {:>8}  writes during fault after {:>8}; after heal: write {:>8}, every node {:>8}",
            self.name,
            self.detail,
            fmt_micros(self.start),
            fmt_micros(self.healed),
            ms(self.during),
            ms(self.first_write),
            ms(self.all_nodes)
        )
    }
}

pub struct Nemesis {
    rng: Rng,
    probe_seq: u64,
    namespace: String,
    exclude: Vec<String>,
}

/// Every fault name with its weight.
pub const MENU: [(&str, u64); 11] = [
    ("kill", 12),
    ("kill-leader", 14),
    ("kill-all", 4),
    ("pause-leader", 12),
    ("pause-follower", 6),
    ("isolate-leader", 14),
    ("split", 12),
    ("one-way-leader", 8),
    ("slow", 6),
    ("bridge", 8),
    (super::cli_holders::FAULT, 8),
];

/// Ways to cut a link.
pub const CUT_MODES: [&str; 3] = ["refuse", "blackhole", "stall"];

fn mode_name(mode: LinkMode) -> String {
    match mode {
        LinkMode::Refuse => "refused".into(),
        LinkMode::Blackhole => "black-holed".into(),
        LinkMode::Stall => "stalled".into(),
        LinkMode::Delay(d) => format!("delayed {} ms", d.as_millis()),
        LinkMode::Pass => "passing".into(),
        LinkMode::SwallowReplies(_) => "swallowing replies".into(),
    }
}

impl Nemesis {
    /// `exclude` names faults of [`MENU`] or cut modes of [`CUT_MODES`] never to use.
    pub fn new(rng: Rng, namespace: &str, exclude: &[String]) -> Nemesis {
        Nemesis {
            rng,
            probe_seq: 0,
            namespace: namespace.to_string(),
            exclude: exclude.to_vec(),
        }
    }

    fn allowed(&self, name: &str) -> bool {
        !self.exclude.iter().any(|e| e == name)
    }

    pub fn quiet(&mut self) -> Duration {
        Duration::from_millis(self.rng.range(1000, 2500))
    }

    fn cut_mode(&mut self) -> LinkMode {
        let modes: Vec<&str> = CUT_MODES
            .iter()
            .copied()
            .filter(|m| self.allowed(m))
            .collect();
        match self.rng.pick(&modes).copied() {
            Some("blackhole") => LinkMode::Blackhole,
            Some("stall") => LinkMode::Stall,
            _ => LinkMode::Refuse,
        }
    }

    /// Picks the next fault and how long it lasts.
    pub fn choose(
        &mut self,
        ids: &[u64],
        leader: Option<u64>,
    ) -> (&'static str, Fault, Duration, String) {
        let menu: Vec<(&'static str, u64)> = MENU
            .iter()
            .copied()
            .filter(|(name, _)| self.allowed(name) && (*name != "bridge" || ids.len() >= 5))
            .collect();
        let total: u64 = menu.iter().map(|(_, w)| w).sum();
        let mut roll = self.rng.below(total);
        let mut name = menu.first().map(|m| m.0).unwrap_or("slow");
        for (n, w) in &menu {
            if roll < *w {
                name = n;
                break;
            }
            roll -= w;
        }
        let random = *self.rng.pick(ids).unwrap_or(&1);
        let target = leader.unwrap_or(random);
        let followers: Vec<u64> = ids.iter().copied().filter(|&i| Some(i) != leader).collect();
        let follower = *self.rng.pick(&followers).unwrap_or(&random);
        let ms = |rng: &mut Rng, lo, hi| Duration::from_millis(rng.range(lo, hi));
        match name {
            "kill" | "kill-leader" => {
                let node = if name == "kill" { random } else { target };
                let hold = ms(&mut self.rng, 1000, 3000);
                (
                    name,
                    Fault::Kill { nodes: vec![node] },
                    hold,
                    format!("kill -9 n{node}"),
                )
            }
            "kill-all" => (
                name,
                Fault::Kill {
                    nodes: ids.to_vec(),
                },
                ms(&mut self.rng, 500, 1500),
                "kill -9 every node".into(),
            ),
            "pause-leader" | "pause-follower" => {
                let node = if name == "pause-follower" {
                    follower
                } else {
                    target
                };
                (
                    name,
                    Fault::Pause { node },
                    ms(&mut self.rng, 2000, 4000),
                    format!("SIGSTOP n{node}"),
                )
            }
            "isolate-leader" => {
                let mode = self.cut_mode();
                let others: Vec<u64> = ids.iter().copied().filter(|&i| i != target).collect();
                (
                    name,
                    Fault::Partition {
                        groups: vec![vec![target], others],
                        mode,
                    },
                    ms(&mut self.rng, 2000, 5000),
                    format!("n{target} {}", mode_name(mode)),
                )
            }
            "split" => {
                let mode = self.cut_mode();
                let mut shuffled = ids.to_vec();
                for i in (1..shuffled.len()).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    shuffled.swap(i, j);
                }
                let minority_size = (ids.len() - 1) / 2;
                let minority = shuffled[..minority_size].to_vec();
                let majority = shuffled[minority_size..].to_vec();
                let detail = format!("{minority:?} | {majority:?} {}", mode_name(mode));
                (
                    name,
                    Fault::Partition {
                        groups: vec![minority, majority],
                        mode,
                    },
                    ms(&mut self.rng, 2000, 5000),
                    detail,
                )
            }
            "one-way-leader" => {
                let mode = self.cut_mode();
                (
                    name,
                    Fault::OneWay { node: target, mode },
                    ms(&mut self.rng, 2000, 5000),
                    format!("n{target} -> others {}", mode_name(mode)),
                )
            }
            "bridge" => {
                let mode = self.cut_mode();
                let mut shuffled = ids.to_vec();
                for i in (1..shuffled.len()).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    shuffled.swap(i, j);
                }
                let half = shuffled.len() / 2;
                let bridge = shuffled[half];
                let left = shuffled[..half].to_vec();
                let right = shuffled[half + 1..].to_vec();
                let detail = format!("{left:?} <- n{bridge} -> {right:?} {}", mode_name(mode));
                (
                    name,
                    Fault::Bridge {
                        left,
                        bridge,
                        right,
                        mode,
                    },
                    ms(&mut self.rng, 2000, 5000),
                    detail,
                )
            }
            super::cli_holders::FAULT => {
                let (lo, hi) = super::cli_holders::PAUSE_MS;
                let hold = ms(&mut self.rng, lo, hi);
                (name, Fault::PauseClient, hold, "a conch sema holder".into())
            }
            _ => {
                let delay = ms(&mut self.rng, 20, 200);
                (
                    "slow",
                    Fault::Slow { delay },
                    ms(&mut self.rng, 2000, 4000),
                    format!("every link +{} ms", delay.as_millis()),
                )
            }
        }
    }

    pub fn apply(&mut self, cluster: &mut Cluster, fault: &Fault) {
        match fault {
            Fault::Kill { nodes } => {
                for &id in nodes {
                    cluster.kill(id);
                }
            }
            Fault::Pause { node } => cluster.pause(*node),
            Fault::Partition { groups, mode } => cluster.partition(groups, *mode),
            Fault::OneWay { node, mode } => {
                for to in cluster.ids() {
                    if to != *node {
                        cluster.set_link(*node, to, *mode);
                    }
                }
            }
            Fault::Bridge {
                left, right, mode, ..
            } => {
                for &a in left {
                    for &b in right {
                        cluster.set_link(a, b, *mode);
                        cluster.set_link(b, a, *mode);
                    }
                }
            }
            Fault::PauseClient => {}
            Fault::Slow { delay } => {
                for from in cluster.ids() {
                    for to in cluster.ids() {
                        if from != to {
                            cluster.set_link(from, to, LinkMode::Delay(*delay));
                        }
                    }
                }
            }
        }
    }

    /// Undoes every fault: all nodes running and resumed, every link passing.
    pub fn heal(&mut self, cluster: &mut Cluster) -> anyhow::Result<()> {
        cluster.heal_all()
    }

    /// Time from `since` to the first acknowledged write (a create of namespace `name`)
    /// through any node, trying them in turn; `None` if none succeeded before `until`.
    pub async fn first_write(
        &self,
        cluster: &Cluster,
        since: Instant,
        until: Instant,
        name: &str,
    ) -> Option<Duration> {
        let ids = cluster.ids();
        let mut i = 0;
        while Instant::now() < until {
            let id = ids[i % ids.len()];
            i += 1;
            let Some(channel) = cluster.channel(id) else {
                continue;
            };
            let req = pb::CreateNamespaceRequest {
                name: name.to_string(),
                ..Default::default()
            };
            let started = Instant::now();
            let attempt = PROBE_ATTEMPT.min(until.saturating_duration_since(started));
            let reply = tokio::time::timeout(
                attempt,
                GrackleApiClient::new(channel).create_namespace(req),
            )
            .await;
            match reply {
                Ok(Ok(_)) => return Some(since.elapsed()),
                Ok(Err(s)) if s.code() == tonic::Code::AlreadyExists => {
                    return Some(since.elapsed());
                }
                _ => {
                    let spent = started.elapsed();
                    if spent < Duration::from_millis(50) {
                        tokio::time::sleep(Duration::from_millis(50) - spent).await;
                    }
                }
            }
        }
        None
    }

    /// While a fault lasts (from `since` until `until`): how long until writes succeed again
    /// (failover), if they do before the heal.
    pub async fn during(
        &mut self,
        cluster: &Cluster,
        since: Instant,
        until: Instant,
    ) -> Option<Duration> {
        self.probe_seq += 1;
        let name = format!("probe-{}", self.probe_seq);
        self.first_write(cluster, since, until, &name).await
    }

    /// Measures recovery after a heal at `healed`.
    pub async fn recovery(
        &mut self,
        cluster: &Cluster,
        healed: Instant,
    ) -> (Option<Duration>, Option<Duration>) {
        self.probe_seq += 1;
        let name = format!("probe-{}", self.probe_seq);
        let first_write = self.first_write(cluster, healed, healed + PROBE_GIVE_UP, &name);
        let all_nodes = async {
            let deadline = healed + PROBE_GIVE_UP;
            let per_node = cluster.ids().into_iter().map(|id| {
                let channel = cluster.channel(id);
                let ns = self.namespace.clone();
                async move {
                    let channel = channel?;
                    while Instant::now() < deadline {
                        let req = pb::GetNamespaceRequest {
                            namespace_name: ns.clone(),
                        };
                        let reply = tokio::time::timeout(
                            PROBE_ATTEMPT,
                            GrackleApiClient::new(channel.clone()).get_namespace(req),
                        )
                        .await;
                        if let Ok(Ok(_)) = reply {
                            return Some(healed.elapsed());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    None
                }
            });
            let times = futures::future::join_all(per_node).await;
            times
                .into_iter()
                .try_fold(Duration::ZERO, |acc, t| t.map(|t| acc.max(t)))
        };
        tokio::join!(first_write, all_nodes)
    }
}

//! `conch-bench --breakdown`: where one write's time goes.
//!
//! Every node times the stages of each write in `conch_write_stage_seconds{stage=...}` (see
//! the book, Performance, "Where a write's time goes"). A run scrapes every node before and after its measured
//! window; the difference is what the window's writes did. The stages are laid out as a tree
//! along the write's path, on the node where each happens: the client's node, the leader and
//! the followers. The stages directly under the client's call partition the server's time;
//! their sum is set beside the end-to-end latency the client measured per call.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::scrape::{Histogram, Scrape};

/// The stage histogram every node exports.
pub const STAGE_METRIC: &str = "conch_write_stage_seconds";
const FSYNC_METRIC: &str = "conch_log_fsync_duration_seconds";
const CALL_METRIC: &str = "conch_grpc_request_duration_seconds";
/// The call that writes nothing, timed to see what any call costs outside the server.
pub const EMPTY_CALL_METHOD: &str = "/conch.v1.ConchAdmin/ClusterStatus";

/// Which nodes a row is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum On {
    /// The node the client called.
    Client,
    Leader,
    /// Every node but the leader, together.
    Followers,
}

/// Where a row's numbers come from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// A stage of `conch_write_stage_seconds`.
    Stage(On, &'static str),
    /// Another histogram of the nodes.
    Metric(On, &'static str),
    /// Derived: the client's end-to-end latency less the server's `call` stage.
    Outside,
    /// Derived: one stage less another (p50 less p50, mean less mean). The AppendEntries hop
    /// is the first follower's round trip less the handling on every follower, so the slower
    /// follower's longer handling makes it a lower bound.
    Less((On, &'static str), (On, &'static str)),
}

/// One row of the tree: depth, label, source, and whether it is one of the stages that add up
/// to the server's time.
type Spec = (usize, &'static str, Source, bool);

/// The leader's part of a write, from its batch task to the answer (depth `d` for its top).
fn leader_rows(d: usize, summed: bool) -> Vec<Spec> {
    use On::*;
    use Source::*;
    vec![
        (d, "batch", Stage(Leader, "batch"), summed),
        (d, "raft (client_write)", Stage(Leader, "raft"), summed),
        (
            d + 1,
            "raft_to_append",
            Stage(Leader, "raft_to_append"),
            false,
        ),
        (
            d + 1,
            "leader_append",
            Stage(Leader, "leader_append"),
            false,
        ),
        (
            d + 2,
            "leader fdatasync",
            Metric(Leader, FSYNC_METRIC),
            false,
        ),
        (d + 1, "quorum", Stage(Leader, "quorum"), false),
        (
            d + 2,
            "replication_send (from client_write)",
            Stage(Leader, "replication_send"),
            false,
        ),
        (
            d + 2,
            "replication_rtt",
            Stage(Leader, "replication_rtt"),
            false,
        ),
        (
            d + 3,
            "AppendEntries hop, both ways (derived, at least)",
            Less((Leader, "replication_rtt"), (Followers, "follower_append")),
            false,
        ),
        (
            d + 3,
            "follower_append (AppendEntries handler)",
            Stage(Followers, "follower_append"),
            false,
        ),
        (
            d + 4,
            "follower fdatasync",
            Metric(Followers, FSYNC_METRIC),
            false,
        ),
        (
            d + 1,
            "commit_to_apply",
            Stage(Leader, "commit_to_apply"),
            false,
        ),
        (d + 1, "apply", Stage(Leader, "apply"), false),
        (
            d + 1,
            "apply_to_return",
            Stage(Leader, "apply_to_return"),
            false,
        ),
    ]
}

/// The tree of a write served by the leader itself.
fn on_leader() -> Vec<Spec> {
    use On::*;
    use Source::*;
    let mut rows = vec![
        (0, "outside the server (derived)", Outside, false),
        (0, "call (server)", Stage(Client, "call"), false),
        (1, "handler_in", Stage(Client, "handler_in"), true),
        (1, "queue", Stage(Client, "queue"), true),
    ];
    rows.extend(leader_rows(1, true));
    rows.extend([
        (1, "wake", Stage(Client, "wake"), true),
        (1, "handler_out", Stage(Client, "handler_out"), true),
    ]);
    rows
}

/// The tree of a write sent to a follower, which forwards it to the leader.
fn through_follower() -> Vec<Spec> {
    use On::*;
    use Source::*;
    let mut rows = vec![
        (0, "outside the server (derived)", Outside, false),
        (0, "call (server)", Stage(Client, "call"), false),
        (1, "handler_in", Stage(Client, "handler_in"), true),
        (1, "queue", Stage(Client, "queue"), true),
        (1, "to_forwarder", Stage(Client, "to_forwarder"), true),
        (1, "forward", Stage(Client, "forward"), true),
        (
            2,
            "forward_rpc (ConchPeer.ProposeStream)",
            Stage(Client, "forward_rpc"),
            false,
        ),
        (
            3,
            "forward hop, both ways (derived)",
            Less((Client, "forward_rpc"), (Leader, "peer_call")),
            false,
        ),
        (
            3,
            "peer_call (on the leader)",
            Stage(Leader, "peer_call"),
            false,
        ),
        (
            4,
            "peer_handler_in",
            Stage(Leader, "peer_handler_in"),
            false,
        ),
        (4, "queue", Stage(Leader, "queue"), false),
    ];
    rows.extend(leader_rows(4, false));
    rows.extend([
        (4, "wake", Stage(Leader, "wake"), false),
        (
            4,
            "peer_handler_out",
            Stage(Leader, "peer_handler_out"),
            false,
        ),
        (1, "wake", Stage(Client, "wake"), true),
        (1, "handler_out", Stage(Client, "handler_out"), true),
    ]);
    rows
}

/// One row of the printed breakdown (times in microseconds).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Line {
    pub depth: usize,
    pub stage: String,
    /// `client`, `leader`, `followers` or `derived`, with the node ids.
    pub on: String,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub mean_us: Option<f64>,
    /// Writes (or calls, appends) observed; 0 for a derived row.
    pub count: f64,
    /// One of the stages that add up to the server's time.
    pub summed: bool,
}

/// A run's breakdown.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Breakdown {
    /// `leader` (the client called the leader) or `follower` (it called a follower).
    pub path: String,
    pub lines: Vec<Line>,
    /// The client's per-call latency over the window.
    pub end_to_end: Summary,
    /// The summed stages: sum of their p50s, sum of their means.
    pub stages_p50_us: f64,
    pub stages_mean_us: f64,
    /// Calls that write nothing to the same node: paced during the window, and one after
    /// another after it.
    #[serde(default)]
    pub empty_calls: Vec<EmptyCall>,
}

/// What a call that writes nothing costs: at the client, and in the server's gRPC layer.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EmptyCall {
    /// When they ran (`during the window, one every 20 ms`, ...).
    pub when: String,
    pub method: String,
    pub client: Summary,
    /// Mean time in the server's gRPC layer (`conch_grpc_request_duration_seconds`).
    pub server_mean_us: Option<f64>,
    /// `client.mean_us - server_mean_us`: what the call costs outside the server.
    pub outside_mean_us: Option<f64>,
}

/// The empty calls' costs from their client-side latencies and the node's scrapes around them.
pub fn empty_call(
    when: &str,
    latencies: &[Duration],
    before: &Scrape,
    after: &Scrape,
) -> EmptyCall {
    let labels = [("method", EMPTY_CALL_METHOD)];
    let server = after.histogram(CALL_METRIC, &labels).map(|a| {
        match before.histogram(CALL_METRIC, &labels) {
            Some(b) => a.since(&b),
            None => a,
        }
    });
    let client = end_to_end(latencies);
    let server_mean_us = server.and_then(|h| h.mean()).map(us);
    let outside_mean_us = match (client.mean_us, server_mean_us) {
        (Some(c), Some(s)) => Some(us((c - s) / 1e6)),
        _ => None,
    };
    EmptyCall {
        when: when.into(),
        method: EMPTY_CALL_METHOD.into(),
        client,
        server_mean_us,
        outside_mean_us,
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub mean_us: Option<f64>,
    pub count: f64,
}

/// Every node's scrapes around the measured window, by node id.
pub struct Window<'a> {
    pub before: &'a BTreeMap<u64, Scrape>,
    pub after: &'a BTreeMap<u64, Scrape>,
    pub leader: u64,
    pub client: u64,
}

impl Window<'_> {
    fn nodes(&self, on: On) -> Vec<u64> {
        match on {
            On::Client => vec![self.client],
            On::Leader => vec![self.leader],
            On::Followers => self
                .after
                .keys()
                .copied()
                .filter(|id| *id != self.leader)
                .collect(),
        }
    }

    /// What `metric` (with `labels`) observed in the window on the nodes of `on`, together.
    fn observed(&self, on: On, metric: &str, labels: &[(&str, &str)]) -> Option<Histogram> {
        let mut total: Option<Histogram> = None;
        for id in self.nodes(on) {
            let Some(after) = self
                .after
                .get(&id)
                .and_then(|s| s.histogram(metric, labels))
            else {
                continue;
            };
            let new = match self
                .before
                .get(&id)
                .and_then(|s| s.histogram(metric, labels))
            {
                Some(before) => after.since(&before),
                None => after,
            };
            total = Some(match total {
                Some(t) => t.plus(&new),
                None => new,
            });
        }
        total
    }

    fn label(&self, on: On) -> String {
        let ids: Vec<String> = self.nodes(on).iter().map(u64::to_string).collect();
        let name = match on {
            On::Client => "client's node",
            On::Leader => "leader",
            On::Followers => "followers",
        };
        format!("{name} {}", ids.join(","))
    }
}

fn us(seconds: f64) -> f64 {
    (seconds * 1e7).round() / 10.0
}

fn summary(h: &Histogram) -> Summary {
    Summary {
        p50_us: h.quantile(0.5).map(us),
        p99_us: h.quantile(0.99).map(us),
        mean_us: h.mean().map(us),
        count: h.count,
    }
}

/// The client's per-call latencies, summarised exactly (nearest rank).
pub fn end_to_end(latencies: &[Duration]) -> Summary {
    let mut ns: Vec<u128> = latencies.iter().map(Duration::as_nanos).collect();
    ns.sort_unstable();
    let pct = |p: f64| -> Option<f64> {
        let n = ns.len();
        if n == 0 {
            return None;
        }
        let rank = ((p / 100.0) * n as f64).ceil().max(1.0) as usize;
        ns.get(rank.min(n) - 1).map(|v| us(*v as f64 / 1e9))
    };
    let mean = (!ns.is_empty()).then(|| us(ns.iter().sum::<u128>() as f64 / ns.len() as f64 / 1e9));
    Summary {
        p50_us: pct(50.0),
        p99_us: pct(99.0),
        mean_us: mean,
        count: ns.len() as f64,
    }
}

/// The breakdown of the window's writes, against the client's end-to-end latencies.
pub fn breakdown(window: &Window, end_to_end: Summary) -> Breakdown {
    let (path, specs) = if window.client == window.leader {
        ("leader", on_leader())
    } else {
        ("follower", through_follower())
    };
    let stage = |on: On, name: &str| window.observed(on, STAGE_METRIC, &[("stage", name)]);
    let mut lines = Vec::new();
    for (depth, label, source, summed) in specs {
        let line = match source {
            Source::Stage(on, name) | Source::Metric(on, name) => {
                let h = match source {
                    Source::Stage(..) => stage(on, name),
                    _ => window.observed(on, name, &[]),
                };
                let s = h.as_ref().map(summary).unwrap_or_default();
                Line {
                    depth,
                    stage: label.to_string(),
                    on: window.label(on),
                    p50_us: s.p50_us,
                    p99_us: s.p99_us,
                    mean_us: s.mean_us,
                    count: s.count,
                    summed,
                }
            }
            Source::Outside | Source::Less(..) => {
                let (whole, part) = match source {
                    Source::Less((on_whole, whole), (on_part, part)) => (
                        stage(on_whole, whole).map(|h| summary(&h)),
                        stage(on_part, part).map(|h| summary(&h)),
                    ),
                    _ => (
                        Some(end_to_end.clone()),
                        stage(On::Client, "call").map(|h| summary(&h)),
                    ),
                };
                let less = |a: Option<f64>, b: Option<f64>| Some(us((a? - b?) / 1e6));
                let (whole, part) = (whole.unwrap_or_default(), part.unwrap_or_default());
                Line {
                    depth,
                    stage: label.to_string(),
                    on: "derived".into(),
                    p50_us: less(whole.p50_us, part.p50_us),
                    p99_us: None,
                    mean_us: less(whole.mean_us, part.mean_us),
                    count: 0.0,
                    summed,
                }
            }
        };
        lines.push(line);
    }
    let sum = |f: fn(&Line) -> Option<f64>| {
        us(lines.iter().filter(|l| l.summed).filter_map(f).sum::<f64>() / 1e6)
    };
    let stages_p50_us = sum(|l| l.p50_us);
    let stages_mean_us = sum(|l| l.mean_us);
    Breakdown {
        path: path.into(),
        lines,
        end_to_end,
        stages_p50_us,
        stages_mean_us,
        empty_calls: Vec::new(),
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn ratio(part: f64, whole: Option<f64>) -> String {
    match whole {
        Some(w) if w > 0.0 => format!("{:.0} %", part / w * 100.0),
        _ => "-".into(),
    }
}

impl Breakdown {
    /// The breakdown as an aligned text table with the sums below it.
    pub fn render(&self) -> String {
        let mut rows = vec![[
            "stage".to_string(),
            "on".into(),
            "p50 µs".into(),
            "p99 µs".into(),
            "mean µs".into(),
            "count".into(),
        ]];
        for l in &self.lines {
            let mark = if l.summed { "+ " } else { "  " };
            rows.push([
                format!("{}{mark}{}", "  ".repeat(l.depth), l.stage),
                l.on.clone(),
                cell(l.p50_us),
                cell(l.p99_us),
                cell(l.mean_us),
                format!("{:.0}", l.count),
            ]);
        }
        let e = &self.end_to_end;
        rows.push([
            "end to end (client, per call)".into(),
            "client".into(),
            cell(e.p50_us),
            cell(e.p99_us),
            cell(e.mean_us),
            format!("{:.0}", e.count),
        ]);
        let mut widths = [0usize; 6];
        for row in &rows {
            for (w, c) in widths.iter_mut().zip(row.iter()) {
                *w = (*w).max(c.chars().count());
            }
        }
        let mut out = format!(
            "Where a write's time goes (through the {}; + marks the stages that add up to the \
             server's time):\n",
            if self.path == "leader" {
                "leader"
            } else {
                "client's follower, forwarded to the leader"
            }
        );
        for row in &rows {
            let mut line = String::new();
            for (i, c) in row.iter().enumerate() {
                let pad = widths[i].saturating_sub(c.chars().count());
                if i < 2 {
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad + 2));
                } else {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push_str(&format!(
            "sum of the + stages: p50 {:.1} µs ({} of end to end), mean {:.1} µs ({} of end \
             to end)\n",
            self.stages_p50_us,
            ratio(self.stages_p50_us, e.p50_us),
            self.stages_mean_us,
            ratio(self.stages_mean_us, e.mean_us),
        ));
        if let Some(mean) = e.mean_us {
            out.push_str(&format!(
                "not in the stages (mean): {:.1} µs, the time outside the server's gRPC layer \
                 (client's gRPC stack, loopback TCP, the server's HTTP/2 before and after the \
                 call) and between stamps\n",
                mean - self.stages_mean_us
            ));
        }
        for empty in &self.empty_calls {
            out.push_str(&format!(
                "a call that writes nothing ({}, {:.0} calls to the same node {}): p50 {} µs, \
                 mean {} µs at the client, mean {} µs in the server's gRPC layer, so {} µs \
                 outside the server\n",
                empty.method,
                empty.client.count,
                empty.when,
                cell(empty.client.p50_us),
                cell(empty.client.mean_us),
                cell(empty.server_mean_us),
                cell(empty.outside_mean_us),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::parse;

    /// A scrape with stage `name` observed `n` times at `value_s` seconds each (all in the
    /// bucket whose upper bound is `value_s`).
    fn stages(observed: &[(&str, f64, f64)]) -> Scrape {
        let mut text = String::new();
        for (name, value_s, n) in observed {
            text.push_str(&format!(
                "{STAGE_METRIC}_bucket{{stage=\"{name}\",le=\"{}\"}} 0\n",
                value_s * 0.5
            ));
            text.push_str(&format!(
                "{STAGE_METRIC}_bucket{{stage=\"{name}\",le=\"{value_s}\"}} {n}\n"
            ));
            text.push_str(&format!(
                "{STAGE_METRIC}_bucket{{stage=\"{name}\",le=\"+Inf\"}} {n}\n"
            ));
            text.push_str(&format!(
                "{STAGE_METRIC}_sum{{stage=\"{name}\"}} {}\n",
                value_s * n
            ));
            text.push_str(&format!("{STAGE_METRIC}_count{{stage=\"{name}\"}} {n}\n"));
        }
        parse(&text).unwrap_or_default()
    }

    fn line<'a>(b: &'a Breakdown, stage: &str, on: &str) -> &'a Line {
        b.lines
            .iter()
            .find(|l| l.stage == stage && l.on.starts_with(on))
            .unwrap_or_else(|| panic!("no line {stage} on {on}: {:#?}", b.lines))
    }

    #[test]
    fn on_the_leader_the_summed_stages_are_the_servers_and_the_rest_is_outside() {
        let before: BTreeMap<u64, Scrape> = [(1, stages(&[("queue", 0.00002, 5.0)]))]
            .into_iter()
            .collect();
        let leader = stages(&[
            ("call", 0.001, 10.0),
            ("handler_in", 0.00005, 10.0),
            ("queue", 0.00002, 15.0),
            ("batch", 0.00001, 10.0),
            ("raft", 0.0008, 10.0),
            ("wake", 0.00001, 10.0),
            ("handler_out", 0.00001, 10.0),
        ]);
        let follower = stages(&[("follower_append", 0.0003, 10.0)]);
        let after: BTreeMap<u64, Scrape> = [(1, leader), (2, follower)].into_iter().collect();
        let window = Window {
            before: &before,
            after: &after,
            leader: 1,
            client: 1,
        };
        let e2e = end_to_end(&[Duration::from_micros(1200); 10]);
        let b = breakdown(&window, e2e);
        assert_eq!(b.path, "leader");
        assert_eq!(line(&b, "queue", "client").count, 10.0, "only the window's");
        assert_eq!(line(&b, "queue", "client").mean_us, Some(20.0));
        assert_eq!(b.stages_mean_us, 900.0, "50 + 20 + 10 + 800 + 10 + 10");
        assert_eq!(
            line(&b, "outside the server (derived)", "derived").mean_us,
            Some(200.0)
        );
        let follower = line(&b, "follower_append (AppendEntries handler)", "followers 2");
        assert_eq!(follower.mean_us, Some(300.0));
        assert!(!follower.summed);
        let text = b.render();
        assert!(
            text.contains("mean 900.0 µs (75 % of end to end)"),
            "{text}"
        );
    }

    #[test]
    fn through_a_follower_the_hop_is_the_forward_call_less_the_leaders_time() {
        let before = BTreeMap::new();
        let client = stages(&[
            ("forward", 0.0011, 4.0),
            ("forward_rpc", 0.001, 4.0),
            ("handler_in", 0.00005, 4.0),
        ]);
        let leader = stages(&[("peer_call", 0.0008, 4.0), ("queue", 0.00003, 4.0)]);
        let after: BTreeMap<u64, Scrape> = [(1, leader), (3, client)].into_iter().collect();
        let window = Window {
            before: &before,
            after: &after,
            leader: 1,
            client: 3,
        };
        let b = breakdown(&window, end_to_end(&[Duration::from_micros(1500)]));
        assert_eq!(b.path, "follower");
        let hop = line(&b, "forward hop, both ways (derived)", "derived");
        assert_eq!(hop.mean_us, Some(200.0));
        assert_eq!(line(&b, "queue", "leader 1").mean_us, Some(30.0));
        assert!(!line(&b, "queue", "leader 1").summed);
        assert!(line(&b, "forward", "client's node 3").summed);
        assert_eq!(
            b.stages_mean_us, 1150.0,
            "forward + handler_in; the rest unobserved"
        );
        let json = serde_json::to_value(&b).unwrap_or_default();
        let back: Breakdown = serde_json::from_value(json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, b);
    }

    #[test]
    fn an_empty_call_is_its_client_time_less_the_servers() -> anyhow::Result<()> {
        let series = |n: f64, sum: f64| {
            let m = format!("{CALL_METRIC}{{method=\"{EMPTY_CALL_METHOD}\"}}");
            let b = format!("{CALL_METRIC}_bucket{{method=\"{EMPTY_CALL_METHOD}\",le=\"+Inf\"}}");
            parse(&format!(
                "{b} {n}\n{} {sum}\n{} {n}\n",
                m.replacen('{', "_sum{", 1),
                m.replacen('{', "_count{", 1)
            ))
        };
        let before = series(3.0, 0.001)?;
        let after = series(13.0, 0.002)?;
        let calls = vec![Duration::from_micros(300); 10];
        let e = empty_call("after", &calls, &before, &after);
        assert_eq!(e.server_mean_us, Some(100.0));
        assert_eq!(e.outside_mean_us, Some(200.0));
        assert_eq!(e.client.count, 10.0);
        Ok(())
    }

    #[test]
    fn end_to_end_uses_nearest_rank() {
        let calls: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        let s = end_to_end(&calls);
        assert_eq!(
            (s.p50_us, s.p99_us, s.mean_us),
            (Some(50.0), Some(99.0), Some(50.5))
        );
        assert_eq!(end_to_end(&[]).p50_us, None);
    }
}

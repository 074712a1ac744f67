//! Prometheus metrics: one registry per node (served as text on `/metrics` over HTTP/1.1 by
//! `http/metrics.rs`). A leaf: every layer records into it, it imports none of them.
//!
//! Three kinds of values:
//! - counters and histograms the node updates as things happen (gRPC calls, proposals, log
//!   appends, snapshots, grants, expirations), held in groups that the code paths own a clone
//!   of ([`LogMetrics`], [`ApplyMetrics`], [`SnapshotMetrics`]; a clone shares its values);
//! - gauges set at scrape time from Raft's metrics and the applied state ([`Metrics::render`]),
//!   so they are never stale and cost nothing between scrapes;
//! - the process's resident memory, open files and CPU time (the crate's process collector).
//!
//! Names follow Prometheus conventions: `conch_` prefix, base units in the name (`_seconds`,
//! `_bytes`), `_total` for counters. Labels never carry user data (names of namespaces,
//! semaphores or leases), so the series count stays fixed.

use std::sync::Arc;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry, TextEncoder,
};

use crate::base::write_trace::{StageHistograms, WriteTrace, stage_buckets};
use crate::state::{QuotaView, Stats};

/// Latency buckets from 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Waits in a queue: from a millisecond to an hour.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Commands per log entry (group commit).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Every metric of one node.
pub struct Metrics {
    registry: Registry,
    pub log: LogMetrics,
    pub apply: ApplyMetrics,
    pub snapshots: SnapshotMetrics,
    pub grpc: GrpcMetrics,
    /// Commands this node proposed as leader (its own callers' and forwarded ones).
    pub proposed_commands: IntCounter,
    /// Log entries this node proposed as leader.
    pub proposed_entries: IntCounter,
    pub commands_per_entry: Histogram,
    /// Calls this node forwarded to the leader, by kind (`write`, `read`).
    pub forwarded: IntCounterVec,
    pub leader_changes: IntCounter,
    /// Calls waiting on this node now (blocking acquires, holder watches).
    pub waiting_calls: IntGauge,
    /// Connections closed at once because a listener had as many as it takes.
    pub connections_refused: IntCounterVec,
    /// When the first certificate in use expires (seconds since the Unix epoch; 0 without TLS),
    /// set at scrape time.
    pub tls_expiry: IntGauge,
    /// The stages of a write (see `write_trace.rs`).
    pub stages: StageHistograms,
    /// The Raft side's stamps of each entry; the log store, network and state machine hold
    /// clones of this `Arc`.
    pub trace: Arc<WriteTrace>,
    gauges: Gauges,
}

/// The log store's timings.
#[derive(Clone)]
pub struct LogMetrics {
    /// One append: write the batch, flush, sync, record the new end.
    pub append_seconds: Histogram,
    /// The `fdatasync` part of an append.
    pub fsync_seconds: Histogram,
    pub appended_entries: IntCounter,
    /// Bytes of the log records written for those entries (headers of segments not counted).
    pub appended_bytes: IntCounter,
    /// Set when Raft records the commit index in the log store.
    pub committed_index: IntGauge,
    /// Where the log store stamps appends and commits of each entry.
    pub trace: Arc<WriteTrace>,
}

/// What applying committed entries did.
#[derive(Clone)]
pub struct ApplyMetrics {
    pub entries: IntCounter,
    pub commands: IntCounter,
    pub grants: IntCounter,
    pub lease_expirations: IntCounter,
    /// From entering a queue to the grant, by the leader's wall-clock stamps.
    pub wait_seconds: Histogram,
    /// Where applying stamps each entry.
    pub trace: Arc<WriteTrace>,
}

/// Snapshots this node built.
#[derive(Clone)]
pub struct SnapshotMetrics {
    pub built: IntCounter,
    pub seconds: Histogram,
    pub last_bytes: IntGauge,
}

/// gRPC calls served, by method and status code.
#[derive(Clone)]
pub struct GrpcMetrics {
    pub requests: IntCounterVec,
    pub seconds: HistogramVec,
}

/// Values read at scrape time.
struct Gauges {
    term: IntGauge,
    leader_id: IntGauge,
    is_leader: IntGauge,
    last_log_index: IntGauge,
    applied_index: IntGauge,
    apply_lag: IntGauge,
    members: IntGauge,
    namespaces: IntGauge,
    semaphores: IntGauge,
    leases: IntGauge,
    holders: IntGauge,
    waiters: IntGauge,
    state_bytes: IntGauge,
    state_budget_bytes: IntGauge,
    quota_use: GaugeVec,
    cluster_version: IntGauge,
}

/// Creates metrics and registers them in one registry.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn register<C: Collector + Clone + 'static>(&self, metric: C) -> C {
        // Names are fixed in this file and never repeat: a failure is a bug found by the tests.
        if let Err(e) = self.registry.register(Box::new(metric.clone())) {
            tracing::error!(error = %e, "metric not registered");
        }
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.register(IntCounter::new(name, help).unwrap_or_else(|_| invalid(name)))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.register(
            IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| invalid(name)),
        )
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.register(IntGauge::new(name, help).unwrap_or_else(|_| invalid(name)))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
        self.register(
            GaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|_| invalid(name)),
        )
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.register(
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .unwrap_or_else(|_| invalid(name)),
        )
    }

    fn histogram_vec(&self, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
        self.histogram_vec_with(name, help, labels, LATENCY_BUCKETS.to_vec())
    }

    fn histogram_vec_with(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
        buckets: Vec<f64>,
    ) -> HistogramVec {
        self.register(
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
                .unwrap_or_else(|_| invalid(name)),
        )
    }
}

/// The metric definitions are constants of this file; an invalid one cannot reach a user.
fn invalid(name: &str) -> ! {
    panic!("invalid metric definition {name}")
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::speaking(crate::state::version::NEWEST)
    }

    /// The metrics of a node that speaks cluster versions up to `cluster_version_max` (what
    /// `conch_build_info` says).
    pub fn speaking(cluster_version_max: u32) -> Metrics {
        let b = Builder {
            registry: Registry::new(),
        };
        let trace = Arc::new(WriteTrace::default());
        let log = LogMetrics {
            append_seconds: b.histogram(
                "conch_log_append_duration_seconds",
                "Time to make one batch of log entries durable (write, flush, fdatasync).",
                LATENCY_BUCKETS,
            ),
            fsync_seconds: b.histogram(
                "conch_log_fsync_duration_seconds",
                "Time of the fdatasync of one log append.",
                LATENCY_BUCKETS,
            ),
            appended_entries: b.counter(
                "conch_log_appended_entries_total",
                "Log entries made durable on this node.",
            ),
            appended_bytes: b.counter(
                "conch_log_appended_bytes_total",
                "Bytes of log records written to this node's segment files.",
            ),
            committed_index: b.gauge(
                "conch_raft_committed_index",
                "Last log index this node knows committed.",
            ),
            trace: Arc::clone(&trace),
        };
        let apply = ApplyMetrics {
            entries: b.counter(
                "conch_raft_entries_applied_total",
                "Committed log entries applied to the state machine on this node.",
            ),
            commands: b.counter(
                "conch_raft_commands_applied_total",
                "Commands applied to the state machine on this node.",
            ),
            grants: b.counter(
                "conch_grants_total",
                "Permits granted (immediately or from a queue), as applied on this node.",
            ),
            lease_expirations: b.counter(
                "conch_lease_expirations_total",
                "Leases that expired because nobody refreshed them, as applied on this node.",
            ),
            wait_seconds: b.histogram(
                "conch_wait_to_grant_seconds",
                "Time from entering a queue to the grant.",
                WAIT_BUCKETS,
            ),
            trace: Arc::clone(&trace),
        };
        let snapshots = SnapshotMetrics {
            built: b.counter("conch_snapshots_total", "Snapshots this node built."),
            seconds: b.histogram(
                "conch_snapshot_duration_seconds",
                "Time to build and store one snapshot.",
                LATENCY_BUCKETS,
            ),
            last_bytes: b.gauge(
                "conch_snapshot_size_bytes",
                "Size of the last snapshot this node built or installed.",
            ),
        };
        let grpc = GrpcMetrics {
            requests: b.counter_vec(
                "conch_grpc_requests_total",
                "gRPC calls answered, by method and status code.",
                &["method", "code"],
            ),
            seconds: b.histogram_vec(
                "conch_grpc_request_duration_seconds",
                "Time to answer a gRPC call (to the response headers), by method.",
                &["method"],
            ),
        };
        let gauges = Gauges {
            term: b.gauge("conch_raft_term", "Current Raft term."),
            leader_id: b.gauge(
                "conch_raft_leader_id",
                "Id of the leader this node knows, 0 if none.",
            ),
            is_leader: b.gauge("conch_raft_is_leader", "1 if this node is the leader."),
            last_log_index: b.gauge(
                "conch_raft_last_log_index",
                "Last index in this node's log.",
            ),
            applied_index: b.gauge(
                "conch_raft_applied_index",
                "Last log index applied to this node's state machine.",
            ),
            apply_lag: b.gauge(
                "conch_raft_apply_lag_entries",
                "Log entries this node holds but has not applied yet.",
            ),
            members: b.gauge("conch_raft_voters", "Voting members in the configuration."),
            namespaces: b.gauge("conch_namespaces", "Namespaces."),
            semaphores: b.gauge("conch_semaphores", "Semaphores."),
            leases: b.gauge("conch_leases", "Live leases."),
            holders: b.gauge(
                "conch_holders",
                "Holds (a lease holding permits of a semaphore).",
            ),
            waiters: b.gauge("conch_waiters", "Leases waiting in a queue."),
            state_bytes: b.gauge(
                "conch_state_bytes",
                "Stored bytes of every namespace together, by the quotas' size model.",
            ),
            state_budget_bytes: b.gauge(
                "conch_state_budget_bytes",
                "The budget on conch_state_bytes; growth past it is refused.",
            ),
            quota_use: b.gauge_vec(
                "conch_namespace_quota_use_ratio",
                "The highest use of a quota over all namespaces, as a fraction of the quota, by \
                 quota (semaphores, leases, entries, bytes); 1 means some namespace is full.",
                &["quota"],
            ),
            cluster_version: b.gauge(
                "conch_cluster_version",
                "The replicated cluster version, as this node applied it.",
            ),
        };
        // Constant for the process: the release and what it reads and speaks.
        b.gauge_vec(
            "conch_build_info",
            "Always 1, labelled with this node's release, the newest data format it writes and \
             the newest cluster version it speaks.",
            &["release", "data_format", "cluster_version_max"],
        )
        .with_label_values(&[
            crate::support::release::RELEASE,
            &crate::state::version::data_format(cluster_version_max).to_string(),
            &cluster_version_max.to_string(),
        ])
        .set(1.0);
        let proposed_commands = b.counter(
            "conch_raft_proposed_commands_total",
            "Commands this node proposed as leader.",
        );
        let proposed_entries = b.counter(
            "conch_raft_proposals_total",
            "Log entries this node proposed as leader (one per group commit).",
        );
        let commands_per_entry = b.histogram(
            "conch_raft_commands_per_entry",
            "Commands carried by one proposed log entry.",
            BATCH_BUCKETS,
        );
        let forwarded = b.counter_vec(
            "conch_forwarded_total",
            "Calls this node forwarded to the leader, by kind (write, read).",
            &["kind"],
        );
        let leader_changes = b.counter(
            "conch_raft_leader_changes_total",
            "Changes of leader this node has seen.",
        );
        let waiting_calls = b.gauge(
            "conch_waiting_calls",
            "Calls waiting on this node now: blocking acquires and holder watches.",
        );
        let connections_refused = b.counter_vec(
            "conch_connections_refused_total",
            "Connections refused or closed by a listener (client, peer, metrics, ui), by reason: \
             per_address (its address had --max-connections-per-address open), full (callers \
             that proved who they are held every slot), evicted (a stranger closed to make room \
             for a new connection), idle (no open call for its idle time), handshake (TLS \
             handshake refused or timed out).",
            &["listener", "reason"],
        );
        let tls_expiry = b.gauge(
            "conch_tls_cert_expiry_timestamp_seconds",
            "When the first certificate this node uses expires (its --tls-cert chain, the \
             --client-ca and --peer-ca certificates), in seconds since the Unix epoch; 0 without \
             TLS. Renew before then: an expired certificate is refused by clients and peers.",
        );
        let stages = StageHistograms::of(&b.histogram_vec_with(
            "conch_write_stage_seconds",
            "Time of one write in each stage of its path, by stage (see the book, Where a write's \
             time goes); stages on another node are in that node's metrics.",
            &["stage"],
            stage_buckets(),
        ));
        Metrics {
            registry: b.registry,
            log,
            apply,
            snapshots,
            grpc,
            proposed_commands,
            proposed_entries,
            commands_per_entry,
            forwarded,
            leader_changes,
            waiting_calls,
            connections_refused,
            tls_expiry,
            stages,
            trace,
            gauges,
        }
    }

    /// Adds the process's memory, open files and CPU time (once, for the node that serves
    /// them).
    pub(crate) fn register_process(&self) {
        let collector = prometheus::process_collector::ProcessCollector::for_self();
        if let Err(e) = self.registry.register(Box::new(collector)) {
            tracing::warn!(error = %e, "process metrics unavailable");
        }
    }

    /// Records one proposed entry of `commands` commands.
    pub fn proposed(&self, commands: usize) {
        self.proposed_entries.inc();
        self.proposed_commands.inc_by(commands as u64);
        self.commands_per_entry.observe(commands as f64);
    }

    /// The text exposition of every metric, the gauges set from `raft` and `stats` (read by
    /// the caller at scrape time).
    pub fn render(
        &self,
        raft: &RaftGauges,
        stats: &Stats,
        quotas: &QuotaGauges,
    ) -> Result<String, prometheus::Error> {
        self.set_gauges(raft, stats, quotas);
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }

    fn set_gauges(&self, raft: &RaftGauges, stats: &Stats, quotas: &QuotaGauges) {
        let g = &self.gauges;
        g.term.set(clamp(raft.term));
        g.leader_id.set(clamp(raft.leader.unwrap_or(0)));
        g.is_leader.set(i64::from(raft.is_leader));
        g.last_log_index.set(clamp(raft.last_log_index));
        g.applied_index.set(clamp(raft.applied_index));
        g.apply_lag.set(clamp(
            raft.last_log_index.saturating_sub(raft.applied_index),
        ));
        g.members.set(clamp(raft.members));
        g.cluster_version.set(i64::from(raft.cluster_version));
        g.namespaces.set(clamp(stats.namespaces));
        g.semaphores.set(clamp(stats.semaphores));
        g.leases.set(clamp(stats.leases));
        g.holders.set(clamp(stats.holders));
        g.waiters.set(clamp(stats.waiters));
        g.state_bytes.set(clamp(quotas.state_bytes));
        g.state_budget_bytes.set(clamp(quotas.budget_bytes));
        for (quota, high) in QUOTAS.iter().zip(quotas.highest_use) {
            g.quota_use.with_label_values(&[quota]).set(high);
        }
    }
}

/// The quotas `conch_namespace_quota_use_ratio` reports, in [`QuotaGauges::highest_use`] order.
const QUOTAS: [&str; 4] = ["semaphores", "leases", "entries", "bytes"];

/// The state's quota gauges, as the node reads them at scrape time.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuotaGauges {
    pub state_bytes: u64,
    pub budget_bytes: u64,
    /// Per quota (semaphores, leases, entries, bytes): the highest use over all namespaces, as
    /// a fraction of the quota (a quota of 0 with something in use counts as full).
    pub highest_use: [f64; 4],
}

impl QuotaGauges {
    pub fn new(budget_bytes: u64, state_bytes: u64, namespaces: &[QuotaView]) -> QuotaGauges {
        let ratio = |used: u64, quota: u64| match (used, quota) {
            (0, _) => 0.0,
            (_, 0) => 1.0,
            (used, quota) => used as f64 / quota as f64,
        };
        let mut highest_use = [0.0f64; 4];
        for q in namespaces {
            let uses = [
                ratio(q.semaphores, q.quotas.semaphores),
                ratio(q.leases, q.quotas.leases),
                ratio(q.entries, q.quotas.entries),
                ratio(q.bytes, q.quotas.bytes),
            ];
            for (high, used) in highest_use.iter_mut().zip(uses) {
                *high = high.max(used);
            }
        }
        QuotaGauges {
            state_bytes,
            budget_bytes,
            highest_use,
        }
    }
}

/// Raft's side of the gauges, as the node reads it at scrape time.
#[derive(Clone, Copy, Debug, Default)]
pub struct RaftGauges {
    pub term: u64,
    /// The leader as this node knows it (see `node::known_leader`).
    pub leader: Option<u64>,
    pub is_leader: bool,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// Voters in the membership.
    pub members: u64,
    /// The replicated cluster version this node applied (not Raft's, but read with it).
    pub cluster_version: u32,
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Default for ApplyMetrics {
    /// Counters registered nowhere, for a state machine nobody scrapes (tools, tests).
    fn default() -> Self {
        Metrics::new().apply
    }
}

impl Default for LogMetrics {
    fn default() -> Self {
        Metrics::new().log
    }
}

impl Default for SnapshotMetrics {
    fn default() -> Self {
        Metrics::new().snapshots
    }
}

/// Observes `duration` in seconds.
pub(crate) fn observe(histogram: &Histogram, duration: Duration) {
    histogram.observe(duration.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metrics with a sample in each labelled family, so that every family is exported.
    fn sampled() -> Metrics {
        let metrics = Metrics::new();
        metrics.proposed(3);
        metrics.forwarded.with_label_values(&["write"]).inc();
        metrics
            .grpc
            .requests
            .with_label_values(&["/x/Y", "OK"])
            .inc();
        metrics
            .grpc
            .seconds
            .with_label_values(&["/x/Y"])
            .observe(0.1);
        metrics
    }

    #[test]
    fn every_metric_is_registered_once_and_named_in_prometheus_style() {
        let metrics = sampled();
        let families = metrics.registry.gather();
        let names: Vec<&str> = families.iter().map(|f| f.name()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for name in &names {
            assert!(name.starts_with("conch_"), "{name}");
        }
        for needed in [
            "conch_raft_term",
            "conch_raft_is_leader",
            "conch_raft_apply_lag_entries",
            "conch_log_append_duration_seconds",
            "conch_raft_commands_per_entry",
            "conch_grpc_requests_total",
            "conch_waiters",
            "conch_write_stage_seconds",
        ] {
            assert!(names.contains(&needed), "{needed} missing from {names:?}");
        }
    }

    #[test]
    fn the_book_lists_every_metric() -> Result<(), prometheus::Error> {
        let readme = include_str!("../../../docs/src/operations.md");
        let metrics = sampled();
        let text = metrics.render(
            &RaftGauges::default(),
            &Stats::default(),
            &QuotaGauges::default(),
        )?;
        let mut missing = Vec::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = line.split_whitespace().nth(2).unwrap_or_default();
            if !readme.contains(&format!("`{name}`")) && !readme.contains(&format!("`{name}{{")) {
                missing.push(name.to_string());
            }
        }
        assert!(
            missing.is_empty(),
            "not in the metrics table of docs/src/operations.md: {missing:?}"
        );
        Ok(())
    }
}

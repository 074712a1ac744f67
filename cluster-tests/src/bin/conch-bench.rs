//! conch-bench: the benchmark and load generator of conch.
//!
//! Starts a 3-node release cluster on loopback for each workload (default conchd settings, so
//! every write is fsynced on a majority before it is acknowledged), or drives the nodes given
//! with `--endpoints`, and prints a table or, with `--json`, one JSON object per line per run.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cluster_tests::bench;
use cluster_tests::bench::stats::{Row, print_table};
use cluster_tests::bench::{Opts, Placement, Target};

/// The workloads run without `--only`.
const WORKLOADS: [&str; 6] = ["W1", "W1b", "W2", "W3", "W4", "W5"];
/// Workloads run only when `--only` names them: the locks (BENCHMARKS.md, "Locks").
const LOCK_WORKLOADS: [&str; 3] = ["L1", "L2", "L3"];
/// Workloads run only when `--only` names them: wait groups and barriers (BENCHMARKS.md, "Wait
/// groups and barriers").
const SYNC_WORKLOADS: [&str; 3] = ["S1", "S2", "S3"];
/// Workloads run only when `--only` names them: the CLI (BENCHMARKS.md, "Elections").
const CLI_WORKLOADS: [&str; 1] = ["E1"];
/// Workloads run only when `--only` names them: a loss pushed to `conch sema` (BENCHMARKS.md,
/// "Losses pushed to the holder").
const LOSS_WORKLOADS: [&str; 1] = ["P1"];
/// Workloads run only when `--only` names them: many live sessions on one cluster (BENCHMARKS.md,
/// "Ten thousand live sessions").
const SCALE_WORKLOADS: [&str; 1] = ["W6"];

/// Benchmark a conch cluster: W1 uncontended cycles, W1b cycles with lease create/revoke, W2
/// contended handoff, W3 leader failover, W4 lease refresh, W5 scale (memory, snapshot,
/// restart); with `--only`, also L1 uncontended lock cycles, L2 contended lock hand-off, L3
/// readers and a writer on one lock, S1 a 64-party barrier's release, S2 1 000 wait-group
/// waiters woken, S3 a wait group of 100 000 jobs (memory, snapshot), E1 the gap when a
/// `conch elect` leader is stopped and hands over, P1 a revoked lease to its `conch sema`
/// command stopped, W6 ten thousand live sessions (own connection, lease, slot or wait each).
#[derive(Parser, Debug)]
#[command(name = "conch-bench", after_help = EXAMPLES)]
struct Cli {
    /// Run only these workloads (comma-separated: W1,W1b,W2,W3,W4,W5,W6,L1,L2,L3,S1,S2,S3,E1,
    /// P1; the lock workloads L1-L3, the wait group and barrier workloads S1-S3, the CLI
    /// workloads E1 and P1 and the sessions workload W6 run only when named). With --baseline etcd: which of W1,W1b,W2,W3,L1,
    /// L2,L3 to compare (default W1,W1b,W2,W3).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,

    /// Drive these nodes (host:port, comma-separated) instead of starting a cluster. W3, W5, W6,
    /// S1-S3 and P1 need processes of their own and are skipped.
    #[arg(long, value_delimiter = ',')]
    endpoints: Option<Vec<String>>,

    /// Print one JSON object per line per workload run instead of a table.
    #[arg(long)]
    json: bool,

    /// Measured seconds per run (after the warm-up); default 5, for W6 300, for each step of
    /// --w6-knee 60.
    #[arg(long)]
    duration_s: Option<u64>,

    /// Warm-up seconds per run, not measured.
    #[arg(long, default_value_t = 1)]
    warmup_s: u64,

    /// Live leases refreshed every second in W4.
    #[arg(long, default_value_t = 10_000)]
    w4_leases: usize,

    /// Leases in W5.
    #[arg(long, default_value_t = 100_000)]
    w5_leases: usize,

    /// Semaphores (each with one holder) in W5.
    #[arg(long, default_value_t = 10_000)]
    w5_semaphores: usize,

    /// Waiters (open blocking acquires, one per semaphore) in W5.
    #[arg(long, default_value_t = 10_000)]
    w5_waiters: usize,

    /// Sessions in W6: each its own connection, lease and slot or parked acquire (at most what
    /// the open-file limit allows, about one file per session).
    #[arg(long, default_value_t = 10_000)]
    w6_sessions: usize,

    /// Semaphores the W6 sessions share (session i uses semaphore i mod this; default:
    /// sessions / 10).
    #[arg(long)]
    w6_semaphores: Option<usize>,

    /// Permits of each W6 semaphore: its first sessions hold one each, the others park a
    /// blocking acquire (default 9: of ten sessions per semaphore, nine hold and one waits).
    #[arg(long, default_value_t = 9)]
    w6_permits: u64,

    /// Lease TTL of the W6 sessions, in seconds; each refreshes every third of it.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    w6_ttl_s: u64,

    /// Mean seconds a W6 holder holds (exponential) before it releases and queues again.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    w6_hold_mean_s: u64,

    /// Loopback source addresses the W6 connections come from (127.0.0.2 up; default: enough
    /// for at most 500 per address and node, half of conchd's default
    /// --max-connections-per-address).
    #[arg(long)]
    w6_source_addresses: Option<usize>,

    /// W6 searches the knee instead: runs of increasing session counts (each on a fresh
    /// cluster, 60 s measured unless --duration-s) until refresh p99 passes 50 ms, up to what
    /// the open-file limit allows.
    #[arg(long)]
    w6_knee: bool,

    /// The session counts of --w6-knee (comma-separated; default 2000,5000,10000,15000, then
    /// every 5000 up to the open-file limit).
    #[arg(long, value_delimiter = ',', requires = "w6_knee")]
    w6_knee_steps: Option<Vec<usize>>,

    /// Start the cluster with TLS, client certificates and peer mutual TLS (certificates made
    /// for the run). Not with --endpoints.
    #[arg(long, conflicts_with = "endpoints")]
    tls: bool,
    /// Run with access control on: the cluster starts with an admin token that every client
    /// sends (with --endpoints: the token in CONCH_TOKEN).
    #[arg(long)]
    auth: bool,

    /// Where the clients of W1, W1b, W2 and L1-L3 connect: `leader` (following the leader hint) or
    /// `spread` (clients dealt over all nodes starting at the node after the leader, so one
    /// client is on a follower; never following a hint, as a plain Grackle client does).
    #[arg(long, default_value = "leader", value_parser = ["leader", "spread"])]
    placement: String,

    /// Client counts of W1 and W1b, one row each (comma-separated, 1-4096; default 1,8,64 for
    /// W1 and 64 for W1b).
    #[arg(long, value_delimiter = ',', conflicts_with = "baseline")]
    clients: Option<Vec<usize>>,

    /// Compare with etcd in the same run: W1, W1b and W2 on a 3-node etcd (Debian's
    /// etcd-server, see scripts/install-bench-deps.sh) and on conch, each row in both client
    /// placements (on the leader, spread over all nodes), then W3; the ratio per row and the
    /// disk's sync rate. With `--only L1,L2,L3`: the lock workloads against etcd's
    /// `concurrency.Mutex` and `recipes.RWMutex`.
    #[arg(long, value_parser = ["etcd"], conflicts_with = "endpoints")]
    baseline: Option<String>,

    /// With `--only W1` or `--only W1b` (best with `--clients 1`): also show where a write's
    /// time goes, stage by stage on every node (the nodes' conch_write_stage_seconds, scraped
    /// around the measured window; W1b's four writes a cycle are timed together), with the
    /// stages' sum beside the latency the client measured per call.
    /// `--placement leader` times writes on the leader; `--placement spread` puts the one
    /// client on a follower, which forwards each write to the leader. Needs the cluster
    /// conch-bench starts (not with --endpoints).
    #[arg(long, conflicts_with_all = ["endpoints", "baseline"])]
    breakdown: bool,
}

/// The most clients one W1 row may run (each holds a connection and a lease).
const MAX_CLIENTS: usize = 4096;

const EXAMPLES: &str = "\
Examples:
  make bench                                   # build release binaries and run everything
  target/release/conch-bench --only W2 --json  # one workload, JSON lines
  target/release/conch-bench --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 --only W1
  target/release/conch-bench --only W1 --placement spread    # clients on every node
  target/release/conch-bench --only W1,W1b --clients 1      # one row each, one client
  make bench-etcd                              # conch / etcd ratios, measured in one run
  target/release/conch-bench --only L1,L2,L3   # the lock workloads on conch
  target/release/conch-bench --baseline etcd --only L1,L2,L3 --duration-s 15   # locks vs etcd
  target/release/conch-bench --only S1,S2,S3   # barrier release, wait-group wake-up and size
  target/release/conch-bench --only E1         # conch elect: the hand-over gap on SIGTERM
  target/release/conch-bench --only P1         # revoke -> conch sema's command stopped
  target/release/conch-bench --only W6         # 10 000 live sessions for 5 minutes
  target/release/conch-bench --only W6 --w6-sessions 2000 --duration-s 60   # a smaller run
  target/release/conch-bench --only W6 --w6-knee   # session count where refresh p99 passes 50 ms
  target/release/conch-bench --only W1 --clients 1 --breakdown   # where a write's time goes
  target/release/conch-bench --only W1 --clients 1 --breakdown --placement spread  # via a follower
  target/release/conch-bench --only W1b --clients 1 --breakdown  # W1b's four writes a cycle

conchd is found next to this binary (target/release/conchd) or through CONCHD_BIN; `make bench`
and `make bench-etcd` set it to the shipped build (target/dist/conchd, the dist profile).";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let (known, default): (Vec<&str>, Vec<&str>) = if cli.baseline.is_some() {
        (
            bench::compare::WORKLOADS.to_vec(),
            bench::compare::DEFAULT_WORKLOADS.to_vec(),
        )
    } else {
        (
            WORKLOADS
                .iter()
                .chain(&LOCK_WORKLOADS)
                .chain(&SYNC_WORKLOADS)
                .chain(&CLI_WORKLOADS)
                .chain(&LOSS_WORKLOADS)
                .chain(&SCALE_WORKLOADS)
                .copied()
                .collect(),
            WORKLOADS.to_vec(),
        )
    };
    let selected: Vec<&str> = if cli.only.is_empty() {
        default
    } else {
        let mut out = Vec::new();
        for w in &cli.only {
            match known.iter().find(|k| k.eq_ignore_ascii_case(w.trim())) {
                Some(k) => out.push(*k),
                None => {
                    eprintln!(
                        "conch-bench: unknown workload {w:?} (known{}: {})",
                        if cli.baseline.is_some() {
                            " with --baseline"
                        } else {
                            ""
                        },
                        known.join(", ")
                    );
                    return ExitCode::from(64);
                }
            }
        }
        out
    };
    if let Some(bad) = cli
        .clients
        .iter()
        .flatten()
        .find(|&&n| n == 0 || n > MAX_CLIENTS)
    {
        eprintln!("conch-bench: --clients {bad}: each client count must be 1-{MAX_CLIENTS}");
        return ExitCode::from(64);
    }
    if cli.breakdown && selected != ["W1"] && selected != ["W1b"] {
        eprintln!(
            "conch-bench: --breakdown times W1's or W1b's writes: run it with --only W1 or --only W1b (got {})",
            selected.join(",")
        );
        return ExitCode::from(64);
    }
    if cli.breakdown && cli.clients.as_deref() != Some(&[1]) {
        eprintln!(
            "conch-bench: warning: --breakdown without --clients 1: writes share batches, so \
             the stages overlap and their sum exceeds a write's latency"
        );
    }
    if cfg!(debug_assertions) {
        eprintln!(
            "conch-bench: warning: this is a debug build; numbers are meaningless (use --release)"
        );
    }
    let measured = |default: u64| Duration::from_secs(cli.duration_s.unwrap_or(default).max(1));
    let opts = Opts {
        duration: measured(5),
        warmup: Duration::from_secs(cli.warmup_s),
        w4_leases: cli.w4_leases.max(1),
        w5_leases: cli.w5_leases,
        w5_semaphores: cli.w5_semaphores,
        w5_waiters: cli.w5_waiters,
        tls: cli.tls,
        auth: cli.auth,
        w1_clients: cli.clients.clone().unwrap_or_else(|| vec![1, 8, 64]),
        w1b_clients: cli.clients.clone().unwrap_or_else(|| vec![64]),
        breakdown: cli.breakdown,
        w6: bench::w6::W6Opts {
            sessions: cli.w6_sessions,
            semaphores: cli.w6_semaphores,
            permits: cli.w6_permits,
            ttl: Duration::from_secs(cli.w6_ttl_s),
            hold_mean: Duration::from_secs(cli.w6_hold_mean_s),
            duration: measured(300),
            source_addresses: cli.w6_source_addresses,
            knee: cli.w6_knee,
            knee_steps: cli.w6_knee_steps.clone(),
            knee_window: measured(60),
        },
    };
    if cli.tls {
        eprintln!("conch-bench: clusters run with TLS, client certificates and peer mutual TLS");
    }
    if cli.baseline.is_some() {
        return match bench::compare::run(&opts, &selected).await {
            Ok(rows) => {
                for row in &rows {
                    if cli.json {
                        println!("{}", row.json());
                    }
                }
                if !cli.json {
                    print_table(&rows);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("conch-bench: comparison with etcd failed: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let placement = if cli.placement == "spread" {
        Placement::Spread
    } else {
        Placement::Leader
    };
    let mut rows = Vec::new();
    let mut failed = false;
    for workload in selected {
        if cli.endpoints.is_some()
            && matches!(workload, "W3" | "W5" | "W6" | "S1" | "S2" | "S3" | "P1")
        {
            eprintln!(
                "conch-bench: {workload} skipped: it starts, measures or kills the nodes' processes, which needs a cluster of its own"
            );
            continue;
        }
        eprintln!("conch-bench: running {workload}");
        let load = loadavg();
        match run(workload, &cli.endpoints, &opts, placement).await {
            Ok(new_rows) => {
                for mut row in new_rows {
                    row.opt("loadavg_1m", load);
                    if cli.json {
                        println!("{}", row.json());
                    }
                    rows.push(row);
                }
            }
            Err(e) => {
                failed = true;
                eprintln!("conch-bench: {workload} failed: {e:#}");
                let mut row = Row::new(workload, 0);
                row.set("error", format!("{e:#}"));
                if cli.json {
                    println!("{}", row.json());
                }
                rows.push(row);
            }
        }
    }
    if !cli.json {
        print_table(&rows);
        for row in &rows {
            let Some(value) = row.fields.get("breakdown") else {
                continue;
            };
            match serde_json::from_value::<bench::breakdown::Breakdown>(value.clone()) {
                Ok(b) => println!("\n{}", b.render()),
                Err(e) => eprintln!("conch-bench: breakdown unreadable: {e}"),
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The 1-minute load average when a workload starts: other work on the machine skews numbers.
fn loadavg() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Runs one workload on a fresh target; a run that fails ends the workload.
async fn run(
    workload: &str,
    endpoints: &Option<Vec<String>>,
    opts: &Opts,
    placement: Placement,
) -> anyhow::Result<Vec<Row>> {
    if workload == "W6" {
        // A fresh cluster per run (the knee search makes several).
        return bench::w6::main(endpoints, opts).await;
    }
    let mut target = Target::new(endpoints, &workload.to_lowercase(), opts.tls, opts.auth).await?;
    let mut rows = Vec::new();
    match workload {
        "W1" => {
            for &clients in &opts.w1_clients {
                rows.push(bench::w1::run(&target, opts, clients, false, placement).await?);
            }
        }
        "W1b" => {
            for &clients in &opts.w1b_clients {
                rows.push(bench::w1::run(&target, opts, clients, true, placement).await?);
            }
        }
        "W2" => {
            for hold_max_ms in [0, 20] {
                rows.push(bench::w2::run(&target, opts, hold_max_ms, placement).await?);
            }
        }
        "W3" => rows.push(bench::w1::failover(&mut target, opts).await?),
        "W4" => rows.push(bench::w4::run(&target, opts).await?),
        "W5" => rows.extend(bench::w5::run(&mut target, opts).await?),
        "L1" => {
            for clients in bench::locks::L1_CLIENTS {
                rows.push(bench::locks::l1(&target, opts, clients, placement).await?);
            }
        }
        "L2" => rows.push(bench::locks::l2(&target, opts, placement).await?),
        "L3" => rows.push(bench::locks::l3(&target, opts, placement).await?),
        "S1" => {
            use bench::sync::{S1_PARTIES, S1_ROUNDS};
            rows.push(bench::sync::s1(&target, S1_PARTIES, S1_ROUNDS).await?);
        }
        "S2" => {
            use bench::sync::{S2_ROUNDS, S2_WAITERS};
            rows.push(bench::sync::s2(&target, S2_WAITERS, S2_ROUNDS).await?);
        }
        "S3" => rows.push(bench::sync::s3(&mut target, bench::sync::S3_JOBS).await?),
        "E1" => rows.push(bench::elect::e1(&target, bench::elect::E1_ROUNDS).await?),
        "P1" => rows.push(bench::loss::p1(&target, opts, bench::loss::P1_ROUNDS).await?),
        other => anyhow::bail!("unknown workload {other}"),
    }
    Ok(rows)
}

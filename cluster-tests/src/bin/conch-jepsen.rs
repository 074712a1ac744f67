//! conch-jepsen: beat a real conchd cluster with faults while clients contend for semaphores
//! and for hierarchical locks, then check the safety rules on the history and the nodes' final
//! state.
//!
//! Prints the seed first; `CONCH_SEED=<seed>` (or `--seed`) replays the same fault schedule
//! and client choices. Ends with one line
//! `jepsen: ops=… ok=… fail=… unknown=… faults=… violations=N` and exits 1 when N > 0; the
//! line before it, `jepsen: locks: …`, gives the lock workload's share of those (its ops and
//! the violations of the lock checks).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cluster_tests::jepsen;
use cluster_tests::jepsen::run::{RunOptions, run};

/// Fault injection and a safety checker for conch (Jepsen-style).
#[derive(Parser, Debug)]
#[command(name = "conch-jepsen", after_help = EXAMPLES)]
struct Cli {
    /// Seconds of faults while the workload runs (the healed tail and checks add ~15-25 s).
    #[arg(long, default_value_t = 60)]
    duration: u64,

    /// Cluster size: 3 or 5.
    #[arg(long, default_value_t = 3)]
    nodes: u64,

    /// Seed of the fault schedule and the clients' choices (default: CONCH_SEED, else random).
    #[arg(long)]
    seed: Option<u64>,

    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,

    /// Concurrent lock clients beside the semaphore ones (0: no lock workload).
    #[arg(long, default_value_t = 8)]
    lock_clients: usize,

    /// Lease TTL of the clients, in seconds.
    #[arg(long, default_value_t = 4)]
    ttl: u64,

    /// Leave these faults or cut modes out of the menu (comma-separated), e.g.
    /// `pause-leader,stall`. Faults: kill, kill-leader, kill-all, pause-leader, pause-follower,
    /// isolate-leader, split, one-way-leader, slow, bridge, clock-step, one-way-out, one-way-in,
    /// disk-full; cut modes: refuse, blackhole, stall.
    #[arg(long, value_delimiter = ',')]
    exclude: Vec<String>,

    /// Keep the node logs and the history even when no violation is found.
    #[arg(long)]
    keep: bool,

    /// Print only the seed, the result and the summary line.
    #[arg(long, short)]
    quiet: bool,

    /// Run the nodes with TLS, client certificates and peer mutual TLS.
    #[arg(long)]
    tls: bool,
    /// Turn access control on first; every client then sends a cluster-admin token.
    #[arg(long)]
    auth: bool,
    /// Without a caller that forges peer messages throughout (on by default: the nodes then
    /// authenticate their peers with a secret, or with node certificates under --tls).
    #[arg(long)]
    no_adversary: bool,
    /// A rolling upgrade during the run: start the cluster on this conchd (a previous release,
    /// e.g. from `scripts/release-binaries.sh 0.1.0`), move one node to this build's conchd
    /// after each healed fault, and finalize the upgrade before the healed tail.
    #[arg(long, value_name = "CONCHD")]
    upgrade_from: Option<std::path::PathBuf>,
}

const EXAMPLES: &str = "\
Examples:
  make jepsen DURATION=300 NODES=5
  target/debug/conch-jepsen --duration 60 --nodes 3
  CONCH_SEED=1234 target/debug/conch-jepsen --duration 40   # replay a seed
  target/debug/conch-jepsen --upgrade-from target/releases/0.1.0/bin/conchd   # rolling upgrade

conchd is found next to this binary or through CONCHD_BIN. On a violation the node logs and the
history (history.txt) are kept and their directory printed.

Exit status: 0 no violation, 1 violations found, 2 the run could not complete (e.g. the
cluster did not start; no summary line then), 64 usage.";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let seed = match jepsen::seed_from(cli.seed) {
        Ok(seed) => seed,
        Err(e) => {
            eprintln!("conch-jepsen: {e}");
            return ExitCode::from(64);
        }
    };
    println!("jepsen: seed={seed} (replay with CONCH_SEED={seed})");
    if ![3, 5].contains(&cli.nodes) || !(2..=300).contains(&cli.ttl) || cli.clients == 0 {
        eprintln!("conch-jepsen: --nodes must be 3 or 5, --ttl 2-300 and --clients positive");
        return ExitCode::from(64);
    }
    let mut opts = RunOptions::new(cli.nodes, Duration::from_secs(cli.duration), seed);
    opts.clients = cli.clients;
    opts.lock_clients = cli.lock_clients;
    opts.ttl = Duration::from_secs(cli.ttl);
    opts.keep = cli.keep;
    let known: Vec<&str> = jepsen::nemesis::MENU
        .iter()
        .map(|(name, _)| *name)
        .chain(jepsen::nemesis::CUT_MODES)
        .collect();
    if let Some(bad) = cli.exclude.iter().find(|e| !known.contains(&e.as_str())) {
        eprintln!(
            "conch-jepsen: unknown fault or cut mode {bad:?}; known: {}",
            known.join(", ")
        );
        return ExitCode::from(64);
    }
    opts.exclude = cli.exclude;
    opts.progress = !cli.quiet;
    opts.tls = cli.tls;
    opts.auth = cli.auth;
    opts.adversary = !cli.no_adversary;
    opts.upgrade_from = cli.upgrade_from;
    let result = tokio::select! {
        result = run(opts) => result,
        _ = tokio::signal::ctrl_c() => {
            // Dropping the run stops every node and proxy and removes the directory.
            eprintln!("conch-jepsen: interrupted (seed {seed})");
            return ExitCode::from(130);
        }
    };
    match result {
        Ok(report) => {
            print!("{}", report.details());
            println!("{}", report.summary_line());
            if report.violations() > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            // No summary line: nothing was checked.
            eprintln!("conch-jepsen: the run could not complete (seed {seed}): {e:#}");
            ExitCode::from(2)
        }
    }
}

//! `conch-sim`: run seeds of the deterministic simulation (see the library docs) and report
//! the failing ones with the command that replays each.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use conch_sim::{SimOptions, run_seed};

/// Run conch nodes, their clients and the network between them in simulation: real node code,
/// simulated network, time and crashes, every choice drawn from one seed. A failing seed is
/// printed with the one command that replays it exactly.
#[derive(Parser, Debug)]
#[command(
    name = "conch-sim",
    after_help = "Examples:\n  conch-sim --seeds 200                 200 seeds from a random first one\n  conch-sim --seed 42 --trace           replay one seed, printing every event\n  conch-sim --seeds 50 --first-seed 1   seeds 1..=50 (what `make test` runs)\n  conch-sim --time-budget 10m           as many seeds as fit in 10 minutes"
)]
struct Args {
    /// Run this one seed and print its report.
    #[arg(long, conflicts_with_all = ["seeds", "time_budget"])]
    seed: Option<u64>,
    /// How many seeds to run (from --first-seed on).
    #[arg(long)]
    seeds: Option<u64>,
    /// Keep starting seeds until this much wall-clock time has passed (e.g. 2m, 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    time_budget: Option<Duration>,
    /// The first seed of a run of seeds (default: a random one, printed).
    #[arg(long)]
    first_seed: Option<u64>,
    /// Nodes in the cluster: 3 or 5.
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Simulated time the workload runs per seed (e.g. 30s).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Workload clients per seed.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Run without faults.
    #[arg(long)]
    no_faults: bool,
    /// Run without the lock clients.
    #[arg(long)]
    no_locks: bool,
    /// Run without the wait group and barrier rounds.
    #[arg(long)]
    no_sync: bool,
    /// Print the faults and the nodes' log lines with their simulated times (one seed).
    #[arg(long, requires = "seed")]
    trace: bool,
    /// Write the seed's history (every operation with its simulated times) to this file.
    #[arg(long, requires = "seed")]
    history: Option<std::path::PathBuf>,
    /// Put back a bug conch once had, to see the simulator find it: wall-clock-leases,
    /// misrouted-replies, phantom-hold or stale-read-after-restart.
    #[arg(long, value_parser = parse_bug)]
    bug: Option<conch_sim::Bug>,
    /// Which faults seeds draw from: 2, every kind (the default); 1, the first mix, without
    /// crash losses, power losses, slow disks and per-node clocks (seeds found with it replay
    /// only with it).
    #[arg(long, default_value_t = 2, value_parser = parse_mix)]
    fault_mix: u8,
    /// Keep only the full mix's faults of these kinds (comma-separated), to aim a search at
    /// them: isolate, one-way, misroute, crash, power-loss, power-loss-all, slow-disk,
    /// clock-step, clock-drift, replace, crash-all, disk, hold, pause, slow, wall-step.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    only_faults: Vec<conch_sim::Kind>,
    /// Version skew: one node starts speaking the previous release's cluster version only and
    /// is upgraded mid-run, then the cluster is finalized. on or off; by default the seed
    /// decides (one seed in four of the full mix), so a printed seed replays as it ran.
    #[arg(long, value_parser = parse_on_off)]
    skew: Option<bool>,
    /// Stop starting seeds once one has failed (to count the seeds a bug takes to find).
    #[arg(long)]
    until_failure: bool,
    /// Print the one-line summary a batch run reads from each seed's process (internal).
    #[arg(long, hide = true, requires = "seed")]
    child: bool,
    /// Seeds run at once (default: one per CPU); each in a process of its own.
    #[arg(long)]
    jobs: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !cfg!(tokio_unstable) {
        eprintln!(
            "conch-sim: built without --cfg tokio_unstable (RUSTFLAGS replaced .cargo/config.toml): \
             tokio's scheduler would not follow the seed, so a seed could not be replayed"
        );
        return ExitCode::from(64);
    }
    if !(args.nodes == 3 || args.nodes == 5) {
        eprintln!("conch-sim: --nodes must be 3 or 5, not {}", args.nodes);
        return ExitCode::from(64);
    }
    if !args.only_faults.is_empty() && args.fault_mix != conch_sim::Mix::Full.number() {
        eprintln!(
            "conch-sim: --only-faults keeps faults of the full mix (--fault-mix 2); the first mix \
             must draw as it always did"
        );
        return ExitCode::from(64);
    }
    let template = SimOptions {
        seed: 0,
        nodes: args.nodes,
        duration: args.duration,
        clients: args.clients,
        faults: !args.no_faults,
        locks: !args.no_locks,
        sync: !args.no_sync,
        trace: args.trace,
        bug: args.bug,
        mix: conch_sim::Mix::from_number(args.fault_mix).unwrap_or(conch_sim::Mix::Full),
        only: match args.only_faults.is_empty() {
            true => conch_sim::Kinds::ALL,
            false => conch_sim::Kinds::of(&args.only_faults),
        },
        skew: args.skew,
    };
    let options = move |seed| SimOptions {
        seed,
        ..template.clone()
    };
    if let Some(seed) = args.seed {
        if args.trace {
            trace_to_stdout();
        }
        return match run_seed(&options(seed)) {
            Ok(report) => {
                if let Some(path) = &args.history
                    && let Err(e) = std::fs::write(path, report.history.join("\n") + "\n")
                {
                    eprintln!("conch-sim: write {}: {e}", path.display());
                }
                for fault in &report.faults {
                    println!("fault {fault}");
                }
                for step in &report.upgrade {
                    println!("upgrade {step}");
                }
                for v in &report.violations {
                    println!("{v}");
                }
                let skewed = if report.upgrade.is_empty() {
                    ""
                } else {
                    ", version skew"
                };
                if args.child {
                    println!(
                        "{CHILD_SUMMARY} {} {} ops, {} grants, {} wait group/barrier rounds, {} \
                         faults{skewed}",
                        report.simulated.as_millis(),
                        report.ops,
                        report.grants,
                        report.sync_rounds,
                        report.faults.len()
                    );
                }
                println!(
                    "seed {seed}: {} ops, {} grants, {} wait group/barrier rounds, {} faults{skewed}, \
                     {:.1} s simulated, history {}: {}",
                    report.ops,
                    report.grants,
                    report.sync_rounds,
                    report.faults.len(),
                    report.simulated.as_secs_f64(),
                    &report.history_hash[..16],
                    if report.passed() { "ok" } else { "FAILED" }
                );
                if report.passed() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                println!("seed {seed}: the simulation itself failed: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if args.seeds.is_none() && args.time_budget.is_none() {
        eprintln!("conch-sim: give --seed S, --seeds N or --time-budget D (see --help)");
        return ExitCode::from(64);
    }
    let first = args.first_seed.unwrap_or_else(|| {
        let seed = conchd::sim_hooks::entropy::random_u64().unwrap_or(1) >> 1;
        println!("first seed {seed} (--first-seed {seed} runs the same seeds)");
        seed
    });
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let simulated_ms = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("conch-sim: cannot find its own program to run seeds in: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers: Vec<_> = (0..jobs.max(1))
        .map(|_| {
            let (next, ran, simulated_ms, failed) = (
                Arc::clone(&next),
                Arc::clone(&ran),
                Arc::clone(&simulated_ms),
                Arc::clone(&failed),
            );
            let limit = args.seeds;
            let budget = args.time_budget;
            let until_failure = args.until_failure;
            let options = options.clone();
            let exe = exe.clone();
            std::thread::spawn(move || {
                loop {
                    if budget.is_some_and(|b| started.elapsed() >= b) {
                        return;
                    }
                    if until_failure && !failed.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
                    {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if limit.is_some_and(|n| i >= n) {
                        return;
                    }
                    let opts = options(first.wrapping_add(i));
                    let seed = opts.seed;
                    let outcome = run_child(&exe, &opts);
                    ran.fetch_add(1, Ordering::SeqCst);
                    match outcome {
                        Child::Passed { summary, simulated } => {
                            simulated_ms.fetch_add(simulated.as_millis() as u64, Ordering::SeqCst);
                            println!("seed {seed}: ok ({summary})");
                        }
                        Child::Failed { said } => {
                            let mut text = format!("seed {seed}: FAILED\n");
                            for line in said {
                                text.push_str(&format!("  {line}\n"));
                            }
                            println!("{text}  replay: {}", opts.replay_command());
                            failed.lock().unwrap_or_else(|p| p.into_inner()).push(seed);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
    let wall = started.elapsed();
    let ran = ran.load(Ordering::SeqCst);
    let simulated = Duration::from_millis(simulated_ms.load(Ordering::SeqCst));
    let minutes = wall.as_secs_f64() / 60.0;
    let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!(
        "{ran} seeds in {:.1} s ({jobs} at once): {:.1} seeds/min, {:.2} simulated hours per \
         wall-clock minute; {} failed{}",
        wall.as_secs_f64(),
        ran as f64 / minutes.max(1e-9),
        simulated.as_secs_f64() / 3600.0 / minutes.max(1e-9),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(": {failed:?}")
        }
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn parse_bug(name: &str) -> Result<conch_sim::Bug, String> {
    conch_sim::Bug::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = conch_sim::Bug::ALL.iter().map(|b| b.name()).collect();
        format!("no bug named {name:?}; the bugs are {}", names.join(", "))
    })
}

fn parse_kind(name: &str) -> Result<conch_sim::Kind, String> {
    conch_sim::Kind::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = conch_sim::Kind::ALL.iter().map(|k| k.name()).collect();
        format!("no fault kind {name:?}; the kinds are {}", names.join(", "))
    })
}

fn parse_on_off(word: &str) -> Result<bool, String> {
    match word {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("--skew takes on or off, not {word:?}")),
    }
}

fn parse_mix(n: &str) -> Result<u8, String> {
    n.parse::<u8>()
        .ok()
        .filter(|n| conch_sim::Mix::from_number(*n).is_some())
        .ok_or_else(|| {
            format!("no fault mix {n:?}; the mixes are 1 (the first) and 2 (every kind)")
        })
}

/// The marker of the summary line a seed's process prints for its batch run.
const CHILD_SUMMARY: &str = "conch-sim-summary";

/// How a seed run in its own process ended.
enum Child {
    Passed {
        summary: String,
        simulated: Duration,
    },
    /// The violations it printed, or how the process ended (a panic, a signal).
    Failed { said: Vec<String> },
}

/// Runs one seed in a process of its own, so that a panic in a node (which may abort) fails
/// only that seed.
fn run_child(exe: &std::path::Path, opts: &SimOptions) -> Child {
    let output = match std::process::Command::new(exe)
        .args(opts.args())
        .arg("--child")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            return Child::Failed {
                said: vec![format!("could not start {}: {e}", exe.display())],
            };
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success()
        && let Some(line) = stdout.lines().find(|l| l.starts_with(CHILD_SUMMARY))
    {
        let mut words = line[CHILD_SUMMARY.len()..].trim().splitn(2, ' ');
        let simulated = words
            .next()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or_default();
        return Child::Passed {
            summary: words.next().unwrap_or_default().to_string(),
            simulated,
        };
    }
    let mut said: Vec<String> = stdout
        .lines()
        .filter(|l| l.starts_with("VIOLATION") || l.contains("the simulation itself failed"))
        .take(5)
        .map(str::to_string)
        .collect();
    let mut lines = stderr.lines();
    while let Some(line) = lines.next() {
        if line.contains("panicked at") {
            said.push(format!("{line} {}", lines.next().unwrap_or_default()));
            break;
        }
    }
    if said.is_empty() {
        said.push(format!("the seed's process ended with {}", output.status));
    }
    Child::Failed { said }
}

/// Node log lines on stdout, each with the simulated time of the host that wrote it.
fn trace_to_stdout() {
    struct SimTime;
    impl tracing_subscriber::fmt::time::FormatTime for SimTime {
        fn format_time(
            &self,
            w: &mut tracing_subscriber::fmt::format::Writer<'_>,
        ) -> std::fmt::Result {
            let t = turmoil::sim_elapsed().unwrap_or_default();
            write!(w, "{:>9.3}s", t.as_secs_f64())
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_timer(SimTime)
        .with_ansi(false)
        .try_init();
}

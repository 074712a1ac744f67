//! The command-line arguments of `conch wait-group` and `conch barrier` (clap derive; the doc
//! comments are the help text). Apart from what they run, so that `xtask` renders their manual
//! pages with the rest of `cli/`.

use std::time::Duration;

use clap::{Args, Subcommand};

use crate::duration::parse_duration;

pub(crate) const WAIT_GROUP_EXAMPLES: &str = "\
Examples:
  # tonight's batch: 40 shards, give up after 6 hours
  conch wait-group create nightly-2026-06-12 --jobs 40 --expires-in 6h

  # each shard's cron job reports itself done, only if it succeeded
  conch wait-group run nightly-2026-06-12 shard-17 -- ./etl.sh --shard 17

  # or report by hand
  conch wait-group done nightly-2026-06-12 shard-17

  # the report job waits for all 40, at most 2 hours
  conch wait-group wait nightly-2026-06-12 --timeout 2h && ./publish-report.sh

  conch wait-group status nightly-2026-06-12 --json

Job ids count once each: reporting the same id again changes nothing, so retries are safe,
also once the group completed (exit 0). A group counts at most 100000000 jobs and expires
more than a minute from now.

Exit status:
  0                 wait, status: the group completed; done, create: done
  1                 wait, status: the group expired before all jobs reported
  2                 status: the group is still active
  the command's     run: the command's own status (its job is reported only on 0)
  64                usage error, or the cluster refused (e.g. a new job for a finished group)
  65                no such wait group (create: it exists already)
  69                no conch node answered
  75                wait: --timeout passed first
  77                access control: no token or no permission on the namespace
  126 / 127         run: the command could not be executed / was not found";

pub(crate) const BARRIER_EXAMPLES: &str = "\
Examples:
  # four shards meet at the end of the map phase
  conch barrier create map-done --parties 4

  # on each shard: arrive, wait for all four, then run the reduce step
  conch barrier wait map-done --id \"$(hostname)\" --timeout 30m -- ./reduce.sh

  # who has arrived in the current round (the same as: conch barrier wait map-done --who)
  conch barrier status map-done

The barrier is reusable: each time the last party arrives it trips, every waiter of that
round is released together, and the next round (generation) starts empty. The command runs
with CONCH_BARRIER_GENERATION (the round it waited for) in its environment.

Exit status:
  0                 the barrier tripped (create, status, --who: done)
  the command's     the barrier tripped and the command ran: its own status
  64                usage error, or the cluster refused the request
  65                no such barrier (create: it exists already)
  69                no conch node answered
  75                --timeout passed before every party arrived
  77                access control: no token or no permission on the namespace
  126 / 127         the command could not be executed / was not found";

#[derive(Debug, Subcommand)]
pub(crate) enum WaitGroupCommand {
    /// Create a wait group of N jobs.
    Create {
        /// Wait group name: letters, digits, '-', '_' and '.'.
        name: String,
        /// How many distinct jobs complete it.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
        jobs: u64,
        /// It expires if not complete this long from now (more than 1m, as Grackle allows).
        #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = expires_in_arg)]
        expires_in: Duration,
        /// Kept this long after it completes or expires, then deleted (at least 60s).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = retention_arg)]
        keep: Duration,
        /// Free-form description.
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        ns: NamespaceArg,
    },
    /// Report a job done.
    Done {
        /// The wait group's name.
        name: String,
        /// The job's id, unique within the group: letters, digits, '-', '_' and '.'.
        job_id: String,
        /// Metadata KEY=VALUE on the job's record (repeatable).
        #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = meta_arg)]
        meta: Vec<(String, String)>,
        #[command(flatten)]
        ns: NamespaceArg,
    },
    /// Wait until the group completes (exit 0) or expires (exit 1).
    Wait {
        /// The wait group's name.
        name: String,
        /// Longest wait [default: forever]; exit 75 when it passes first.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        timeout: Option<Duration>,
        #[command(flatten)]
        ns: NamespaceArg,
    },
    /// Show the group: jobs done of the counter, status, expiry.
    Status {
        /// The wait group's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also list the completed jobs.
        #[arg(long)]
        jobs: bool,
        #[command(flatten)]
        ns: NamespaceArg,
    },
    /// Run a command and report JOB_ID done only if it exits 0.
    Run {
        /// The wait group's name.
        name: String,
        /// The job's id, unique within the group.
        job_id: String,
        /// The command to run, after `--`.
        #[arg(value_name = "CMD", last = true, required = true)]
        command: Vec<String>,
        #[command(flatten)]
        ns: NamespaceArg,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum BarrierCommand {
    /// Show the barrier: its round, who has arrived in it and who tripped the last one (the
    /// same as `wait NAME --who`).
    Status {
        /// The barrier's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ns: NamespaceArg,
    },
    /// Create a barrier for N parties.
    Create {
        /// Barrier name: letters, digits, '-', '_' and '.'.
        name: String,
        /// How many parties trip it.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=i64::MAX as u64))]
        parties: u64,
        /// Deleted after this long without an arrival (at least 60s).
        #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = retention_arg)]
        keep: Duration,
        /// Free-form description.
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        ns: NamespaceArg,
    },
    /// Arrive as --id and wait until every party has, then run the command (if any).
    Wait {
        /// The barrier's name.
        name: String,
        /// Who arrives: unique among the parties (letters, digits, '-', '_' and '.').
        #[arg(long, value_name = "ID", required_unless_present = "who")]
        id: Option<String>,
        /// Longest wait [default: forever]; exit 75 when it passes first.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Show who has arrived in the current round (and the last one) instead.
        #[arg(long, conflicts_with_all = ["id", "timeout", "command"])]
        who: bool,
        /// With --who: print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ns: NamespaceArg,
        /// The command to run once the barrier tripped, after `--`.
        #[arg(value_name = "CMD", last = true)]
        command: Vec<String>,
    },
}

/// `--namespace`, as `conch sema` takes it.
#[derive(Debug, Args)]
pub(crate) struct NamespaceArg {
    /// The namespace it lives in.
    #[arg(long, value_name = "NS", env = "CONCH_NAMESPACE", default_value = conch_client::sema::NAMESPACE, value_parser = namespace_arg)]
    pub namespace: String,
}

pub(crate) fn namespace_arg(s: &str) -> Result<String, String> {
    conch_client::sema::validate_name("namespace", s)?;
    Ok(s.to_string())
}

/// A wait group's expiry from now: the server refuses an `expires_at` less than a minute ahead
/// when the call reaches it, so a minute and one second at least.
pub(crate) fn expires_in_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d <= Duration::from_secs(60) {
        return Err("must be more than 1m (a wait group expires at least a minute ahead)".into());
    }
    Ok(d)
}

pub(crate) fn retention_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(60) {
        return Err("must be at least 60s".into());
    }
    Ok(d)
}

pub(crate) fn meta_arg(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s}: expected KEY=VALUE"))?;
    Ok((k.to_string(), v.to_string()))
}

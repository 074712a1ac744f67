//! `conch wait-group create | done | wait | status | run`: a cron fleet reports N jobs in, and
//! whoever waits learns when all of them did.
//!
//! A wait group lives in a namespace (`conch` unless `--namespace`), counts the distinct job
//! ids reported done, and completes when they reach its counter; it expires if that has not
//! happened by its deadline. `wait` blocks on the server (woken by the entry that completes or
//! expires the group, not by polling), chaining 300-second waits up to `--timeout`.
//! `run` starts the command and reports its job done only when it exits 0.
//!
//! Exit codes (the table of `exit.rs`): `wait` exits 0 when the group completed, 1 when it
//! expired, 75 when `--timeout` passed first; `status` 0 completed, 1 expired, 2 active; `run`
//! the command's own status; `done` 0 also for a job the group already counted, finished or
//! not (a safe retry); 64 usage or a refusal (e.g. a new job reported to a finished group),
//! 65 no such group (or it exists already, for `create`), 69 no node answered, 77 access.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conch_client::Client;
use conch_client::proto::grackle::{WaitGroup, WaitGroupStatus, WaitGroupWaitOutcome};
use serde::Serialize;
use tokio::time::Instant;

use crate::child::{self, Signals};
use crate::exit::{self, Exit};
use crate::sync_args::WaitGroupCommand;
use crate::timefmt;

/// What `status --json` prints.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct WaitGroupJson {
    pub name: String,
    pub status: &'static str,
    pub counter: i64,
    pub completed_jobs: i64,
    /// RFC 3339.
    pub expires_at: String,
    /// RFC 3339; empty while active.
    pub finished_at: String,
    pub version: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<String>>,
}

pub(crate) fn status_name(status: i32) -> &'static str {
    match WaitGroupStatus::try_from(status) {
        Ok(WaitGroupStatus::Active) => "active",
        Ok(WaitGroupStatus::Completed) => "completed",
        Ok(WaitGroupStatus::Expired) => "expired",
        _ => "unknown",
    }
}

impl From<&WaitGroup> for WaitGroupJson {
    fn from(w: &WaitGroup) -> Self {
        WaitGroupJson {
            name: w.name.clone(),
            status: status_name(w.status),
            counter: w.counter,
            completed_jobs: w.completed_jobs,
            expires_at: timefmt::format_unix_nanos(w.expires_at).unwrap_or_default(),
            finished_at: match w.finished_at {
                0 => String::new(),
                t => timefmt::format_unix_nanos(t).unwrap_or_default(),
            },
            version: w.version,
            jobs: None,
        }
    }
}

/// One status line: `<name>  <status>  <done>/<counter> jobs  expires=<time>`.
pub(crate) fn line(w: &WaitGroupJson) -> String {
    let mut line = format!(
        "{}  {}  {}/{} jobs  expires={}",
        w.name, w.status, w.completed_jobs, w.counter, w.expires_at
    );
    if !w.finished_at.is_empty() {
        line.push_str(&format!("  finished={}", w.finished_at));
    }
    line
}

/// 0 completed, 1 expired, 2 active.
fn status_code(status: i32) -> ExitCode {
    match WaitGroupStatus::try_from(status) {
        Ok(WaitGroupStatus::Completed) => ExitCode::SUCCESS,
        Ok(WaitGroupStatus::Expired) => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}

/// This host's name, recorded with a job or an arrival.
pub(crate) fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

fn unix_nanos_in(d: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_add(d);
    i64::try_from(now.as_nanos()).unwrap_or(i64::MAX)
}

pub(crate) async fn run(client: &Client, command: WaitGroupCommand) -> anyhow::Result<ExitCode> {
    match command {
        WaitGroupCommand::Create {
            name,
            jobs,
            expires_in,
            keep,
            description,
            ns,
        } => {
            client.ensure_namespace(&ns.namespace).await?;
            let wg = client
                .create_wait_group(
                    &ns.namespace,
                    &name,
                    jobs,
                    unix_nanos_in(expires_in),
                    keep,
                    &description,
                )
                .await?;
            crate::print_lines([line(&WaitGroupJson::from(&wg))])?;
            Ok(ExitCode::SUCCESS)
        }
        WaitGroupCommand::Done {
            name,
            job_id,
            meta,
            ns,
        } => {
            let wg = done(
                client,
                &ns.namespace,
                &name,
                &job_id,
                meta.into_iter().collect(),
            )
            .await?;
            crate::print_lines([line(&WaitGroupJson::from(&wg))])?;
            Ok(ExitCode::SUCCESS)
        }
        WaitGroupCommand::Wait { name, timeout, ns } => {
            wait(client, &ns.namespace, &name, timeout).await
        }
        WaitGroupCommand::Status {
            name,
            json,
            jobs,
            ns,
        } => {
            let wg = client.get_wait_group(&ns.namespace, &name).await?;
            let mut out = WaitGroupJson::from(&wg);
            if jobs {
                let done = client.list_completed_jobs(&ns.namespace, &name).await?;
                out.jobs = Some(done.into_iter().map(|j| j.job_id).collect());
            }
            if json {
                crate::print_lines([serde_json::to_string(&out)?])?;
            } else {
                let mut lines = vec![line(&out)];
                lines.extend(out.jobs.iter().flatten().map(|j| format!("  {j}")));
                crate::print_lines(lines)?;
            }
            Ok(status_code(wg.status))
        }
        WaitGroupCommand::Run {
            name,
            job_id,
            command,
            ns,
        } => {
            // Catch the forwarded signals before the command starts.
            let mut signals = Signals::install()?;
            // The group must exist and be active before the job starts.
            let wg = client.get_wait_group(&ns.namespace, &name).await?;
            if wg.status != WaitGroupStatus::Active as i32 {
                return Err(Exit {
                    code: exit::USAGE,
                    message: format!(
                        "wait group {name} is {}: not running {}",
                        status_name(wg.status),
                        command.first().map_or("", String::as_str)
                    ),
                }
                .into());
            }
            let env = [
                ("CONCH_WAIT_GROUP", name.clone()),
                ("CONCH_JOB_ID", job_id.clone()),
            ];
            let code = run_command(&command, &env, &mut signals).await?;
            if code == 0 {
                let mut meta = HashMap::new();
                meta.insert("host".to_string(), hostname());
                done(client, &ns.namespace, &name, &job_id, meta).await?;
            }
            Ok(ExitCode::from(code))
        }
    }
}

/// Reports `job_id` done. Reporting it again is a safe retry, also once the group completed:
/// the server refuses any report to a finished group, so a refusal is looked at again, and a
/// job the completed group has recorded answers the group as a first report would.
async fn done(
    client: &Client,
    namespace: &str,
    name: &str,
    job_id: &str,
    meta: HashMap<String, String>,
) -> anyhow::Result<WaitGroup> {
    let refused = match client
        .complete_jobs(namespace, name, vec![(job_id.to_string(), meta)])
        .await
    {
        Ok(wg) => return Ok(wg),
        Err(e @ conch_client::Error::InvalidArgument { .. }) => e,
        Err(e) => return Err(e.into()),
    };
    let wg = client.get_wait_group(namespace, name).await?;
    if wg.status == WaitGroupStatus::Completed as i32 {
        let jobs = client.list_completed_jobs(namespace, name).await?;
        if jobs.iter().any(|j| j.job_id == job_id) {
            return Ok(wg);
        }
    }
    Err(refused.into())
}

async fn wait(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Option<Duration>,
) -> anyhow::Result<ExitCode> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => conch_client::sync::WAIT_RPC_MAX,
        };
        let (wg, outcome) = client.wait_for_wait_group(namespace, name, left).await?;
        let json = WaitGroupJson::from(&wg);
        match outcome {
            WaitGroupWaitOutcome::Completed => {
                crate::print_lines([line(&json)])?;
                return Ok(ExitCode::SUCCESS);
            }
            WaitGroupWaitOutcome::Expired => {
                crate::print_lines([line(&json)])?;
                return Ok(ExitCode::from(1));
            }
            _ if deadline.is_some_and(|d| Instant::now() >= d) => {
                return Err(Exit {
                    code: exit::NO_SLOT,
                    message: format!(
                        "wait group {name}: {}/{} jobs done when --timeout passed",
                        wg.completed_jobs, wg.counter
                    ),
                }
                .into());
            }
            _ => {}
        }
    }
}

/// Runs `argv` in its own process group with `env`, forwarding conch's signals to it, and
/// returns its exit code (128+N if killed by signal N; 126/127 if it could not start).
pub(crate) async fn run_command(
    argv: &[String],
    env: &[(&str, String)],
    signals: &mut Signals,
) -> anyhow::Result<u8> {
    let mut command = match child::spawn(argv, env) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::COMMAND_NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            let program = argv.first().map_or("", String::as_str);
            return Err(Exit {
                code,
                message: format!("cannot run {program}: {e}"),
            }
            .into());
        }
    };
    let pgid = command.id().map_or(0, |id| id as i32);
    loop {
        tokio::select! {
            status = command.wait() => return Ok(exit::code_for_status(status?)),
            sig = signals.recv() => child::signal_group(pgid, sig),
        }
    }
}

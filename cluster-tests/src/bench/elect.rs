//! E1: how long leadership stays vacant when a leader is told to stop.
//!
//! Two `conch elect` candidates of one election run against the cluster, each with a command
//! that prints one line as it starts and then sleeps. Per round, the leader's conch gets
//! SIGTERM: it stops its command, revokes its lease, and the waiting candidate's conch starts
//! its command. Measured: the time from sending SIGTERM to the new leader's line being read
//! (`p50_ms`/`p99_ms`/`max_ms` over the rounds). A new candidate then joins, and once the
//! queue shows it waiting the next round begins. The old leader's exit status is checked every
//! round (its command was stopped by SIGTERM: 143).
//!
//! The candidates are this build's `conch` binary beside `conch-bench` (or `CONCH_BIN`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use conch_proto::conch::ListSemaphoreWaitersRequest;
use conch_proto::conch::conch_api_client::ConchApiClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::{binary, dies_with_spawner, wait_for};

use super::Target;
use super::stats::{Latencies, Row};

/// Rounds of E1.
pub const E1_ROUNDS: usize = 50;

/// How long one step (a candidate queueing, a new leader starting) may take.
const STEP: Duration = Duration::from_secs(30);

/// One `conch elect` candidate and the lines its command prints.
struct Candidate {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Candidate {
    fn start(target: &Target, election: &str) -> anyhow::Result<Candidate> {
        let mut command = Command::new(binary("conch"));
        command
            .args(["elect", election, "--namespace", &target.ns])
            .args(["--ttl", "10s", "--kill-after", "5s", "--"])
            .args(["sh", "-c", r#"echo "leader $CONCH_REV"; exec sleep 600"#])
            .env("CONCH_ENDPOINTS", target.endpoints.join(","))
            .env_remove("CONCH_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        dies_with_spawner(command.as_std_mut());
        let mut child = command.spawn().context("start conch elect")?;
        let stdout = child.stdout.take().context("conch elect has no stdout")?;
        Ok(Candidate {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Waits for the line the command prints once this candidate leads.
    async fn leads(&mut self) -> anyhow::Result<()> {
        match tokio::time::timeout(STEP, self.lines.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("leader ") => Ok(()),
            Ok(Ok(other)) => bail!("unexpected output from the leader's command: {other:?}"),
            Ok(Err(e)) => Err(e).context("read the candidate's output"),
            Err(_) => bail!("no new leader within {STEP:?}"),
        }
    }

    fn terminate(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("candidate already gone")?;
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM).context("SIGTERM the leader")
    }

    async fn exit_code(&mut self) -> anyhow::Result<Option<i32>> {
        let status = tokio::time::timeout(STEP, self.child.wait())
            .await
            .context("the stopped leader's conch did not exit")??;
        Ok(status.code())
    }
}

/// How many candidates wait in `election`'s queue.
async fn waiting(target: &Target, election: &str) -> Option<usize> {
    for addr in &target.endpoints {
        let Ok(channel) = crate::channel(addr).await else {
            continue;
        };
        let request = ListSemaphoreWaitersRequest {
            namespace_name: target.ns.clone(),
            semaphore_name: format!("{election}.elect"),
            ..Default::default()
        };
        if let Ok(r) = ConchApiClient::new(channel)
            .list_semaphore_waiters(request)
            .await
        {
            return Some(r.into_inner().waiters.len());
        }
    }
    None
}

/// E1: the hand-over gap of `conch elect` on SIGTERM, over `rounds` hand-overs.
pub async fn e1(target: &Target, rounds: usize) -> anyhow::Result<Row> {
    let election = "e1";
    let mut leader = Candidate::start(target, election)?;
    leader.leads().await.context("the first leader")?;
    let mut gaps = Latencies::default();
    for round in 0..rounds {
        let mut next = Candidate::start(target, election)?;
        wait_for("the next candidate to queue", STEP, || async {
            (waiting(target, election).await? == 1).then_some(())
        })
        .await?;
        let sent = Instant::now();
        leader.terminate()?;
        next.leads()
            .await
            .with_context(|| format!("round {round}"))?;
        gaps.push(sent.elapsed());
        let code = leader.exit_code().await?;
        ensure!(
            code == Some(128 + 15),
            "round {round}: the old leader's conch exited {code:?}, not 143"
        );
        leader = next;
    }
    leader.terminate()?;
    leader.exit_code().await?;
    let mut row = Row::new("E1", 2);
    row.set("rounds", rounds as u64);
    row.opt("p50_ms", gaps.pct_ms(50.0));
    row.opt("p99_ms", gaps.pct_ms(99.0));
    row.opt("max_ms", gaps.pct_ms(100.0));
    Ok(row)
}

//! P1: a loss pushed to the holder, from the server to the command stopped.
//!
//! Per round, a real `conch sema` (the release binary next to conch-bench) takes a slot with a
//! 60 s TTL and runs `sleep`; once its loss watch is up (the nodes' `conch_waiting_calls` say
//! so), the bench revokes its lease through the leader (`RevokeSemaphoreLease`). Measured: the
//! time from sending the revoke to the `conch` process having exited, which it does only once
//! its command's process group is gone (SIGTERM, which ends `sleep` at once). The TTL makes
//! sure no refresh is what told: every round must end with exit 79 and the pushed cause
//! (`revoked`) on stderr, or the workload fails.
//!
//! Needs a cluster started by conch-bench (no `--endpoints`), without `--tls` or `--auth`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use conch_proto::grackle as pb;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

use super::stats::{Latencies, Row};
use super::{Opts, Target};
use crate::Cluster;
use crate::scrape::scrape;

/// Rounds of P1.
pub const P1_ROUNDS: usize = 100;

/// How long one round's steps may take.
const STEP: Duration = Duration::from_secs(30);

/// Waits until the nodes together serve at least `n` waiting calls (a loss watch is one).
async fn watching(cluster: &Cluster, n: usize) -> anyhow::Result<()> {
    let addrs: Vec<String> = cluster
        .ids()
        .into_iter()
        .filter_map(|id| cluster.metrics_addr(id))
        .collect();
    crate::wait_for("the loss watch to be served", STEP, || {
        let addrs = addrs.clone();
        async move {
            let mut total = 0.0;
            for addr in &addrs {
                total += scrape(addr).await.ok()?.value("conch_waiting_calls");
            }
            (total >= n as f64).then_some(())
        }
    })
    .await
}

/// P1 over `rounds` rounds.
pub async fn p1(target: &Target, opts: &Opts, rounds: usize) -> anyhow::Result<Row> {
    if opts.tls || opts.auth {
        bail!("P1 runs conch against a plaintext cluster without access control");
    }
    let cluster = target
        .cluster
        .as_ref()
        .context("P1 needs a cluster started by conch-bench (no --endpoints)")?;
    let conch = crate::binary("conch");
    if !conch.exists() {
        bail!(
            "conch not found at {}: build it with `cargo build --release --bins` or set CONCH_BIN",
            conch.display()
        );
    }
    let leader = target.leader().await?;
    let mut revoker = target
        .clients(&leader.addr, 1)
        .await?
        .pop()
        .context("a client on the leader")?;
    let mut stopped = Latencies::default();
    for round in 0..rounds {
        let mut child = Command::new(&conch)
            .args([
                "sema",
                "p1",
                "--max",
                "1",
                "--ttl",
                "60s",
                "--kill-after",
                "5s",
            ])
            .args(["--namespace", &target.ns])
            .args(["--", "sh", "-c", "echo \"$CONCH_LEASE\"; exec sleep 600"])
            .env("CONCH_ENDPOINTS", target.endpoints.join(","))
            .env_remove("CONCH_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", conch.display()))?;
        let stdout = child.stdout.take().context("conch's stdout")?;
        let mut stderr = child.stderr.take().context("conch's stderr")?;
        let mut line = String::new();
        tokio::time::timeout(STEP, BufReader::new(stdout).read_line(&mut line))
            .await
            .with_context(|| format!("round {round}: the command did not start"))??;
        let lease = line.trim().to_string();
        if lease.is_empty() {
            bail!("round {round}: the command printed no CONCH_LEASE");
        }
        watching(cluster, 1).await?;
        let sent = Instant::now();
        revoker
            .revoke_semaphore_lease(pb::RevokeSemaphoreLeaseRequest {
                namespace_name: target.ns.clone(),
                lease_id: lease.clone(),
            })
            .await
            .with_context(|| format!("round {round}: revoke {lease}"))?;
        let status = tokio::time::timeout(STEP, child.wait())
            .await
            .with_context(|| format!("round {round}: conch did not stop the command"))??;
        stopped.push(sent.elapsed());
        let mut said = String::new();
        stderr.read_to_string(&mut said).await?;
        if status.code() != Some(79) || !said.contains("(revoked)") {
            bail!("round {round}: conch exited {status} without the pushed loss: {said:?}");
        }
    }
    let mut row = Row::new("P1", 1);
    row.set("rounds", rounds);
    row.opt("p50_ms", stopped.pct_ms(50.0));
    row.opt("p99_ms", stopped.pct_ms(99.0));
    row.opt("max_ms", stopped.pct_ms(100.0));
    Ok(row)
}

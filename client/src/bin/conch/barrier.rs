//! `conch barrier create | wait | status`: N processes meet, then all go on together.
//!
//! `wait NAME --id ID` arrives at the barrier's current generation as ID (once: a retry of the
//! arrival is answered with the first reply) and waits on the server until that generation
//! trips, chaining 300-second waits up to `--timeout`; then it runs the command, if one is
//! given after `--`. The arrival that trips the barrier releases every waiter of that
//! generation from the same applied entry. `--who` (or `status NAME`) shows who has arrived
//! instead.
//!
//! Exit codes: `wait` 0 when the barrier tripped (or the command's own status), 75 when
//! `--timeout` passed first (the arrival stays counted for that generation); `--who`, `status`
//! 0; 64
//! usage or a refusal, 65 no such barrier (or it exists already, for `create`), 69 no node
//! answered, 77 access.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use conch_client::Client;
use conch_client::proto::grackle::{Barrier, BarrierWaitOutcome};
use serde::Serialize;
use tokio::time::Instant;

use crate::child::Signals;
use crate::exit::{self, Exit};
use crate::sync_args::BarrierCommand;
use crate::timefmt;
use crate::waitgroup::{hostname, run_command};

/// What `--who --json` prints.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct WhoJson {
    pub name: String,
    pub generation: i64,
    pub expected: i64,
    /// Process ids arrived in the current generation.
    pub arrived: Vec<String>,
    /// Process ids of the generation before (the last to trip), if kept.
    pub previous: Vec<String>,
}

fn line(b: &Barrier) -> String {
    format!(
        "{}  generation {}  {}/{} arrived  last activity {}",
        b.name,
        b.generation,
        b.arrived_processes,
        b.expected_processes,
        timefmt::format_unix_nanos(b.last_activity_at).unwrap_or_default()
    )
}

pub(crate) async fn run(client: &Client, command: BarrierCommand) -> anyhow::Result<ExitCode> {
    match command {
        BarrierCommand::Create {
            name,
            parties,
            keep,
            description,
            ns,
        } => {
            client.ensure_namespace(&ns.namespace).await?;
            let b = client
                .create_barrier(&ns.namespace, &name, parties, keep, &description)
                .await?;
            crate::print_lines([line(&b)])?;
            Ok(ExitCode::SUCCESS)
        }
        BarrierCommand::Status { name, json, ns } => who(client, &ns.namespace, &name, json).await,
        BarrierCommand::Wait {
            name,
            who: true,
            json,
            ns,
            ..
        } => who(client, &ns.namespace, &name, json).await,
        BarrierCommand::Wait {
            name,
            id,
            timeout,
            ns,
            command,
            ..
        } => {
            let mut signals = Signals::install()?;
            let id = id.ok_or_else(|| exit::usage("--id is required"))?;
            let generation = arrive_and_wait(client, &ns.namespace, &name, &id, timeout).await?;
            if command.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
            let env = [
                ("CONCH_BARRIER", name.clone()),
                ("CONCH_BARRIER_GENERATION", generation.to_string()),
            ];
            Ok(ExitCode::from(
                run_command(&command, &env, &mut signals).await?,
            ))
        }
    }
}

/// Arrives at the current generation and waits for it to trip; returns that generation.
async fn arrive_and_wait(
    client: &Client,
    namespace: &str,
    name: &str,
    id: &str,
    timeout: Option<Duration>,
) -> anyhow::Result<u64> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut meta = HashMap::new();
    meta.insert("host".to_string(), hostname());
    // The generation read may trip before the arrival lands (someone lowered the parties):
    // then arrive at the next one.
    let mut attempts = 0;
    let (generation, tripped) = loop {
        let barrier = client.get_barrier(namespace, name).await?;
        let generation = u64::try_from(barrier.generation).unwrap_or(0);
        match client
            .arrive_at_barrier(namespace, name, id, generation, meta.clone())
            .await
        {
            Ok((_, tripped)) => break (generation, tripped),
            Err(conch_client::Error::InvalidArgument { .. }) if attempts < 3 => attempts += 1,
            Err(e) => return Err(e.into()),
        }
    };
    if tripped {
        return Ok(generation);
    }
    loop {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => conch_client::sync::WAIT_RPC_MAX,
        };
        let (b, outcome) = client
            .wait_at_barrier(namespace, name, generation, left)
            .await?;
        if outcome == BarrierWaitOutcome::Tripped {
            return Ok(generation);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Exit {
                code: exit::NO_SLOT,
                message: format!(
                    "barrier {name}: {}/{} arrived when --timeout passed",
                    b.arrived_processes, b.expected_processes
                ),
            }
            .into());
        }
    }
}

async fn who(client: &Client, namespace: &str, name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let b = client.get_barrier(namespace, name).await?;
    let generation = u64::try_from(b.generation).unwrap_or(0);
    let ids = |list: Vec<conch_client::proto::grackle::BarrierParticipant>| {
        list.into_iter().map(|p| p.process_id).collect::<Vec<_>>()
    };
    let arrived = ids(client
        .list_barrier_participants(namespace, name, generation)
        .await?);
    let previous = match generation {
        0 | 1 => Vec::new(),
        g => ids(client
            .list_barrier_participants(namespace, name, g - 1)
            .await?),
    };
    let out = WhoJson {
        name: b.name.clone(),
        generation: b.generation,
        expected: b.expected_processes,
        arrived,
        previous,
    };
    if json {
        crate::print_lines([serde_json::to_string(&out)?])?;
    } else {
        let mut lines = vec![line(&b)];
        lines.extend(out.arrived.iter().map(|p| format!("  arrived  {p}")));
        if !out.previous.is_empty() {
            lines.push(format!(
                "  generation {} (tripped): {}",
                out.generation - 1,
                out.previous.join(" ")
            ));
        }
        crate::print_lines(lines)?;
    }
    Ok(ExitCode::SUCCESS)
}

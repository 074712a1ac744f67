//! `conch sema <name> --max N -- cmd…`: hold one of N cluster-wide slots while `cmd` runs.
//!
//! 1. Make sure `<ns>/<name>.<N>` exists (and, with `--spread`, `<ns>/<name>.<N>.host-<h>`),
//!    `<ns>` being `--namespace` (default `conch`). A namespace that does not exist is made
//!    where the token may; where it may not, conch says so in one line (exit 77). A semaphore
//!    that exists with other permits than N (changed through the API) is refused (exit 70).
//! 2. Create a lease (`--ttl`) and queue for one permit (the host semaphore first, with the
//!    same lease and what is left of the same wait). The queue position survives RPC timeouts
//!    and node failover; a lease lost while waiting re-enters with a new lease (back of the
//!    queue) while `--wait` allows, else exit 75.
//! 3. Check that the semaphore is still the one queued in, then run the command in its own
//!    process group with `CONCH_REV` and `CONCH_LEASE` (and without the variables that hold
//!    or name conch's credentials), forwarding signals, while the lease keeps itself alive and
//!    the semaphore is watched ([`crate::watch`]).
//! 4. Command exits: revoke the lease (releasing its permits in one request), exit with the
//!    command's status. Lease lost, or the semaphore deleted or resized, first: SIGTERM the
//!    group, SIGKILL after `--kill-after`, revoke, exit 79.
//!
//! Beside the command runs a [`guard`](crate::guard) process, renewed on every refresh: should
//! conch itself not run (stopped, stuck) past the point where the lease is safe, the guard
//! stops the command, and conch, once it runs again, says so and exits 79.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use conch_client::sema::{self, META_CMD, META_HOST, META_PID, META_SINCE, NAMESPACE};
use conch_client::{Client, Guard, Lease, format_duration, refresh_interval};
use tonic::Code;
use tracing::{debug, info};

use crate::child::{self, Signals};
use crate::cli::SemaArgs;
use crate::exit::{self, Exit};
use crate::guard;
use crate::status;
use crate::timefmt::now_rfc3339;
use crate::watch::Held;

/// Who this conch is, as holders and waiters show it.
#[derive(Debug, Clone)]
pub struct Identity {
    pub host: String,
    pub pid: u32,
    pub since: String,
    pub cmd: String,
}

/// This machine's host name, as `gethostname(2)` reports it (`unknown` if it is empty).
pub fn hostname() -> String {
    let name = gethostname::gethostname();
    let name = name.to_string_lossy();
    let name = name.trim();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name.to_string()
    }
}

impl Identity {
    pub fn current(command: &[String]) -> Identity {
        Identity {
            host: hostname(),
            pid: std::process::id(),
            since: now_rfc3339(),
            cmd: command.join(" "),
        }
    }

    /// Metadata for the lease and for the waiter/holder (values cut to the server's limit).
    pub fn metadata(&self) -> HashMap<String, String> {
        let cut = |s: &str| sema::truncate_utf8(s, sema::MAX_META_VALUE_LEN).to_string();
        HashMap::from([
            (META_HOST.to_string(), cut(&self.host)),
            (META_PID.to_string(), self.pid.to_string()),
            (META_SINCE.to_string(), self.since.clone()),
            (META_CMD.to_string(), cut(&self.cmd)),
        ])
    }

    pub fn process_id(&self) -> String {
        sema::process_id(&self.host, self.pid)
    }
}

/// The semaphores one run takes, in order: the per-host one (`--spread`), then the main one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub main: String,
    pub host: Option<String>,
}

impl Plan {
    pub fn new(name: &str, max: u64, spread: bool, host: &str) -> Result<Plan, String> {
        Ok(Plan {
            main: sema::semaphore_name(name, max)?,
            host: if spread {
                Some(sema::spread_semaphore_name(name, max, host)?)
            } else {
                None
            },
        })
    }
}

/// What is left of a wait that ends at `deadline` (`None`: forever).
fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// One run under a slot, as `conch sema` and `conch elect` describe it: which semaphores, how
/// long to wait, what to run, and the words the messages use.
pub struct Spec<'a> {
    /// The namespace everything lives in (`--namespace`).
    pub namespace: String,
    pub plan: Plan,
    /// Permits of the main semaphore.
    pub permits: u64,
    pub ttl: Duration,
    pub kill_after: Duration,
    /// `None`: forever.
    pub wait: Option<Duration>,
    pub command: &'a [String],
    pub me: Identity,
    /// Metadata of the lease and the acquires (the identity's, plus what the caller adds).
    pub metadata: HashMap<String, String>,
    /// Environment for the command besides `CONCH_REV` and `CONCH_LEASE`.
    pub env: Vec<(&'static str, String)>,
    /// What is queued for, in messages: `video-encode[2]`, `election billing`.
    pub label: String,
    /// What is wanted, in "no … within": `slot in video-encode[2]`, `leadership of billing`.
    pub wanted: String,
    /// The message when there is none to take at once.
    pub busy: String,
    /// What is held, in messages: `slot`, `leadership`.
    pub slot: &'static str,
}

fn no_slot(spec: &Spec, wait: Option<Duration>) -> anyhow::Error {
    let wanted = &spec.wanted;
    let message = match wait {
        Some(w) if w.is_zero() => spec.busy.clone(),
        Some(w) => format!("no {wanted} within {}", format_duration(w)),
        None => format!("no {wanted}"),
    };
    Exit {
        code: exit::NO_SLOT,
        message,
    }
    .into()
}

/// What to say when `namespace` does not exist and the token may not create it.
pub fn missing_namespace(namespace: &str) -> String {
    if namespace == NAMESPACE {
        format!(
            "namespace {namespace} does not exist, and this token may not create it: a token \
             with acquire permission on {namespace} creates it on first use"
        )
    } else {
        format!(
            "namespace {namespace} does not exist; an admin creates it with: conch namespace \
             create {namespace}"
        )
    }
}

/// A failure to set up `namespace/semaphore`, as one line: a refusal because the namespace does
/// not exist (and this token may not create it) says so, exit 77.
async fn setup_error(
    client: &Client,
    namespace: &str,
    semaphore: &str,
    e: conch_client::Error,
) -> anyhow::Error {
    if e.code() == Some(Code::PermissionDenied)
        && matches!(client.get_namespace(namespace).await, Err(ref g) if g.is_not_found())
    {
        return Exit {
            code: exit::NO_PERMISSION,
            message: missing_namespace(namespace),
        }
        .into();
    }
    anyhow::Error::new(e).context(format!("set up semaphore {namespace}/{semaphore}"))
}

/// Makes sure the plan's semaphores exist in `namespace` (and the namespace, where the token
/// may create it); returns the main one as it is now. One whose permits are not `max` was
/// changed through the API: running under it would not be what the caller asked for.
async fn ensure_semaphores(
    client: &Client,
    namespace: &str,
    plan: &Plan,
    max: u64,
) -> anyhow::Result<Held> {
    let main = match client.ensure_semaphore(namespace, &plan.main, max).await {
        Ok(s) => s,
        Err(e) => return Err(setup_error(client, namespace, &plan.main, e).await),
    };
    if main.permits != max {
        return Err(Exit {
            code: exit::SOFTWARE,
            message: format!(
                "semaphore {namespace}/{} has {} permits, not {max} (changed through the API); \
                 not running the command: set its permits back to {max}, or delete it to have it \
                 made again",
                plan.main, main.permits
            ),
        }
        .into());
    }
    if let Some(host) = &plan.host
        && let Err(e) = client.ensure_semaphore(namespace, host, 1).await
    {
        return Err(setup_error(client, namespace, host, e).await);
    }
    Ok(Held::new(namespace, &main, max))
}

/// Takes the plan's semaphores with one lease: all of them, or none (`Ok(None)`).
async fn take_slots(
    client: &Client,
    lease: &Lease,
    namespace: &str,
    plan: &Plan,
    deadline: Option<Instant>,
    metadata: &HashMap<String, String>,
) -> conch_client::Result<Option<Vec<Guard>>> {
    let mut guards = Vec::new();
    for sem in plan.host.iter().chain(std::iter::once(&plan.main)) {
        let wait = remaining(deadline);
        match client
            .acquire(lease, namespace, sem, 1, wait, metadata.clone())
            .await?
        {
            Some(g) => guards.push(g),
            None => {
                // Revoking the lease (the caller does) releases what was taken.
                guards.into_iter().for_each(Guard::forget);
                return Ok(None);
            }
        }
    }
    Ok(Some(guards))
}

/// How long the final revoke may take when the command is done: the slot comes back after
/// the TTL anyway, so conch does not hang around an unreachable cluster.
const REVOKE_BUDGET: Duration = Duration::from_secs(3);

/// How long conch tries to revoke a lease it could not refresh, after its command was stopped.
const LAST_REVOKE_TRY: Duration = Duration::from_millis(300);

/// Revokes a lease, which releases everything it holds or waits for in one write; says so if
/// it could not be done (the slot then comes back within the TTL).
async fn revoke(lease: Lease) {
    let id = lease.id().to_string();
    let ttl = lease.ttl();
    let why = match tokio::time::timeout(REVOKE_BUDGET, lease.revoke()).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {}", format_duration(REVOKE_BUDGET)),
    };
    eprintln!(
        "conch: warning: could not revoke lease {id} ({why}); its slot comes back within {}",
        format_duration(ttl)
    );
}

/// Frees the slot: revoking the lease releases every guard taken with it, in one request.
async fn release_all(guards: Vec<Guard>, lease: Lease) {
    guards.into_iter().for_each(Guard::forget);
    revoke(lease).await;
}

pub async fn run(
    client: &Client,
    args: &SemaArgs,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let me = Identity::current(&args.command);
    let plan = Plan::new(&args.name, args.max, args.spread, &me.host).map_err(exit::usage)?;
    let spec = Spec {
        namespace: args.namespace.clone(),
        plan,
        permits: args.max,
        ttl: args.ttl,
        kill_after: args.kill_after,
        wait: args.wait_bound(),
        command: &args.command,
        metadata: me.metadata(),
        me,
        env: Vec::new(),
        label: format!("{}[{}]", args.name, args.max),
        wanted: format!("slot in {}[{}]", args.name, args.max),
        busy: format!(
            "no free slot in {}[{}] (all taken{})",
            args.name,
            args.max,
            if args.spread {
                " or this host already holds one"
            } else {
                ""
            }
        ),
        slot: "slot",
    };
    hold(client, &spec, signals).await
}

/// Queues for the spec's slot, runs its command while holding it, and gives it back; the
/// lease, refresh, self-fencing and guard machinery of `conch sema` and `conch elect`.
pub async fn hold(
    client: &Client,
    spec: &Spec<'_>,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let namespace = spec.namespace.as_str();
    let plan = &spec.plan;
    let wait = spec.wait;
    let deadline = wait.map(|w| Instant::now() + w);
    let metadata = &spec.metadata;
    let process_id = spec.me.process_id();

    let mut held = tokio::select! {
        r = ensure_semaphores(client, namespace, plan, spec.permits) => r?,
        sig = signals.recv() => return Ok(exit::signal_exit(sig)),
    };

    // Queue for the slot; a lost lease re-enters with a new one while the wait allows.
    let (lease, guards) = loop {
        let lease = tokio::select! {
            r = client.create_lease(namespace, &process_id, spec.ttl, metadata.clone()) => {
                r.context("create lease")?
            }
            sig = signals.recv() => return Ok(exit::signal_exit(sig)),
        };
        debug!(lease = lease.id(), "lease created; queueing");
        let taken = tokio::select! {
            r = status::show_while(
                client,
                namespace,
                &spec.label,
                &plan.main,
                lease.id(),
                take_slots(client, &lease, namespace, plan, deadline, metadata),
            ) => r,
            sig = signals.recv() => {
                // Dropping the acquire cancels the wait; revoking leaves nothing behind.
                revoke(lease).await;
                return Ok(exit::signal_exit(sig));
            }
        };
        match taken {
            Ok(Some(guards)) if !lease.is_lost() => break (lease, guards),
            Ok(Some(guards)) => {
                guards.into_iter().for_each(Guard::forget);
                revoke(lease).await;
                if remaining(deadline).is_some_and(|r| r.is_zero()) {
                    return Err(no_slot(spec, wait));
                }
                eprintln!(
                    "conch: lease lost just after the grant; queueing again with a new lease"
                );
            }
            Ok(None) => {
                revoke(lease).await;
                return Err(no_slot(spec, wait));
            }
            Err(e) if e.is_lease_lost() || e.is_not_found() => {
                revoke(lease).await;
                if remaining(deadline).is_some_and(|r| r.is_zero()) {
                    return Err(no_slot(spec, wait)).context(e.to_string());
                }
                eprintln!(
                    "conch: lost the lease while waiting ({e}); queueing again with a new lease"
                );
                // The semaphore may be what disappeared.
                held = ensure_semaphores(client, namespace, plan, spec.permits).await?;
            }
            Err(e) => {
                revoke(lease).await;
                return Err(e).context(format!("queue for {}", spec.label));
            }
        }
    };

    // The semaphore may have been deleted or resized while conch queued: then the slot is not
    // the one asked for, and the command does not start.
    let before = tokio::select! {
        r = held.check(client) => r,
        sig = signals.recv() => {
            release_all(guards, lease).await;
            return Ok(exit::signal_exit(sig));
        }
    };
    if let Ok(Some(change)) = before {
        release_all(guards, lease).await;
        return Err(Exit {
            code: exit::SLOT_LOST,
            message: held.describe(&change, "while queued; the command was not started"),
        }
        .into());
    }

    let token = guards.last().map_or(0, |g| g.fencing_token());
    info!(
        lease = lease.id(),
        rev = token,
        "slot acquired; starting the command"
    );
    let mut env = vec![
        ("CONCH_REV", token.to_string()),
        ("CONCH_LEASE", lease.id().to_string()),
    ];
    env.extend(spec.env.iter().cloned());
    let mut watchdog = match guard::Guard::start(spec.ttl, spec.kill_after) {
        Ok(g) => g,
        Err(e) => {
            release_all(guards, lease).await;
            return Err(Exit {
                code: exit::SOFTWARE,
                message: format!("cannot start the guard process: {e}"),
            }
            .into());
        }
    };
    let mut refreshed = lease.refreshed();
    let mut child = match child::spawn(spec.command, &env) {
        Ok(c) => c,
        Err(e) => {
            watchdog.finish().await;
            release_all(guards, lease).await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::COMMAND_NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            let program = spec.command.first().map_or("", String::as_str);
            return Err(Exit {
                code,
                message: format!("cannot run {program}: {e}"),
            }
            .into());
        }
    };
    let pgid = child.id().map_or(0, |id| id as i32);
    watchdog.watch(pgid, *refreshed.borrow_and_update());

    enum End {
        Exited(std::process::ExitStatus),
        Lost(conch_client::LeaseLoss),
        Changed(crate::watch::Change),
    }
    // One future for the whole run, so the checks keep their pace whatever else wakes the loop.
    let semaphore_changed = held.changed(client, refresh_interval(spec.ttl));
    tokio::pin!(semaphore_changed);
    let end = loop {
        tokio::select! {
            status = child.wait() => break End::Exited(status.context("wait for the command")?),
            sig = signals.recv() => child::signal_group(pgid, sig),
            loss = lease.lost() => break End::Lost(loss),
            change = &mut semaphore_changed => break End::Changed(change),
            Ok(()) = refreshed.changed() => watchdog.renew(*refreshed.borrow_and_update()),
        }
    };
    if watchdog.fired() {
        // conch did not run while the lease ran out (stopped, or stuck): the guard sent SIGTERM
        // and sends SIGKILL after --kill-after; conch sees the group gone, or finishes the job.
        eprintln!(
            "conch: {} lost while conch was paused (lease {} not refreshed in time); the command was stopped (SIGTERM, SIGKILL after {})",
            spec.slot,
            lease.id(),
            format_duration(spec.kill_after)
        );
        let status = child::finish_stopping(&mut child, pgid, spec.kill_after, signals)
            .await
            .context("stop the command")?;
        debug!(?status, "command stopped by the guard");
        watchdog.finish().await;
        guards.into_iter().for_each(Guard::forget);
        // The server may not have expired the lease yet: one quick, silent try to free it.
        let _ = tokio::time::timeout(LAST_REVOKE_TRY, lease.revoke()).await;
        return Ok(ExitCode::from(exit::SLOT_LOST));
    }
    match end {
        End::Exited(status) => {
            watchdog.finish().await;
            release_all(guards, lease).await;
            Ok(ExitCode::from(exit::code_for_status(status)))
        }
        End::Lost(loss) => {
            eprintln!(
                "conch: {} lost while running (lease {}: {loss}); stopping the command (SIGTERM, SIGKILL after {})",
                spec.slot,
                lease.id(),
                format_duration(spec.kill_after)
            );
            watchdog.stopping();
            let status = child::stop_group(&mut child, pgid, spec.kill_after, signals)
                .await
                .context("stop the command")?;
            debug!(?status, "command stopped");
            watchdog.finish().await;
            guards.into_iter().for_each(Guard::forget);
            // The command is gone. A lease the server no longer knows needs no revoke; one that
            // could not be refreshed gets one quick, silent try (the cluster was unreachable a
            // moment ago), so the next holder may get in before the TTL. Either way conch exits
            // now, having said one line.
            if matches!(loss, conch_client::LeaseLoss::NoRefresh { .. }) {
                let _ = tokio::time::timeout(LAST_REVOKE_TRY, lease.revoke()).await;
            }
            Ok(ExitCode::from(exit::SLOT_LOST))
        }
        End::Changed(change) => {
            eprintln!(
                "conch: {}; stopping the command (SIGTERM, SIGKILL after {})",
                held.describe(&change, "while held"),
                format_duration(spec.kill_after)
            );
            watchdog.stopping();
            let status = child::stop_group(&mut child, pgid, spec.kill_after, signals)
                .await
                .context("stop the command")?;
            debug!(?status, "command stopped");
            watchdog.finish().await;
            // The lease is still alive: revoking it gives back whatever else it holds.
            release_all(guards, lease).await;
            Ok(ExitCode::from(exit::SLOT_LOST))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_is_never_empty() {
        assert!(!hostname().is_empty());
    }

    #[test]
    fn plans_name_the_semaphores() {
        let p = Plan::new("video-encode", 2, false, "node1").unwrap();
        assert_eq!(
            p,
            Plan {
                main: "video-encode.2".into(),
                host: None
            }
        );
        let p = Plan::new("video-encode", 2, true, "node1.lan").unwrap();
        assert_eq!(p.host.as_deref(), Some("video-encode.2.host-node1-lan"));
        assert!(Plan::new("bad name", 2, false, "h").is_err());
    }

    #[test]
    fn identity_metadata_has_host_pid_since_and_fits() {
        let me = Identity {
            host: "node2".into(),
            pid: 4242,
            since: "2026-06-12T10:15:00Z".into(),
            cmd: "x".repeat(1000),
        };
        let m = me.metadata();
        assert_eq!(m[META_HOST], "node2");
        assert_eq!(m[META_PID], "4242");
        assert_eq!(m[META_SINCE], "2026-06-12T10:15:00Z");
        assert_eq!(m[META_CMD].len(), sema::MAX_META_VALUE_LEN);
        assert_eq!(me.process_id(), "node2/pid-4242");
    }

    #[test]
    fn remaining_wait_counts_down_and_forever_stays_forever() {
        assert_eq!(remaining(None), None);
        let past = Instant::now() - Duration::from_secs(1);
        assert_eq!(remaining(Some(past)), Some(Duration::ZERO));
        let r = remaining(Some(Instant::now() + Duration::from_secs(10))).unwrap();
        assert!(r > Duration::from_secs(9) && r <= Duration::from_secs(10));
    }
}

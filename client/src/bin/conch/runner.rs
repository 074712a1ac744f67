//! The runner of `conch sema`, `conch elect` and `conch lock`: queue for what is to be held,
//! run the command while holding it, give it back.
//!
//! What is held is a [`Target`]: semaphore slots (`conch sema`, `conch elect`: `SemaTarget` in
//! `sema.rs`) or a lock path (`conch lock`: `LockTarget` in `lock.rs`).
//! Everything else is this one code path:
//!
//! 1. [`Target::prepare`]: make sure what the acquire needs exists (a namespace that does not
//!    exist is made where the token may; where it may not, conch says so in one line, exit 77).
//! 2. Create a lease of the target's kind (`--ttl`) and queue ([`Target::take`]). The queue
//!    position survives RPC timeouts and node failover; a lease lost while waiting re-enters
//!    with a new lease (back of the queue) while `--wait` allows, else exit 75. While it
//!    waits, a status line says where it stands ([`crate::status`]).
//! 3. Check that the hold is still there ([`Target::check`]), then run the command in its own
//!    process group with `CONCH_REV` (the grant's fencing token; [`Target::revs`] may add more,
//!    e.g. `CONCH_REVS` for an all-or-none set) and `CONCH_LEASE` (and
//!    without the variables that hold or name conch's credentials), forwarding signals, while
//!    the lease keeps itself alive and the hold is watched ([`Target::lost`]).
//! 4. Command exits: revoke the lease (releasing everything in one request), exit with the
//!    command's status. A target may also end the run itself: on a signal it
//!    [stops on](Target::stops_on) (stop the command, then revoke), or to hand what it holds to
//!    a [preferred](Target::preferred) waiter (stop, revoke, and return [`HandedOver`]). Lease lost, or the hold gone (a semaphore deleted or resized, a lock's
//!    hold dropped by `DeleteLock`), first: SIGTERM the group, SIGKILL after `--kill-after`,
//!    revoke, exit 79 (80 when the server ended the hold at its hold limit); or, when the audit
//!    trail says an administrator revoked the lease ([`crate::revoke::revoked`], looked up once
//!    the loss is known), print who and why and exit 81. A loss is learned the moment a node
//!    applies it ([`Client::lease_lost`], a `WatchLoss` stream), and the cause printed; the
//!    refreshes and the reads of [`Target::lost`] are the fallback when no node can push it.
//!
//! Beside the command runs a guard process ([`crate::guard`]), renewed on every refresh: should
//! conch itself not run (stopped, stuck) past the point where the lease is safe, the guard
//! stops the command, and conch, once it runs again, says so and exits 79.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use conch_client::proto::conch::LossCause;
use conch_client::sema::NAMESPACE;
use conch_client::{Client, Guard, Held, Lease, LeaseKind, format_duration, refresh_interval};
use nix::sys::signal::Signal;
use tonic::Code;
use tracing::{debug, info};

use crate::child::{self, Signals};
use crate::exit::{self, Exit};
use crate::guard;
use crate::identity::Identity;
use crate::status::{self, Standing};

/// What a run holds, and how it is taken, checked and shown.
pub(crate) trait Target {
    /// The kind of lease that holds it.
    fn lease_kind(&self) -> LeaseKind;

    /// Makes sure what the acquire needs exists in `namespace`; called before queueing, and
    /// again when a lease was lost while waiting (what it waited for may be what went).
    async fn prepare(&mut self, client: &Client, namespace: &str) -> anyhow::Result<()>;

    /// Takes it with `lease`, waiting until `deadline` (`None`: forever): all of it, or
    /// nothing (`Ok(None)`; revoking the lease, as the caller does, frees any part taken).
    async fn take(
        &self,
        client: &Client,
        lease: &Lease,
        namespace: &str,
        deadline: Option<Instant>,
        metadata: &HashMap<String, String>,
    ) -> conch_client::Result<Option<Vec<Guard>>>;

    /// The message when nothing came within `wait` (`Some(0)`: busy now).
    fn not_taken(&self, wait: Option<Duration>) -> String;

    /// Reads once whether the grant with `token` still stands: `Ok(Some(what happened))` if
    /// not (`semaphore conch/x.1 was deleted`).
    async fn check(&self, client: &Client, token: u64) -> conch_client::Result<Option<String>>;

    /// Reads every `every` until the grant with `token` no longer stands, and says what
    /// happened. Never resolves while it stands (or cannot be read).
    async fn lost(&self, client: &Client, token: u64, every: Duration) -> String;

    /// Where a wait of `lease_id` stands, for the status line (`None`: cannot tell now).
    async fn standing(&self, client: &Client, lease_id: &str) -> Option<Standing>;

    /// The token the command sees as `CONCH_REV`, and any further variables naming the
    /// grants' tokens, of `guards` (as `take` returned them). By default the last guard's
    /// token and nothing more.
    fn revs(&self, guards: &[Guard]) -> (u64, Vec<(&'static str, String)>) {
        (guards.last().map_or(0, Guard::fencing_token), Vec::new())
    }

    /// Reads every `every` whether the holder should hand what it holds to a waiter preferred
    /// over it (`conch elect --priority`), and says which. Never resolves for targets without
    /// preferences, or while none waits.
    async fn preferred(&self, _client: &Client, _every: Duration) -> String {
        std::future::pending().await
    }

    /// Whether `sig`, received while the command runs, means "stop the command, then give
    /// back what is held" (`conch elect` hands leadership over on SIGTERM and SIGINT) rather
    /// than only being forwarded to the command (the default).
    fn stops_on(&self, _sig: Signal) -> bool {
        false
    }
}

/// How a run ended when its holder handed what it held to a preferred waiter: the command was
/// stopped and the lease revoked; the caller may stand again.
#[derive(Debug)]
pub(crate) struct HandedOver {
    /// Who it went to, in words.
    pub to: String,
}

impl std::fmt::Display for HandedOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "handed over to {}", self.to)
    }
}

impl std::error::Error for HandedOver {}

/// What is left of a wait that ends at `deadline` (`None`: forever).
pub(crate) fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// One run: where, how long to wait, what to run, and the words the messages use.
pub(crate) struct Spec<'a> {
    /// The namespace everything lives in (`--namespace`).
    pub namespace: String,
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
    /// What is queued for, in the status line: `video-encode[2]`, `election billing`,
    /// `lock db/orders (exclusive)`.
    pub label: String,
    /// What is held, in messages: `slot`, `leadership`, `lock`.
    pub slot: &'static str,
}

fn no_slot(target: &impl Target, wait: Option<Duration>) -> anyhow::Error {
    Exit {
        code: exit::NO_SLOT,
        message: target.not_taken(wait),
    }
    .into()
}

/// How long after `--wait` passed a wait in the queue may still take to end on its own (the
/// server's "not granted", one round trip late) before conch stops waiting for the answer.
const QUEUE_BACKSTOP: Duration = Duration::from_millis(500);

/// `fut`, unless `bound` passes first (`None` then).
async fn bounded<T>(bound: Option<Instant>, fut: impl Future<Output = T>) -> Option<T> {
    match bound {
        Some(at) => tokio::time::timeout_at(at.into(), fut).await.ok(),
        None => Some(fut.await),
    }
}

/// `fut`, unless `bound` passes first: then the cluster did not answer within `--wait`.
async fn within<T>(
    bound: Option<Instant>,
    wait: Option<Duration>,
    fut: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    bounded(bound, fut)
        .await
        .unwrap_or_else(|| Err(no_answer_within(wait)))
}

/// `--wait` passed while the cluster had not answered (no quorum, or no node reachable):
/// exit 69, as for any cluster that does not answer, but within the wait asked for.
fn no_answer_within(wait: Option<Duration>) -> anyhow::Error {
    Exit {
        code: exit::UNAVAILABLE,
        message: format!(
            "the cluster did not answer within --wait {} (no quorum, or no node reachable)",
            wait.map_or_else(|| "forever".to_string(), format_duration)
        ),
    }
    .into()
}

/// What to say when `namespace` does not exist and the token may not create it.
pub(crate) fn missing_namespace(namespace: &str) -> String {
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

/// A failure to set up `what` in `namespace`, as one line: a refusal because the namespace
/// does not exist (and this token may not create it) says so, exit 77.
pub(crate) async fn setup_error(
    client: &Client,
    namespace: &str,
    what: &str,
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
    anyhow::Error::new(e).context(format!("set up {what}"))
}

/// How long the final revoke may take when the command is done: what was held comes back
/// after the TTL anyway, so conch does not hang around an unreachable cluster.
const REVOKE_BUDGET: Duration = Duration::from_secs(3);

/// How long conch tries to revoke a lease it could not refresh, after its command was stopped.
const LAST_REVOKE_TRY: Duration = Duration::from_millis(300);

/// How long before the server ends a hold (its hold limit) the command must be gone, at most.
const HOLD_MARGIN: Duration = Duration::from_secs(1);

/// The shortest window for stopping a command before its hold ends.
const HOLD_WINDOW_MIN: Duration = Duration::from_secs(1);

/// When to send SIGTERM for a hold that ends at `until`, and the grace before SIGKILL.
///
/// The command gets the hold minus a stop window: `kill_after` plus [`HOLD_MARGIN`], but never
/// more than a tenth of the hold (nor less than [`HOLD_WINDOW_MIN`]), so a hold of 10 s or more
/// runs the command for at least 90 % of it. SIGKILL comes [`HOLD_MARGIN`] before the end, or half
/// the window when that is shorter; the grace is what remains of the window, at most `kill_after`. `until` is counted
/// from when the grant was asked for, so it is never later than the server's end of the hold.
fn hold_stop(until: Instant, kill_after: Duration, now: Instant) -> (Instant, Duration) {
    let hold = until.saturating_duration_since(now);
    let window = kill_after
        .saturating_add(HOLD_MARGIN)
        .min((hold / 10).max(HOLD_WINDOW_MIN));
    let margin = HOLD_MARGIN.min(window / 2);
    let grace = kill_after.min(window - margin);
    let kill_by = until.checked_sub(margin).unwrap_or(now).max(now);
    let term_at = kill_by.checked_sub(grace).unwrap_or(now).max(now);
    (term_at, kill_by.saturating_duration_since(term_at))
}

/// Revokes a lease, which releases everything it holds or waits for in one write; says so if
/// it could not be done (what it held then comes back within the TTL).
async fn revoke(lease: Lease, slot: &str) {
    let id = lease.id().to_string();
    let ttl = lease.ttl();
    let why = match tokio::time::timeout(REVOKE_BUDGET, lease.revoke()).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {}", format_duration(REVOKE_BUDGET)),
    };
    eprintln!(
        "conch: warning: could not revoke lease {id} ({why}); its {slot} comes back within {}",
        format_duration(ttl)
    );
}

/// Gives back what was held: revoking the lease releases every guard taken with it, in one
/// request.
async fn release_all(guards: Vec<Guard>, lease: Lease, slot: &str) {
    guards.into_iter().for_each(Guard::forget);
    revoke(lease, slot).await;
}

/// Stops the command's whole group (SIGTERM, SIGKILL after `grace`), the guard told so first
/// and ended once the group is gone.
async fn stop_command(
    child: &mut tokio::process::Child,
    pgid: i32,
    grace: Duration,
    signals: &mut Signals,
    mut watchdog: guard::Guard,
    why: &str,
) -> anyhow::Result<()> {
    watchdog.stopping();
    let status = child::stop_group(child, pgid, grace, signals)
        .await
        .context("stop the command")?;
    debug!(?status, why, "command stopped");
    watchdog.finish().await;
    Ok(())
}

/// The line said when the command is stopped because the lease or a hold was lost: who
/// revoked it and why when the audit trail has it (`revoked`), else `lost`.
fn losing_line(
    slot: &str,
    revoked: Option<&conch_client::proto::conch::AuditRecord>,
    lost: String,
    grace: Duration,
) -> String {
    let what = match revoked {
        Some(record) => crate::revoke::revoked_line(slot, record),
        None => lost,
    };
    format!(
        "conch: {what}; stopping the command (SIGTERM, SIGKILL after {})",
        format_duration(grace)
    )
}

/// Queues for `target`, runs the spec's command while holding it, and gives it back; the
/// lease, refresh, self-fencing and guard machinery of `conch sema`, `conch elect` and
/// `conch lock`.
pub(crate) async fn hold(
    client: &Client,
    spec: &Spec<'_>,
    target: &mut impl Target,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let namespace = spec.namespace.as_str();
    let slot = spec.slot;
    let wait = spec.wait;
    let deadline = wait.map(|w| Instant::now() + w);
    let metadata = &spec.metadata;
    let process_id = spec.me.process_id();

    // `--wait D` bounds the wall time of everything before the command starts, also when the
    // cluster does not answer (no quorum): the setup calls and the queueing end at the
    // deadline, whatever their own request timeouts. (`--nonblock` asks once, each call bounded
    // by `--timeout`.)
    let bound = deadline.filter(|_| wait.is_some_and(|w| !w.is_zero()));

    tokio::select! {
        r = within(bound, wait, target.prepare(client, namespace)) => r?,
        sig = signals.recv() => return Ok(exit::signal_exit(sig)),
    };

    // Queue; a lost lease re-enters with a new one while the wait allows.
    let (lease, guards) = loop {
        let kind = target.lease_kind();
        let create = async {
            client
                .create_lease_of(kind, namespace, &process_id, spec.ttl, metadata.clone())
                .await
                .context("create lease")
        };
        let lease = tokio::select! {
            r = within(bound, wait, create) => r?,
            sig = signals.recv() => return Ok(exit::signal_exit(sig)),
        };
        debug!(lease = lease.id(), "lease created; queueing");
        let taken = {
            let lease_id = lease.id().to_string();
            let shown = &*target;
            let queued = status::show_while(
                &spec.label,
                || shown.standing(client, &lease_id),
                shown.take(client, &lease, namespace, deadline, metadata),
            );
            // The wait ends itself at the deadline (the server answers "not granted" then);
            // this is the backstop for a cluster that stopped answering meanwhile.
            let backstop = bound.map(|at| at + QUEUE_BACKSTOP);
            tokio::select! {
                r = bounded(backstop, queued) => match r {
                    Some(r) => r,
                    None => {
                        // No slot came within --wait: one short try to free the lease (it
                        // expires within its TTL anyway).
                        let _ = tokio::time::timeout(LAST_REVOKE_TRY, lease.revoke()).await;
                        return Err(no_slot(target, wait));
                    }
                },
                sig = signals.recv() => {
                    // Dropping the acquire cancels the wait; revoking leaves nothing behind.
                    revoke(lease, slot).await;
                    return Ok(exit::signal_exit(sig));
                }
            }
        };
        match taken {
            Ok(Some(guards)) if !lease.is_lost() => break (lease, guards),
            Ok(Some(guards)) => {
                guards.into_iter().for_each(Guard::forget);
                revoke(lease, slot).await;
                if remaining(deadline).is_some_and(|r| r.is_zero()) {
                    return Err(no_slot(target, wait));
                }
                eprintln!(
                    "conch: lease lost just after the grant; queueing again with a new lease"
                );
            }
            Ok(None) => {
                revoke(lease, slot).await;
                return Err(no_slot(target, wait));
            }
            Err(e) if e.is_lease_lost() || e.is_not_found() => {
                revoke(lease, slot).await;
                if remaining(deadline).is_some_and(|r| r.is_zero()) {
                    return Err(no_slot(target, wait)).context(e.to_string());
                }
                eprintln!(
                    "conch: lost the lease while waiting ({e}); queueing again with a new lease"
                );
                within(bound, wait, target.prepare(client, namespace)).await?;
            }
            Err(e) => {
                revoke(lease, slot).await;
                return Err(e).context(format!("queue for {}", spec.label));
            }
        }
    };

    // What was queued for may have gone while conch queued (a semaphore deleted or resized, a
    // lock's hold dropped): then the command does not start.
    let (token, revs) = target.revs(&guards);
    let before = tokio::select! {
        r = target.check(client, token) => r,
        sig = signals.recv() => {
            release_all(guards, lease, slot).await;
            return Ok(exit::signal_exit(sig));
        }
    };
    if let Ok(Some(what)) = before {
        release_all(guards, lease, slot).await;
        return Err(Exit {
            code: exit::SLOT_LOST,
            message: format!("{what} while queued; the command was not started"),
        }
        .into());
    }

    info!(
        lease = lease.id(),
        rev = token,
        "{slot} acquired; starting the command"
    );
    let mut env = vec![
        ("CONCH_REV", token.to_string()),
        ("CONCH_LEASE", lease.id().to_string()),
    ];
    env.extend(revs);
    env.extend(spec.env.iter().cloned());
    let mut watchdog = match guard::Guard::start(spec.ttl, spec.kill_after) {
        Ok(g) => g,
        Err(e) => {
            release_all(guards, lease, slot).await;
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
            release_all(guards, lease, slot).await;
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
    // A hold limit: stop the command so that it is gone before the server ends the hold; the
    // guard is told too, in case conch itself is paused then.
    let hold_stop = guards
        .iter()
        .filter_map(Guard::hold_until)
        .min()
        .map(|until| hold_stop(until, spec.kill_after, Instant::now()));
    if let Some((term_at, grace)) = hold_stop {
        watchdog.cap(term_at + grace / 2);
    }
    watchdog.watch(pgid, *refreshed.borrow_and_update());

    enum End {
        Exited(std::process::ExitStatus),
        Lost(conch_client::LeaseLoss),
        Gone(String),
        HoldLimit(Duration),
        Stopped(Signal),
        HandOver(String),
        Pushed(conch_client::Lost),
    }
    let end = {
        // One future for the whole run, so the checks keep their pace whatever else wakes the
        // loop.
        let gone = target.lost(client, token, refresh_interval(spec.ttl));
        tokio::pin!(gone);
        let preferred = target.preferred(client, refresh_interval(spec.ttl));
        tokio::pin!(preferred);
        // The loss pushed by the cluster, at once; the refreshes and the checks above are the
        // fallback when no node can push it.
        let held: Vec<Held> = guards.iter().map(|g| g.held().clone()).collect();
        let pushed = client.lease_lost(namespace, lease.id(), target.lease_kind(), &held);
        tokio::pin!(pushed);
        let mut pushing = true;
        let (term_at, grace) = hold_stop.unwrap_or((Instant::now(), spec.kill_after));
        let limit = tokio::time::sleep_until(term_at.into());
        tokio::pin!(limit);
        loop {
            tokio::select! {
                status = child.wait() => break End::Exited(status.context("wait for the command")?),
                sig = signals.recv() => {
                    if target.stops_on(sig) {
                        break End::Stopped(sig);
                    }
                    child::signal_group(pgid, sig);
                }
                loss = lease.lost() => break End::Lost(loss),
                what = &mut gone => break End::Gone(what),
                to = &mut preferred => break End::HandOver(to),
                () = &mut limit, if hold_stop.is_some() => break End::HoldLimit(grace),
                lost = &mut pushed, if pushing => match lost {
                    Ok(lost) => break End::Pushed(lost),
                    Err(e) => {
                        pushing = false;
                        debug!(error = %e, "losses are not pushed; relying on refreshes");
                    }
                },
                Ok(()) = refreshed.changed() => watchdog.renew(*refreshed.borrow_and_update()),
            }
        }
    };
    if watchdog.fired() {
        // conch did not run while the lease ran out (stopped, or stuck): the guard sent SIGTERM
        // and sends SIGKILL after --kill-after; conch sees the group gone, or finishes the job.
        eprintln!(
            "conch: {slot} lost while conch was paused (lease {} not refreshed in time); the command was stopped (SIGTERM, SIGKILL after {})",
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
            release_all(guards, lease, slot).await;
            Ok(ExitCode::from(exit::code_for_status(status)))
        }
        End::Lost(loss) => {
            // A lease the server no longer knows may have been revoked by an administrator:
            // the audit trail says who and why.
            let revoked = match loss {
                conch_client::LeaseLoss::NotFound { .. } => {
                    crate::revoke::revoked(client, &spec.namespace, lease.id()).await
                }
                conch_client::LeaseLoss::NoRefresh { .. } => None,
            };
            let lost = format!("{slot} lost while running (lease {}: {loss})", lease.id());
            eprintln!(
                "{}",
                losing_line(slot, revoked.as_ref(), lost, spec.kill_after)
            );
            stop_command(
                &mut child,
                pgid,
                spec.kill_after,
                signals,
                watchdog,
                "lease lost",
            )
            .await?;
            guards.into_iter().for_each(Guard::forget);
            // The command is gone. A lease the server no longer knows needs no revoke; one that
            // could not be refreshed gets one quick, silent try (the cluster was unreachable a
            // moment ago), so the next holder may get in before the TTL. Either way conch exits
            // now, having said one line.
            if matches!(loss, conch_client::LeaseLoss::NoRefresh { .. }) {
                let _ = tokio::time::timeout(LAST_REVOKE_TRY, lease.revoke()).await;
            }
            Ok(ExitCode::from(match revoked {
                Some(_) => exit::REVOKED,
                None => exit::SLOT_LOST,
            }))
        }
        End::HoldLimit(grace) => {
            eprintln!(
                "conch: {slot} reaches its hold limit; stopping the command (SIGTERM, SIGKILL after {})",
                format_duration(grace)
            );
            stop_command(&mut child, pgid, grace, signals, watchdog, "hold limit").await?;
            release_all(guards, lease, slot).await;
            Ok(ExitCode::from(exit::HOLD_LIMIT))
        }
        End::Pushed(lost) => {
            // A revoked lease may have been an administrator's revoke: the audit trail says who
            // and why.
            let revoked = match lost.cause {
                LossCause::Revoked | LossCause::Gone
                    if lost.semaphore.is_none() && lost.lock.is_none() =>
                {
                    crate::revoke::revoked(client, &spec.namespace, lease.id()).await
                }
                _ => None,
            };
            let said = format!(
                "{slot} lost while running ({}): {}",
                lost.cause_name(),
                lost.reason
            );
            eprintln!(
                "{}",
                losing_line(slot, revoked.as_ref(), said, spec.kill_after)
            );
            stop_command(
                &mut child,
                pgid,
                spec.kill_after,
                signals,
                watchdog,
                "pushed loss",
            )
            .await?;
            let code = match (lost.cause, &revoked) {
                (_, Some(_)) => exit::REVOKED,
                (LossCause::HoldLimit, None) => exit::HOLD_LIMIT,
                _ => exit::SLOT_LOST,
            };
            if lost.semaphore.is_some() || lost.lock.is_some() {
                // One hold ended; the lease lives on: revoking it gives back whatever else it
                // holds.
                release_all(guards, lease, slot).await;
            } else {
                // The lease is gone: nothing to give back.
                guards.into_iter().for_each(Guard::forget);
            }
            Ok(ExitCode::from(code))
        }
        End::Stopped(sig) => {
            eprintln!(
                "conch: {sig}: stopping the command (SIGKILL after {}), then giving back the {slot}",
                format_duration(spec.kill_after)
            );
            watchdog.stopping();
            child::signal_group(pgid, sig);
            let status = child::finish_stopping(&mut child, pgid, spec.kill_after, signals)
                .await
                .context("stop the command")?;
            debug!(?status, "command stopped on a signal");
            watchdog.finish().await;
            release_all(guards, lease, slot).await;
            Ok(ExitCode::from(exit::code_for_status(status)))
        }
        End::HandOver(to) => {
            eprintln!(
                "conch: {to} is preferred; stopping the command (SIGTERM, SIGKILL after {}) and handing the {slot} over",
                format_duration(spec.kill_after)
            );
            stop_command(
                &mut child,
                pgid,
                spec.kill_after,
                signals,
                watchdog,
                "hand-over",
            )
            .await?;
            release_all(guards, lease, slot).await;
            Err(HandedOver { to }.into())
        }
        End::Gone(what) => {
            // A hold dropped by an administrator's revoke (a lock's check may see it before
            // the lease's refresh does): the audit trail says who and why.
            let revoked = crate::revoke::revoked(client, &spec.namespace, lease.id()).await;
            match &revoked {
                Some(record) => eprintln!(
                    "conch: {}; stopping the command (SIGTERM, SIGKILL after {})",
                    crate::revoke::revoked_line(slot, record),
                    format_duration(spec.kill_after)
                ),
                None => eprintln!(
                    "conch: {what} while held; stopping the command (SIGTERM, SIGKILL after {})",
                    format_duration(spec.kill_after)
                ),
            }
            stop_command(
                &mut child,
                pgid,
                spec.kill_after,
                signals,
                watchdog,
                "hold gone",
            )
            .await?;
            // The lease is still alive: revoking it gives back whatever else it holds.
            release_all(guards, lease, slot).await;
            Ok(ExitCode::from(match revoked {
                Some(_) => exit::REVOKED,
                None => exit::SLOT_LOST,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_limit_leaves_the_command_most_of_its_hold() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // A long hold: SIGTERM kill_after + 1 s before the end, the whole grace.
        assert_eq!(hold_stop(now + s(3600), s(5), now), (now + s(3594), s(5)));
        // A minute: the window is a tenth of it, 6 s: still the whole grace.
        assert_eq!(hold_stop(now + s(60), s(5), now), (now + s(54), s(5)));
        // 10 s: the command runs 9 s; SIGKILL half a second before the end.
        assert_eq!(hold_stop(now + s(10), s(5), now), (now + s(9), ms(500)));
        // 30 s: a 3 s window, SIGKILL a second before the end.
        assert_eq!(hold_stop(now + s(30), s(5), now), (now + s(27), s(2)));
        // A short grace needs no more than itself and the margin.
        assert_eq!(hold_stop(now + s(100), s(1), now), (now + s(98), s(1)));
        // Shorter than 10 s: a window of 1 s.
        assert_eq!(hold_stop(now + s(4), s(5), now), (now + s(3), ms(500)));
        // Already at the end: stop at once with no grace.
        assert_eq!(hold_stop(now, s(5), now), (now, Duration::ZERO));
        // For every hold of 10 s or more the command gets at least 90 % of it.
        for secs in [10, 11, 15, 20, 45, 61, 300, 7200] {
            for kill_after in [s(0), s(1), s(5), s(60)] {
                let (term_at, grace) = hold_stop(now + s(secs), kill_after, now);
                assert!(term_at - now >= s(secs) * 9 / 10, "{secs}s, {kill_after:?}");
                assert!(grace <= kill_after, "{secs}s, {kill_after:?}");
                assert!(
                    term_at + grace < now + s(secs),
                    "{secs}s: SIGKILL before the end"
                );
            }
        }
    }

    #[test]
    fn remaining_wait_counts_down_and_forever_stays_forever() {
        assert_eq!(remaining(None), None);
        let past = Instant::now() - Duration::from_secs(1);
        assert_eq!(remaining(Some(past)), Some(Duration::ZERO));
        let r = remaining(Some(Instant::now() + Duration::from_secs(10))).unwrap();
        assert!(r > Duration::from_secs(9) && r <= Duration::from_secs(10));
    }

    #[test]
    fn a_missing_namespace_says_who_may_make_it() {
        assert!(missing_namespace("conch").contains("creates it on first use"));
        assert!(missing_namespace("team-a").contains("conch namespace create team-a"));
    }
}

//! `conch sema <name> --max N -- cmd…`: hold one of N cluster-wide slots while `cmd` runs.
//!
//! The run itself is [`crate::runner::hold`], shared with `conch elect` and `conch lock`;
//! what is particular to `conch sema` is [`SemaTarget`]:
//!
//! - make sure `<ns>/<name>.<N>` exists (and, with `--spread`, `<ns>/<name>.<N>.host-<h>`),
//!   `<ns>` being `--namespace` (default `conch`). A semaphore that exists with other permits
//!   than N (changed through the API) is refused (exit 70);
//! - queue for one permit of each (the host semaphore first, with the same lease and what is
//!   left of the same wait);
//! - while the command runs, the semaphore is watched ([`crate::watch`]): deleted or resized,
//!   the slot is lost (exit 79).
//!
//! With `--and` (members beyond the first), every member's `<ns>/<name>.<N>` is made sure of,
//! taken all at once or not at all in one all-or-none acquire ([`Client::acquire_all`]), and
//! watched; the command sees the first member's token as `CONCH_REV` and every member's as
//! `CONCH_REVS=name=token,...`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conch_client::sema;
use conch_client::{Client, Guard, Lease, LeaseKind, format_duration};

use crate::child::Signals;
use crate::cli::{Member, SemaArgs};
use crate::exit::{self, Exit};
use crate::identity::Identity;
use crate::runner::{Spec, Target, hold, remaining, setup_error};
use crate::status::{self, Standing};
use crate::watch::Held;

/// The semaphores one run takes, in order: the per-host one (`--spread`), then the main one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub main: String,
    /// The permits taken of `main` (`--weight`, default 1); the per-host one takes 1.
    pub weight: u64,
    pub host: Option<String>,
    /// All or none (`--and`): every member, the first being `main`; empty for one semaphore.
    pub set: Vec<SetSlot>,
}

/// One member of an all-or-none run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetSlot {
    /// As given (`gpu`), for `CONCH_REVS` and messages.
    pub name: String,
    /// The semaphore (`gpu.1`).
    pub semaphore: String,
    pub max: u64,
    pub weight: u64,
}

impl Plan {
    /// The plan of the members of a run: one semaphore, or (more than one) an all-or-none set.
    pub(crate) fn of_members(members: &[Member], spread: bool, host: &str) -> Result<Plan, String> {
        let first = members
            .first()
            .ok_or_else(|| "no semaphore to take".to_string())?;
        let mut plan = Plan::new(&first.name, first.max, spread, host)?;
        plan.weight = first.weight.max(1);
        if members.len() > 1 {
            plan.set = members
                .iter()
                .map(|m| {
                    Ok(SetSlot {
                        name: m.name.clone(),
                        semaphore: sema::semaphore_name(&m.name, m.max)?,
                        max: m.max,
                        weight: m.weight,
                    })
                })
                .collect::<Result<_, String>>()?;
        }
        Ok(plan)
    }
}

impl Plan {
    pub(crate) fn new(name: &str, max: u64, spread: bool, host: &str) -> Result<Plan, String> {
        Ok(Plan {
            main: sema::semaphore_name(name, max)?,
            weight: 1,
            host: if spread {
                Some(sema::spread_semaphore_name(name, max, host)?)
            } else {
                None
            },
            set: Vec::new(),
        })
    }
}

/// The slots of a `conch sema` (or `conch elect`) run: the plan's semaphores, each with one
/// permit, all taken with one lease.
pub(crate) struct SemaTarget {
    pub plan: Plan,
    /// Permits of the main semaphore.
    pub permits: u64,
    /// What is wanted, in "no … within": `slot in video-encode[2]`, `leadership of billing`.
    pub wanted: String,
    /// The message when there is none to take at once.
    pub busy: String,
    /// The main semaphore as read when conch queued (set by `prepare`).
    held: Option<Held>,
    /// Every member of an all-or-none set as read when conch queued (set by `prepare`).
    held_set: Vec<Held>,
    namespace: String,
    /// The hold limit asked for (`--max-hold`).
    pub max_hold: Option<Duration>,
    /// `conch sema NAME`: warn once, before queueing, when NAME is held or awaited with
    /// another `--max`.
    pub warn_other_max: Option<String>,
}

impl SemaTarget {
    pub(crate) fn new(plan: Plan, permits: u64, wanted: String, busy: String) -> SemaTarget {
        SemaTarget {
            plan,
            permits,
            wanted,
            busy,
            held: None,
            held_set: Vec::new(),
            namespace: String::new(),
            warn_other_max: None,
            max_hold: None,
        }
    }

    fn held(&self) -> conch_client::Result<&Held> {
        self.held
            .as_ref()
            .ok_or_else(|| conch_client::Error::Protocol {
                op: "check semaphore",
                message: "the semaphore was not read before queueing".to_string(),
            })
    }
}

impl Target for SemaTarget {
    fn lease_kind(&self) -> LeaseKind {
        LeaseKind::Semaphore
    }

    async fn prepare(&mut self, client: &Client, namespace: &str) -> anyhow::Result<()> {
        self.namespace = namespace.to_string();
        self.held = Some(ensure_semaphores(client, namespace, &self.plan, self.permits).await?);
        if let Some(name) = self.warn_other_max.take() {
            // A mistyped --max is loud: the same name held or awaited with another capacity.
            // Best effort: a failure to look changes nothing about the run.
            match crate::who::busy_other_capacities(client, namespace, &name, self.permits).await {
                Ok(busy) => {
                    if let Some(line) =
                        crate::who::other_capacities_warning(&name, self.permits, &busy)
                    {
                        eprintln!("{line}");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not look for other capacities"),
            }
        }
        self.held_set.clear();
        for slot in self.plan.set.iter().skip(1) {
            let member = Plan::new(&slot.name, slot.max, false, "")
                .map_err(|e| exit::usage(e.to_string()))?;
            self.held_set
                .push(ensure_semaphores(client, namespace, &member, slot.max).await?);
        }
        Ok(())
    }

    async fn take(
        &self,
        client: &Client,
        lease: &Lease,
        namespace: &str,
        deadline: Option<Instant>,
        metadata: &HashMap<String, String>,
    ) -> conch_client::Result<Option<Vec<Guard>>> {
        take_slots(
            client,
            lease,
            namespace,
            &self.plan,
            deadline,
            metadata,
            self.max_hold,
        )
        .await
    }

    fn not_taken(&self, wait: Option<Duration>) -> String {
        let wanted = &self.wanted;
        match wait {
            Some(w) if w.is_zero() => self.busy.clone(),
            Some(w) => format!("no {wanted} within {}", format_duration(w)),
            None => format!("no {wanted}"),
        }
    }

    async fn check(&self, client: &Client, _token: u64) -> conch_client::Result<Option<String>> {
        let held = self.held()?;
        for held in std::iter::once(held).chain(&self.held_set) {
            if let Some(change) = held.check(client).await? {
                return Ok(Some(held.describe(&change)));
            }
        }
        Ok(None)
    }

    async fn lost(&self, client: &Client, _token: u64, every: Duration) -> String {
        let Ok(held) = self.held() else {
            // Cannot happen (`prepare` ran); never resolving leaves the lease in charge.
            return std::future::pending().await;
        };
        if self.held_set.is_empty() {
            return held.describe(&held.changed(client, every).await);
        }
        // Every member, read in turn every `every`.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for held in std::iter::once(held).chain(&self.held_set) {
                if let Ok(Some(change)) = held.check(client).await {
                    return held.describe(&change);
                }
            }
        }
    }

    fn revs(&self, guards: &[Guard]) -> (u64, Vec<(&'static str, String)>) {
        if self.plan.set.is_empty() {
            return (guards.last().map_or(0, Guard::fencing_token), Vec::new());
        }
        let revs: Vec<String> = self
            .plan
            .set
            .iter()
            .zip(guards)
            .map(|(slot, g)| format!("{}={}", slot.name, g.fencing_token()))
            .collect();
        (
            guards.first().map_or(0, Guard::fencing_token),
            vec![("CONCH_REVS", revs.join(","))],
        )
    }

    async fn standing(&self, client: &Client, lease_id: &str) -> Option<Standing> {
        status::semaphore_standing(client, &self.namespace, &self.plan.main, lease_id).await
    }
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
        Err(e) => {
            let what = format!("semaphore {namespace}/{}", plan.main);
            return Err(setup_error(client, namespace, &what, e).await);
        }
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
        let what = format!("semaphore {namespace}/{host}");
        return Err(setup_error(client, namespace, &what, e).await);
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
    max_hold: Option<Duration>,
) -> conch_client::Result<Option<Vec<Guard>>> {
    if !plan.set.is_empty() {
        let members: Vec<(&str, u64)> = plan
            .set
            .iter()
            .map(|slot| (slot.semaphore.as_str(), slot.weight))
            .collect();
        let wait = remaining(deadline);
        return client
            .acquire_all_limited(lease, namespace, &members, wait, metadata.clone(), max_hold)
            .await;
    }
    let mut guards = Vec::new();
    let slots = plan
        .host
        .iter()
        .map(|host| (host, 1))
        .chain(std::iter::once((&plan.main, plan.weight)));
    for (sem, weight) in slots {
        let wait = remaining(deadline);
        match client
            .acquire_limited(
                lease,
                namespace,
                sem,
                weight,
                wait,
                metadata.clone(),
                max_hold,
            )
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

pub(crate) async fn run(
    client: &Client,
    args: &SemaArgs,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let me = Identity::current(&args.command);
    let plan = Plan::of_members(&args.members, args.spread, &me.host).map_err(exit::usage)?;
    // `gpu[1]`, or for a set `gpu[1]+licences[3]x2`.
    let label = args
        .members
        .iter()
        .map(|m| match m.weight {
            1 => format!("{}[{}]", m.name, m.max),
            w => format!("{}[{}]x{w}", m.name, m.max),
        })
        .collect::<Vec<_>>()
        .join("+");
    let busy = format!(
        "no free slot in {label} ({}{})",
        if plan.set.is_empty() {
            "all taken"
        } else {
            "not all members free at once"
        },
        if args.spread {
            " or this host already holds one"
        } else {
            ""
        }
    );
    let mut target = SemaTarget::new(plan, args.first_max(), format!("slot in {label}"), busy);
    target.max_hold = args.max_hold;
    target.warn_other_max = Some(args.name.clone());
    let spec = Spec {
        namespace: args.namespace.clone(),
        ttl: args.ttl,
        kill_after: args.kill_after,
        wait: args.wait_bound(),
        command: &args.command,
        metadata: me.metadata(),
        me,
        env: Vec::new(),
        label,
        slot: "slot",
    };
    hold(client, &spec, &mut target, signals).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::hostname;
    use conch_client::sema::{META_CMD, META_HOST, META_PID, META_SINCE};

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
                weight: 1,
                host: None,
                set: Vec::new(),
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
}

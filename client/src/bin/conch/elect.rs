//! `conch elect <name> -- cmd…`: run `cmd` only while this candidate leads; `--who` shows the
//! leader and the candidates; `--observe` follows the leader.
//!
//! An election is a 1-permit semaphore `<name>.elect` in the namespace `conch`, or
//! `--namespace` (see
//! [`conch_client::elect`]). A candidate is a `conch sema` run on it: the same lease, FIFO queue,
//! refresh, self-fencing and guard ([`crate::runner::hold`]), with the candidate's `--value` in the
//! lease and acquire metadata and in the command's environment as `CONCH_LEADER_VALUE`.
//!
//! Hand-over: SIGTERM or SIGINT to a leader's conch stops the command (SIGKILL after
//! `--kill-after`) and revokes the lease at once, so the next candidate starts without waiting
//! for the TTL. With `--priority`, a leader that sees a candidate of higher priority waiting
//! (read every third of the TTL) stops its command, hands over, and stands again; a candidate
//! granted leadership while one of higher priority waits gives it back before its command
//! starts (see [`conch_client::elect::preferred`]).
//!
//! `--observe` also says how a leader went (resigned, expired, revoked by an administrator, hold
//! limit, deleted) when the answering node saw it go during the wait: a loss of the leader's
//! lease is watched on the server, and none means it let go.
//!
//! `--observe` asks the server to wait until the leader differs from the one it knows
//! (`WaitHolderChange`), prints a line, and asks again: no polling, and the client library
//! fails over between endpoints. Changes closer together than one round trip show as one.
//!
//! ```text
//! billing LEADER    value=10.0.0.2:8080 node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812
//! billing CANDIDATE value=10.0.0.3:8080 node3 pid=991  since=2026-06-12T10:15:04Z position=0
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conch_client::elect::{self, HolderChange, HolderEnd, META_PRIORITY, META_VALUE};
use conch_client::proto::grackle::SemaphoreHolder;
use conch_client::sema::MAX_META_VALUE_LEN;
use conch_client::{Client, Error, Guard, Lease, LeaseKind};
use nix::sys::signal::Signal;
use serde::Serialize;

use crate::child::Signals;
use crate::cli::ElectArgs;
use crate::exit;
use crate::identity::Identity;
use crate::runner::{HandedOver, Spec, Target, hold};
use crate::sema::{Plan, SemaTarget};
use crate::status::Standing;
use crate::timefmt::now_rfc3339;
use crate::who::{self, Entry};

/// How long one `WaitHolderChange` call waits before `--observe` asks again.
const OBSERVE_WAIT: Duration = Duration::from_secs(30);

/// Pause before asking again after no node answered, while observing.
const OBSERVE_RETRY: Duration = Duration::from_secs(1);

/// Stands as a candidate and runs the command while leader.
pub(crate) async fn run(
    client: &Client,
    args: &ElectArgs,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let semaphore = elect::semaphore_name(&args.name).map_err(exit::usage)?;
    let me = Identity::current(&args.command);
    let value = args.value.clone().unwrap_or_else(|| me.host.clone());
    if value.len() > MAX_META_VALUE_LEN {
        return Err(exit::usage(format!(
            "--value is {} bytes long; at most {MAX_META_VALUE_LEN} are allowed",
            value.len()
        )));
    }
    let mut metadata = me.metadata();
    metadata.insert(META_VALUE.to_string(), value.clone());
    if args.priority > 0 {
        metadata.insert(META_PRIORITY.to_string(), args.priority.to_string());
    }
    let mut target = ElectTarget {
        slots: SemaTarget::new(
            Plan {
                main: semaphore.clone(),
                weight: 1,
                host: None,
                set: Vec::new(),
            },
            1,
            format!("leadership of {}", args.name),
            format!("not leader of {} (another candidate leads)", args.name),
        ),
        semaphore,
        namespace: args.namespace.clone(),
        priority: args.priority,
    };
    let spec = Spec {
        namespace: args.namespace.clone(),
        ttl: args.ttl,
        kill_after: args.kill_after,
        wait: args.wait.and_then(|w| w.0),
        command: &args.command,
        me,
        metadata,
        env: vec![("CONCH_LEADER_VALUE", value)],
        label: format!("election {}", args.name),
        slot: "leadership",
    };
    // A leader that handed over to a preferred candidate stands again, behind it.
    loop {
        match hold(client, &spec, &mut target, signals).await {
            Err(e) if e.is::<HandedOver>() => {
                eprintln!("conch: {e}; standing as a candidate of {} again", args.name);
            }
            done => return done,
        }
    }
}

/// A candidate: the 1-permit semaphore of `conch sema`, plus the hand-over to candidates of a
/// higher `--priority`.
struct ElectTarget {
    slots: SemaTarget,
    semaphore: String,
    namespace: String,
    priority: u32,
}

impl ElectTarget {
    /// The waiting candidate this one should hand leadership to, in words (`None`: none, or the
    /// queue cannot be read now: leadership stays).
    async fn waiting_preferred(&self, client: &Client) -> Option<String> {
        let queue = client
            .list_waiters(&self.namespace, &self.semaphore)
            .await
            .ok()?;
        elect::preferred(&queue.waiters, self.priority).map(|w| {
            let value = w.metadata.get(META_VALUE).map_or("?", String::as_str);
            format!(
                "candidate {value} (priority {})",
                elect::priority_of(&w.metadata)
            )
        })
    }
}

impl Target for ElectTarget {
    fn lease_kind(&self) -> LeaseKind {
        self.slots.lease_kind()
    }

    async fn prepare(&mut self, client: &Client, namespace: &str) -> anyhow::Result<()> {
        self.slots.prepare(client, namespace).await
    }

    /// Takes leadership; granted while a preferred candidate waits, gives it back at once (the
    /// command never starts) and queues again behind that candidate.
    async fn take(
        &self,
        client: &Client,
        lease: &Lease,
        namespace: &str,
        deadline: Option<Instant>,
        metadata: &HashMap<String, String>,
    ) -> conch_client::Result<Option<Vec<Guard>>> {
        loop {
            let Some(guards) = self
                .slots
                .take(client, lease, namespace, deadline, metadata)
                .await?
            else {
                return Ok(None);
            };
            let Some(to) = self.waiting_preferred(client).await else {
                return Ok(Some(guards));
            };
            eprintln!("conch: {to} is preferred; letting it lead first");
            for guard in guards {
                guard.release().await?;
            }
        }
    }

    fn not_taken(&self, wait: Option<Duration>) -> String {
        self.slots.not_taken(wait)
    }

    async fn check(&self, client: &Client, token: u64) -> conch_client::Result<Option<String>> {
        self.slots.check(client, token).await
    }

    async fn lost(&self, client: &Client, token: u64, every: Duration) -> String {
        self.slots.lost(client, token, every).await
    }

    async fn standing(&self, client: &Client, lease_id: &str) -> Option<Standing> {
        self.slots.standing(client, lease_id).await
    }

    async fn preferred(&self, client: &Client, every: Duration) -> String {
        loop {
            tokio::time::sleep(every).await;
            if let Some(to) = self.waiting_preferred(client).await {
                return to;
            }
        }
    }

    fn stops_on(&self, sig: Signal) -> bool {
        matches!(sig, Signal::SIGTERM | Signal::SIGINT)
    }
}

/// What `--who --json` prints.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Election {
    pub name: String,
    pub namespace: String,
    pub semaphore: String,
    pub leader: Option<Entry>,
    /// In the order they would take over.
    pub candidates: Vec<Entry>,
}

/// The `--who` lines: the leader, then the candidates.
pub(crate) fn render_lines(e: &Election) -> Vec<String> {
    let all: Vec<&Entry> = e.leader.iter().chain(&e.candidates).collect();
    let value = |x: &Entry| x.value.clone().unwrap_or_else(|| "?".to_string());
    let host = |x: &Entry| x.host.clone().unwrap_or_else(|| "?".to_string());
    let pid = |x: &Entry| x.pid.map_or_else(|| "?".to_string(), |p| p.to_string());
    let value_w = all.iter().map(|x| value(x).len()).max().unwrap_or(0);
    let host_w = all.iter().map(|x| host(x).len()).max().unwrap_or(0);
    let pid_w = all.iter().map(|x| pid(x).len()).max().unwrap_or(0);
    let line = |state: &str, x: &Entry, tail: String| {
        format!(
            "{} {state:<9} value={:<value_w$} {:<host_w$} pid={:<pid_w$} since={} {tail}",
            e.name,
            value(x),
            host(x),
            pid(x),
            x.since.as_deref().unwrap_or("?"),
        )
    };
    e.leader
        .iter()
        .map(|l| {
            let rev = l.rev.map_or_else(|| "-".to_string(), |r| r.to_string());
            let mut tail = format!("rev={rev}");
            if let Some(p) = l.priority.filter(|p| *p > 0) {
                tail.push_str(&format!(" priority={p}"));
            }
            line("LEADER", l, tail)
        })
        .chain(e.candidates.iter().enumerate().map(|(i, c)| {
            let mut tail = format!("position={}", c.position.unwrap_or(i as u64));
            if let Some(p) = c.priority.filter(|p| *p > 0) {
                tail.push_str(&format!(" priority={p}"));
            }
            line("CANDIDATE", c, tail)
        }))
        .collect()
}

/// `--who`: exit 0 if there is a leader, 1 if there is none.
pub(crate) async fn who(client: &Client, args: &ElectArgs) -> anyhow::Result<ExitCode> {
    let semaphore = elect::semaphore_name(&args.name).map_err(exit::usage)?;
    let found = who::gather(client, &args.namespace, &args.name, 1, &semaphore).await?;
    let election = Election {
        name: args.name.clone(),
        namespace: args.namespace.clone(),
        semaphore,
        leader: found.holders.into_iter().next(),
        candidates: found.waiters,
    };
    if args.json {
        crate::print_lines([serde_json::to_string_pretty(&election)?])?;
    } else {
        let mut lines = render_lines(&election);
        if lines.is_empty() {
            lines.push(format!("{} no leader", election.name));
        }
        crate::print_lines(lines)?;
    }
    // Exit 0 with a leader or without: the question was answered.
    Ok(ExitCode::SUCCESS)
}

/// One `--observe` record: a new leader (or none), or how the leader went.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Change {
    /// When conch saw the change (RFC 3339).
    pub time: String,
    /// `leader` (a leader, or `leader: false` for nobody), or how the previous leader went:
    /// `resigned`, `expired`, `revoked`, `hold-limit`, `deleted`.
    pub event: &'static str,
    /// Departures: what ended the leadership, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// `false`: nobody leads.
    pub leader: bool,
    pub value: Option<String>,
    pub host: Option<String>,
    pub pid: Option<u32>,
    /// The leader's fencing token (`CONCH_REV`).
    pub rev: Option<u64>,
    pub lease_id: Option<String>,
}

impl Change {
    pub(crate) fn new(time: String, leader: Option<&SemaphoreHolder>) -> Change {
        let entry = leader.map(who::holder_entry);
        Change {
            time,
            event: "leader",
            cause: None,
            leader: entry.is_some(),
            value: entry.as_ref().and_then(|e| e.value.clone()),
            host: entry.as_ref().and_then(|e| e.host.clone()),
            pid: entry.as_ref().and_then(|e| e.pid),
            rev: entry.as_ref().and_then(|e| e.rev),
            lease_id: entry.and_then(|e| e.lease_id),
        }
    }

    /// How the leader `gone` (a `leader` record) went, if `ended` says: a departure record with
    /// its value, host, pid, fencing token and lease.
    pub(crate) fn departure(
        time: String,
        gone: &Change,
        ended: HolderEnd,
        reason: &str,
    ) -> Option<Change> {
        let (event, cause) = match ended {
            HolderEnd::Unknown => return None,
            HolderEnd::Released => ("resigned", "released".to_string()),
            HolderEnd::LeaseRevoked => ("resigned", "lease revoked".to_string()),
            HolderEnd::Expired => ("expired", "lease not refreshed within its TTL".to_string()),
            HolderEnd::HoldLimit => ("hold-limit", "the hold limit was reached".to_string()),
            HolderEnd::Deleted => (
                "deleted",
                "the election's semaphore was deleted".to_string(),
            ),
            HolderEnd::RevokedByAdmin if reason.is_empty() => {
                ("revoked", "revoked by an administrator".to_string())
            }
            HolderEnd::RevokedByAdmin => {
                ("revoked", format!("revoked by an administrator: {reason}"))
            }
        };
        Some(Change {
            time,
            event,
            cause: Some(cause),
            leader: false,
            value: gone.value.clone(),
            host: gone.host.clone(),
            pid: gone.pid,
            rev: gone.rev,
            lease_id: gone.lease_id.clone(),
        })
    }

    /// The text line: `<time> leader=<value> host=<h> pid=<p> rev=<token>`, `<time> no leader`,
    /// or for a departure `<time> <event> leader=<value> host=<h> pid=<p> rev=<token> (<cause>)`.
    pub(crate) fn line(&self) -> String {
        let or_q = |s: &Option<String>| s.clone().unwrap_or_else(|| "?".to_string());
        let who = format!(
            "leader={} host={} pid={} rev={}",
            or_q(&self.value),
            or_q(&self.host),
            self.pid.map_or_else(|| "?".to_string(), |p| p.to_string()),
            self.rev.map_or_else(|| "?".to_string(), |r| r.to_string()),
        );
        match (&self.cause, self.leader) {
            (Some(cause), _) => format!("{} {} {who} ({cause})", self.time, self.event),
            (None, true) => format!("{} {who}", self.time),
            (None, false) => format!("{} no leader", self.time),
        }
    }
}

/// Writes one line to stdout; `false` once the reader went away.
fn emit(line: &str) -> std::io::Result<bool> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether an error means "no node answered now" (keep observing) rather than a refusal.
fn transient(e: &Error) -> bool {
    matches!(e, Error::Unavailable { .. } | Error::Timeout { .. })
}

/// `--observe`: the current leader, then one line per change, until interrupted (or stdout
/// closes: exit 0).
pub(crate) async fn observe(client: &Client, args: &ElectArgs) -> anyhow::Result<ExitCode> {
    let semaphore = elect::semaphore_name(&args.name).map_err(exit::usage)?;
    // `None` until the first answer, which is printed whatever it says.
    let mut known: Option<u64> = None;
    // The last record printed about who leads.
    let mut last: Option<Change> = None;
    let mut outage = false;
    loop {
        let wait = if known.is_some() {
            OBSERVE_WAIT
        } else {
            Duration::ZERO
        };
        let now: HolderChange = match client
            .wait_holder_change(&args.namespace, &semaphore, known.unwrap_or(0), wait)
            .await
        {
            Ok(now) => now,
            Err(e) if transient(&e) => {
                if !outage {
                    eprintln!("conch: {e}; still observing");
                    outage = true;
                }
                tokio::time::sleep(OBSERVE_RETRY).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        outage = false;
        if known == Some(now.token()) {
            continue;
        }
        known = Some(now.token());
        let time = now_rfc3339();
        let gone = last.as_ref().filter(|l| l.leader).and_then(|l| {
            Change::departure(time.clone(), l, now.known_ended, &now.known_ended_reason)
        });
        let change = Change::new(time, now.holders.first());
        for record in gone.iter().chain([&change]) {
            let text = if args.json {
                serde_json::to_string(record)?
            } else {
                record.line()
            };
            if !emit(&text)? {
                return Ok(ExitCode::SUCCESS);
            }
        }
        last = Some(change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn holder() -> SemaphoreHolder {
        let metadata: HashMap<String, String> = [
            ("host", "node2"),
            ("pid", "4242"),
            ("since", "2026-06-12T10:15:00Z"),
            ("value", "10.0.0.2:8080"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        SemaphoreHolder {
            lease_id: "ls_a".into(),
            weight: 1,
            metadata,
            fencing_token: 8812,
            ..Default::default()
        }
    }

    #[test]
    fn changes_render_as_lines_and_json() {
        let c = Change::new("2026-06-12T10:16:00Z".into(), Some(&holder()));
        assert_eq!(
            c.line(),
            "2026-06-12T10:16:00Z leader=10.0.0.2:8080 host=node2 pid=4242 rev=8812"
        );
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"time": "2026-06-12T10:16:00Z", "event": "leader",
                "leader": true, "value": "10.0.0.2:8080", "host": "node2", "pid": 4242,
                "rev": 8812, "lease_id": "ls_a"})
        );
        let none = Change::new("2026-06-12T10:17:00Z".into(), None);
        assert_eq!(none.line(), "2026-06-12T10:17:00Z no leader");
        assert_eq!(serde_json::to_value(&none).unwrap()["leader"], false);

        let t = || "2026-06-12T10:17:00Z".to_string();
        assert_eq!(Change::departure(t(), &c, HolderEnd::Unknown, ""), None);
        let resigned = Change::departure(t(), &c, HolderEnd::LeaseRevoked, "").unwrap();
        assert_eq!(
            resigned.line(),
            "2026-06-12T10:17:00Z resigned leader=10.0.0.2:8080 host=node2 pid=4242 rev=8812 (lease revoked)"
        );
        let revoked =
            Change::departure(t(), &c, HolderEnd::RevokedByAdmin, "stuck for 3h").unwrap();
        assert_eq!(
            serde_json::to_value(&revoked).unwrap(),
            serde_json::json!({"time": "2026-06-12T10:17:00Z", "event": "revoked",
                "cause": "revoked by an administrator: stuck for 3h", "leader": false,
                "value": "10.0.0.2:8080", "host": "node2", "pid": 4242, "rev": 8812,
                "lease_id": "ls_a"})
        );
        for (end, event) in [
            (HolderEnd::Released, "resigned"),
            (HolderEnd::Expired, "expired"),
            (HolderEnd::HoldLimit, "hold-limit"),
            (HolderEnd::Deleted, "deleted"),
            (HolderEnd::RevokedByAdmin, "revoked"),
        ] {
            let d = Change::departure(t(), &c, end, "").unwrap();
            assert_eq!(d.event, event, "{end:?}");
            assert!(
                d.line().contains(&format!(" {event} leader=")),
                "{}",
                d.line()
            );
        }
    }

    #[test]
    fn who_lines_show_leader_then_candidates() {
        let mut candidate = who::holder_entry(&holder());
        candidate.rev = None;
        candidate.position = Some(0);
        candidate.value = Some("b".into());
        candidate.pid = Some(7);
        candidate.priority = Some(3);
        let e = Election {
            name: "billing".into(),
            namespace: "conch".into(),
            semaphore: "billing.elect".into(),
            leader: Some(who::holder_entry(&holder())),
            candidates: vec![candidate],
        };
        assert_eq!(
            render_lines(&e),
            [
                "billing LEADER    value=10.0.0.2:8080 node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812",
                "billing CANDIDATE value=b             node2 pid=7    since=2026-06-12T10:15:00Z position=0 priority=3",
            ]
        );
    }
}

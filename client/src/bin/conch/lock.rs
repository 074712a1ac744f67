//! `conch lock <path> [--shared] -- cmd…`: hold a hierarchical lock while `cmd` runs;
//! `--who` shows who holds and who waits.
//!
//! A lock is a `/`-separated path in the namespace `conch` (or `--namespace`), held exclusive
//! (the default) or `--shared` through a lock lease. An exclusive hold conflicts with every hold
//! of another lease on the same path, its ancestors and its descendants; a shared hold only
//! with exclusive ones there. The run is [`crate::runner::hold`], the one `conch sema` uses,
//! with [`LockTarget`]: no lock to create (a lock exists while held), only the namespace.
//!
//! While the command runs, conch reads the lock about every TTL/3 and checks that its grant (by
//! fencing token) still holds it: `DeleteLock` drops every hold on a path while the lease lives
//! on, and a holder must not go on believing it holds. Gone: SIGTERM, SIGKILL after
//! `--kill-after`, exit 79.
//!
//! `--who` prints the holds on the path, its ancestors and descendants, then the queued
//! acquires there (`ListLockWaiters`), then what an acquire of the path would wait for now:
//!
//! ```text
//! a/b HELD exclusive node2 pid=4242 since=2026-06-12T10:15:00Z rev=17
//! a   WAIT exclusive node1 pid=1207 since=2026-06-12T10:15:09Z position=0
//! a: an exclusive acquire waits for descendant a/b
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conch_client::lock::{self, Blocked, LockOutcome, Relation};
use conch_client::proto::conch::LockWaiter;
use conch_client::proto::grackle::{ContentionReason, Lock, LockHolder, LockState};
use conch_client::sema::{META_CMD, META_HOST, META_PID, META_SINCE};
use conch_client::{Client, Guard, Lease, LeaseKind, format_duration};
use serde::Serialize;
use tracing::debug;

use crate::child::Signals;
use crate::cli::LockArgs;
use crate::exit;
use crate::identity::Identity;
use crate::runner::{Spec, Target, hold, remaining, setup_error};
use crate::status::{Standing, host_pid};
use crate::timefmt::format_unix_nanos;

fn mode(exclusive: bool) -> &'static str {
    if exclusive { "exclusive" } else { "shared" }
}

/// The lock of a `conch lock` run.
pub(crate) struct LockTarget {
    pub path: String,
    pub exclusive: bool,
    namespace: String,
    /// Why the last acquire did not get the lock.
    blocked: RefCell<Option<Blocked>>,
}

impl LockTarget {
    pub(crate) fn new(path: &str, exclusive: bool) -> LockTarget {
        LockTarget {
            path: path.to_string(),
            exclusive,
            namespace: String::new(),
            blocked: RefCell::new(None),
        }
    }

    /// Whether the lock as read (`None`: its namespace is gone) still has the grant `token`;
    /// if not, what happened.
    fn judge(&self, lock: Option<&Lock>, token: u64) -> Option<String> {
        if lock.is_some_and(|l| lock::holds(l, token)) {
            return None;
        }
        Some(format!(
            "the hold on lock {}/{} (rev {token}) was dropped (DeleteLock, or a release through \
             the API)",
            self.namespace, self.path
        ))
    }
}

impl Target for LockTarget {
    fn lease_kind(&self) -> LeaseKind {
        LeaseKind::Lock
    }

    async fn prepare(&mut self, client: &Client, namespace: &str) -> anyhow::Result<()> {
        self.namespace = namespace.to_string();
        match client.ensure_namespace(namespace).await {
            Ok(()) => Ok(()),
            Err(e) => {
                Err(setup_error(client, namespace, &format!("namespace {namespace}"), e).await)
            }
        }
    }

    async fn take(
        &self,
        client: &Client,
        lease: &Lease,
        namespace: &str,
        deadline: Option<Instant>,
        metadata: &HashMap<String, String>,
    ) -> conch_client::Result<Option<Vec<Guard>>> {
        let wait = remaining(deadline);
        match client
            .acquire_lock(
                lease,
                namespace,
                &self.path,
                self.exclusive,
                wait,
                metadata.clone(),
            )
            .await?
        {
            LockOutcome::Acquired(guard) => Ok(Some(vec![guard])),
            LockOutcome::Blocked(blocked) => {
                debug!(reason = blocked.reason_word(), "lock not acquired");
                *self.blocked.borrow_mut() = Some(blocked);
                Ok(None)
            }
        }
    }

    fn not_taken(&self, wait: Option<Duration>) -> String {
        let (path, mode) = (&self.path, mode(self.exclusive));
        let head = match wait {
            Some(w) if w.is_zero() => format!("lock {path} is busy ({mode} wanted)"),
            Some(w) => format!("no {mode} lock on {path} within {}", format_duration(w)),
            None => format!("no {mode} lock on {path}"),
        };
        match &*self.blocked.borrow() {
            Some(b) => format!("{head}: {}", b.describe()),
            None => head,
        }
    }

    async fn check(&self, client: &Client, token: u64) -> conch_client::Result<Option<String>> {
        match client.get_lock(&self.namespace, &self.path).await {
            Ok(lock) => Ok(self.judge(Some(&lock), token)),
            Err(e) if e.is_not_found() => Ok(self.judge(None, token)),
            Err(e) => Err(e),
        }
    }

    async fn lost(&self, client: &Client, token: u64, every: Duration) -> String {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.check(client, token).await {
                Ok(Some(what)) => return what,
                Ok(None) => {}
                // The lease's own keep-alive decides what an unreachable cluster means.
                Err(e) => debug!(error = %e, path = %self.path, "lock check failed"),
            }
        }
    }

    async fn standing(&self, client: &Client, lease_id: &str) -> Option<Standing> {
        let locks = client.list_locks(&self.namespace).await.ok()?;
        let waiters = client
            .list_lock_waiters(&self.namespace, &self.path)
            .await
            .ok()?;
        let position = waiters
            .iter()
            .position(|w| w.lease_id == lease_id && w.lock_name == self.path)
            .map(|i| i as u64);
        let (reason, blocking) = lock::conflicts(&self.path, self.exclusive, lease_id, &locks);
        let others: Vec<&str> = blocking
            .iter()
            .filter(|l| l.name != self.path)
            .map(|l| l.name.as_str())
            .collect();
        let blocked = match reason {
            ContentionReason::Ancestor | ContentionReason::Descendant if !others.is_empty() => {
                Some(format!(
                    "blocked by {} {}",
                    lock::reason_word(reason),
                    others.join(", ")
                ))
            }
            _ => None,
        };
        Some(Standing {
            position,
            queued: waiters.len(),
            blocked,
            holders: blocking
                .iter()
                .flat_map(|l| &l.lock_holders)
                .map(|h| {
                    let (host, pid) = host_pid(&h.metadata);
                    (host, pid, h.locked_at)
                })
                .collect(),
        })
    }
}

pub(crate) async fn run(
    client: &Client,
    args: &LockArgs,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let exclusive = !args.shared;
    let me = Identity::current(&args.command);
    let mut target = LockTarget::new(&args.path, exclusive);
    let spec = Spec {
        namespace: args.namespace.clone(),
        ttl: args.ttl,
        kill_after: args.kill_after,
        wait: args.wait_bound(),
        command: &args.command,
        metadata: me.metadata(),
        me,
        env: vec![
            ("CONCH_LOCK", args.path.clone()),
            ("CONCH_LOCK_MODE", mode(exclusive).to_string()),
        ],
        label: format!("lock {} ({})", args.path, mode(exclusive)),
        slot: "lock",
    };
    hold(client, &spec, &mut target, signals).await
}

// ---------------------------------------------------------------------------------------------
// --who
// ---------------------------------------------------------------------------------------------

/// What `--who --json` prints.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct LockWho {
    pub namespace: String,
    pub path: String,
    /// The path's own state: `unlocked`, `shared` or `exclusive`.
    pub state: String,
    /// Holds on the path, its ancestors and its descendants: the path's first, then by path.
    pub holders: Vec<LockEntry>,
    /// Queued acquires of the path, its ancestors and descendants, in queue order.
    pub waiters: Vec<LockEntry>,
    /// What an acquire of the path (in the mode asked: exclusive, or `--shared`) would wait
    /// for now; absent if it would be granted (unless acquires queued before it conflict).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<WhoBlocked>,
}

/// Why an acquire would wait.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct WhoBlocked {
    /// The mode asked: `exclusive` or `shared`.
    pub mode: String,
    /// `peer` (the path itself), `ancestor` or `descendant`: the first conflict found.
    pub reason: String,
    /// Every held path in the way.
    pub blocking: Vec<String>,
}

/// One hold or queued acquire.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct LockEntry {
    pub path: String,
    /// `exclusive` or `shared`.
    pub mode: String,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub since: Option<String>,
    /// `None` when the server does not show it (another token's lease, seen without admin).
    pub lease_id: Option<String>,
    /// Holds: the grant's fencing token (`CONCH_REV`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rev: Option<u64>,
    /// Queued acquires: place in the namespace's lock queue (0 = oldest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
}

fn entry(
    path: &str,
    exclusive: bool,
    lease_id: &str,
    metadata: &HashMap<String, String>,
    at_nanos: i64,
) -> LockEntry {
    LockEntry {
        path: path.to_string(),
        mode: mode(exclusive).to_string(),
        host: metadata.get(META_HOST).filter(|h| !h.is_empty()).cloned(),
        pid: metadata.get(META_PID).and_then(|p| p.parse().ok()),
        since: metadata
            .get(META_SINCE)
            .filter(|s| !s.is_empty())
            .cloned()
            .or_else(|| format_unix_nanos(at_nanos)),
        lease_id: (!lease_id.is_empty()).then(|| lease_id.to_string()),
        rev: None,
        position: None,
        cmd: metadata.get(META_CMD).cloned(),
    }
}

pub(crate) fn holder_entry(path: &str, h: &LockHolder) -> LockEntry {
    LockEntry {
        rev: Some(h.fencing_token),
        ..entry(path, h.exclusive, &h.lease_id, &h.metadata, h.locked_at)
    }
}

pub(crate) fn waiter_entry(w: &LockWaiter) -> LockEntry {
    LockEntry {
        position: Some(w.position),
        ..entry(
            &w.lock_name,
            w.exclusive,
            &w.lease_id,
            &w.metadata,
            w.queued_at,
        )
    }
}

/// `--who` from what was read: the namespace's held locks and the related queued acquires.
pub(crate) fn gather(
    namespace: &str,
    path: &str,
    exclusive: bool,
    locks: &[Lock],
    waiters: &[LockWaiter],
) -> LockWho {
    let mut related: Vec<&Lock> = locks
        .iter()
        .filter(|l| lock::relation(path, &l.name) != Relation::Unrelated)
        .collect();
    related.sort_by_key(|l| (l.name != path, l.name.clone()));
    let state = locks
        .iter()
        .find(|l| l.name == path)
        .map_or("unlocked", |l| match LockState::try_from(l.state) {
            Ok(LockState::ExclusiveLocked) => "exclusive",
            Ok(LockState::SharedLocked) => "shared",
            _ => "unlocked",
        });
    let (reason, blocking) = lock::conflicts(path, exclusive, "", locks);
    LockWho {
        namespace: namespace.to_string(),
        path: path.to_string(),
        state: state.to_string(),
        holders: related
            .iter()
            .flat_map(|l| l.lock_holders.iter().map(|h| holder_entry(&l.name, h)))
            .collect(),
        waiters: waiters.iter().map(waiter_entry).collect(),
        blocked: (reason != ContentionReason::Unspecified).then(|| WhoBlocked {
            mode: mode(exclusive).to_string(),
            reason: lock::reason_word(reason).to_string(),
            blocking: blocking.iter().map(|l| l.name.clone()).collect(),
        }),
    }
}

/// The text lines: holds, queued acquires, then what an acquire would wait for.
pub(crate) fn render_lines(who: &LockWho) -> Vec<String> {
    let all: Vec<&LockEntry> = who.holders.iter().chain(&who.waiters).collect();
    let host = |e: &LockEntry| e.host.clone().unwrap_or_else(|| "?".to_string());
    let pid = |e: &LockEntry| e.pid.map_or_else(|| "?".to_string(), |p| p.to_string());
    let path_w = all.iter().map(|e| e.path.len()).max().unwrap_or(0);
    let host_w = all.iter().map(|e| host(e).len()).max().unwrap_or(0);
    let pid_w = all.iter().map(|e| pid(e).len()).max().unwrap_or(0);
    let line = |state: &str, e: &LockEntry| {
        let tail = match (e.rev, e.position) {
            (Some(rev), _) => format!("rev={rev}"),
            (None, Some(p)) => format!("position={p}"),
            (None, None) => "-".to_string(),
        };
        format!(
            "{:<path_w$} {state} {:<9} {:<host_w$} pid={:<pid_w$} since={} {tail}",
            e.path,
            e.mode,
            host(e),
            pid(e),
            e.since.as_deref().unwrap_or("?"),
        )
    };
    let mut lines: Vec<String> = who
        .holders
        .iter()
        .map(|e| line("HELD", e))
        .chain(who.waiters.iter().map(|e| line("WAIT", e)))
        .collect();
    let a = |mode: &str| if mode == "exclusive" { "an" } else { "a" };
    match &who.blocked {
        Some(b) if b.reason == "peer" => lines.push(format!(
            "{}: {} {} acquire waits for the holds on it",
            who.path,
            a(&b.mode),
            b.mode
        )),
        Some(b) => lines.push(format!(
            "{}: {} {} acquire waits for {} {}",
            who.path,
            a(&b.mode),
            b.mode,
            b.reason,
            b.blocking
                .iter()
                .filter(|p| **p != who.path)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
        None if lines.is_empty() => lines.push(format!("{}: unlocked, nobody waits", who.path)),
        None => {}
    }
    lines
}

/// `--who`: what holds or waits, or that nothing does; exit 0 either way (the question was
/// answered; `--json` tells the two apart).
pub(crate) async fn who(client: &Client, args: &LockArgs) -> anyhow::Result<ExitCode> {
    let locks = match client.list_locks(&args.namespace).await {
        Ok(l) => l,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let waiters = match client.list_lock_waiters(&args.namespace, &args.path).await {
        Ok(w) => w,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let who = gather(&args.namespace, &args.path, !args.shared, &locks, &waiters);
    if args.json {
        crate::print_lines([serde_json::to_string_pretty(&who)?])?;
    } else {
        crate::print_lines(render_lines(&who))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `conch lock` refuses a bad path before asking the cluster.
pub(crate) fn check_path(path: &str) -> anyhow::Result<()> {
    lock::validate_path(path).map_err(exit::usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(host: &str, pid: &str, since: &str) -> HashMap<String, String> {
        [(META_HOST, host), (META_PID, pid), (META_SINCE, since)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn held(name: &str, exclusive: bool, token: u64, host: &str, pid: &str) -> Lock {
        Lock {
            name: name.into(),
            state: if exclusive {
                LockState::ExclusiveLocked
            } else {
                LockState::SharedLocked
            } as i32,
            lock_holders: vec![LockHolder {
                lease_id: format!("ls_{pid}"),
                exclusive,
                fencing_token: token,
                metadata: meta(host, pid, "2026-06-12T10:15:00Z"),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn waiter(path: &str, pid: &str, position: u64) -> LockWaiter {
        LockWaiter {
            lease_id: format!("ls_{pid}"),
            lock_name: path.into(),
            exclusive: true,
            metadata: meta("node1", pid, "2026-06-12T10:15:09Z"),
            position,
            ..Default::default()
        }
    }

    #[test]
    fn who_shows_related_holds_waiters_and_what_blocks() {
        let locks = vec![
            held("a/b", true, 17, "node2", "4242"),
            held("z", true, 3, "node3", "9"),
        ];
        let who = gather("conch", "a", true, &locks, &[waiter("a", "1207", 0)]);
        assert_eq!(who.state, "unlocked");
        assert_eq!(
            render_lines(&who),
            [
                "a/b HELD exclusive node2 pid=4242 since=2026-06-12T10:15:00Z rev=17",
                "a   WAIT exclusive node1 pid=1207 since=2026-06-12T10:15:09Z position=0",
                "a: an exclusive acquire waits for descendant a/b",
            ]
        );
        let v = serde_json::to_value(&who).unwrap();
        assert_eq!(v["blocked"]["reason"], "descendant");
        assert_eq!(v["blocked"]["blocking"], serde_json::json!(["a/b"]));
        assert_eq!(v["holders"][0]["rev"], 17);
        assert_eq!(v["holders"][0]["path"], "a/b");
        assert_eq!(v["waiters"][0]["position"], 0);
        assert_eq!(v["waiters"][0]["pid"], 1207);
    }

    #[test]
    fn a_shared_ask_is_blocked_only_by_exclusive_holds() {
        let locks = vec![held("a", false, 4, "node2", "1")];
        assert_eq!(gather("conch", "a/b", false, &locks, &[]).blocked, None);
        let who = gather("conch", "a/b", true, &locks, &[]);
        assert_eq!(
            render_lines(&who).last().map(String::as_str),
            Some("a/b: an exclusive acquire waits for ancestor a")
        );
        let who = gather("conch", "a", true, &locks, &[]);
        assert_eq!(who.state, "shared");
        assert_eq!(
            render_lines(&who).last().map(String::as_str),
            Some("a: an exclusive acquire waits for the holds on it")
        );
    }

    #[test]
    fn nothing_held_says_so() {
        let who = gather("conch", "a", true, &[], &[]);
        assert_eq!(render_lines(&who), ["a: unlocked, nobody waits"]);
        assert!(who.holders.is_empty());
    }

    #[test]
    fn a_dropped_hold_is_noticed_by_its_token() {
        let mut t = LockTarget::new("a", true);
        t.namespace = "conch".into();
        let lock = held("a", true, 17, "node2", "1");
        assert_eq!(t.judge(Some(&lock), 17), None);
        let gone = t.judge(Some(&lock), 18).unwrap();
        assert!(
            gone.contains("conch/a") && gone.contains("rev 18"),
            "{gone}"
        );
        assert!(t.judge(None, 17).is_some());
    }

    #[test]
    fn not_taken_names_the_reason_and_the_blocking_path() {
        let t = LockTarget::new("a", true);
        *t.blocked.borrow_mut() = Some(Blocked {
            reason: ContentionReason::Descendant,
            blocking: vec![held("a/b", true, 17, "node2", "4242")],
            lock: None,
        });
        assert_eq!(
            t.not_taken(Some(Duration::ZERO)),
            "lock a is busy (exclusive wanted): a descendant a/b (held exclusive by node2 pid 4242 rev 17)"
        );
        assert!(
            t.not_taken(Some(Duration::from_secs(5)))
                .starts_with("no exclusive lock on a within 5s: ")
        );
    }
}

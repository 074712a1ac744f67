//! `conch sema <name> --max N --who [--json]`: holders in grant order, then waiters in queue
//! order.
//!
//! ```text
//! video-encode[2/2] HELD  node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812
//! video-encode[2/2] HELD  node3 pid=991  since=2026-06-12T10:15:04Z rev=8814
//! video-encode[2/2] WAIT  node1 pid=1207 since=2026-06-12T10:15:09Z rev=-
//! ```
//!
//! The bracket is `[active holds/N]`. Host and pid columns are padded so lines align. A holder
//! or waiter with a weight other than 1 (possible through the Grackle API) gets ` weight=W`.
//!
//! Also shown:
//! - `--spread` callers queued on their host's lock (behind a process of the same host that
//!   holds a slot), after the queue, as `WAIT ... (host lock)`;
//! - the other capacities of the same name in use (`conch sema x --max 3` while others use
//!   `--max 2`): each --max is a semaphore of its own, a mistake `--who` makes visible. Their
//!   lines follow, with their own `[holds/N]`, and one line on stderr names them.

use std::collections::HashMap;
use std::process::ExitCode;

use conch_client::Client;
use conch_client::proto::conch::SemaphoreWaiter;
use conch_client::proto::grackle::SemaphoreHolder;
use conch_client::sema::{self, META_CMD, META_HOST, META_PID, META_SINCE, SemaphoreKind};
use serde::Serialize;

use crate::exit;
use crate::timefmt::format_unix_nanos;

/// What `--who --json` prints.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Who {
    pub name: String,
    pub max: u64,
    pub namespace: String,
    pub semaphore: String,
    /// `false` if nobody has used (name, max) yet.
    pub exists: bool,
    /// Sum of the holders' weights.
    pub active_holds: u64,
    pub holders: Vec<Entry>,
    pub waiters: Vec<Entry>,
    /// The same name with other `--max` values that exist, each as a `Who` (without `others`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub others: Option<Vec<Who>>,
}

/// One holder or waiter.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Entry {
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub since: Option<String>,
    /// `None` when the server does not show it: another token's lease, seen without admin on
    /// the namespace.
    pub lease_id: Option<String>,
    pub weight: u64,
    /// Holders: the grant's fencing token (`CONCH_REV`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rev: Option<u64>,
    /// Waiters: place in the queue, 0 = next to be granted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    /// Waiters: a `--spread` caller queued on its host's lock, not yet on the semaphore.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub host_lock: bool,
    /// `conch elect`: the candidate's `--value`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `conch elect`: the candidate's `--priority`, when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
}

fn entry(lease_id: &str, weight: u64, metadata: &HashMap<String, String>, at_nanos: i64) -> Entry {
    Entry {
        host: metadata.get(META_HOST).filter(|h| !h.is_empty()).cloned(),
        pid: metadata.get(META_PID).and_then(|p| p.parse().ok()),
        since: metadata
            .get(META_SINCE)
            .filter(|s| !s.is_empty())
            .cloned()
            .or_else(|| format_unix_nanos(at_nanos)),
        lease_id: (!lease_id.is_empty()).then(|| lease_id.to_string()),
        weight: weight.max(1),
        rev: None,
        position: None,
        cmd: metadata.get(META_CMD).cloned(),
        host_lock: false,
        value: metadata.get(conch_client::elect::META_VALUE).cloned(),
        priority: metadata
            .get(conch_client::elect::META_PRIORITY)
            .and_then(|p| p.parse().ok()),
    }
}

pub(crate) fn holder_entry(h: &SemaphoreHolder) -> Entry {
    Entry {
        rev: Some(h.fencing_token),
        ..entry(&h.lease_id, h.weight, &h.metadata, h.locked_at)
    }
}

pub(crate) fn waiter_entry(w: &SemaphoreWaiter, index: usize) -> Entry {
    // Trust the server's position; fall back to list order if it sent none.
    let position = if w.position == 0 && index > 0 {
        index as u64
    } else {
        w.position
    };
    Entry {
        position: Some(position),
        ..entry(&w.lease_id, w.weight, &w.metadata, w.queued_at)
    }
}

/// The text lines, holders first.
pub(crate) fn render_lines(who: &Who) -> Vec<String> {
    let all = who.holders.iter().chain(&who.waiters);
    let host = |e: &Entry| e.host.clone().unwrap_or_else(|| "?".to_string());
    let pid = |e: &Entry| e.pid.map_or_else(|| "?".to_string(), |p| p.to_string());
    let host_w = all.clone().map(|e| host(e).len()).max().unwrap_or(0);
    let pid_w = all.map(|e| pid(e).len()).max().unwrap_or(0);
    let prefix = format!("{}[{}/{}]", who.name, who.active_holds, who.max);
    let line = |state: &str, e: &Entry| {
        let since = e.since.as_deref().unwrap_or("?");
        let rev = e.rev.map_or_else(|| "-".to_string(), |r| r.to_string());
        let mut l = format!(
            "{prefix} {state:<5} {:<host_w$} pid={:<pid_w$} since={since} rev={rev}",
            host(e),
            pid(e)
        );
        if e.weight != 1 {
            l.push_str(&format!(" weight={}", e.weight));
        }
        if e.host_lock {
            l.push_str(" (host lock)");
        }
        l
    };
    who.holders
        .iter()
        .map(|e| line("HELD", e))
        .chain(who.waiters.iter().map(|e| line("WAIT", e)))
        .chain(who.others.iter().flatten().flat_map(render_lines))
        .collect()
}

/// The stderr line naming the other capacities in use, if any.
pub(crate) fn others_note(who: &Who) -> Option<String> {
    let others = who.others.as_ref().filter(|o| !o.is_empty())?;
    let maxes: Vec<String> = others.iter().map(|o| format!("--max {}", o.max)).collect();
    Some(format!(
        "conch: note: {} is also used with {}; each --max is a separate semaphore",
        who.name,
        maxes.join(", ")
    ))
}

/// What `--who` prints without `--json`: the holders and waiters, or one line saying the
/// asked semaphore has no holder (never nothing), then the lines of the same name's other
/// capacities, so `x --max 3 --who` never shows only `x[2/2]` lines.
pub(crate) fn text_lines(who: &Who) -> Vec<String> {
    let lines = render_lines(who);
    if who.holders.is_empty() && who.waiters.is_empty() {
        let mut said = vec![format!(
            "{}[{}/{}] no holder",
            who.name, who.active_holds, who.max
        )];
        said.extend(lines);
        said
    } else {
        lines
    }
}

pub(crate) async fn run(
    client: &Client,
    namespace: &str,
    name: &str,
    max: u64,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let semaphore = sema::semaphore_name(name, max).map_err(exit::usage)?;
    // Every semaphore of the namespace: the other capacities and the host locks of this name.
    let all = match client.list_semaphores(namespace).await {
        Ok(all) => all,
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut other_maxes = Vec::new();
    let mut host_locks = Vec::new();
    for s in &all {
        match sema::semaphore_kind(&s.name) {
            Some(SemaphoreKind::Main { name: n, max: m }) if n == name && m != max => {
                other_maxes.push(m);
            }
            Some(SemaphoreKind::HostLock { name: n, max: m }) if n == name && m == max => {
                host_locks.push(s.name.clone());
            }
            _ => {}
        }
    }
    let mut who = gather(client, namespace, name, max, &semaphore).await?;
    for lock in host_locks {
        match client.list_waiters(namespace, &lock).await {
            Ok(w) => who.waiters.extend(w.waiters.iter().map(|w| Entry {
                host_lock: true,
                position: None,
                ..waiter_entry(w, 0)
            })),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut others = Vec::new();
    for m in other_maxes {
        let other = sema::semaphore_name(name, m).map_err(exit::usage)?;
        let found = gather(client, namespace, name, m, &other).await?;
        if found.exists {
            others.push(found);
        }
    }
    who.others = Some(others);
    if let Some(note) = others_note(&who) {
        eprintln!("{note}");
    }
    if json {
        crate::print_lines([serde_json::to_string_pretty(&who)?])?;
    } else {
        crate::print_lines(text_lines(&who))?;
    }
    Ok(who_exit(&who))
}

/// `--who`'s exit status, for scripts: 0 when someone holds the asked semaphore, 1 when nobody
/// does (whether or not it exists, whoever waits, whatever other capacities hold).
pub(crate) fn who_exit(who: &Who) -> ExitCode {
    if who.holders.is_empty() {
        ExitCode::from(EMPTY)
    } else {
        ExitCode::SUCCESS
    }
}

/// `--who`: nobody holds the semaphore.
pub(crate) const EMPTY: u8 = 1;

/// The other capacities of `name` (`--max` other than `max`) that someone holds or waits for
/// now, with their holders and waiters counted: the mistyped `--max` a run warns about.
pub(crate) async fn busy_other_capacities(
    client: &Client,
    namespace: &str,
    name: &str,
    max: u64,
) -> conch_client::Result<Vec<(u64, usize, usize)>> {
    let mut busy = Vec::new();
    for s in client.list_semaphores(namespace).await? {
        let Some(SemaphoreKind::Main { name: n, max: m }) = sema::semaphore_kind(&s.name) else {
            continue;
        };
        if n != name || m == max {
            continue;
        }
        let holders = s.active_holders_count as usize;
        let waiters = s.waiters_count as usize;
        if holders + waiters > 0 {
            busy.push((m, holders, waiters));
        }
    }
    Ok(busy)
}

/// The warning a run prints when other capacities of its name are in use.
pub(crate) fn other_capacities_warning(
    name: &str,
    max: u64,
    busy: &[(u64, usize, usize)],
) -> Option<String> {
    if busy.is_empty() {
        return None;
    }
    let said: Vec<String> = busy
        .iter()
        .map(|(m, holders, waiters)| format!("--max {m} ({holders} holding, {waiters} waiting)"))
        .collect();
    Some(format!(
        "conch: warning: {name} is also in use with {}; each --max is a separate semaphore, so \
         this run (--max {max}) does not exclude those: check the --max (conch sema {name} --max \
         {max} --who lists them)",
        said.join(", ")
    ))
}

/// Holders and waiters of one semaphore of (name, max).
pub(crate) async fn gather(
    client: &Client,
    namespace: &str,
    name: &str,
    max: u64,
    semaphore: &str,
) -> anyhow::Result<Who> {
    let mut who = Who {
        name: name.to_string(),
        max,
        namespace: namespace.to_string(),
        semaphore: semaphore.to_string(),
        exists: true,
        active_holds: 0,
        holders: Vec::new(),
        waiters: Vec::new(),
        others: None,
    };
    match client.list_holders(namespace, semaphore).await {
        Ok(holders) => who.holders = holders.iter().map(holder_entry).collect(),
        Err(e) if e.is_not_found() => who.exists = false,
        Err(e) => return Err(e.into()),
    }
    if who.exists {
        match client.list_waiters(namespace, semaphore).await {
            Ok(w) => {
                who.waiters = w
                    .waiters
                    .iter()
                    .enumerate()
                    .map(|(i, w)| waiter_entry(w, i))
                    .collect();
                who.active_holds = w.semaphore.map(|s| s.active_holds).unwrap_or(0);
            }
            Err(e) if e.is_not_found() => who.exists = false,
            Err(e) => return Err(e.into()),
        }
    }
    if who.active_holds == 0 {
        who.active_holds = who.holders.iter().map(|h| h.weight).sum();
    }
    Ok(who)
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

    fn seed_example() -> Who {
        let holders = [
            SemaphoreHolder {
                lease_id: "ls_a".into(),
                weight: 1,
                metadata: meta("node2", "4242", "2026-06-12T10:15:00Z"),
                fencing_token: 8812,
                ..Default::default()
            },
            SemaphoreHolder {
                lease_id: "ls_b".into(),
                weight: 1,
                metadata: meta("node3", "991", "2026-06-12T10:15:04Z"),
                fencing_token: 8814,
                ..Default::default()
            },
        ];
        let waiters = [SemaphoreWaiter {
            lease_id: "ls_c".into(),
            weight: 1,
            metadata: meta("node1", "1207", "2026-06-12T10:15:09Z"),
            position: 0,
            ..Default::default()
        }];
        Who {
            name: "video-encode".into(),
            max: 2,
            namespace: "conch".into(),
            semaphore: "video-encode.2".into(),
            exists: true,
            active_holds: 2,
            holders: holders.iter().map(holder_entry).collect(),
            waiters: waiters
                .iter()
                .enumerate()
                .map(|(i, w)| waiter_entry(w, i))
                .collect(),
            others: None,
        }
    }

    #[test]
    fn a_run_warns_of_other_capacities_in_use() {
        assert_eq!(other_capacities_warning("x", 1, &[]), None);
        let said = other_capacities_warning("x", 1, &[(2, 1, 0), (3, 0, 2)]).expect("warning");
        assert!(
            said.contains("x is also in use with --max 2 (1 holding, 0 waiting), --max 3 (0 holding, 2 waiting)"),
            "{said}"
        );
        assert!(said.contains("this run (--max 1)"), "{said}");
    }

    #[test]
    fn lines_match_the_seed_format() {
        assert_eq!(
            render_lines(&seed_example()),
            [
                "video-encode[2/2] HELD  node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812",
                "video-encode[2/2] HELD  node3 pid=991  since=2026-06-12T10:15:04Z rev=8814",
                "video-encode[2/2] WAIT  node1 pid=1207 since=2026-06-12T10:15:09Z rev=-",
            ]
        );
    }

    #[test]
    fn foreign_holders_without_metadata_still_show() {
        let h = SemaphoreHolder {
            lease_id: "ls_x".into(),
            weight: 3,
            locked_at: 1_781_259_300_000_000_000,
            fencing_token: 7,
            ..Default::default()
        };
        let who = Who {
            holders: vec![holder_entry(&h)],
            waiters: vec![],
            active_holds: 3,
            max: 4,
            name: "db".into(),
            ..seed_example()
        };
        assert_eq!(
            render_lines(&who),
            ["db[3/4] HELD  ? pid=? since=2026-06-12T10:15:00Z rev=7 weight=3"]
        );
    }

    #[test]
    fn nobody_holding_says_no_holder() {
        let who = Who {
            holders: vec![],
            waiters: vec![],
            active_holds: 0,
            exists: false,
            ..seed_example()
        };
        assert!(render_lines(&who).is_empty());
        let said = text_lines(&who);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].ends_with("] no holder"), "{said:?}");
    }

    #[test]
    fn no_holder_of_the_asked_capacity_is_said_before_the_others() {
        let asked = Who {
            max: 3,
            semaphore: "video-encode.3".into(),
            exists: false,
            active_holds: 0,
            holders: vec![],
            waiters: vec![],
            others: Some(vec![seed_example()]),
            ..seed_example()
        };
        assert_eq!(
            text_lines(&asked),
            [
                "video-encode[0/3] no holder",
                "video-encode[2/2] HELD  node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812",
                "video-encode[2/2] HELD  node3 pid=991  since=2026-06-12T10:15:04Z rev=8814",
                "video-encode[2/2] WAIT  node1 pid=1207 since=2026-06-12T10:15:09Z rev=-",
            ]
        );
    }

    #[test]
    fn json_has_the_same_information() {
        let v = serde_json::to_value(seed_example()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "name": "video-encode",
                "max": 2,
                "namespace": "conch",
                "semaphore": "video-encode.2",
                "exists": true,
                "active_holds": 2,
                "holders": [
                    {"host": "node2", "pid": 4242, "since": "2026-06-12T10:15:00Z",
                     "lease_id": "ls_a", "weight": 1, "rev": 8812},
                    {"host": "node3", "pid": 991, "since": "2026-06-12T10:15:04Z",
                     "lease_id": "ls_b", "weight": 1, "rev": 8814},
                ],
                "waiters": [
                    {"host": "node1", "pid": 1207, "since": "2026-06-12T10:15:09Z",
                     "lease_id": "ls_c", "weight": 1, "position": 0},
                ],
            })
        );
    }

    #[test]
    fn other_capacities_and_host_lock_waiters_are_shown() {
        let mut spread = waiter_entry(
            &SemaphoreWaiter {
                lease_id: "ls_d".into(),
                weight: 1,
                metadata: meta("node2", "77", "2026-06-12T10:16:00Z"),
                ..Default::default()
            },
            0,
        );
        spread.host_lock = true;
        spread.position = None;
        let asked = Who {
            name: "video-encode".into(),
            max: 3,
            semaphore: "video-encode.3".into(),
            exists: false,
            active_holds: 0,
            holders: vec![],
            waiters: vec![spread],
            others: Some(vec![seed_example()]),
            ..seed_example()
        };
        assert_eq!(
            render_lines(&asked),
            [
                "video-encode[0/3] WAIT  node2 pid=77 since=2026-06-12T10:16:00Z rev=- (host lock)",
                "video-encode[2/2] HELD  node2 pid=4242 since=2026-06-12T10:15:00Z rev=8812",
                "video-encode[2/2] HELD  node3 pid=991  since=2026-06-12T10:15:04Z rev=8814",
                "video-encode[2/2] WAIT  node1 pid=1207 since=2026-06-12T10:15:09Z rev=-",
            ]
        );
        assert_eq!(
            others_note(&asked).as_deref(),
            Some(
                "conch: note: video-encode is also used with --max 2; each --max is a separate semaphore"
            )
        );
        let v = serde_json::to_value(&asked).unwrap();
        assert_eq!(v["waiters"][0]["host_lock"], true);
        assert_eq!(v["others"][0]["max"], 2);
        assert_eq!(others_note(&seed_example()), None);
    }

    #[test]
    fn waiter_positions_fall_back_to_list_order() {
        let w = SemaphoreWaiter::default();
        assert_eq!(waiter_entry(&w, 0).position, Some(0));
        assert_eq!(waiter_entry(&w, 3).position, Some(3));
        let w = SemaphoreWaiter {
            position: 5,
            ..Default::default()
        };
        assert_eq!(waiter_entry(&w, 3).position, Some(5));
    }
}

//! What the status page shows, gathered from one applied state under one read: the rows of
//! each view, as the HTML renders them and as the JSON serializes them.
//!
//! Every listing goes through the state's own read functions with the API's visibility rules:
//! namespaces the caller may not read are left out ([`Caller::may_read_in`]), another token's
//! lease ids (and the process that took them) are hidden unless the caller has admin on the
//! namespace ([`Caller::may_see_lease`]). Each list is capped at one page ([`ROWS`]); `more`
//! says that rows were left out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::api::auth::Caller;
use crate::state::{
    Error, HolderView, LeaseKind, LeaseView, Metadata, Nanos, Page, PageRequest, State,
    WaitGroupStatus,
};

/// Rows per list: a page of the state's paging, its largest.
pub(super) const ROWS: i32 = 250;
/// The leases the overview lists, soonest to expire first.
pub(super) const EXPIRING: usize = 20;
/// The metadata keys `conch` fills in for a holder or waiter: its machine and process.
pub(super) const META_HOST: &str = "host";
pub(super) const META_PID: &str = "pid";

const NANOS_PER_MILLI: Nanos = 1_000_000;

/// A capped list: its rows, and whether more exist than are shown.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct Listed<T> {
    pub items: Vec<T>,
    pub more: bool,
}

impl<T> Listed<T> {
    fn of<V>(page: Page<V>, row: impl FnMut(V) -> T) -> Listed<T> {
        Listed {
            more: !page.next_token.is_empty(),
            items: page.items.into_iter().map(row).collect(),
        }
    }
}

/// The cluster as the serving node sees it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct Cluster {
    pub node_id: u64,
    pub node_addr: String,
    /// `Leader`, `Follower`, `Candidate`, `Learner` or `Shutdown`.
    pub role: String,
    pub term: u64,
    pub leader_id: Option<u64>,
    pub leader_addr: Option<String>,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub snapshot_index: u64,
    /// Changes of leader this node has seen since it started.
    pub leader_changes: u64,
    pub members: Vec<MemberRow>,
    /// Whether the members' lag is known here: only the leader tracks it.
    pub lag_known: bool,
    /// Whether this node serves TLS (and this page over HTTPS).
    pub tls: bool,
    /// When this node's certificate expires (UTC), with TLS.
    pub certificate_expires_at: Option<String>,
    pub certificate_expires_in_ms: Option<i64>,
    /// What stops the cluster from serving as configured (e.g. access control being set up).
    pub problems: Vec<String>,
    /// The release this node runs.
    pub release: String,
    /// The replicated cluster version, and the newest this node's release speaks.
    pub cluster_version: u32,
    pub cluster_version_max: u32,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct MemberRow {
    pub id: u64,
    pub addr: String,
    /// `leader`, `follower` or `learner`.
    pub role: &'static str,
    /// The node serving this page.
    pub this_node: bool,
    /// The last log index the leader knows this member holds (on the leader only).
    pub matched_index: Option<u64>,
    /// Entries this member is behind the leader's log (on the leader only).
    pub lag: Option<u64>,
}

/// The first page: the cluster, the namespaces, the leases expiring soonest.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct Overview {
    pub cluster: Cluster,
    pub access_control: bool,
    pub namespaces: Listed<NamespaceRow>,
    pub expiring_leases: Vec<LeaseRow>,
    /// When the page was read (UTC).
    pub read_at: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct NamespaceRow {
    pub name: String,
    pub description: String,
    pub semaphores: u64,
    pub holders: u64,
    pub waiters: u64,
    pub locks_held: u64,
    pub wait_groups: u64,
    pub barriers: u64,
    pub leases: u64,
    /// Some count stopped at [`ROWS`].
    pub more: bool,
}

/// One namespace: its semaphores with their holders and queues, locks, wait groups, barriers
/// and leases.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct NamespacePage {
    pub name: String,
    pub description: String,
    pub metadata: Metadata,
    pub semaphores: Listed<SemaphoreBlock>,
    pub locks: Listed<LockRow>,
    pub lock_queue: Listed<WaiterRow>,
    pub wait_groups: Listed<WaitGroupRow>,
    pub barriers: Listed<BarrierRow>,
    pub leases: Listed<LeaseRow>,
    pub read_at: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct SemaphoreBlock {
    pub name: String,
    pub description: String,
    pub permits: u64,
    /// Permits held (the sum of the holders' weights).
    pub holds: u64,
    pub holders_count: u64,
    pub waiters_count: u64,
    pub version: u64,
    /// In grant order.
    pub holders: Listed<HolderRow>,
    /// In queue order.
    pub queue: Listed<WaiterRow>,
}

/// Who holds: a semaphore's holder, or a lock's.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct HolderRow {
    pub fencing_token: u64,
    /// Empty when the caller may not see this lease (another token's).
    pub lease_id: String,
    /// A semaphore holder's weight; for a lock, 1 exclusive and 0 shared.
    pub weight: u64,
    pub exclusive: Option<bool>,
    pub process_id: String,
    pub host: String,
    /// The conch process id from the metadata: a number in JSON (as `conch sema --who --json`
    /// has it), `null` when the metadata has none or not a number.
    #[serde(serialize_with = "pid_number")]
    pub pid: String,
    pub metadata: Metadata,
    pub locked_at: String,
    pub held_for_ms: i64,
    /// Until the hold limit ends the hold (`None`: no hold limit; a semaphore's only).
    pub hold_ends_in_ms: Option<i64>,
}

/// Who waits, in queue order: for a semaphore, or for a lock of the namespace.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct WaiterRow {
    /// 0 = next.
    pub position: u64,
    /// The lock path waited for (locks only).
    pub path: Option<String>,
    pub exclusive: Option<bool>,
    pub lease_id: String,
    pub weight: u64,
    pub process_id: String,
    pub host: String,
    /// The conch process id from the metadata: a number in JSON (as `conch sema --who --json`
    /// has it), `null` when the metadata has none or not a number.
    #[serde(serialize_with = "pid_number")]
    pub pid: String,
    pub metadata: Metadata,
    pub queued_at: String,
    pub waited_for_ms: i64,
    /// Until the wait times out; `None` when it waits without a deadline.
    pub timeout_in_ms: Option<i64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct LockRow {
    pub path: String,
    /// `exclusive` or `shared`.
    pub mode: &'static str,
    pub holders: Vec<HolderRow>,
    pub waiters: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct WaitGroupRow {
    pub name: String,
    pub counter: u64,
    pub completed_jobs: u64,
    /// `active`, `completed` or `expired`.
    pub status: &'static str,
    pub expires_at: Option<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct BarrierRow {
    pub name: String,
    pub arrived: u64,
    pub expected: u64,
    pub generation: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub(super) struct LeaseRow {
    pub namespace: String,
    pub lease_id: String,
    /// `semaphore` or `lock`.
    pub kind: &'static str,
    pub process_id: String,
    pub host: String,
    /// The conch process id from the metadata: a number in JSON (as `conch sema --who --json`
    /// has it), `null` when the metadata has none or not a number.
    #[serde(serialize_with = "pid_number")]
    pub pid: String,
    pub ttl_s: u64,
    pub expires_at: String,
    pub expires_in_ms: i64,
}

fn first_page() -> PageRequest {
    PageRequest {
        token: String::new(),
        limit: ROWS,
    }
}

/// A pid as a JSON number, or `null` when it is not one.
fn pid_number<S: serde::Serializer>(pid: &str, serializer: S) -> Result<S::Ok, S::Error> {
    match pid.trim().parse::<u64>() {
        Ok(n) => serializer.serialize_u64(n),
        Err(_) => serializer.serialize_none(),
    }
}

fn meta(metadata: &Metadata, key: &str) -> String {
    metadata.get(key).cloned().unwrap_or_default()
}

fn kind_name(kind: LeaseKind) -> &'static str {
    match kind {
        LeaseKind::Semaphore => "semaphore",
        LeaseKind::Lock => "lock",
    }
}

fn millis(ns: Nanos) -> i64 {
    ns.max(0) / NANOS_PER_MILLI
}

/// The overview's namespaces and expiring leases, read from `state` as `caller` may see them,
/// with durations measured to `now_ns` (wall clock, ns since the Unix epoch).
pub(super) fn overview_of(
    state: &State,
    caller: &Caller,
    now_ns: Nanos,
) -> Result<(Listed<NamespaceRow>, Vec<LeaseRow>), Error> {
    let page = state.list_namespaces_visible(&first_page(), |ns| caller.may_read_in(state, ns))?;
    let namespaces = Listed::of(page, |ns| ns);
    let mut rows = Vec::with_capacity(namespaces.items.len());
    let mut leases = Vec::new();
    for ns in &namespaces.items {
        let sems = state.list_semaphores(&ns.name, &first_page())?;
        let locks = state.list_locks(&ns.name, &first_page())?;
        let groups = state.list_wait_groups(&ns.name, &first_page())?;
        let barriers = state.list_barriers(&ns.name, &first_page())?;
        let mut ns_leases = 0;
        let mut more = [&sems.next_token, &locks.next_token]
            .iter()
            .chain([&groups.next_token, &barriers.next_token].iter())
            .any(|t| !t.is_empty());
        for kind in [LeaseKind::Semaphore, LeaseKind::Lock] {
            let page = visible_leases(state, caller, &ns.name, kind)?;
            more |= !page.next_token.is_empty();
            ns_leases += page.items.len() as u64;
            leases.extend(
                page.items
                    .into_iter()
                    .map(|l| lease_row(&ns.name, kind, l, now_ns)),
            );
        }
        rows.push(NamespaceRow {
            name: ns.name.clone(),
            description: ns.description.clone(),
            semaphores: sems.items.len() as u64,
            holders: sems.items.iter().map(|s| s.active_holders_count).sum(),
            waiters: sems.items.iter().map(|s| s.waiters_count).sum(),
            locks_held: locks.items.len() as u64,
            wait_groups: groups.items.len() as u64,
            barriers: barriers.items.len() as u64,
            leases: ns_leases,
            more,
        });
    }
    leases.sort_by(|a, b| {
        (a.expires_in_ms, &a.namespace, &a.lease_id).cmp(&(
            b.expires_in_ms,
            &b.namespace,
            &b.lease_id,
        ))
    });
    leases.truncate(EXPIRING);
    Ok((
        Listed {
            items: rows,
            more: namespaces.more,
        },
        leases,
    ))
}

fn visible_leases(
    state: &State,
    caller: &Caller,
    ns: &str,
    kind: LeaseKind,
) -> Result<Page<LeaseView>, Error> {
    state.list_leases_visible(ns, kind, None, &first_page(), |owner| {
        caller.may_see_lease(state, ns, owner)
    })
}

fn lease_row(ns: &str, kind: LeaseKind, lease: LeaseView, now_ns: Nanos) -> LeaseRow {
    LeaseRow {
        namespace: ns.to_string(),
        host: meta(&lease.metadata, META_HOST),
        pid: meta(&lease.metadata, META_PID),
        kind: kind_name(kind),
        expires_at: utc(lease.expires_at),
        expires_in_ms: millis(lease.expires_at.saturating_sub(now_ns)),
        lease_id: lease.lease_id,
        process_id: lease.process_id,
        ttl_s: lease.ttl_s,
    }
}

/// Namespace `ns` read from `state` as `caller` may see it (the caller's read permission on it
/// is checked before: see the API's `Caller::allow`).
pub(super) fn namespace_of(
    state: &State,
    caller: &Caller,
    ns: &str,
    now_ns: Nanos,
) -> Result<NamespacePage, Error> {
    let namespace = state.get_namespace(ns)?;
    // The process that took a lease, where the caller may see the lease.
    let process = |kind: LeaseKind, lease_id: &str, owner: Option<u64>| {
        if lease_id.is_empty() || !caller.may_see_lease(state, ns, owner) {
            return String::new();
        }
        state
            .get_lease(ns, kind, lease_id)
            .map(|l| l.process_id)
            .unwrap_or_default()
    };
    let lease_shown = |lease_id: String, owner: Option<u64>| {
        let mut lease_id = lease_id;
        caller.hide_lease_id(state, ns, &mut lease_id, owner);
        lease_id
    };
    let holder_row = |h: HolderView| HolderRow {
        fencing_token: h.token,
        process_id: process(LeaseKind::Semaphore, &h.lease_id, h.owner),
        lease_id: lease_shown(h.lease_id, h.owner),
        weight: h.weight,
        exclusive: None,
        host: meta(&h.metadata, META_HOST),
        pid: meta(&h.metadata, META_PID),
        locked_at: utc(h.locked_at),
        held_for_ms: millis(now_ns.saturating_sub(h.locked_at)),
        hold_ends_in_ms: (h.ends_at > 0).then(|| millis(h.ends_at.saturating_sub(now_ns).max(0))),
        metadata: h.metadata,
    };
    // Deadlines are on the lease clock, which stands still between batches: move it on by the
    // wall time since the newest batch.
    let clock_ns = state
        .clock_ns()
        .saturating_add(now_ns.saturating_sub(state.wall_ns()).max(0));
    let timeout_in = |deadline_ns: Nanos| {
        // Waits without a deadline carry the clock's end.
        (deadline_ns < Nanos::MAX / 2).then(|| millis(deadline_ns.saturating_sub(clock_ns)))
    };

    let sems = state.list_semaphores(ns, &first_page())?;
    let mut blocks = Vec::with_capacity(sems.items.len());
    for sem in &sems.items {
        let holders = Listed::of(
            state.list_holders(ns, &sem.name, &first_page())?,
            holder_row,
        );
        let (_, waiters) = state.list_waiters(ns, &sem.name, &first_page())?;
        let queue = Listed::of(waiters, |w| WaiterRow {
            position: w.position,
            path: None,
            exclusive: None,
            process_id: process(LeaseKind::Semaphore, &w.lease_id, w.owner),
            lease_id: lease_shown(w.lease_id, w.owner),
            weight: w.weight,
            host: meta(&w.metadata, META_HOST),
            pid: meta(&w.metadata, META_PID),
            queued_at: utc(w.queued_at),
            waited_for_ms: millis(now_ns.saturating_sub(w.queued_at)),
            timeout_in_ms: timeout_in(w.deadline_ns),
            metadata: w.metadata,
        });
        blocks.push(SemaphoreBlock {
            name: sem.name.clone(),
            description: sem.description.clone(),
            permits: sem.permits,
            holds: sem.active_holds,
            holders_count: sem.active_holders_count,
            waiters_count: sem.waiters_count,
            version: sem.version,
            holders,
            queue,
        });
    }
    let semaphores = Listed {
        items: blocks,
        more: !sems.next_token.is_empty(),
    };

    let locks = Listed::of(state.list_locks(ns, &first_page())?, |lock| LockRow {
        mode: if lock.exclusive == Some(true) {
            "exclusive"
        } else {
            "shared"
        },
        holders: lock
            .holders
            .into_iter()
            .map(|h| HolderRow {
                fencing_token: h.token,
                process_id: process(LeaseKind::Lock, &h.lease_id, h.owner),
                lease_id: lease_shown(h.lease_id, h.owner),
                weight: u64::from(h.exclusive),
                exclusive: Some(h.exclusive),
                host: meta(&h.metadata, META_HOST),
                pid: meta(&h.metadata, META_PID),
                locked_at: utc(h.locked_at),
                held_for_ms: millis(now_ns.saturating_sub(h.locked_at)),
                hold_ends_in_ms: None,
                metadata: h.metadata,
            })
            .collect(),
        waiters: lock.waiters,
        path: lock.name,
    });
    let lock_queue = Listed::of(state.list_lock_waiters(ns, "", &first_page())?, |w| {
        WaiterRow {
            position: w.position,
            exclusive: Some(w.exclusive),
            process_id: process(LeaseKind::Lock, &w.lease_id, w.owner),
            lease_id: lease_shown(w.lease_id, w.owner),
            weight: u64::from(w.exclusive),
            host: meta(&w.metadata, META_HOST),
            pid: meta(&w.metadata, META_PID),
            queued_at: utc(w.queued_at),
            waited_for_ms: millis(now_ns.saturating_sub(w.queued_at)),
            timeout_in_ms: timeout_in(w.deadline_ns),
            metadata: w.metadata,
            path: Some(w.path),
        }
    });
    let wait_groups = Listed::of(state.list_wait_groups(ns, &first_page())?, |g| {
        WaitGroupRow {
            status: match g.status {
                WaitGroupStatus::Active => "active",
                WaitGroupStatus::Completed => "completed",
                WaitGroupStatus::Expired => "expired",
            },
            expires_at: (g.expires_at > 0).then(|| utc(g.expires_at)),
            name: g.name,
            counter: g.counter,
            completed_jobs: g.completed_jobs,
        }
    });
    let barriers = Listed::of(state.list_barriers(ns, &first_page())?, |b| BarrierRow {
        name: b.name,
        arrived: b.arrived,
        expected: b.expected,
        generation: b.generation,
    });
    let mut leases = Vec::new();
    let mut more_leases = false;
    for kind in [LeaseKind::Semaphore, LeaseKind::Lock] {
        let page = visible_leases(state, caller, ns, kind)?;
        more_leases |= !page.next_token.is_empty();
        leases.extend(
            page.items
                .into_iter()
                .map(|l| lease_row(ns, kind, l, now_ns)),
        );
    }
    leases.sort_by(|a, b| (a.expires_in_ms, &a.lease_id).cmp(&(b.expires_in_ms, &b.lease_id)));
    Ok(NamespacePage {
        name: namespace.name,
        description: namespace.description,
        metadata: namespace.metadata,
        semaphores,
        locks,
        lock_queue,
        wait_groups,
        barriers,
        leases: Listed {
            items: leases,
            more: more_leases,
        },
        read_at: utc(now_ns),
    })
}

/// The members' rows: roles from the membership and the known leader; lag from the leader's
/// replication progress (`matched`, on the leader only) against its `last_log_index`.
pub(super) fn member_rows(
    members: &[(u64, String, bool)],
    this_node: u64,
    leader: Option<u64>,
    matched: Option<&BTreeMap<u64, u64>>,
    last_log_index: u64,
) -> Vec<MemberRow> {
    members
        .iter()
        .map(|(id, addr, voter)| {
            let matched_index = match (matched, Some(*id) == leader) {
                (Some(_), true) => Some(last_log_index),
                (Some(m), false) => m.get(id).copied(),
                (None, _) => None,
            };
            MemberRow {
                id: *id,
                addr: addr.clone(),
                role: match (Some(*id) == leader, voter) {
                    (true, _) => "leader",
                    (false, true) => "follower",
                    (false, false) => "learner",
                },
                this_node: *id == this_node,
                lag: matched_index.map(|m| last_log_index.saturating_sub(m)),
                matched_index,
            }
        })
        .collect()
}

/// `ns` (nanoseconds since the Unix epoch) as UTC, to the second: `2026-06-12 10:15:00Z`.
pub(super) fn utc(ns: Nanos) -> String {
    if ns <= 0 {
        return String::new();
    }
    let secs = ns / 1_000_000_000;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_is_the_civil_date() {
        assert_eq!(utc(1_000_000_000), "1970-01-01 00:00:01Z");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(utc(1_709_210_096 * 1_000_000_000), "2024-02-29 12:34:56Z");
        assert_eq!(utc(0), "", "no time");
    }

    #[test]
    fn members_take_their_roles_and_lag_from_the_leader() {
        let members = [
            (1, "a:1".to_string(), true),
            (2, "b:1".to_string(), true),
            (3, "c:1".to_string(), false),
        ];
        let matched = BTreeMap::from([(2, 90), (3, 100)]);
        let rows = member_rows(&members, 1, Some(1), Some(&matched), 100);
        let roles: Vec<_> = rows.iter().map(|r| (r.id, r.role, r.lag)).collect();
        assert_eq!(
            roles,
            [
                (1, "leader", Some(0)),
                (2, "follower", Some(10)),
                (3, "learner", Some(0))
            ]
        );
        assert!(rows[0].this_node && !rows[1].this_node);
        let on_follower = member_rows(&members, 2, Some(1), None, 100);
        assert!(on_follower.iter().all(|r| r.lag.is_none()));
        assert_eq!(on_follower[0].role, "leader");
    }
}

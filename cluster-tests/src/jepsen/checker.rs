//! Safety checks on a history: capacity, fencing, durability of what was acknowledged, and
//! the client's own view of what it holds. The run adds agreement of the nodes and the
//! liveness checks from what it observes at the end; see [`super::run`].
//!
//! # What a client believes it holds
//!
//! The lease rule of the conch CLI ([`conch_client::loss_after`],
//! `L = ttl − min(max(1s, ttl/5), ttl/2)`):
//! a lease created by a request sent at `s0` is believed alive until `s0 + L`; each refresh
//! acknowledged *before* the current deadline moves it to `send time + L` (never back); a
//! refresh acknowledged at or after the deadline comes too late (the lease is lost and stays
//! lost). Belief ends earlier when a request on the lease is answered `NotFound` (at that
//! answer) or when a revoke of the lease is sent (at that send).
//!
//! A *hold interval* comes from an acquire acknowledged `ACQUIRED` (token `T`, weight `w`)
//! with lease `L` on semaphore `S`: it starts at the acknowledgement and ends at the first of
//! - the send of the next release of `S` by `L` (one that was actually sent),
//! - the end of belief in `L` (above).
//!
//! An acquire whose outcome is unknown creates no interval (the client never believed it
//! held), and an unknown release still ends the interval at its send: the client stops
//! considering itself a holder when it sends the release: a hold ends, for the client, when it
//! lets go. The
//! server side may still keep such a hold until the lease ends; the read checks below allow
//! for that.
//!
//! # Checks
//!
//! - **capacity (client view)**: at every instant, for every semaphore, the weights of the
//!   hold intervals covering it sum to at most the permits.
//! - **capacity (server view)**: every semaphore returned by acquire/release shows
//!   `active_holds <= permits`; every holder list sums to at most the permits and has unique
//!   tokens.
//! - **fencing**: every `ACQUIRED` carries a token; tokens are unique across the cluster; if
//!   grant A was acknowledged before grant B was invoked, `token(A) < token(B)`.
//! - **durability of holds**: a linearizable holder read R of `S` (sent at `ri`, answered at
//!   `rc`) lists, with its token and weight, every hold interval of `S` that began before `ri`
//!   and ends after `rc` (the client still believed it held, so its lease had not expired on
//!   the server, and no release or revoke had been sent).
//! - **no phantom or resurrected holds**: every holder `(L, T)` that R lists is explained:
//!   an acquire by `L` of `S` with an unknown outcome was sent before `rc`, or an acquire
//!   acknowledged with token `T` and weight `w` exists, sent before `rc`, with no release of
//!   `S` by `L` acknowledged after it and before `ri`; and no revoke of `L` was acknowledged
//!   before `ri`.
//! - **durability of leases and revokes**: a linearizable lease list sent at `ri` contains no
//!   lease whose revoke was acknowledged before `ri`, and contains every lease still believed
//!   alive at `rc`.
//! - **all or none**: an all-or-none acquire (`AcquireSemaphores`) acknowledged `ACQUIRED`
//!   carries one token per member, consecutive and increasing: the members were granted in one
//!   applied entry with no other grant between. Each member then makes a hold interval of its
//!   own (ended by the release of that member), so the capacity, fencing and read checks above
//!   cover every member.
//! - **no unexpected errors**: no `InvalidArgument`, `AlreadyExists`, `ResourceExhausted` or
//!   `Internal` answers (the workload only sends valid requests), including a
//!   `ResourceExhausted` made by the client from a connection the server ended (recorded as
//!   unknown: the call may have been applied).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::history::{Micros, OkValue, Op, OpKind, Outcome, fmt_micros};

#[derive(Clone, Debug)]
pub struct CheckConfig {
    /// Semaphore name → permits.
    pub permits: BTreeMap<String, u64>,
    /// The client's lease loss bound (`ttl − margin`).
    pub loss_after: Duration,
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub check: &'static str,
    pub message: String,
    /// The offending operations.
    pub ops: Vec<Op>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "VIOLATION [{}] {}", self.check, self.message)?;
        for op in &self.ops {
            writeln!(f, "    {op}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Default)]
pub struct CheckStats {
    pub grants: usize,
    pub hold_intervals: usize,
    pub holder_reads_checked: usize,
    pub lease_reads_checked: usize,
    /// All-or-none acquires acknowledged `ACQUIRED`.
    pub set_grants: usize,
    /// Semaphore → the largest total weight clients believed they held at once.
    pub max_believed: BTreeMap<String, u64>,
}

/// At most this many violations of one kind are reported (the rest are counted).
const MAX_PER_CHECK: usize = 10;

/// What [`check`] found.
#[derive(Clone, Debug, Default)]
pub struct CheckResult {
    /// The first few violations of each check, with their operations.
    pub violations: Vec<Violation>,
    /// Check → number of violations (shown or not).
    pub per_check: BTreeMap<&'static str, usize>,
    pub stats: CheckStats,
}

impl CheckResult {
    pub fn total(&self) -> usize {
        self.per_check.values().sum()
    }

    pub(super) fn add(&mut self, check: &'static str, message: String, ops: Vec<&Op>) {
        let n = self.per_check.entry(check).or_default();
        *n += 1;
        if *n <= MAX_PER_CHECK {
            self.violations.push(Violation {
                check,
                message,
                ops: ops.into_iter().cloned().collect(),
            });
        }
    }
}

/// What the history says about one lease.
#[derive(Debug)]
pub(super) struct LeaseBelief {
    pub(super) create: usize,
    /// The create was acknowledged.
    pub(super) since: Micros,
    /// Belief ends (exclusive).
    pub(super) until: Micros,
    /// First acknowledged revoke.
    pub(super) revoked_at: Option<(Micros, usize)>,
}

#[derive(Debug, Clone)]
pub(super) struct Hold {
    pub(super) acquire: usize,
    pub(super) release: Option<usize>,
    pub(super) lease: String,
    pub(super) sem: String,
    pub(super) weight: u64,
    pub(super) token: u64,
    pub(super) start: Micros,
    pub(super) end: Micros,
}

pub(super) fn micros(d: Duration) -> Micros {
    d.as_micros() as Micros
}

pub(super) fn is_not_sent(op: &Op) -> bool {
    matches!(&op.outcome, Outcome::Fail { code, .. } if code == "NotSent")
}

pub(super) fn lease_beliefs(ops: &[Op], loss_after: Micros) -> BTreeMap<String, LeaseBelief> {
    let mut beliefs = BTreeMap::new();
    for op in ops {
        if let (OpKind::CreateLease { .. }, Outcome::Ok(OkValue::Lease { lease })) =
            (&op.kind, &op.outcome)
        {
            beliefs.insert(
                lease.clone(),
                LeaseBelief {
                    create: op.id,
                    since: op.end(),
                    until: op.invoke.saturating_add(loss_after),
                    revoked_at: None,
                },
            );
        }
    }
    let mut refreshes: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        let Some(lease) = op.kind.lease() else {
            continue;
        };
        if let OpKind::Refresh { .. } = op.kind
            && op.outcome.is_ok()
        {
            refreshes.entry(lease).or_default().push(op);
        }
    }
    for (lease, belief) in beliefs.iter_mut() {
        let mut list = refreshes.remove(lease.as_str()).unwrap_or_default();
        list.sort_by_key(|op| op.end());
        for r in list {
            if r.end() >= belief.until {
                break; // too late: lost
            }
            belief.until = belief.until.max(r.invoke.saturating_add(loss_after));
        }
    }
    for op in ops {
        let Some(lease) = op.kind.lease() else {
            continue;
        };
        let Some(belief) = beliefs.get_mut(lease) else {
            continue;
        };
        if op.outcome.is_not_found() {
            belief.until = belief.until.min(op.end());
        }
        if let OpKind::Revoke { .. } = op.kind {
            belief.until = belief.until.min(op.invoke);
            if op.outcome.is_ok() && belief.revoked_at.is_none_or(|(t, _)| op.end() < t) {
                belief.revoked_at = Some((op.end(), op.id));
            }
        }
    }
    beliefs
}

pub(super) fn holds(ops: &[Op], beliefs: &BTreeMap<String, LeaseBelief>) -> Vec<Hold> {
    // (lease, sem) -> releases sent, in send order
    let mut releases: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for op in ops {
        if let OpKind::Release { lease, sem } = &op.kind
            && !is_not_sent(op)
        {
            releases.entry((lease, sem)).or_default().push(op);
        }
    }
    for list in releases.values_mut() {
        list.sort_by_key(|op| op.invoke);
    }
    let mut out = Vec::new();
    for op in ops {
        // A single acquire's one member, or every member of a granted set.
        let granted: Vec<(&String, &String, u64, u64)> = match (&op.kind, &op.outcome) {
            (
                OpKind::Acquire {
                    lease, sem, weight, ..
                },
                _,
            ) => op
                .token()
                .map(|t| (lease, sem, *weight, t))
                .into_iter()
                .collect(),
            (
                OpKind::AcquireSet { lease, members, .. },
                Outcome::Ok(OkValue::SetAcquired { tokens }),
            ) => members
                .iter()
                .zip(tokens)
                .map(|((sem, weight), token)| (lease, sem, *weight, *token))
                .collect(),
            _ => Vec::new(),
        };
        for (lease, sem, weight, token) in granted {
            let start = op.end();
            let mut end = beliefs.get(lease).map(|b| b.until).unwrap_or(start);
            let release = releases
                .get(&(lease.as_str(), sem.as_str()))
                .and_then(|list| list.iter().find(|r| r.invoke >= op.invoke).copied());
            if let Some(r) = release {
                end = end.min(r.invoke);
            }
            out.push(Hold {
                acquire: op.id,
                release: release.map(|r| r.id),
                lease: lease.clone(),
                sem: sem.clone(),
                weight: weight.max(1),
                token,
                start,
                end,
            });
        }
    }
    out
}

/// Runs every history check.
pub fn check(ops: &[Op], config: &CheckConfig) -> CheckResult {
    let mut report = CheckResult::default();
    let mut stats = CheckStats::default();
    let by_id: BTreeMap<usize, &Op> = ops.iter().map(|op| (op.id, op)).collect();
    let op = |id: usize| -> &Op { by_id[&id] };
    let beliefs = lease_beliefs(ops, micros(config.loss_after));
    let all_holds = holds(ops, &beliefs);
    stats.grants = all_holds.len();

    // Hold intervals that exist (start before end), by semaphore.
    let mut intervals: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for h in &all_holds {
        if h.start < h.end {
            intervals.entry(h.sem.as_str()).or_default().push(h);
            stats.hold_intervals += 1;
        }
    }

    // ---- capacity, client view ----
    for (sem, list) in &intervals {
        let permits = config.permits.get(*sem).copied().unwrap_or(0);
        let mut events: Vec<(Micros, u8, usize)> = Vec::new();
        for (i, h) in list.iter().enumerate() {
            events.push((h.start, 1, i));
            events.push((h.end, 0, i)); // ends sort before starts at the same instant
        }
        events.sort();
        let mut active: BTreeSet<usize> = BTreeSet::new();
        let mut held = 0u64;
        let mut max_held = 0u64;
        for (t, kind, i) in events {
            if kind == 0 {
                if active.remove(&i) {
                    held -= list[i].weight;
                }
                continue;
            }
            active.insert(i);
            held += list[i].weight;
            max_held = max_held.max(held);
            if held > permits {
                let mut offending = Vec::new();
                let mut detail = Vec::new();
                for &j in &active {
                    let h = list[j];
                    offending.push(op(h.acquire));
                    if let Some(r) = h.release {
                        offending.push(op(r));
                    }
                    detail.push(format!(
                        "{} w={} token={} held {}..{}",
                        h.lease,
                        h.weight,
                        h.token,
                        fmt_micros(h.start),
                        fmt_micros(h.end)
                    ));
                }
                report.add(
                    "capacity",
                    format!(
                        "at {} clients believed they held {held} of {sem}'s {permits} permits: {}",
                        fmt_micros(t),
                        detail.join("; ")
                    ),
                    offending,
                );
            }
        }
        stats.max_believed.insert(sem.to_string(), max_held);
    }

    // ---- fencing ----
    let mut by_token: BTreeMap<u64, &Hold> = BTreeMap::new();
    for h in &all_holds {
        if h.token == 0 {
            report.add(
                "fencing",
                "ACQUIRED without a fencing token".into(),
                vec![op(h.acquire)],
            );
            continue;
        }
        if let Some(other) = by_token.insert(h.token, h) {
            report.add(
                "fencing",
                format!("token {} granted twice", h.token),
                vec![op(other.acquire), op(h.acquire)],
            );
        }
    }
    {
        let mut by_ack: Vec<&Hold> = all_holds.iter().collect();
        by_ack.sort_by_key(|h| h.start);
        let mut by_invoke: Vec<&Hold> = all_holds.iter().collect();
        by_invoke.sort_by_key(|h| op(h.acquire).invoke);
        let mut next = 0;
        let mut best: Option<&Hold> = None;
        for b in by_invoke {
            let invoke = op(b.acquire).invoke;
            while next < by_ack.len() && by_ack[next].start < invoke {
                if best.is_none_or(|x| by_ack[next].token > x.token) {
                    best = Some(by_ack[next]);
                }
                next += 1;
            }
            if let Some(a) = best
                && a.token >= b.token
            {
                report.add(
                    "fencing",
                    format!(
                        "grant with token {} was acknowledged before a grant with token {} was requested",
                        a.token, b.token
                    ),
                    vec![op(a.acquire), op(b.acquire)],
                );
            }
        }
    }

    // ---- capacity, server view (every reply that shows the semaphore) ----
    for o in ops {
        if let Outcome::Ok(
            OkValue::Acquired {
                active_holds,
                permits,
                ..
            }
            | OkValue::NotAcquired {
                active_holds,
                permits,
                ..
            }
            | OkValue::Released {
                active_holds,
                permits,
            },
        ) = &o.outcome
            && active_holds > permits
        {
            report.add(
                "capacity-server",
                format!("reply shows {active_holds} held of {permits} permits"),
                vec![o],
            );
        }
    }

    // ---- holder reads ----
    let mut acquires_of: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    let mut releases_of: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for o in ops {
        match &o.kind {
            OpKind::Acquire { lease, sem, .. } => {
                acquires_of.entry((lease, sem)).or_default().push(o)
            }
            OpKind::AcquireSet { lease, members, .. } => {
                for (sem, _) in members {
                    acquires_of.entry((lease, sem)).or_default().push(o);
                }
            }
            OpKind::Release { lease, sem } => releases_of.entry((lease, sem)).or_default().push(o),
            _ => {}
        }
    }
    for read in ops {
        let (OpKind::ReadHolders { sem }, Outcome::Ok(OkValue::Holders { holders })) =
            (&read.kind, &read.outcome)
        else {
            continue;
        };
        stats.holder_reads_checked += 1;
        let (ri, rc) = (read.invoke, read.end());
        let permits = config.permits.get(sem).copied().unwrap_or(0);
        let total: u64 = holders.iter().map(|h| h.weight).sum();
        if total > permits {
            report.add(
                "capacity-server",
                format!("{sem} lists holders of total weight {total} > {permits} permits"),
                vec![read],
            );
        }
        let tokens: BTreeSet<u64> = holders.iter().map(|h| h.token).collect();
        if tokens.len() != holders.len() {
            report.add(
                "fencing",
                format!("{sem} lists two holders with the same token"),
                vec![read],
            );
        }
        // (a) every hold the client still believed in is there.
        for h in intervals.get(sem.as_str()).into_iter().flatten() {
            if !(h.start < ri && h.end > rc) {
                continue;
            }
            match holders.iter().find(|x| x.lease == h.lease) {
                None => report.add(
                    "lost-acquire",
                    format!(
                        "acknowledged hold of {sem} by {} (token {}) missing from a later read",
                        h.lease, h.token
                    ),
                    vec![op(h.acquire), read],
                ),
                Some(x) if x.token != h.token || x.weight != h.weight => report.add(
                    "lost-acquire",
                    format!(
                        "hold of {sem} by {} was granted with token {} weight {}, read shows token {} weight {}",
                        h.lease, h.token, h.weight, x.token, x.weight
                    ),
                    vec![op(h.acquire), read],
                ),
                Some(_) => {}
            }
        }
        // (b) everything listed is explained by the history.
        for x in holders {
            if let Some(b) = beliefs.get(&x.lease)
                && let Some((at, revoke)) = b.revoked_at
                && at < ri
            {
                report.add(
                    "lost-revoke",
                    format!(
                        "{} still holds {sem} (token {}) after its revoke was acknowledged",
                        x.lease, x.token
                    ),
                    vec![op(revoke), read],
                );
                continue;
            }
            let acquires: Vec<&Op> = acquires_of
                .get(&(x.lease.as_str(), sem.as_str()))
                .map(|v| v.iter().copied().filter(|a| a.invoke < rc).collect())
                .unwrap_or_default();
            if acquires.iter().any(|a| a.outcome.is_unknown()) {
                continue; // an acquire that may have taken effect at any time
            }
            let granted = acquires.iter().find(|a| a.token_of(sem) == Some(x.token));
            let Some(granted) = granted else {
                let mut shown = acquires.clone();
                shown.push(read);
                report.add(
                    "phantom-hold",
                    format!(
                        "{} holds {sem} with token {} that no acquire of it was granted",
                        x.lease, x.token
                    ),
                    shown,
                );
                continue;
            };
            if let Some(weight) = granted.weight_of(sem)
                && weight != x.weight
            {
                report.add(
                    "phantom-hold",
                    format!(
                        "{} holds {sem} with weight {}, acquired with weight {weight}",
                        x.lease, x.weight
                    ),
                    vec![granted, read],
                );
            }
            let released = releases_of
                .get(&(x.lease.as_str(), sem.as_str()))
                .and_then(|v| {
                    v.iter()
                        .find(|r| r.outcome.is_ok() && r.invoke >= granted.invoke && r.end() < ri)
                });
            if let Some(r) = released {
                report.add(
                    "lost-release",
                    format!(
                        "{} still holds {sem} (token {}) after its release was acknowledged",
                        x.lease, x.token
                    ),
                    vec![granted, r, read],
                );
            }
        }
    }

    // ---- lease reads ----
    for read in ops {
        let (OpKind::ReadLeases, Outcome::Ok(OkValue::Leases { leases })) =
            (&read.kind, &read.outcome)
        else {
            continue;
        };
        stats.lease_reads_checked += 1;
        let (ri, rc) = (read.invoke, read.end());
        let listed: BTreeSet<&str> = leases.iter().map(String::as_str).collect();
        for (lease, b) in &beliefs {
            if let Some((at, revoke)) = b.revoked_at
                && at < ri
                && listed.contains(lease.as_str())
            {
                report.add(
                    "lost-revoke",
                    format!("{lease} is listed after its revoke was acknowledged"),
                    vec![op(revoke), read],
                );
            }
            if b.since < ri && b.until > rc && !listed.contains(lease.as_str()) {
                report.add(
                    "lost-lease",
                    format!(
                        "{lease} is missing although refreshed in time (believed alive until {})",
                        fmt_micros(b.until)
                    ),
                    vec![op(b.create), read],
                );
            }
        }
    }

    // ---- all or none ----
    for o in ops {
        let (OpKind::AcquireSet { members, .. }, Outcome::Ok(OkValue::SetAcquired { tokens })) =
            (&o.kind, &o.outcome)
        else {
            continue;
        };
        stats.set_grants += 1;
        let consecutive = tokens.windows(2).all(|w| w[0].checked_add(1) == Some(w[1]));
        if tokens.len() != members.len() || !consecutive || tokens.contains(&0) {
            report.add(
                "all-or-none",
                format!(
                    "a set of {} members was granted tokens {tokens:?}: not one per member in one entry",
                    members.len()
                ),
                vec![o],
            );
        }
    }

    // ---- unexpected errors ----
    for o in ops {
        let unexpected = match &o.outcome {
            Outcome::Fail { code, .. } => {
                matches!(
                    code.as_str(),
                    "InvalidArgument" | "AlreadyExists" | "ResourceExhausted"
                )
            }
            // An HTTP/2 connection ended by the server with ENHANCE_YOUR_CALM: no quota
            // refused the call. A connection a stopping node closed gracefully (GOAWAY with
            // NO_ERROR, which tonic reports as Internal) is a node going away, as expected
            // under faults: the call's outcome is unknown, and nothing went wrong.
            Outcome::Unknown { reason } => {
                (reason.starts_with("Internal") || reason.starts_with("ResourceExhausted"))
                    && !super::history::closed_gracefully(reason)
            }
            _ => false,
        };
        if unexpected {
            report.add("unexpected-error", "unexpected error".into(), vec![o]);
        }
    }

    report.stats = stats;
    report
}

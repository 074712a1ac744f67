//! Property tests: random histories over 2 namespaces x 3 semaphores x 4 leases with small
//! permits, random weights and waits, time moving forwards and sometimes backwards, invalid
//! input mixed in, and snapshot -> restore as one of the operations. Some commands carry a
//! fresh request id, and some repeat an earlier one (a client's retry).
//!
//! Each history runs on two states:
//! - `whole`: every batch applied at once, never snapshotted;
//! - `split`: the same batches applied one command per batch (equivalent by construction: the
//!   clock only moves per batch and reaping happens before every command), restored from its
//!   own snapshot whenever the history says so, and checked against a model of the queues.
//!
//! After every batch: both states' invariants hold, their replies, events and hashes agree, and
//! no semaphore holds more than its permits. Grants come from the head of the queue in strict
//! FIFO order, and fencing tokens strictly increase. All-or-none acquires (`AcquireSet`) are
//! mixed in: a set is granted every member in one command (never some of them), an immediate
//! set grant jumps no member's queue, and the invariants check that a waiting set holds none
//! of its members and stands in the same relative order in every queue. At the end, replaying the recorded batches
//! on a fresh state gives the same replies and hash (determinism). A repeat of a request id
//! whose first reply was final, within its retention, answers that reply, emits nothing and
//! leaves the state hash unchanged.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;

use super::limits::{PERMITS_MAX, REQUEST_RETENTION_NS};
use super::*;

const S: Nanos = NANOS_PER_SEC;
const NAMESPACES: [&str; 3] = ["a", "b", "bad name!"];
const SEMAPHORES: [&str; 4] = ["s0", "s1", "s2", "gone"];

#[derive(Clone, Debug)]
enum GiveUpDeadline {
    /// The waiter's current deadline (what its latest caller would send).
    Current,
    /// One nanosecond before it (an older caller whose wait was re-attached).
    Earlier,
    Extreme(Nanos),
}

#[derive(Clone, Debug)]
enum GenCmd {
    CreateNamespace(usize),
    UpdateNamespace(usize, u64),
    DeleteNamespace(usize),
    /// Namespace, semaphore, permits, hold limit.
    CreateSemaphore(usize, usize, u64, Nanos),
    UpdateSemaphore(usize, usize, u64, u64),
    /// Update with the semaphore's current version (so it can succeed).
    UpdateSemaphoreCurrent(usize, usize, u64),
    DeleteSemaphore(usize, usize),
    CreateLease(usize, u64, usize),
    RefreshLease(usize, usize, u64),
    RevokeLease(usize, usize),
    /// Namespace, semaphore, lease slot, weight, wait, hold limit.
    Acquire(usize, usize, usize, u64, Nanos, Nanos),
    /// All or none: namespace, lease slot, (semaphore, weight) members, wait, hold limit.
    AcquireSet(usize, usize, Vec<(usize, u64)>, Nanos, Nanos),
    Release(usize, usize, usize),
    /// Release by whichever lease is the k-th holder (mod count) of the semaphore.
    ReleaseHolder(usize, usize, usize),
    /// Give up for whichever lease is the k-th waiter (mod count) of the semaphore.
    GiveUpWaiter(usize, usize, usize, GiveUpDeadline),
    GiveUp(usize, usize, usize, GiveUpDeadline),
    Expire,
    ExtendLeases,
    /// The command with a fresh request id.
    WithId(Box<GenCmd>),
    /// The k-th most recent command sent with a request id, sent again (a retry).
    Repeat(usize),
    /// An access control command, used as is.
    Auth(Cmd),
    /// Quotas for a namespace: semaphores, leases, entries, bytes (small, so they bind).
    SetQuotas(usize, u64, u64, u64, u64),
    SetBudget(u64),
    /// A lock lease in a namespace, with a TTL.
    CreateLockLease(usize, u64),
    /// Namespace, lock path (index into `LOCK_PATHS`), lock lease slot, exclusive, wait.
    AcquireLock(usize, usize, usize, bool, Nanos),
    ReleaseLock(usize, usize, usize),
    DeleteLock(usize, usize),
    /// An administrator's revoke of a holder of a semaphore: namespace, semaphore, lease slot,
    /// reason (0: a reason; 1: empty; 2: one byte too long).
    RevokeHolder(usize, usize, usize, usize),
}

const LOCK_PATHS: [&str; 3] = ["l", "l/x", "m"];

#[derive(Clone, Debug)]
enum Op {
    Batch {
        dt_ns: Nanos,
        cmds: Vec<GenCmd>,
    },
    Snapshot,
    Read {
        ns: usize,
        sem: usize,
        token: String,
        limit: i32,
    },
}

/// The hold limit an acquire's grant answered (0: none, or not a grant); of a set's grants,
/// the largest.
fn hold_ns(reply: &Reply) -> Nanos {
    match reply {
        Ok(Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Acquired { hold_ns, .. },
            ..
        })) => *hold_ns,
        Ok(Outcome::AcquireSet(AcquireSetReply {
            status: AcquireSetStatus::Acquired { grants },
            ..
        })) => grants.iter().map(|g| g.hold_ns).max().unwrap_or(0),
        _ => 0,
    }
}

/// `reply` with a grant's hold limit left out.
fn without_hold(reply: &Reply) -> Reply {
    let mut reply = reply.clone();
    if let Ok(Outcome::Acquire(AcquireReply {
        status: AcquireStatus::Acquired { hold_ns, .. },
        ..
    })) = &mut reply
    {
        *hold_ns = 0;
    }
    if let Ok(Outcome::AcquireSet(AcquireSetReply {
        status: AcquireSetStatus::Acquired { grants },
        ..
    })) = &mut reply
    {
        for grant in grants {
            grant.hold_ns = 0;
        }
    }
    reply
}

fn ns_index() -> impl Strategy<Value = usize> {
    prop_oneof![30 => 0..2usize, 1 => Just(2usize)]
}

fn sem_index() -> impl Strategy<Value = usize> {
    prop_oneof![30 => 0..3usize, 1 => Just(3usize)]
}

fn lease_slot() -> impl Strategy<Value = usize> {
    prop_oneof![30 => 0..4usize, 1 => Just(4usize)]
}

fn weight() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 0..=2u64, 10 => 3..=4u64, 1 => Just(u64::MAX), 1 => Just(PERMITS_MAX + 1)]
}

fn wait_ns() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        12 => Just(0),
        24 => (1..=30i64).prop_map(|s| s * S),
        2 => Just(300 * S),
        1 => Just(-1),
        1 => Just(301 * S),
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
    ]
}

/// A hold limit: mostly none, sometimes a few seconds (so holds end within a history), rarely
/// out of range.
fn max_hold_ns() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        12 => Just(0),
        6 => (1..=20i64).prop_map(|s| s * S),
        1 => Just(S - 1),
        1 => Just(-S),
    ]
}

fn permits() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 1..=4u64, 1 => Just(0u64), 1 => Just(u64::MAX)]
}

fn ttl_s() -> impl Strategy<Value = u64> {
    prop_oneof![30 => 5..=60u64, 1 => Just(0u64), 1 => Just(301u64), 1 => Just(u64::MAX)]
}

fn give_up_deadline() -> impl Strategy<Value = GiveUpDeadline> {
    prop_oneof![
        4 => Just(GiveUpDeadline::Current),
        2 => Just(GiveUpDeadline::Earlier),
        1 => prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0)].prop_map(GiveUpDeadline::Extreme),
    ]
}

fn gen_cmd() -> impl Strategy<Value = GenCmd> {
    prop_oneof![
        4 => ns_index().prop_map(GenCmd::CreateNamespace),
        2 => (ns_index(), 0..4u64).prop_map(|(n, v)| GenCmd::UpdateNamespace(n, v)),
        1 => ns_index().prop_map(GenCmd::DeleteNamespace),
        12 => (ns_index(), sem_index(), permits(), max_hold_ns()).prop_map(|(n, s, p, h)| GenCmd::CreateSemaphore(n, s, p, h)),
        3 => (ns_index(), sem_index(), permits()).prop_map(|(n, s, p)| GenCmd::UpdateSemaphoreCurrent(n, s, p)),
        6 => (ns_index(), sem_index(), permits(), 0..4u64).prop_map(|(n, s, p, v)| GenCmd::UpdateSemaphore(n, s, p, v)),
        2 => (ns_index(), sem_index()).prop_map(|(n, s)| GenCmd::DeleteSemaphore(n, s)),
        20 => (ns_index(), ttl_s(), 0..3usize).prop_map(|(n, t, p)| GenCmd::CreateLease(n, t, p)),
        20 => (ns_index(), lease_slot(), prop_oneof![Just(0u64), ttl_s()]).prop_map(|(n, l, t)| GenCmd::RefreshLease(n, l, t)),
        3 => (ns_index(), lease_slot()).prop_map(|(n, l)| GenCmd::RevokeLease(n, l)),
        60 => (ns_index(), sem_index(), lease_slot(), weight(), wait_ns(), max_hold_ns())
            .prop_map(|(n, s, l, w, t, h)| GenCmd::Acquire(n, s, l, w, t, h)),
        15 => (ns_index(), lease_slot(), prop::collection::vec((sem_index(), weight()), 1..=4), wait_ns(), max_hold_ns())
            .prop_map(|(n, l, m, t, h)| GenCmd::AcquireSet(n, l, m, t, h)),
        8 => (ns_index(), sem_index(), lease_slot()).prop_map(|(n, s, l)| GenCmd::Release(n, s, l)),
        16 => (ns_index(), sem_index(), 0..4usize).prop_map(|(n, s, k)| GenCmd::ReleaseHolder(n, s, k)),
        6 => (ns_index(), sem_index(), 0..4usize, give_up_deadline())
            .prop_map(|(n, s, k, d)| GenCmd::GiveUpWaiter(n, s, k, d)),
        12 => (ns_index(), sem_index(), lease_slot(), give_up_deadline())
            .prop_map(|(n, s, l, d)| GenCmd::GiveUp(n, s, l, d)),
        4 => Just(GenCmd::Expire),
        2 => Just(GenCmd::ExtendLeases),
        6 => auth_cmd().prop_map(GenCmd::Auth),
        2 => (ns_index(), 0..4u64, 0..6u64, 0..8u64, prop_oneof![Just(0u64), 300..3_000u64, Just(64u64 << 20)])
            .prop_map(|(n, s, l, e, b)| GenCmd::SetQuotas(n, s, l, e, b)),
        1 => prop_oneof![500..5_000u64, Just(512u64 << 20)].prop_map(GenCmd::SetBudget),
        4 => (ns_index(), ttl_s()).prop_map(|(n, t)| GenCmd::CreateLockLease(n, t)),
        10 => (ns_index(), 0..LOCK_PATHS.len(), lease_slot(), any::<bool>(), wait_ns())
            .prop_map(|(n, p, l, e, t)| GenCmd::AcquireLock(n, p, l, e, t)),
        4 => (ns_index(), 0..LOCK_PATHS.len(), lease_slot()).prop_map(|(n, p, l)| GenCmd::ReleaseLock(n, p, l)),
        1 => (ns_index(), 0..LOCK_PATHS.len()).prop_map(|(n, p)| GenCmd::DeleteLock(n, p)),
        3 => (ns_index(), sem_index(), lease_slot(), prop_oneof![8 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)])
            .prop_map(|(n, s, l, r)| GenCmd::RevokeHolder(n, s, l, r)),
    ]
}

/// Access control commands over 3 role names (one invalid), a few namespaces and 4 hashes.
fn auth_cmd() -> impl Strategy<Value = Cmd> {
    use super::auth::Permission;
    let role = || prop_oneof![Just("r0"), Just("r1"), Just("bad role!")].prop_map(String::from);
    let grant_ns = || prop_oneof![Just("a"), Just("b"), Just("*"), Just("")].prop_map(String::from);
    let perm = || {
        prop_oneof![
            Just(Permission::Read),
            Just(Permission::Acquire),
            Just(Permission::Write),
            Just(Permission::Admin)
        ]
    };
    let hash = || (0..4u8).prop_map(|b| [b; 32]);
    prop_oneof![
        2 => Just(Cmd::AuthEnable),
        1 => Just(Cmd::AuthDisable),
        3 => (role(), any::<bool>()).prop_map(|(name, cluster_admin)| Cmd::RoleCreate { name, cluster_admin }),
        3 => (role(), grant_ns(), perm()).prop_map(|(role, ns, perm)| Cmd::RoleGrant { role, ns, perm }),
        1 => (role(), grant_ns()).prop_map(|(role, ns)| Cmd::RoleRevoke { role, ns }),
        1 => role().prop_map(|name| Cmd::RoleDelete { name }),
        3 => (role(), hash()).prop_map(|(role, hash)| Cmd::TokenCreate { name: "t".into(), role, hash }),
        2 => (0..5u64).prop_map(|n| Cmd::TokenRevoke { id: format!("tk_{n}") }),
        1 => hash().prop_map(|hash| Cmd::AuthBootstrap { hash }),
    ]
    .prop_flat_map(move |cmd| {
        // Sent with one of the tokens, or none.
        prop_oneof![
            1 => Just(None),
            2 => hash().prop_map(Some),
        ]
        .prop_map(move |token| match cmd {
            Cmd::AuthBootstrap { .. } => cmd.clone(),
            _ => cmd.clone().with_token(token),
        })
    })
}

/// A contended mix: one namespace, a few leases fighting over small semaphores.
fn contended_cmd() -> impl Strategy<Value = GenCmd> {
    prop_oneof![
        30 => (Just(0usize), 0..2usize, 0..4usize, 0..=3u64, prop_oneof![1 => Just(0i64), 4 => (1..=20i64).prop_map(|s| s * S)], max_hold_ns())
            .prop_map(|(n, s, l, w, t, h)| GenCmd::Acquire(n, s, l, w, t, h)),
        10 => (Just(0usize), 0..4usize, prop::collection::vec((0..3usize, 1..=2u64), 2..=3), prop_oneof![1 => Just(0i64), 4 => (1..=20i64).prop_map(|s| s * S)], max_hold_ns())
            .prop_map(|(n, l, m, t, h)| GenCmd::AcquireSet(n, l, m, t, h)),
        12 => (Just(0usize), 0..2usize, 0..4usize).prop_map(|(n, s, k)| GenCmd::ReleaseHolder(n, s, k)),
        6 => (Just(0usize), 0..2usize, 0..4usize, give_up_deadline())
            .prop_map(|(n, s, k, d)| GenCmd::GiveUpWaiter(n, s, k, d)),
        6 => (Just(0usize), 0..4usize, prop_oneof![Just(0u64), 5..=20u64]).prop_map(|(n, l, t)| GenCmd::RefreshLease(n, l, t)),
        4 => (Just(0usize), 5..=30u64, 0..3usize).prop_map(|(n, t, p)| GenCmd::CreateLease(n, t, p)),
        2 => (Just(0usize), 0..4usize).prop_map(|(n, l)| GenCmd::RevokeLease(n, l)),
        3 => (Just(0usize), 0..2usize, 1..=4u64).prop_map(|(n, s, p)| GenCmd::UpdateSemaphoreCurrent(n, s, p)),
        3 => Just(GenCmd::Expire),
        1 => Just(GenCmd::ExtendLeases),
        1 => (Just(0usize), 0..2usize).prop_map(|(n, s)| GenCmd::DeleteSemaphore(n, s)),
        2 => (Just(0usize), 0..2usize, 1..=3u64, max_hold_ns()).prop_map(|(n, s, p, h)| GenCmd::CreateSemaphore(n, s, p, h)),
    ]
}

fn contended_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (prop_oneof![10 => 0..=S, 3 => 0..=8 * S, 1 => (-2 * S)..0], prop::collection::vec(with_ids(contended_cmd), 0..5))
            .prop_map(|(dt_ns, cmds)| Op::Batch { dt_ns, cmds }),
        1 => Just(Op::Snapshot),
    ]
}

fn dt_ns() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        100 => 0..=S,
        20 => 0..=5 * S,
        10 => 0..=20 * S,
        10 => (-3 * S)..0,
        1 => Just(i64::MAX / 2),
        1 => Just(i64::MIN / 2),
    ]
}

/// Some commands with a request id, some repeats of one.
fn with_ids<S: Strategy<Value = GenCmd> + 'static>(
    cmd: fn() -> S,
) -> impl Strategy<Value = GenCmd> {
    prop_oneof![
        6 => cmd(),
        3 => cmd().prop_map(|c| GenCmd::WithId(Box::new(c))),
        2 => (0..4usize).prop_map(GenCmd::Repeat),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (dt_ns(), prop::collection::vec(with_ids(gen_cmd), 0..6)).prop_map(|(dt_ns, cmds)| Op::Batch { dt_ns, cmds }),
        1 => Just(Op::Snapshot),
        1 => (ns_index(), sem_index(), prop_oneof![Just(String::new()), Just("f.00".to_string()), Just("b.7a".to_string()), "[a-zA-Z.0-9]{0,12}"], -2..300i32)
            .prop_map(|(ns, sem, token, limit)| Op::Read { ns, sem, token, limit }),
    ]
}

/// Turns generated commands into concrete ones: lease slots become the ids that `CreateLease`
/// returned (the k-th most recent in that namespace), deadlines come from the current waiter.
struct Harness {
    /// Lease ids per namespace name, in creation order.
    leases: BTreeMap<String, Vec<String>>,
    /// Lock lease ids per namespace name, in creation order.
    lock_leases: BTreeMap<String, Vec<String>>,
    now_ns: Nanos,
    /// Every command sent with a request id, in order.
    onces: RefCell<Vec<Cmd>>,
    /// Per request id: its first final reply and the state clock then, or `None` when the id
    /// is not checked (its first reply was a queued acquire, settled later by the state).
    first_replies: BTreeMap<String, Option<(Outcome, Nanos)>>,
}

impl Harness {
    fn lease(&self, ns: &str, slot: usize) -> String {
        if slot >= 4 {
            return "ls_garbage".to_string();
        }
        self.leases
            .get(ns)
            .and_then(|ids| ids.len().checked_sub(slot + 1).and_then(|i| ids.get(i)))
            .cloned()
            .unwrap_or_else(|| "ls_00000000000000630badf00d".to_string())
    }

    fn concrete(&self, state: &State, cmd: &GenCmd) -> Cmd {
        let ns = |i: usize| NAMESPACES[i].to_string();
        let sem = |i: usize| SEMAPHORES[i].to_string();
        match cmd.clone() {
            GenCmd::CreateNamespace(n) => Cmd::CreateNamespace {
                name: ns(n),
                description: "d".into(),
                metadata: Metadata::new(),
            },
            GenCmd::UpdateNamespace(n, v) => Cmd::UpdateNamespace {
                name: ns(n),
                description: String::new(),
                metadata: [("k".to_string(), "v".to_string())].into(),
                expected_version: v,
            },
            GenCmd::DeleteNamespace(n) => Cmd::DeleteNamespace { name: ns(n) },
            GenCmd::CreateSemaphore(n, s, p, h) => Cmd::CreateSemaphore {
                ns: ns(n),
                name: sem(s),
                description: String::new(),
                permits: p,
                metadata: Metadata::new(),
                max_hold_ns: h,
            },
            GenCmd::UpdateSemaphore(n, s, p, v) => Cmd::UpdateSemaphore {
                ns: ns(n),
                name: sem(s),
                description: String::new(),
                permits: p,
                metadata: Metadata::new(),
                expected_version: v,
                max_hold_ns: None,
            },
            GenCmd::UpdateSemaphoreCurrent(n, s, p) => Cmd::UpdateSemaphore {
                ns: ns(n),
                name: sem(s),
                description: String::new(),
                permits: p,
                metadata: Metadata::new(),
                expected_version: unfiltered(state)
                    .get_semaphore(&ns(n), &sem(s))
                    .map_or(1, |v| v.version),
                // Permits decide which of the three an update does to the hold limit.
                max_hold_ns: match p % 3 {
                    0 => None,
                    1 => Some(0),
                    _ => Some(p as Nanos * S),
                },
            },
            GenCmd::DeleteSemaphore(n, s) => Cmd::DeleteSemaphore {
                ns: ns(n),
                name: sem(s),
            },
            GenCmd::CreateLease(n, t, p) => Cmd::CreateLease {
                ns: ns(n),
                kind: LeaseKind::Semaphore,
                process_id: format!("p{p}"),
                ttl_s: t,
                metadata: Metadata::new(),
                secret: (t << 8) ^ p as u64,
            },
            GenCmd::RefreshLease(n, l, t) => Cmd::RefreshLease {
                ns: ns(n),
                kind: LeaseKind::Semaphore,
                lease: self.lease(&ns(n), l),
                ttl_s: t,
            },
            GenCmd::RevokeLease(n, l) => Cmd::RevokeLease {
                ns: ns(n),
                kind: LeaseKind::Semaphore,
                lease: self.lease(&ns(n), l),
            },
            GenCmd::Acquire(n, s, l, w, t, h) => Cmd::Acquire {
                ns: ns(n),
                sem: sem(s),
                lease: self.lease(&ns(n), l),
                weight: w,
                wait_ns: t,
                metadata: [("pid".to_string(), l.to_string())].into(),
                max_hold_ns: h,
            },
            GenCmd::AcquireSet(n, l, members, t, h) => Cmd::AcquireSet {
                ns: ns(n),
                lease: self.lease(&ns(n), l),
                members: members
                    .into_iter()
                    .map(|(s, w)| SetMember {
                        sem: sem(s),
                        weight: w,
                    })
                    .collect(),
                wait_ns: t,
                metadata: [("pid".to_string(), l.to_string())].into(),
                max_hold_ns: h,
            },
            GenCmd::Release(n, s, l) => Cmd::Release {
                ns: ns(n),
                sem: sem(s),
                lease: self.lease(&ns(n), l),
            },
            GenCmd::ReleaseHolder(n, s, k) => {
                let request = PageRequest {
                    token: String::new(),
                    limit: 250,
                };
                let holders = unfiltered(state)
                    .list_holders(&ns(n), &sem(s), &request)
                    .map(|p| p.items)
                    .unwrap_or_default();
                let lease = match holders.len() {
                    0 => self.lease(&ns(n), k),
                    len => holders[k % len].lease_id.clone(),
                };
                Cmd::Release {
                    ns: ns(n),
                    sem: sem(s),
                    lease,
                }
            }
            GenCmd::GiveUp(n, s, l, d) => self.give_up(state, n, s, self.lease(&ns(n), l), d),
            GenCmd::GiveUpWaiter(n, s, k, d) => {
                let request = PageRequest {
                    token: String::new(),
                    limit: 250,
                };
                let waiters = unfiltered(state)
                    .list_waiters(&ns(n), &sem(s), &request)
                    .map(|(_, p)| p.items)
                    .unwrap_or_default();
                let lease = match waiters.len() {
                    0 => self.lease(&ns(n), k),
                    len => waiters[k % len].lease_id.clone(),
                };
                self.give_up(state, n, s, lease, d)
            }
            GenCmd::Expire => Cmd::Expire,
            GenCmd::ExtendLeases => Cmd::ExtendLeases,
            GenCmd::SetQuotas(n, semaphores, leases, entries, bytes) => Cmd::SetQuotas {
                ns: ns(n),
                quotas: super::quota::Quotas {
                    semaphores,
                    leases,
                    entries,
                    bytes,
                    // The model predicts repeats by retention only; forgetting past this
                    // quota has its own timeline tests (`tests_once.rs`).
                    request_ids: super::limits::DEFAULT_REQUEST_IDS,
                },
            },
            GenCmd::SetBudget(bytes) => Cmd::SetBudget { bytes },
            GenCmd::WithId(inner) => {
                let mut onces = self.onces.borrow_mut();
                let cmd = Cmd::Once {
                    request_id: format!("r{}", onces.len()),
                    cmd: Box::new(self.concrete(state, &inner)),
                };
                onces.push(cmd.clone());
                cmd
            }
            GenCmd::Repeat(k) => {
                let onces = self.onces.borrow();
                onces
                    .len()
                    .checked_sub(k + 1)
                    .and_then(|i| onces.get(i))
                    .cloned()
                    .unwrap_or(Cmd::Expire)
            }
            GenCmd::Auth(cmd) => cmd,
            GenCmd::CreateLockLease(n, t) => Cmd::CreateLease {
                ns: ns(n),
                kind: LeaseKind::Lock,
                process_id: "locker".into(),
                ttl_s: t,
                metadata: Metadata::new(),
                secret: t ^ 0x5a5a,
            },
            GenCmd::AcquireLock(n, p, l, exclusive, t) => Cmd::AcquireLock {
                ns: ns(n),
                path: LOCK_PATHS[p].into(),
                lease: self.lock_lease(&ns(n), l),
                exclusive,
                wait_ns: t,
                metadata: [("pid".to_string(), l.to_string())].into(),
            },
            GenCmd::ReleaseLock(n, p, l) => Cmd::ReleaseLock {
                ns: ns(n),
                path: LOCK_PATHS[p].into(),
                lease: self.lock_lease(&ns(n), l),
            },
            GenCmd::DeleteLock(n, p) => Cmd::DeleteLock {
                ns: ns(n),
                path: LOCK_PATHS[p].into(),
            },
            GenCmd::RevokeHolder(n, s, l, r) => Cmd::RevokeHolder {
                ns: ns(n),
                kind: LeaseKind::Semaphore,
                object: sem(s),
                lease: self.lease(&ns(n), l),
                reason: match r {
                    0 => "stuck".to_string(),
                    1 => String::new(),
                    _ => "x".repeat(super::audit::AUDIT_REASON_MAX_BYTES + 1),
                },
            },
        }
    }

    /// The k-th most recent lock lease of `ns` (a semaphore lease's id, or garbage, past 3).
    fn lock_lease(&self, ns: &str, slot: usize) -> String {
        if slot >= 3 {
            return self.lease(ns, 0);
        }
        self.lock_leases
            .get(ns)
            .and_then(|ids| ids.len().checked_sub(slot + 1).and_then(|i| ids.get(i)))
            .cloned()
            .unwrap_or_else(|| "ls_00000000000000630badf00d".to_string())
    }

    /// The reply a repeat of `cmd` must answer at `clock_ns`, if the model knows it.
    fn expected_repeat(&self, cmd: &Cmd, clock_ns: Nanos) -> Option<&Outcome> {
        let Cmd::Once { request_id, .. } = cmd else {
            return None;
        };
        match self.first_replies.get(request_id) {
            Some(Some((reply, at))) if clock_ns.saturating_sub(*at) < REQUEST_RETENTION_NS => {
                Some(reply)
            }
            _ => None,
        }
    }

    /// Records what a command with a request id answered (the state's clock is `clock_ns`).
    fn record_once(&mut self, cmd: &Cmd, reply: &Reply, clock_ns: Nanos) {
        let (Cmd::Once { request_id, .. }, Ok(outcome)) = (cmd, reply) else {
            return;
        };
        let live = match self.first_replies.get(request_id) {
            Some(Some((_, at))) => clock_ns.saturating_sub(*at) < REQUEST_RETENTION_NS,
            Some(None) => true,
            None => false,
        };
        if live {
            return;
        }
        let queued = matches!(
            outcome,
            Outcome::Acquire(AcquireReply {
                status: AcquireStatus::Queued { .. },
                ..
            }) | Outcome::AcquireLock(AcquireLockReply {
                status: AcquireStatus::Queued { .. },
                ..
            }) | Outcome::AcquireSet(AcquireSetReply {
                status: AcquireSetStatus::Queued { .. },
                ..
            })
        );
        let first = (!queued).then(|| (outcome.clone(), clock_ns));
        self.first_replies.insert(request_id.clone(), first);
    }

    fn give_up(&self, state: &State, n: usize, s: usize, lease: String, d: GiveUpDeadline) -> Cmd {
        let (ns, sem) = (NAMESPACES[n].to_string(), SEMAPHORES[s].to_string());
        let current = state
            .waiter(&ns, &sem, &lease)
            .map_or(self.now_ns, |w| w.deadline_ns);
        let deadline_ns = match d {
            GiveUpDeadline::Current => current,
            GiveUpDeadline::Earlier => current.saturating_sub(1),
            GiveUpDeadline::Extreme(x) => x,
        };
        Cmd::GiveUp {
            ns,
            sem,
            lease,
            deadline_ns,
            linger_ns: 0,
        }
    }

    fn record(&mut self, cmd: &Cmd, reply: &Reply) {
        let cmd = match cmd {
            Cmd::Once { cmd, .. } => cmd.as_ref(),
            cmd => cmd,
        };
        match (cmd, reply) {
            (Cmd::CreateLease { ns, kind, .. }, Ok(Outcome::Lease(view))) => {
                let ids = match kind {
                    LeaseKind::Semaphore => self.leases.entry(ns.clone()).or_default(),
                    LeaseKind::Lock => self.lock_leases.entry(ns.clone()).or_default(),
                };
                if !ids.contains(&view.lease_id) {
                    ids.push(view.lease_id.clone());
                }
            }
            (Cmd::DeleteNamespace { name }, _) => {
                self.leases.remove(name);
                self.lock_leases.remove(name);
            }
            _ => {}
        }
    }
}

/// Every queue and hold, raw (nothing hidden), keyed by (namespace, semaphore).
#[derive(Clone, Default)]
struct World {
    queues: BTreeMap<(String, String), VecDeque<String>>,
    /// (namespace, semaphore, lease) -> held weight.
    holds: BTreeMap<(String, String, String), u64>,
    /// (namespace, semaphore, lease) -> the members of the set it waits for there (only set
    /// waiters).
    sets: BTreeMap<(String, String, String), Vec<String>>,
}

fn world(state: &State) -> World {
    let mut out = World::default();
    let request = PageRequest {
        token: String::new(),
        limit: 250,
    };
    for (ns_name, ns) in state.data.namespaces.map() {
        for (sem_name, sem) in ns.semaphores() {
            for (seq, waiter) in sem.waiters() {
                if !waiter.set.is_empty() {
                    out.sets.insert(
                        (ns_name.clone(), sem_name.clone(), ns.lease_id(*seq)),
                        waiter.set.clone(),
                    );
                }
            }
        }
    }
    for ns in &NAMESPACES[..2] {
        for sem in &SEMAPHORES {
            if let Ok((_, page)) = unfiltered(state).list_waiters(ns, sem, &request) {
                let queue = page.items.into_iter().map(|w| w.lease_id).collect();
                out.queues.insert((ns.to_string(), sem.to_string()), queue);
            }
            if let Ok(page) = unfiltered(state).list_holders(ns, sem, &request) {
                for h in page.items {
                    out.holds
                        .insert((ns.to_string(), sem.to_string(), h.lease_id), h.weight);
                }
            }
        }
    }
    out
}

/// Checks one command's grants against the queues before it, and its fencing tokens.
fn check_command(
    before: &World,
    cmd: &Cmd,
    reply: &Reply,
    events: &[Event],
    last_token: &mut u64,
) -> Result<(), TestCaseError> {
    let once = matches!(cmd, Cmd::Once { .. });
    let cmd = match cmd {
        Cmd::Once { cmd, .. } => cmd.as_ref(),
        cmd => cmd,
    };
    let mut model = before.queues.clone();
    let mut holds = before.holds.clone();
    let mut event_tokens = Vec::new();
    // All or none: a set waiter granted in this command is granted every member in it.
    let granted: std::collections::BTreeSet<(String, String, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Granted { ns, sem, lease, .. } => Some((ns.clone(), sem.clone(), lease.clone())),
            _ => None,
        })
        .collect();
    for (ns, sem, lease) in &granted {
        if let Some(set) = before.sets.get(&(ns.clone(), sem.clone(), lease.clone())) {
            for member in set {
                prop_assert!(
                    granted.contains(&(ns.clone(), member.clone(), lease.clone())),
                    "{lease} granted {sem} of its set {set:?} in {ns} without {member}"
                );
            }
        }
    }
    for event in events {
        match event {
            // Lock queues have their own model (`lock_proptests.rs`).
            Event::WaitEnded { sem, .. } if lock_path(sem).is_some() => {}
            Event::Granted { sem, token, .. } if lock_path(sem).is_some() => {
                event_tokens.push(*token);
            }
            Event::WaitEnded { ns, sem, lease, .. } => {
                let queue = model.get_mut(&(ns.clone(), sem.clone()));
                let pos = queue
                    .as_ref()
                    .and_then(|q| q.iter().position(|l| l == lease));
                prop_assert!(
                    pos.is_some(),
                    "wait ended for {lease} that was not queued on {ns}/{sem}"
                );
                if let (Some(q), Some(pos)) = (queue, pos) {
                    q.remove(pos);
                }
            }
            Event::Granted {
                ns,
                sem,
                lease,
                token,
                weight,
                ..
            } => {
                let queue = model.get_mut(&(ns.clone(), sem.clone()));
                prop_assert!(queue.is_some(), "grant on unknown queue {ns}/{sem}");
                let Some(queue) = queue else { continue };
                if queue.front() == Some(lease) {
                    queue.pop_front();
                } else {
                    // Only a re-acquire at a lower weight settles a queued upgrade out of turn,
                    // and then the grant is this very command's reply.
                    let settles = matches!(
                        (cmd, reply),
                        (Cmd::Acquire { ns: n, sem: s, lease: l, .. },
                         Ok(Outcome::Acquire(AcquireReply { status: AcquireStatus::Acquired { token: t, .. }, .. })))
                            if n == ns && s == sem && l == lease && t == token
                    );
                    prop_assert!(
                        settles,
                        "{lease} granted out of FIFO order on {ns}/{sem}: queue {queue:?}"
                    );
                    queue.retain(|l| l != lease);
                }
                holds.insert((ns.clone(), sem.clone(), lease.clone()), *weight);
                event_tokens.push(*token);
            }
            // Wait groups and barriers: `sync_proptests.rs`.
            Event::Synced { .. } => {}
            // Losses end holds and leases, not queues (`tests.rs` checks them).
            Event::Lost { .. } => {}
        }
    }
    // Grants from the queues take tokens in event order; an immediate grant's token (not in
    // the events) may sit between them (reaping grants before the command, more after it).
    prop_assert!(
        event_tokens.windows(2).all(|w| w[0] < w[1]),
        "event tokens not increasing: {event_tokens:?}"
    );
    let mut tokens = event_tokens.clone();
    if let Ok(Outcome::AcquireLock(AcquireLockReply {
        status: AcquireStatus::Acquired { token, .. },
        ..
    })) = reply
        && !event_tokens.contains(token)
        && !(once && *token <= *last_token)
    {
        tokens.push(*token);
    }
    if let Ok(Outcome::Acquire(AcquireReply {
        status: AcquireStatus::Acquired { token, .. },
        ..
    })) = reply
        && !event_tokens.contains(token)
        // A remembered grant, answered again to a repeat.
        && !(once && *token <= *last_token)
    {
        tokens.push(*token);
        // An immediate grant never jumps the queue, unless it re-acquires at most what the
        // lease already held.
        if let Cmd::Acquire {
            ns,
            sem,
            lease,
            weight,
            ..
        } = cmd
        {
            let held = holds
                .get(&(ns.clone(), sem.clone(), lease.clone()))
                .copied()
                .unwrap_or(0);
            if held < (*weight).max(1) {
                let others = model
                    .get(&(ns.clone(), sem.clone()))
                    .map_or(0, |q| q.iter().filter(|l| *l != lease).count());
                prop_assert_eq!(others, 0, "{} jumped the queue of {}/{}", lease, ns, sem);
            }
        }
    }
    for token in &tokens {
        prop_assert!(*token > *last_token, "token {token} not above {last_token}");
    }
    *last_token = tokens
        .iter()
        .copied()
        .max()
        .unwrap_or(*last_token)
        .max(*last_token);
    // An immediate set grant: every member at once, jumping no member's queue.
    if let (
        Ok(Outcome::AcquireSet(AcquireSetReply {
            status: AcquireSetStatus::Acquired { grants },
            ..
        })),
        Cmd::AcquireSet {
            ns, lease, members, ..
        },
    ) = (reply, cmd)
    {
        prop_assert_eq!(grants.len(), members.len());
        let fresh: Vec<u64> = grants
            .iter()
            .map(|g| g.token)
            .filter(|t| !event_tokens.contains(t) && *t > *last_token)
            .collect();
        if fresh.len() == grants.len() {
            prop_assert!(
                fresh.windows(2).all(|w| w[0] < w[1]),
                "set tokens {fresh:?}"
            );
            for member in members {
                let others = model
                    .get(&(ns.clone(), member.sem.clone()))
                    .map_or(0, |q| q.iter().filter(|l| *l != lease).count());
                prop_assert_eq!(
                    others,
                    0,
                    "{} jumped the queue of {}/{}",
                    lease,
                    ns,
                    member.sem
                );
            }
            *last_token = fresh.iter().copied().max().unwrap_or(*last_token);
        }
    }
    if let Ok(Outcome::GiveUp(GiveUpReply::Granted { token, .. })) = reply {
        prop_assert!(
            *token <= *last_token,
            "give-up reports a token never handed out"
        );
    }
    Ok(())
}

fn check_capacity(state: &State) -> Result<(), TestCaseError> {
    for ns in &NAMESPACES[..2] {
        for sem in &SEMAPHORES {
            let Ok(view) = unfiltered(state).get_semaphore(ns, sem) else {
                continue;
            };
            let holders = unfiltered(state)
                .list_holders(
                    ns,
                    sem,
                    &PageRequest {
                        token: String::new(),
                        limit: 250,
                    },
                )
                .map_err(|e| TestCaseError::fail(e.message))?;
            let held: u64 = holders.items.iter().map(|h| h.weight).sum();
            prop_assert!(
                held <= view.permits,
                "{ns}/{sem}: held {held} > permits {}",
                view.permits
            );
            prop_assert_eq!(held, view.active_holds);
        }
    }
    Ok(())
}

/// The state with its clock moved before everything, so reads show every lease, holder and
/// waiter the data has, due or not.
fn unfiltered(state: &State) -> State {
    let mut state = state.clone();
    state.data.clock_ns = Nanos::MIN;
    state
}

/// A wall clock that has nothing to do with the lease clock: it jumps hours either way from
/// batch to batch (`variant` picks one of two such clocks).
fn wall_ns(now_ns: Nanos, variant: i64) -> Nanos {
    const HOUR: Nanos = 3_600 * S;
    let jump = (now_ns / S).wrapping_mul(7 + 4 * variant).rem_euclid(5) - 2;
    1_700_000_000 * S + jump * HOUR + variant * 13 * HOUR
}

/// What a lock view says, without its display times.
fn lock_decision(v: &LockView) -> String {
    let holders: Vec<String> = v
        .holders
        .iter()
        .map(|h| format!("{}:{}:{}", h.lease_id, h.exclusive, h.token))
        .collect();
    format!(
        "lock {} {:?} {:?} w{}",
        v.name, v.exclusive, holders, v.waiters
    )
}

/// What a reply decided, without the display times in it.
fn decision(reply: &Reply) -> String {
    match reply {
        Ok(Outcome::Lease(v)) => format!("lease {} ttl {}", v.lease_id, v.ttl_s),
        Ok(Outcome::Namespace(v)) => format!("namespace {} v{}", v.name, v.version),
        Ok(Outcome::Semaphore(v)) => format!(
            "semaphore {} v{} {}/{} {} {}",
            v.name, v.version, v.active_holds, v.permits, v.active_holders_count, v.waiters_count
        ),
        Ok(Outcome::Acquire(a)) => format!(
            "{:?} {}/{} {}",
            a.status, a.semaphore.active_holds, a.semaphore.permits, a.semaphore.waiters_count
        ),
        Ok(Outcome::Role(v)) => format!("role {} admin {} {:?}", v.name, v.cluster_admin, v.grants),
        Ok(Outcome::Token(v)) => format!("token {} {} {}", v.id, v.name, v.role),
        Ok(Outcome::Lock(v)) => lock_decision(v),
        // The record's `at` is a display time on the wall clock.
        Ok(Outcome::Audit(r)) => format!(
            "audit {} {:?} {}/{} {} {:?} {} {}",
            r.seq, r.action, r.namespace, r.object, r.lease, r.actor, r.reason, r.clock_ns
        ),
        Ok(Outcome::AcquireLock(a)) => format!(
            "{:?} {:?} {} [{}]",
            a.status,
            a.reason,
            lock_decision(&a.lock),
            a.blocking
                .iter()
                .map(lock_decision)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => format!("{other:?}"),
    }
}

fn run_history(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut whole = State::new();
    let mut skewed = State::new();
    let mut split = State::new();
    let mut harness = Harness {
        leases: BTreeMap::new(),
        lock_leases: BTreeMap::new(),
        now_ns: 0,
        onces: RefCell::new(Vec::new()),
        first_replies: BTreeMap::new(),
    };
    let mut applied: Vec<(Batch, Vec<Reply>)> = Vec::new();
    let mut last_token = 0u64;
    // Every history starts from the same small world: both namespaces, their semaphores with
    // 1, 2 and 3 permits, and four leases each.
    let mut prelude = Vec::new();
    for n in 0..2 {
        prelude.push(GenCmd::CreateNamespace(n));
        for s in 0..3 {
            prelude.push(GenCmd::CreateSemaphore(n, s, s as u64 + 1, 0));
        }
        for p in 0..4 {
            prelude.push(GenCmd::CreateLease(n, 30, p % 3));
        }
    }
    let ops: Vec<Op> = std::iter::once(Op::Batch {
        dt_ns: 0,
        cmds: prelude,
    })
    .chain(ops.iter().cloned())
    .collect();
    for op in &ops {
        match op {
            Op::Snapshot => {
                let bytes = split
                    .encode_snapshot()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let restored = State::decode_snapshot(&bytes)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(restored.hash(), split.hash());
                prop_assert_eq!(restored.stats(), split.stats());
                prop_assert_eq!(restored.next_due_ns(), split.next_due_ns());
                split = restored;
            }
            Op::Read {
                ns,
                sem,
                token,
                limit,
            } => {
                let request = PageRequest {
                    token: token.clone(),
                    limit: *limit,
                };
                let (ns, sem) = (NAMESPACES[*ns], SEMAPHORES[*sem]);
                let _ = whole.list_namespaces(&request);
                let _ = whole.list_semaphores(ns, &request);
                let _ = whole.list_holders(ns, sem, &request);
                let _ = whole.list_waiters(ns, sem, &request);
                let _ = whole.list_leases(ns, LeaseKind::Semaphore, Some("p1"), &request);
                let _ = whole.list_leases(ns, LeaseKind::Lock, None, &request);
                let _ = whole.get_semaphore(ns, sem);
                let _ = whole.get_lease(ns, LeaseKind::Semaphore, &harness.lease(ns, 0));
            }
            Op::Batch { dt_ns, cmds } => {
                harness.now_ns = harness.now_ns.saturating_add(*dt_ns);
                let cmds: Vec<Cmd> = cmds.iter().map(|c| harness.concrete(&whole, c)).collect();
                let batch = Batch {
                    now_ns: harness.now_ns,
                    cmds: cmds.clone(),
                    wall_ns: wall_ns(harness.now_ns, 0),
                };
                let mut whole_events = Vec::new();
                let whole_replies = whole.apply_batch(&batch, &mut whole_events);
                whole.check_invariants().map_err(TestCaseError::fail)?;

                // The same history under another wall clock decides exactly the same.
                let mut skewed_events = Vec::new();
                let skewed_replies = skewed.apply_batch(
                    &Batch {
                        wall_ns: wall_ns(harness.now_ns, 1),
                        ..batch.clone()
                    },
                    &mut skewed_events,
                );
                prop_assert_eq!(&whole_events, &skewed_events);
                prop_assert_eq!(whole.stats(), skewed.stats());
                prop_assert_eq!(whole.next_due_ns(), skewed.next_due_ns());
                prop_assert_eq!(whole_replies.len(), skewed_replies.len());
                for (a, b) in whole_replies.iter().zip(&skewed_replies) {
                    prop_assert_eq!(decision(a), decision(b));
                }

                let mut split_events = Vec::new();
                let mut split_replies = Vec::new();
                // An empty batch still moves the clock.
                split.apply_batch(
                    &Batch {
                        now_ns: batch.now_ns,
                        cmds: Vec::new(),
                        wall_ns: batch.wall_ns,
                    },
                    &mut split_events,
                );
                for cmd in &cmds {
                    let before = world(&split);
                    let mut events = Vec::new();
                    let one = Batch {
                        now_ns: batch.now_ns,
                        cmds: vec![cmd.clone()],
                        wall_ns: batch.wall_ns,
                    };
                    let hash_before = split.hash();
                    let mut replies = split.apply_batch(&one, &mut events);
                    prop_assert_eq!(replies.len(), 1);
                    let reply = replies.remove(0);
                    split.check_invariants().map_err(TestCaseError::fail)?;
                    let refused_by_access_control = split.auth().enabled()
                        && matches!(&reply, Err(e) if matches!(
                            e.kind,
                            ErrorKind::Unauthenticated | ErrorKind::PermissionDenied
                        ));
                    // A remembered reply goes only to a caller who may ask now.
                    if !refused_by_access_control
                        && let Some(first) = harness.expected_repeat(cmd, split.clock_ns())
                    {
                        // ... except for a hold limit, which a repeat answers with what is
                        // left of it now: never more than the first answer, never none.
                        let (first_hold, repeat_hold) =
                            (hold_ns(&Ok(first.clone())), hold_ns(&reply));
                        prop_assert!(
                            repeat_hold <= first_hold && (first_hold == 0) == (repeat_hold == 0),
                            "a repeat's hold limit {repeat_hold} against the first {first_hold}"
                        );
                        prop_assert_eq!(
                            without_hold(&reply),
                            without_hold(&Ok(first.clone())),
                            "a repeat answers the first reply"
                        );
                        prop_assert!(events.is_empty(), "a repeat emits nothing");
                        prop_assert_eq!(split.hash(), hash_before, "a repeat changes nothing");
                    }
                    harness.record_once(cmd, &reply, split.clock_ns());
                    check_command(&before, cmd, &reply, &events, &mut last_token)?;
                    split_events.extend(events);
                    split_replies.push(reply);
                }
                prop_assert_eq!(&whole_replies, &split_replies);
                prop_assert_eq!(&whole_events, &split_events);
                prop_assert_eq!(whole.hash(), split.hash());
                prop_assert_eq!(whole.clock_ns(), split.clock_ns());
                check_capacity(&whole)?;
                for (cmd, reply) in cmds.iter().zip(&whole_replies) {
                    harness.record(cmd, reply);
                }
                applied.push((batch, whole_replies));
            }
        }
    }
    // Determinism: the same log on a fresh state gives the same replies and state.
    let mut replay = State::new();
    for (batch, replies) in &applied {
        let mut events = Vec::new();
        prop_assert_eq!(&replay.apply_batch(batch, &mut events), replies);
    }
    prop_assert_eq!(replay.hash(), whole.hash());
    Ok(())
}

proptest! {
    // Failing seeds are kept next to this file (daemon/src/state/proptests.proptest-regressions).
    // `make proptest CASES=N` runs longer (PROPTEST_CASES); 256 cases in `make test`.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_histories_keep_every_invariant(ops in prop::collection::vec(op(), 1..60)) {
        run_history(&ops)?;
    }

    #[test]
    fn contended_histories_keep_every_invariant(ops in prop::collection::vec(contended_op(), 1..60)) {
        run_history(&ops)?;
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut framed = b"conch-sm\x01\0\0\0".to_vec();
        framed.extend_from_slice(&bytes);
        for input in [&bytes, &framed] {
            if let Ok(state) = State::decode_snapshot(input) {
                prop_assert!(state.check_invariants().is_ok());
            }
        }
    }
}

/// A fixed history that exercises most paths, so a failure here is easy to read.
#[test]
fn a_fixed_history_passes() {
    let g = |cmds: Vec<GenCmd>| Op::Batch { dt_ns: S, cmds };
    let ops = vec![
        g(vec![
            GenCmd::CreateNamespace(0),
            GenCmd::CreateSemaphore(0, 0, 2, 0),
        ]),
        g(vec![
            GenCmd::CreateLease(0, 5, 0),
            GenCmd::CreateLease(0, 10, 1),
            GenCmd::CreateLease(0, 10, 2),
        ]),
        g(vec![
            GenCmd::Acquire(0, 0, 0, 2, 0, 0),
            GenCmd::Acquire(0, 0, 1, 1, 5 * S, 0),
            GenCmd::Acquire(0, 0, 2, 1, 5 * S, 0),
        ]),
        Op::Snapshot,
        g(vec![GenCmd::Acquire(0, 0, 0, 1, 0, 0)]),
        g(vec![
            GenCmd::GiveUp(0, 0, 2, GiveUpDeadline::Current),
            GenCmd::Release(0, 0, 0),
        ]),
        Op::Batch {
            dt_ns: 10 * S,
            cmds: vec![GenCmd::Expire],
        },
        Op::Batch {
            dt_ns: -5 * S,
            cmds: vec![GenCmd::ExtendLeases, GenCmd::DeleteNamespace(0)],
        },
    ];
    if let Err(e) = run_history(&ops) {
        panic!("{e}");
    }
}

/// Found by the contended proptest (a bug in the test's model, kept as a regression): a waiter
/// granted by the reaping that runs before a command, then re-acquiring in that command, is a
/// re-acquire at its held weight, not a queue jump.
#[test]
fn a_grant_while_reaping_then_a_reacquire_in_the_same_command() {
    let b = |dt_ns: Nanos, cmds: Vec<GenCmd>| Op::Batch { dt_ns, cmds };
    let ops = vec![
        b(
            0,
            vec![
                GenCmd::Acquire(0, 1, 2, 0, 0, 0),
                GenCmd::Acquire(0, 1, 0, 2, 2 * S, 0),
            ],
        ),
        b(
            0,
            vec![
                GenCmd::Acquire(0, 1, 1, 0, S, 0),
                GenCmd::Acquire(0, 1, 3, 2, S, 0),
                GenCmd::CreateLease(0, 7, 0),
            ],
        ),
        b(0, vec![GenCmd::Acquire(0, 1, 0, 0, 7 * S, 0)]),
        b(-739_875_400, vec![]),
        b(
            0,
            vec![
                GenCmd::ReleaseHolder(0, 1, 0),
                GenCmd::UpdateSemaphoreCurrent(0, 1, 4),
            ],
        ),
        b(
            0,
            vec![
                GenCmd::CreateLease(0, 5, 0),
                GenCmd::Acquire(0, 1, 2, 2, 6 * S, 0),
            ],
        ),
        b(1_739_875_400, vec![GenCmd::Acquire(0, 1, 1, 0, 0, 0)]),
    ];
    if let Err(e) = run_history(&ops) {
        panic!("{e}");
    }
}

/// Lease and acquire commands among many access control commands, with request ids and
/// repeats: the general mix reaches the rarer orders of bootstrap, tokens and roles only once in
/// thousands of cases (it found a bootstrap over a non-admin token's hash once in CI).
fn auth_heavy_cmd() -> impl Strategy<Value = GenCmd> {
    prop_oneof![
        6 => (ns_index(), ttl_s(), 0..3usize).prop_map(|(n, t, p)| GenCmd::CreateLease(n, t, p)),
        6 => (ns_index(), lease_slot(), prop_oneof![Just(0u64), ttl_s()]).prop_map(|(n, l, t)| GenCmd::RefreshLease(n, l, t)),
        2 => (ns_index(), lease_slot()).prop_map(|(n, l)| GenCmd::RevokeLease(n, l)),
        6 => (ns_index(), sem_index(), lease_slot(), weight(), wait_ns(), max_hold_ns())
            .prop_map(|(n, s, l, w, t, h)| GenCmd::Acquire(n, s, l, w, t, h)),
        10 => auth_cmd().prop_map(GenCmd::Auth),
        1 => ns_index().prop_map(GenCmd::CreateNamespace),
        1 => Just(GenCmd::Expire),
    ]
}

fn auth_heavy_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (dt_ns(), prop::collection::vec(with_ids(auth_heavy_cmd), 0..6)).prop_map(|(dt_ns, cmds)| Op::Batch { dt_ns, cmds }),
        1 => Just(Op::Snapshot),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn auth_heavy_histories_keep_every_invariant(ops in prop::collection::vec(auth_heavy_op(), 1..60)) {
        run_history(&ops)?;
    }
}

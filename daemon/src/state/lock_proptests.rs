//! Property tests of the locks against a model: random histories of acquires (both modes,
//! blocking or not, re-acquires, upgrades, re-attaches), releases, deletes, revokes and time
//! passing, over a small tree of paths and a few lock leases. After every step the state's
//! holds and queue must be the model's, every invariant must hold (`Timeline` checks them), and
//! fencing tokens must increase per path.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";
const PATHS: [&str; 6] = ["a", "a/b", "a/b/c", "a/d", "ab", "e"];
const LEASES: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        path: usize,
        lease: usize,
        exclusive: bool,
        wait_s: i64,
    },
    Release {
        path: usize,
        lease: usize,
    },
    Delete {
        path: usize,
    },
    Revoke {
        lease: usize,
    },
    Pass {
        ms: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..PATHS.len(), 0..LEASES, any::<bool>(), prop_oneof![1 => Just(0i64), 3 => 1..=20i64])
            .prop_map(|(path, lease, exclusive, wait_s)| Op::Acquire { path, lease, exclusive, wait_s }),
        5 => (0..PATHS.len(), 0..LEASES).prop_map(|(path, lease)| Op::Release { path, lease }),
        1 => (0..PATHS.len()).prop_map(|path| Op::Delete { path }),
        1 => (0..LEASES).prop_map(|lease| Op::Revoke { lease }),
        3 => (0..8_000i64).prop_map(|ms| Op::Pass { ms }),
    ]
}

fn overlap(p: &str, q: &str) -> bool {
    let under = |a: &str, b: &str| a.strip_prefix(b).is_some_and(|r| r.starts_with('/'));
    p == q || under(p, q) || under(q, p)
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    lease: usize,
    path: &'static str,
    exclusive: bool,
    deadline_ns: Nanos,
}

/// The model: holds by (path, lease) -> exclusive, and the queue in arrival order.
#[derive(Default)]
struct Model {
    holds: BTreeMap<(&'static str, usize), bool>,
    queue: Vec<Entry>,
}

impl Model {
    fn hold_blocks(&self, path: &str, lease: usize, exclusive: bool) -> bool {
        self.holds
            .iter()
            .any(|((p, l), e)| *l != lease && overlap(p, path) && (exclusive || *e))
    }

    fn entry_blocks(entries: &[Entry], path: &str, lease: usize, exclusive: bool) -> bool {
        entries
            .iter()
            .any(|w| w.lease != lease && overlap(w.path, path) && (exclusive || w.exclusive))
    }

    /// Grants every queued acquire that conflicts with no hold and no earlier queued one.
    fn pass(&mut self) {
        let mut blocked: Vec<Entry> = Vec::new();
        for w in std::mem::take(&mut self.queue) {
            if !self.hold_blocks(w.path, w.lease, w.exclusive)
                && !Self::entry_blocks(&blocked, w.path, w.lease, w.exclusive)
            {
                self.holds.insert((w.path, w.lease), w.exclusive);
            } else {
                blocked.push(w);
            }
        }
        self.queue = blocked;
    }

    /// Due waiters leave first (before every command).
    fn reap(&mut self, now_ns: Nanos) {
        let before = self.queue.len();
        self.queue.retain(|w| w.deadline_ns > now_ns);
        if self.queue.len() != before {
            self.pass();
        }
    }

    fn position(&self, path: &str, lease: usize) -> Option<usize> {
        self.queue
            .iter()
            .position(|w| w.path == path && w.lease == lease)
    }

    /// What the acquire answers: "acquired", "queued" or "unavailable".
    fn acquire(
        &mut self,
        path: &'static str,
        lease: usize,
        exclusive: bool,
        wait_ns: Nanos,
        now_ns: Nanos,
    ) -> &'static str {
        if let Some(&held) = self.holds.get(&(path, lease))
            && (held || !exclusive)
        {
            self.holds.insert((path, lease), exclusive);
            if let Some(i) = self.position(path, lease) {
                self.queue.remove(i);
            }
            self.pass();
            return "acquired";
        }
        if let Some(i) = self.position(path, lease) {
            let w = &mut self.queue[i];
            w.exclusive = exclusive;
            w.deadline_ns = w.deadline_ns.max(now_ns + wait_ns);
            self.pass();
            if self.position(path, lease).is_none() {
                return "acquired";
            }
            return if wait_ns > 0 { "queued" } else { "unavailable" };
        }
        if !self.hold_blocks(path, lease, exclusive)
            && !Self::entry_blocks(&self.queue, path, lease, exclusive)
        {
            self.holds.insert((path, lease), exclusive);
            return "acquired";
        }
        if wait_ns == 0 {
            return "unavailable";
        }
        self.queue.push(Entry {
            lease,
            path,
            exclusive,
            deadline_ns: now_ns + wait_ns,
        });
        "queued"
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut t = Timeline::new();
    t.ok(Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: Metadata::new(),
    });
    let mut leases: Vec<String> = (0..LEASES)
        .map(|i| {
            match t.ok(Cmd::CreateLease {
                ns: NS.into(),
                kind: LeaseKind::Lock,
                process_id: String::new(),
                ttl_s: 300,
                metadata: Metadata::new(),
                secret: i as u64,
            }) {
                Outcome::Lease(v) => v.lease_id,
                other => panic!("unexpected {other:?}"),
            }
        })
        .collect();
    let mut model = Model::default();
    let mut last_token: BTreeMap<&str, u64> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for op in ops {
        model.reap(t.now_ns);
        let cmd = match op {
            Op::Acquire {
                path,
                lease,
                exclusive,
                wait_s,
            } => Cmd::AcquireLock {
                ns: NS.into(),
                path: PATHS[*path].into(),
                lease: leases[*lease].clone(),
                exclusive: *exclusive,
                wait_ns: wait_s * S,
                metadata: Metadata::new(),
            },
            Op::Release { path, lease } => Cmd::ReleaseLock {
                ns: NS.into(),
                path: PATHS[*path].into(),
                lease: leases[*lease].clone(),
            },
            Op::Delete { path } => Cmd::DeleteLock {
                ns: NS.into(),
                path: PATHS[*path].into(),
            },
            Op::Revoke { lease } => Cmd::RevokeLease {
                ns: NS.into(),
                kind: LeaseKind::Lock,
                lease: leases[*lease].clone(),
            },
            Op::Pass { ms } => {
                t.at(t.now_ns + ms * 1_000_000);
                model.reap(t.now_ns);
                Cmd::Expire
            }
        };
        let reply = t.run_now(cmd);
        let expected = match op {
            Op::Acquire {
                path,
                lease,
                exclusive,
                wait_s,
            } => Some(model.acquire(PATHS[*path], *lease, *exclusive, wait_s * S, t.now_ns)),
            Op::Release { path, lease } => {
                model.holds.remove(&(PATHS[*path], *lease));
                if let Some(i) = model.position(PATHS[*path], *lease) {
                    model.queue.remove(i);
                }
                model.pass();
                None
            }
            Op::Delete { path } => {
                model.holds.retain(|(p, _), _| *p != PATHS[*path]);
                model.pass();
                None
            }
            Op::Revoke { lease } => {
                model.holds.retain(|(_, l), _| l != lease);
                model.queue.retain(|w| w.lease != *lease);
                model.pass();
                None
            }
            Op::Pass { .. } => None,
        };
        match (&reply, expected) {
            (Ok(Outcome::AcquireLock(r)), Some(want)) => {
                let got = match r.status {
                    AcquireStatus::Acquired { .. } => "acquired",
                    AcquireStatus::Queued { .. } => "queued",
                    AcquireStatus::Unavailable => "unavailable",
                };
                prop_assert_eq!(got, want, "{:?}", op);
            }
            (Ok(_), None) => {}
            (Err(e), _) if matches!(op, Op::Revoke { .. }) && e.kind == ErrorKind::NotFound => {}
            (other, want) => prop_assert!(false, "{op:?}: {other:?}, model says {want:?}"),
        }
        if let Op::Revoke { lease } = op {
            // A revoked lease is gone for good: later steps use a fresh one in its slot.
            leases[*lease] = match t.ok(Cmd::CreateLease {
                ns: NS.into(),
                kind: LeaseKind::Lock,
                process_id: String::new(),
                ttl_s: 300,
                metadata: Metadata::new(),
                secret: 99,
            }) {
                Outcome::Lease(v) => v.lease_id,
                other => panic!("unexpected {other:?}"),
            };
        }

        // The state's holds and queue are the model's.
        let lease_slot = |id: &str| leases.iter().position(|l| l == id);
        let mut holds = BTreeMap::new();
        for path in PATHS {
            let view = t
                .state
                .get_lock(NS, path)
                .map_err(|e| TestCaseError::fail(e.message))?;
            for h in &view.holders {
                let slot = lease_slot(&h.lease_id);
                prop_assert!(slot.is_some(), "holder {} is no current lease", h.lease_id);
                holds.insert((path, slot.unwrap_or(0)), h.exclusive);
                // A grant not seen before has a token above every earlier one on the path.
                if seen.insert((path, h.token)) {
                    let last = last_token.entry(path).or_insert(0);
                    prop_assert!(
                        h.token > *last,
                        "{path}: new token {} after {}",
                        h.token,
                        *last
                    );
                    *last = h.token;
                }
            }
        }
        prop_assert_eq!(&holds, &model.holds);
        let page = t
            .state
            .list_lock_waiters(
                NS,
                "",
                &PageRequest {
                    token: String::new(),
                    limit: 250,
                },
            )
            .map_err(|e| TestCaseError::fail(e.message))?;
        let queue: Vec<(usize, &str, bool)> = page
            .items
            .iter()
            .map(|w| {
                (
                    lease_slot(&w.lease_id).unwrap_or(usize::MAX),
                    w.path.as_str(),
                    w.exclusive,
                )
            })
            .collect();
        let want: Vec<(usize, &str, bool)> = model
            .queue
            .iter()
            .map(|w| (w.lease, w.path, w.exclusive))
            .collect();
        prop_assert_eq!(queue, want);
    }
    Ok(())
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
    fn locks_follow_the_model(ops in prop::collection::vec(op(), 1..80)) {
        run(&ops)?;
    }
}

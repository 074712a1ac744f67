//! Timelines through the state machine. Every step checks the invariants.

use bincode::Options;

use super::data::{Data, State, Tally};
use super::hash::fnv1a64;
use super::lease_id::{lease_id, parse_lease_id};
use super::limits::*;
use super::snapshot::bincode_options;
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";

fn none() -> Metadata {
    Metadata::new()
}

fn meta(k: &str, v: &str) -> Metadata {
    [(k.to_string(), v.to_string())].into()
}

impl Timeline {
    /// A timeline with namespace "n" created at t=0.
    fn with_ns() -> Self {
        let mut t = Self::new();
        t.create_ns(NS);
        t
    }

    fn create_ns(&mut self, name: &str) -> NamespaceView {
        match self.ok(Cmd::CreateNamespace {
            name: name.into(),
            description: String::new(),
            metadata: none(),
        }) {
            Outcome::Namespace(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn create_sem(&mut self, name: &str, permits: u64) -> SemaphoreView {
        let cmd = Cmd::CreateSemaphore {
            ns: NS.into(),
            name: name.into(),
            description: String::new(),
            permits,
            metadata: none(),
            max_hold_ns: 0,
        };
        match self.ok(cmd) {
            Outcome::Semaphore(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn create_lease(&mut self, ttl_s: u64) -> String {
        self.create_lease_for("", ttl_s).lease_id
    }

    fn create_lease_for(&mut self, process_id: &str, ttl_s: u64) -> LeaseView {
        let cmd = Cmd::CreateLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            process_id: process_id.into(),
            ttl_s,
            metadata: none(),
            secret: 7,
        };
        match self.ok(cmd) {
            Outcome::Lease(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn acquire_cmd(sem: &str, lease: &str, weight: u64, wait_ns: Nanos) -> Cmd {
        Cmd::Acquire {
            ns: NS.into(),
            sem: sem.into(),
            lease: lease.into(),
            weight,
            wait_ns,
            metadata: none(),
            max_hold_ns: 0,
        }
    }

    fn acquire(&mut self, sem: &str, lease: &str, weight: u64, wait_ns: Nanos) -> AcquireReply {
        match self.ok(Self::acquire_cmd(sem, lease, weight, wait_ns)) {
            Outcome::Acquire(r) => r,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Acquires and expects the permits now; returns the fencing token.
    fn acquired(&mut self, sem: &str, lease: &str, weight: u64, wait_ns: Nanos) -> u64 {
        match self.acquire(sem, lease, weight, wait_ns).status {
            AcquireStatus::Acquired { token, .. } => token,
            other => panic!("expected Acquired, got {other:?}"),
        }
    }

    fn release(&mut self, sem: &str, lease: &str) -> SemaphoreView {
        match self.ok(Cmd::Release {
            ns: NS.into(),
            sem: sem.into(),
            lease: lease.into(),
        }) {
            Outcome::Semaphore(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn give_up(&mut self, sem: &str, lease: &str, deadline_ns: Nanos) -> GiveUpReply {
        let cmd = Cmd::GiveUp {
            ns: NS.into(),
            sem: sem.into(),
            lease: lease.into(),
            deadline_ns,
            linger_ns: 0,
        };
        match self.ok(cmd) {
            Outcome::GiveUp(r) => r,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn sem(&self, name: &str) -> SemaphoreView {
        self.read_at(self.now_ns)
            .get_semaphore(NS, name)
            .expect("semaphore exists")
    }

    fn holders(&self, sem: &str) -> Vec<(String, u64)> {
        let page = self
            .read_at(self.now_ns)
            .list_holders(NS, sem, &PageRequest::default())
            .expect("semaphore exists");
        page.items
            .into_iter()
            .map(|h| (h.lease_id, h.weight))
            .collect()
    }

    fn waiters(&self, sem: &str) -> Vec<(String, u64)> {
        let (_, page) = self
            .read_at(self.now_ns)
            .list_waiters(NS, sem, &PageRequest::default())
            .expect("exists");
        page.items
            .into_iter()
            .map(|w| (w.lease_id, w.weight))
            .collect()
    }
}

type Tim = Timeline;

fn granted(sem: &str, lease: &str, token: u64, weight: u64) -> Event {
    Event::Granted {
        ns: NS.into(),
        sem: sem.into(),
        lease: lease.into(),
        token,
        weight,
        hold_ns: 0,
    }
}

fn wait_ended(sem: &str, lease: &str, reason: WaitEnd) -> Event {
    Event::WaitEnded {
        ns: NS.into(),
        sem: sem.into(),
        lease: lease.into(),
        reason,
    }
}

fn lost(lease: &str, object: &str, cause: LossCause) -> Event {
    Event::Lost {
        ns: NS.into(),
        lease: lease.into(),
        object: object.into(),
        cause,
    }
}

fn hold(lease: &str, weight: u64) -> (String, u64) {
    (lease.to_string(), weight)
}

// ---- namespaces ----

#[test]
fn namespace_create_get_update_delete() {
    // t=1s  create "n" -> version 1; again -> AlreadyExists
    let mut t = Timeline::new();
    t.at(S);
    let v = t.create_ns(NS);
    assert_eq!((v.version, v.created_at, v.updated_at), (1, S, S));
    let e = t.err(Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: none(),
    });
    assert_eq!(e.kind, ErrorKind::AlreadyExists);
    assert_eq!(t.state.get_namespace(NS), Ok(v.clone()));
    // t=2s  update with version 7 -> InvalidArgument, nothing changes
    t.at(2 * S);
    let update = |expected_version, metadata: Metadata| Cmd::UpdateNamespace {
        name: NS.into(),
        description: "d".into(),
        metadata,
        expected_version,
    };
    let e = t.err(update(7, meta("k", "v")));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert_eq!(e.message, "version mismatch: expected 7, found 1");
    // update with version 1 -> version 2, updated_at 2s
    let Outcome::Namespace(v2) = t.ok(update(1, meta("k", "v"))) else {
        panic!()
    };
    assert_eq!((v2.version, v2.created_at, v2.updated_at), (2, S, 2 * S));
    assert_eq!(
        (v2.description.as_str(), v2.metadata.clone()),
        ("d", meta("k", "v"))
    );
    // omitted metadata clears it
    let Outcome::Namespace(v3) = t.ok(update(2, none())) else {
        panic!()
    };
    assert!(v3.metadata.is_empty());
    // unknown namespace -> NotFound; delete -> gone; delete again -> Done (no-op)
    let e = t.err(Cmd::UpdateNamespace {
        name: "x".into(),
        description: String::new(),
        metadata: none(),
        expected_version: 1,
    });
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "namespace x not found")
    );
    assert_eq!(
        t.ok(Cmd::DeleteNamespace { name: NS.into() }),
        Outcome::Done
    );
    assert_eq!(
        t.state.get_namespace(NS).map_err(|e| e.kind),
        Err(ErrorKind::NotFound)
    );
    assert_eq!(
        t.ok(Cmd::DeleteNamespace { name: NS.into() }),
        Outcome::Done
    );
    // bad names are InvalidArgument naming the field
    let e = t.err(Cmd::CreateNamespace {
        name: "a b".into(),
        description: String::new(),
        metadata: none(),
    });
    assert!(e.message.starts_with("name "));
    assert_eq!(
        t.state.get_namespace("").map_err(|e| e.kind),
        Err(ErrorKind::InvalidArgument)
    );
}

#[test]
fn deleting_a_namespace_removes_everything_in_it() {
    // t=0  "n": sem db(1); L1 holds, L2 waits; namespace "other" with a lease
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let l1 = t.create_lease(10);
    let l2 = t.create_lease(10);
    t.acquired("db", &l1, 1, 0);
    t.acquire("db", &l2, 1, 5 * S);
    t.create_ns("other");
    t.ok(Cmd::CreateLease {
        ns: "other".into(),
        kind: LeaseKind::Semaphore,
        process_id: String::new(),
        ttl_s: 20,
        metadata: none(),
        secret: 7,
    });
    t.take_events();
    // t=1s  delete "n" -> L2's caller learns the semaphore is gone; only "other" is left
    t.at(S);
    assert_eq!(
        t.ok(Cmd::DeleteNamespace { name: NS.into() }),
        Outcome::Done
    );
    assert_eq!(
        t.take_events(),
        vec![
            lost(&l1, "", LossCause::NamespaceDeleted),
            lost(&l2, "", LossCause::NamespaceDeleted),
            wait_ended("db", &l2, WaitEnd::SemaphoreGone)
        ]
    );
    assert_eq!(
        t.state.stats(),
        Stats {
            namespaces: 1,
            semaphores: 0,
            leases: 1,
            holders: 0,
            waiters: 0
        }
    );
    assert_eq!(t.state.next_due_ns(), Some(20 * S));
    // recreate "n": empty, and lease ids are never reused
    t.create_ns(NS);
    let l3 = t.create_lease(10);
    assert!(l3 > l2 && l2 > l1);
    assert_eq!(
        t.err(Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: l1.clone()
        })
        .kind,
        ErrorKind::NotFound
    );
}

#[test]
fn namespace_list_is_ordered_and_paged() {
    let mut t = Timeline::new();
    for name in ["c", "a", "b", "d", "e"] {
        t.create_ns(name);
    }
    let page = |token: &str| {
        t.state
            .list_namespaces(&PageRequest {
                token: token.into(),
                limit: 2,
            })
            .expect("valid")
    };
    let p1 = page("");
    assert_eq!(
        p1.items.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(p1.previous_token, "");
    let p2 = page(&p1.next_token);
    assert_eq!(
        p2.items.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["c", "d"]
    );
    let p3 = page(&p2.next_token);
    assert_eq!(
        p3.items.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["e"]
    );
    assert_eq!(p3.next_token, "");
    assert_eq!(page(&p3.previous_token).items, p2.items);
    let e = t
        .state
        .list_namespaces(&PageRequest {
            token: "nonsense".into(),
            limit: 0,
        })
        .expect_err("garbage");
    assert!(e.message.contains("pagination_token"));
    let e = t
        .state
        .list_namespaces(&PageRequest {
            token: String::new(),
            limit: 251,
        })
        .expect_err("too big");
    assert!(e.message.contains("limit"));
}

#[test]
fn a_filtered_namespace_list_pages_and_points_only_at_visible_names() {
    // t=0   namespaces a, alpha, b, secret-prod, z; the caller may see alpha and z
    let mut t = Timeline::new();
    for name in ["a", "alpha", "b", "secret-prod", "z"] {
        t.create_ns(name);
    }
    let visible = |name: &str| name == "alpha" || name == "z";
    let page = |token: &str| {
        t.state
            .list_namespaces_visible(
                &PageRequest {
                    token: token.into(),
                    limit: 1,
                },
                visible,
            )
            .expect("valid")
    };
    // Walking every cursor, forwards and back, shows the visible names only.
    let p1 = page("");
    assert_eq!(
        p1.items.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["alpha"]
    );
    assert_eq!(p1.previous_token, "", "nothing visible before alpha");
    let p2 = page(&p1.next_token);
    assert_eq!(
        p2.items.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        ["z"]
    );
    assert_eq!(p2.next_token, "", "nothing visible after z");
    assert_eq!(page(&p2.previous_token).items, p1.items);
    // Each token is a position at a visible name.
    for token in [&p1.next_token, &p2.previous_token] {
        let hex = token
            .split_once('.')
            .map(|(_, hex)| hex)
            .unwrap_or_default();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        let named = String::from_utf8(bytes).unwrap_or_default();
        assert!(visible(&named), "{token} names {named:?}");
    }
}

#[test]
fn namespace_quota_is_resource_exhausted() {
    let mut state = State::new();
    let mut events = Vec::new();
    for chunk in 0..(NAMESPACES_MAX / 1000) {
        let cmds = (0..1000)
            .map(|i| Cmd::CreateNamespace {
                name: format!("ns{}", chunk * 1000 + i),
                description: String::new(),
                metadata: none(),
            })
            .collect();
        let replies = state.apply_batch(
            &Batch {
                now_ns: 0,
                cmds,
                wall_ns: 0,
            },
            &mut events,
        );
        assert!(replies.iter().all(Result::is_ok));
    }
    let cmd = Cmd::CreateNamespace {
        name: "one-more".into(),
        description: String::new(),
        metadata: none(),
    };
    let replies = state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds: vec![cmd],
            wall_ns: 0,
        },
        &mut events,
    );
    assert_eq!(
        replies[0].as_ref().map_err(|e| e.kind),
        Err(ErrorKind::ResourceExhausted)
    );
    state.check_invariants().expect("invariants hold");
}

// ---- semaphores ----

#[test]
fn semaphore_create_and_its_errors() {
    // t=3s  create db(2) in "n" -> version 1, all timestamps 3s
    let mut t = Timeline::with_ns();
    t.at(3 * S);
    let v = t.create_sem("db", 2);
    assert_eq!(
        (
            v.permits,
            v.version,
            v.active_holds,
            v.active_holders_count,
            v.waiters_count
        ),
        (2, 1, 0, 0, 0)
    );
    assert_eq!(
        (v.created_at, v.updated_at, v.last_activity_at),
        (3 * S, 3 * S, 3 * S)
    );
    let create = |ns: &str, name: &str, permits| Cmd::CreateSemaphore {
        ns: ns.into(),
        name: name.into(),
        description: String::new(),
        permits,
        metadata: none(),
        max_hold_ns: 0,
    };
    assert_eq!(t.err(create(NS, "db", 2)).kind, ErrorKind::AlreadyExists);
    let e = t.err(create("nope", "db", 2));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "namespace nope not found")
    );
    assert_eq!(t.err(create(NS, "x", 0)).kind, ErrorKind::InvalidArgument);
    assert_eq!(
        t.err(create(NS, "x", PERMITS_MAX + 1)).kind,
        ErrorKind::InvalidArgument
    );
    assert!(
        t.err(create(NS, "x y", 1))
            .message
            .starts_with("semaphore_name ")
    );
    assert!(
        t.err(create("x y", "x", 1))
            .message
            .starts_with("namespace_name ")
    );
    let e = t.read_at(0).get_semaphore(NS, "nope").expect_err("absent");
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "semaphore nope not found")
    );
}

#[test]
fn semaphore_update_checks_version_holds_and_waiters() {
    // t=0  db(4): L1 holds 3, L2 waits for 4
    let mut t = Timeline::with_ns();
    t.create_sem("db", 4);
    let l1 = t.create_lease(60);
    let l2 = t.create_lease(60);
    let tok1 = t.acquired("db", &l1, 3, 0);
    t.acquire("db", &l2, 4, 30 * S);
    let update = |permits, expected_version, metadata: Metadata| Cmd::UpdateSemaphore {
        ns: NS.into(),
        name: "db".into(),
        description: "new".into(),
        permits,
        metadata,
        expected_version,
        max_hold_ns: None,
    };
    // t=1s  wrong version; below holds; below a waiter's weight -> InvalidArgument, no change
    t.at(S);
    assert_eq!(
        t.err(update(5, 2, none())).message,
        "version mismatch: expected 2, found 1"
    );
    assert!(
        t.err(update(2, 1, none()))
            .message
            .starts_with("permits below active holds")
    );
    assert_eq!(
        t.err(update(3, 1, none())).message,
        "permits below the weight of a queued waiter"
    );
    t.take_events();
    // t=2s  raise to 7: L2 (4) fits next to L1 (3) -> granted from the head
    t.at(2 * S);
    let Outcome::Semaphore(v) = t.ok(update(7, 1, meta("a", "b"))) else {
        panic!()
    };
    let tok2 = t.state.holder(NS, "db", &l2).expect("granted").token;
    assert!(tok2 > tok1);
    assert_eq!(t.take_events(), vec![granted("db", &l2, tok2, 4)]);
    assert_eq!(
        (v.permits, v.version, v.active_holds, v.waiters_count),
        (7, 2, 7, 0)
    );
    assert_eq!(
        (v.updated_at, v.last_activity_at),
        (2 * S, 0),
        "update is not activity"
    );
    assert_eq!(
        (v.description.as_str(), v.metadata.clone()),
        ("new", meta("a", "b"))
    );
    // omitted metadata clears it
    let Outcome::Semaphore(v) = t.ok(update(7, 2, none())) else {
        panic!()
    };
    assert!(v.metadata.is_empty());
    assert_eq!(
        t.err(Cmd::UpdateSemaphore {
            ns: NS.into(),
            name: "zz".into(),
            description: String::new(),
            permits: 1,
            metadata: none(),
            expected_version: 1,
            max_hold_ns: None,
        })
        .kind,
        ErrorKind::NotFound
    );
}

#[test]
fn semaphore_update_with_five_permits_fails_only_on_version() {
    // the previous test's "5 permits, version 1" is fine on permits: 5 >= 3 held, 5 >= 4 waiting
    let mut t = Timeline::with_ns();
    t.create_sem("db", 4);
    let l1 = t.create_lease(60);
    t.acquired("db", &l1, 3, 0);
    let cmd = Cmd::UpdateSemaphore {
        ns: NS.into(),
        name: "db".into(),
        description: String::new(),
        permits: 5,
        metadata: none(),
        expected_version: 1,
        max_hold_ns: None,
    };
    assert!(t.run(cmd).is_ok());
}

#[test]
fn deleting_a_semaphore_drops_holders_and_waiters() {
    // t=0  db(1): L1 holds, L2 and L3 wait; L1 also holds "other"
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    t.create_sem("other", 1);
    let l1 = t.create_lease(60);
    let l2 = t.create_lease(60);
    let l3 = t.create_lease(60);
    t.acquired("db", &l1, 1, 0);
    t.acquired("other", &l1, 1, 0);
    t.acquire("db", &l2, 1, 10 * S);
    t.acquire("db", &l3, 1, 10 * S);
    t.take_events();
    // t=1s  delete db -> both waiters told, in queue order; L1 keeps "other"
    t.at(S);
    assert_eq!(
        t.ok(Cmd::DeleteSemaphore {
            ns: NS.into(),
            name: "db".into()
        }),
        Outcome::Done
    );
    assert_eq!(
        t.take_events(),
        vec![
            lost(&l1, "db", LossCause::SemaphoreDeleted),
            wait_ended("db", &l2, WaitEnd::SemaphoreGone),
            wait_ended("db", &l3, WaitEnd::SemaphoreGone)
        ]
    );
    assert_eq!(
        t.state.stats(),
        Stats {
            namespaces: 1,
            semaphores: 1,
            leases: 3,
            holders: 1,
            waiters: 0
        }
    );
    assert_eq!(t.state.next_due_ns(), Some(60 * S));
    // absent semaphore -> Done; absent namespace -> NotFound
    assert_eq!(
        t.ok(Cmd::DeleteSemaphore {
            ns: NS.into(),
            name: "db".into()
        }),
        Outcome::Done
    );
    assert_eq!(
        t.err(Cmd::DeleteSemaphore {
            ns: "x".into(),
            name: "db".into()
        })
        .kind,
        ErrorKind::NotFound
    );
    // recreated db starts empty; L1 can acquire it again
    t.create_sem("db", 1);
    t.acquired("db", &l1, 1, 0);
    assert_eq!(
        t.ok(Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: l1
        }),
        Outcome::Done
    );
    assert_eq!(t.sem("other").active_holds, 0);
}

#[test]
fn semaphore_list_is_ordered_and_paged() {
    let mut t = Timeline::with_ns();
    for name in ["b", "a", "c"] {
        t.create_sem(name, 1);
    }
    let list = |token: &str| {
        t.read_at(0)
            .list_semaphores(
                NS,
                &PageRequest {
                    token: token.into(),
                    limit: 2,
                },
            )
            .expect("ok")
    };
    let p1 = list("");
    assert_eq!(
        p1.items.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let p2 = list(&p1.next_token);
    assert_eq!(
        p2.items.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["c"]
    );
    assert_eq!(p2.next_token, "");
    assert_eq!(
        t.read_at(0)
            .list_semaphores("x", &PageRequest::default())
            .map_err(|e| e.kind),
        Err(ErrorKind::NotFound)
    );
}

/// A namespace holds at most a million semaphores, whatever its quotas say (about 7 s in a
/// debug build: it creates them).
#[test]
fn semaphore_quota_is_resource_exhausted() {
    let mut state = State::new();
    let mut events = Vec::new();
    let create_ns = Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: none(),
    };
    state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds: vec![create_ns],
            wall_ns: 0,
        },
        &mut events,
    );
    // The namespace's quotas and the state's budget let it hold the most semaphores a
    // namespace can have, so the hard limit is what refuses the next one.
    let quotas = Quotas {
        semaphores: SEMAPHORES_PER_NAMESPACE_MAX as u64,
        bytes: super::quota::BYTES_MAX,
        ..Quotas::default()
    };
    let raised = state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds: vec![
                Cmd::SetQuotas {
                    ns: NS.into(),
                    quotas,
                },
                Cmd::SetBudget {
                    bytes: super::quota::BYTES_MAX,
                },
            ],
            wall_ns: 0,
        },
        &mut events,
    );
    assert!(raised.iter().all(Result::is_ok), "{raised:?}");
    // Fill the namespace cheaply by inserting through the same code path in big batches.
    let sem = |i: usize| Cmd::CreateSemaphore {
        ns: NS.into(),
        name: format!("s{i}"),
        description: String::new(),
        permits: 1,
        metadata: none(),
        max_hold_ns: 0,
    };
    for chunk in 0..(SEMAPHORES_PER_NAMESPACE_MAX / 10_000) {
        let cmds = (0..10_000).map(|i| sem(chunk * 10_000 + i)).collect();
        let replies = state.apply_batch(
            &Batch {
                now_ns: 0,
                cmds,
                wall_ns: 0,
            },
            &mut events,
        );
        if let Some(Err(e)) = replies.iter().find(|r| r.is_err()) {
            panic!("semaphore {} of the fill: {e:?}", chunk * 10_000);
        }
    }
    let replies = state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds: vec![sem(usize::MAX)],
            wall_ns: 0,
        },
        &mut events,
    );
    let refused = replies[0].as_ref().expect_err("one past the limit");
    assert_eq!(refused.kind, ErrorKind::ResourceExhausted);
    assert!(
        refused
            .message
            .contains("at most 1000000 semaphores per namespace"),
        "the hard limit refuses, not a quota: {}",
        refused.message
    );
}

// ---- leases ----

#[test]
fn lease_ids_carry_the_commands_secret_are_unique_and_in_creation_order() {
    let mut t = Timeline::with_ns();
    t.at(5 * S);
    let a = t.create_lease_for("host-1/pid-2", 60);
    let b = t.create_lease(60);
    assert_eq!(a.lease_id, lease_id(1, 7));
    assert!(a.lease_id.starts_with("ls_") && a.lease_id.len() == 35);
    assert!(a.lease_id < b);
    assert_eq!(parse_lease_id(&a.lease_id), Some((1, 7)));
    assert_eq!((a.created_at, a.expires_at, a.ttl_s), (5 * S, 65 * S, 60));
    assert_eq!(a.process_id, "host-1/pid-2");
    // The secret is whatever the command carried.
    let c = match t.ok(Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        process_id: String::new(),
        ttl_s: 60,
        metadata: none(),
        secret: 0xfeed_f00d_dead_beef,
    }) {
        Outcome::Lease(lease) => lease.lease_id,
        other => panic!("{other:?}"),
    };
    assert_eq!(c, lease_id(3, 0xfeed_f00d_dead_beef));
    // The right number with another secret, a forged or mangled id: simply not found.
    let other_secret = lease_id(1, 8);
    for id in [
        other_secret.as_str(),
        "ls_",
        "ls_0000000000000001",
        "x",
        "LS_00000000000000010000000000000007",
        "ls_00000000000000010000000000000007x",
    ] {
        let e = t.err(Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: id.into(),
        });
        assert_eq!(e.kind, ErrorKind::NotFound, "{id}");
    }
    assert_eq!(
        t.err(Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: String::new()
        })
        .kind,
        ErrorKind::InvalidArgument
    );
    // ttl out of range; namespace missing
    let create = |ns: &str, ttl_s| Cmd::CreateLease {
        ns: ns.into(),
        kind: LeaseKind::Semaphore,
        process_id: String::new(),
        ttl_s,
        metadata: none(),
        secret: 7,
    };
    assert!(t.err(create(NS, 0)).message.starts_with("ttl_seconds "));
    assert!(t.err(create(NS, 301)).message.starts_with("ttl_seconds "));
    assert_eq!(t.err(create("x", 10)).kind, ErrorKind::NotFound);
}

#[test]
fn refresh_extends_and_may_change_the_ttl() {
    // t=0  L ttl 10s -> expires 10s
    let mut t = Timeline::with_ns();
    let l = t.create_lease(10);
    let refresh = |ttl_s| Cmd::RefreshLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: l.clone(),
        ttl_s,
    };
    // t=4s  refresh (own ttl) -> 14s
    t.at(4 * S);
    let Outcome::Lease(v) = t.ok(refresh(0)) else {
        panic!()
    };
    assert_eq!((v.expires_at, v.ttl_s), (14 * S, 10));
    // t=5s  refresh with 30s -> 35s, and 30s becomes the lease's ttl
    t.at(5 * S);
    let Outcome::Lease(v) = t.ok(refresh(30)) else {
        panic!()
    };
    assert_eq!((v.expires_at, v.ttl_s), (35 * S, 30));
    t.at(6 * S);
    let Outcome::Lease(v) = t.ok(refresh(0)) else {
        panic!()
    };
    assert_eq!(v.expires_at, 36 * S);
    assert_eq!(
        t.read_at(6 * S).get_lease(NS, LeaseKind::Semaphore, &l),
        Ok(v)
    );
    assert_eq!(t.state.next_due_ns(), Some(36 * S));
    assert!(t.err(refresh(301)).message.starts_with("ttl_seconds "));
    assert_eq!(
        t.err(Cmd::RefreshLease {
            ns: "x".into(),
            kind: LeaseKind::Semaphore,
            lease: l.clone(),
            ttl_s: 0
        })
        .kind,
        ErrorKind::NotFound
    );
}

#[test]
fn refreshing_an_expired_lease_revokes_it_and_is_not_found() {
    // t=0  db(1): L (ttl 10s) holds, W waits 60s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let l = t.create_lease(10);
    let w = t.create_lease(100);
    t.acquired("db", &l, 1, 0);
    t.acquire("db", &w, 1, 60 * S);
    t.take_events();
    // t=9s  reads still show L
    assert!(
        t.read_at(9 * S)
            .get_lease(NS, LeaseKind::Semaphore, &l)
            .is_ok()
    );
    // t=10s a read hides L and its hold even before anything is reaped
    assert_eq!(
        t.read_at(10 * S)
            .get_lease(NS, LeaseKind::Semaphore, &l)
            .map_err(|e| e.kind),
        Err(ErrorKind::NotFound)
    );
    assert_eq!(
        t.read_at(10 * S)
            .get_semaphore(NS, "db")
            .map(|s| s.active_holds),
        Ok(0)
    );
    assert!(
        t.state.holder(NS, "db", &l).is_some(),
        "holder() does not filter"
    );
    // t=10s refresh -> NotFound; L was reaped first, so W got the permit
    t.at(10 * S);
    let e = t
        .run(Cmd::RefreshLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: l.clone(),
            ttl_s: 0,
        })
        .expect_err("expired");
    assert_eq!(e.kind, ErrorKind::NotFound);
    let token = t.state.holder(NS, "db", &w).expect("granted").token;
    assert_eq!(
        t.take_events(),
        vec![
            lost(&l, "", LossCause::Expired),
            granted("db", &w, token, 1)
        ]
    );
    assert_eq!(t.holders("db"), vec![hold(&w, 1)]);
}

#[test]
fn revoke_releases_everything_atomically() {
    // t=0  db(2), cache(1): L holds db 2 and cache; L waits for nothing; A waits db, B waits cache
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    t.create_sem("cache", 1);
    t.create_sem("q", 1);
    let l = t.create_lease(60);
    let a = t.create_lease(60);
    let b = t.create_lease(60);
    t.acquired("db", &l, 2, 0);
    t.acquired("cache", &l, 1, 0);
    t.acquired("q", &a, 1, 0);
    t.acquire("q", &l, 1, 30 * S);
    t.acquire("db", &a, 2, 30 * S);
    t.acquire("cache", &b, 1, 30 * S);
    t.take_events();
    // t=1s  revoke L -> its wait on q ends, A gets db, B gets cache
    t.at(S);
    assert_eq!(
        t.ok(Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: l.clone()
        }),
        Outcome::Done
    );
    let ta = t.state.holder(NS, "db", &a).expect("A holds db").token;
    let tb = t
        .state
        .holder(NS, "cache", &b)
        .expect("B holds cache")
        .token;
    assert_eq!(
        t.take_events(),
        vec![
            lost(&l, "", LossCause::Revoked),
            wait_ended("q", &l, WaitEnd::LeaseGone),
            granted("cache", &b, tb, 1),
            granted("db", &a, ta, 2)
        ]
    );
    assert_eq!(t.state.stats().waiters, 0);
    assert_eq!(
        t.err(Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: l.clone()
        })
        .kind,
        ErrorKind::NotFound
    );
    assert_eq!(
        t.err(Tim::acquire_cmd("db", &l, 1, 0)).kind,
        ErrorKind::NotFound
    );
}

#[test]
fn lease_list_filters_by_process_and_hides_expired() {
    // t=0  p1: A (ttl 5), B (ttl 60); p2: C; p1: D
    let mut t = Timeline::with_ns();
    let a = t.create_lease_for("p1", 5).lease_id;
    let b = t.create_lease_for("p1", 60).lease_id;
    let c = t.create_lease_for("p2", 60).lease_id;
    let d = t.create_lease_for("p1", 60).lease_id;
    let ids = |page: Page<LeaseView>| {
        page.items
            .into_iter()
            .map(|l| l.lease_id)
            .collect::<Vec<_>>()
    };
    let list = |pid: Option<&str>, token: &str, limit, now_ns| {
        t.read_at(now_ns)
            .list_leases(
                NS,
                LeaseKind::Semaphore,
                pid,
                &PageRequest {
                    token: token.into(),
                    limit,
                },
            )
            .expect("ok")
    };
    assert_eq!(
        ids(list(None, "", 0, 0)),
        [a.as_str(), b.as_str(), c.as_str(), d.as_str()]
    );
    assert_eq!(
        ids(list(Some("p1"), "", 0, 0)),
        [a.as_str(), b.as_str(), d.as_str()]
    );
    assert_eq!(ids(list(Some("p2"), "", 0, 0)), [c.as_str()]);
    assert!(ids(list(Some("p3"), "", 0, 0)).is_empty());
    // t=5s  A has expired for readers
    assert_eq!(
        ids(list(Some("p1"), "", 0, 5 * S)),
        [b.as_str(), d.as_str()]
    );
    // paging through p1 one at a time, forwards and back
    let p1 = list(Some("p1"), "", 1, 0);
    assert_eq!(ids(p1.clone()), [a.as_str()]);
    let p2 = list(Some("p1"), &p1.next_token, 1, 0);
    assert_eq!(ids(p2.clone()), [b.as_str()]);
    let p3 = list(Some("p1"), &p2.next_token, 1, 0);
    assert_eq!(ids(p3.clone()), [d.as_str()]);
    assert_eq!(p3.next_token, "");
    assert_eq!(
        ids(list(Some("p1"), &p3.previous_token, 1, 0)),
        [b.as_str()]
    );
    // a cursor past every key of the index must not panic
    let far = list(Some("p1"), &format!("f.{}", "ff".repeat(8)), 1, 0);
    assert!(far.items.is_empty());
    assert_eq!(
        ids(list(Some("p1"), &far.previous_token, 1, 0)),
        [d.as_str()]
    );
    let start = list(Some("p1"), &format!("b.{}", "00".repeat(8)), 1, 0);
    assert!(start.items.is_empty());
    assert!(
        t.read_at(0)
            .list_leases(
                NS,
                LeaseKind::Semaphore,
                Some(&"p".repeat(129)),
                &PageRequest::default()
            )
            .is_err()
    );
}

// ---- acquire ----

#[test]
fn acquire_grants_when_free_and_reports_unavailable_otherwise() {
    // t=0  db(3); t=1s L1 acquires weight 0 (= 1) and L2 acquires 2 -> both granted
    let mut t = Timeline::with_ns();
    t.create_sem("db", 3);
    let l1 = t.create_lease(60);
    let l2 = t.create_lease(60);
    let l3 = t.create_lease(60);
    t.at(S);
    let tok1 = t.acquired("db", &l1, 0, 0);
    let r = t.acquire("db", &l2, 2, 0);
    let AcquireStatus::Acquired { token: tok2, .. } = r.status else {
        panic!("{r:?}")
    };
    assert!(tok2 > tok1 && tok1 > 0);
    assert_eq!(
        (
            r.semaphore.active_holds,
            r.semaphore.active_holders_count,
            r.semaphore.last_activity_at
        ),
        (3, 2, S)
    );
    // t=2s  L3 non-blocking -> Unavailable; only last_activity_at changes
    t.at(2 * S);
    let r = t.acquire("db", &l3, 1, 0);
    assert_eq!(r.status, AcquireStatus::Unavailable);
    assert_eq!(
        (
            r.semaphore.active_holds,
            r.semaphore.waiters_count,
            r.semaphore.last_activity_at
        ),
        (3, 0, 2 * S)
    );
    assert_eq!(t.holders("db"), vec![hold(&l1, 1), hold(&l2, 2)]);
    assert!(t.take_events().is_empty());
}

#[test]
fn acquire_errors_change_nothing() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    let l = t.create_lease(60);
    t.at(S);
    // weight above permits: InvalidArgument at once, even when blocking
    let e = t.err(Tim::acquire_cmd("db", &l, 3, 10 * S));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (
            ErrorKind::InvalidArgument,
            "weight exceeds semaphore permits"
        )
    );
    assert_eq!(
        t.err(Tim::acquire_cmd("db", &l, u64::MAX, 0)).kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(t.sem("db").last_activity_at, 0);
    // unknown namespace, semaphore, lease
    let e = t.err(Cmd::Acquire {
        ns: "x".into(),
        sem: "db".into(),
        lease: l.clone(),
        weight: 1,
        wait_ns: 0,
        metadata: none(),
        max_hold_ns: 0,
    });
    assert_eq!(e.message, "namespace x not found");
    assert_eq!(
        t.err(Tim::acquire_cmd("nope", &l, 1, 0)).message,
        "semaphore nope not found"
    );
    let e = t.err(Tim::acquire_cmd("db", "ls_nope", 1, 0));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "lease ls_nope not found")
    );
    // bad timeout, bad metadata
    assert!(
        t.err(Tim::acquire_cmd("db", &l, 1, -1))
            .message
            .starts_with("timeout_seconds ")
    );
    assert!(
        t.err(Tim::acquire_cmd("db", &l, 1, 301 * S))
            .message
            .starts_with("timeout_seconds ")
    );
    let mut cmd = Tim::acquire_cmd("db", &l, 1, 0);
    if let Cmd::Acquire { metadata, .. } = &mut cmd {
        metadata.insert("k".into(), "v".repeat(257));
    }
    assert!(t.err(cmd).message.starts_with("metadata "));
}

#[test]
fn waiters_are_granted_in_strict_fifo_order() {
    // t=0  db(3): H holds 2; A queues for 3 (heavy), then B queues for 1
    let mut t = Timeline::with_ns();
    t.create_sem("db", 3);
    let h = t.create_lease(60);
    let a = t.create_lease(60);
    let b = t.create_lease(60);
    let c = t.create_lease(60);
    t.acquired("db", &h, 2, 0);
    assert_eq!(
        t.acquire("db", &a, 3, 30 * S).status,
        AcquireStatus::Queued {
            deadline_ns: 30 * S
        }
    );
    // B would fit (2 + 1 <= 3) but must not jump the heavy head
    assert_eq!(
        t.acquire("db", &b, 1, 30 * S).status,
        AcquireStatus::Queued {
            deadline_ns: 30 * S
        }
    );
    // C non-blocking: fits but the queue is not empty -> Unavailable
    assert_eq!(t.acquire("db", &c, 1, 0).status, AcquireStatus::Unavailable);
    assert_eq!(t.waiters("db"), vec![hold(&a, 3), hold(&b, 1)]);
    let (view, page) = t
        .read_at(0)
        .list_waiters(NS, "db", &PageRequest::default())
        .expect("ok");
    assert_eq!(view.waiters_count, 2);
    assert_eq!(
        page.items.iter().map(|w| w.position).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(t.state.waiter(NS, "db", &b).map(|w| w.position), Some(1));
    t.take_events();
    // t=1s  H releases -> A (3) granted; B still waits behind it
    t.at(S);
    let v = t.release("db", &h);
    let ta = t.state.holder(NS, "db", &a).expect("A holds").token;
    assert_eq!(t.take_events(), vec![granted("db", &a, ta, 3)]);
    assert_eq!((v.active_holds, v.waiters_count), (3, 1));
    // t=2s  A releases -> B granted
    t.at(2 * S);
    t.release("db", &a);
    let tb = t.state.holder(NS, "db", &b).expect("B holds").token;
    assert!(tb > ta);
    assert_eq!(t.take_events(), vec![granted("db", &b, tb, 1)]);
    assert_eq!(
        t.state.holder(NS, "db", &b).map(|h| h.locked_at),
        Some(2 * S)
    );
}

#[test]
fn a_heavy_head_blocks_lighter_waiters_while_permits_are_partly_free() {
    // t=0  db(3): H1 and H2 hold 1 each; A queues for 3; B queues for 1 (it would fit)
    let mut t = Timeline::with_ns();
    t.create_sem("db", 3);
    let h1 = t.create_lease(60);
    let h2 = t.create_lease(60);
    let a = t.create_lease(60);
    let b = t.create_lease(60);
    t.acquired("db", &h1, 1, 0);
    t.acquired("db", &h2, 1, 0);
    t.acquire("db", &a, 3, 30 * S);
    t.acquire("db", &b, 1, 30 * S);
    // t=1s  H1 releases: 2 permits free, A still does not fit, and B must not pass it
    t.at(S);
    t.release("db", &h1);
    assert!(t.take_events().is_empty());
    assert_eq!(t.waiters("db"), vec![hold(&a, 3), hold(&b, 1)]);
    // t=2s  H2 releases: A gets all 3, B keeps waiting
    t.at(2 * S);
    t.release("db", &h2);
    assert_eq!(t.holders("db"), vec![hold(&a, 3)]);
    assert_eq!(t.waiters("db"), vec![hold(&b, 1)]);
}

#[test]
fn one_release_can_grant_several_waiters() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 3);
    let h = t.create_lease(60);
    let ls: Vec<String> = (0..3).map(|_| t.create_lease(60)).collect();
    t.acquired("db", &h, 3, 0);
    for l in &ls {
        t.acquire("db", l, 1, 10 * S);
    }
    t.take_events();
    t.release("db", &h);
    let events = t.take_events();
    assert_eq!(events.len(), 3);
    let mut last = 0;
    for (event, l) in events.iter().zip(&ls) {
        let Event::Granted { lease, token, .. } = event else {
            panic!("{event:?}")
        };
        assert_eq!(lease, l);
        assert!(*token > last);
        last = *token;
    }
}

#[test]
fn reacquire_sets_the_weight_and_never_makes_a_second_holder() {
    // t=0  db(4): L holds 3
    let mut t = Timeline::with_ns();
    t.create_sem("db", 4);
    let l = t.create_lease(60);
    let o = t.create_lease(60);
    let tok1 = t.acquired("db", &l, 3, 0);
    // t=1s  L re-acquires 1 -> granted at once with a new token and weight 1
    t.at(S);
    let tok2 = t.acquired("db", &l, 1, 0);
    assert!(tok2 > tok1);
    assert_eq!(t.holders("db"), vec![hold(&l, 1)]);
    // L re-acquires 4: its own 1 counts as free and the queue is empty -> granted
    let tok3 = t.acquired("db", &l, 4, 0);
    assert!(tok3 > tok2);
    assert_eq!(t.holders("db"), vec![hold(&l, 4)]);
    // back to 2, then O takes 2
    t.acquired("db", &l, 2, 0);
    t.acquired("db", &o, 2, 0);
    // L asks for 3 without waiting -> Unavailable, the old hold stays
    assert_eq!(t.acquire("db", &l, 3, 0).status, AcquireStatus::Unavailable);
    assert_eq!(t.holders("db").len(), 2);
    assert_eq!(t.state.holder(NS, "db", &l).map(|h| h.weight), Some(2));
    t.take_events();
    // L asks for 3 waiting 10s -> queued while holding 2
    assert_eq!(
        t.acquire("db", &l, 3, 10 * S).status,
        AcquireStatus::Queued {
            deadline_ns: 11 * S
        }
    );
    assert_eq!(t.state.stats().holders, 2);
    assert_eq!(t.sem("db").active_holds, 4);
    // t=2s  O releases -> L's upgrade is granted: one holder, weight 3
    t.at(2 * S);
    t.release("db", &o);
    let h = t.state.holder(NS, "db", &l).expect("holds");
    assert_eq!(h.weight, 3);
    assert_eq!(t.take_events(), vec![granted("db", &l, h.token, 3)]);
    assert_eq!(t.holders("db"), vec![hold(&l, 3)]);
    assert_eq!(
        t.give_up("db", &l, 11 * S),
        GiveUpReply::Granted {
            token: h.token,
            hold_ns: 0,
        }
    );
}

#[test]
fn reacquire_at_a_lower_weight_settles_a_pending_upgrade() {
    // t=0  db(2): L holds 1, O holds 1; L queues an upgrade to 2
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    let l = t.create_lease(60);
    let o = t.create_lease(60);
    let w = t.create_lease(60);
    t.acquired("db", &l, 1, 0);
    t.acquired("db", &o, 1, 0);
    t.acquire("db", &l, 2, 10 * S);
    t.acquire("db", &w, 1, 10 * S);
    t.take_events();
    // L re-acquires 1 -> granted at once, the upgrade leaves the queue (its caller learns the
    // grant), and W is still behind nobody but does not fit
    let token = t.acquired("db", &l, 1, 0);
    assert_eq!(t.take_events(), vec![granted("db", &l, token, 1)]);
    assert_eq!(t.waiters("db"), vec![hold(&w, 1)]);
    // L gives up the (already settled) upgrade -> Granted with the current token
    assert_eq!(
        t.give_up("db", &l, 10 * S),
        GiveUpReply::Granted { token, hold_ns: 0 }
    );
}

#[test]
fn reattach_keeps_the_place_and_extends_the_deadline() {
    // t=0  db(2): H holds 2; A waits 10s for 2, B waits 10s for 1
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    let h = t.create_lease(100);
    let a = t.create_lease(100);
    let b = t.create_lease(100);
    t.acquired("db", &h, 2, 0);
    t.acquire("db", &a, 2, 10 * S);
    t.acquire("db", &b, 1, 10 * S);
    // t=5s  A re-attaches waiting 20s -> same place, deadline 25s
    t.at(5 * S);
    assert_eq!(
        t.acquire("db", &a, 2, 20 * S).status,
        AcquireStatus::Queued {
            deadline_ns: 25 * S
        }
    );
    assert_eq!(t.waiters("db"), vec![hold(&a, 2), hold(&b, 1)]);
    // a shorter wait never shortens the deadline
    assert_eq!(
        t.acquire("db", &a, 2, S).status,
        AcquireStatus::Queued {
            deadline_ns: 25 * S
        }
    );
    // with wait 0 while still queued -> Unavailable, and the waiter stays
    assert_eq!(t.acquire("db", &a, 2, 0).status, AcquireStatus::Unavailable);
    assert_eq!(
        t.state
            .waiter(NS, "db", &a)
            .map(|w| (w.position, w.deadline_ns)),
        Some((0, 25 * S))
    );
    assert_eq!(t.state.next_due_ns(), Some(10 * S));
    // t=10s B times out; A does not
    t.at(10 * S);
    t.ok(Cmd::Expire);
    assert_eq!(
        t.take_events(),
        vec![wait_ended("db", &b, WaitEnd::TimedOut)]
    );
    assert_eq!(t.waiters("db"), vec![hold(&a, 2)]);
}

#[test]
fn reattach_with_a_lower_weight_can_be_granted_at_once() {
    // t=0  db(2): H holds 1; A waits for 2
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    let h = t.create_lease(100);
    let a = t.create_lease(100);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &a, 2, 10 * S);
    t.take_events();
    // A re-attaches for 1 -> fits now -> Acquired, and its waiting caller hears the grant too
    let r = t.acquire("db", &a, 1, 0);
    let AcquireStatus::Acquired { token, .. } = r.status else {
        panic!("{r:?}")
    };
    assert_eq!(t.take_events(), vec![granted("db", &a, token, 1)]);
    assert_eq!(r.semaphore.active_holds, 2);
}

#[test]
fn holder_and_waiter_quotas_are_resource_exhausted() {
    // db(5000): 1000 holders fit, the 1001st is refused though permits are free
    let mut t = Timeline::with_ns();
    // Quotas above the per-semaphore caps, so the caps are what refuses.
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: super::quota::Quotas {
            leases: 20_000,
            entries: 20_000,
            ..Default::default()
        },
    });
    t.create_sem("db", 5000);
    t.create_sem("one", 1);
    let mut events = Vec::new();
    let create = |n| Batch {
        now_ns: 0,
        cmds: (0..n)
            .map(|_| Cmd::CreateLease {
                ns: NS.into(),
                kind: LeaseKind::Semaphore,
                process_id: String::new(),
                ttl_s: 300,
                metadata: none(),
                secret: 7,
            })
            .collect(),
        wall_ns: 0,
    };
    let leases: Vec<String> = t
        .state
        .apply_batch(&create(WAITERS_PER_SEMAPHORE_MAX + 2), &mut events)
        .into_iter()
        .map(|r| match r {
            Ok(Outcome::Lease(l)) => l.lease_id,
            other => panic!("{other:?}"),
        })
        .collect();
    let cmds = leases[..HOLDERS_PER_SEMAPHORE_MAX]
        .iter()
        .map(|l| Tim::acquire_cmd("db", l, 1, 0))
        .collect();
    let replies = t.state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds,
            wall_ns: 0,
        },
        &mut events,
    );
    assert!(replies.iter().all(|r| matches!(
        r,
        Ok(Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Acquired { .. },
            ..
        }))
    )));
    let e = t.err(Tim::acquire_cmd(
        "db",
        &leases[HOLDERS_PER_SEMAPHORE_MAX],
        1,
        10 * S,
    ));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    // an existing holder can still change its weight
    t.acquired("db", &leases[0], 5, 0);
    // one(1): a holder plus 10 000 waiters, then the next waiter is refused
    t.acquired("one", &leases[0], 1, 0);
    let cmds = leases[1..=WAITERS_PER_SEMAPHORE_MAX]
        .iter()
        .map(|l| Tim::acquire_cmd("one", l, 1, 300 * S))
        .collect();
    let replies = t.state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds,
            wall_ns: 0,
        },
        &mut events,
    );
    assert!(replies.iter().all(|r| matches!(
        r,
        Ok(Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Queued { .. },
            ..
        }))
    )));
    let e = t.err(Tim::acquire_cmd(
        "one",
        &leases[WAITERS_PER_SEMAPHORE_MAX + 1],
        1,
        300 * S,
    ));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    // but a non-blocking attempt is just Unavailable
    assert_eq!(
        t.acquire("one", &leases[WAITERS_PER_SEMAPHORE_MAX + 1], 1, 0)
            .status,
        AcquireStatus::Unavailable
    );
    t.state.check_invariants().expect("invariants hold");
}

#[test]
fn a_head_without_a_holder_slot_waits_for_one() {
    // db(2000): 1000 holders of weight 1; W queues (permits fit, no holder slot)
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2000);
    let mut events = Vec::new();
    let cmds = (0..=HOLDERS_PER_SEMAPHORE_MAX)
        .map(|_| Cmd::CreateLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            process_id: String::new(),
            ttl_s: 300,
            metadata: none(),
            secret: 7,
        })
        .collect();
    let leases: Vec<String> = t
        .state
        .apply_batch(
            &Batch {
                now_ns: 0,
                cmds,
                wall_ns: 0,
            },
            &mut events,
        )
        .into_iter()
        .filter_map(|r| match r {
            Ok(Outcome::Lease(l)) => Some(l.lease_id),
            _ => None,
        })
        .collect();
    let cmds = leases[..HOLDERS_PER_SEMAPHORE_MAX]
        .iter()
        .map(|l| Tim::acquire_cmd("db", l, 1, 0))
        .collect();
    t.state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds,
            wall_ns: 0,
        },
        &mut events,
    );
    // make the queue non-empty first so W queues instead of being refused: H upgrades to 2000
    let w = &leases[HOLDERS_PER_SEMAPHORE_MAX];
    assert!(matches!(
        t.acquire("db", &leases[0], 2000, 10 * S).status,
        AcquireStatus::Queued { .. }
    ));
    assert!(matches!(
        t.acquire("db", w, 1, 10 * S).status,
        AcquireStatus::Queued { .. }
    ));
    t.take_events();
    // the upgrade gives up; W is head, fits on permits, still no slot -> waits
    assert_eq!(t.give_up("db", &leases[0], 10 * S), GiveUpReply::Removed);
    assert!(t.state.waiter(NS, "db", w).is_some());
    // one holder leaves -> W granted
    t.release("db", &leases[1]);
    assert!(t.state.holder(NS, "db", w).is_some());
}

// ---- release and give up ----

#[test]
fn release_cases() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(60);
    let w = t.create_lease(60);
    let x = t.create_lease(60);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &w, 1, 10 * S);
    t.take_events();
    // t=1s  releasing a semaphore X does not hold is a no-op returning the semaphore
    t.at(S);
    let v = t.release("db", &x);
    assert_eq!(
        (v.active_holds, v.waiters_count, v.last_activity_at),
        (1, 1, S)
    );
    assert!(t.take_events().is_empty());
    // the waiter releases -> leaves the queue
    let v = t.release("db", &w);
    assert_eq!((v.active_holds, v.waiters_count), (1, 0));
    assert_eq!(t.take_events(), vec![wait_ended("db", &w, WaitEnd::GaveUp)]);
    // unknown semaphore / lease / namespace -> NotFound
    let release = |ns: &str, sem: &str, lease: &str| Cmd::Release {
        ns: ns.into(),
        sem: sem.into(),
        lease: lease.into(),
    };
    assert_eq!(t.err(release(NS, "nope", &h)).kind, ErrorKind::NotFound);
    assert_eq!(t.err(release(NS, "db", "ls_x")).kind, ErrorKind::NotFound);
    assert_eq!(t.err(release("x", "db", &h)).kind, ErrorKind::NotFound);
    // the holder releases
    let v = t.release("db", &h);
    assert_eq!((v.active_holds, v.active_holders_count), (0, 0));
}

#[test]
fn give_up_cases() {
    // t=0  db(1): H holds; A waits until 10s; B waits until 10s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(60);
    let a = t.create_lease(60);
    let b = t.create_lease(60);
    let x = t.create_lease(60);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &a, 1, 10 * S);
    t.acquire("db", &b, 1, 10 * S);
    // t=2s  A re-attached until 12s, so an old caller's give-up (deadline 10s) leaves it queued
    t.at(2 * S);
    t.acquire("db", &a, 1, 10 * S);
    t.take_events();
    assert_eq!(
        t.give_up("db", &a, 10 * S),
        GiveUpReply::StillQueued {
            deadline_ns: 12 * S
        }
    );
    // the newer caller gives up -> Removed
    assert_eq!(t.give_up("db", &a, 12 * S), GiveUpReply::Removed);
    assert_eq!(t.take_events(), vec![wait_ended("db", &a, WaitEnd::GaveUp)]);
    // not queued: X, and anything unknown
    assert_eq!(t.give_up("db", &x, 10 * S), GiveUpReply::NotQueued);
    assert_eq!(t.give_up("nope", &x, 10 * S), GiveUpReply::NotQueued);
    assert_eq!(t.give_up("db", "ls_nope", 10 * S), GiveUpReply::NotQueued);
    let cmd = Cmd::GiveUp {
        ns: "x".into(),
        sem: "db".into(),
        lease: x.clone(),
        deadline_ns: 0,
        linger_ns: 0,
    };
    assert_eq!(t.ok(cmd), Outcome::GiveUp(GiveUpReply::NotQueued));
    // t=3s  H releases -> B granted; B's give-up that raced behind it reports the grant
    t.at(3 * S);
    t.release("db", &h);
    let token = t.state.holder(NS, "db", &b).expect("granted").token;
    assert_eq!(
        t.give_up("db", &b, 10 * S),
        GiveUpReply::Granted { token, hold_ns: 0 }
    );
    assert_eq!(t.sem("db").active_holds, 1, "the grant is not leaked");
}

#[test]
fn giving_up_the_head_lets_the_next_waiter_in() {
    // db(2): H holds 1; A (head) waits for 2; B waits for 1 and would fit
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    let h = t.create_lease(60);
    let a = t.create_lease(60);
    let b = t.create_lease(60);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &a, 2, 10 * S);
    t.acquire("db", &b, 1, 10 * S);
    t.take_events();
    assert_eq!(t.give_up("db", &a, 10 * S), GiveUpReply::Removed);
    let token = t.state.holder(NS, "db", &b).expect("B granted").token;
    assert_eq!(
        t.take_events(),
        vec![
            wait_ended("db", &a, WaitEnd::GaveUp),
            granted("db", &b, token, 1)
        ]
    );
}

// ---- time ----

#[test]
fn holder_is_dropped_once_its_lease_expires() {
    // t=0    create "db" with 2 permits; lease L, ttl 10s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 2);
    let l = t.create_lease(10);
    // t=5s   L acquires 2          -> Acquired
    t.at(5 * S);
    t.acquired("db", &l, 2, 0);
    assert_eq!(t.state.next_due_ns(), Some(10 * S));
    // t=9s   nothing is due yet
    t.at(9 * S);
    t.ok(Cmd::Expire);
    assert_eq!(t.sem("db").active_holds, 2);
    // t=16s  Expire                -> held weight back to 0
    t.at(16 * S);
    assert_eq!(t.ok(Cmd::Expire), Outcome::Done);
    assert_eq!(t.sem("db").active_holds, 0);
    assert_eq!(t.state.stats().leases, 0);
    assert_eq!(t.state.next_due_ns(), None);
}

#[test]
fn expiry_grants_waiters_but_never_a_waiter_that_is_itself_due() {
    // t=0  db(1): H (ttl 10s) holds; A waits until 10s; B (ttl 100s) waits until 20s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(10);
    let a = t.create_lease(100);
    let b = t.create_lease(100);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &a, 1, 10 * S);
    t.acquire("db", &b, 1, 20 * S);
    t.take_events();
    // t=10s any command reaps first: H expires and A's deadline passes at the same instant;
    // A times out (never granted), B gets the permit
    t.at(10 * S);
    let view = t.release("db", &a);
    let token = t.state.holder(NS, "db", &b).expect("B granted").token;
    assert_eq!(
        t.take_events(),
        vec![
            lost(&h, "", LossCause::Expired),
            wait_ended("db", &a, WaitEnd::TimedOut),
            granted("db", &b, token, 1)
        ]
    );
    assert_eq!((view.active_holds, view.waiters_count), (1, 0));
}

#[test]
fn the_tally_counts_grants_waits_and_expirations_and_resets() {
    // t=0 H holds db(1), W waits; t=10s H expires and W is granted after waiting 10s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(10);
    let w = t.create_lease(100);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &w, 1, 60 * S);
    let first = t.state.take_tally();
    assert_eq!((first.grants, first.expirations), (1, 0));
    assert!(
        first.waits_ns.is_empty(),
        "an immediate grant waited for nothing"
    );
    t.at(10 * S);
    t.create_lease(5);
    assert!(
        t.state.holder(NS, "db", &w).is_some(),
        "W granted at the expiry"
    );
    let second = t.state.take_tally();
    assert_eq!((second.grants, second.expirations), (1, 1));
    assert_eq!(second.waits_ns, vec![10 * S]);
    assert_eq!(t.state.take_tally(), Tally::default(), "taking resets it");
}

#[test]
fn an_expiring_lease_ends_its_waits() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(100);
    let w = t.create_lease(5);
    t.acquired("db", &h, 1, 0);
    t.acquire("db", &w, 1, 60 * S);
    t.take_events();
    assert_eq!(t.state.next_due_ns(), Some(5 * S));
    // a reader at 5s no longer sees the waiter
    let (view, page) = t
        .read_at(5 * S)
        .list_waiters(NS, "db", &PageRequest::default())
        .expect("ok");
    assert_eq!((view.waiters_count, page.items.len()), (0, 0));
    assert!(
        t.state.waiter(NS, "db", &w).is_some(),
        "waiter() does not filter"
    );
    t.at(5 * S);
    t.ok(Cmd::Expire);
    assert_eq!(
        t.take_events(),
        vec![
            lost(&w, "", LossCause::Expired),
            wait_ended("db", &w, WaitEnd::LeaseGone)
        ]
    );
    assert_eq!(t.state.next_due_ns(), Some(100 * S));
}

#[test]
fn the_clock_never_runs_backwards() {
    let mut t = Timeline::with_ns();
    t.at(10 * S);
    t.ok(Cmd::Expire);
    t.at(3 * S);
    let l = t.create_lease_for("", 5);
    assert_eq!(t.state.clock_ns(), 10 * S);
    assert_eq!(t.state.next_due_ns(), Some(15 * S));
    // Display times take the batch's wall stamp, whatever the lease clock says.
    assert_eq!((l.created_at, l.expires_at), (3 * S, 8 * S));
}

#[test]
fn extend_leases_gives_every_lease_its_ttl_from_now_and_leaves_waiters_alone() {
    // t=0  A ttl 10s, B ttl 100s; db(1): A holds, B waits until 12s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let a = t.create_lease(10);
    let b = t.create_lease(100);
    t.acquired("db", &a, 1, 0);
    t.acquire("db", &b, 1, 12 * S);
    // t=30s a new leader's first entry: ExtendLeases before anything is reaped
    let mut events = Vec::new();
    let batch = Batch {
        now_ns: 30 * S,
        cmds: vec![Cmd::ExtendLeases, Cmd::Expire],
        wall_ns: 30 * S,
    };
    let replies = t.state.apply_batch(&batch, &mut events);
    assert_eq!(replies, vec![Ok(Outcome::Done), Ok(Outcome::Done)]);
    t.state.check_invariants().expect("invariants hold");
    // A lives until 40s (it was due at 10s but survived), B until 130s; B's wait timed out
    assert_eq!(
        t.read_at(30 * S)
            .get_lease(NS, LeaseKind::Semaphore, &a)
            .map(|l| l.expires_at),
        Ok(40 * S)
    );
    assert_eq!(
        t.read_at(30 * S)
            .get_lease(NS, LeaseKind::Semaphore, &b)
            .map(|l| l.expires_at),
        Ok(130 * S)
    );
    assert_eq!(events, vec![wait_ended("db", &b, WaitEnd::TimedOut)]);
    assert!(t.state.holder(NS, "db", &a).is_some());
}

#[test]
fn extreme_times_and_inputs_do_not_panic() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let l = t.create_lease(300);
    t.at(i64::MIN);
    t.ok(Cmd::Expire);
    t.at(i64::MAX - 1);
    // everything reaped; new leases saturate at i64::MAX
    let l2 = t.create_lease_for("", 300);
    assert_eq!(l2.expires_at, i64::MAX);
    assert_eq!(
        t.err(Cmd::RefreshLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: l,
            ttl_s: 0
        })
        .kind,
        ErrorKind::NotFound
    );
    let r = t.acquire("db", &l2.lease_id, 1, 300 * S);
    assert!(matches!(r.status, AcquireStatus::Acquired { .. }));
    t.ok(Cmd::ExtendLeases);
    assert_eq!(
        t.give_up("db", &l2.lease_id, i64::MIN),
        GiveUpReply::Granted {
            token: 1,
            hold_ns: 0,
        }
    );
    t.at(i64::MAX);
    t.ok(Cmd::Expire);
    assert_eq!(t.state.stats().leases, 0);
    for limit in [i32::MIN, -1, 251, i32::MAX] {
        assert!(
            t.read_at(0)
                .list_leases(
                    NS,
                    LeaseKind::Semaphore,
                    None,
                    &PageRequest {
                        token: String::new(),
                        limit
                    },
                )
                .is_err()
        );
    }
}

// ---- reads ----

#[test]
fn reads_hide_expired_holders_before_they_are_reaped() {
    // t=0  db(3): A (ttl 5) holds 1, B (ttl 50) holds 2; W (ttl 50) waits until 8s
    let mut t = Timeline::with_ns();
    t.create_sem("db", 3);
    let a = t.create_lease(5);
    let b = t.create_lease(50);
    let w = t.create_lease(50);
    t.acquired("db", &a, 1, 0);
    t.acquired("db", &b, 2, 0);
    t.acquire("db", &w, 1, 8 * S);
    let seen = |now| {
        let v = t.read_at(now).get_semaphore(NS, "db").expect("ok");
        (v.active_holds, v.active_holders_count, v.waiters_count)
    };
    assert_eq!(seen(0), (3, 2, 1));
    assert_eq!(seen(5 * S), (2, 1, 1));
    assert_eq!(seen(8 * S), (2, 1, 0));
    let list = t
        .read_at(5 * S)
        .list_semaphores(NS, &PageRequest::default())
        .expect("ok");
    assert_eq!(list.items[0].active_holds, 2);
    t.at(5 * S);
    assert_eq!(t.holders("db"), vec![hold(&b, 2)]);
    assert_eq!(t.waiters("db"), vec![hold(&w, 1)]);
    t.at(0);
    assert_eq!(t.holders("db"), vec![hold(&a, 1), hold(&b, 2)]);
    assert_eq!(
        t.read_at(5 * S)
            .list_leases(NS, LeaseKind::Semaphore, None, &PageRequest::default())
            .map(|p| p.items.len()),
        Ok(2)
    );
    assert_eq!(
        t.read_at(0)
            .list_holders(NS, "x", &PageRequest::default())
            .map_err(|e| e.kind),
        Err(ErrorKind::NotFound)
    );
}

#[test]
fn holders_are_listed_in_grant_order_and_paged() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 10);
    let ls: Vec<String> = (0..5).map(|_| t.create_lease(60)).collect();
    for l in ls.iter().rev() {
        t.acquired("db", l, 1, 0);
    }
    // ls[4] re-acquires: it moves to the end (new token)
    t.acquired("db", &ls[4], 1, 0);
    let order = [&ls[3], &ls[2], &ls[1], &ls[0], &ls[4]];
    let page = |token: &str| {
        t.read_at(0)
            .list_holders(
                NS,
                "db",
                &PageRequest {
                    token: token.into(),
                    limit: 2,
                },
            )
            .expect("ok")
    };
    let mut token = String::new();
    let mut seen = Vec::new();
    loop {
        let p = page(&token);
        seen.extend(p.items.iter().map(|h| h.lease_id.clone()));
        if p.next_token.is_empty() {
            break;
        }
        token = p.next_token;
    }
    assert_eq!(seen.iter().collect::<Vec<_>>(), order);
    let (_, waiters) = t
        .read_at(0)
        .list_waiters(NS, "db", &PageRequest::default())
        .expect("ok");
    assert!(waiters.items.is_empty());
}

#[test]
fn waiter_positions_survive_paging() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(60);
    t.acquired("db", &h, 1, 0);
    let ls: Vec<String> = (0..5).map(|_| t.create_lease(60)).collect();
    for l in &ls {
        t.acquire("db", l, 1, 30 * S);
    }
    let request = PageRequest {
        token: String::new(),
        limit: 2,
    };
    let (_, p1) = t.read_at(0).list_waiters(NS, "db", &request).expect("ok");
    let (_, p2) = t
        .read_at(0)
        .list_waiters(
            NS,
            "db",
            &PageRequest {
                token: p1.next_token.clone(),
                limit: 2,
            },
        )
        .expect("ok");
    assert_eq!(
        p2.items
            .iter()
            .map(|w| (w.lease_id.clone(), w.position))
            .collect::<Vec<_>>(),
        vec![(ls[2].clone(), 2), (ls[3].clone(), 3)]
    );
    let (_, back) = t
        .read_at(0)
        .list_waiters(
            NS,
            "db",
            &PageRequest {
                token: p2.previous_token,
                limit: 2,
            },
        )
        .expect("ok");
    assert_eq!(back.items, p1.items);
}

// ---- batches, hashing, snapshots ----

fn busy_timeline() -> Timeline {
    let mut t = Timeline::with_ns();
    t.create_ns("other");
    t.create_sem("db", 3);
    t.create_sem("cache", 1);
    let a = t.create_lease_for("p1", 30).lease_id;
    let b = t.create_lease_for("p2", 10).lease_id;
    let c = t.create_lease_for("p1", 60).lease_id;
    t.acquired("db", &a, 2, 0);
    t.acquired("db", &c, 1, 0);
    t.acquire("db", &b, 2, 20 * S);
    t.acquired("cache", &c, 1, 0);
    t.acquire("cache", &a, 1, 40 * S);
    t.at(S);
    t.acquire("db", &c, 3, 5 * S); // an upgrade, queued behind B
    t
}

#[test]
fn a_batch_is_the_same_as_its_commands_one_by_one() {
    let mut one = Timeline::with_ns();
    let mut all = State::new();
    let mut events = Vec::new();
    all.apply_batch(
        &Batch {
            now_ns: 0,
            cmds: vec![Cmd::CreateNamespace {
                name: NS.into(),
                description: String::new(),
                metadata: none(),
            }],
            wall_ns: 0,
        },
        &mut events,
    );
    let l1 = lease_id(1, 7);
    let l2 = lease_id(2, 7);
    let cmds = vec![
        Cmd::CreateSemaphore {
            ns: NS.into(),
            name: "db".into(),
            description: String::new(),
            permits: 1,
            metadata: none(),
            max_hold_ns: 0,
        },
        Cmd::CreateLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            process_id: String::new(),
            ttl_s: 5,
            metadata: none(),
            secret: 7,
        },
        Cmd::CreateLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            process_id: String::new(),
            ttl_s: 50,
            metadata: none(),
            secret: 7,
        },
        Tim::acquire_cmd("db", &l1, 1, 0),
        Tim::acquire_cmd("db", &l2, 1, 50 * S),
        Tim::acquire_cmd("db", "garbage id", 1, 0),
    ];
    let batch_replies = all.apply_batch(
        &Batch {
            now_ns: S,
            cmds: cmds.clone(),
            wall_ns: S,
        },
        &mut events,
    );
    one.at(S);
    let one_replies: Vec<Reply> = cmds.into_iter().map(|c| one.run(c)).collect();
    assert_eq!(batch_replies, one_replies);
    assert_eq!(events, one.take_events());
    assert_eq!(all.hash(), one.state.hash());
}

#[test]
fn equal_histories_hash_equal_and_different_ones_do_not() {
    let a = busy_timeline();
    let b = busy_timeline();
    assert_eq!(a.state.hash(), b.state.hash());
    let mut c = busy_timeline();
    c.at(S + 1);
    c.ok(Cmd::Expire);
    assert_ne!(
        a.state.hash(),
        c.state.hash(),
        "the clock is part of the state"
    );
    assert_ne!(State::new().hash(), a.state.hash());
}

#[test]
fn snapshot_round_trip_keeps_hash_and_behaviour() {
    let mut t = busy_timeline();
    let bytes = t.state.encode_snapshot().expect("encodes");
    let restored = State::decode_snapshot(&bytes).expect("decodes");
    assert_eq!(restored.hash(), t.state.hash());
    assert_eq!(restored.index(), t.state.index());
    assert_eq!(restored.stats(), t.state.stats());
    let mut r = Timeline {
        state: restored,
        now_ns: t.now_ns,
        wall_offset_ns: t.wall_offset_ns,
        ..Timeline::new()
    };
    // drive both through the same future: expiry, releases, new acquires
    for now in [5 * S, 10 * S, 25 * S, 31 * S, 70 * S] {
        t.at(now);
        r.at(now);
        let l = t.create_lease(20);
        assert_eq!(r.create_lease(20), l);
        for cmd in [
            Cmd::Expire,
            Tim::acquire_cmd("db", &l, 1, 10 * S),
            Tim::acquire_cmd("cache", &l, 1, 0),
        ] {
            assert_eq!(t.run(cmd.clone()), r.run(cmd));
        }
        assert_eq!(t.take_events(), r.take_events());
        assert_eq!(t.state.hash(), r.state.hash());
    }
}

#[test]
fn garbage_snapshots_are_errors_not_panics() {
    let t = busy_timeline();
    let bytes = t.state.encode_snapshot().expect("encodes");
    assert!(matches!(
        State::decode_snapshot(&[]),
        Err(SnapshotError::Decode(_))
    ));
    // a snapshot is header-less: bytes that open with a header are not state data
    assert!(matches!(
        State::decode_snapshot(b"conch-sm\x01\0\0\0"),
        Err(SnapshotError::Decode(_))
    ));
    let mut framed = b"conch-sm\x01\0\0\0".to_vec();
    framed.extend_from_slice(&bytes);
    assert!(
        State::decode_snapshot(&framed).is_err(),
        "a framed snapshot"
    );
    // Without its last two bytes (an empty table of request ids) it is the encoding of earlier
    // builds, which still decodes.
    for len in (0..bytes.len()).filter(|len| *len != bytes.len() - 2) {
        assert!(
            State::decode_snapshot(&bytes[..len]).is_err(),
            "truncated to {len}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(State::decode_snapshot(&longer).is_err(), "trailing bytes");
    // flip every byte in turn: an error or a consistent state, never a panic
    for i in 0..bytes.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= flip;
            if let Ok(s) = State::decode_snapshot(&b) {
                s.check_invariants().expect("a decoded state is consistent");
            }
        }
    }
}

#[test]
fn inconsistent_snapshots_are_refused() {
    let t = busy_timeline();
    let encode = |data: &Data| bincode_options().serialize(data).expect("encodes");
    // a semaphore over its permits
    let mut data = t.state.data.clone();
    if let Some(sem) = data
        .namespaces
        .get_mut(NS)
        .and_then(|ns| ns.semaphore_mut("db"))
    {
        sem.permits = 1;
    }
    assert!(matches!(
        State::decode_snapshot(&encode(&data)),
        Err(SnapshotError::Inconsistent(_))
    ));
    // a holder without a lease
    let mut data = t.state.data.clone();
    if let Some(ns) = data.namespaces.get_mut(NS) {
        ns.leases_raw_mut().clear();
    }
    assert!(matches!(
        State::decode_snapshot(&encode(&data)),
        Err(SnapshotError::Inconsistent(_))
    ));
    // a token from beyond the counter
    let mut data = t.state.data.clone();
    data.last_token = 1;
    assert!(matches!(
        State::decode_snapshot(&encode(&data)),
        Err(SnapshotError::Inconsistent(_))
    ));
    // the untouched data decodes
    assert!(State::decode_snapshot(&encode(&t.state.data)).is_ok());
}

#[test]
fn serde_round_trip_rebuilds_indexes() {
    let t = busy_timeline();
    let bytes = bincode::serialize(&t.state).expect("serializes");
    let back: State = bincode::deserialize(&bytes).expect("deserializes");
    assert_eq!(back.hash(), t.state.hash());
    assert_eq!(back.index(), t.state.index());
}

#[test]
fn stats_count_everything() {
    let t = busy_timeline();
    assert_eq!(
        t.state.stats(),
        Stats {
            namespaces: 2,
            semaphores: 2,
            leases: 3,
            holders: 3,
            waiters: 3
        }
    );
}

/// Memory for one million leases in one namespace. Run with
/// `cargo test --release -p conchd --lib one_million_leases -- --ignored --nocapture`.
#[test]
#[ignore = "memory measurement; takes a few seconds in release"]
fn one_million_leases_fit_in_memory() {
    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }
    let before = rss_bytes();
    let mut state = State::new();
    let mut events = Vec::new();
    let ns = Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: none(),
    };
    state.apply_batch(
        &Batch {
            now_ns: 0,
            cmds: vec![ns],
            wall_ns: 0,
        },
        &mut events,
    );
    let started = std::time::Instant::now();
    for chunk in 0..1000 {
        let cmds = (0..1000)
            .map(|i| Cmd::CreateLease {
                ns: NS.into(),
                kind: LeaseKind::Semaphore,
                process_id: format!("host-{}/pid-{}", chunk % 100, i),
                ttl_s: 60,
                metadata: none(),
                secret: 7,
            })
            .collect();
        let replies = state.apply_batch(
            &Batch {
                now_ns: chunk * NANOS_PER_MS,
                cmds,
                wall_ns: chunk * NANOS_PER_MS,
            },
            &mut events,
        );
        assert!(replies.iter().all(Result::is_ok));
    }
    let elapsed = started.elapsed();
    let after = rss_bytes();
    assert_eq!(state.stats().leases, 1_000_000);
    let snapshot = state.encode_snapshot().expect("encodes");
    let started = std::time::Instant::now();
    let restored = State::decode_snapshot(&snapshot).expect("decodes");
    let decode = started.elapsed();
    assert_eq!(restored.hash(), state.hash());
    println!(
        "1M leases: RSS +{} MiB ({} bytes/lease), created in {elapsed:?}; snapshot {} MiB, decoded+checked in {decode:?}",
        (after.saturating_sub(before)) >> 20,
        after.saturating_sub(before) / 1_000_000,
        snapshot.len() >> 20,
    );
}

#[test]
fn an_abandoned_wait_lingers_so_a_quick_reattach_keeps_its_place() {
    // t=0    "db" with 1 permit; H holds it; A then B queue with 60 s waits
    // t=1s   A's connection breaks: GiveUp with a 5 s linger -> A stays queued until t=6s
    // t=2s   A re-attaches (new call)  -> still ahead of B
    // t=3s   H releases                -> A granted, not B
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(30);
    let a = t.create_lease(120);
    let b = t.create_lease(120);
    assert!(matches!(
        t.acquire("db", &h, 1, 0).status,
        AcquireStatus::Acquired { .. }
    ));
    let AcquireStatus::Queued { deadline_ns } = t.acquire("db", &a, 1, 60 * S).status else {
        panic!("A must queue")
    };
    assert!(matches!(
        t.acquire("db", &b, 1, 60 * S).status,
        AcquireStatus::Queued { .. }
    ));
    t.at(S);
    let cmd = Cmd::GiveUp {
        ns: NS.into(),
        sem: "db".into(),
        lease: a.clone(),
        deadline_ns,
        linger_ns: 5 * S,
    };
    assert_eq!(
        t.ok(cmd),
        Outcome::GiveUp(GiveUpReply::StillQueued { deadline_ns: 6 * S })
    );
    assert_eq!(t.state.waiter(NS, "db", &a).map(|w| w.position), Some(0));
    t.at(2 * S);
    assert!(matches!(
        t.acquire("db", &a, 1, 60 * S).status,
        AcquireStatus::Queued { .. }
    ));
    t.at(3 * S);
    t.release("db", &h);
    assert!(
        t.state.holder(NS, "db", &a).is_some(),
        "A kept its place at the head"
    );
    assert!(t.state.holder(NS, "db", &b).is_none());
}

#[test]
fn an_abandoned_wait_that_nobody_reattaches_leaves_after_the_linger() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let h = t.create_lease(30);
    let a = t.create_lease(120);
    assert!(matches!(
        t.acquire("db", &h, 1, 0).status,
        AcquireStatus::Acquired { .. }
    ));
    let AcquireStatus::Queued { deadline_ns } = t.acquire("db", &a, 1, 60 * S).status else {
        panic!("A must queue")
    };
    let cmd = Cmd::GiveUp {
        ns: NS.into(),
        sem: "db".into(),
        lease: a.clone(),
        deadline_ns,
        linger_ns: 5 * S,
    };
    t.ok(cmd);
    t.at(5 * S);
    t.ok(Cmd::Expire);
    assert!(t.state.waiter(NS, "db", &a).is_none());
    assert_eq!(t.state.next_due_ns().map(|d| d > 5 * S), Some(true));
}

/// A small fixed history touching every field of the canonical data: descriptions, metadata,
/// holders, an upgrade queued behind a waiter, a lingered deadline, a deleted semaphore (whose
/// dropped holder the audit trail records).
fn pinned_timeline() -> Timeline {
    let mut t = Timeline::new();
    t.wall_offset(1_000 * S);
    t.ok(Cmd::CreateNamespace {
        name: NS.into(),
        description: "the namespace".into(),
        metadata: meta("team", "infra"),
    });
    t.create_ns("other");
    t.ok(Cmd::CreateSemaphore {
        ns: NS.into(),
        name: "db".into(),
        description: "database slots".into(),
        permits: 3,
        metadata: meta("tier", "1"),
        max_hold_ns: 3_600 * S,
    });
    t.create_sem("gone", 1);
    let a = t.create_lease_for("host-a/1", 30).lease_id;
    let b = t.create_lease_for("host-b/2", 10).lease_id;
    t.at(S / 2);
    t.ok(Cmd::Acquire {
        ns: NS.into(),
        sem: "db".into(),
        lease: a.clone(),
        weight: 2,
        wait_ns: 0,
        metadata: meta("job", "42"),
        max_hold_ns: 600 * S,
    });
    t.acquire("db", &b, 2, 20 * S);
    t.acquire("gone", &b, 1, 0);
    t.at(S);
    t.acquire("db", &a, 3, 5 * S); // an upgrade, queued behind B
    t.ok(Cmd::GiveUp {
        ns: NS.into(),
        sem: "db".into(),
        lease: b.clone(),
        deadline_ns: 21 * S,
        linger_ns: 4 * S,
    });
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "gone".into(),
    });
    // A lock held exclusive and a shared acquire queued under it.
    let locker = |t: &mut Timeline, secret| match t.ok(Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Lock,
        process_id: "host-c/3".into(),
        ttl_s: 40,
        metadata: none(),
        secret,
    }) {
        Outcome::Lease(v) => v.lease_id,
        other => panic!("unexpected {other:?}"),
    };
    let (x, y) = (locker(&mut t, 0x77), locker(&mut t, 0x78));
    for (path, lease, exclusive, wait_ns) in [("a/b", &x, true, 0), ("a", &y, false, 9 * S)] {
        t.ok(Cmd::AcquireLock {
            ns: NS.into(),
            path: path.into(),
            lease: lease.clone(),
            exclusive,
            wait_ns,
            metadata: meta("k", "v"),
        });
    }
    t
}

/// The canonical encoding and the hash are what nodes compare and data directories hold:
/// pinned, so a change to their layout is a deliberate one.
#[test]
fn the_hash_and_the_encoded_bytes_are_pinned() {
    const DATA: &str = concat!(
        "fc0094357703040202016e01016e0d746865206e616d65737061636501047465616d05696e667261",
        "fd00204aa9d1010000fd00204aa9d101000001010264620e646174616261736520736c6f74730104",
        "7469657201310301fd00204aa9d1010000fd00204aa9d1010000fd00b47f20d2010000fd00407161",
        "8c060000010102fd00eae4e4d101000001036a6f6202343201fd00aa2da117010000fd00ca774ae9",
        "02000002010203fd00b47f20d2010000fd007841cb02000000000000020102fd00eae4e4d1010000",
        "fd00e40b540200000000000002040108686f73742d612f3100fd00204aa9d1010000fd005847f80d",
        "0000001e0007000208686f73742d622f3200fd00204aa9d1010000fd00c817a8040000000a000700",
        "0308686f73742d632f3300fd00b47f20d2010000fd00b4941713000000280077010408686f73742d",
        "632f3300fd00b47f20d2010000fd00b494171300000028007801fb1027fb1027fca0860100fc0000",
        "0004fb10270103612f62fd00b47f20d2010000010301fd00b47f20d201000001016b017603010104",
        "016100fd00b47f20d2010000fd00c817a80400000001016b0176010000056f7468657202056f7468",
        "65720000fd00204aa9d1010000fd00204aa9d1010000010000fb1027fb1027fca0860100fc000000",
        "04fb102700000000000000fd00b47f20d20100000000000000fc00000020010101fd00b47f20d201",
        "0000fc0094357709616e6f6e796d6f7573000002016e0004676f6e65236c735f3030303030303030",
        "30303030303030323030303030303030303030303030303708686f73742d622f32000000",
    );
    let t = pinned_timeline();
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
    let data = bincode_options().serialize(&t.state.data).expect("encodes");
    assert_eq!(hex(&data), DATA);
    assert_eq!(t.state.hash(), 0xdf11_5b1f_46ec_d8d9);
    assert_eq!(
        fnv1a64(&data),
        t.state.hash(),
        "the hash is FNV-1a of the encoding"
    );
    let snapshot = t.state.encode_snapshot().expect("encodes");
    assert_eq!(
        hex(&snapshot),
        DATA,
        "a snapshot is the encoding, header-less"
    );
    let restored = State::decode_snapshot(&snapshot).expect("decodes");
    assert_eq!(restored.hash(), t.state.hash());
}

// ---- the two clocks: lease clock for expiry, wall clock for display ----

const HOUR: Nanos = 3_600 * S;
const WALL: Nanos = 1_700_000_000 * S;

#[test]
fn display_times_follow_the_wall_stamp_and_expiry_the_lease_clock() {
    // lease clock 0, wall clock WALL: everything created shows wall times
    let mut t = Timeline::new();
    t.wall_offset(WALL);
    let ns = t.create_ns(NS);
    assert_eq!((ns.created_at, ns.updated_at), (WALL, WALL));
    let sem = t.create_sem("db", 1);
    assert_eq!((sem.created_at, sem.last_activity_at), (WALL, WALL));
    let l = t.create_lease_for("", 10);
    assert_eq!((l.created_at, l.expires_at), (WALL, WALL + 10 * S));
    t.acquired("db", &l.lease_id, 1, 0);
    // lease clock 4s, wall clock one hour ahead: a waiter queues at the wall time
    t.at(4 * S).wall_offset(WALL + HOUR);
    let w = t.create_lease(100);
    t.acquire("db", &w, 1, 60 * S);
    let (_, waiters) = t
        .read_at(4 * S)
        .list_waiters(NS, "db", &PageRequest::default())
        .expect("ok");
    assert_eq!(waiters.items[0].queued_at, WALL + HOUR + 4 * S);
    assert_eq!(
        waiters.items[0].deadline_ns,
        64 * S,
        "deadlines are lease-clock times"
    );
    // The displayed expiry is the newest wall stamp plus the lease clock time left: 6 s.
    assert_eq!(
        t.read_at(4 * S)
            .get_lease(NS, LeaseKind::Semaphore, &l.lease_id)
            .map(|v| v.expires_at),
        Ok(WALL + HOUR + 10 * S)
    );
    let holders = t
        .read_at(4 * S)
        .list_holders(NS, "db", &PageRequest::default())
        .expect("ok");
    assert_eq!(holders.items[0].locked_at, WALL);
    assert_eq!(t.sem("db").last_activity_at, WALL + HOUR + 4 * S);
}

#[test]
fn wall_clock_steps_neither_expire_leases_nor_freeze_expiry() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    let holder = t.create_lease(10);
    let waiter = t.create_lease(300);
    t.acquired("db", &holder, 1, 0);
    t.acquire("db", &waiter, 1, 200 * S);
    t.take_events();
    // The wall clock jumps an hour ahead, then two hours back, while the holder refreshes
    // every 3 s of lease-clock time: the lease never expires and the waiter is never granted.
    let refresh = |lease: &str| Cmd::RefreshLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: lease.into(),
        ttl_s: 0,
    };
    for (step, offset) in [(3, HOUR), (6, -HOUR), (9, 3 * HOUR), (12, -5 * HOUR)] {
        t.at(step * S).wall_offset(offset);
        t.ok(refresh(&holder));
        t.ok(Cmd::Expire);
        assert_eq!(t.holders("db"), vec![hold(&holder, 1)]);
        assert_eq!(t.waiters("db"), vec![hold(&waiter, 1)]);
        assert!(
            t.read_at(step * S)
                .get_lease(NS, LeaseKind::Semaphore, &holder)
                .is_ok()
        );
    }
    assert!(t.take_events().is_empty(), "nothing was granted or ended");
    // The holder stops refreshing (crashed): with the wall clock far behind, the lease still
    // ends 10 s of lease-clock time after its last refresh, and the waiter gets the slot.
    t.at(21 * S).wall_offset(-30 * HOUR);
    t.ok(Cmd::Expire);
    assert_eq!(
        t.holders("db"),
        vec![hold(&holder, 1)],
        "not due before 22 s"
    );
    t.at(22 * S);
    t.ok(Cmd::Expire);
    assert_eq!(t.holders("db"), vec![hold(&waiter, 1)]);
    assert_eq!(
        t.read_at(22 * S)
            .get_lease(NS, LeaseKind::Semaphore, &holder)
            .map_err(|e| e.kind),
        Err(ErrorKind::NotFound)
    );
}

#[test]
fn reads_decide_by_the_state_clock_alone() {
    // Two states with the same lease-clock history but wall stamps hours apart answer every
    // read about what is alive the same; only display times differ.
    let run = |offset: Nanos| {
        let mut t = Timeline::with_ns();
        t.wall_offset(offset);
        t.create_sem("db", 2);
        let a = t.create_lease(5);
        let b = t.create_lease(50);
        t.acquired("db", &a, 1, 0);
        t.acquired("db", &b, 1, 0);
        // an empty batch at 6 s: a is past due but not reaped yet
        let state = t.read_at(6 * S);
        let sem = state.get_semaphore(NS, "db").expect("ok");
        let leases = state
            .list_leases(NS, LeaseKind::Semaphore, None, &PageRequest::default())
            .expect("ok");
        (
            (sem.active_holds, sem.active_holders_count),
            leases
                .items
                .iter()
                .map(|l| l.lease_id.clone())
                .collect::<Vec<_>>(),
            state.get_lease(NS, LeaseKind::Semaphore, &a).is_err(),
        )
    };
    let ahead = run(WALL + HOUR);
    let behind = run(WALL - HOUR);
    assert_eq!(ahead, behind);
    assert_eq!(ahead.0, (1, 1));
    assert!(
        ahead.2,
        "a's lease is hidden once the state's clock passed it"
    );
}

// ---- quotas and the state's byte budget ----

fn set_quotas(t: &mut Timeline, quotas: super::quota::Quotas) -> QuotaView {
    match t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas,
    }) {
        Outcome::Quotas(view) => view,
        other => panic!("unexpected {other:?}"),
    }
}

fn sem_with(name: &str, description: &str, metadata: Metadata) -> Cmd {
    Cmd::CreateSemaphore {
        ns: NS.into(),
        name: name.into(),
        description: description.into(),
        permits: 1,
        metadata,
        max_hold_ns: 0,
    }
}

#[test]
fn stored_bytes_follow_the_size_model() {
    use super::quota::{ENTRY_BYTES, OBJECT_BYTES};
    let mut t = Timeline::with_ns();
    let empty_ns = OBJECT_BYTES + NS.len() as u64;
    assert_eq!(t.state.quotas(NS).expect("quotas").bytes, empty_ns);
    t.ok(sem_with("db", "four", meta("k", "vv")));
    let sem = OBJECT_BYTES + 2 + 4 + 3;
    let l = t.create_lease_for("p", 60).lease_id;
    let lease = OBJECT_BYTES + 1;
    t.ok(Cmd::Acquire {
        ns: NS.into(),
        sem: "db".into(),
        lease: l.clone(),
        weight: 1,
        wait_ns: 0,
        metadata: meta("host", "a"),
        max_hold_ns: 0,
    });
    let holder = ENTRY_BYTES + 5;
    let view = t.state.quotas(NS).expect("quotas");
    assert_eq!(
        (view.semaphores, view.leases, view.entries, view.bytes),
        (1, 1, 1, empty_ns + sem + lease + holder)
    );
    assert_eq!(
        view.state_bytes, view.bytes,
        "one namespace: the whole state"
    );
    // Everything given back: only the namespace itself is left.
    t.release("db", &l);
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "db".into(),
    });
    t.ok(Cmd::RevokeLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: l,
    });
    let view = t.state.quotas(NS).expect("quotas");
    assert_eq!(
        (view.entries, view.bytes, view.state_bytes),
        (0, empty_ns, empty_ns)
    );
}

#[test]
fn each_quota_refuses_growth_past_it_naming_it_and_changes_nothing() {
    let mut t = Timeline::with_ns();
    set_quotas(
        &mut t,
        super::quota::Quotas {
            semaphores: 2,
            leases: 2,
            entries: 2,
            bytes: 1 << 20,
            request_ids: 2,
        },
    );
    t.create_sem("a", 5);
    t.create_sem("b", 5);
    let e = t.err(sem_with("c", "", none()));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert!(
        e.message
            .starts_with("semaphore quota of namespace n reached"),
        "{e:?}"
    );
    let l1 = t.create_lease(60);
    let l2 = t.create_lease(60);
    let e = t.err(Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        process_id: String::new(),
        ttl_s: 60,
        metadata: none(),
        secret: 7,
    });
    assert!(
        e.message.starts_with("lease quota of namespace n reached"),
        "{e:?}"
    );
    t.acquired("a", &l1, 1, 0);
    t.acquired("b", &l1, 1, 0);
    let e = t.err(Tim::acquire_cmd("a", &l2, 1, 0));
    assert!(
        e.message
            .starts_with("holder and waiter quota of namespace n reached"),
        "{e:?}"
    );
    // A re-acquire replaces its hold: no new entry, so it is not refused.
    t.acquired("a", &l1, 1, 0);
    // Giving back makes room again.
    t.release("b", &l1);
    t.acquired("a", &l2, 1, 0);
}

#[test]
fn the_byte_quota_counts_descriptions_metadata_and_updates() {
    use super::quota::OBJECT_BYTES;
    let mut t = Timeline::with_ns();
    let ns_bytes = t.state.quotas(NS).expect("quotas").bytes;
    // Room for the namespace and one semaphore with a 100-byte description.
    let one = OBJECT_BYTES + 1 + 100;
    set_quotas(
        &mut t,
        super::quota::Quotas {
            bytes: ns_bytes + one,
            ..Default::default()
        },
    );
    t.ok(sem_with("a", &"d".repeat(100), none()));
    let e = t.err(sem_with("b", "", none()));
    assert!(
        e.message.starts_with("byte quota of namespace n reached"),
        "{e:?}"
    );
    // Growing the description is refused; shrinking it is not.
    let update = |description: &str| Cmd::UpdateSemaphore {
        ns: NS.into(),
        name: "a".into(),
        description: description.into(),
        permits: 1,
        metadata: none(),
        expected_version: 1,
        max_hold_ns: None,
    };
    let e = t.err(update(&"d".repeat(101)));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    t.ok(update("short"));
    assert_eq!(
        t.state.quotas(NS).expect("quotas").bytes,
        ns_bytes + OBJECT_BYTES + 1 + 5
    );
}

#[test]
fn a_quota_lowered_below_use_refuses_growth_and_takes_nothing_away() {
    let mut t = Timeline::with_ns();
    t.create_sem("a", 5);
    t.create_sem("b", 5);
    let view = set_quotas(
        &mut t,
        super::quota::Quotas {
            semaphores: 1,
            ..Default::default()
        },
    );
    assert_eq!((view.semaphores, view.quotas.semaphores), (2, 1));
    let e = t.err(sem_with("c", "", none()));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert_eq!(
        t.state
            .list_semaphores(NS, &PageRequest::default())
            .expect("list")
            .items
            .len(),
        2
    );
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "a".into(),
    });
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "b".into(),
    });
    t.create_sem("c", 5);
}

#[test]
fn the_state_budget_bounds_every_namespace_together() {
    let mut t = Timeline::with_ns();
    let used = t.state.budget().1;
    // Room for one more empty namespace of a one-letter name, not two.
    let one_ns = super::quota::OBJECT_BYTES + 1;
    t.ok(Cmd::SetBudget {
        bytes: used + one_ns,
    });
    t.create_ns("x");
    let e = t.err(Cmd::CreateNamespace {
        name: "y".into(),
        description: String::new(),
        metadata: none(),
    });
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert!(
        e.message.starts_with("the state's byte budget reached"),
        "{e:?}"
    );
    // The budget covers growth inside a namespace too.
    let e = t.err(sem_with("db", "", none()));
    assert!(
        e.message.starts_with("the state's byte budget reached"),
        "{e:?}"
    );
    // Deleting a namespace gives its bytes back.
    t.ok(Cmd::DeleteNamespace { name: "x".into() });
    t.create_ns("y");
    assert_eq!(t.state.budget(), (used + one_ns, used + one_ns));
}

#[test]
fn quotas_and_budget_beyond_what_the_state_can_hold_are_invalid() {
    let mut t = Timeline::with_ns();
    let e = t.err(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: super::quota::Quotas {
            semaphores: SEMAPHORES_PER_NAMESPACE_MAX as u64 + 1,
            ..Default::default()
        },
    });
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.starts_with("quota semaphores must be at most"),
        "{e:?}"
    );
    let e = t.err(Cmd::SetBudget {
        bytes: super::quota::BYTES_MAX + 1,
    });
    assert!(
        e.message.starts_with("budget_bytes must be at most"),
        "{e:?}"
    );
    let e = t.err(Cmd::SetQuotas {
        ns: "absent".into(),
        quotas: super::quota::Quotas::default(),
    });
    assert_eq!(e.kind, ErrorKind::NotFound);
}

// ---- losses ----

/// Every way a holder loses its lease or a hold emits one `Lost` naming the lease, what was
/// lost and why; a release by the holder emits none, and a waiter's ended wait is no loss.
#[test]
fn a_loss_is_emitted_for_every_way_a_holder_loses_and_never_for_a_release() {
    let mut t = Timeline::with_ns();
    t.create_sem("db", 1);
    t.create_sem("other", 1);
    let a = t.create_lease(100);
    t.acquired("db", &a, 1, 0);
    t.release("db", &a);
    assert!(t.take_events().is_empty(), "a release is not a loss");

    t.acquired("db", &a, 1, 0);
    t.ok(Cmd::RevokeLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: a.clone(),
    });
    assert_eq!(t.take_events(), vec![lost(&a, "", LossCause::Revoked)]);

    let b = t.create_lease(10);
    t.acquired("db", &b, 1, 0);
    t.at(20 * S);
    t.ok(Cmd::Expire);
    assert_eq!(t.take_events(), vec![lost(&b, "", LossCause::Expired)]);

    // The semaphore deleted: its holder loses the hold (its lease lives on), its waiter's wait
    // ends.
    let c = t.create_lease(100);
    let w = t.create_lease(100);
    t.acquired("other", &c, 1, 0);
    t.acquire("other", &w, 1, 50 * S);
    t.take_events();
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "other".into(),
    });
    assert_eq!(
        t.take_events(),
        vec![
            lost(&c, "other", LossCause::SemaphoreDeleted),
            wait_ended("other", &w, WaitEnd::SemaphoreGone)
        ]
    );

    // A hold limit ends the hold, not the lease.
    t.ok(Cmd::Acquire {
        ns: NS.into(),
        sem: "db".into(),
        lease: c.clone(),
        weight: 1,
        wait_ns: 0,
        metadata: none(),
        max_hold_ns: 5 * S,
    });
    t.at(30 * S);
    t.ok(Cmd::Expire);
    assert_eq!(t.take_events(), vec![lost(&c, "db", LossCause::HoldLimit)]);

    // A lock deleted under its holder.
    let l = match t.ok(Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Lock,
        process_id: String::new(),
        ttl_s: 100,
        metadata: none(),
        secret: 9,
    }) {
        Outcome::Lease(v) => v.lease_id,
        other => panic!("unexpected {other:?}"),
    };
    t.ok(Cmd::AcquireLock {
        ns: NS.into(),
        path: "a/b".into(),
        lease: l.clone(),
        exclusive: true,
        wait_ns: 0,
        metadata: none(),
    });
    t.take_events();
    t.ok(Cmd::DeleteLock {
        ns: NS.into(),
        path: "a/b".into(),
    });
    assert_eq!(
        t.take_events(),
        vec![lost(&l, &lock_object("a/b"), LossCause::LockDeleted)]
    );

    // The namespace deleted: every lease in it is lost.
    t.ok(Cmd::DeleteNamespace { name: NS.into() });
    let losses: Vec<Event> = t
        .take_events()
        .into_iter()
        .filter(|e| matches!(e, Event::Lost { .. }))
        .collect();
    assert_eq!(
        losses,
        vec![
            lost(&c, "", LossCause::NamespaceDeleted),
            lost(&w, "", LossCause::NamespaceDeleted),
            lost(&l, "", LossCause::NamespaceDeleted),
        ]
    );
}

/// Semaphores with no, a few and many holders and waiters (more than the eight a small map
/// keeps in a vector), and a lease holding ten semaphores: the snapshot of this state as the
/// encoding wrote it before holders, waiters and a lease's holds were kept in small maps
/// (`snapshot_sample.hex`, written by the previous representation) is what this one writes, and
/// it decodes to a state that encodes and hashes the same.
#[test]
fn snapshot_encoding_matches_the_sample_written_before_small_maps() {
    let mut t = Tim::with_ns();
    t.create_sem("empty", 1);
    t.create_sem("few", 3);
    t.create_sem("many", 12);
    let leases: Vec<String> = (0..40).map(|_| t.create_lease(300)).collect();
    t.acquired("few", &leases[0], 1, 0);
    t.acquired("few", &leases[1], 2, 0);
    for (lease, weight) in [(&leases[2], 3), (&leases[3], 1)] {
        let reply = t.acquire("few", lease, weight, 100 * S);
        assert!(matches!(reply.status, AcquireStatus::Queued { .. }));
    }
    for lease in &leases[4..16] {
        t.acquired("many", lease, 1, 0);
    }
    for lease in &leases[16..28] {
        let reply = t.acquire("many", lease, 1, 100 * S);
        assert!(matches!(reply.status, AcquireStatus::Queued { .. }));
    }
    // Grants from the queue: the releases move the head waiters to the holders.
    t.release("many", &leases[4]);
    t.release("many", &leases[5]);
    for i in 0..10 {
        let name = format!("h{i}");
        t.create_sem(&name, 1);
        t.acquired(&name, &leases[30], 1, 0);
    }
    t.release("h3", &leases[30]);
    t.state.check_invariants().expect("invariants hold");

    let bytes = t.state.encode_snapshot().expect("encodes");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let sample = include_str!("snapshot_sample.hex").trim();
    assert_eq!(hex, sample, "the snapshot's bytes changed");

    let restored = State::decode_snapshot(&bytes).expect("decodes");
    restored.check_invariants().expect("invariants hold");
    assert_eq!(restored.encode_snapshot().expect("encodes"), bytes);
    assert_eq!(restored.hash(), t.state.hash());
}

/// A lease (boxed, one per lease, a million at ten times W5) fits the allocator's 128-byte
/// class with its two sets of holds and waits as pointers; with two vectors it took the
/// 160-byte class.
#[test]
fn a_lease_fits_in_120_bytes() {
    assert!(std::mem::size_of::<super::data::Lease>() <= 120);
}

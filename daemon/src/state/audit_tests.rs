//! Timelines of the audit trail: what each action records, who is named, the bound, the
//! administrator's revoke, snapshots and determinism. Every step checks the invariants, and
//! every refusal leaves the state hash unchanged (see `timeline.rs`).

use super::State;
use super::audit::*;
use super::auth::Permission;
use super::quota::Quotas;
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";

impl Timeline {
    fn audit_setup() -> Timeline {
        let mut t = Timeline::stepping(S);
        t.wall_offset(1_000 * S);
        t.ok(Cmd::CreateNamespace {
            name: NS.into(),
            description: String::new(),
            metadata: Metadata::new(),
        });
        t.ok(Cmd::CreateSemaphore {
            ns: NS.into(),
            name: "s".into(),
            description: String::new(),
            permits: 1,
            metadata: Metadata::new(),
            max_hold_ns: 0,
        });
        t
    }

    fn new_lease(&mut self, kind: LeaseKind, process_id: &str) -> String {
        match self.ok(Cmd::CreateLease {
            ns: NS.into(),
            kind,
            process_id: process_id.into(),
            ttl_s: 60,
            metadata: Metadata::new(),
            secret: 9,
        }) {
            Outcome::Lease(v) => v.lease_id,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn take(&mut self, lease: &str, wait_ns: Nanos) -> AcquireStatus {
        match self.ok(Cmd::Acquire {
            ns: NS.into(),
            sem: "s".into(),
            lease: lease.into(),
            weight: 1,
            wait_ns,
            metadata: Metadata::new(),
            max_hold_ns: 0,
        }) {
            Outcome::Acquire(r) => r.status,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn lock_it(&mut self, path: &str, lease: &str) {
        self.ok(Cmd::AcquireLock {
            ns: NS.into(),
            path: path.into(),
            lease: lease.into(),
            exclusive: true,
            wait_ns: 0,
            metadata: Metadata::new(),
        });
    }

    /// Every record, newest first.
    fn trail(&self) -> Vec<AuditRecord> {
        let page = PageRequest {
            token: String::new(),
            limit: 250,
        };
        self.state
            .list_audit(&AuditFilter::default(), &page, |_| true)
            .expect("reads")
            .items
    }
}

fn revoke(kind: LeaseKind, object: &str, lease: &str, reason: &str) -> Cmd {
    Cmd::RevokeHolder {
        ns: NS.into(),
        kind,
        object: object.into(),
        lease: lease.into(),
        reason: reason.into(),
    }
}

fn holder_of(t: &Timeline, lease: &str) -> bool {
    t.state.holder(NS, "s", lease).is_some()
}

#[test]
fn an_admin_revoke_ends_the_lease_grants_the_next_waiter_and_records_why() {
    // t=2..7  A holds s (1 permit), B queues behind it
    let mut t = Timeline::audit_setup();
    let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    let b = t.new_lease(LeaseKind::Semaphore, "host-b/2");
    assert!(matches!(t.take(&a, 0), AcquireStatus::Acquired { .. }));
    assert!(matches!(t.take(&b, 60 * S), AcquireStatus::Queued { .. }));
    t.take_events();
    // t=8  revoke A's hold, saying why
    let record = match t.ok(revoke(LeaseKind::Semaphore, "s", &a, "job stuck since 9am")) {
        Outcome::Audit(r) => r,
        other => panic!("unexpected {other:?}"),
    };
    // A's lease is gone; B is granted in the same entry.
    assert_eq!(
        t.state
            .get_lease(NS, LeaseKind::Semaphore, &a)
            .map_err(|e| e.kind),
        Err(ErrorKind::NotFound)
    );
    assert!(!holder_of(&t, &a));
    assert!(holder_of(&t, &b));
    let granted: Vec<_> = t
        .take_events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Granted { lease, .. } => Some(lease),
            _ => None,
        })
        .collect();
    assert_eq!(granted, vec![b.clone()]);
    // The record: who (anonymous, access control off), what, whom, why, when.
    assert_eq!(record.seq, 1);
    assert_eq!(record.action, AuditAction::RevokeHolder);
    assert_eq!(record.actor.name, ANONYMOUS);
    assert_eq!(record.actor.token, None);
    assert_eq!(
        (
            record.namespace.as_str(),
            record.object_kind,
            record.object.as_str()
        ),
        (NS, AuditObject::Semaphore, "s")
    );
    assert_eq!(
        (record.lease.as_str(), record.holder.as_str()),
        (a.as_str(), "host-a/1")
    );
    assert_eq!(record.reason, "job stuck since 9am");
    assert_eq!(record.clock_ns, 8 * S);
    assert_eq!(record.at, 1_008 * S);
    assert_eq!(t.trail(), vec![record]);
}

#[test]
fn a_revoke_must_name_what_the_lease_holds_and_a_reason_within_the_bound() {
    let mut t = Timeline::audit_setup();
    let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    let idle = t.new_lease(LeaseKind::Semaphore, "host-b/2");
    t.take(&a, 0);
    // A lease that neither holds nor waits for s; a semaphore it does not hold; no such lease.
    for (object, lease) in [("s", idle.as_str()), ("other", a.as_str())] {
        let err = t.err(revoke(LeaseKind::Semaphore, object, lease, "why"));
        assert_eq!(err.kind, ErrorKind::NotFound, "{}", err.message);
        assert!(
            err.message.contains("neither holds nor waits"),
            "{}",
            err.message
        );
    }
    let err = t.err(revoke(LeaseKind::Lock, "s", &a, "why"));
    assert_eq!(err.kind, ErrorKind::NotFound);
    // No reason, or one over 256 bytes.
    let err = t.err(revoke(LeaseKind::Semaphore, "s", &a, "  "));
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("reason"), "{}", err.message);
    let long = "x".repeat(AUDIT_REASON_MAX_BYTES + 1);
    let err = t.err(revoke(LeaseKind::Semaphore, "s", &a, &long));
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("at most 256 bytes"), "{}", err.message);
    let exact = "x".repeat(AUDIT_REASON_MAX_BYTES);
    t.ok(revoke(LeaseKind::Semaphore, "s", &a, &exact));
    assert_eq!(t.trail()[0].reason.len(), AUDIT_REASON_MAX_BYTES);
}

#[test]
fn a_revoke_of_a_lock_holder_records_the_path() {
    let mut t = Timeline::audit_setup();
    let x = t.new_lease(LeaseKind::Lock, "host-c/3");
    t.lock_it("db/orders", &x);
    t.ok(revoke(LeaseKind::Lock, "db/orders", &x, "migration"));
    let lock = t.state.get_lock(NS, "db/orders").expect("reads");
    assert!(lock.holders.is_empty());
    let r = &t.trail()[0];
    assert_eq!(
        (r.object_kind, r.object.as_str(), r.lease.as_str()),
        (AuditObject::Lock, "db/orders", x.as_str())
    );
}

#[test]
fn a_revoke_is_admin_only_and_names_the_token() {
    // Access control on: "root" is cluster admin (token 1), "ops" has admin on n (token 2),
    // "job" may acquire (token 3).
    let mut t = Timeline::audit_setup();
    t.ok(Cmd::RoleCreate {
        name: "root".into(),
        cluster_admin: true,
    });
    for (role, perm) in [("ops", Permission::Admin), ("job", Permission::Acquire)] {
        t.ok(Cmd::RoleCreate {
            name: role.into(),
            cluster_admin: false,
        });
        t.ok(Cmd::RoleGrant {
            role: role.into(),
            ns: NS.into(),
            perm,
        });
    }
    for (byte, role) in [(1u8, "root"), (2, "ops"), (3, "job")] {
        t.ok(Cmd::TokenCreate {
            name: format!("{role}-token"),
            role: role.into(),
            hash: [byte; 32],
        });
    }
    t.caller = Some(1);
    t.ok(Cmd::AuthEnable);
    t.caller = Some(3);
    let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    t.take(&a, 0);
    // The job's own token may not revoke (even its own lease this way): PermissionDenied.
    let err = t.err(revoke(LeaseKind::Semaphore, "s", &a, "mine"));
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert!(t.trail().is_empty());
    // The namespace admin may; the record names it and the lease's creator.
    t.caller = Some(2);
    t.ok(revoke(LeaseKind::Semaphore, "s", &a, "stuck"));
    let r = &t.trail()[0];
    assert_eq!(
        r.actor,
        Actor {
            name: "ops-token".into(),
            role: "ops".into(),
            token: Some(2),
        }
    );
    assert_eq!(r.lease_owner, Some(3));
}

#[test]
fn forced_releases_capacity_and_quota_changes_are_recorded() {
    let mut t = Timeline::audit_setup();
    let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    t.take(&a, 0);
    // A change that keeps permits and hold limit records nothing; one that changes them does.
    let update = |permits, max_hold_ns, version| Cmd::UpdateSemaphore {
        ns: NS.into(),
        name: "s".into(),
        description: "d".into(),
        permits,
        metadata: Metadata::new(),
        expected_version: version,
        max_hold_ns,
    };
    t.ok(update(1, None, 1));
    assert!(t.trail().is_empty());
    t.ok(update(3, Some(30 * S), 2));
    let r = &t.trail()[0];
    assert_eq!(r.action, AuditAction::UpdateSemaphore);
    assert_eq!(r.detail, "permits 1 -> 3, hold limit none -> 30s");
    assert!(r.lease.is_empty());
    // Deleting a held semaphore records one record per holder dropped.
    let b = t.new_lease(LeaseKind::Semaphore, "host-b/2");
    t.take(&b, 0);
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "s".into(),
    });
    let dropped: Vec<_> = t
        .trail()
        .iter()
        .filter(|r| r.action == AuditAction::DeleteSemaphore)
        .map(|r| (r.lease.clone(), r.holder.clone()))
        .collect();
    assert_eq!(
        dropped,
        vec![
            (b.clone(), "host-b/2".into()),
            (a.clone(), "host-a/1".into())
        ]
    );
    // Deleting a semaphore nobody holds, or that does not exist, records nothing more.
    let before = t.trail().len();
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "s".into(),
    });
    assert_eq!(t.trail().len(), before);
    // Deleting a held lock.
    let x = t.new_lease(LeaseKind::Lock, "host-c/3");
    t.lock_it("a/b", &x);
    t.ok(Cmd::DeleteLock {
        ns: NS.into(),
        path: "a/b".into(),
    });
    let r = &t.trail()[0];
    assert_eq!(
        (r.action, r.object.as_str(), r.lease.as_str()),
        (AuditAction::DeleteLock, "a/b", x.as_str())
    );
    // Quotas and the budget.
    let quotas = Quotas {
        semaphores: 7,
        ..Quotas::default()
    };
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas,
    });
    let r = &t.trail()[0];
    assert_eq!(r.action, AuditAction::SetQuotas);
    assert_eq!(r.object_kind, AuditObject::Namespace);
    assert!(r.detail.starts_with("semaphores "), "{}", r.detail);
    assert!(r.detail.ends_with(" -> 7"), "{}", r.detail);
    t.ok(Cmd::SetBudget { bytes: 1 << 30 });
    let r = &t.trail()[0];
    assert_eq!(r.action, AuditAction::SetBudget);
    assert!(
        r.detail.ends_with(&format!("-> {}", 1u64 << 30)),
        "{}",
        r.detail
    );
    // Seqs increase in the order the records were made; the read is newest first.
    let seqs: Vec<u64> = t.trail().iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "{seqs:?}");
}

#[test]
fn a_lease_revoked_by_another_token_is_recorded_and_by_its_own_is_not() {
    let mut t = Timeline::audit_setup();
    t.ok(Cmd::RoleCreate {
        name: "root".into(),
        cluster_admin: true,
    });
    for (byte, name) in [(1u8, "admin"), (2, "job")] {
        t.ok(Cmd::TokenCreate {
            name: name.into(),
            role: "root".into(),
            hash: [byte; 32],
        });
    }
    t.caller = Some(2);
    let mine = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    t.take(&mine, 0);
    t.ok(Cmd::RevokeLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: mine,
    });
    assert!(
        t.trail().is_empty(),
        "a holder's own revoke is no forced release"
    );
    let theirs = t.new_lease(LeaseKind::Semaphore, "host-b/2");
    t.take(&theirs, 0);
    t.caller = Some(1);
    t.ok(Cmd::RevokeLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: theirs.clone(),
    });
    let trail = t.trail();
    assert_eq!(trail.len(), 1);
    assert_eq!(trail[0].action, AuditAction::RevokeLease);
    assert_eq!(trail[0].lease, theirs);
    assert_eq!(trail[0].actor.name, "admin");
    assert_eq!(trail[0].lease_owner, Some(2));
}

#[test]
fn the_ring_keeps_the_newest_records_and_pages_newest_first() {
    let mut t = Timeline::audit_setup();
    let total = AUDIT_RECORDS_MAX + 5;
    for i in 0..total {
        t.ok(Cmd::SetBudget {
            bytes: 1_000_000 + i as u64,
        });
    }
    assert_eq!(t.state.audit_len(), AUDIT_RECORDS_MAX);
    // Page through all of it: newest first, the oldest five dropped.
    let mut token = String::new();
    let mut seqs = Vec::new();
    loop {
        let page = t
            .state
            .list_audit(
                &AuditFilter::default(),
                &PageRequest {
                    token: token.clone(),
                    limit: 250,
                },
                |_| true,
            )
            .expect("reads");
        seqs.extend(page.items.iter().map(|r| r.seq));
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    let expected: Vec<u64> = (6..=total as u64).rev().collect();
    assert_eq!(seqs, expected);
    // A cursor this call never made is refused by name.
    let err = t
        .state
        .list_audit(
            &AuditFilter::default(),
            &PageRequest {
                token: "x".into(),
                limit: 0,
            },
            |_| true,
        )
        .expect_err("refused");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("pagination_token"));
}

#[test]
fn filters_by_namespace_and_lease() {
    let mut t = Timeline::audit_setup();
    let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    t.take(&a, 0);
    t.ok(Cmd::SetBudget { bytes: 1 << 30 });
    t.ok(revoke(LeaseKind::Semaphore, "s", &a, "why"));
    let read = |ns: &str, lease: &str| -> Vec<AuditAction> {
        let filter = AuditFilter {
            namespace: ns.into(),
            lease: lease.into(),
        };
        t.state
            .list_audit(&filter, &PageRequest::default(), |_| true)
            .expect("reads")
            .items
            .iter()
            .map(|r| r.action)
            .collect()
    };
    assert_eq!(
        read("", ""),
        vec![AuditAction::RevokeHolder, AuditAction::SetBudget]
    );
    assert_eq!(read(NS, ""), vec![AuditAction::RevokeHolder]);
    assert_eq!(read(NS, &a), vec![AuditAction::RevokeHolder]);
    assert_eq!(read("other", ""), Vec::<AuditAction>::new());
}

#[test]
fn the_trail_survives_a_snapshot_and_replays_to_the_same_hash() {
    // The same history twice: equal states; through a snapshot: equal again.
    let history = || {
        let mut t = Timeline::audit_setup();
        let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
        t.take(&a, 0);
        t.ok(revoke(LeaseKind::Semaphore, "s", &a, "stuck"));
        t.ok(Cmd::SetBudget { bytes: 1 << 30 });
        t
    };
    let (one, two) = (history(), history());
    assert_eq!(one.state.hash(), two.state.hash());
    let bytes = one.state.encode_snapshot().expect("encodes");
    let restored = State::decode_snapshot(&bytes).expect("decodes");
    assert_eq!(restored.hash(), one.state.hash());
    let page = PageRequest::default();
    let all = |s: &State| {
        s.list_audit(&AuditFilter::default(), &page, |_| true)
            .expect("reads")
            .items
    };
    assert_eq!(all(&restored), all(&one.state));
    assert_eq!(all(&restored).len(), 2);
}

#[test]
fn a_repeated_revoke_answers_the_first_record_and_records_once() {
    let mut t = Timeline::audit_setup();
    let a = t.new_lease(LeaseKind::Semaphore, "host-a/1");
    t.take(&a, 0);
    let cmd = Cmd::Once {
        request_id: "r-1".into(),
        cmd: Box::new(revoke(LeaseKind::Semaphore, "s", &a, "stuck")),
    };
    let first = t.run(cmd.clone());
    assert!(matches!(first, Ok(Outcome::Audit(_))));
    t.repeat(cmd, &first);
    assert_eq!(t.trail().len(), 1);
}

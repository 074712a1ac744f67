//! Timelines of the lock commands. Every step checks the invariants (among them: no two
//! conflicting holds, no queued acquire left grantable).

use super::limits::*;
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";

impl Timeline {
    fn locks() -> Self {
        let mut t = Timeline::new();
        t.ok(Cmd::CreateNamespace {
            name: NS.into(),
            description: String::new(),
            metadata: Metadata::new(),
        });
        t
    }

    fn lease_of(&mut self, kind: LeaseKind, ttl_s: u64) -> String {
        match self.ok(Cmd::CreateLease {
            ns: NS.into(),
            kind,
            process_id: String::new(),
            ttl_s,
            metadata: Metadata::new(),
            secret: 11,
        }) {
            Outcome::Lease(v) => v.lease_id,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn lock_lease(&mut self) -> String {
        self.lease_of(LeaseKind::Lock, 60)
    }

    fn lock_cmd(path: &str, lease: &str, exclusive: bool, wait_ns: Nanos) -> Cmd {
        Cmd::AcquireLock {
            ns: NS.into(),
            path: path.into(),
            lease: lease.into(),
            exclusive,
            wait_ns,
            metadata: Metadata::new(),
        }
    }

    fn lock(
        &mut self,
        path: &str,
        lease: &str,
        exclusive: bool,
        wait_ns: Nanos,
    ) -> AcquireLockReply {
        match self.ok(Self::lock_cmd(path, lease, exclusive, wait_ns)) {
            Outcome::AcquireLock(r) => r,
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Acquires and expects the lock now; returns the fencing token.
    fn locked(&mut self, path: &str, lease: &str, exclusive: bool) -> u64 {
        match self.lock(path, lease, exclusive, 0).status {
            AcquireStatus::Acquired { token, .. } => token,
            other => panic!("expected the lock on {path}, got {other:?}"),
        }
    }

    fn unlock(&mut self, path: &str, lease: &str) -> LockView {
        match self.ok(Cmd::ReleaseLock {
            ns: NS.into(),
            path: path.into(),
            lease: lease.into(),
        }) {
            Outcome::Lock(v) => v,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn lock_view(&self, path: &str) -> LockView {
        self.state.get_lock(NS, path).expect("get lock")
    }

    /// The lock grants announced since the last call, as (path, lease, exclusive, token).
    fn lock_grants(&mut self) -> Vec<(String, String, bool, u64)> {
        self.take_events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Granted {
                    sem,
                    lease,
                    token,
                    weight,
                    ..
                } => Some((lock_path(&sem)?.to_string(), lease, weight == 1, token)),
                _ => None,
            })
            .collect()
    }
}

fn queued(reply: &AcquireLockReply) -> bool {
    matches!(reply.status, AcquireStatus::Queued { .. })
}

#[test]
fn shared_holds_coexist_and_exclusive_holds_exclude() {
    let mut t = Timeline::locks();
    let (a, b, c) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("db", &a, false);
    t.locked("db", &b, false);
    let view = t.lock_view("db");
    assert_eq!(view.exclusive, Some(false));
    assert_eq!(view.holders.len(), 2);
    let refused = t.lock("db", &c, true, 0);
    assert_eq!(refused.status, AcquireStatus::Unavailable);
    assert_eq!(refused.reason, Contention::Peer);
    assert!(
        refused.blocking.is_empty(),
        "a peer conflict lists no other lock"
    );
    t.unlock("db", &a);
    t.unlock("db", &b);
    assert_eq!(
        t.lock_view("db").exclusive,
        None,
        "a lock goes with its last holder"
    );
    t.locked("db", &c, true);
    assert_eq!(
        t.lock("db", &a, false, 0).status,
        AcquireStatus::Unavailable
    );
}

#[test]
fn a_hold_conflicts_up_and_down_the_path_but_not_with_siblings() {
    let mut t = Timeline::locks();
    let (a, b) = (t.lock_lease(), t.lock_lease());
    t.locked("users/1/profile", &a, true);
    t.locked("users/1/settings", &b, true);
    t.locked("users/2", &b, false);
    let up = t.lock("users", &b, false, 0);
    assert_eq!(up.reason, Contention::Descendant);
    assert_eq!(
        up.blocking
            .iter()
            .map(|l| l.name.as_str())
            .collect::<Vec<_>>(),
        ["users/1/profile"],
        "only the other lease's conflicting locks block it"
    );
    let down = t.lock("users/1/profile/photo", &b, false, 0);
    assert_eq!(down.reason, Contention::Ancestor);
    assert_eq!(down.blocking[0].name, "users/1/profile");
    // A lease never conflicts with itself.
    t.locked("users/1/profile/photo", &a, false);
    // `users/10` is not under `users/1`.
    t.locked("users/10", &b, true);
    // Shared holds do not conflict with shared holds, on any path.
    t.locked("users/2/x", &a, false);
}

#[test]
fn a_waiting_writer_is_not_starved_by_later_readers() {
    let mut t = Timeline::locks();
    let (r1, w, r2) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("cfg", &r1, false);
    assert!(queued(&t.lock("cfg", &w, true, 30 * S)));
    let late = t.lock("cfg", &r2, false, 30 * S);
    assert!(queued(&late), "a reader behind a waiting writer waits");
    assert_eq!(late.reason, Contention::Peer);
    // Not even a non-blocking reader jumps the queue.
    assert_eq!(
        t.lock("cfg", &r2, false, 0).status,
        AcquireStatus::Unavailable
    );
    t.take_events();
    t.unlock("cfg", &r1);
    let grants = t.lock_grants();
    assert_eq!(grants.len(), 1);
    assert_eq!((grants[0].1.as_str(), grants[0].2), (w.as_str(), true));
    t.unlock("cfg", &w);
    let grants = t.lock_grants();
    assert_eq!(grants.len(), 1);
    assert_eq!((grants[0].1.as_str(), grants[0].2), (r2.as_str(), false));
}

#[test]
fn the_queue_is_fifo_across_the_hierarchy() {
    let mut t = Timeline::locks();
    let (x, y, z, other) = (
        t.lock_lease(),
        t.lock_lease(),
        t.lock_lease(),
        t.lock_lease(),
    );
    t.locked("a/b", &x, true);
    let y_reply = t.lock("a", &y, true, 30 * S);
    assert!(queued(&y_reply));
    assert_eq!(y_reply.reason, Contention::Descendant);
    assert_eq!(y_reply.blocking[0].name, "a/b");
    // `a/c` is free, but a subtree writer queued first: it waits behind it.
    let z_reply = t.lock("a/c", &z, false, 30 * S);
    assert!(queued(&z_reply));
    assert_eq!(z_reply.reason, Contention::Ancestor);
    // Unrelated paths are not held back.
    t.locked("b", &other, true);
    t.take_events();
    t.unlock("a/b", &x);
    let grants = t.lock_grants();
    assert_eq!(
        grants.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    t.unlock("a", &y);
    let grants = t.lock_grants();
    assert_eq!(
        grants.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        ["a/c"]
    );
}

#[test]
fn acquires_that_conflict_with_nothing_before_them_are_granted_together() {
    let mut t = Timeline::locks();
    let (w, r1, r2) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("p", &w, true);
    assert!(queued(&t.lock("p/1", &r1, false, 30 * S)));
    assert!(queued(&t.lock("p/2", &r2, false, 30 * S)));
    t.take_events();
    t.unlock("p", &w);
    let mut paths: Vec<String> = t.lock_grants().into_iter().map(|g| g.0).collect();
    paths.sort();
    assert_eq!(paths, ["p/1", "p/2"]);
}

#[test]
fn fencing_tokens_increase_per_path_through_expiry_and_delete() {
    let mut t = Timeline::locks();
    let a = t.lease_of(LeaseKind::Lock, 5);
    let b = t.lock_lease();
    let c = t.lock_lease();
    let first = t.locked("job", &a, true);
    assert!(queued(&t.lock("job", &b, true, 60 * S)));
    t.take_events();
    // a's lease expires: b is granted by the reaping before the next command.
    t.at(6 * S);
    t.ok(Cmd::Expire);
    let grants = t.lock_grants();
    assert_eq!(grants.len(), 1);
    let second = grants[0].3;
    assert!(second > first);
    assert!(queued(&t.lock("job", &c, true, 60 * S)));
    t.ok(Cmd::DeleteLock {
        ns: NS.into(),
        path: "job".into(),
    });
    let grants = t.lock_grants();
    assert_eq!(grants.len(), 1, "deleting a lock grants what waited for it");
    assert_eq!(grants[0].1, c);
    assert!(grants[0].3 > second);
}

#[test]
fn lock_leases_and_semaphore_leases_are_kept_apart() {
    let mut t = Timeline::locks();
    let sem_lease = t.lease_of(LeaseKind::Semaphore, 60);
    let lock_lease = t.lock_lease();
    let e = t.err(Timeline::lock_cmd("x", &sem_lease, true, 0));
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.message, format!("lock lease {sem_lease} not found"));
    t.ok(Cmd::CreateSemaphore {
        ns: NS.into(),
        name: "s".into(),
        description: String::new(),
        permits: 1,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    });
    let e = t.err(Cmd::Acquire {
        ns: NS.into(),
        sem: "s".into(),
        lease: lock_lease.clone(),
        weight: 1,
        wait_ns: 0,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    });
    assert_eq!(e.kind, ErrorKind::NotFound);
    for kind in [LeaseKind::Semaphore, LeaseKind::Lock] {
        let other = if kind == LeaseKind::Lock {
            &sem_lease
        } else {
            &lock_lease
        };
        let e = t.err(Cmd::RefreshLease {
            ns: NS.into(),
            kind,
            lease: other.clone(),
            ttl_s: 0,
        });
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(t.state.get_lease(NS, kind, other).is_err());
        assert!(
            t.state
                .get_lease(
                    NS,
                    kind,
                    if kind == LeaseKind::Lock {
                        &lock_lease
                    } else {
                        &sem_lease
                    }
                )
                .is_ok()
        );
    }
    let page = t
        .state
        .list_leases(NS, LeaseKind::Lock, None, &PageRequest::default())
        .expect("list");
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].lease_id, lock_lease);
}

#[test]
fn upgrades_queue_and_downgrades_are_immediate() {
    let mut t = Timeline::locks();
    let (a, b) = (t.lock_lease(), t.lock_lease());
    t.locked("r", &a, false);
    t.locked("r", &b, false);
    let up = t.lock("r", &a, true, 30 * S);
    assert!(queued(&up), "an upgrade waits for the other reader");
    assert_eq!(
        t.lock_view("r").holders.len(),
        2,
        "the shared hold stays meanwhile"
    );
    t.take_events();
    t.unlock("r", &b);
    let grants = t.lock_grants();
    assert_eq!((grants[0].1.as_str(), grants[0].2), (a.as_str(), true));
    assert_eq!(t.lock_view("r").exclusive, Some(true));
    assert_eq!(t.lock_view("r").holders.len(), 1);
    t.locked("r", &a, false);
    assert_eq!(t.lock_view("r").exclusive, Some(false));
    t.locked("r", &b, false);
}

#[test]
fn a_re_attach_keeps_the_place_and_the_later_deadline() {
    let mut t = Timeline::locks();
    let (h, w1, w2) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("q", &h, true);
    assert!(queued(&t.lock("q", &w1, true, 10 * S)));
    assert!(queued(&t.lock("q", &w2, true, 50 * S)));
    t.at(5 * S);
    let again = t.lock("q", &w1, true, 20 * S);
    assert_eq!(
        again.status,
        AcquireStatus::Queued {
            deadline_ns: 25 * S
        }
    );
    // A non-blocking re-attach answers UNAVAILABLE and stays queued.
    assert_eq!(t.lock("q", &w1, true, 0).status, AcquireStatus::Unavailable);
    t.take_events();
    t.unlock("q", &h);
    assert_eq!(t.lock_grants()[0].1, w1, "still first in line");
}

#[test]
fn a_waiter_that_times_out_lets_later_ones_through() {
    let mut t = Timeline::locks();
    let (h, slow, fast) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("a", &h, false);
    assert!(queued(&t.lock("a", &slow, true, 5 * S)));
    assert!(queued(&t.lock("a/x", &fast, false, 60 * S)));
    t.take_events();
    t.at(6 * S);
    t.ok(Cmd::Expire);
    let events = t.take_events();
    assert!(events.iter().any(|e| matches!(e,
        Event::WaitEnded { lease, reason: WaitEnd::TimedOut, .. } if *lease == slow)));
    assert!(events.iter().any(|e| matches!(e,
        Event::Granted { lease, .. } if *lease == fast)));
}

#[test]
fn give_up_settles_against_a_grant() {
    let mut t = Timeline::locks();
    let (h, w) = (t.lock_lease(), t.lock_lease());
    t.locked("g", &h, true);
    let AcquireStatus::Queued { deadline_ns } = t.lock("g", &w, true, 30 * S).status else {
        panic!("queued")
    };
    let give_up = |lease: &str| Cmd::GiveUp {
        ns: NS.into(),
        sem: lock_object("g"),
        lease: lease.into(),
        deadline_ns,
        linger_ns: 0,
    };
    t.unlock("g", &h);
    // The grant came first: the give-up reports it.
    let token = t.lock_view("g").holders[0].token;
    assert_eq!(
        t.ok(give_up(&w)),
        Outcome::GiveUp(GiveUpReply::Granted { token, hold_ns: 0 })
    );
    t.unlock("g", &w);
    t.locked("g", &h, true);
    assert!(queued(&t.lock("g", &w, true, 30 * S)));
    assert_eq!(t.ok(give_up(&w)), Outcome::GiveUp(GiveUpReply::Removed));
    assert_eq!(t.lock_view("g").waiters, 0);
}

#[test]
fn deleting_the_namespace_ends_lock_waits() {
    let mut t = Timeline::locks();
    let (h, w) = (t.lock_lease(), t.lock_lease());
    t.locked("d", &h, true);
    assert!(queued(&t.lock("d", &w, false, 30 * S)));
    t.take_events();
    t.ok(Cmd::DeleteNamespace { name: NS.into() });
    let events = t.take_events();
    assert_eq!(events.len(), 3, "{events:?}");
    // Both leases are lost with the namespace, and the waiter's wait ends.
    for lease in [&h, &w] {
        assert!(events.iter().any(|e| matches!(e,
            Event::Lost { lease: l, cause: LossCause::NamespaceDeleted, .. } if l == lease)));
    }
    assert!(events.iter().any(|e| matches!(e,
        Event::WaitEnded { sem, reason: WaitEnd::SemaphoreGone, .. } if *sem == lock_object("d"))));
}

#[test]
fn a_queued_lock_acquire_with_a_request_id_is_settled_by_its_grant() {
    let mut t = Timeline::locks();
    let (h, w) = (t.lock_lease(), t.lock_lease());
    t.locked("o", &h, true);
    let once = Cmd::Once {
        request_id: "req-1".into(),
        cmd: Box::new(Timeline::lock_cmd("o", &w, true, 30 * S)),
    };
    assert!(matches!(t.ok(once.clone()), Outcome::AcquireLock(r) if queued(&r)));
    t.unlock("o", &h);
    let token = t.lock_view("o").holders[0].token;
    let again = t.run_now(once.clone());
    match &again {
        Ok(Outcome::AcquireLock(r)) => {
            assert_eq!(
                r.status,
                AcquireStatus::Acquired { token, hold_ns: 0 },
                "the one grant"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
    t.repeat(once, &again);
}

#[test]
fn snapshots_keep_the_locks_and_their_queue() {
    let mut t = Timeline::locks();
    let (a, b, c) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("s/1", &a, true);
    assert!(queued(&t.lock("s", &b, false, 30 * S)));
    assert!(queued(&t.lock("s/1", &c, false, 30 * S)));
    let bytes = t.state.encode_snapshot().expect("encode");
    let restored = super::State::decode_snapshot(&bytes).expect("decode");
    assert_eq!(restored.hash(), t.state.hash());
    restored.check_invariants().expect("invariants");
    assert_eq!(restored.stats(), t.state.stats());
    assert_eq!(restored.next_due_ns(), t.state.next_due_ns());
    t.state = restored;
    t.take_events();
    t.unlock("s/1", &a);
    assert_eq!(
        t.lock_grants().len(),
        2,
        "both readers go once the writer leaves"
    );
}

#[test]
fn lock_holders_count_against_the_entries_quota() {
    let mut t = Timeline::locks();
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: Quotas {
            entries: 2,
            ..Quotas::default()
        },
    });
    let (a, b, c) = (t.lock_lease(), t.lock_lease(), t.lock_lease());
    t.locked("e/1", &a, false);
    assert!(queued(&t.lock("e", &b, true, 30 * S)));
    let e = t.err(Timeline::lock_cmd("f", &c, false, 0));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    assert!(
        e.message.contains("holder and waiter quota"),
        "{}",
        e.message
    );
    // A non-blocking attempt that finds the lock taken adds nothing, so no quota refuses it.
    assert_eq!(t.lock("e", &c, false, 0).status, AcquireStatus::Unavailable);
    t.unlock("e/1", &a);
    t.locked("f", &c, false);
}

#[test]
fn lock_names_are_paths_of_the_allowed_characters() {
    let mut t = Timeline::locks();
    let a = t.lock_lease();
    for bad in ["", "a b", "a:b", &"x".repeat(LOCK_NAME_MAX_CHARS + 1)] {
        let e = t.err(Timeline::lock_cmd(bad, &a, true, 0));
        assert!(
            e.message.starts_with("lock_name "),
            "{bad:?}: {}",
            e.message
        );
    }
    t.locked(&"x".repeat(LOCK_NAME_MAX_CHARS), &a, true);
    t.locked("A-z_0.9/b", &a, true);
}

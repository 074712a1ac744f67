//! Hold limits: a semaphore's `max_hold_ns` and an acquire's, the smaller winning; the hold ends
//! on the lease clock at its limit whatever the lease does, the next waiter is granted in the
//! same entry, a re-acquire never extends it, and reads stop showing it once it has passed.

use super::limits::*;
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";

fn none() -> Metadata {
    Metadata::new()
}

/// A timeline with namespace `n` and semaphore `db` of `permits` limited to `max_hold_ns`.
fn with_sem(permits: u64, max_hold_ns: Nanos) -> Timeline {
    let mut t = Timeline::new();
    t.ok(Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: none(),
    });
    t.ok(Cmd::CreateSemaphore {
        ns: NS.into(),
        name: "db".into(),
        description: String::new(),
        permits,
        metadata: none(),
        max_hold_ns,
    });
    t
}

fn lease(t: &mut Timeline, ttl_s: u64) -> String {
    match t.ok(Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        process_id: String::new(),
        ttl_s,
        metadata: none(),
        secret: 7,
    }) {
        Outcome::Lease(v) => v.lease_id,
        other => panic!("unexpected {other:?}"),
    }
}

fn acquire_cmd(lease: &str, weight: u64, wait_ns: Nanos, max_hold_ns: Nanos) -> Cmd {
    Cmd::Acquire {
        ns: NS.into(),
        sem: "db".into(),
        lease: lease.into(),
        weight,
        wait_ns,
        metadata: none(),
        max_hold_ns,
    }
}

fn acquire(t: &mut Timeline, lease: &str, wait_ns: Nanos, max_hold_ns: Nanos) -> AcquireStatus {
    match t.ok(acquire_cmd(lease, 1, wait_ns, max_hold_ns)) {
        Outcome::Acquire(r) => r.status,
        other => panic!("unexpected {other:?}"),
    }
}

fn refresh(t: &mut Timeline, lease: &str) {
    t.ok(Cmd::RefreshLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: lease.into(),
        ttl_s: 0,
    });
}

fn holders(t: &Timeline, at: Nanos) -> Vec<String> {
    t.read_at(at)
        .list_holders(NS, "db", &PageRequest::default())
        .expect("db exists")
        .items
        .into_iter()
        .map(|h| h.lease_id)
        .collect()
}

#[test]
fn a_hold_ends_at_its_limit_while_its_lease_lives_and_the_next_waiter_gets_it() {
    let mut t = with_sem(1, 10 * S);
    let a = lease(&mut t, 300);
    let b = lease(&mut t, 300);
    let token_a = match acquire(&mut t, &a, 0, 0) {
        AcquireStatus::Acquired { token, hold_ns } => {
            assert_eq!(hold_ns, 10 * S, "the semaphore's limit, all of it left");
            token
        }
        other => panic!("expected a grant, got {other:?}"),
    };
    assert!(matches!(
        acquire(&mut t, &b, 60 * S, 0),
        AcquireStatus::Queued { .. }
    ));
    t.take_events();
    // The holder refreshes its lease all along: the hold still ends at 10 s.
    for at in [3 * S, 6 * S, 9 * S] {
        t.at(at);
        refresh(&mut t, &a);
    }
    assert_eq!(holders(&t, 10 * S - 1), vec![a.clone()]);
    t.at(10 * S);
    refresh(&mut t, &a);
    let token_b = token_a + 1;
    assert_eq!(
        t.take_events(),
        vec![
            Event::Lost {
                ns: NS.into(),
                lease: a.clone(),
                object: "db".into(),
                cause: LossCause::HoldLimit,
            },
            Event::Granted {
                ns: NS.into(),
                sem: "db".into(),
                lease: b.clone(),
                token: token_b,
                weight: 1,
                hold_ns: 10 * S,
            }
        ],
        "the end of A's hold is A's loss and grants B in the same entry"
    );
    assert_eq!(holders(&t, 10 * S), vec![b]);
    assert!(
        t.read_at(10 * S)
            .get_lease(NS, LeaseKind::Semaphore, &a)
            .is_ok(),
        "the lease itself lives on"
    );
}

#[test]
fn the_smaller_of_the_semaphores_limit_and_the_acquires_wins() {
    for (sem_limit, asked, got) in [
        (10 * S, 4 * S, 4 * S),
        (10 * S, 20 * S, 10 * S),
        (10 * S, 0, 10 * S),
        (0, 5 * S, 5 * S),
        (0, 0, 0),
    ] {
        let mut t = with_sem(1, sem_limit);
        let a = lease(&mut t, 300);
        match acquire(&mut t, &a, 0, asked) {
            AcquireStatus::Acquired { hold_ns, .. } => {
                assert_eq!(hold_ns, got, "semaphore {sem_limit}, asked {asked}")
            }
            other => panic!("expected a grant, got {other:?}"),
        }
        let view = t.read_at(0).holder(NS, "db", &a).expect("A holds db");
        assert_eq!(view.hold_left_ns, got);
        assert_eq!(
            view.ends_at,
            if got == 0 { 0 } else { t.wall_ns() + got },
            "the end on the wall clock, for display"
        );
    }
}

#[test]
fn a_reacquire_never_extends_a_hold() {
    let mut t = with_sem(2, 10 * S);
    let a = lease(&mut t, 300);
    acquire(&mut t, &a, 0, 0);
    t.at(6 * S);
    match acquire(&mut t, &a, 0, 0) {
        AcquireStatus::Acquired { hold_ns, .. } => assert_eq!(hold_ns, 4 * S),
        other => panic!("expected a grant, got {other:?}"),
    }
    // An upgrade queued and then granted keeps the first end too.
    let b = lease(&mut t, 300);
    acquire(&mut t, &b, 0, 0);
    assert!(matches!(
        t.ok(acquire_cmd(&a, 2, 60 * S, 0)),
        Outcome::Acquire(AcquireReply {
            status: AcquireStatus::Queued { .. },
            ..
        })
    ));
    t.take_events();
    t.at(7 * S);
    t.ok(Cmd::Release {
        ns: NS.into(),
        sem: "db".into(),
        lease: b.clone(),
    });
    assert!(
        matches!(
            t.take_events().as_slice(),
            [Event::Granted { hold_ns, weight: 2, .. }] if *hold_ns == 3 * S
        ),
        "the upgrade is granted with what was left of the first hold"
    );
    assert_eq!(holders(&t, 10 * S - 1), vec![a.clone()]);
    assert!(holders(&t, 10 * S).is_empty());
}

#[test]
fn reads_stop_showing_a_hold_at_its_limit_before_it_is_reaped() {
    let mut t = with_sem(1, 10 * S);
    let a = lease(&mut t, 300);
    acquire(&mut t, &a, 0, 0);
    let seen = |at| {
        t.read_at(at)
            .get_semaphore(NS, "db")
            .map(|v| (v.active_holds, v.active_holders_count))
    };
    assert_eq!(seen(10 * S - 1), Ok((1, 1)));
    assert_eq!(seen(10 * S), Ok((0, 0)));
}

#[test]
fn a_limit_change_applies_to_later_grants_and_an_update_without_one_keeps_it() {
    let mut t = with_sem(2, 10 * S);
    let a = lease(&mut t, 300);
    acquire(&mut t, &a, 0, 0);
    let update = |max_hold_ns, version| Cmd::UpdateSemaphore {
        ns: NS.into(),
        name: "db".into(),
        description: String::new(),
        permits: 2,
        metadata: none(),
        expected_version: version,
        max_hold_ns,
    };
    let limit = |t: &mut Timeline, cmd| match t.ok(cmd) {
        Outcome::Semaphore(v) => v.max_hold_ns,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(limit(&mut t, update(None, 1)), 10 * S, "kept");
    assert_eq!(limit(&mut t, update(Some(0), 2)), 0, "cleared");
    let b = lease(&mut t, 300);
    match acquire(&mut t, &b, 0, 0) {
        AcquireStatus::Acquired { hold_ns, .. } => assert_eq!(hold_ns, 0),
        other => panic!("expected a grant, got {other:?}"),
    }
    // A's hold keeps the limit it was granted with.
    assert_eq!(holders(&t, 10 * S), vec![b]);
}

#[test]
fn a_give_up_after_the_grant_answers_what_is_left_of_the_hold() {
    let mut t = with_sem(1, 10 * S);
    let a = lease(&mut t, 300);
    let b = lease(&mut t, 300);
    acquire(&mut t, &a, 0, 0);
    acquire(&mut t, &b, 60 * S, 0);
    t.at(2 * S);
    t.ok(Cmd::Release {
        ns: NS.into(),
        sem: "db".into(),
        lease: a,
    });
    t.at(5 * S);
    match t.ok(Cmd::GiveUp {
        ns: NS.into(),
        sem: "db".into(),
        lease: b,
        deadline_ns: 62 * S,
        linger_ns: 0,
    }) {
        Outcome::GiveUp(GiveUpReply::Granted { hold_ns, .. }) => assert_eq!(hold_ns, 7 * S),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn hold_limits_out_of_range_are_refused_and_change_nothing() {
    let mut t = with_sem(1, 0);
    let a = lease(&mut t, 300);
    let too_long = (MAX_HOLD_MAX_MS as Nanos + 1) * 1_000_000;
    for bad in [1, S - 1, too_long, -S] {
        let e = t.err(acquire_cmd(&a, 1, 0, bad));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("max_hold_ms"), "{}", e.message);
        let e = t.err(Cmd::CreateSemaphore {
            ns: NS.into(),
            name: "other".into(),
            description: String::new(),
            permits: 1,
            metadata: none(),
            max_hold_ns: bad,
        });
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }
}

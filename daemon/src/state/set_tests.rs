//! All-or-none acquires (`set.rs`): granted whole at once or queued as one entry in every
//! member's queue; FIFO with single acquires; no deadlock between opposite orders; every exit
//! from the queue ends the whole set; exactly-once with request ids.

use super::data::State;
use super::limits::*;
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";

fn none() -> Metadata {
    Metadata::new()
}

/// A timeline with namespace `n` and semaphores of the given permits.
fn with_sems(sems: &[(&str, u64)]) -> Timeline {
    let mut t = Timeline::new();
    t.ok(Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: none(),
    });
    for (name, permits) in sems {
        t.ok(Cmd::CreateSemaphore {
            ns: NS.into(),
            name: (*name).into(),
            description: String::new(),
            permits: *permits,
            metadata: none(),
            max_hold_ns: 0,
        });
    }
    t
}

fn lease(t: &mut Timeline) -> String {
    match t.ok(Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        process_id: String::new(),
        ttl_s: 300,
        metadata: none(),
        secret: 7,
    }) {
        Outcome::Lease(v) => v.lease_id,
        other => panic!("unexpected {other:?}"),
    }
}

fn set_cmd(lease: &str, members: &[(&str, u64)], wait_ns: Nanos) -> Cmd {
    Cmd::AcquireSet {
        ns: NS.into(),
        lease: lease.into(),
        members: members
            .iter()
            .map(|(sem, weight)| SetMember {
                sem: (*sem).into(),
                weight: *weight,
            })
            .collect(),
        wait_ns,
        metadata: none(),
        max_hold_ns: 0,
    }
}

fn acquire_set(
    t: &mut Timeline,
    lease: &str,
    members: &[(&str, u64)],
    wait_ns: Nanos,
) -> AcquireSetStatus {
    match t.ok(set_cmd(lease, members, wait_ns)) {
        Outcome::AcquireSet(r) => r.status,
        other => panic!("unexpected {other:?}"),
    }
}

fn acquire(t: &mut Timeline, sem: &str, lease: &str, weight: u64, wait_ns: Nanos) -> AcquireStatus {
    match t.ok(Cmd::Acquire {
        ns: NS.into(),
        sem: sem.into(),
        lease: lease.into(),
        weight,
        wait_ns,
        metadata: none(),
        max_hold_ns: 0,
    }) {
        Outcome::Acquire(r) => r.status,
        other => panic!("unexpected {other:?}"),
    }
}

fn release(t: &mut Timeline, sem: &str, lease: &str) {
    t.ok(Cmd::Release {
        ns: NS.into(),
        sem: sem.into(),
        lease: lease.into(),
    });
}

fn holds(t: &Timeline, sem: &str, lease: &str) -> bool {
    t.state.holder(NS, sem, lease).is_some()
}

fn waits(t: &Timeline, sem: &str, lease: &str) -> bool {
    t.state.waiter(NS, sem, lease).is_some()
}

/// The (semaphore, lease) of every `Granted` event, in order.
fn granted(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Granted { sem, lease, .. } => Some((sem.clone(), lease.clone())),
            _ => None,
        })
        .collect()
}

/// The (semaphore, lease, reason) of every `WaitEnded` event, in order.
fn ended(events: &[Event]) -> Vec<(String, String, WaitEnd)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::WaitEnded {
                sem, lease, reason, ..
            } => Some((sem.clone(), lease.clone(), *reason)),
            _ => None,
        })
        .collect()
}

fn pair(sem: &str, lease: &str) -> (String, String) {
    (sem.to_string(), lease.to_string())
}

#[test]
fn a_free_set_is_granted_whole_at_once_with_a_token_per_member() {
    let mut t = with_sems(&[("a", 1), ("b", 3)]);
    let l = lease(&mut t);
    let AcquireSetStatus::Acquired { grants } = acquire_set(&mut t, &l, &[("a", 1), ("b", 2)], 0)
    else {
        panic!("expected a grant");
    };
    assert_eq!(grants.len(), 2);
    let a = t.state.holder(NS, "a", &l).expect("a held");
    let b = t.state.holder(NS, "b", &l).expect("b held");
    assert_eq!((grants[0].token, grants[1].token), (a.token, b.token));
    assert_eq!((a.weight, b.weight), (1, 2));
    assert!(a.token < b.token, "tokens in the order of the command");
    assert!(
        t.take_events().is_empty(),
        "an immediate grant is answered by the reply"
    );
}

#[test]
fn a_non_blocking_set_with_one_member_full_takes_nothing() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (holder, l) = (lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &holder, 1, 0);
    assert_eq!(
        acquire_set(&mut t, &l, &[("a", 1), ("b", 1)], 0),
        AcquireSetStatus::Unavailable
    );
    assert!(!holds(&t, "a", &l) && !holds(&t, "b", &l));
    assert!(!waits(&t, "a", &l) && !waits(&t, "b", &l));
}

#[test]
fn opposite_orders_do_not_deadlock_and_are_granted_in_arrival_order() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (ha, hb, x, y) = (lease(&mut t), lease(&mut t), lease(&mut t), lease(&mut t));
    acquire(&mut t, "a", &ha, 1, 0);
    acquire(&mut t, "b", &hb, 1, 0);
    assert!(matches!(
        acquire_set(&mut t, &x, &[("a", 1), ("b", 1)], 60 * S),
        AcquireSetStatus::Queued { .. }
    ));
    assert!(matches!(
        acquire_set(&mut t, &y, &[("b", 1), ("a", 1)], 60 * S),
        AcquireSetStatus::Queued { .. }
    ));
    t.take_events();
    // One member free is not enough: the set holds nothing.
    release(&mut t, "a", &ha);
    assert!(t.take_events().is_empty());
    assert!(!holds(&t, "a", &x));
    release(&mut t, "b", &hb);
    assert_eq!(
        granted(&t.take_events()),
        vec![pair("a", &x), pair("b", &x)],
        "the older set, both members in one entry"
    );
    release(&mut t, "a", &x);
    assert!(t.take_events().is_empty(), "y still needs b");
    release(&mut t, "b", &x);
    assert_eq!(
        granted(&t.take_events()),
        vec![pair("b", &y), pair("a", &y)]
    );
}

#[test]
fn a_single_acquire_behind_a_set_waits_for_it_even_with_room() {
    let mut t = with_sems(&[("a", 2), ("b", 1)]);
    let (hb, set, single) = (lease(&mut t), lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 60 * S);
    assert!(matches!(
        acquire(&mut t, "a", &single, 1, 60 * S),
        AcquireStatus::Queued { .. }
    ));
    let passer = lease(&mut t);
    assert_eq!(
        acquire(&mut t, "a", &passer, 1, 0),
        AcquireStatus::Unavailable,
        "a non-blocking acquire does not pass the set either"
    );
    t.take_events();
    release(&mut t, "b", &hb);
    assert_eq!(
        granted(&t.take_events()),
        vec![pair("a", &set), pair("b", &set), pair("a", &single)]
    );
}

#[test]
fn a_timed_out_set_leaves_every_queue_and_the_queues_move() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set, single) = (lease(&mut t), lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 10 * S);
    acquire(&mut t, "a", &single, 1, 60 * S);
    t.take_events();
    t.at(10 * S);
    t.ok(Cmd::Expire);
    let events = t.take_events();
    assert_eq!(
        ended(&events),
        vec![
            ("a".to_string(), set.clone(), WaitEnd::TimedOut),
            ("b".to_string(), set.clone(), WaitEnd::TimedOut)
        ]
    );
    assert_eq!(granted(&events), vec![pair("a", &single)]);
    assert!(!waits(&t, "a", &set) && !waits(&t, "b", &set));
}

#[test]
fn deleting_a_member_fails_the_set_in_every_member() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set, single) = (lease(&mut t), lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 60 * S);
    acquire(&mut t, "a", &single, 1, 60 * S);
    t.take_events();
    t.ok(Cmd::DeleteSemaphore {
        ns: NS.into(),
        name: "b".into(),
    });
    let events = t.take_events();
    assert_eq!(
        ended(&events),
        vec![
            ("b".to_string(), set.clone(), WaitEnd::SemaphoreGone),
            ("a".to_string(), set.clone(), WaitEnd::SemaphoreGone)
        ]
    );
    assert_eq!(granted(&events), vec![pair("a", &single)]);
}

#[test]
fn a_revoked_lease_ends_the_set_in_every_member() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set) = (lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 60 * S);
    t.take_events();
    t.ok(Cmd::RevokeLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        lease: set.clone(),
    });
    assert_eq!(
        ended(&t.take_events()),
        vec![
            ("a".to_string(), set.clone(), WaitEnd::LeaseGone),
            ("b".to_string(), set.clone(), WaitEnd::LeaseGone)
        ]
    );
}

#[test]
fn releasing_one_member_ends_a_waiting_set_whole_and_a_granted_one_member_only() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set) = (lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 60 * S);
    t.take_events();
    release(&mut t, "b", &set);
    assert_eq!(
        ended(&t.take_events()),
        vec![
            ("a".to_string(), set.clone(), WaitEnd::GaveUp),
            ("b".to_string(), set.clone(), WaitEnd::GaveUp)
        ]
    );
    release(&mut t, "b", &hb);
    assert!(matches!(
        acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 0),
        AcquireSetStatus::Acquired { .. }
    ));
    release(&mut t, "a", &set);
    assert!(!holds(&t, "a", &set));
    assert!(holds(&t, "b", &set), "the other member stays held");
}

#[test]
fn a_give_up_naming_a_member_ends_the_set_and_a_linger_moves_every_deadline() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set) = (lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    let AcquireSetStatus::Queued { deadline_ns } =
        acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 60 * S)
    else {
        panic!("expected queued");
    };
    let give_up = |linger_ns| Cmd::GiveUp {
        ns: NS.into(),
        sem: "a".into(),
        lease: set.clone(),
        deadline_ns,
        linger_ns,
    };
    assert_eq!(
        t.ok(give_up(5 * S)),
        Outcome::GiveUp(GiveUpReply::StillQueued { deadline_ns: 5 * S })
    );
    let deadlines: Vec<Nanos> = ["a", "b"]
        .iter()
        .map(|sem| t.state.waiter(NS, sem, &set).expect("waits").deadline_ns)
        .collect();
    assert_eq!(deadlines, vec![5 * S, 5 * S]);
    assert_eq!(
        t.ok(Cmd::GiveUp {
            ns: NS.into(),
            sem: "a".into(),
            lease: set.clone(),
            deadline_ns: 5 * S,
            linger_ns: 0,
        }),
        Outcome::GiveUp(GiveUpReply::Removed)
    );
    assert!(!waits(&t, "a", &set) && !waits(&t, "b", &set));
}

#[test]
fn bad_sets_are_refused_with_a_clear_error_and_change_nothing() {
    let mut t = with_sems(&[("a", 1), ("b", 1), ("c", 1)]);
    let l = lease(&mut t);
    let err = t.err(set_cmd(&l, &[("a", 1), ("a", 1)], 0));
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("semaphore a is named twice"), "{err}");
    let err = t.err(set_cmd(&l, &[("a", 1)], 0));
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    let names: Vec<String> = (0..=SET_MEMBERS_MAX).map(|i| format!("s{i}")).collect();
    let many: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
    assert_eq!(
        t.err(set_cmd(&l, &many, 0)).kind,
        ErrorKind::InvalidArgument
    );
    let err = t.err(set_cmd(&l, &[("a", 1), ("b", 2)], 0));
    assert!(err.message.contains("semaphore b"), "{err}");
    assert_eq!(
        t.err(set_cmd(&l, &[("a", 1), ("zz", 1)], 0)).kind,
        ErrorKind::NotFound
    );
    acquire(&mut t, "c", &l, 1, 0);
    let err = t.err(set_cmd(&l, &[("a", 1), ("c", 1)], 0));
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
    assert!(err.message.contains("semaphore c"), "{err}");
}

#[test]
fn a_single_acquire_of_a_member_the_lease_waits_for_in_a_set_is_refused() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set) = (lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 60 * S);
    let err = t.err(Cmd::Acquire {
        ns: NS.into(),
        sem: "a".into(),
        lease: set.clone(),
        weight: 1,
        wait_ns: 0,
        metadata: none(),
        max_hold_ns: 0,
    });
    assert_eq!(err.kind, ErrorKind::FailedPrecondition);
}

#[test]
fn a_re_attach_keeps_the_place_and_a_retry_after_the_grant_answers_the_same_tokens() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set, other) = (lease(&mut t), lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 10 * S);
    acquire_set(&mut t, &other, &[("b", 1), ("a", 1)], 60 * S);
    t.at(5 * S);
    assert_eq!(
        acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 0),
        AcquireSetStatus::Unavailable,
        "still queued, answered as a non-blocking re-attach"
    );
    assert_eq!(
        acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 30 * S),
        AcquireSetStatus::Queued {
            deadline_ns: 35 * S
        }
    );
    assert_eq!(t.state.waiter(NS, "b", &set).map(|w| w.position), Some(0));
    t.take_events();
    release(&mut t, "b", &hb);
    assert_eq!(
        granted(&t.take_events()),
        vec![pair("a", &set), pair("b", &set)]
    );
    let tokens = |t: &Timeline| {
        ["a", "b"]
            .iter()
            .map(|sem| SetGrant {
                token: t.state.holder(NS, sem, &set).expect("held").token,
                hold_ns: 0,
            })
            .collect::<Vec<_>>()
    };
    let expected = tokens(&t);
    assert_eq!(
        acquire_set(&mut t, &set, &[("a", 1), ("b", 1)], 30 * S),
        AcquireSetStatus::Acquired { grants: expected }
    );
    assert!(t.take_events().is_empty(), "no second grant");
}

#[test]
fn a_request_id_answers_the_grant_that_settled_a_queued_set() {
    let mut t = with_sems(&[("a", 1), ("b", 1)]);
    let (hb, set) = (lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    let once = |wait_ns| Cmd::Once {
        request_id: "r1".into(),
        cmd: Box::new(set_cmd(&set, &[("a", 1), ("b", 1)], wait_ns)),
    };
    assert!(matches!(
        t.ok(once(60 * S)),
        Outcome::AcquireSet(AcquireSetReply {
            status: AcquireSetStatus::Queued { .. },
            ..
        })
    ));
    release(&mut t, "b", &hb);
    let a = t.state.holder(NS, "a", &set).expect("a held").token;
    let b = t.state.holder(NS, "b", &set).expect("b held").token;
    let settled = Ok(Outcome::AcquireSet(AcquireSetReply {
        status: AcquireSetStatus::Acquired {
            grants: vec![
                SetGrant {
                    token: a,
                    hold_ns: 0,
                },
                SetGrant {
                    token: b,
                    hold_ns: 0,
                },
            ],
        },
        members: vec!["a".into(), "b".into()],
    }));
    // Even after one member is released, the repeat answers the one grant, changing nothing.
    release(&mut t, "a", &set);
    t.take_events();
    t.repeat(once(30 * S), &settled);
}

#[test]
fn waiting_sets_survive_a_snapshot_round_trip() {
    let mut t = with_sems(&[("a", 1), ("b", 1), ("c", 2)]);
    let (hb, x, y) = (lease(&mut t), lease(&mut t), lease(&mut t));
    acquire(&mut t, "b", &hb, 1, 0);
    acquire_set(&mut t, &x, &[("a", 1), ("b", 1), ("c", 2)], 60 * S);
    acquire_set(&mut t, &y, &[("c", 1), ("a", 1)], 60 * S);
    let bytes = t.state.encode_snapshot().expect("encode");
    let decoded = State::decode_snapshot(&bytes).expect("decode");
    assert_eq!(decoded.hash(), t.state.hash());
    assert_eq!(
        decoded.waiter(NS, "c", &y).map(|w| w.position),
        Some(1),
        "y stays behind x"
    );
}

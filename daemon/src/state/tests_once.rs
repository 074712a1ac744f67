//! Timelines of exactly-once writes: repeats of a request id, queued acquires settled by later
//! grants, expiry, eviction and snapshots of the remembered ids. Every step checks the
//! invariants.

use super::data::State;
use super::limits::*;
use super::timeline::Timeline;
use super::types::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";

fn once(id: &str, cmd: Cmd) -> Cmd {
    Cmd::Once {
        request_id: id.to_string(),
        cmd: Box::new(cmd),
    }
}

impl Timeline {
    /// A lease created by request `id`.
    fn once_lease(&mut self, id: &str, ttl_s: u64) -> String {
        match self.ok(once(id, create_lease(ttl_s))) {
            Outcome::Lease(view) => view.lease_id,
            other => panic!("not a lease: {other:?}"),
        }
    }
}

fn create_ns(name: &str) -> Cmd {
    Cmd::CreateNamespace {
        name: name.into(),
        description: String::new(),
        metadata: Metadata::new(),
    }
}

fn create_sem(name: &str, permits: u64) -> Cmd {
    Cmd::CreateSemaphore {
        ns: NS.into(),
        name: name.into(),
        description: String::new(),
        permits,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    }
}

fn create_lease(ttl_s: u64) -> Cmd {
    Cmd::CreateLease {
        ns: NS.into(),
        kind: LeaseKind::Semaphore,
        process_id: "p".into(),
        ttl_s,
        metadata: Metadata::new(),
        secret: 7,
    }
}

fn acquire(lease: &str, weight: u64, wait_ns: Nanos) -> Cmd {
    Cmd::Acquire {
        ns: NS.into(),
        sem: "s".into(),
        lease: lease.into(),
        weight,
        wait_ns,
        metadata: Metadata::new(),
        max_hold_ns: 0,
    }
}

fn release(lease: &str) -> Cmd {
    Cmd::Release {
        ns: NS.into(),
        sem: "s".into(),
        lease: lease.into(),
    }
}

fn status(outcome: &Outcome) -> AcquireStatus {
    match outcome {
        Outcome::Acquire(reply) => reply.status,
        other => panic!("not an acquire: {other:?}"),
    }
}

/// A namespace "n" with semaphore "s" of `permits`, created with request ids.
fn with_sem(permits: u64) -> Timeline {
    let mut t = Timeline::new();
    t.ok(once("ns", create_ns(NS)));
    t.ok(once("sem", create_sem("s", permits)));
    t
}

#[test]
fn every_write_repeated_answers_its_first_reply_and_changes_nothing() {
    let mut t = Timeline::new();
    let step = |t: &mut Timeline, id: &str, cmd: Cmd| {
        let cmd = once(id, cmd);
        let first = t.run(cmd.clone());
        assert!(first.is_ok(), "{id}: {first:?}");
        t.repeat(cmd, &first);
        first.unwrap_or_else(|e| panic!("{id}: {e}"))
    };
    step(&mut t, "c-ns", create_ns(NS));
    step(
        &mut t,
        "u-ns",
        Cmd::UpdateNamespace {
            name: NS.into(),
            description: "d".into(),
            metadata: Metadata::new(),
            expected_version: 1,
        },
    );
    step(&mut t, "c-sem", create_sem("s", 1));
    step(
        &mut t,
        "u-sem",
        Cmd::UpdateSemaphore {
            ns: NS.into(),
            name: "s".into(),
            description: "d".into(),
            permits: 2,
            metadata: Metadata::new(),
            expected_version: 1,
            max_hold_ns: None,
        },
    );
    let lease = match step(&mut t, "c-lease", create_lease(30)) {
        Outcome::Lease(view) => view.lease_id,
        other => panic!("{other:?}"),
    };
    t.now_ns = S;
    step(
        &mut t,
        "refresh",
        Cmd::RefreshLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease: lease.clone(),
            ttl_s: 0,
        },
    );
    let acquired = step(&mut t, "acquire", acquire(&lease, 2, 0));
    assert!(matches!(status(&acquired), AcquireStatus::Acquired { .. }));
    step(&mut t, "release", release(&lease));
    step(
        &mut t,
        "d-sem",
        Cmd::DeleteSemaphore {
            ns: NS.into(),
            name: "s".into(),
        },
    );
    step(
        &mut t,
        "revoke",
        Cmd::RevokeLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            lease,
        },
    );
    step(&mut t, "d-ns", Cmd::DeleteNamespace { name: NS.into() });
    // The repeats changed nothing: one namespace was created and deleted, and so on.
    assert_eq!(t.state.stats(), Stats::default());
    assert_eq!(t.state.data.last_namespace_id, 1);
    assert_eq!(t.state.data.last_lease_seq, 1);
    assert_eq!(t.state.data.last_token, 1);
}

#[test]
fn a_repeat_later_still_answers_the_first_reply() {
    let mut t = with_sem(1);
    let cmd = once("lease", create_lease(30));
    let first = t.run(cmd.clone());
    t.now_ns = 10 * S;
    let again = t.run(cmd);
    assert_eq!(again, first);
    assert_eq!(t.state.stats().leases, 1, "one lease, not two");
}

#[test]
fn an_id_reused_for_another_command_is_refused_and_changes_nothing() {
    let mut t = with_sem(1);
    let before = t.state.hash();
    let err = t
        .run(once("sem", create_sem("other", 1)))
        .expect_err("refused");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("conch-request-id"), "{}", err.message);
    assert_eq!(t.state.hash(), before);
}

#[test]
fn bad_ids_and_wrapped_internal_commands_are_refused() {
    let mut t = with_sem(1);
    for id in ["", "has space", &"x".repeat(REQUEST_ID_MAX_BYTES + 1)] {
        let cmd = once(id, create_ns("m"));
        assert_eq!(
            cmd.validate().map_err(|e| e.kind),
            Err(ErrorKind::InvalidArgument)
        );
        let before = t.state.hash();
        assert!(t.run(cmd).is_err());
        assert_eq!(t.state.hash(), before);
    }
    for inner in [Cmd::Expire, Cmd::ExtendLeases, once("x", create_ns("m"))] {
        let cmd = once("ok", inner);
        assert!(cmd.validate().is_err());
        assert!(t.run(cmd).is_err());
    }
    assert!(
        once(&"a".repeat(REQUEST_ID_MAX_BYTES), create_ns("m"))
            .validate()
            .is_ok()
    );
}

#[test]
fn a_refused_command_is_not_remembered() {
    let mut t = Timeline::new();
    let cmd = once("sem", create_sem("s", 1));
    let err = t.run(cmd.clone()).expect_err("no namespace yet");
    assert_eq!(err.kind, ErrorKind::NotFound);
    t.ok(create_ns(NS));
    assert!(matches!(t.ok(cmd), Outcome::Semaphore(_)));
}

#[test]
fn a_queued_acquire_repeated_after_its_grant_sees_that_grant() {
    let mut t = with_sem(1);
    let a = t.once_lease("la", 30);
    let b = t.once_lease("lb", 30);
    t.ok(once("a-acq", acquire(&a, 1, 0)));
    let b_acquire = once("b-acq", acquire(&b, 1, 10 * S));
    let queued = t.ok(b_acquire.clone());
    assert!(matches!(status(&queued), AcquireStatus::Queued { .. }));
    // A repeat while queued re-attaches: still queued, same place.
    let again = t.ok(b_acquire.clone());
    assert!(matches!(status(&again), AcquireStatus::Queued { .. }));
    assert_eq!(t.state.stats().waiters, 1);
    // The grant comes from someone else's release (without a request id).
    t.now_ns = S;
    t.take_events();
    t.ok(release(&a));
    let granted = t
        .take_events()
        .iter()
        .find_map(|e| match e {
            Event::Granted { token, .. } => Some(*token),
            _ => None,
        })
        .expect("b granted");
    let Ok(reply) = t.run(b_acquire.clone()) else {
        panic!("repeat refused")
    };
    assert_eq!(
        status(&reply),
        AcquireStatus::Acquired {
            token: granted,
            hold_ns: 0,
        }
    );
    t.repeat(b_acquire, &Ok(reply));
    assert_eq!(t.state.data.last_token, granted, "no second grant");
}

#[test]
fn a_queued_acquire_repeated_after_its_wait_ended_runs_again() {
    let mut t = with_sem(1);
    let a = t.once_lease("la", 30);
    let b = t.once_lease("lb", 30);
    t.ok(once("a-acq", acquire(&a, 1, 0)));
    let b_acquire = once("b-acq", acquire(&b, 1, 2 * S));
    assert!(matches!(
        status(&t.ok(b_acquire.clone())),
        AcquireStatus::Queued { .. }
    ));
    t.now_ns = 3 * S;
    t.ok(Cmd::Expire);
    assert_eq!(t.state.stats().waiters, 0, "timed out");
    let again = t.ok(b_acquire.clone());
    assert!(matches!(status(&again), AcquireStatus::Queued { .. }));
    assert_eq!(t.state.stats().waiters, 1, "queued again");
    // Granted this time, and the grant is what a repeat sees.
    t.ok(release(&a));
    assert!(matches!(
        status(&t.ok(b_acquire)),
        AcquireStatus::Acquired { .. }
    ));
}

#[test]
fn ids_expire_by_the_state_clock() {
    let mut t = with_sem(1);
    let cmd = once("lease", create_lease(300));
    t.now_ns = S;
    let first = t.run(cmd.clone());
    t.now_ns = S + REQUEST_RETENTION_NS - 1;
    assert_eq!(t.run(cmd.clone()), first);
    assert_eq!(t.state.stats().leases, 1);
    t.now_ns = S + REQUEST_RETENTION_NS;
    let second = t.run(cmd);
    assert_ne!(second, first, "forgotten: the command ran again");
    assert_eq!(t.state.stats().leases, 2);
}

#[test]
fn ids_beyond_the_cap_are_forgotten_oldest_first() {
    let mut state = State::new();
    // Spread over enough namespaces that none reaches its own quota first.
    let namespaces = REQUESTS_REMEMBERED_MAX / DEFAULT_REQUEST_IDS as usize + 1;
    let cmds: Vec<Cmd> = (0..=REQUESTS_REMEMBERED_MAX)
        .map(|i| {
            let name = format!("n{}", i % namespaces);
            once(&format!("r{i}"), Cmd::DeleteNamespace { name })
        })
        .collect();
    let mut events = Vec::new();
    state.apply_batch(
        &Batch {
            now_ns: 0,
            wall_ns: 0,
            cmds,
        },
        &mut events,
    );
    state.check_invariants().expect("invariants hold");
    assert_eq!(state.data.requests.len(), REQUESTS_REMEMBERED_MAX);
    assert!(state.data.requests.get("r0").is_none());
    assert!(state.data.requests.get("r1").is_some());
    assert!(
        state
            .data
            .requests
            .get(&format!("r{REQUESTS_REMEMBERED_MAX}"))
            .is_some()
    );
}

#[test]
fn snapshots_keep_the_remembered_ids() {
    let mut t = with_sem(1);
    let a = t.once_lease("la", 30);
    let b = t.once_lease("lb", 30);
    t.ok(once("a-acq", acquire(&a, 1, 0)));
    let b_acquire = once("b-acq", acquire(&b, 1, 10 * S));
    t.ok(b_acquire.clone());
    let bytes = t.state.encode_snapshot().expect("encode");
    let restored = State::decode_snapshot(&bytes).expect("decode");
    assert_eq!(restored.hash(), t.state.hash());
    t.state = restored;
    // The link from the queued acquire to its waiter survived the round trip.
    t.ok(release(&a));
    let reply = t.ok(b_acquire);
    assert!(matches!(status(&reply), AcquireStatus::Acquired { .. }));
    let cmd = once("lease", create_lease(30));
    let first = t.run(cmd.clone());
    let restored =
        State::decode_snapshot(&t.state.encode_snapshot().expect("encode")).expect("decode");
    t.state = restored;
    t.repeat(cmd, &first);
}

#[test]
fn an_acquire_retried_with_what_is_left_of_its_wait_is_the_same_request() {
    let mut t = with_sem(1);
    let a = t.once_lease("la", 30);
    let b = t.once_lease("lb", 30);
    t.ok(once("a-acq", acquire(&a, 1, 0)));
    assert!(matches!(
        status(&t.ok(once("b-acq", acquire(&b, 1, 10 * S)))),
        AcquireStatus::Queued { .. }
    ));
    t.now_ns = S;
    t.ok(release(&a));
    let granted = t.ok(once("b-acq", acquire(&b, 1, 9 * S)));
    let token = t.state.data.last_token;
    assert_eq!(
        status(&granted),
        AcquireStatus::Acquired { token, hold_ns: 0 }
    );
    t.repeat(once("b-acq", acquire(&b, 1, 3 * S)), &Ok(granted));
    // A different weight is a different request.
    let err = t
        .run(once("b-acq", acquire(&b, 2, 3 * S)))
        .expect_err("refused");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
}

/// A namespace remembers at most its quota of request ids: past it, its own oldest is
/// forgotten first (a repeat of it runs again), and another namespace's are kept.
#[test]
fn each_namespace_forgets_its_own_oldest_request_ids_past_its_quota() {
    let mut t = Timeline::new();
    t.ok(create_ns(NS));
    t.ok(create_ns("other"));
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: super::quota::Quotas {
            request_ids: 2,
            ..Default::default()
        },
    });
    let other_lease = || {
        once(
            "other-1",
            Cmd::CreateLease {
                ns: "other".into(),
                kind: LeaseKind::Semaphore,
                process_id: "p".into(),
                ttl_s: 60,
                metadata: Metadata::new(),
                secret: 9,
            },
        )
    };
    let kept = t.ok(other_lease());
    let first = t.once_lease("a", 60);
    t.once_lease("b", 60);
    t.once_lease("c", 60);
    assert_eq!(t.state.quotas(NS).expect("quotas").request_ids, 2);
    assert_eq!(t.state.quotas("other").expect("quotas").request_ids, 1);
    // "a" was forgotten: its repeat creates another lease.
    assert_ne!(
        t.once_lease("a", 60),
        first,
        "a is forgotten, so it runs again"
    );
    // "c" is remembered: its repeat answers the same lease, creating nothing.
    let leases = t.state.stats().leases;
    let c = t.once_lease("c", 60);
    assert_eq!(t.state.stats().leases, leases);
    assert_eq!(c, t.once_lease("c", 60));
    // The other namespace's id survived all of this.
    assert_eq!(t.ok(other_lease()), kept);
}

/// A retried create of a lease is the same request whatever secret the node that took each
/// attempt drew, and whatever token it came with: the first lease answers, nothing is created.
#[test]
fn a_retried_lease_create_is_the_same_request_whichever_node_took_it() {
    let mut t = Timeline::new();
    t.ok(create_ns(NS));
    let attempt = |secret| {
        let cmd = Cmd::CreateLease {
            ns: NS.into(),
            kind: LeaseKind::Semaphore,
            process_id: "p".into(),
            ttl_s: 60,
            metadata: Metadata::new(),
            secret,
        };
        once("lease-1", cmd.with_token(Some([3; 32])))
    };
    let first = t.ok(attempt(1));
    assert_eq!(t.ok(attempt(2)), first);
    assert_eq!(t.state.stats().leases, 1);
}

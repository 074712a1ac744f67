//! Timelines through wait groups and barriers. Every step checks the invariants; time moves
//! only as each test sets it (the lease clock), and the wall clock is stepped on purpose to
//! show that no decision follows it.

use super::limits::*;
use super::timeline::Timeline;
use super::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";
/// The wall clock the timelines start with: a plausible Unix time.
const WALL: Nanos = 1_700_000_000 * S;

fn none() -> Metadata {
    Metadata::new()
}

fn job(id: &str) -> JobDone {
    JobDone {
        job_id: id.into(),
        metadata: none(),
    }
}

fn create_wg(name: &str, counter: u64, expires_in: Nanos, wall_ns: Nanos) -> Cmd {
    Cmd::WaitGroup(WaitGroupCmd::Create {
        ns: NS.into(),
        name: name.into(),
        description: String::new(),
        counter,
        expires_at: wall_ns + expires_in,
        delete_after_finished_s: 60,
        metadata: none(),
    })
}

fn complete(name: &str, ids: &[&str]) -> Cmd {
    Cmd::WaitGroup(WaitGroupCmd::Complete {
        ns: NS.into(),
        name: name.into(),
        jobs: ids.iter().map(|id| job(id)).collect(),
    })
}

fn update_wg(name: &str, counter: u64, expires_at: Nanos, expected_version: u64) -> Cmd {
    Cmd::WaitGroup(WaitGroupCmd::Update {
        ns: NS.into(),
        name: name.into(),
        description: "d".into(),
        counter,
        expires_at,
        delete_after_finished_s: 60,
        metadata: none(),
        expected_version,
    })
}

fn create_barrier(name: &str, expected: u64) -> Cmd {
    Cmd::Barrier(BarrierCmd::Create {
        ns: NS.into(),
        name: name.into(),
        description: String::new(),
        expected,
        delete_inactive_after_s: 60,
        metadata: none(),
    })
}

fn arrive(name: &str, who: &str, generation: u64) -> Cmd {
    Cmd::Barrier(BarrierCmd::Arrive {
        ns: NS.into(),
        name: name.into(),
        process_id: who.into(),
        expected_generation: generation,
        metadata: none(),
    })
}

fn update_barrier(name: &str, expected: u64, expected_version: u64) -> Cmd {
    Cmd::Barrier(BarrierCmd::Update {
        ns: NS.into(),
        name: name.into(),
        description: String::new(),
        expected,
        delete_inactive_after_s: 60,
        metadata: none(),
        expected_version,
    })
}

fn wg(outcome: Outcome) -> WaitGroupView {
    match outcome {
        Outcome::WaitGroup(v) => v,
        other => panic!("unexpected {other:?}"),
    }
}

fn barrier(outcome: Outcome) -> BarrierReply {
    match outcome {
        Outcome::Barrier(v) => v,
        other => panic!("unexpected {other:?}"),
    }
}

fn synced(kind: SyncKind, name: &str) -> Event {
    Event::Synced {
        ns: NS.into(),
        kind,
        name: name.into(),
    }
}

fn timeline() -> Timeline {
    let mut t = Timeline::new();
    t.at(10 * S).wall_offset(WALL - 10 * S);
    t.ok(Cmd::CreateNamespace {
        name: NS.into(),
        description: String::new(),
        metadata: none(),
    });
    t
}

#[test]
fn a_group_completes_when_its_distinct_jobs_reach_the_counter() {
    let mut t = timeline();
    let v = wg(t.ok(create_wg("g", 3, 3600 * S, t.wall_ns())));
    assert_eq!(
        (v.status, v.counter, v.completed_jobs),
        (WaitGroupStatus::Active, 3, 0)
    );
    assert_eq!(v.version, 1);
    // Repeated ids count once, within a call and across calls.
    let v = wg(t.ok(complete("g", &["a", "a", "b"])));
    assert_eq!((v.status, v.completed_jobs), (WaitGroupStatus::Active, 2));
    let v = wg(t.ok(complete("g", &["b"])));
    assert_eq!(v.completed_jobs, 2);
    assert!(t.take_events().is_empty(), "nothing finished yet");
    let v = wg(t.ok(complete("g", &["c", "b"])));
    assert_eq!(
        (v.status, v.completed_jobs),
        (WaitGroupStatus::Completed, 3)
    );
    assert_eq!(v.finished_at, t.wall_ns());
    assert_eq!(t.take_events(), vec![synced(SyncKind::WaitGroup, "g")]);
    // Terminal: no more jobs, no updates.
    let e = t.err(complete("g", &["d"]));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let e = t.err(update_wg("g", 5, WALL, 1));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let jobs = t
        .state
        .list_completed_jobs(NS, "g", &PageRequest::default())
        .unwrap();
    let ids: Vec<&str> = jobs.items.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

#[test]
fn a_completion_past_the_counter_is_refused_whole() {
    let mut t = timeline();
    t.ok(create_wg("g", 2, 3600 * S, t.wall_ns()));
    t.ok(complete("g", &["a"]));
    let e = t.err(complete("g", &["b", "c"]));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("counter"), "{e}");
    let v = t.state.get_wait_group(NS, "g").unwrap();
    assert_eq!(v.completed_jobs, 1);
    // A job already done, with one new: fits.
    let v = wg(t.ok(complete("g", &["a", "b"])));
    assert_eq!(v.status, WaitGroupStatus::Completed);
}

#[test]
fn the_first_record_of_a_job_is_kept() {
    let mut t = timeline();
    t.ok(create_wg("g", 5, 3600 * S, t.wall_ns()));
    let first = Cmd::WaitGroup(WaitGroupCmd::Complete {
        ns: NS.into(),
        name: "g".into(),
        jobs: vec![JobDone {
            job_id: "a".into(),
            metadata: [("worker".to_string(), "1".to_string())].into(),
        }],
    });
    t.ok(first);
    t.at(20 * S);
    let again = Cmd::WaitGroup(WaitGroupCmd::Complete {
        ns: NS.into(),
        name: "g".into(),
        jobs: vec![JobDone {
            job_id: "a".into(),
            metadata: [("worker".to_string(), "2".to_string())].into(),
        }],
    });
    t.ok(again);
    let jobs = t
        .state
        .list_completed_jobs(NS, "g", &PageRequest::default())
        .unwrap();
    assert_eq!(jobs.items.len(), 1);
    assert_eq!(jobs.items[0].metadata["worker"], "1");
    assert_eq!(jobs.items[0].completed_at, WALL);
}

#[test]
fn updates_replace_everything_check_versions_and_lowering_the_counter_completes() {
    let mut t = timeline();
    t.ok(create_wg("g", 3, 3600 * S, t.wall_ns()));
    t.ok(complete("g", &["a", "b"]));
    let e = t.err(update_wg("g", 4, WALL, 7));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("version"), "{e}");
    let e = t.err(update_wg("g", 0, WALL, 1));
    assert!(e.message.contains("counter"), "{e}");
    let v = wg(t.ok(update_wg("g", 4, WALL + 7200 * S, 1)));
    assert_eq!(
        (v.counter, v.version, v.expires_at),
        (4, 2, WALL + 7200 * S)
    );
    assert_eq!(v.description, "d");
    let e = t.err(update_wg("g", 1, WALL + 7200 * S, 2));
    assert!(e.message.contains("below completed"), "{e}");
    t.take_events();
    let v = wg(t.ok(update_wg("g", 2, WALL + 7200 * S, 2)));
    assert_eq!(v.status, WaitGroupStatus::Completed);
    assert_eq!(t.take_events(), vec![synced(SyncKind::WaitGroup, "g")]);
}

#[test]
fn a_group_expires_on_the_lease_clock_and_is_deleted_after_its_retention() {
    let mut t = timeline();
    t.ok(create_wg("g", 3, 100 * S, t.wall_ns()));
    // The wall clock jumps a day ahead: nothing expires.
    t.wall_offset(WALL - 10 * S + 86_400 * S);
    t.at(109 * S);
    t.ok(Cmd::Expire);
    assert_eq!(
        t.state.get_wait_group(NS, "g").unwrap().status,
        WaitGroupStatus::Active
    );
    assert!(t.take_events().is_empty());
    // A read at the deadline already shows it expired, before any reaping.
    let read = t.read_at(110 * S);
    let v = read.get_wait_group(NS, "g").unwrap();
    assert_eq!(v.status, WaitGroupStatus::Expired);
    assert_eq!(t.state.next_due_ns(), Some(110 * S));
    t.at(110 * S);
    t.ok(Cmd::Expire);
    let v = t.state.get_wait_group(NS, "g").unwrap();
    assert_eq!(v.status, WaitGroupStatus::Expired);
    assert_eq!(t.take_events(), vec![synced(SyncKind::WaitGroup, "g")]);
    let e = t.err(complete("g", &["a"]));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // Deleted 60 s of lease clock after it finished; a read at that time no longer sees it.
    assert_eq!(t.state.next_due_ns(), Some(170 * S));
    assert!(t.read_at(170 * S).get_wait_group(NS, "g").is_err());
    t.at(170 * S);
    t.ok(Cmd::Expire);
    assert_eq!(
        t.state.get_wait_group(NS, "g").unwrap_err().kind,
        ErrorKind::NotFound
    );
    assert_eq!(t.take_events(), vec![synced(SyncKind::WaitGroup, "g")]);
    assert_eq!(t.state.next_due_ns(), None);
}

#[test]
fn moving_expires_at_moves_the_deadline_from_now() {
    let mut t = timeline();
    t.ok(create_wg("g", 3, 100 * S, t.wall_ns()));
    t.at(50 * S);
    // At lease time 50 the wall reads WALL + 40 s; the new expires_at is 200 s after that.
    let expires_at = t.wall_ns() + 200 * S;
    t.ok(update_wg("g", 3, expires_at, 1));
    assert_eq!(t.state.next_due_ns(), Some(250 * S));
    // The same expires_at again keeps the deadline, even after the wall clock stepped.
    t.wall_offset(WALL);
    t.at(60 * S);
    t.ok(update_wg("g", 3, expires_at, 2));
    assert_eq!(t.state.next_due_ns(), Some(250 * S));
}

#[test]
fn deleting_a_group_or_its_namespace_tells_its_waiters() {
    let mut t = timeline();
    t.ok(create_wg("g", 3, 100 * S, t.wall_ns()));
    t.ok(create_barrier("b", 3));
    let delete = Cmd::WaitGroup(WaitGroupCmd::Delete {
        ns: NS.into(),
        name: "g".into(),
    });
    assert_eq!(t.ok(delete.clone()), Outcome::Done);
    assert_eq!(t.take_events(), vec![synced(SyncKind::WaitGroup, "g")]);
    assert_eq!(t.ok(delete), Outcome::Done, "absent: a no-op");
    assert!(t.take_events().is_empty());
    t.ok(create_wg("g2", 3, 100 * S, t.wall_ns()));
    t.ok(Cmd::DeleteNamespace { name: NS.into() });
    assert_eq!(
        t.take_events(),
        vec![
            synced(SyncKind::WaitGroup, "g2"),
            synced(SyncKind::Barrier, "b")
        ]
    );
    assert_eq!(t.state.next_due_ns(), None);
}

#[test]
fn a_barrier_trips_at_the_expected_arrivals_and_starts_the_next_generation() {
    let mut t = timeline();
    let b = barrier(t.ok(create_barrier("b", 3)));
    assert_eq!((b.barrier.generation, b.barrier.arrived), (1, 0));
    assert!(!barrier(t.ok(arrive("b", "p1", 1))).tripped);
    // Idempotent per (generation, process).
    let again = barrier(t.ok(arrive("b", "p1", 1)));
    assert_eq!((again.tripped, again.barrier.arrived), (false, 1));
    t.ok(arrive("b", "p2", 1));
    assert!(t.take_events().is_empty());
    let last = barrier(t.ok(arrive("b", "p3", 1)));
    assert!(last.tripped);
    assert_eq!((last.barrier.generation, last.barrier.arrived), (2, 0));
    assert_eq!(t.take_events(), vec![synced(SyncKind::Barrier, "b")]);
    // The wrong generation is refused.
    let e = t.err(arrive("b", "p1", 1));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let e = t.err(arrive("b", "p1", 3));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    // Generation 1's participants are still listed.
    let who = t
        .state
        .list_participants(NS, "b", 1, &PageRequest::default())
        .unwrap();
    assert_eq!(who.items.len(), 3);
    // Two more generations: only the last two are kept.
    for generation in 2..=3 {
        for p in ["p1", "p2", "p3"] {
            t.ok(arrive("b", p, generation));
        }
    }
    let listed = |t: &Timeline, g| {
        t.state
            .list_participants(NS, "b", g, &PageRequest::default())
            .unwrap()
            .items
            .len()
    };
    assert_eq!(listed(&t, 1), 0);
    assert_eq!(listed(&t, 2), 0);
    assert_eq!(listed(&t, 3), 3);
    assert_eq!(listed(&t, 4), 0);
    let usage = t.state.quotas(NS).unwrap();
    assert_eq!(usage.entries, 3, "only generation 3's records are kept");
}

#[test]
fn lowering_expected_to_the_arrivals_trips_and_below_is_refused() {
    let mut t = timeline();
    t.ok(create_barrier("b", 4));
    t.ok(arrive("b", "p1", 1));
    t.ok(arrive("b", "p2", 1));
    let e = t.err(update_barrier("b", 1, 1));
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let e = t.err(update_barrier("b", 3, 9));
    assert!(e.message.contains("version"), "{e}");
    let r = barrier(t.ok(update_barrier("b", 3, 1)));
    assert!(!r.tripped);
    t.take_events();
    let r = barrier(t.ok(update_barrier("b", 2, 2)));
    assert!(r.tripped);
    assert_eq!(
        (r.barrier.generation, r.barrier.arrived, r.barrier.version),
        (2, 0, 3)
    );
    assert_eq!(t.take_events(), vec![synced(SyncKind::Barrier, "b")]);
}

#[test]
fn a_barrier_is_deleted_after_inactivity_on_the_lease_clock() {
    let mut t = timeline();
    t.ok(create_barrier("b", 2));
    assert_eq!(t.state.next_due_ns(), Some(70 * S));
    t.at(50 * S);
    t.ok(arrive("b", "p1", 1));
    // Arrival is activity: the deletion moves.
    assert_eq!(t.state.next_due_ns(), Some(110 * S));
    // Update is not.
    t.at(60 * S);
    t.ok(update_barrier("b", 3, 1));
    assert_eq!(t.state.next_due_ns(), Some(110 * S));
    // The wall clock steps back an hour: no effect.
    t.wall_offset(WALL - 3600 * S);
    t.at(109 * S);
    t.ok(Cmd::Expire);
    assert!(t.state.get_barrier(NS, "b").is_ok());
    t.take_events();
    t.at(110 * S);
    t.ok(Cmd::Expire);
    assert_eq!(
        t.state.get_barrier(NS, "b").unwrap_err().kind,
        ErrorKind::NotFound
    );
    assert_eq!(t.take_events(), vec![synced(SyncKind::Barrier, "b")]);
    assert_eq!(t.state.quotas(NS).unwrap().entries, 0);
}

#[test]
fn bad_input_names_the_field_and_changes_nothing() {
    let mut t = timeline();
    let cases: Vec<(Cmd, &str)> = vec![
        (create_wg("bad name", 1, S, WALL), "wait_group_name"),
        (create_wg("g", 0, S, WALL), "counter"),
        (
            Cmd::WaitGroup(WaitGroupCmd::Create {
                ns: NS.into(),
                name: "g".into(),
                description: String::new(),
                counter: 1,
                expires_at: WALL,
                delete_after_finished_s: 59,
                metadata: none(),
            }),
            "delete_after_finished_seconds",
        ),
        (complete("g", &["no spaces"]), "job_id"),
        (complete("g", &vec!["j"; JOBS_PER_CALL_MAX + 1]), "jobs"),
        (create_barrier("b", 0), "expected_processes"),
        (arrive("b", "p", 0), "expected_generation"),
        (arrive("b", "", 1), "process_id"),
    ];
    for (cmd, field) in cases {
        let e = t.err(cmd);
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains(field), "{e} names {field}");
    }
    assert_eq!(t.err(complete("none", &["a"])).kind, ErrorKind::NotFound);
    assert_eq!(t.err(arrive("none", "a", 1)).kind, ErrorKind::NotFound);
    let other_ns = Cmd::Barrier(BarrierCmd::Delete {
        ns: "other".into(),
        name: "b".into(),
    });
    assert_eq!(t.err(other_ns).kind, ErrorKind::NotFound);
    t.ok(create_barrier("b", 2));
    assert_eq!(t.err(create_barrier("b", 2)).kind, ErrorKind::AlreadyExists);
}

#[test]
fn jobs_and_participants_count_against_the_quotas() {
    let mut t = timeline();
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: Quotas {
            entries: 3,
            ..Quotas::default()
        },
    });
    t.ok(create_wg("g", 10, 3600 * S, t.wall_ns()));
    t.ok(complete("g", &["a", "b"]));
    let e = t.err(complete("g", &["c", "d"]));
    assert_eq!(e.kind, ErrorKind::ResourceExhausted);
    t.ok(complete("g", &["c"]));
    t.ok(create_barrier("b", 5));
    assert_eq!(
        t.err(arrive("b", "p", 1)).kind,
        ErrorKind::ResourceExhausted
    );
    let q = t.state.quotas(NS).unwrap();
    assert_eq!(q.entries, 3);
    // Deleting the group gives everything back.
    t.ok(Cmd::WaitGroup(WaitGroupCmd::Delete {
        ns: NS.into(),
        name: "g".into(),
    }));
    assert_eq!(t.state.quotas(NS).unwrap().entries, 0);
}

#[test]
fn exactly_once_applies_to_completions_and_arrivals() {
    let mut t = timeline();
    t.ok(create_wg("g", 2, 3600 * S, t.wall_ns()));
    t.ok(create_barrier("b", 2));
    let once = |id: &str, cmd: Cmd| Cmd::Once {
        request_id: id.into(),
        cmd: Box::new(cmd),
    };
    let first = t.run(once("r1", complete("g", &["a"])));
    t.repeat(once("r1", complete("g", &["a"])), &first);
    let first = t.run(once("r2", arrive("b", "p1", 1)));
    t.run(arrive("b", "p2", 1)).unwrap();
    // The barrier tripped; the retry of p1's arrival still gets its first answer.
    t.repeat(once("r2", arrive("b", "p1", 1)), &first);
}

#[test]
fn snapshots_of_a_large_group_decode_to_the_same_state_in_linear_size() {
    let mut t = timeline();
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: Quotas {
            entries: 1_000_000,
            ..Quotas::default()
        },
    });
    t.ok(create_wg("g", 1_000_000, 3600 * S, t.wall_ns()));
    let size = |t: &Timeline| t.state.encode_snapshot().unwrap().len();
    let base = size(&t);
    let mut sizes = Vec::new();
    for batch in 0..40 {
        let ids: Vec<String> = (0..JOBS_PER_CALL_MAX)
            .map(|i| format!("job-{batch:04}-{i:02}"))
            .collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        t.ok(complete("g", &refs));
        if batch % 10 == 9 {
            sizes.push(size(&t) - base);
        }
    }
    // Each 500 jobs add the same bytes (linear, not quadratic).
    let per_step: Vec<usize> = sizes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        per_step.iter().all(|d| d.abs_diff(per_step[0]) <= 8),
        "{sizes:?}"
    );
    let bytes = t.state.encode_snapshot().unwrap();
    let decoded = State::decode_snapshot(&bytes).unwrap();
    assert_eq!(decoded.hash(), t.state.hash());
    assert_eq!(
        decoded.get_wait_group(NS, "g").unwrap().completed_jobs,
        2000
    );
}

/// Measures a wait group of 100 000 completed jobs: the state's stored bytes by the size model,
/// the snapshot's size, and the time to encode and decode it. Run it with
/// `cargo nextest run -p conchd --release --run-ignored only measure_100k`.
#[test]
#[ignore = "a measurement, not a check"]
fn measure_100k_completed_jobs() {
    let mut t = timeline();
    t.ok(Cmd::SetQuotas {
        ns: NS.into(),
        quotas: Quotas {
            entries: 1_000_000,
            bytes: 1 << 30,
            ..Quotas::default()
        },
    });
    t.ok(create_wg("g", 1_000_000, 3600 * S, t.wall_ns()));
    let empty = t.state.encode_snapshot().unwrap().len();
    for batch in 0..2000 {
        let ids: Vec<String> = (0..JOBS_PER_CALL_MAX)
            .map(|i| format!("job-{batch:05}-{i:02}"))
            .collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        t.ok(complete("g", &refs));
    }
    let started = std::time::Instant::now();
    let bytes = t.state.encode_snapshot().unwrap();
    let encoded = started.elapsed();
    let started = std::time::Instant::now();
    let decoded = State::decode_snapshot(&bytes).unwrap();
    let decoded_in = started.elapsed();
    assert_eq!(
        decoded.get_wait_group(NS, "g").unwrap().completed_jobs,
        100_000
    );
    eprintln!(
        "100000 jobs: stored bytes (size model) {}, snapshot {} bytes ({} per job), encode {:?}, decode+check {:?}",
        t.state.quotas(NS).unwrap().bytes,
        bytes.len(),
        (bytes.len() - empty) / 100_000,
        encoded,
        decoded_in
    );
}

/// While access control is on, every wait group and barrier write needs `write` on the
/// namespace, decided where the command applies: `read` and `acquire` are refused and change
/// nothing.
#[test]
fn writes_need_write_on_the_namespace() {
    use super::auth::Permission;
    let mut t = timeline();
    t.ok(Cmd::RoleCreate {
        name: "admin".into(),
        cluster_admin: true,
    });
    for (role, perm) in [
        ("reader", Permission::Read),
        ("jobs", Permission::Acquire),
        ("writer", Permission::Write),
    ] {
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
    for (byte, role) in [(1u8, "admin"), (2, "reader"), (3, "jobs"), (4, "writer")] {
        t.ok(Cmd::TokenCreate {
            name: format!("t{byte}"),
            role: role.into(),
            hash: [byte; 32],
        });
    }
    t.caller = Some(1);
    t.ok(Cmd::AuthEnable);
    let writes = [
        create_wg("g", 2, 3600 * S, t.wall_ns()),
        create_barrier("b", 2),
    ];
    for caller in [2, 3] {
        t.caller = Some(caller);
        for cmd in writes.clone() {
            assert_eq!(t.err(cmd).kind, ErrorKind::PermissionDenied);
        }
    }
    t.caller = None;
    assert_eq!(
        t.err(complete("g", &["a"])).kind,
        ErrorKind::Unauthenticated
    );
    t.caller = Some(4);
    for cmd in writes {
        t.ok(cmd);
    }
    t.ok(complete("g", &["a"]));
    t.ok(arrive("b", "p", 1));
    t.caller = Some(2);
    assert_eq!(
        t.err(complete("g", &["b"])).kind,
        ErrorKind::PermissionDenied
    );
    assert_eq!(t.err(arrive("b", "q", 1)).kind, ErrorKind::PermissionDenied);
}

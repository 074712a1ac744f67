//! Property tests of wait groups and barriers against a simple model.
//!
//! Random histories over one namespace (and one that does not exist) with two wait groups and
//! two barriers, a handful of job and process ids, stale and current versions and generations,
//! invalid input mixed in, time moving forwards by random steps (and sometimes backwards, which
//! the state's clock ignores), and snapshot -> restore as one of the operations.
//!
//! The model is the plain reading of the rules: a group's set of job ids, its counter and
//! status; a barrier's generation and set of arrivals; deadlines on the lease clock; reaping
//! before every command. After every command: the state's invariants hold; the reply is the
//! model's (success or the same error kind); every group and barrier a read shows matches the
//! model; and the command emitted a `Synced` event for exactly the objects the model finished,
//! tripped or deleted. A group completes exactly when its distinct jobs reach its counter; a
//! barrier trips exactly at its expected arrivals. At the end, replaying the batches on a
//! fresh state gives the same hash (determinism).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const S: Nanos = NANOS_PER_SEC;
const NS: &str = "n";
const WALL_OFFSET: Nanos = 1_700_000_000 * S;
const GROUPS: [&str; 2] = ["g0", "g1"];
const BARRIERS: [&str; 2] = ["b0", "b1"];
const JOBS: [&str; 5] = ["j0", "j1", "j2", "j3", "j4"];
const PROCS: [&str; 4] = ["p0", "p1", "p2", "p3"];

#[derive(Clone, Debug)]
enum Op {
    Tick(Nanos),
    Snapshot,
    CreateGroup {
        g: usize,
        counter: u64,
        expires_in: Nanos,
        retention_s: u64,
    },
    UpdateGroup {
        g: usize,
        counter: u64,
        expires_in: Option<Nanos>,
        stale: bool,
    },
    Complete {
        g: usize,
        jobs: Vec<usize>,
    },
    DeleteGroup(usize),
    CreateBarrier {
        b: usize,
        expected: u64,
        window_s: u64,
    },
    UpdateBarrier {
        b: usize,
        expected: u64,
        stale: bool,
    },
    Arrive {
        b: usize,
        p: usize,
        generation_delta: i64,
    },
    DeleteBarrier(usize),
    DeleteNamespace,
    /// A command about a namespace that does not exist.
    Elsewhere,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop_oneof![Just(0i64), 1..30i64, Just(60), Just(100), Just(-5)]
            .prop_map(|s| Op::Tick(s * S)),
        1 => Just(Op::Snapshot),
        3 => (0..2usize, 0..5u64, prop_oneof![Just(0i64), 1..200i64], prop_oneof![Just(60u64), Just(90), Just(30)])
            .prop_map(|(g, counter, e, retention_s)| Op::CreateGroup { g, counter, expires_in: e * S, retention_s }),
        2 => (0..2usize, 0..6u64, proptest::option::of(1..200i64), any::<bool>())
            .prop_map(|(g, counter, e, stale)| Op::UpdateGroup { g, counter, expires_in: e.map(|e| e * S), stale }),
        6 => (0..2usize, proptest::collection::vec(0..5usize, 0..4))
            .prop_map(|(g, jobs)| Op::Complete { g, jobs }),
        1 => (0..2usize).prop_map(Op::DeleteGroup),
        3 => (0..2usize, 0..4u64, prop_oneof![Just(60u64), Just(120)])
            .prop_map(|(b, expected, window_s)| Op::CreateBarrier { b, expected, window_s }),
        2 => (0..2usize, 0..5u64, any::<bool>())
            .prop_map(|(b, expected, stale)| Op::UpdateBarrier { b, expected, stale }),
        7 => (0..2usize, 0..4usize, prop_oneof![8 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64)])
            .prop_map(|(b, p, generation_delta)| Op::Arrive { b, p, generation_delta }),
        1 => (0..2usize).prop_map(Op::DeleteBarrier),
        1 => Just(Op::DeleteNamespace),
        1 => Just(Op::Elsewhere),
    ]
}

#[derive(Clone, Debug)]
struct MGroup {
    counter: u64,
    jobs: BTreeSet<usize>,
    status: WaitGroupStatus,
    deadline: Nanos,
    finished: Nanos,
    retention: Nanos,
    version: u64,
    expires_at: Nanos,
}

#[derive(Clone, Debug)]
struct MBarrier {
    expected: u64,
    generation: u64,
    arrived: BTreeSet<usize>,
    active: Nanos,
    window: Nanos,
    version: u64,
}

#[derive(Clone, Debug, Default)]
struct Model {
    ns: bool,
    groups: BTreeMap<usize, MGroup>,
    barriers: BTreeMap<usize, MBarrier>,
}

impl Model {
    /// Reaping before a command; returns the objects it finished or deleted.
    fn reap(&mut self, clock: Nanos, synced: &mut BTreeSet<(SyncKind, String)>) {
        for (g, m) in self.groups.iter_mut() {
            if m.status == WaitGroupStatus::Active && m.deadline <= clock {
                m.status = WaitGroupStatus::Expired;
                m.finished = m.deadline;
                synced.insert((SyncKind::WaitGroup, GROUPS[*g].into()));
            }
        }
        let before: Vec<usize> = self.groups.keys().copied().collect();
        self.groups.retain(|_, m| {
            m.status == WaitGroupStatus::Active || m.finished.saturating_add(m.retention) > clock
        });
        for g in before {
            if !self.groups.contains_key(&g) {
                synced.insert((SyncKind::WaitGroup, GROUPS[g].into()));
            }
        }
        let before: Vec<usize> = self.barriers.keys().copied().collect();
        self.barriers
            .retain(|_, b| b.active.saturating_add(b.window) > clock);
        for b in before {
            if !self.barriers.contains_key(&b) {
                synced.insert((SyncKind::Barrier, BARRIERS[b].into()));
            }
        }
    }
}

fn kind_of(reply: &Reply) -> Result<(), ErrorKind> {
    reply.as_ref().map(|_| ()).map_err(|e| e.kind)
}

/// Runs `op` on the state and the model; returns the command (if any) for the replay.
fn step(
    state: &mut State,
    model: &mut Model,
    clock: &mut Nanos,
    op: &Op,
    batches: &mut Vec<Batch>,
) -> Result<(), TestCaseError> {
    let cmd = match op {
        Op::Tick(dt) => {
            *clock += dt;
            return Ok(());
        }
        Op::Snapshot => {
            let bytes = state
                .encode_snapshot()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let restored =
                State::decode_snapshot(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(restored.hash(), state.hash());
            *state = restored;
            return Ok(());
        }
        Op::CreateGroup {
            g,
            counter,
            expires_in,
            retention_s,
        } => Cmd::WaitGroup(WaitGroupCmd::Create {
            ns: NS.into(),
            name: GROUPS[*g].into(),
            description: String::new(),
            counter: *counter,
            expires_at: state.clock_ns().max(*clock) + WALL_OFFSET + expires_in,
            delete_after_finished_s: *retention_s,
            metadata: Metadata::new(),
        }),
        Op::UpdateGroup {
            g,
            counter,
            expires_in,
            stale,
        } => {
            let m = model.groups.get(g);
            let version = m.map_or(1, |m| m.version) + u64::from(*stale);
            let expires_at = match (expires_in, m) {
                (Some(e), _) => state.clock_ns().max(*clock) + WALL_OFFSET + e,
                (None, Some(m)) => m.expires_at,
                (None, None) => 0,
            };
            Cmd::WaitGroup(WaitGroupCmd::Update {
                ns: NS.into(),
                name: GROUPS[*g].into(),
                description: "u".into(),
                counter: *counter,
                expires_at,
                delete_after_finished_s: 60,
                metadata: Metadata::new(),
                expected_version: version,
            })
        }
        Op::Complete { g, jobs } => Cmd::WaitGroup(WaitGroupCmd::Complete {
            ns: NS.into(),
            name: GROUPS[*g].into(),
            jobs: jobs
                .iter()
                .map(|j| JobDone {
                    job_id: JOBS[*j].into(),
                    metadata: Metadata::new(),
                })
                .collect(),
        }),
        Op::DeleteGroup(g) => Cmd::WaitGroup(WaitGroupCmd::Delete {
            ns: NS.into(),
            name: GROUPS[*g].into(),
        }),
        Op::CreateBarrier {
            b,
            expected,
            window_s,
        } => Cmd::Barrier(BarrierCmd::Create {
            ns: NS.into(),
            name: BARRIERS[*b].into(),
            description: String::new(),
            expected: *expected,
            delete_inactive_after_s: *window_s,
            metadata: Metadata::new(),
        }),
        Op::UpdateBarrier { b, expected, stale } => Cmd::Barrier(BarrierCmd::Update {
            ns: NS.into(),
            name: BARRIERS[*b].into(),
            description: "u".into(),
            expected: *expected,
            delete_inactive_after_s: 60,
            metadata: Metadata::new(),
            expected_version: model.barriers.get(b).map_or(1, |m| m.version) + u64::from(*stale),
        }),
        Op::Arrive {
            b,
            p,
            generation_delta,
        } => Cmd::Barrier(BarrierCmd::Arrive {
            ns: NS.into(),
            name: BARRIERS[*b].into(),
            process_id: PROCS[*p].into(),
            expected_generation: model
                .barriers
                .get(b)
                .map_or(1, |m| m.generation)
                .saturating_add_signed(*generation_delta),
            metadata: Metadata::new(),
        }),
        Op::DeleteBarrier(b) => Cmd::Barrier(BarrierCmd::Delete {
            ns: NS.into(),
            name: BARRIERS[*b].into(),
        }),
        Op::DeleteNamespace => Cmd::DeleteNamespace { name: NS.into() },
        Op::Elsewhere => Cmd::Barrier(BarrierCmd::Arrive {
            ns: "elsewhere".into(),
            name: "b0".into(),
            process_id: "p0".into(),
            expected_generation: 1,
            metadata: Metadata::new(),
        }),
    };
    // The state's clock never goes back; the model follows it.
    let now = state.clock_ns().max(*clock);
    // The wall clock reads the state's clock plus a fixed offset (what `expires_at` is built
    // from); the lease clock the batch carries may be behind the state's.
    let batch = Batch {
        now_ns: *clock,
        wall_ns: now + WALL_OFFSET,
        cmds: vec![cmd.clone()],
    };
    let mut events = Vec::new();
    let reply = state.apply_batch(&batch, &mut events).remove(0);
    batches.push(batch);
    state.check_invariants().map_err(TestCaseError::fail)?;

    let mut synced = BTreeSet::new();
    if model.ns {
        model.reap(now, &mut synced);
    }
    let generation = match &cmd {
        Cmd::Barrier(BarrierCmd::Arrive {
            expected_generation,
            ..
        }) => *expected_generation,
        _ => 0,
    };
    let expected = expect(model, op, now, generation, &mut synced);
    prop_assert_eq!(kind_of(&reply), expected, "{:?} -> {:?}", op, reply);
    let got: BTreeSet<(SyncKind, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Synced { kind, name, .. } => Some((*kind, name.clone())),
            _ => None,
        })
        .collect();
    prop_assert_eq!(&got, &synced, "{:?}", op);
    compare(state, model)
}

/// Applies `op` to the model at clock `now`; returns what the reply must be.
fn expect(
    model: &mut Model,
    op: &Op,
    now: Nanos,
    generation: u64,
    synced: &mut BTreeSet<(SyncKind, String)>,
) -> Result<(), ErrorKind> {
    use ErrorKind::*;
    match op {
        Op::DeleteNamespace => {
            if model.ns {
                for g in model.groups.keys() {
                    synced.insert((SyncKind::WaitGroup, GROUPS[*g].into()));
                }
                for b in model.barriers.keys() {
                    synced.insert((SyncKind::Barrier, BARRIERS[*b].into()));
                }
            }
            *model = Model::default();
            return Ok(());
        }
        Op::Elsewhere => return Err(NotFound),
        _ => {}
    }
    // Static checks come before the namespace lookup.
    match op {
        Op::CreateGroup {
            counter,
            retention_s,
            ..
        } if *counter == 0 || *retention_s < 60 => {
            return Err(InvalidArgument);
        }
        Op::UpdateGroup { counter: 0, .. } => return Err(InvalidArgument),
        Op::CreateBarrier { expected: 0, .. } | Op::UpdateBarrier { expected: 0, .. } => {
            return Err(InvalidArgument);
        }
        Op::Arrive { .. } if generation == 0 => return Err(InvalidArgument),
        _ => {}
    }
    if !model.ns {
        // The history's first command makes the namespace (see `history`).
        return Err(NotFound);
    }
    match op {
        Op::CreateGroup {
            g,
            counter,
            expires_in,
            retention_s,
        } => {
            if model.groups.contains_key(g) {
                return Err(AlreadyExists);
            }
            model.groups.insert(
                *g,
                MGroup {
                    counter: *counter,
                    jobs: BTreeSet::new(),
                    status: WaitGroupStatus::Active,
                    deadline: now + expires_in,
                    finished: 0,
                    retention: *retention_s as Nanos * S,
                    version: 1,
                    expires_at: now + WALL_OFFSET + expires_in,
                },
            );
            Ok(())
        }
        Op::UpdateGroup {
            g,
            counter,
            expires_in,
            stale,
        } => {
            let m = model.groups.get_mut(g).ok_or(NotFound)?;
            if *stale || m.status != WaitGroupStatus::Active || *counter < m.jobs.len() as u64 {
                return Err(InvalidArgument);
            }
            if let Some(e) = expires_in {
                let expires_at = now + WALL_OFFSET + e;
                if expires_at != m.expires_at {
                    m.deadline = now + e;
                    m.expires_at = expires_at;
                }
            }
            m.counter = *counter;
            m.version += 1;
            m.retention = 60 * S;
            if m.jobs.len() as u64 == m.counter {
                m.status = WaitGroupStatus::Completed;
                m.finished = now;
                synced.insert((SyncKind::WaitGroup, GROUPS[*g].into()));
            }
            Ok(())
        }
        Op::Complete { g, jobs } => {
            let m = model.groups.get_mut(g).ok_or(NotFound)?;
            if m.status != WaitGroupStatus::Active {
                return Err(InvalidArgument);
            }
            let all: BTreeSet<usize> = m.jobs.iter().chain(jobs.iter()).copied().collect();
            if all.len() as u64 > m.counter {
                return Err(InvalidArgument);
            }
            m.jobs = all;
            if m.jobs.len() as u64 == m.counter {
                m.status = WaitGroupStatus::Completed;
                m.finished = now;
                synced.insert((SyncKind::WaitGroup, GROUPS[*g].into()));
            }
            Ok(())
        }
        Op::DeleteGroup(g) => {
            if model.groups.remove(g).is_some() {
                synced.insert((SyncKind::WaitGroup, GROUPS[*g].into()));
            }
            Ok(())
        }
        Op::CreateBarrier {
            b,
            expected,
            window_s,
        } => {
            if model.barriers.contains_key(b) {
                return Err(AlreadyExists);
            }
            model.barriers.insert(
                *b,
                MBarrier {
                    expected: *expected,
                    generation: 1,
                    arrived: BTreeSet::new(),
                    active: now,
                    window: *window_s as Nanos * S,
                    version: 1,
                },
            );
            Ok(())
        }
        Op::UpdateBarrier { b, expected, stale } => {
            let m = model.barriers.get_mut(b).ok_or(NotFound)?;
            if *stale || *expected < m.arrived.len() as u64 {
                return Err(InvalidArgument);
            }
            m.expected = *expected;
            m.version += 1;
            m.window = 60 * S;
            if m.arrived.len() as u64 >= m.expected {
                m.generation += 1;
                m.arrived.clear();
                synced.insert((SyncKind::Barrier, BARRIERS[*b].into()));
            }
            Ok(())
        }
        Op::Arrive { b, p, .. } => {
            let m = model.barriers.get_mut(b).ok_or(NotFound)?;
            if generation != m.generation {
                return Err(InvalidArgument);
            }
            if m.arrived.insert(*p) {
                m.active = now;
                if m.arrived.len() as u64 == m.expected {
                    m.generation += 1;
                    m.arrived.clear();
                    synced.insert((SyncKind::Barrier, BARRIERS[*b].into()));
                }
            }
            Ok(())
        }
        Op::DeleteBarrier(b) => {
            if model.barriers.remove(b).is_some() {
                synced.insert((SyncKind::Barrier, BARRIERS[*b].into()));
            }
            Ok(())
        }
        Op::Tick(_) | Op::Snapshot | Op::DeleteNamespace | Op::Elsewhere => Ok(()),
    }
}

/// What reads show equals the model (at the state's clock).
fn compare(state: &State, model: &Model) -> Result<(), TestCaseError> {
    if !model.ns {
        return Ok(());
    }
    let clock = state.clock_ns();
    for (g, name) in GROUPS.iter().enumerate() {
        let read = state.get_wait_group(NS, name);
        // A finished group past its deletion is not shown, even before the reaping.
        let shown = |m: &&MGroup| {
            let finished = match m.status {
                WaitGroupStatus::Active if m.deadline <= clock => Some(m.deadline),
                WaitGroupStatus::Active => None,
                _ => Some(m.finished),
            };
            finished.is_none_or(|f| f.saturating_add(m.retention) > clock)
        };
        match model.groups.get(&g).filter(shown) {
            None => prop_assert!(read.is_err(), "{name} should be gone: {read:?}"),
            Some(m) => {
                let v = read.map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
                let status = match m.status {
                    WaitGroupStatus::Active if m.deadline <= clock => WaitGroupStatus::Expired,
                    s => s,
                };
                prop_assert_eq!(v.status, status, "{}", name);
                prop_assert_eq!(v.completed_jobs, m.jobs.len() as u64);
                prop_assert_eq!((v.counter, v.version), (m.counter, m.version));
                prop_assert_eq!(
                    v.status == WaitGroupStatus::Completed,
                    v.completed_jobs == v.counter
                );
            }
        }
    }
    for (b, name) in BARRIERS.iter().enumerate() {
        let read = state.get_barrier(NS, name);
        let shown = |m: &&MBarrier| m.active.saturating_add(m.window) > clock;
        match model.barriers.get(&b).filter(shown) {
            None => prop_assert!(read.is_err(), "{name} should be gone: {read:?}"),
            Some(m) => {
                let v = read.map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
                prop_assert_eq!(
                    (v.generation, v.arrived, v.expected, v.version),
                    (m.generation, m.arrived.len() as u64, m.expected, m.version)
                );
                prop_assert!(v.arrived < v.expected);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn wait_groups_and_barriers_follow_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut state = State::new();
        let mut model = Model::default();
        let mut clock: Nanos = 10 * S;
        let mut batches = Vec::new();
        let create = Cmd::CreateNamespace { name: NS.into(), description: String::new(), metadata: Metadata::new() };
        let recreate = |state: &mut State, model: &mut Model, clock: Nanos, batches: &mut Vec<Batch>| {
            let batch = Batch { now_ns: clock, wall_ns: clock + WALL_OFFSET, cmds: vec![create.clone()] };
            state.apply_batch(&batch, &mut Vec::new());
            batches.push(batch);
            model.ns = true;
        };
        recreate(&mut state, &mut model, clock, &mut batches);
        for op in &ops {
            step(&mut state, &mut model, &mut clock, op, &mut batches)?;
            if matches!(op, Op::DeleteNamespace) {
                recreate(&mut state, &mut model, clock, &mut batches);
            }
        }
        let mut replay = State::new();
        for batch in &batches {
            replay.apply_batch(batch, &mut Vec::new());
        }
        prop_assert_eq!(replay.hash(), state.hash());
    }
}

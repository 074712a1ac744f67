//! Where one write's time goes: the stages of a write, timed where they happen and recorded
//! into `conch_write_stage_seconds{stage=...}` (see the book, Performance, "Where a write's time goes").
//!
//! Stages timed on one task are measured there with `Instant`s carried along (in the proposal,
//! in the call's task-local [`CallStamps`]). Stages inside Raft happen on openraft's tasks, which
//! the node does not see: the log store, the replication RPCs and the state machine stamp the
//! moments they handle an entry into [`WriteTrace`], a fixed ring of slots by log index, and the
//! proposer reads the stamps of its entry once `client_write` returns. A leaf: it imports no
//! other module of the daemon.
//!
//! Nothing here allocates per write or takes a lock: stamps are relaxed atomics and each
//! stage's histogram is resolved once at start. A write whose slot was taken by a newer index,
//! or whose stamps are missing or out of order (an entry replaced after a leader change, two
//! writes racing for one slot), has its Raft stages skipped rather than recorded wrong; its
//! outer stages still count.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The stages of a write, each a series of `conch_write_stage_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// A client's call that wrote once, from the gRPC layer seeing it to the response headers.
    Call,
    /// From the gRPC layer to the handler's proposal (decode, access control, validation).
    HandlerIn,
    /// From the proposal to the proposer's batch task starting (channel, gathering, spawn).
    Queue,
    /// From the batch task starting to `client_write` (lease clock, batch built), on the leader.
    Batch,
    /// `client_write`, call to return, on the leader: the sum of the six Raft stages below.
    Raft,
    /// From `client_write` to the log store's append of the entry (Raft core, index assigned).
    RaftToAppend,
    /// The leader's append of the entry: write, flush, fdatasync.
    LeaderAppend,
    /// From the leader's own append done to the entry committed (waiting for a follower).
    Quorum,
    /// From committed to the state machine applying it (commit index saved, entry read back).
    CommitToApply,
    /// Applying the entry to the state.
    Apply,
    /// From applied to `client_write` returning (the result passed back through Raft core).
    ApplyToReturn,
    /// Not on the path's sum: from `client_write` to the first replication RPC carrying the
    /// entry.
    ReplicationSend,
    /// Not on the path's sum: a replication RPC carrying the entry, sent to the first success
    /// reply.
    ReplicationRtt,
    /// On a follower: an `AppendEntries` call carrying entries, in the handler (decode, Raft
    /// core, the follower's append and fdatasync, encode).
    FollowerAppend,
    /// On a follower: from its batch task to the forwarder taking the batch.
    ToForwarder,
    /// On a follower: the forwarder's commit of the batch through the leader, to its reply.
    Forward,
    /// Not on the path's sum, part of `Forward`: the `ConchPeer.Propose` call itself.
    ForwardRpc,
    /// From the batch's result to the waiting caller running again.
    Wake,
    /// From the caller running again to the response headers (reply built).
    HandlerOut,
    /// On the leader, a follower's `ConchPeer.Propose` call, as the gRPC layer times it.
    PeerCall,
    /// `HandlerIn` of a `ConchPeer.Propose` call.
    PeerHandlerIn,
    /// `HandlerOut` of a `ConchPeer.Propose` call.
    PeerHandlerOut,
}

impl Stage {
    pub const ALL: [Stage; 22] = [
        Stage::Call,
        Stage::HandlerIn,
        Stage::Queue,
        Stage::Batch,
        Stage::Raft,
        Stage::RaftToAppend,
        Stage::LeaderAppend,
        Stage::Quorum,
        Stage::CommitToApply,
        Stage::Apply,
        Stage::ApplyToReturn,
        Stage::ReplicationSend,
        Stage::ReplicationRtt,
        Stage::FollowerAppend,
        Stage::ToForwarder,
        Stage::Forward,
        Stage::ForwardRpc,
        Stage::Wake,
        Stage::HandlerOut,
        Stage::PeerCall,
        Stage::PeerHandlerIn,
        Stage::PeerHandlerOut,
    ];

    /// The `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Call => "call",
            Stage::HandlerIn => "handler_in",
            Stage::Queue => "queue",
            Stage::Batch => "batch",
            Stage::Raft => "raft",
            Stage::RaftToAppend => "raft_to_append",
            Stage::LeaderAppend => "leader_append",
            Stage::Quorum => "quorum",
            Stage::CommitToApply => "commit_to_apply",
            Stage::Apply => "apply",
            Stage::ApplyToReturn => "apply_to_return",
            Stage::ReplicationSend => "replication_send",
            Stage::ReplicationRtt => "replication_rtt",
            Stage::FollowerAppend => "follower_append",
            Stage::ToForwarder => "to_forwarder",
            Stage::Forward => "forward",
            Stage::ForwardRpc => "forward_rpc",
            Stage::Wake => "wake",
            Stage::HandlerOut => "handler_out",
            Stage::PeerCall => "peer_call",
            Stage::PeerHandlerIn => "peer_handler_in",
            Stage::PeerHandlerOut => "peer_handler_out",
        }
    }

    /// Its place in [`Stage::ALL`] (declaration order).
    fn position(self) -> usize {
        self as usize
    }
}

/// Bucket bounds of `conch_write_stage_seconds`: 1 µs to about 1.3 s, each 25 % above the
/// last, rounded to three significant digits, so a quantile read from them is within a few
/// percent.
pub(crate) fn stage_buckets() -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    let mut bound = 1e-6f64;
    while bound < 1.5 {
        let rounded = round3(bound);
        if out.last().is_none_or(|last| rounded > *last) {
            out.push(rounded);
        }
        bound *= 1.25;
    }
    out
}

fn round3(x: f64) -> f64 {
    let scale = 10f64.powi(2 - x.log10().floor() as i32);
    (x * scale).round() / scale
}

/// One histogram per stage, resolved once (no label lookup per write).
#[derive(Clone)]
pub struct StageHistograms {
    by_stage: Vec<prometheus::Histogram>,
}

impl StageHistograms {
    /// The series of `vec` (labelled `stage`), one per [`Stage`].
    pub fn of(vec: &prometheus::HistogramVec) -> StageHistograms {
        StageHistograms {
            by_stage: Stage::ALL
                .iter()
                .map(|s| vec.with_label_values(&[s.name()]))
                .collect(),
        }
    }

    pub fn observe(&self, stage: Stage, duration: Duration) {
        if let Some(h) = self.by_stage.get(stage.position()) {
            h.observe(duration.as_secs_f64());
        }
    }

    /// Observes `to - from` (nothing if `to` is earlier).
    pub fn between(&self, stage: Stage, from: Instant, to: Instant) {
        if let Some(d) = to.checked_duration_since(from) {
            self.observe(stage, d);
        }
    }

    /// How many times `stage` was observed.
    #[cfg(test)]
    pub fn count(&self, stage: Stage) -> u64 {
        self.by_stage
            .get(stage.position())
            .map_or(0, prometheus::Histogram::get_sample_count)
    }
}

/// A moment in an entry's life that the Raft side stamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    AppendStart = 0,
    AppendDone = 1,
    /// First replication RPC carrying the entry sent (first only).
    Sent = 2,
    /// First success reply to such an RPC (first only).
    Acked = 3,
    Committed = 4,
    ApplyStart = 5,
    ApplyDone = 6,
}

const MARKS: usize = 7;
/// Slots of the ring: far more than the entries in flight at once.
const SLOTS: usize = 256;

#[derive(Default)]
struct Slot {
    index: AtomicU64,
    /// Nanoseconds since the trace's epoch, 0 when not stamped.
    at: [AtomicU64; MARKS],
}

/// The stamps of the last [`SLOTS`] log entries, by index.
pub struct WriteTrace {
    epoch: Instant,
    slots: Box<[Slot]>,
    /// The last index stamped committed (commits come as "up to").
    committed: AtomicU64,
}

impl Default for WriteTrace {
    fn default() -> Self {
        WriteTrace {
            epoch: Instant::now(),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            committed: AtomicU64::new(0),
        }
    }
}

impl WriteTrace {
    /// `at` as nanoseconds since the epoch, at least 1 (0 means "not stamped").
    pub fn ns(&self, at: Instant) -> u64 {
        let ns = at.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(ns).unwrap_or(u64::MAX).max(1)
    }

    /// The slot of `index`, taken over from an older index; `None` if a newer index holds it.
    fn claim(&self, index: u64) -> Option<&Slot> {
        let slot = &self.slots[(index % SLOTS as u64) as usize];
        let mut current = slot.index.load(Ordering::Relaxed);
        loop {
            if current == index {
                return Some(slot);
            }
            if current > index {
                return None;
            }
            match slot
                .index
                .compare_exchange(current, index, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    for at in &slot.at {
                        at.store(0, Ordering::Relaxed);
                    }
                    return Some(slot);
                }
                Err(now) => current = now,
            }
        }
    }

    /// Stamps `mark` of entry `index` now; `Sent` and `Acked` keep their first stamp.
    pub fn stamp(&self, index: u64, mark: Mark) {
        self.stamp_at(index, mark, self.ns(Instant::now()));
    }

    fn stamp_at(&self, index: u64, mark: Mark, ns: u64) {
        let Some(slot) = self.claim(index) else {
            return;
        };
        let at = &slot.at[mark as usize];
        match mark {
            Mark::Sent | Mark::Acked => {
                let _ = at.compare_exchange(0, ns, Ordering::Relaxed, Ordering::Relaxed);
            }
            _ => at.store(ns, Ordering::Relaxed),
        }
    }

    /// Stamps `mark` on every entry from `first` to `last` (at most the ring's size, the last
    /// ones).
    pub(crate) fn stamp_range(&self, first: u64, last: u64, mark: Mark) {
        let ns = self.ns(Instant::now());
        let first = first.max(last.saturating_sub(SLOTS as u64 - 1));
        for index in first..=last {
            self.stamp_at(index, mark, ns);
        }
    }

    /// Stamps every entry committed since the last call, up to `upto`.
    pub fn committed(&self, upto: u64) {
        let before = self.committed.fetch_max(upto, Ordering::Relaxed);
        if upto > before {
            self.stamp_range(before + 1, upto, Mark::Committed);
        }
    }

    /// The stamps of entry `index`, if its slot still holds it.
    fn stamps(&self, index: u64) -> Option<[u64; MARKS]> {
        let slot = &self.slots[(index % SLOTS as u64) as usize];
        if slot.index.load(Ordering::Relaxed) != index {
            return None;
        }
        let stamps = std::array::from_fn(|i| slot.at[i].load(Ordering::Relaxed));
        (slot.index.load(Ordering::Relaxed) == index).then_some(stamps)
    }

    /// Records the Raft stages of entry `index`, proposed by `client_write` at `called` and
    /// returned at `returned`; nothing if its stamps are incomplete or out of order.
    pub(crate) fn record_raft(
        &self,
        index: u64,
        called: Instant,
        returned: Instant,
        into: &StageHistograms,
    ) {
        let Some(stamps) = self.stamps(index) else {
            return;
        };
        let Some(split) = split_raft(self.ns(called), stamps, self.ns(returned)) else {
            return;
        };
        for (stage, ns) in split {
            into.observe(stage, Duration::from_nanos(ns));
        }
    }
}

/// The Raft stages of one entry, in nanoseconds, from `client_write`'s call and return and the
/// entry's stamps: the six stages that partition the call (each stamp no earlier than the one
/// before), then the replication stages when both stamps are there.
fn split_raft(called: u64, stamps: [u64; MARKS], returned: u64) -> Option<Vec<(Stage, u64)>> {
    let at = |m: Mark| stamps[m as usize];
    let path = [
        called,
        at(Mark::AppendStart),
        at(Mark::AppendDone),
        at(Mark::Committed),
        at(Mark::ApplyStart),
        at(Mark::ApplyDone),
        returned,
    ];
    if path.contains(&0) || path.windows(2).any(|w| w[1] < w[0]) {
        return None;
    }
    let stages = [
        Stage::RaftToAppend,
        Stage::LeaderAppend,
        Stage::Quorum,
        Stage::CommitToApply,
        Stage::Apply,
        Stage::ApplyToReturn,
    ];
    let mut out: Vec<(Stage, u64)> = stages
        .iter()
        .zip(path.windows(2))
        .map(|(s, w)| (*s, w[1] - w[0]))
        .collect();
    let (sent, acked) = (at(Mark::Sent), at(Mark::Acked));
    if sent >= called && acked >= sent && sent != 0 {
        out.push((Stage::ReplicationSend, sent - called));
        out.push((Stage::ReplicationRtt, acked - sent));
    }
    Some(out)
}

/// What the gRPC layer learns from a call's handler about its write (see [`CALL`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallStamps {
    /// Writes the call proposed.
    pub writes: u32,
    /// A `ConchPeer.Propose` call: a follower's proposal.
    pub forwarded: bool,
    /// When the (last) write was proposed.
    pub proposed: Option<Instant>,
    /// When the handler ran again with the (last) write's result.
    pub resumed: Option<Instant>,
}

tokio::task_local! {
    /// The stamps of the gRPC call this task serves, set by the gRPC layer around the call.
    pub(crate) static CALL: Cell<CallStamps>;
}

/// Notes on the current call (if any) that it proposed a write now.
pub(crate) fn note_proposed(at: Instant, forwarded: bool) {
    let _ = CALL.try_with(|c| {
        let mut s = c.get();
        s.writes += 1;
        s.forwarded = forwarded;
        s.proposed = Some(at);
        c.set(s);
    });
}

/// Notes on the current call (if any) that its write's result arrived.
pub(crate) fn note_resumed(at: Instant) {
    let _ = CALL.try_with(|c| {
        let mut s = c.get();
        s.resumed = Some(at);
        c.set(s);
    });
}

/// Records the outer stages of a call that wrote exactly once, from the gRPC layer's start and
/// end.
pub(crate) fn record_call(
    stamps: CallStamps,
    started: Instant,
    ended: Instant,
    into: &StageHistograms,
) {
    let (1, Some(proposed), Some(resumed)) = (stamps.writes, stamps.proposed, stamps.resumed)
    else {
        return;
    };
    let (call, handler_in, handler_out) = match stamps.forwarded {
        false => (Stage::Call, Stage::HandlerIn, Stage::HandlerOut),
        true => (Stage::PeerCall, Stage::PeerHandlerIn, Stage::PeerHandlerOut),
    };
    into.between(call, started, ended);
    into.between(handler_in, started, proposed);
    into.between(handler_out, resumed, ended);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamps(append: (u64, u64), repl: (u64, u64), commit: u64, apply: (u64, u64)) -> [u64; 7] {
        [append.0, append.1, repl.0, repl.1, commit, apply.0, apply.1]
    }

    #[test]
    fn the_raft_stages_partition_the_call_and_replication_rides_beside() {
        let s = stamps((110, 150), (155, 300), 320, (330, 340));
        let split = split_raft(100, s, 400).expect("ordered stamps split");
        let path: u64 = split.iter().take(6).map(|(_, ns)| ns).sum();
        assert_eq!(path, 300, "the six stages add up to the call");
        assert_eq!(
            split,
            vec![
                (Stage::RaftToAppend, 10),
                (Stage::LeaderAppend, 40),
                (Stage::Quorum, 170),
                (Stage::CommitToApply, 10),
                (Stage::Apply, 10),
                (Stage::ApplyToReturn, 60),
                (Stage::ReplicationSend, 55),
                (Stage::ReplicationRtt, 145),
            ]
        );
    }

    #[test]
    fn missing_or_disordered_stamps_give_no_split() {
        let missing = stamps((110, 0), (0, 0), 320, (330, 340));
        assert_eq!(split_raft(100, missing, 400), None);
        let disordered = stamps((110, 150), (0, 0), 140, (330, 340));
        assert_eq!(split_raft(100, disordered, 400), None);
        let ok_without_replication = stamps((110, 150), (0, 0), 160, (170, 180));
        let split = split_raft(100, ok_without_replication, 200).expect("splits");
        assert_eq!(split.len(), 6, "no replication stages without their stamps");
    }

    #[test]
    fn a_slot_follows_the_newest_index_and_keeps_the_first_send() {
        let trace = WriteTrace::default();
        trace.stamp_at(5, Mark::Sent, 10);
        trace.stamp_at(5, Mark::Sent, 20);
        assert_eq!(trace.stamps(5).map(|s| s[Mark::Sent as usize]), Some(10));
        trace.stamp_at(5 + SLOTS as u64, Mark::AppendStart, 30);
        assert_eq!(trace.stamps(5), None, "a newer index took the slot");
        let newer = trace.stamps(5 + SLOTS as u64).expect("held");
        assert_eq!(
            newer[Mark::Sent as usize],
            0,
            "stamps of the old index cleared"
        );
        trace.stamp_at(5, Mark::AppendStart, 40);
        assert_eq!(
            trace.stamps(5),
            None,
            "an older index never takes a slot back"
        );
    }

    #[test]
    fn commits_stamp_every_entry_since_the_last() {
        let trace = WriteTrace::default();
        trace.committed(3);
        trace.committed(2);
        trace.committed(5);
        for index in 1..=5 {
            let s = trace.stamps(index).expect("stamped");
            assert_ne!(s[Mark::Committed as usize], 0, "index {index}");
        }
    }

    #[test]
    fn every_stage_has_its_own_place_and_name() {
        for (i, stage) in Stage::ALL.iter().enumerate() {
            assert_eq!(stage.position(), i, "{stage:?}");
        }
        let mut names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Stage::ALL.len());
    }

    #[test]
    fn buckets_rise_by_a_quarter_from_a_microsecond() {
        let b = stage_buckets();
        assert_eq!(b.first(), Some(&1e-6));
        assert!(b.windows(2).all(|w| w[1] > w[0] && w[1] / w[0] < 1.3));
        assert!(*b.last().unwrap_or(&0.0) >= 1.0);
    }

    #[test]
    fn a_call_counts_only_when_it_wrote_once() {
        let vec = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("x", "x").buckets(stage_buckets()),
            &["stage"],
        )
        .expect("valid");
        let h = StageHistograms::of(&vec);
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let once = CallStamps {
            writes: 1,
            forwarded: false,
            proposed: Some(ms(1)),
            resumed: Some(ms(3)),
        };
        record_call(once, t, ms(4), &h);
        record_call(CallStamps { writes: 2, ..once }, t, ms(4), &h);
        record_call(
            CallStamps {
                forwarded: true,
                ..once
            },
            t,
            ms(4),
            &h,
        );
        let count = |s: &str| vec.with_label_values(&[s]).get_sample_count();
        assert_eq!(count("call"), 1);
        assert_eq!(count("handler_in"), 1);
        assert_eq!(count("handler_out"), 1);
        assert_eq!(count("peer_call"), 1);
        let sum = vec.with_label_values(&["handler_out"]).get_sample_sum();
        assert!((sum - 0.001).abs() < 1e-9, "{sum}");
    }
}

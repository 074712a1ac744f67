//! The vocabulary of wait groups and barriers: their commands, replies and views.
//!
//! Plain data like `types.rs`, which wraps these commands in [`Cmd`](super::Cmd) and their
//! replies in [`Outcome`](super::Outcome). This module imports nothing from the state, so it
//! sits at the bottom of the module graph beside `types.rs`.
//!
//! Times users read (`created_at`, `expires_at`, `finished_at`, ...) are on the wall clock, in
//! nanoseconds since the Unix epoch; every decision about them is made on the lease clock (see
//! `waitgroup.rs` and `barrier.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

type Metadata = BTreeMap<String, String>;
type Nanos = i64;

/// Which kind of object a [`Event::Synced`](super::Event::Synced) is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SyncKind {
    WaitGroup,
    Barrier,
}

impl SyncKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncKind::WaitGroup => "wait group",
            SyncKind::Barrier => "barrier",
        }
    }
}

/// One job reported done: its id (unique within its group) and metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDone {
    pub job_id: String,
    pub metadata: Metadata,
}

/// A wait group command (each about one group of one namespace).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitGroupCmd {
    Create {
        ns: String,
        name: String,
        description: String,
        counter: u64,
        /// Wall clock, as the caller gave it; the group expires that far from the batch's wall
        /// stamp, measured on the lease clock.
        expires_at: Nanos,
        delete_after_finished_s: u64,
        metadata: Metadata,
    },
    /// Replaces every mutable attribute (only of an ACTIVE group).
    Update {
        ns: String,
        name: String,
        description: String,
        counter: u64,
        expires_at: Nanos,
        delete_after_finished_s: u64,
        metadata: Metadata,
        expected_version: u64,
    },
    /// A no-op when the group is absent.
    Delete { ns: String, name: String },
    /// Idempotent per job id: a job already done keeps its first record.
    Complete {
        ns: String,
        name: String,
        jobs: Vec<JobDone>,
    },
}

impl WaitGroupCmd {
    pub fn ns(&self) -> &str {
        match self {
            WaitGroupCmd::Create { ns, .. }
            | WaitGroupCmd::Update { ns, .. }
            | WaitGroupCmd::Delete { ns, .. }
            | WaitGroupCmd::Complete { ns, .. } => ns,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            WaitGroupCmd::Create { name, .. }
            | WaitGroupCmd::Update { name, .. }
            | WaitGroupCmd::Delete { name, .. }
            | WaitGroupCmd::Complete { name, .. } => name,
        }
    }
}

/// A barrier command (each about one barrier of one namespace).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BarrierCmd {
    Create {
        ns: String,
        name: String,
        description: String,
        expected: u64,
        delete_inactive_after_s: u64,
        metadata: Metadata,
    },
    /// Replaces every mutable attribute; lowering `expected` to the arrivals trips it.
    Update {
        ns: String,
        name: String,
        description: String,
        expected: u64,
        delete_inactive_after_s: u64,
        metadata: Metadata,
        expected_version: u64,
    },
    /// A no-op when the barrier is absent.
    Delete { ns: String, name: String },
    /// Idempotent per (generation, process id).
    Arrive {
        ns: String,
        name: String,
        process_id: String,
        expected_generation: u64,
        metadata: Metadata,
    },
}

impl BarrierCmd {
    pub fn ns(&self) -> &str {
        match self {
            BarrierCmd::Create { ns, .. }
            | BarrierCmd::Update { ns, .. }
            | BarrierCmd::Delete { ns, .. }
            | BarrierCmd::Arrive { ns, .. } => ns,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            BarrierCmd::Create { name, .. }
            | BarrierCmd::Update { name, .. }
            | BarrierCmd::Delete { name, .. }
            | BarrierCmd::Arrive { name, .. } => name,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitGroupStatus {
    Active,
    Completed,
    Expired,
}

impl WaitGroupStatus {
    pub fn finished(self) -> bool {
        self != WaitGroupStatus::Active
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitGroupView {
    pub name: String,
    pub description: String,
    pub metadata: Metadata,
    pub counter: u64,
    pub completed_jobs: u64,
    pub status: WaitGroupStatus,
    pub version: u64,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    /// As the caller set it (wall clock).
    pub expires_at: Nanos,
    pub delete_after_finished_s: u64,
    /// 0 while ACTIVE.
    pub finished_at: Nanos,
    pub last_activity_at: Nanos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    pub job_id: String,
    pub completed_at: Nanos,
    pub metadata: Metadata,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierView {
    pub name: String,
    pub description: String,
    pub metadata: Metadata,
    pub expected: u64,
    /// Arrivals in the current generation (always below `expected`).
    pub arrived: u64,
    /// Starts at 1; one more per trip.
    pub generation: u64,
    pub version: u64,
    pub created_at: Nanos,
    pub updated_at: Nanos,
    pub last_activity_at: Nanos,
    pub delete_inactive_after_s: u64,
}

/// A barrier command's reply: the barrier after it, and whether it tripped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierReply {
    pub barrier: BarrierView,
    pub tripped: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParticipantView {
    pub process_id: String,
    pub arrived_at: Nanos,
    pub metadata: Metadata,
}

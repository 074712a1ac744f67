//! Bugs conch once had, put back on demand: the simulator turns one on to show that it finds it
//! (`conch-sim --bug NAME`). Only a thread that asked sees a bug ([`reintroduce_on_this_thread`]);
//! nothing in `conchd` ever asks, so in a node serving clients every check here is `false`.
//!
//! Without `--cfg tokio_unstable` (the release; `SIM_HOOKS` in lib.rs) [`active`] is a constant `false`.

use std::cell::Cell;

/// A bug that was found and fixed, each with where its fix lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The lease clock followed the wall clock, so a clock step forward expired live leases
    /// (fixed by the monotonic lease clock, `clock.rs`).
    WallClockLeases,
    /// A leader restarted as leader of its old term read at its read index without the floor of
    /// the log it started with: right after every node restarted, a read could miss
    /// acknowledged writes (`Node::read_index_as_leader`). Since a restarted leader campaigns
    /// for a new term (`raft::early`), whose first entry follows its whole log, the read index
    /// covers that log too; putting the bug back also puts back the old restart (and turns
    /// early sends off, which the old restart is unsafe with).
    StaleReadAfterRestart,
    /// A node answered Raft messages meant for another node: when the address used for one
    /// member led to another (or to the sender itself), that node's replies counted as the
    /// intended member's, and a quorum could be counted from fewer real nodes
    /// (`raft/peer_target.rs`).
    MisroutedReplies,
    /// A waiting acquire on a follower read its state before applying its own acquire, found no
    /// waiter and answered TIMED_OUT while the leader granted it later: a phantom hold
    /// (`wait.rs`, the catch-up before the first read).
    PhantomHold,
}

impl Bug {
    pub const ALL: [Bug; 4] = [
        Bug::WallClockLeases,
        Bug::StaleReadAfterRestart,
        Bug::MisroutedReplies,
        Bug::PhantomHold,
    ];

    /// The name `conch-sim --bug` takes.
    pub fn name(self) -> &'static str {
        match self {
            Bug::WallClockLeases => "wall-clock-leases",
            Bug::StaleReadAfterRestart => "stale-read-after-restart",
            Bug::MisroutedReplies => "misrouted-replies",
            Bug::PhantomHold => "phantom-hold",
        }
    }

    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }
}

thread_local! {
    static BUG: Cell<Option<Bug>> = const { Cell::new(None) };
}

/// Puts `bug` back for the code this thread runs (`None`: none).
pub fn reintroduce_on_this_thread(bug: Option<Bug>) {
    BUG.with(|b| b.set(bug));
}

/// Whether `bug` is back on this thread.
pub fn active(bug: Bug) -> bool {
    crate::SIM_HOOKS && BUG.with(|b| b.get() == Some(bug))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bug_is_back_only_on_the_thread_that_asked_and_names_round_trip() {
        for bug in Bug::ALL {
            assert_eq!(Bug::from_name(bug.name()), Some(bug));
        }
        assert_eq!(Bug::from_name("no-such-bug"), None);
        reintroduce_on_this_thread(Some(Bug::PhantomHold));
        assert!(active(Bug::PhantomHold));
        assert!(!active(Bug::WallClockLeases));
        let elsewhere = std::thread::spawn(|| active(Bug::PhantomHold))
            .join()
            .unwrap_or(true);
        assert!(!elsewhere, "another thread does not see it");
        reintroduce_on_this_thread(None);
        assert!(!active(Bug::PhantomHold));
    }
}

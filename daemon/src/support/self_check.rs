//! The state machine's invariants checked after every applied entry, on a thread that asked
//! for it (the simulator does; `conchd` never does, the check costs a walk of the whole state).
//! What breaks them is kept, with the entry's index, for the asker to collect.
//!
//! Every replica applies the same committed entries to the same state, so each index is
//! checked once, on the first node of the thread to apply it; that the replicas really agree
//! is the simulator's own check at the end (one applied index, one state hash).
//!
//! One check is not the state's own: the cluster version a node applies must not exceed the
//! ceiling the asker set ([`limit_cluster_version`]: what every member speaks, while the
//! simulator runs a node that speaks less than this build). It is checked on every node.
//!
//! Without `--cfg tokio_unstable` (the release; `SIM_HOOKS` in lib.rs) the checks after each
//! entry are compiled out.

use std::cell::{Cell, RefCell};

use crate::state::State;

/// At most this many broken invariants are kept per thread (the first ones tell the story).
const MAX_KEPT: usize = 20;

thread_local! {
    /// `Some` while this thread checks: what was found so far.
    static FOUND: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    /// The highest index checked so far.
    static CHECKED: Cell<u64> = const { Cell::new(0) };
    /// The cluster version no node may apply past, and why (see [`limit_cluster_version`]).
    static CEILING: RefCell<Option<(u32, String)>> = const { RefCell::new(None) };
}

/// From now on (while checking), finding a node of this thread that applied a cluster version
/// above `ceiling` is a broken invariant, said with `why` (e.g. which node speaks no more);
/// `None` lifts the ceiling.
pub fn limit_cluster_version(ceiling: Option<(u32, String)>) {
    CEILING.with(|c| *c.borrow_mut() = ceiling);
}

fn found(broken: String) {
    FOUND.with(|f| {
        if let Some(found) = f.borrow_mut().as_mut()
            && found.len() < MAX_KEPT
            && !found.contains(&broken)
        {
            found.push(broken);
        }
    });
}

/// From now on, check after every entry this thread applies (forgetting earlier findings).
pub fn check_on_this_thread() {
    FOUND.with(|f| *f.borrow_mut() = Some(Vec::new()));
    CHECKED.with(|c| c.set(0));
    CEILING.with(|c| *c.borrow_mut() = None);
}

/// Stops checking on this thread and returns what was found.
pub fn take_found() -> Vec<String> {
    FOUND.with(|f| f.borrow_mut().take().unwrap_or_default())
}

/// Called by the applied state after each entry (see `applied.rs`).
pub(crate) fn after_apply(index: u64, state: &State) {
    let checking = crate::SIM_HOOKS && FOUND.with(|f| f.borrow().is_some());
    if !checking {
        return;
    }
    let version = state.cluster_version().0;
    let above = CEILING.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|(ceiling, _)| version > *ceiling)
            .map(|(ceiling, why)| format!("cluster version {version} above {ceiling}: {why}"))
    });
    if let Some(broken) = above {
        found(broken);
    }
    if CHECKED.with(|c| c.get()) >= index {
        return;
    }
    CHECKED.with(|c| c.set(index));
    if let Err(broken) = state.check_invariants() {
        found(format!("after entry {index}: {broken}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Batch, Cmd};

    fn at_version(version: u32) -> State {
        let mut state = State::new();
        let batch = Batch {
            cmds: vec![Cmd::SetClusterVersion { version }],
            ..Default::default()
        };
        let replies = state.apply_batch(&batch, &mut Vec::new());
        assert!(replies.iter().all(Result::is_ok), "{replies:?}");
        state
    }

    #[test]
    fn a_cluster_version_above_the_ceiling_is_found_on_every_node_until_lifted() {
        check_on_this_thread();
        limit_cluster_version(Some((1, "n3 speaks cluster version 1 at most".into())));
        after_apply(1, &at_version(1));
        assert!(take_found().is_empty(), "version 1 is within the ceiling");

        check_on_this_thread();
        limit_cluster_version(Some((1, "n3 speaks cluster version 1 at most".into())));
        after_apply(1, &at_version(2));
        // Another node applying the same index is checked too, and said once.
        after_apply(1, &at_version(2));
        assert_eq!(
            take_found(),
            vec!["cluster version 2 above 1: n3 speaks cluster version 1 at most".to_string()]
        );

        check_on_this_thread();
        limit_cluster_version(Some((1, "n3".into())));
        limit_cluster_version(None);
        after_apply(1, &at_version(2));
        assert!(take_found().is_empty(), "no ceiling once lifted");
    }
}

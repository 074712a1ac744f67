//! The state machine's invariants checked after every applied entry, on a thread that asked
//! for it (the simulator does; `conchd` never does, the check costs a walk of the whole state).
//! What breaks them is kept, with the entry's index, for the asker to collect.
//!
//! Every replica applies the same committed entries to the same state, so each index is
//! checked once, on the first node of the thread to apply it; that the replicas really agree
//! is the simulator's own check at the end (one applied index, one state hash).
//!
//! Without `--cfg tokio_unstable` (the release; `SIM_HOOKS` in lib.rs) the check after each entry is compiled out.

use std::cell::{Cell, RefCell};

use crate::state::State;

/// At most this many broken invariants are kept per thread (the first ones tell the story).
const MAX_KEPT: usize = 20;

thread_local! {
    /// `Some` while this thread checks: what was found so far.
    static FOUND: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
    /// The highest index checked so far.
    static CHECKED: Cell<u64> = const { Cell::new(0) };
}

/// From now on, check after every entry this thread applies (forgetting earlier findings).
pub fn check_on_this_thread() {
    FOUND.with(|f| *f.borrow_mut() = Some(Vec::new()));
    CHECKED.with(|c| c.set(0));
}

/// Stops checking on this thread and returns what was found.
pub fn take_found() -> Vec<String> {
    FOUND.with(|f| f.borrow_mut().take().unwrap_or_default())
}

/// Called by the applied state after each entry (see `applied.rs`).
pub(crate) fn after_apply(index: u64, state: &State) {
    let checking = crate::SIM_HOOKS && FOUND.with(|f| f.borrow().is_some());
    if !checking || CHECKED.with(|c| c.get()) >= index {
        return;
    }
    CHECKED.with(|c| c.set(index));
    if let Err(broken) = state.check_invariants() {
        FOUND.with(|f| {
            if let Some(found) = f.borrow_mut().as_mut()
                && found.len() < MAX_KEPT
            {
                found.push(format!("after entry {index}: {broken}"));
            }
        });
    }
}

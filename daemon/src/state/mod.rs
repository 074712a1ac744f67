//! The semaphore state machine: Grackle semantics as a pure, deterministic function of the
//! Raft log.
//!
//! Invariants (checked by [`State::check_invariants`]):
//! - for every semaphore, the sum of holder weights <= permits
//! - every holder and waiter belongs to a live lease of the same namespace
//! - a lease that both holds and waits for one semaphore is upgrading: it waits for more weight
//!   than it holds (and keeps its hold meanwhile)
//! - the head of every queue cannot be granted now (no grant is ever left undone)
//! - fencing tokens are unique and strictly increasing in grant order
//! - the clock never decreases
//!
//! No clock reads, no I/O, no randomness: ids and tokens derive from counters in the state,
//! and time comes from the leader's stamp on each [`Batch`].

pub mod limits;
mod machine;
mod paging;
#[cfg(test)]
mod proptests;
mod types;
pub mod validate;

pub use machine::{State, fnv1a64};
pub use types::*;

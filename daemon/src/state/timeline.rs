//! The one timeline harness of the state machine's tests (`tests.rs`, `tests_once.rs`,
//! `auth_tests.rs`): a [`State`] driven one command per batch at a time the test sets.
//!
//! What every timeline checks, at every step:
//! - the invariants hold after each batch (`check_invariants`);
//! - a refused command ([`Timeline::err`]) leaves the state hash unchanged;
//! - a repeated request ([`Timeline::repeat`]) answers the first reply, emits nothing and
//!   changes nothing.
//!
//! The domain steps (create a namespace, acquire, grant a role) live beside the tests that use
//! them, as further `impl Timeline` blocks.

use super::data::State;
use super::types::*;

/// A state driven one command per batch at a settable time.
pub(super) struct Timeline {
    pub(super) state: State,
    /// The lease clock the next batch carries.
    pub(super) now_ns: Nanos,
    /// The wall clock minus the lease clock: what the leader's wall clock stamps read.
    pub(super) wall_offset_ns: Nanos,
    /// How far the clock moves before each command (0: only [`Timeline::at`] moves it).
    pub(super) step_ns: Nanos,
    /// The token the commands are sent with (`None`: none, an anonymous caller).
    pub(super) caller: Option<u8>,
    /// Every event emitted since the last [`Timeline::take_events`].
    pub(super) events: Vec<Event>,
}

impl Timeline {
    /// At t=0; the clock moves only when told.
    pub(super) fn new() -> Self {
        Timeline {
            state: State::new(),
            now_ns: 0,
            wall_offset_ns: 0,
            step_ns: 0,
            caller: None,
            events: Vec::new(),
        }
    }

    /// At t=`step_ns`, the clock moving `step_ns` before every command.
    pub(super) fn stepping(step_ns: Nanos) -> Self {
        Timeline {
            now_ns: step_ns,
            step_ns,
            ..Timeline::new()
        }
    }

    pub(super) fn at(&mut self, now_ns: Nanos) -> &mut Self {
        self.now_ns = now_ns;
        self
    }

    /// Steps the wall clock the next batches carry to `offset` from the lease clock.
    pub(super) fn wall_offset(&mut self, offset_ns: Nanos) -> &mut Self {
        self.wall_offset_ns = offset_ns;
        self
    }

    pub(super) fn wall_ns(&self) -> Nanos {
        self.now_ns.saturating_add(self.wall_offset_ns)
    }

    fn batch(&self, cmds: Vec<Cmd>) -> Batch {
        Batch {
            now_ns: self.now_ns,
            wall_ns: self.wall_ns(),
            cmds,
        }
    }

    /// The state as a read sees it once an (empty) batch stamped `now_ns` is applied: the clock
    /// moves, nothing is reaped. The timeline itself is left as it was.
    pub(super) fn read_at(&self, now_ns: Nanos) -> State {
        let mut state = self.state.clone();
        state.apply_batch(
            &Batch {
                now_ns,
                cmds: Vec::new(),
                wall_ns: now_ns.saturating_add(self.wall_offset_ns),
            },
            &mut Vec::new(),
        );
        state
    }

    /// Moves the clock one step, then runs `cmd`.
    pub(super) fn run(&mut self, cmd: Cmd) -> Reply {
        self.now_ns += self.step_ns;
        self.run_now(cmd)
    }

    /// Runs `cmd` at the current time (the clock does not move), as the caller.
    pub(super) fn run_now(&mut self, cmd: Cmd) -> Reply {
        let cmd = cmd.with_token(self.caller.map(|b| [b; 32]));
        let batch = self.batch(vec![cmd]);
        let mut replies = self.state.apply_batch(&batch, &mut self.events);
        assert_eq!(replies.len(), 1);
        self.state.check_invariants().expect("invariants hold");
        replies.remove(0)
    }

    pub(super) fn ok(&mut self, cmd: Cmd) -> Outcome {
        self.run(cmd).expect("command succeeds")
    }

    /// Runs `cmd`, which must be refused and change nothing.
    pub(super) fn err(&mut self, cmd: Cmd) -> Error {
        // Let time advance first (an empty batch moves the clock and reaps nothing).
        self.now_ns += self.step_ns;
        let tick = self.batch(Vec::new());
        self.state.apply_batch(&tick, &mut self.events);
        let before = self.state.hash();
        let err = self.run_now(cmd).expect_err("command is refused");
        assert_eq!(
            self.state.hash(),
            before,
            "a refused command changes nothing"
        );
        err
    }

    /// Runs `cmd` again at the same time: it must answer `first`, emit nothing and leave the
    /// state exactly as it was.
    pub(super) fn repeat(&mut self, cmd: Cmd, first: &Reply) {
        let before = self.state.hash();
        let events = self.events.len();
        let again = self.run_now(cmd);
        assert_eq!(&again, first, "a repeat answers the first reply");
        assert_eq!(self.events.len(), events, "a repeat emits nothing");
        assert_eq!(self.state.hash(), before, "a repeat changes nothing");
    }

    pub(super) fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }
}

//! The lease clock: the time a leader stamps on each batch (`Batch::now_ns`), on which every
//! lease expiry, wait deadline and linger is measured.
//!
//! It advances by this machine's monotonic elapsed time and never by its wall clock, so an NTP
//! step, a VM resume or an operator's `date -s` neither expires leases early nor freezes expiry.
//! When this node stamps the first batch of a term it anchors at (the applied state's clock,
//! now on the monotonic clock); a reading is `anchor + elapsed`. If the applied state's clock is
//! ahead of that (entries of an earlier term applied after the anchor), it re-anchors forward to
//! it. A reading never goes back. Every value it returns is a stamp some leader made plus at
//! most the monotonic time elapsed since, so the replicated clock never runs ahead of real time
//! since any committed stamp: a lease lives at least its TTL of real time after the refresh that
//! set it. See `docs/design.md` (Time).
//!
//! The wall clock ([`wall_ns`]) is read only for the times users read (`Batch::wall_ns`).
//!
//! The monotonic clock is tokio's ([`tokio::time::Instant`]: the machine's monotonic clock, or
//! a runtime's paused clock under simulation), and a program simulating time may replace the
//! wall clock once ([`set_wall_clock`]).

use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::state::Nanos;

/// The wall clock that replaces the system's, if one was set.
static WALL_CLOCK: OnceLock<fn() -> Option<Nanos>> = OnceLock::new();

/// Makes [`wall_ns`] read `clock` (where it answers `None`, the system's clock) for the rest of
/// the process. Only the first call takes effect; returns whether this one did.
pub fn set_wall_clock(clock: fn() -> Option<Nanos>) -> bool {
    WALL_CLOCK.set(clock).is_ok()
}

/// The wall clock in nanoseconds since the Unix epoch: for display times only.
pub(crate) fn wall_ns() -> Nanos {
    if crate::SIM_HOOKS
        && let Some(now) = WALL_CLOCK.get().and_then(|clock| clock())
    {
        return now;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[derive(Clone, Copy, Debug)]
struct Anchor {
    term: u64,
    clock_ns: Nanos,
    at: Instant,
}

/// This node's lease clock while it leads. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct LeaseClock {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    anchor: Option<Anchor>,
    /// The largest reading returned so far.
    last_ns: Nanos,
}

impl LeaseClock {
    /// The lease clock now, as leader of `term` whose applied state's clock is `applied_ns`.
    pub(crate) fn now(&self, term: u64, applied_ns: Nanos) -> Nanos {
        if crate::sim_hooks::regressions::active(
            crate::sim_hooks::regressions::Bug::WallClockLeases,
        ) {
            return wall_ns();
        }
        self.read_at(term, applied_ns, Instant::now(), wall_ns)
    }

    /// The reading at monotonic instant `now`. `origin` gives the starting point of a cluster
    /// that has never stamped anything (applied clock 0): the wall clock, so that lease-clock
    /// values look like times when debugging; nothing compares them with a wall clock.
    fn read_at(
        &self,
        term: u64,
        applied_ns: Nanos,
        now: Instant,
        origin: impl FnOnce() -> Nanos,
    ) -> Nanos {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let anchor = match inner.anchor {
            Some(anchor) if anchor.term == term => anchor,
            _ => {
                let start = if applied_ns == 0 && inner.last_ns == 0 {
                    origin().max(0)
                } else {
                    applied_ns.max(inner.last_ns)
                };
                Anchor {
                    term,
                    clock_ns: start,
                    at: now,
                }
            }
        };
        let elapsed =
            i64::try_from(now.saturating_duration_since(anchor.at).as_nanos()).unwrap_or(i64::MAX);
        let mut reading = anchor.clock_ns.saturating_add(elapsed);
        let anchor = if applied_ns > reading {
            // Entries stamped earlier (by a former leader) were applied since the anchor.
            reading = applied_ns;
            Anchor {
                term,
                clock_ns: applied_ns,
                at: now,
            }
        } else {
            anchor
        };
        inner.anchor = Some(anchor);
        let reading = reading.max(inner.last_ns);
        inner.last_ns = reading;
        reading
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const S: Nanos = 1_000_000_000;

    fn after(start: Instant, ns: Nanos) -> Instant {
        start + Duration::from_nanos(ns as u64)
    }

    fn never() -> Nanos {
        panic!("the origin is read only for a cluster that never stamped")
    }

    #[test]
    fn a_term_anchors_at_the_applied_clock_and_advances_by_elapsed_time() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        assert_eq!(clock.read_at(3, 100 * S, t0, never), 100 * S);
        assert_eq!(clock.read_at(3, 100 * S, after(t0, 2 * S), never), 102 * S);
        // The applied clock catching up with our own stamps changes nothing.
        assert_eq!(clock.read_at(3, 102 * S, after(t0, 5 * S), never), 105 * S);
    }

    #[test]
    fn a_fresh_cluster_starts_at_the_origin() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        assert_eq!(clock.read_at(1, 0, t0, || 7 * S), 7 * S);
        assert_eq!(clock.read_at(1, 0, after(t0, S), never), 8 * S);
    }

    #[test]
    fn an_applied_clock_ahead_re_anchors_forward() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        assert_eq!(clock.read_at(5, 10 * S, t0, never), 10 * S);
        // A former leader's entries, stamped up to 50 s, are applied one second later.
        assert_eq!(clock.read_at(5, 50 * S, after(t0, S), never), 50 * S);
        // From there on the clock advances from the new anchor.
        assert_eq!(clock.read_at(5, 50 * S, after(t0, 3 * S), never), 52 * S);
    }

    #[test]
    fn readings_never_go_back() {
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        assert_eq!(clock.read_at(1, 10 * S, t0, never), 10 * S);
        assert_eq!(clock.read_at(1, 10 * S, after(t0, 30 * S), never), 40 * S);
        // A later term whose applied clock is behind what this node stamped (those entries
        // never committed) starts from this node's last reading.
        assert_eq!(clock.read_at(2, 20 * S, after(t0, 31 * S), never), 40 * S);
        assert_eq!(clock.read_at(2, 20 * S, after(t0, 32 * S), never), 41 * S);
        // An instant from before the anchor (readings raced) does not move it back either.
        assert_eq!(clock.read_at(2, 20 * S, t0, never), 41 * S);
    }

    #[test]
    fn the_wall_clock_does_not_move_it() {
        // Nothing but the monotonic instants given goes in: two readings one monotonic second
        // apart differ by one second whatever the wall clock did meanwhile.
        let clock = LeaseClock::default();
        let t0 = Instant::now();
        let a = clock.read_at(9, 1_000 * S, t0, never);
        let b = clock.read_at(9, 1_000 * S, after(t0, S), never);
        assert_eq!(b - a, S);
    }
}

//! Exponential backoff with jitter, for retries across endpoints.
//!
//! Delay `n` (from 0) lies in `[c/2, c]` where `c = min(cap, base * 2^n)` ("equal jitter"), so
//! clients that failed together do not retry in lockstep, yet never wait less than half the
//! ceiling.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Exponential backoff with jitter.
///
/// ```
/// use std::time::Duration;
/// use conch_client::Backoff;
///
/// let mut b = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
/// let first = b.next_delay();
/// assert!(first >= Duration::from_millis(25) && first <= Duration::from_millis(50));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    seed: RandomState,
}

impl Backoff {
    /// A backoff starting at `base` and never exceeding `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            attempt: 0,
            seed: RandomState::new(),
        }
    }

    /// The ceiling of delay number `attempt` (from 0), before jitter.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next delay, and advances.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let mut h = self.seed.build_hasher();
        h.write_u32(self.attempt);
        let frac = (h.finish() % 1_000_001) as f64 / 1_000_000.0;
        half + half.mul_f64(frac)
    }

    /// How many delays were handed out since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Starts over from `base` (call after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let ceilings: Vec<u128> = (0..8).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn delays_stay_between_half_and_the_ceiling_and_reset_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for n in 0..30 {
            let c = b.ceiling(n);
            let d = b.next_delay();
            assert!(
                d >= c / 2 && d <= c,
                "attempt {n}: {d:?} not in [{:?}, {c:?}]",
                c / 2
            );
        }
        assert_eq!(b.attempts(), 30);
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn cap_below_base_is_raised_to_base() {
        let mut b = Backoff::new(Duration::from_millis(300), Duration::from_millis(10));
        assert!(b.next_delay() <= Duration::from_millis(300));
        assert_eq!(b.ceiling(5), Duration::from_millis(300));
    }
}

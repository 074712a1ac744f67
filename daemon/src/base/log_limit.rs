//! Rate limits for log lines that would otherwise repeat many times a second (refused peer
//! calls, an unreachable peer).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lets a repeated warning through at most once per interval.
pub struct LogLimit {
    every: Duration,
    last: Mutex<Option<Instant>>,
}

impl LogLimit {
    pub fn new(every: Duration) -> LogLimit {
        LogLimit {
            every,
            last: Mutex::new(None),
        }
    }

    /// Whether to log now (and if so, the next one waits a full interval).
    pub fn due(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < self.every) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

/// [`LogLimit`] per key (e.g. per peer), counting what it held back.
pub(crate) struct LogLimits<K> {
    every: Duration,
    /// Per key: when a line last passed, and how many were held back since.
    last: Mutex<BTreeMap<K, (Instant, u64)>>,
}

impl<K: Ord> LogLimits<K> {
    pub(crate) fn new(every: Duration) -> LogLimits<K> {
        LogLimits {
            every,
            last: Mutex::new(BTreeMap::new()),
        }
    }

    /// `Some(n)` when a line for `key` is due now, `n` being how many were held back since the
    /// last one (for "… (n more since)"); `None` when this one is held back.
    pub(crate) fn due_counting(&self, key: K) -> Option<u64> {
        self.due_counting_at(key, Instant::now())
    }

    fn due_counting_at(&self, key: K, now: Instant) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.get_mut(&key) {
            Some((at, held)) if now.saturating_duration_since(*at) < self.every => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let since = std::mem::take(held);
                *at = now;
                Some(since)
            }
            None => {
                last.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_passes_once_per_interval_per_key() {
        let limit = LogLimit::new(Duration::from_secs(3600));
        assert!(limit.due());
        assert!(!limit.due());
        let limits = LogLimits::new(Duration::from_secs(3600));
        assert_eq!(limits.due_counting(1), Some(0));
        assert_eq!(limits.due_counting(2), Some(0));
        assert_eq!(limits.due_counting(1), None);
    }

    #[test]
    fn a_held_back_line_is_counted_in_the_next_one() {
        let limits = LogLimits::new(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(limits.due_counting_at(2, t0), Some(0));
        for i in 1..=59 {
            // Twice a second, as openraft retries an unreachable peer.
            assert_eq!(
                limits.due_counting_at(2, t0 + Duration::from_millis(500 * i)),
                None
            );
        }
        assert_eq!(
            limits.due_counting_at(3, t0 + Duration::from_secs(1)),
            Some(0)
        );
        assert_eq!(
            limits.due_counting_at(2, t0 + Duration::from_secs(30)),
            Some(59)
        );
        assert_eq!(
            limits.due_counting_at(2, t0 + Duration::from_secs(31)),
            None
        );
        assert_eq!(
            limits.due_counting_at(2, t0 + Duration::from_secs(60)),
            Some(1)
        );
    }
}

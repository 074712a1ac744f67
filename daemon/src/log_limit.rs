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

/// [`LogLimit`] per key (e.g. per peer).
pub struct LogLimits<K> {
    every: Duration,
    last: Mutex<BTreeMap<K, Instant>>,
}

impl<K: Ord> LogLimits<K> {
    pub fn new(every: Duration) -> LogLimits<K> {
        LogLimits {
            every,
            last: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether to log for `key` now.
    pub fn due(&self, key: K) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match last.get(&key) {
            Some(at) if now.duration_since(*at) < self.every => false,
            _ => {
                last.insert(key, now);
                true
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
        assert!(limits.due(1));
        assert!(limits.due(2));
        assert!(!limits.due(1));
    }
}

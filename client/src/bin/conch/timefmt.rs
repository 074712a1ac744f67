//! RFC 3339 timestamps in UTC with whole seconds (`2026-06-12T10:15:00Z`), as the CLI shows them
//! and stores them in holder metadata. conch's wire timestamps are int64 nanoseconds since the
//! Unix epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Formats a wire timestamp (ns since the Unix epoch); `None` for 0 (unknown) and for instants
/// before the epoch, which no node reports.
pub(crate) fn format_unix_nanos(nanos: i64) -> Option<String> {
    let secs = u64::try_from(nanos.div_euclid(1_000_000_000)).ok()?;
    (nanos > 0).then(|| rfc3339(UNIX_EPOCH + Duration::from_secs(secs)))
}

/// The current time as RFC 3339.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(SystemTime::now().max(UNIX_EPOCH))
}

/// `t` (not before the epoch; i64 nanoseconds reach no further than the year 2262) as RFC 3339.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Option<String> {
        format_unix_nanos(secs * 1_000_000_000)
    }

    #[test]
    fn known_instants() {
        assert_eq!(at(951_782_400).as_deref(), Some("2000-02-29T00:00:00Z"));
        assert_eq!(at(1_781_259_300).as_deref(), Some("2026-06-12T10:15:00Z"));
        assert_eq!(at(4_102_444_799).as_deref(), Some("2099-12-31T23:59:59Z"));
        assert_eq!(
            format_unix_nanos(i64::MAX).as_deref(),
            Some("2262-04-11T23:47:16Z")
        );
    }

    #[test]
    fn nanos_are_truncated_to_seconds_and_zero_means_unknown() {
        assert_eq!(
            format_unix_nanos(1_781_259_300_999_999_999).as_deref(),
            Some("2026-06-12T10:15:00Z")
        );
        assert_eq!(format_unix_nanos(0), None);
        assert_eq!(format_unix_nanos(-1), None);
        assert_eq!(format_unix_nanos(i64::MIN), None);
    }

    #[test]
    fn now_looks_like_a_timestamp() {
        let now = now_rfc3339();
        assert_eq!(now.len(), 20);
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T');
    }
}
